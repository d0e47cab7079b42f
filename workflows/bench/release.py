"""Run the benchmarks a release reports, one after the other, each writing its own results.

Each benchmark of the README's Performance table runs in its own process with the
arguments that table gives (otherwise its defaults) and writes its current result to
``workflows/bench/results/<name>.md`` and ``.json``, replacing the previous one (git
keeps the history). A benchmark that fails is reported at the end; the others still
run; the exit code is 1 if any failed.

    python workflows/bench/release.py --dry-run            # the commands, nothing run
    python workflows/bench/release.py                      # all of them (hours; the
                                                            # 10^9-row run needs ~80 GB free)
    python workflows/bench/release.py --only cli_floors patches
    python workflows/bench/release.py --skip billion larger_than_memory

Run it on an otherwise idle machine: the figures are timings, and several benchmarks
compare against floors measured in the same run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

#: (name, script, arguments, result file it writes), in the order they run: the short
#: ones first, the ones that write tens of GB last.
RELEASE = [
    ("cli_floors", "cli_floors.py", [], "cli_floors.md"),
    ("patches", "patches.py", [], "patches.md"),
    ("engines", "engines.py", [], "engines.md"),
    ("peers", "peers.py", [], "peers.md"),
    ("passes", "passes.py", [], "passes.md"),
    ("digits_exact", "digits_exact.py", ["--repeats", "15"], "digits_exact.md"),
    ("incremental", "incremental.py", [], "incremental.md"),
    ("dictionaries", "dictionaries.py", [], "dictionaries.md"),
    ("chunk_ceiling", "chunk_ceiling.py", [], "chunk_ceiling.md"),
    ("pass_profile", "pass_profile.py", [], "pass_profile.md"),
    ("prefix_scan", "prefix_scan.py", [], "prefix_scan.md"),
    ("inverse_transform", "inverse_transform.py", ["--sizes", "1e6", "1e7"],
     "inverse_transform.md"),
    ("memory_flat", "memory_flat.py", ["--sizes", "1e6", "1e7", "1e8"], "memory_flat.md"),
    ("larger_than_memory", "larger_than_memory.py", [], "larger_than_memory.md"),
    ("billion", "larger_than_memory.py", ["--workflow", "workflows/billion.toml"], "billion.md"),
]


def commands(only=None, skip=()) -> list[tuple[str, list[str], str]]:
    """``(name, argv, result file)`` of the benchmarks selected, in running order."""
    names = [name for name, *_ in RELEASE]
    for name in list(only or []) + list(skip):
        if name not in names:
            raise SystemExit(f"release.py: unknown benchmark {name!r}; one of {', '.join(names)}")
    return [(name, [sys.executable, str(Path("workflows/bench") / script), *args], result)
            for name, script, args, result in RELEASE
            if (not only or name in only) and name not in skip]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true",
                    help="print the commands, one per line, and run nothing")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these benchmarks")
    ap.add_argument("--skip", nargs="+", metavar="NAME", default=[], help="leave these out")
    args = ap.parse_args(argv)
    todo = commands(args.only, args.skip)
    if args.dry_run:
        for name, argv_, result in todo:
            print(f"{name}: {' '.join(argv_[1:])}  -> workflows/bench/results/{result}")
        return 0
    failed = []
    for name, argv_, result in todo:
        print(f"== {name}: {' '.join(argv_[1:])}", flush=True)
        t = time.perf_counter()
        code = subprocess.run(argv_, cwd=ROOT).returncode
        print(f"== {name}: exit {code} after {time.perf_counter() - t:.0f} s "
              f"(workflows/bench/results/{result})", flush=True)
        if code:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
