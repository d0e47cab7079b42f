"""Where one sub-block of pass 2 spends its time, part by part (issue 18, item 1).

Runs the steps of :func:`ooc_spectral.core.pass2.chunk_moments` one after the
other, as the chunk function does, on one BLAS thread (what each task of a pass
has), and times each: the float64 copy and finiteness check, the kernel block
``k(D, X)`` (product and exponentials), the triangular solve, the residuals, the
mean and centring, and the m x m accumulation (``syrk`` into the task's accumulator);
then ``chunk_moments`` itself per sub-block. Beside them, the time
the counted flops would take at this thread's gemm rate (the solve: ``c m^2``; the
accumulation: ``c m^2``; the kernel product: ``2 c m d``). Shapes: the sub-blocks of
``cli_floors.py`` (c = 6,990 at m = 300, d = 32; c = 2,621 at m = 800, d = 16), on
a Gaussian dictionary (``solve_layouts.dictionary``).

    python workflows/bench/pass2_parts.py [--repeats 30] [--out DIR]

Writes ``pass2_parts.json`` and ``pass2_parts.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from ooc_spectral._accel.blas import add_gram_lower, blas_backend, fast_solve_order
from ooc_spectral._accel.fused import centre_rows
from ooc_spectral.core.pass2 import _column_means, _kernel_scratch, chunk_moments
from ooc_spectral.core.planning import solve_block_rows
from ooc_spectral._validation import check_finite
from ooc_spectral.core.statistics import RowSums

sys.path.insert(0, str(Path(__file__).parent))
from solve_layouts import SHAPES, dictionary, one_thread_gemm_flops  # noqa: E402


def parts_once(X32: np.ndarray, D) -> dict:
    """c rows, step by step as ``chunk_moments`` does them (in sub-blocks of
    :func:`~ooc_spectral.core.planning.solve_block_rows` rows in the order this BLAS solves
    fastest): seconds per step, summed over the sub-blocks."""
    t, out = time.perf_counter(), {}

    def tick(name):
        nonlocal t
        now = time.perf_counter()
        out[name] = out.get(name, 0.0) + now - t
        t = now

    order = fast_solve_order()
    step = solve_block_rows(len(X32), D.size, order)
    acc = np.zeros((D.size, D.size), order="F")
    for a in range(0, len(X32), step):
        X = np.ascontiguousarray(X32[a:a + step], dtype=np.float64)
        check_finite(X, 0)
        tick("float64 copy + check")
        c, m = X.shape[0], D.size
        ksum = np.empty(m) if order == "C" else None
        if ksum is None:
            K, kx = D.kernel_block(X, out=_kernel_scratch(m, c, order), order=order)
        else:  # the kernel rows and, as one more row, their mean kbar
            K = _kernel_scratch(m, c + 1, order)
            _, kx = D.kernel_block(X, out=K[:c], order=order, col_sums=ksum)
            np.divide(ksum, c, out=K[c])
        tick("kernel block")
        Z = D.solve(K, overwrite=True)
        tick("triangular solve")
        if ksum is None:  # as _centred_coordinates does it in each order
            dhat = D.unconstrained_residuals(Z, kx)
            D.residuals(Z, kx, dhat)
            RowSums.of(Z, kx, dhat)
            tick("residuals + sums")
            Z -= _column_means(Z)
            tick("mean + centring")
        else:
            Z, mean = Z[:c], Z[c].copy()  # the mean L^-1 kbar, solved with the rows
            sq, zw = centre_rows(Z, mean, D.w if D.affine else None)
            tick("mean + centring (with the norms and z.w, piece by piece)")
            dhat = kx - sq
            D.residuals(None, kx, dhat, zw)
            RowSums.of(None, kx, dhat)
            tick("residuals + sums")
        add_gram_lower(acc, Z)
        tick("m x m accumulation (syrk)")
    return out


def whole_chunk_ms(X32: np.ndarray, D, c: int, repeats: int) -> float:
    """``chunk_moments`` itself on 16 sub-blocks of c rows (parts, fold and all):
    the median ms per sub-block."""
    X = np.concatenate([X32] * 16)
    chunk_moments(X, D, 0, block_rows=c)
    times = []
    for _ in range(max(3, repeats // 6)):
        t = time.perf_counter()
        chunk_moments(X, D, 0, block_rows=c)
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times)) / 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    with threadpool_limits(1, user_api="blas"):
        gemm = one_thread_gemm_flops(rng)
        for m, d, c in SHAPES:
            D = dictionary(m, d, rng)
            X32 = rng.standard_normal((c, d)).astype(np.float32)
            runs = [parts_once(X32, D) for _ in range(args.repeats)]
            median = {k: 1e3 * float(np.median([r[k] for r in runs])) for k in runs[0]}
            floors = {"kernel block": 1e3 * 2 * c * m * d / gemm,
                      "triangular solve": 1e3 * c * m * m / gemm,
                      "m x m accumulation (syrk)": 1e3 * c * m * m / gemm}
            rows.append({"m": m, "d": d, "c": c, "order": fast_solve_order(),
                         "sub_block_rows": solve_block_rows(c, m, fast_solve_order()),
                         "median_ms": median, "gemm_rate_ms": floors,
                         "total_ms": sum(median.values()),
                         "chunk_moments_ms": whole_chunk_ms(X32, D, c, args.repeats)})
            print(rows[-1], flush=True)
    result = {"command": "python workflows/bench/pass2_parts.py", "one_thread_gemm_flops": gemm,
              "blas": blas_backend(), "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "pass2_parts.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Pass 2, one sub-block part by part (one BLAS thread)", "",
             f"Command: `{result['command']}`; {result['blas']}; one-thread gemm "
             f"{gemm / 1e9:.0f} GFLOP/s; medians of "
             f"{args.repeats} sub-blocks, ms. `at gemm rate`: the part's counted flops at that rate "
             "(its exponentials not included).", ""]
    for r in rows:
        lines += [f"## m = {r['m']}, d = {r['d']}, c = {r['c']}: {r['total_ms']:.1f} ms in all", "",
                  f"Kernel block in {r['order']} order, sub-blocks of {r['sub_block_rows']:,} rows.", "",
                  f"`chunk_moments` itself (16 sub-blocks, their fold included): "
                  f"{r['chunk_moments_ms']:.1f} ms per sub-block.", "",
                  "| part | ms | at gemm rate, ms |", "|---|---:|---:|"]
        for k, v in r["median_ms"].items():
            f = r["gemm_rate_ms"].get(k)
            lines.append(f"| {k} | {v:.2f} | {'' if f is None else f'{f:.2f}'} |")
        lines.append("")
    (out / "pass2_parts.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
