"""Pass 2's triangular solve: one ``dtrsm`` or the blocked row solve (issue 18, item 1).

Pass 2 turns each sub-block's kernel rows into coordinates ``Z = K L^-T``. Two ways,
timed here on one BLAS thread (what each task of a pass has):

- ``one dtrsm``: ``_blas.solve_lower_transposed`` on the C-ordered c x m block (what
  pass 2 did until 2026-11-25; bitwise ``scipy.linalg.solve_triangular``);
- ``row solve, leaf b``: ``_blas.solve_lower_rows`` on the C-ordered m x c block
  ``k(D, X)`` (what ``Dictionary.kernel_block`` now gives): recursive halving, one
  ``dgemm`` update of the bottom half by the top half, small ``dtrsm`` on blocks of at
  most b rows (since 2026-11-25, evening; before it, a left-looking loop over 64-row
  blocks: 30.2 ms at m = 800 and 15.3 ms at m = 300).

Also the whole chunk function (``accumulate.chunk_moments``: kernel block, solve,
residuals, centring, ``Z'Z``) on a sub-block, and the counted floor of the solve
(``c m^2`` flops at the one-thread gemm rate). Shapes: the sub-blocks of
``workflows/bench/cli_floors.py`` (c = 2,621 at m = 800; c = 6,990 at m = 300).

    python workflows/bench/solve_layouts.py [--out DIR]

Writes ``solve_layouts.json`` and ``solve_layouts.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from ooc_spectral._accel.blas import solve_lower_rows, solve_lower_transposed
from ooc_spectral.core.pass2 import chunk_moments
from ooc_spectral.core.kernel_choice import make_kernel
from ooc_spectral.core.model import Dictionary

SHAPES = ((800, 16, 2621), (300, 32, 6990))
BLOCKS = (16, 32, 48, 64)


def best_ms(f, repeat: int = 9) -> float:
    out = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        out = min(out, time.perf_counter() - t)
    return 1e3 * out


def one_thread_gemm_flops(rng) -> float:
    """float64 gemm FLOP/s of the calling thread (a 2048 x 1024 by 1024 x 1024 product,
    best of 9), for callers that hold BLAS to one thread: NumPy's, or MKL's where it is
    in use and faster (its ``dgemm``, sequential)."""
    from ooc_spectral._accel.blas import mkl

    a, b = rng.random((2048, 1024)), rng.random((1024, 1024))
    best = best_ms(lambda: a @ b)
    if mkl() is not None:
        out = np.empty((2048, 1024))
        best = min(best, best_ms(lambda: mkl_matmul(a, b, out)))
    return 2.0 * 2048 * 1024 * 1024 / (best / 1e3)


def mkl_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = a @ b`` by MKL's sequential ``dgemm`` on the calling thread, for C-ordered
    float64 ``a`` (r x k), ``b`` (k x s) and ``out`` (r x s): the gemm rate of the library
    pass 2 runs on where it is in use (``ooc_spectral._accel.blas.mkl``)."""
    from ooc_spectral._accel.blas import _mkl_call

    (r, k), s = a.shape, b.shape[1]
    # column-major terms: out' (s x r) = b' (s x k) a' (k x r)
    _mkl_call("dgemm_64", b"N", b"N", s, r, k, 1.0, (b, 0), s, (a, 0), k, 0.0, (out, 0), s)
    return out


def dictionary(m: int, d: int, rng) -> Dictionary:
    """A dictionary of m Gaussian points (rbf, gamma 0.5 / d) with its factor."""
    P = rng.standard_normal((m, d))
    k = make_kernel("rbf", gamma=0.5 / d)
    L = np.linalg.cholesky(k(P) + 1e-8 * np.eye(m))
    w = np.linalg.solve(L, np.ones(m))
    return Dictionary(kernel=k, points=P, indices=np.arange(m), aux=k.aux(P), L=L, w=w,
                      beta=float(w @ w), affine=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    with threadpool_limits(1, user_api="blas"):
        gemm = one_thread_gemm_flops(rng)
        for m, d, c in SHAPES:
            D = dictionary(m, d, rng)
            K = rng.standard_normal((c, m))
            KT = np.ascontiguousarray(K.T)
            row = {"m": m, "d": d, "c": c,
                   "floor_ms": 1e3 * c * m * m / gemm,
                   "one_dtrsm_ms": best_ms(lambda: solve_lower_transposed(D.L, K.copy())),
                   "row_solve_ms": {str(blk): best_ms(lambda: solve_lower_rows(D.L, KT.copy(), blk))
                                    for blk in BLOCKS},
                   "copy_ms": best_ms(lambda: KT.copy())}
            X = rng.standard_normal((c, d))
            row["chunk_moments_ms"] = best_ms(lambda: chunk_moments(X, D, 0))
            rows.append(row)
            print(row, flush=True)
    result = {"command": "python workflows/bench/solve_layouts.py", "one_thread_gemm_flops": gemm,
              "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "solve_layouts.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Pass 2's solve: one dtrsm or the blocked row solve (one BLAS thread)", "",
             f"Command: `{result['command']}`; one-thread gemm {gemm / 1e9:.0f} GFLOP/s. Times in ms, "
             "best of 9, each including a copy of the block (column `copy`).", "",
             "| m | c | floor (c m^2 at gemm rate) | one dtrsm | "
             + " | ".join(f"row solve leaf {blk}" for blk in BLOCKS) + " | copy | chunk_moments |",
             "|---:|---:|---:|---:|" + "---:|" * len(BLOCKS) + "---:|---:|"]
    for r in rows:
        lines.append(f"| {r['m']} | {r['c']} | {r['floor_ms']:.1f} | {r['one_dtrsm_ms']:.1f} | "
                     + " | ".join(f"{r['row_solve_ms'][str(blk)]:.1f}" for blk in BLOCKS)
                     + f" | {r['copy_ms']:.1f} | {r['chunk_moments_ms']:.1f} |")
    (out / "solve_layouts.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
