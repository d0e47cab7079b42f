"""Incremental update against a fresh fit (issue 16).

Data: a 3-D swiss roll padded with 13 small noise columns (d = 16, float32, zarr
with 262,144-row chunks). Batch A has ``--n`` rows with the roll angle t in
[1.5 pi, 4.5 pi]; batch B has ``--n-new`` rows, half from that range and half
from a new one, t in [4.5 pi, 5 pi] (a partly new region, so the dictionary grows).

Measured in one run, in one process (dask's threaded scheduler, both cores):

- ``partial_fit(A)`` then ``partial_fit(B)``: the update is the second call (scan
  of B, pass 2 on B, the cross pass over A for the points B added, the solve);
- ``fit`` on A and B together (a dask concatenation of the two zarr arrays), from
  scratch: the scan, pass 2 and the solve (the embedding stays lazy in both).

Reports the update's time as a fraction of the fresh fit's (goal: at most 0.35),
both dictionary sizes, and the largest eigenvalue difference of the two results
(both are kernel PCA of every row projected on their final dictionaries).
Writes ``incremental.json`` and ``incremental.md`` to ``--out``.

    python workflows/bench/incremental.py                   # n = 10^7 + 10^6
    python workflows/bench/incremental.py --n 1000000 --n-new 100000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

CHUNK = 262_144
D = 16


def write_roll(path: Path, n: int, t_ranges, seed: int):
    import zarr

    z = zarr.create_array(str(path), shape=(n, D), chunks=(CHUNK, D), dtype="float32")
    rng = np.random.default_rng(seed)
    for a in range(0, n, CHUNK):
        b = min(a + CHUNK, n)
        c = b - a
        lo, hi = t_ranges[rng.integers(len(t_ranges), size=c)].T
        t = lo + (hi - lo) * rng.random(c)
        h = 21 * rng.random(c)
        block = np.empty((c, D), dtype=np.float32)
        block[:, 0], block[:, 1], block[:, 2] = t * np.cos(t), h, t * np.sin(t)
        block[:, 3:] = 0.05 * rng.standard_normal((c, D - 3))
        z[a:b] = block
    return z


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=float, default=1e7)
    ap.add_argument("--n-new", type=float, default=1e6)
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--gamma", type=float, default=0.02)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()

    import dask
    import dask.array as da

    from ooc_spectral import GreedySpectralEmbedding

    n, n_new = int(args.n), int(args.n_new)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="incremental-"))
    old = np.array([[1.5 * np.pi, 4.5 * np.pi]])
    mixed = np.array([[1.5 * np.pi, 4.5 * np.pi], [4.5 * np.pi, 5.0 * np.pi]])
    t = time.perf_counter()
    A = write_roll(work / "a.zarr", n, old, 1)
    B = write_roll(work / "b.zarr", n_new, mixed, 2)
    gen = time.perf_counter() - t
    params = dict(n_components=4, gamma=args.gamma, tol=args.tol, random_state=0)
    warnings.simplefilter("ignore")
    with dask.config.set(scheduler="threads"):
        inc = GreedySpectralEmbedding(**params)
        t = time.perf_counter()
        inc.partial_fit(A)
        first = time.perf_counter() - t
        m_first = inc.dictionary_.shape[0]
        t = time.perf_counter()
        inc.partial_fit(B)
        update = time.perf_counter() - t
        both = da.concatenate([da.from_zarr(A), da.from_zarr(B)], axis=0).rechunk({0: CHUNK})
        t = time.perf_counter()
        fresh = GreedySpectralEmbedding(**params).fit(both)
        fresh_s = time.perf_counter() - t
    res = {
        "n": n, "n_new": n_new, "d": D, "tol": args.tol, "gamma": args.gamma,
        "generate_seconds": gen, "partial_fit_first_seconds": first, "update_seconds": update,
        "fresh_fit_seconds": fresh_s, "fresh_fit_stages": {k: round(v, 3) for k, v in fresh.timings_.items()},
        "update_fraction": update / fresh_s,
        "dictionary_first": int(m_first), "dictionary_after_update": int(inc.dictionary_.shape[0]),
        "dictionary_fresh": int(fresh.dictionary_.shape[0]),
        "eigenvalues_update": inc.eigenvalues_.tolist(), "eigenvalues_fresh": fresh.eigenvalues_.tolist(),
        "eigenvalue_max_rel_diff": float(np.max(np.abs(inc.eigenvalues_ - fresh.eigenvalues_)
                                                / fresh.eigenvalues_)),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "incremental.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "incremental.md").write_text(
        f"# Incremental update (n = {n:,} + {n_new:,}, d = {D}, tol = {args.tol})\n\n"
        f"`python workflows/bench/incremental.py --n {n} --n-new {n_new}`\n\n"
        "| | seconds |\n|---|---:|\n"
        f"| partial_fit(A), n rows | {first:.1f} |\n"
        f"| partial_fit(B): the update | {update:.1f} |\n"
        f"| fit(A and B) from scratch | {fresh_s:.1f} |\n\n"
        f"Update / fresh fit: **{res['update_fraction']:.2f}** (goal <= 0.35). Dictionary: "
        f"{m_first} after A, {res['dictionary_after_update']} after the update, "
        f"{res['dictionary_fresh']} for the fresh fit (another visiting order). Largest "
        f"relative eigenvalue difference: {res['eigenvalue_max_rel_diff']:.1e}.\n")
    print(json.dumps({k: res[k] for k in ("update_seconds", "fresh_fit_seconds", "update_fraction",
                                           "dictionary_first", "dictionary_after_update",
                                           "dictionary_fresh")}))


if __name__ == "__main__":
    main()
