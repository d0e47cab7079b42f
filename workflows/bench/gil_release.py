"""Which of pass 2's per-block operations let another Python thread run (issue 18, item 1).

On the threaded engine (``--engine threads``, what ``auto`` picks for small inputs)
the tasks of a pass share one process: two worker threads only both compute while
the operation each is in releases the GIL. This script times each operation pass 2
does on a block (shapes of the 2 x 10^6 x 16, m = 800 fit) while a second thread
spins in pure Python, and records the longest time the spinner was stalled: an
operation that releases the GIL stalls it for about the interpreter's switch
interval (5 ms); one that holds the GIL stalls it for the whole call.

    python workflows/bench/gil_release.py [--rows 16000 --m 800 --out DIR]

Writes ``gil_release.json`` and ``gil_release.md`` to ``--out``. The result is a
property of the installed NumPy and SciPy, not of the machine's load: the stall of
a GIL-holding call is its duration however busy the machine is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import scipy
from scipy.linalg import solve_triangular
from scipy.linalg.blas import dsyrk
from threadpoolctl import threadpool_limits

from ooc_spectral._accel.threads import longest_gil_stall as longest_stall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=16000)
    ap.add_argument("--m", type=int, default=800)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    c, m, d = args.rows, args.m, args.dim
    rng = np.random.default_rng(0)
    A = rng.standard_normal((m, m))
    L = np.linalg.cholesky(A @ A.T + m * np.eye(m))
    X = rng.standard_normal((c, d))
    P = rng.standard_normal((m, d))
    K = rng.standard_normal((c, m))
    ops = {
        "kernel gemm X P^T (numpy matmul)": lambda: X @ P.T,
        "exponentials (numpy exp)": lambda: np.exp(-np.abs(K)),
        "triangular solve K L^-T (scipy.linalg.solve_triangular, LAPACK trtrs)":
            lambda: solve_triangular(L, K.T, lower=True, check_finite=False),
        "m x m accumulation Z^T Z (numpy matmul)": lambda: K.T @ K,
        "m x m accumulation (scipy.linalg.blas.dsyrk)": lambda: dsyrk(1.0, K, trans=1),
        "row norms (numpy einsum)": lambda: np.einsum("ij,ij->i", K, K),
    }
    rows = []
    with threadpool_limits(1):
        for name, call in ops.items():
            call()  # warm up
            dt, stall = longest_stall(call)
            rows.append({"operation": name, "seconds": dt, "longest_stall_seconds": stall,
                         "releases_gil": bool(stall < 0.5 * dt)})
    result = {"command": " ".join([sys.executable, *sys.argv]), "rows": c, "m": m, "d": d,
              "numpy": np.__version__, "scipy": scipy.__version__,
              "switch_interval_seconds": sys.getswitchinterval(), "operations": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gil_release.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# Which pass-2 operations release the GIL (c = {c:,} rows, m = {m}, d = {d})", "",
             f"Command: `{result['command']}`; NumPy {np.__version__}, SciPy {scipy.__version__}, "
             "BLAS on one thread as in a worker.", "",
             "| operation | call s | longest stall of another Python thread s | releases the GIL |",
             "|---|---:|---:|---|"]
    lines += [f"| {r['operation']} | {r['seconds']:.3f} | {r['longest_stall_seconds']:.3f} | "
              f"{'yes' if r['releases_gil'] else '**no**'} |" for r in rows]
    (out / "gil_release.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
