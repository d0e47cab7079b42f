"""Where the time of passes 2 and 3 goes, through ``ooc-spectral fit`` (issue 18, item 1).

Runs the command as users do (the embedded default engine) under ``py-spy
record`` (sampling every thread of the process tree, idle threads excluded),
then attributes the samples of each pass to what the task code was doing:
the zarr read and decode, the float64 copy and finiteness check, the kernel
block's gemm and its exponentials, the triangular solve, the m x m
accumulation, the write-back, and the rest (scheduling, reduction, Python).

In the same run it measures the machine's floors on all cores: float64 gemm
(GFLOP/s) and ``exp`` (values/s), and sets each pass against its counted work
(pass 2: ``2nmd + 2nm^2`` flops and ``n m`` exponentials; pass 3:
``2nmd + 2nmp`` flops and ``n m`` exponentials), as issue 18 counts it.

    pip install py-spy
    python workflows/bench/pass_profile.py --n 2000000 --dim 16 --dictionary-size 800

Writes ``pass_profile.json`` and ``pass_profile.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


from ooc_spectral.datasets import make_data

sys.path.insert(0, str(Path(__file__).parent))
from cli_floors import exp_per_s, gemm_gflops  # noqa: E402

#: (category, substrings of a frame "function (file:line)"), first match from the leaf up
CATEGORIES = [
    ("zarr read + decode", ("zarr/", "numcodecs", "blosc", "zstd", "_read_zarr_block")),
    ("exp + clip (kernel)", ("monotone_to_kernel",)),
    ("kernel gemm + norms", ("pairwise_monotone", "_sq_norms", "kernel_block", "pairwise (")),
    ("triangular solve", ("solve_triangular", "solve (ooc_spectral/core/model.py")),
    ("residuals / certificate", ("residuals", "_row_sums", "_certificate")),
    ("m x m accumulation", ("chunk_moments (ooc_spectral/core/pass2.py",)),
    ("float64 copy + finite check", ("check_finite", "ascontiguousarray")),
    ("embed product", ("embed", "folded")),
    ("reduction (combine)", ("combine",)),
]


def categorize(stack: list[str]) -> str:
    for frame in reversed(stack):
        for name, keys in CATEGORIES:
            if any(k in frame for k in keys):
                return name
    return "other (scheduling, Python)"


def pass_of(stack: list[str]) -> str | None:
    text = ";".join(stack)
    if "_write_block" in text or "_embed_block" in text:
        return "pass3"
    if "chunk_moments" in text or "_combine_many" in text:
        return "pass2"
    return None


def floors(threads: int) -> dict:
    """float64 gemm GFLOP/s and exp values/s on ``threads`` threads, measured now."""
    return {"gemm_gflops": round(gemm_gflops(threads), 1),
            "exp_per_s": float(f"{exp_per_s(threads):.3g}")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=float, default=2e6)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--dictionary-size", type=int, default=800)
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--data", default=None, help="an existing zarr input (default: make-data)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--rate", type=int, default=50, help="py-spy samples per second")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    n = int(args.n)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ooc-prof-"))
    work.mkdir(parents=True, exist_ok=True)
    data = Path(args.data) if args.data else work / f"roll-{n}-{args.dim}.zarr"
    if not data.exists():
        make_data("swiss-roll", n, data, dim=args.dim, seed=0)
    fit_out, raw = work / "fit", work / "profile.txt"
    shutil.rmtree(fit_out, ignore_errors=True)
    cores = os.cpu_count() or 1
    before = floors(cores)
    load0 = os.getloadavg()[0]
    cmd = ["py-spy", "record", "--format", "raw", "--rate", str(args.rate), "--subprocesses",
           "--nonblocking", "-o", str(raw), "--", "ooc-spectral", "fit", str(data), "--out",
           str(fit_out), "--dictionary-size", str(args.dictionary_size), "--n-components", "2",
           "--engine", args.engine, "-q"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = floors(cores)
    report = json.loads((fit_out / "report.json").read_text())
    m, d, p = report["dictionary_size"], report["n_features"], 2
    rate = {k: (before[k] + after[k]) / 2 for k in before}
    counted = {
        "pass2": (2 * n * m * d + 2 * n * m * m) / (rate["gemm_gflops"] * 1e9) + n * m / rate["exp_per_s"],
        "pass3": (2 * n * m * d + 2 * n * m * p) / (rate["gemm_gflops"] * 1e9) + n * m / rate["exp_per_s"],
    }
    samples: dict[str, collections.Counter] = {"pass2": collections.Counter(),
                                              "pass3": collections.Counter()}
    for line in raw.read_text().splitlines():
        stack_text, _, count = line.rpartition(" ")
        stack = stack_text.split(";")
        which = pass_of(stack)
        if which:
            samples[which][categorize(stack)] += int(count)
    rows = {}
    for name in ("pass2", "pass3"):
        seconds = report["stages"][name]["seconds"]
        total = sum(samples[name].values()) or 1
        rows[name] = {"seconds": seconds, "floor_seconds": round(counted[name], 2),
                      "of_floor": round(counted[name] / seconds, 3),
                      "shares": {k: round(v / total, 3) for k, v in samples[name].most_common()}}
    result = {"n": n, "d": d, "m": m, "engine": report["engine"], "threads": report["threads"],
              "tasks": report["tasks"], "task_rows": report["task_rows"],
              "block_rows": report["block_rows"], "floors_before": before, "floors_after": after,
              "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2),
              "passes": rows, "stages": {k: v["seconds"] for k, v in report["stages"].items()},
              "note": "the machine is shared with other engineers' test runs: see the load"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pass_profile.json").write_text(json.dumps(result, indent=1))
    lines = [f"# Where passes 2 and 3 spend their time (n = {n:,}, d = {d}, m = {m}, "
             f"{report['engine']} engine, {report['threads']} threads, {report['tasks']} tasks of "
             f"{report['task_rows']:,} rows, sub-blocks of {report['block_rows']:,})\n\n",
             f"Floors measured in the same run on {cores} cores: gemm {before['gemm_gflops']} / "
             f"{after['gemm_gflops']} GFLOP/s, exp {before['exp_per_s']:.3g} / "
             f"{after['exp_per_s']:.3g} per s (before / after); load average "
             f"{result['load_before']} -> {result['load_after']} ({result['note']}). "
             "Shares are py-spy samples of the pass's task code (idle threads excluded).\n\n",
             "| pass | seconds | counted work at the floors, s | of floor | where the samples are |\n",
             "|---|---|---|---|---|\n"]
    for name, r in rows.items():
        shares = ", ".join(f"{k} {100 * v:.0f}%" for k, v in r["shares"].items())
        lines.append(f"| {name} | {r['seconds']:.2f} | {r['floor_seconds']:.2f} | "
                     f"{100 * r['of_floor']:.0f}% | {shares} |\n")
    lines.append("\n`python workflows/bench/pass_profile.py "
                 f"--n {n} --dim {d} --dictionary-size {args.dictionary_size}`\n")
    (out / "pass_profile.md").write_text("".join(lines))
    print("".join(lines))


if __name__ == "__main__":
    main()
