"""What passes 2 and 3's chunk code reaches without dask: the ceiling of ``cli_floors.py``.

Two processes (one per core, BLAS on one thread each, as the embedded cluster's
workers) each run the pass's chunk function over ``--blocks`` blocks of 65,536
in-memory float32 rows, ``d`` columns, against a dictionary of ``m`` points
(rbf): pass 2's :func:`~ooc_spectral.core.pass2.chunk_moments` (kernel block,
triangular solve, residuals, ``Z'Z``) and pass 3's embedding product
(``k(X, D) G``, :meth:`~ooc_spectral.core.kernels.Kernel.pairwise_dot`). The floors
are those of ``cli_floors.py`` (2-core gemm and ``exp`` rates measured in the
same run; no read, since the rows are in memory): a pass through the command
line cannot do better than its chunk code does here.

Each configuration is run ``--repeats`` times, alternating, and every time is
reported (the machine's speed drifts by 10-20% within minutes).

    python workflows/bench/chunk_ceiling.py                       # m = 300, d = 32 and m = 800, d = 16
    python workflows/bench/chunk_ceiling.py --cases 300:32 --block-rows 4096 30946

Writes ``chunk_ceiling.json`` and ``chunk_ceiling.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from cli_floors import exp_per_s, gemm_gflops  # noqa: E402

ROWS = 65_536


def _dictionary(m: int, d: int):
    from scipy.linalg import solve_triangular

    from ooc_spectral.core.kernels import RBFKernel
    from ooc_spectral.core.model import Dictionary

    rng = np.random.default_rng(0)
    P = rng.standard_normal((m, d))
    k = RBFKernel(gamma=1.0 / d)
    L = np.linalg.cholesky(k(P) + 1e-8 * np.eye(m))
    w = solve_triangular(L, np.ones(m), lower=True)
    return Dictionary(k, P, np.arange(m), k.aux(P), L, w, float(w @ w), True), rng


def _worker(args) -> float:
    m, d, blocks, block_rows, which = args
    from threadpoolctl import threadpool_limits

    from ooc_spectral.core.pass2 import chunk_moments

    D, rng = _dictionary(m, d)
    X = rng.standard_normal((ROWS, d)).astype(np.float32)
    G = rng.standard_normal((m, 2))
    with threadpool_limits(1):
        chunk_moments(X[:1024], D, 0)
        t = time.perf_counter()
        for _ in range(blocks):
            if which == "pass2":
                chunk_moments(X, D, 0, block_rows=block_rows)
            else:
                for a in range(0, ROWS, block_rows):
                    rows = np.ascontiguousarray(X[a:a + block_rows], dtype=np.float64)
                    D.kernel.pairwise_dot(rows, D.points, G, None, D.aux)
        return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=["300:32", "800:16"], help="m:d pairs")
    ap.add_argument("--block-rows", type=int, nargs="+", default=None,
                    help="sub-block rows (default: what plan_block_rows gives, and 30,946)")
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    from ooc_spectral.core.planning import plan_block_rows

    rows = []
    with mp.get_context("spawn").Pool(2) as pool:
        for case in args.cases:
            m, d = (int(v) for v in case.split(":"))
            sizes = args.block_rows or sorted({plan_block_rows(262_144, d, m, itemsize=4), 30_946})
            for which in ("pass2", "pass3"):
                for rep in range(args.repeats):
                    for block_rows in sizes:
                        gemm, exps = gemm_gflops(2) * 1e9, exp_per_s(2)
                        n = 2 * ROWS * args.blocks
                        flops = 2 * n * m * d + (2 * n * m * m if which == "pass2" else 2 * n * m * 2)
                        floor = flops / gemm + n * m / exps
                        seconds = max(pool.map(_worker, [(m, d, args.blocks, block_rows, which)] * 2))
                        rows.append({"m": m, "d": d, "pass": which, "block_rows": block_rows,
                                     "repeat": rep, "seconds": round(seconds, 3),
                                     "floor_seconds": round(floor, 3),
                                     "of_floor": round(floor / seconds, 3),
                                     "gemm_gflops": round(gemm / 1e9, 1),
                                     "exp_per_s": float(f"{exps:.3g}")})
                        print(rows[-1], flush=True)
    command = " ".join(["python", "workflows/bench/chunk_ceiling.py", *sys.argv[1:]])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chunk_ceiling.json").write_text(json.dumps({"command": command, "rows": rows},
                                                       indent=1) + "\n")
    lines = ["# The chunk code's ceiling: passes 2 and 3 in two processes, no dask, rows in memory",
             "", f"Command: `{command}`. Each process: {args.blocks} blocks of {ROWS:,} rows; "
             "floors measured just before each timing (2-core gemm and exp, as in "
             "`cli_floors.py`, without the read).", "",
             "| m | d | pass | sub-block rows | repeat | seconds | floor s | of floor | gemm GFLOP/s | exp /s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['m']} | {r['d']} | {r['pass']} | {r['block_rows']:,} | {r['repeat']} | "
              f"{r['seconds']:.2f} | {r['floor_seconds']:.2f} | **{100 * r['of_floor']:.0f}%** | "
              f"{r['gemm_gflops']} | {r['exp_per_s']:.3g} |" for r in rows]
    (out / "chunk_ceiling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
