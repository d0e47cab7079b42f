"""Peak memory of the whole process tree does not grow with n.

Generates swiss-roll data padded to ``--dim`` features (float32, zarr, same
chunking) at each size, runs ``ooc-spectral fit`` on it with the same
dictionary size m (Algorithm 2 on a seeded sample) on the embedded
LocalCluster, and samples the resident set size of the command and all its
descendants (client, nannies, workers) every 50 ms.

Writes ``memory_flat.json`` and ``memory_flat.md`` to ``--out``.

    python workflows/bench/memory_flat.py --sizes 1000000 10000000
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from ooc_spectral.datasets import make_data
from ooc_spectral.runtime.monitor import tree_rss


def run_sampled(cmd: list[str], interval: float = 0.05) -> tuple[int, float, int]:
    """Run ``cmd``; returns (peak tree RSS in bytes, seconds, exit code)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(interval)
    err = proc.stderr.read().decode()
    if proc.returncode:
        sys.stderr.write(err)
    return peak, time.perf_counter() - t0, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7])
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--dictionary-size", type=int, default=300)
    ap.add_argument("--chunk-rows", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workdir", default=None, help="where to put the data (default: a temp dir)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ooc-mem-"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in map(int, args.sizes):
        data = work / f"roll-{n}.zarr"
        if not data.exists():
            make_data("swiss-roll", n, data, dim=args.dim, chunk_rows=args.chunk_rows, seed=0)
        fit_out = work / f"fit-{n}"
        shutil.rmtree(fit_out, ignore_errors=True)
        cmd = ["ooc-spectral", "fit", str(data), "--out", str(fit_out), "--dictionary-size",
               str(args.dictionary_size), "--n-components", "2", "--workers", str(args.workers),
               "--memory-limit", "4GiB", "-q"]
        peak, seconds, code = run_sampled(cmd)
        if code:
            raise SystemExit(f"fit failed for n={n}")
        report = json.loads((fit_out / "report.json").read_text())
        rows.append({"n": n, "dim": args.dim, "dictionary_size": report["dictionary_size"],
                     "chunk_rows": args.chunk_rows, "task_rows": report["task_rows"],
                     "peak_tree_rss_bytes": peak, "seconds": round(seconds, 2),
                     "input_bytes": n * args.dim * 4,
                     "stages": {k: v["seconds"] for k, v in report["stages"].items()}})
        print(f"n={n:>12,}  peak RSS {peak / 2**20:8.1f} MiB  {seconds:7.1f} s  m={report['dictionary_size']}",
              flush=True)
        shutil.rmtree(fit_out, ignore_errors=True)
    ratio = rows[-1]["peak_tree_rss_bytes"] / rows[0]["peak_tree_rss_bytes"]
    result = {"command": " ".join(sys.argv), "machine": {"cpus": psutil.cpu_count(),
              "ram_bytes": psutil.virtual_memory().total, "python": platform.python_version()},
              "runs": rows, "ratio_largest_to_smallest": ratio}
    (out / "memory_flat.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Peak memory against n", "", f"Command: `{result['command']}`", "",
             "| n | d | m | input size | peak RSS (process tree) | wall time |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['n']:,} | {r['dim']} | {r['dictionary_size']} | "
                     f"{r['input_bytes'] / 2**20:,.0f} MiB | {r['peak_tree_rss_bytes'] / 2**20:,.1f} MiB | "
                     f"{r['seconds']:.1f} s |")
    lines += ["", f"Largest / smallest peak: **{ratio:.3f}** (target: at most 1.25)."]
    (out / "memory_flat.md").write_text("\n".join(lines) + "\n")
    print(f"ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
