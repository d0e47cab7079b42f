"""The sequential scan on every core: BLAS's own threads or the scan's block split.

Pass 1 is sequential, but each block's coordinates against the dictionary (a
c x m kernel block and a triangular solve against the m x m factor) are
independent row by row. Below ``planning.SCAN_ONE_BLAS_THREAD_BELOW`` points the
scan runs BLAS on one thread and cuts each block in one part per core
(``blocked.block_coordinates``); above it, OpenBLAS shares each call. This script
times the scan of the same rows both ways, at several dictionary sizes, to place
that size:

- ``blas threads``: the threshold at 0 (BLAS on every thread, blocks whole);
- ``block split``: the threshold above every m (BLAS on one thread, blocks split).

The selection is the same both ways (``tests/test_scan.py``); the script checks it.
Rows: ``--n`` swiss-roll rows in memory (d = 3), rbf kernel, ``tol`` 1e-3, one
gamma per dictionary size.

    python workflows/bench/scan_threads.py [--n 500000] [--out DIR]

Writes ``scan_threads.json`` and ``scan_threads.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from sklearn.datasets import make_swiss_roll

import ooc_spectral.core.scan.blocked as scan
from ooc_spectral.core.kernel_choice import make_kernel
from ooc_spectral.core.planning import VisitOrder
from ooc_spectral.io.source import open_source
from ooc_spectral.pipeline.scan import scan_source

GAMMAS = (0.1, 0.2, 0.3, 0.5)
TOL = 1e-3


def timed_scan(X: np.ndarray, gamma: float, below: int) -> tuple[float, np.ndarray]:
    scan.SCAN_ONE_BLAS_THREAD_BELOW = below
    state = scan.DictionaryState(make_kernel("rbf", gamma=gamma), X.shape[1], affine=True)
    t = time.perf_counter()
    scan_source(open_source(X), VisitOrder(len(X), 0), state, tol=TOL, max_size=20_000)
    return time.perf_counter() - t, state.indices.copy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=500_000)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    X = make_swiss_roll(args.n, random_state=0)[0]
    default = scan.SCAN_ONE_BLAS_THREAD_BELOW
    rows = []
    for gamma in GAMMAS:
        t_blas, d_blas = timed_scan(X, gamma, 0)
        t_split, d_split = timed_scan(X, gamma, 10**9)
        if not np.array_equal(d_blas, d_split):
            raise SystemExit(f"gamma {gamma}: the two ways selected different rows")
        rows.append({"gamma": gamma, "m": int(len(d_blas)), "blas_threads_s": t_blas,
                     "block_split_s": t_split})
        print(rows[-1], flush=True)
    result = {"command": f"python workflows/bench/scan_threads.py --n {args.n}", "n": args.n,
              "tol": TOL, "cores": os.cpu_count(), "threshold": default, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scan_threads.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# The scan on {os.cpu_count()} cores: BLAS threads or the block split", "",
             f"Command: `{result['command']}` (swiss roll, d = 3, rbf, tol {TOL}; "
             "the same rows selected both ways)", "",
             "| gamma | m | BLAS threads, s | block split, s | split / BLAS |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['gamma']} | {r['m']} | {r['blas_threads_s']:.2f} | {r['block_split_s']:.2f} | "
              f"{r['block_split_s'] / r['blas_threads_s']:.2f} |" for r in rows]
    lines += ["", f"`SCAN_ONE_BLAS_THREAD_BELOW` = {default}: the split below it, BLAS's threads "
              "from there on."]
    (out / "scan_threads.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
