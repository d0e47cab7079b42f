"""Passes 2 and 3 of two commits, measured alternately in the same run (issues 36 and 40).

Each commit is checked out in a detached worktree; its fit command runs in turn with the
other's, on the same zarr input and the same parameters (the embedded default, threads
engine on this machine's cores), so that the machine's drift (its own gemm rate moved by
up to 2x between runs minutes apart) falls on both alike:

- ``--pairs`` whole fits each (scan, pass 2, solve, pass 3), from an empty output;
- ``--resumed-pairs`` runs of pass 3 alone inside a fit process: a copy of each commit's
  finished fit with its embedding, markers, model and report removed; the rerun resumes
  the scan and pass 2 from the checkpoint, then solves and writes every row again.

For each stage: every run's seconds, the means, the change of the head's mean from the
base's, and the median of the pairs' ratios (head over base, pair by pair). Writes
``passes_ab.json`` and ``passes_ab.md`` to ``--out``.

    python workflows/bench/passes_ab.py --base c62686f            # head: HEAD of this checkout
    python workflows/bench/passes_ab.py --base c62686f --pairs 2 --resumed-pairs 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def worktree(ref: str, where: Path) -> tuple[Path, str]:
    """A detached worktree of ``ref`` (made once), and its commit."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], check=True,
                         capture_output=True, text=True).stdout.strip()
    path = where / f"tree-{sha}"
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), sha],
                       check=True, capture_output=True)
    return path, sha


def fit_argv(data: Path, out: Path, tol: float, resume: bool) -> list[str]:
    return [sys.executable, "-m", "ooc_spectral", "fit", str(data), "--out", str(out),
            "--tol", repr(tol), "--gamma", "0.05", "--n-components", "3",
            "--max-dictionary-size", "5000", "-q"] + ([] if resume else ["--overwrite"])


def run_fit(tree: Path, data: Path, out: Path, tol: float, resume: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run(fit_argv(data, out, tol, resume), cwd=tree, env=env, check=True,
                   capture_output=True)
    report = json.loads((out / "report.json").read_text())
    return {k: v["seconds"] for k, v in report["stages"].items()} | {
        "m": report["dictionary_size"]}


def resumed_pass3(tree: Path, data: Path, finished: Path, scratch: Path, tol: float) -> dict:
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(finished, scratch)
    for name in ("embedding", "embedding_written", "model"):
        shutil.rmtree(scratch / name, ignore_errors=True)
    (scratch / "report.json").unlink(missing_ok=True)
    return run_fit(tree, data, scratch, tol, resume=True)


def order(pair: int) -> tuple[str, str]:
    """Which commit runs first in pair ``pair``: base, head, then head, base (ABBA), so
    that whatever the first run of a pair leaves to the second (the page cache, the
    disk's write-back of the first run's output) falls on both commits alike."""
    return ("base", "head") if pair % 2 == 0 else ("head", "base")


def summary(base: list[float], head: list[float]) -> dict:
    pairs = [h / b for b, h in zip(base, head)]
    mb, mh = statistics.mean(base), statistics.mean(head)
    return {"base": base, "head": head, "base_mean": mb, "head_mean": mh,
            "change": mh / mb - 1.0, "pair_ratios": pairs,
            "median_pair_ratio": statistics.median(pairs),
            "head_slower_in": sum(r > 1 for r in pairs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit to compare against")
    ap.add_argument("--head", default="HEAD")
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--tol", type=float, default=0.03109898785313094,
                    help="the tol that gives m = 877 on the default data (passes.py's probe "
                         "with --m 650)")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--resumed-pairs", type=int, default=10)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ooc-passes-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    sys.path.insert(0, str(ROOT))
    from ooc_spectral.datasets import make_data

    data = work / f"roll-{args.n}x{args.dim}.zarr"
    make_data("swiss-roll", args.n, data, dim=args.dim, chunk_rows=65536, seed=0, reuse=True,
              pad_std=0.1)
    trees = dict(zip(("base", "head"), (worktree(args.base, work), worktree(args.head, work))))
    t0 = time.time()
    load_before = os.getloadavg()[0]
    full = {"base": [], "head": []}
    for i in range(args.pairs):
        for side in order(i):
            full[side].append(run_fit(trees[side][0], data, work / f"fit-{side}", args.tol))
            print(side, i, json.dumps(full[side][-1]), flush=True)
    resumed = {"base": [], "head": []}
    for i in range(args.resumed_pairs):
        for side in order(i):
            resumed[side].append(resumed_pass3(trees[side][0], data, work / f"fit-{side}",
                                               work / f"resume-{side}", args.tol))
            print("resumed", side, i, resumed[side][-1]["pass3"], flush=True)

    stages = {f"{s} (whole fits)": summary([r[s] for r in full["base"]], [r[s] for r in full["head"]])
              for s in ("scan", "pass2", "pass3") if args.pairs}
    if args.resumed_pairs:
        stages["pass3 (resumed fits)"] = summary([r["pass3"] for r in resumed["base"]],
                                                 [r["pass3"] for r in resumed["head"]])
    result = {
        "command": "python workflows/bench/passes_ab.py " + " ".join(sys.argv[1:]),
        "base": trees["base"][1], "head": trees["head"][1], "n": args.n, "dim": args.dim,
        "tol": args.tol, "m": sorted({r["m"] for side in full.values() for r in side}),
        "cores": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()[0],
        "seconds": time.time() - t0, "runs": {"full": full, "resumed": resumed}, "stages": stages,
    }
    (out / "passes_ab.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# Passes 2 and 3: {result['head']} against {result['base']}, alternately in one run",
        "",
        f"Command: `{result['command']}`; {args.n:,} x {args.dim} rows (swiss roll padded with "
        f"noise, float32 zarr), rbf gamma 0.05, tol {args.tol:.6g} (m = "
        f"{', '.join(map(str, result['m'])) or '-'}), the embedded default (threads engine) on "
        f"{result['cores']} cores; load average {load_before:.2f} before, "
        f"{result['load_after']:.2f} after; {result['seconds']:.0f} s in all. Whole fits: "
        f"{args.pairs} pairs; pass 3 in a resumed fit process: {args.resumed_pairs} pairs "
        "(base first in even pairs, head first in odd ones).",
        "",
        "| stage | base s | head s | base mean | head mean | change of the mean | median pair ratio | head slower in |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, s in stages.items():
        lines.append(
            f"| {name} | {', '.join(f'{v:.2f}' for v in s['base'])} | "
            f"{', '.join(f'{v:.2f}' for v in s['head'])} | {s['base_mean']:.2f} | "
            f"{s['head_mean']:.2f} | {100 * s['change']:+.1f} % | {s['median_pair_ratio']:.3f} | "
            f"{s['head_slower_in']} of {len(s['base'])} |")
    (out / "passes_ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
