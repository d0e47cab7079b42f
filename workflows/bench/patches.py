"""Real rows: image patches, ooc_spectral from zarr against Nystroem + PCA in memory.

Issue 18's second criterion (10^6 rows, m about 300). ``n`` overlapping 8 x 8 patches (default 10^6) of
scikit-image's bundled photographs (astronaut, camera, chelsea, coffee, rocket,
in grey, values in [0, 1]; every patch of the five, 1.14 x 10^6, then a seeded
choice of n), each column standardized, written to zarr as float32 in
131,072-row chunks. Kernel PCA (rbf, ``gamma`` 0.0013, 5 components) by:

- ``ooc``: ``GreedySpectralEmbedding(tol=tol)`` given the zarr path (the embedded
  default engine), then its training embedding computed: what a user of the
  Python API runs;
- ``nystroem``: scikit-learn ``Nystroem(n_components=m)`` + ``PCA(5)`` with m the
  dictionary size ``ooc`` found (equal m), ``fit_transform`` of the rows already
  in memory as float64 (the precision ``ooc`` computes in; reading them is not
  timed).

One case per ``--tols`` value: tol 0.015 gives m = 302 on the 10^6 rows (the
issue's "m about 300"; the criterion is judged on the case whose m is nearest
300), tol 0.05 gives m = 93 (reported beside it: at small m the fixed costs of
the scan and the passes weigh more). In each case the two alternate
``--repeats`` times and the medians are compared. Accuracy:
the embeddings of a seeded 10^4-row subset S, against exact kernel PCA
(``KernelPCA(eigen_solver="dense")``) fitted on S alone, after the best linear
alignment (the main paper's protocol): ``min_A ||E_S A - R||^2 / ||R||^2``.

The machine's own rates are measured in the same run (float64 gemm on all
threads and the exponentials), with the floor of ``ooc``'s pass 2 (kernel
``2nmd`` and accumulation ``2nm^2`` flops at the gemm rate, ``nm``
exponentials). Writes ``patches.json`` and ``patches.md`` to ``--out``.

    pip install -e ".[bench]"                    # scikit-image
    python workflows/bench/patches.py            # 10^6 x 64, about 6 minutes
    python workflows/bench/patches.py --n 100000 --tols 0.05 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

PHOTOS = ("astronaut", "camera", "chelsea", "coffee", "rocket")
GAMMA = 0.0013
N_COMPONENTS = 5
CHUNK_ROWS = 131_072


def patches(n: int, seed: int = 0) -> np.ndarray:
    """``n`` standardized 8 x 8 grey patches (float32), a seeded choice of all of them."""
    import skimage.data
    from skimage.color import rgb2gray
    from sklearn.feature_extraction.image import extract_patches_2d

    parts = []
    for photo in PHOTOS:
        im = getattr(skimage.data, photo)()
        im = rgb2gray(im) if im.ndim == 3 else im / 255.0
        parts.append(extract_patches_2d(im, (8, 8)).reshape(-1, 64).astype(np.float32))
    X = np.concatenate(parts)
    if n > len(X):
        raise SystemExit(f"the five photographs give {len(X):,} patches; ask for at most that many")
    rows = np.sort(np.random.default_rng(seed).choice(len(X), n, replace=False))
    X = X[rows].astype(np.float64)
    X -= X.mean(axis=0)
    X /= X.std(axis=0)
    return X.astype(np.float32)


def write(path: Path, X: np.ndarray) -> str:
    import zarr

    group = zarr.open_group(str(path), mode="w")
    arr = group.create_array("data", shape=X.shape, chunks=(CHUNK_ROWS, X.shape[1]), dtype=X.dtype)
    arr[...] = X
    return str(path)


def run_ooc(data: str, tol: float) -> tuple[float, np.ndarray, dict]:
    from ooc_spectral import GreedySpectralEmbedding

    est = GreedySpectralEmbedding(n_components=N_COMPONENTS, gamma=GAMMA, tol=tol, random_state=0)
    t = time.perf_counter()
    est.fit(data)
    E = np.asarray(est.embedding_.compute() if hasattr(est.embedding_, "compute") else est.embedding_)
    return time.perf_counter() - t, E, {"m": int(est.dictionary_.shape[0]), "timings": est.timings_}


def run_nystroem(X: np.ndarray, m: int) -> tuple[float, np.ndarray]:
    from sklearn.decomposition import PCA
    from sklearn.kernel_approximation import Nystroem

    t = time.perf_counter()
    Z = Nystroem(kernel="rbf", gamma=GAMMA, n_components=m, random_state=0).fit_transform(X)
    E = PCA(N_COMPONENTS, random_state=0).fit_transform(Z)
    return time.perf_counter() - t, E


def alignment_error(E: np.ndarray, R: np.ndarray) -> float:
    A, *_ = np.linalg.lstsq(E, R, rcond=None)
    return float(np.sum((E @ A - R) ** 2) / np.sum(R**2))


def best(fn, repeat: int) -> float:
    out = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t)
    return out


def machine_rates() -> dict:
    rng = np.random.default_rng(0)
    A, B = rng.random((4096, 1024)), rng.random((1024, 1024))
    E = -rng.random((4096, 1024))
    return {"gemm_flops_per_s": 2.0 * 4096 * 1024 * 1024 / best(lambda: A @ B, 5),
            "exp_per_s": E.size / best(lambda: np.exp(E), 5)}


TARGET_M = 300  # the "m about 300"


def run_case(data: str, X: np.ndarray, tol: float, repeats: int, S: np.ndarray, R: np.ndarray,
             rates: dict) -> dict:
    """One tol: ``repeats`` alternating runs of both methods, medians, accuracy on S."""
    ooc_times, nys_times, info = [], [], {}
    for _ in range(repeats):  # alternate, so drift of the machine hits both
        t, E_ooc, info = run_ooc(data, tol)
        ooc_times.append(t)
        t, E_nys = run_nystroem(X, info["m"])
        nys_times.append(t)
    m = info["m"]
    n, d = X.shape
    pass2_floor = (2.0 * n * m * d + 2.0 * n * m * m) / rates["gemm_flops_per_s"] + n * m / rates["exp_per_s"]
    timings = info["timings"]
    return {
        "tol": tol, "m": m,
        "ooc_seconds": ooc_times, "nystroem_seconds": nys_times,
        "ooc_median": statistics.median(ooc_times), "nystroem_median": statistics.median(nys_times),
        "ratio": statistics.median(ooc_times) / statistics.median(nys_times),
        "pairwise_ratios": [a / b for a, b in zip(ooc_times, nys_times)],
        "ooc_stages": timings, "pass2_floor_seconds": pass2_floor,
        "pass2_fraction_of_floor": pass2_floor / timings["pass2"] if timings.get("pass2") else None,
        "alignment_error": {"ooc": alignment_error(E_ooc[S], R), "nystroem": alignment_error(E_nys[S], R)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--tols", type=float, nargs="+", default=[0.015, 0.05])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--subset", type=int, default=10_000)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ooc-patches-"))
    work.mkdir(parents=True, exist_ok=True)

    X32 = patches(args.n)
    data = write(work / f"patches-{args.n}.zarr", X32)
    X = X32.astype(np.float64)
    del X32
    rates = machine_rates()

    from sklearn.decomposition import KernelPCA

    S = np.sort(np.random.default_rng(1).choice(args.n, args.subset, replace=False))
    R = KernelPCA(N_COMPONENTS, kernel="rbf", gamma=GAMMA, eigen_solver="dense").fit_transform(X[S])
    cases = [run_case(data, X, tol, args.repeats, S, R, rates) for tol in args.tols]
    judged = min(cases, key=lambda c: abs(c["m"] - TARGET_M))
    n, d = X.shape
    result = {
        "command": "python workflows/bench/patches.py " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items() if k not in ("workdir", "out")),
        "n": n, "d": d, "gamma": GAMMA, "n_components": N_COMPONENTS, "subset": args.subset,
        "machine": platform.processor() or platform.machine(), "rates": rates,
        "cases": cases, "judged_tol": judged["tol"], "judged_ratio": judged["ratio"],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "patches.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Image patches: ooc_spectral (zarr) against Nystroem + PCA (in memory)", "",
        f"Command: `{result['command']}`", "",
        f"- rows: {n:,} x {d} standardized 8x8 grey patches of scikit-image's photographs, "
        f"float32 zarr; rbf gamma {GAMMA}, {N_COMPONENTS} components",
        f"- machine: float64 gemm {rates['gemm_flops_per_s'] / 1e9:.0f} GFLOP/s, "
        f"exponentials {rates['exp_per_s'] / 1e9:.2f}e9/s",
        f"- seconds are medians of {args.repeats} alternating runs; accuracy is the alignment error "
        f"on {args.subset:,} rows against exact KernelPCA",
        "",
        "| tol | m | ooc_spectral fit + embedding, s | Nystroem(m) + PCA, s | ratio (pairwise) | "
        "accuracy ooc | accuracy Nystroem |",
        "|---:|---:|---:|---:|---|---:|---:|",
    ]
    for c in cases:
        pair = ", ".join(f"{r:.2f}" for r in c["pairwise_ratios"])
        lines.append(f"| {c['tol']} | {c['m']} | {c['ooc_median']:.2f} | {c['nystroem_median']:.2f} | "
                     f"**{c['ratio']:.2f}** ({pair}) | {c['alignment_error']['ooc']:.2e} | "
                     f"{c['alignment_error']['nystroem']:.2e} |")
    lines += ["", f"**Judged case (m nearest {TARGET_M}): tol {judged['tol']}, m = {judged['m']}, "
              f"ratio {judged['ratio']:.2f}** (goal <= 1.2).", ""]
    for c in cases:
        stages = ", ".join(f"{k} {v:.1f} s" for k, v in c["ooc_stages"].items())
        lines.append(f"- tol {c['tol']}: ooc stages (last repeat) {stages}; pass 2 floor "
                     f"{c['pass2_floor_seconds']:.1f} s ({100 * (c['pass2_fraction_of_floor'] or 0):.0f}% of it).")
    (out / "patches.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
