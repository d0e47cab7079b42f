"""The client's small O(m^3) stages on one BLAS thread or two, on quiet and shared cores.

After pass 2 the client computes the rounding constants of the dictionary's factor
(``rounding``), the eigensolve of the m x m statistic and the eigenvalue interval
(``solve``). Below ``planning.CLIENT_ONE_BLAS_THREAD_BELOW`` points they run BLAS on one
thread (``planning.small_blas``). This script times both stages of a real dictionary
both ways, on quiet cores and with one core kept busy by another process (a batch job
on a shared machine, a test suite's other worker), to place that size:

- ``one thread``: the stages inside ``small_blas`` (BLAS limited to one thread);
- ``all threads``: BLAS on every core (OpenBLAS's default).

Each figure is the median of ``--repeats`` runs. Dictionaries: swiss-roll rows, rbf,
tol 1e-3, one gamma per size.

    python workflows/bench/client_blas.py [--repeats 5] [--out DIR]

Writes ``client_blas.json`` and ``client_blas.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.datasets import make_swiss_roll
from threadpoolctl import threadpool_limits

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.core.eigensolve import sorted_eigenpairs
from ooc_spectral.core.planning import CLIENT_ONE_BLAS_THREAD_BELOW
from ooc_spectral.core.rounding import with_rounding

#: (rows, gamma): dictionaries of about 450, 1,200 and 2,250 points at tol 1e-3
SIZES = ((20_000, 0.05), (30_000, 0.15), (40_000, 0.3))
TOL = 1e-3


def stages(dictionary, C) -> float:
    t = time.perf_counter()
    with_rounding(dictionary, target=TOL, cap=TOL)
    sorted_eigenpairs(C, 2)
    return time.perf_counter() - t


def timed(dictionary, C, threads: int | None, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        with threadpool_limits(limits=threads, user_api="blas") if threads else contextlib.nullcontext():
            runs.append(stages(dictionary, C))
    return float(np.median(runs))


@contextlib.contextmanager
def busy_core():
    """One core kept busy by another process for the duration."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    rows = []
    for n, gamma in SIZES:
        X = make_swiss_roll(n, random_state=0)[0]
        est = GreedySpectralEmbedding(n_components=2, gamma=gamma, tol=TOL, random_state=0).fit(X)
        d = est.spectral_map_.dictionary
        Z = d.coordinates(X[:5000])[0]
        C = np.cov(Z, rowvar=False)
        row = {"n": n, "gamma": gamma, "m": int(d.size)}
        for cores, ctx in (("quiet", contextlib.nullcontext), ("shared", busy_core)):
            with ctx():
                row[f"{cores}_one_s"] = timed(d, C, 1, args.repeats)
                row[f"{cores}_all_s"] = timed(d, C, None, args.repeats)
        rows.append(row)
        print(row, flush=True)
    result = {"command": f"python workflows/bench/client_blas.py --repeats {args.repeats}",
              "tol": TOL, "cores": os.cpu_count(), "threshold": CLIENT_ONE_BLAS_THREAD_BELOW,
              "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "client_blas.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# The client's rounding and solve stages on {os.cpu_count()} cores: one BLAS "
             "thread or all", "",
             f"Command: `{result['command']}` (swiss roll, rbf, tol {TOL}; median of "
             f"{args.repeats} runs; shared: another process keeps one core busy)", "",
             "| m | quiet, one thread, s | quiet, all, s | all / one | shared, one thread, s "
             "| shared, all, s | all / one |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['m']} | {r['quiet_one_s']:.3f} | {r['quiet_all_s']:.3f} | "
              f"{r['quiet_all_s'] / r['quiet_one_s']:.2f} | {r['shared_one_s']:.3f} | "
              f"{r['shared_all_s']:.3f} | {r['shared_all_s'] / r['shared_one_s']:.2f} |"
              for r in rows]
    lines += ["", f"`CLIENT_ONE_BLAS_THREAD_BELOW` = {CLIENT_ONE_BLAS_THREAD_BELOW}: one thread "
              "below it, BLAS's threads from there on."]
    (out / "client_blas.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
