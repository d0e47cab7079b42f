"""Reproductions of Homrighausen & McDonald (2011), section 3.

Their diffusion map is the divisive normalization (``W = D^-1/2 W~ D^-1/2``,
``W~ = exp(-||x - y||^2 / eps)``, so ``gamma = 1 / eps``), features the
eigenvectors 2..p+1 of ``W``. Methods at *equal cost*:

- ``nystrom``: uniform Nyström on ``m_nys`` landmarks (``O(n m_nys^2)``);
- ``nystrom-diagonal``: their "weighted Nyström", landmarks sampled in
  proportion to the diagonal of the normalized kernel;
- ``gaussian-projection``: Halko et al.'s range finder with ``m_gp`` columns
  and no power iteration (their Algorithm 2, ``O(n^2 m_gp)``);
- ``gaussian-projection-q2``: the same with 2 power iterations (3 times the
  products: *not* equal cost, shown to separate the method from its
  cheapest setting);
- ``greedy``: the greedy dictionary of ``m_nys`` points with every row
  projected (``O(n m_nys^2)`` as Nyström);
- ``random``: a random dictionary of ``m_nys`` points, every row projected;
- ``nystrom-largest-diagonal`` and ``nystrom-volume`` (Belabbas & Wolfe).

For the manifold and clustering tasks the paper sets ``m_nys = sqrt(n m_gp)``
(equal dominant cost); for classification ``m_nys = m_gp = m``.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from ..baselines.exact import ExactKernelEmbedding
from ..baselines.gaussian_projection import GaussianProjectionEmbedding
from ..baselines.nystrom import NystromEmbedding
from ..estimators.embedding import GreedySpectralEmbedding
from .evaluation import (
    align,
    clustering_ari,
    kernel_reconstruction_error,
    svm_accuracy,
    threshold_accuracy,
)
from ..exceptions import InvalidParameterError, OocSpectralError
from . import _paper_common as pc

log = logging.getLogger("ooc_spectral.experiments")

__all__ = ["EXPERIMENTS", "run_fishbowl", "run_halo_ball", "run_digits", "METHODS"]

METHODS = ("nystrom", "nystrom-diagonal", "nystrom-largest-diagonal", "nystrom-volume",
           "gaussian-projection", "gaussian-projection-q2", "greedy", "random")
LABEL = {"exact": "exact (full W)",
         "nystrom": "Nyström (uniform)",
         "nystrom-diagonal": "weighted Nyström (diagonal)",
         "nystrom-largest-diagonal": "Nyström, largest diagonal",
         "nystrom-volume": "Nyström, volume sampling",
         "gaussian-projection": "Gaussian projection",
         "gaussian-projection-q2": "Gaussian projection, 2 power it.",
         "greedy": "greedy dictionary",
         "random": "random dictionary"}


def make_method(method: str, *, p: int, gamma: float, m_nys: int, m_gp: int, seed: int):
    """The estimator of ``method`` (divisive normalization, ``p`` coordinates)."""
    common = dict(gamma=gamma, normalization="divisive", random_state=seed)
    if method == "exact":
        return ExactKernelEmbedding(p, gamma=gamma, normalization="divisive")
    if method.startswith("gaussian-projection"):
        over = m_gp - (p + 1)
        if over < 0:
            raise InvalidParameterError(
                f"m_gp={m_gp} Gaussian columns cannot give n_components={p} diffusion "
                f"coordinates (the trivial one is dropped); use m_gp >= {p + 1}"
            )
        q = 2 if method.endswith("q2") else 0
        return GaussianProjectionEmbedding(p, oversampling=over, power_iterations=q, **common)
    if method in ("greedy", "random"):
        return GreedySpectralEmbedding(p, dictionary_size=m_nys, selection=method,
                                       max_dictionary_size=max(5000, m_nys), **common)
    selection = {"nystrom": "uniform", "nystrom-diagonal": "diagonal",
                 "nystrom-largest-diagonal": "largest-diagonal",
                 "nystrom-volume": "volume"}[method]
    return NystromEmbedding(p, n_landmarks=m_nys, selection=selection, **common)


def _embed(method, X, *, with_estimator=False, **kw):
    est = make_method(method, **kw)
    (est, wall, cpu) = pc.timed(lambda: est.fit(X))
    if with_estimator:
        return np.asarray(est.embedding_), cpu, wall, est
    return np.asarray(est.embedding_), cpu, wall


def _methods(methods, *, p: int, m_gp: int | None = None) -> list[str]:
    meths = pc.as_list("methods", methods)
    pc.check_choices("methods", meths, METHODS)
    if m_gp is not None and m_gp < p + 1 and any(m.startswith("gaussian") for m in meths):
        raise InvalidParameterError(
            f"m_gp={m_gp} Gaussian columns cannot give n_components={p} diffusion coordinates "
            f"(the trivial one is dropped); use m_gp >= {p + 1}"
        )
    return meths


def _unexplained(E, reference) -> float:
    """``1 - R^2`` of the linear alignment of ``E`` onto ``reference``."""
    aligned, _ = align(E, reference)
    R = np.asarray(reference)
    return float(np.sum((aligned - R) ** 2) / np.sum((R - R.mean(axis=0)) ** 2))


# --------------------------------------------------------------------------- #
# fishbowl: manifold recovery (section 3.1, Figure 2)
# --------------------------------------------------------------------------- #
@pc.single_threaded_experiment
def run_fishbowl(out: Path, n=2000, gamma=4.0, m_gp=10, m_nys=None, n_components=2,
                 methods="nystrom,nystrom-diagonal,gaussian-projection,gaussian-projection-q2,greedy",
                 repeats=5, seed=0) -> dict:
    """Fishbowl manifold recovery at equal cost (Homrighausen & McDonald, Figure 2).

    The diffusion map of the fishbowl (``u`` a regular grid of n angles, ``v``
    uniform) by the exact method and each approximation, ``m_nys =
    sqrt(n m_gp)``. Score: ``1 - R^2`` of the linear alignment of each
    approximation onto the exact coordinates (0: the exact embedding up to a
    linear map), over ``repeats`` seeds; and the relative error of the
    normalized kernel matrix the embedding implies, on sampled entries
    (:func:`~ooc_spectral.experiments.evaluation.kernel_reconstruction_error`).
    """
    n, m_gp, p = pc.as_int("n", n, 10), pc.as_int("m_gp", m_gp, 2), pc.as_int("n_components", n_components)
    gamma = pc.as_float("gamma", gamma, 0.0)
    m_nys = round(math.sqrt(n * m_gp)) if m_nys in (None, "None", "null") else pc.as_int("m_nys", m_nys)
    repeats, seed = pc.as_int("repeats", repeats), pc.as_int("seed", seed, 0)
    meths = _methods(methods, p=p, m_gp=m_gp)
    X, labels = pc.load_dataset("fishbowl", n, seed=seed)
    kw = dict(p=p, gamma=gamma, m_nys=m_nys, m_gp=m_gp)

    def reconstruction(est):
        return kernel_reconstruction_error(X, est.embedding_, est.eigenvalues_, gamma=gamma,
                                           normalization="divisive", n_pairs=20000,
                                           random_state=seed)["relative_frobenius"]

    exact, ex_cpu, ex_wall, ex_est = _embed("exact", X, seed=seed, with_estimator=True, **kw)
    results = {"exact": {"cpu": [ex_cpu], "wall": [ex_wall], "unexplained": [0.0],
                         "reconstruction": [reconstruction(ex_est)]}}
    shown = {"exact": exact}
    for meth in meths:
        r = results[meth] = {"cpu": [], "wall": [], "unexplained": [], "reconstruction": []}
        for k in range(repeats):
            try:
                E, cpu, wall, est = _embed(meth, X, seed=seed + k, with_estimator=True, **kw)
            except OocSpectralError as exc:
                log.warning("fishbowl %s seed %d: %s", meth, seed + k, exc)
                continue
            r["cpu"].append(cpu)
            r["wall"].append(wall)
            r["unexplained"].append(_unexplained(E, exact))
            r["reconstruction"].append(reconstruction(est))
            if k == 0:
                shown[meth] = E
        log.info("fishbowl %s: 1-R^2 %s", meth, pc.fmt_ci(*pc.mean_ci(r["unexplained"])))
    rows = []
    for meth, r in results.items():
        size = {"exact": f"n = {n}", "gaussian-projection": f"m_gp = {m_gp}",
                "gaussian-projection-q2": f"m_gp = {m_gp}"}.get(meth, f"m = {m_nys}")
        rows.append([LABEL[meth], size, pc.fmt_ci(*pc.mean_ci(r["unexplained"])),
                     pc.fmt_ci(*pc.mean_ci(r["reconstruction"])),
                     pc.fmt(float(np.median(r["cpu"])) if r["cpu"] else math.nan)])
    plt = pc.pyplot()
    fig, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3.2), squeeze=False)
    for ax, (meth, E) in zip(axes[0], shown.items()):
        ax.scatter(E[:, 0], E[:, 1], c=labels["v"], s=2, cmap="viridis")
        ax.set_title(LABEL[meth], fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    figure = pc.save_figure(fig, out / "hm2011-fishbowl.png")
    md = ["# Fishbowl manifold recovery (Homrighausen & McDonald 2011, section 3.1)", "",
          f"n = {n} points of the fishbowl (unit sphere opened at v = π/4, u a regular grid), "
          f"diffusion map (divisive normalization) with gamma = {gamma:g} (eps = {1 / gamma:.3g}), "
          f"{p} coordinates; equal dominant cost: m_nys = sqrt(n m_gp) = {m_nys}, m_gp = {m_gp}. "
          f"Scores, mean ± 95% CI over {repeats} seeds: 1 − R² of the linear alignment onto the "
          f"exact coordinates (0: the exact embedding up to a linear map); the relative "
          f"Frobenius error of the rank-{p + 1} normalized kernel the embedding implies "
          f"(trivial eigenvector included), on 20000 sampled entries — the exact method's "
          f"value is the best any rank-{p + 1} approximation can do. CPU seconds of the fit "
          f"on one core (median).", "",
          pc.md_table(["method", "size", "1 − R² vs exact", "kernel reconstruction error",
                       "CPU s"], rows), "",
          "![fishbowl embeddings, coloured by v](hm2011-fishbowl.png)"]
    data = {"experiment": "hm2011-fishbowl", "n": n, "gamma": gamma, "m_nys": m_nys,
            "m_gp": m_gp, "results": results}
    paths = pc.write_outputs(out, "hm2011-fishbowl", "\n".join(md), data)
    return {**paths, "figure": figure}


# --------------------------------------------------------------------------- #
# halo and ball: clustering (section 3.2, Figure 3)
# --------------------------------------------------------------------------- #
@pc.single_threaded_experiment
def run_halo_ball(out: Path, n=2000, gammas="4,6.67,10,20", figure_gamma=10.0, m_gp=20,
                  m_nys=None, n_components=2,
                  methods="nystrom,nystrom-diagonal,gaussian-projection,gaussian-projection-q2,greedy",
                  repeats=5, seed=0) -> dict:
    """Halo-and-ball clustering at equal cost (Homrighausen & McDonald, Figure 3).

    For each kernel width, the adjusted Rand index of 2-means on the first
    ``n_components`` diffusion coordinates against the true halo/ball labels,
    and the accuracy of the best threshold on the first coordinate (1.0:
    "separable even in one dimension"), mean ± 95% CI over ``repeats`` seeds.
    """
    n, m_gp, p = pc.as_int("n", n, 10), pc.as_int("m_gp", m_gp, 2), pc.as_int("n_components", n_components)
    gamma_list = pc.as_list("gammas", gammas, float)
    fig_gamma = pc.as_float("figure_gamma", figure_gamma, 0.0)
    if fig_gamma not in gamma_list:
        gamma_list.append(fig_gamma)
    m_nys = round(math.sqrt(n * m_gp)) if m_nys in (None, "None", "null") else pc.as_int("m_nys", m_nys)
    repeats, seed = pc.as_int("repeats", repeats), pc.as_int("seed", seed, 0)
    meths = _methods(methods, p=p, m_gp=m_gp)
    X, labels = pc.load_dataset("halo-ball", n, seed=seed)
    y = labels["label"]
    results: dict = {}
    shown = {}
    for gamma in gamma_list:
        kw = dict(p=p, gamma=gamma, m_nys=m_nys, m_gp=m_gp)
        for meth in ["exact", *meths]:
            r = results.setdefault(meth, {}).setdefault(gamma, {"ari": [], "threshold": [], "cpu": []})
            for k in range(1 if meth == "exact" else repeats):
                try:
                    E, cpu, _ = _embed(meth, X, seed=seed + k, **kw)
                except OocSpectralError as exc:
                    log.warning("halo-ball %s gamma=%g seed %d: %s", meth, gamma, seed + k, exc)
                    continue
                r["ari"].append(clustering_ari(E, y, random_state=seed))
                r["threshold"].append(threshold_accuracy(E[:, 0], y))
                r["cpu"].append(cpu)
                if k == 0 and gamma == fig_gamma:
                    shown[meth] = E
            log.info("halo-ball %s gamma=%g: ARI %s", meth, gamma, pc.fmt_ci(*pc.mean_ci(r["ari"])))
    header = ["method", "size"] + [f"γ = {g:g} (ε = {1 / g:.2g})" for g in gamma_list]
    rows_ari, rows_thr = [], []
    for meth, by_gamma in results.items():
        size = {"exact": f"n = {n}", "gaussian-projection": f"m_gp = {m_gp}",
                "gaussian-projection-q2": f"m_gp = {m_gp}"}.get(meth, f"m = {m_nys}")
        rows_ari.append([LABEL[meth], size] + [pc.fmt_ci(*pc.mean_ci(by_gamma[g]["ari"]))
                                               for g in gamma_list])
        rows_thr.append([LABEL[meth], size] + [pc.fmt_ci(*pc.mean_ci(by_gamma[g]["threshold"]))
                                               for g in gamma_list])
    plt = pc.pyplot()
    fig, axes = plt.subplots(1, len(shown), figsize=(3.2 * len(shown), 3.2), squeeze=False)
    for ax, (meth, E) in zip(axes[0], shown.items()):
        ax.scatter(E[:, 0], E[:, 1], c=y, s=2, cmap="coolwarm")
        ax.set_title(LABEL[meth], fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"halo (blue) and ball (red), γ = {fig_gamma:g}: diffusion coordinates 1 and 2",
                 fontsize=10, y=1.06)
    figure = pc.save_figure(fig, out / "hm2011-halo-ball.png")
    md = ["# Halo-and-ball clustering (Homrighausen & McDonald 2011, section 3.2)", "",
          f"n = {n} points ({int(np.sum(y == 1))} in the ball), diffusion map with "
          f"{p} coordinates, m_nys = sqrt(n m_gp) = {m_nys}, m_gp = {m_gp}; mean ± 95% CI over "
          f"{repeats} seeds (the exact method is deterministic).", "",
          "## Adjusted Rand index of 2-means on the diffusion coordinates", "",
          pc.md_table(header, rows_ari), "",
          "## Accuracy of the best threshold on the first coordinate", "",
          pc.md_table(header, rows_thr), "",
          f"![halo and ball, gamma = {fig_gamma:g}](hm2011-halo-ball.png)"]
    data = {"experiment": "hm2011-halo-ball", "n": n, "m_nys": m_nys, "m_gp": m_gp,
            "gammas": gamma_list,
            "results": {m: {str(g): v for g, v in d.items()} for m, d in results.items()}}
    paths = pc.write_outputs(out, "hm2011-halo-ball", "\n".join(md), data)
    return {**paths, "figure": figure}


# --------------------------------------------------------------------------- #
# digits: classification at equal m (section 3.3, Table 1 and Figure 4)
# --------------------------------------------------------------------------- #
@pc.single_threaded_experiment
def run_digits(out: Path, dataset="digits", mnist=None, n=None, n_test=300, n_components=10,
               m_grid="20,40,80,160,320", m_table=160, gamma="median",
               methods="nystrom,nystrom-diagonal,gaussian-projection,greedy,random",
               repeats=5, cv=5, seed=0) -> dict:
    """Digit classification with an SVM on diffusion features at equal m.

    The diffusion map of all rows (labelled training rows and test rows
    together, as in the paper's semi-supervised setting) gives
    ``n_components`` features; an RBF SVM with ``C`` chosen by ``cv``-fold
    cross-validation on the training rows predicts the ``n_test`` test rows.
    Each repeat draws a new train/test split and new method seeds; the kernel
    width is fixed (median heuristic), not tuned on the test set.
    """
    dataset = str(dataset)
    pc.check_choices("dataset", [dataset], ("digits", "mnist"))
    X, labels = pc.load_dataset(dataset, None if n in (None, "None", "null") else pc.as_int("n", n),
                                seed=pc.as_int("seed", seed, 0), mnist=mnist)
    y = labels["label"]
    n_rows = len(y)
    n_test, p = pc.as_int("n_test", n_test), pc.as_int("n_components", n_components)
    m_list = [m for m in pc.as_list("m_grid", m_grid, int) if p + 1 < m < n_rows]
    m_table = pc.as_int("m_table", m_table)
    if m_table not in m_list:
        m_list = sorted({*m_list, m_table})
    repeats, seed, cv = pc.as_int("repeats", repeats), pc.as_int("seed", seed, 0), pc.as_int("cv", cv, 2)
    g = pc.median_gamma(X, seed) if str(gamma) == "median" else pc.as_float("gamma", gamma, 0.0)
    meths = _methods(methods, p=p, m_gp=min(m_list) if m_list else None)
    splits = []
    for k in range(repeats):
        perm = np.random.default_rng(np.random.SeedSequence([seed, k, 0xD161])).permutation(n_rows)
        splits.append((perm[n_test:], perm[:n_test]))

    def score(E, k):
        tr, te = splits[k]
        return svm_accuracy(E[tr], y[tr], E[te], y[te], cv=cv, random_state=seed)

    exact, ex_cpu, _ = _embed("exact", X, p=p, gamma=g, m_nys=0, m_gp=0, seed=seed)
    results = {"exact": {"all": {"correct": [score(exact, k)["n_correct"] for k in range(repeats)],
                                 "cpu": [ex_cpu]}}}
    log.info("digits exact: %s correct of %d", results["exact"]["all"]["correct"], n_test)
    for meth in meths:
        for m in m_list:
            r = results.setdefault(meth, {}).setdefault(m, {"correct": [], "cpu": []})
            for k in range(repeats):
                try:
                    E, cpu, _ = _embed(meth, X, p=p, gamma=g, m_nys=m, m_gp=m, seed=seed + k)
                except OocSpectralError as exc:
                    log.warning("digits %s m=%d seed %d: %s", meth, m, seed + k, exc)
                    r["correct"].append(None)  # keeps the runs paired by split
                    continue
                r["correct"].append(score(E, k)["n_correct"])
                r["cpu"].append(cpu)
            log.info("digits %s m=%d: %s correct of %d", meth, m, r["correct"], n_test)
    ex_mean, ex_half = pc.mean_ci(results["exact"]["all"]["correct"])
    base = results.get("nystrom", {}).get(m_table, {"correct": []})["correct"]

    def vs_uniform(values):
        pairs = [a - b for a, b in zip(values, base) if a is not None and b is not None]
        return pc.fmt_ci(*pc.mean_ci(pairs)) if len(pairs) > 1 else "n/a"

    rows = [[LABEL["exact"], f"n = {n_rows}", pc.fmt_ci(ex_mean, ex_half),
             pc.fmt(100 * (1 - ex_mean / n_test)),
             vs_uniform(results["exact"]["all"]["correct"])]]
    for meth in meths:
        v = results[meth].get(m_table, {"correct": []})
        mean, half = pc.mean_ci(v["correct"])
        rows.append([LABEL[meth], f"m = {m_table}", pc.fmt_ci(mean, half),
                     pc.fmt(100 * (1 - mean / n_test)),
                     "—" if meth == "nystrom" else vs_uniform(v["correct"])])
    curve_rows = []
    for m in m_list:
        cells = [m]
        for meth in meths:
            v = results[meth].get(m, {"correct": []})
            mean, half = pc.mean_ci([100 * (1 - c / n_test) for c in v["correct"] if c is not None])
            cells.append(pc.fmt_ci(mean, half))
        curve_rows.append(cells)
    plt = pc.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for meth in meths:
        pts = [(m, pc.mean_ci([100 * (1 - c / n_test) for c in results[meth][m]["correct"]
                               if c is not None]))
               for m in m_list if results[meth].get(m, {}).get("correct")]
        ax.errorbar([m for m, _ in pts], [v[0] for _, v in pts], yerr=[v[1] for _, v in pts],
                    fmt="o-", ms=4, capsize=2, label=LABEL[meth])
    ax.axhline(100 * (1 - ex_mean / n_test), color="k", ls="--", label=LABEL["exact"])
    pc.log_xticks(ax, m_list)
    ax.set_xlabel("m (landmarks / dictionary points / Gaussian columns)")
    ax.set_ylabel("misclassification rate (%)")
    ax.set_title(f"{dataset}: SVM on {p} diffusion coordinates, n_test = {n_test}", fontsize=10)
    ax.legend(fontsize=7)
    figure = pc.save_figure(fig, out / "hm2011-digits.png")
    md = ["# Classification on diffusion features (Homrighausen & McDonald 2011, section 3.3)", "",
          f"`{dataset}`: {n_rows} images, {n_rows - n_test} labelled for training and {n_test} "
          f"for testing, all embedded together; {p} diffusion coordinates (divisive "
          f"normalization, gamma = {g:.4g} by the median heuristic); RBF SVM, C by {cv}-fold "
          f"cross-validation; mean ± 95% CI over {repeats} random splits and method seeds.", "",
          f"## Correct test predictions at m = {m_table} (their Table 1)", "",
          pc.md_table(["method", "size", f"# correct of {n_test}", "error %",
                       "Δ correct vs uniform Nyström (paired by split)"], rows), "",
          "## Misclassification rate (%) against m (their Figure 4, right)", "",
          pc.md_table(["m"] + [LABEL[k] for k in meths], curve_rows), "",
          "![misclassification against m](hm2011-digits.png)"]
    data = {"experiment": "hm2011-digits", "dataset": dataset, "n": n_rows, "n_test": n_test,
            "gamma": g, "m": m_list,
            "results": {m: {str(k): v for k, v in d.items()} for m, d in results.items()}}
    paths = pc.write_outputs(out, "hm2011-digits", "\n".join(md), data)
    return {**paths, "figure": figure}


EXPERIMENTS = {
    "hm2011-fishbowl": run_fishbowl,
    "hm2011-halo-ball": run_halo_ball,
    "hm2011-digits": run_digits,
}
