"""The stability experiment of Bengio et al. (2003), section 5.

Is the out-of-sample error of each method's Nyström extension small against
the embedding's own variability when the training set changes? For each method
and each fraction f of substituted training rows:

1. Split the n rows of D at random into F (``|F| = n (1 - f) / (1 + f)`` rows) and
   two halves R1, R2 of the rest, so that F u R1 and F u R2 differ in a fraction
   f of their rows. Fit on F u R1 and on F u R2; align the second embedding on
   the first by an affine map fitted (least squares) on the rows of F; the
   *training-set variability* of ``s_i`` in F is the Euclidean distance between
   its two aligned coordinates.
2. For ``n_loo`` rows ``s_i`` of F (a seeded subset; the paper uses all of F),
   fit on ``(F u R1) \\ {s_i}``, embed ``s_i`` with ``transform``, align that
   model on the F u R1 embedding by an affine map fitted on their common rows,
   and measure the distance to the coordinates of ``s_i`` in the F u R1
   embedding: the *out-of-sample error*. (The paper does not say it aligns in
   this step; without it a sign flip of an eigenvector would count as error.)
3. Report the mean over those ``s_i`` of (variability - out-of-sample error)
   with a 95% confidence interval (1.96 standard errors), against f.

A positive difference means the extension errs less than the embedding moves
when a fraction f of the training set is replaced. The fraction at which the
variability (linear from 0 at f = 0 through the points measured) reaches the
mean out-of-sample error is its "substitution equivalent"
(:func:`substitution_equivalent`); the paper finds 1-4%.

Methods (``methods``): ``mds`` (:class:`~ooc_spectral.manifold.MetricMDS`,
Euclidean, out of core), ``spectral`` (the divisive embedding of
:class:`~ooc_spectral.GreedySpectralEmbedding`: spectral clustering /
Laplacian eigenmaps' unit eigenvectors), ``isomap``
(:class:`~ooc_spectral.manifold.Isomap`) and ``lle``
(:class:`~ooc_spectral.manifold.LocallyLinearEmbedding`), each giving a 2-D
embedding as in the paper. The paper's data (698 face images of 4096 pixels)
is replaced by a synthetic set of :mod:`ooc_spectral.datasets` (default the
swiss roll, n = 698, which the paper lists among the sets giving
"qualitatively similar results").

Writes ``stability.md`` (the table), ``stability.json`` (every number) and
``stability.png`` (one panel per method, as the paper's Figure 1) under ``out``.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from .._validation import check_float, check_int
from ..exceptions import InvalidParameterError

__all__ = ["EXPERIMENTS", "run_stability", "affine_align", "split_sizes", "substitution_equivalent",
           "METHODS"]

log = logging.getLogger(__name__)

METHODS = ("mds", "spectral", "isomap", "lle")
TITLES = {"mds": "MDS (classical, Euclidean)",
          "spectral": "spectral clustering / Laplacian eigenmaps",
          "isomap": "Isomap", "lle": "LLE"}


def _below_warning(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


@contextmanager
def _quiet_core():
    """Drop the core's per-stage INFO lines (hundreds of fits) while the experiment runs."""
    core = logging.getLogger("ooc_spectral")
    core.addFilter(_below_warning)
    try:
        yield
    finally:
        core.removeFilter(_below_warning)


def affine_align(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """``(p + 1) x q`` coefficients of the affine map ``[source, 1] C ~ target`` (least squares)."""
    A = np.column_stack([source, np.ones(source.shape[0])])
    coef, *_ = np.linalg.lstsq(A, target, rcond=None)
    return coef


def _apply(coef: np.ndarray, E: np.ndarray) -> np.ndarray:
    return E @ coef[:-1] + coef[-1]


def split_sizes(n: int, fraction: float) -> tuple[int, int]:
    """``(|F|, |R1|)`` for n rows so that F u R1 and F u R2 share a fraction 1 - f.

    ``f = |R1| / (|F| + |R1|)`` with ``|F| + 2 |R1| <= n``; the rows left over by
    rounding are not used.
    """
    m = int(round(n * (1.0 - fraction) / (1.0 + fraction)))
    h = (n - m) // 2
    return m, h


def _model_factory(method: str, *, n_neighbors: int, gamma, tol: float, seed: int
                   ) -> Callable[[np.ndarray], tuple[np.ndarray, Callable]]:
    """``fit(X) -> (embedding, transform)`` for one method (2-D embeddings)."""
    from ..estimators.embedding import GreedySpectralEmbedding
    from ..estimators.manifold import Isomap, LocallyLinearEmbedding, MetricMDS

    def make():
        if method == "mds":
            return MetricMDS(2, random_state=seed)
        if method == "spectral":
            return GreedySpectralEmbedding(2, gamma=gamma, tol=tol, normalization="divisive",
                                           random_state=seed)
        if method == "isomap":
            return Isomap(2, n_neighbors=n_neighbors, eigen_solver="dense")
        return LocallyLinearEmbedding(2, n_neighbors=n_neighbors, eigen_solver="dense")

    def fit(X):
        est = make().fit(X)
        return np.asarray(est.embedding_), est.transform

    return fit


def _parse_methods(methods) -> list[str]:
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    if not isinstance(methods, (list, tuple)) or not methods:
        raise InvalidParameterError(
            f"stability: methods={methods!r} must be a list or a comma-separated string of "
            f"{', '.join(METHODS)}")
    for m in methods:
        if m not in METHODS:
            raise InvalidParameterError(
                f"stability: unknown method {m!r} in methods; expected some of {', '.join(METHODS)}")
    return list(dict.fromkeys(methods))


def _parse_fractions(fractions) -> list[float]:
    if isinstance(fractions, (int, float)) and not isinstance(fractions, bool):
        fractions = [fractions]
    if isinstance(fractions, str):
        try:
            fractions = [float(v) for v in fractions.split(",") if v.strip()]
        except ValueError:
            fractions = None
    if not isinstance(fractions, (list, tuple)) or not fractions:
        raise InvalidParameterError(
            f"stability: fractions={fractions!r} must be a non-empty list of numbers in (0, 1), "
            "e.g. [0.05, 0.1, 0.2]")
    out = []
    for f in fractions:
        f = check_float("stability", "fractions", f, low=0.0, low_open=True)
        if f >= 1.0:
            raise InvalidParameterError(
                f"stability: fractions holds {f}; each fraction of substituted rows must be in (0, 1)")
        out.append(f)
    return sorted(set(out))


def _one_split(fit, X: np.ndarray, fraction: float, n_loo: int, rng: np.random.Generator) -> dict:
    n = X.shape[0]
    m, h = split_sizes(n, fraction)
    if h < 1 or m < 2:
        raise InvalidParameterError(
            f"stability: with n={n}, fraction {fraction} leaves |F|={m} and |R1|={h}; "
            "raise n or choose a fraction further from 0 and 1")
    perm = rng.permutation(n)
    F, R1, R2 = perm[:m], perm[m:m + h], perm[m + h:m + 2 * h]
    train1 = np.concatenate([F, R1])
    train2 = np.concatenate([F, R2])
    e1, _ = fit(X[train1])
    e2, _ = fit(X[train2])
    coef = affine_align(e2[:m], e1[:m])
    variability = np.linalg.norm(_apply(coef, e2[:m]) - e1[:m], axis=1)
    loo = np.arange(min(n_loo, m))  # positions in F (F is already in random order)
    oos = np.empty(loo.size)
    for j, i in enumerate(loo):
        keep = np.delete(np.arange(train1.size), i)
        e_loo, transform = fit(X[train1[keep]])
        new = np.asarray(transform(X[train1[i]][None, :]))
        coef = affine_align(e_loo, e1[keep])
        oos[j] = float(np.linalg.norm(_apply(coef, new)[0] - e1[i]))
    scale = float(np.sqrt(np.mean(np.sum((e1 - e1.mean(axis=0)) ** 2, axis=1))))
    return {"F": int(m), "R": int(h), "n_train": int(m + h), "variability": variability[loo],
            "variability_all_F": float(variability.mean()), "oos": oos, "scale": scale}


def substitution_equivalent(fractions, variability, oos_level: float) -> float | None:
    """Fraction of substituted rows whose variability equals the out-of-sample error.

    The variability curve is taken piecewise linear through ``(0, 0)`` (no row
    substituted, no variability) and the points measured; the result is where
    it first reaches ``oos_level``, or None if it never does within the
    fractions run.
    """
    f = np.concatenate([[0.0], np.asarray(fractions, dtype=float)])
    v = np.concatenate([[0.0], np.asarray(variability, dtype=float)])
    for i in range(1, f.size):
        if v[i] >= oos_level:
            if v[i] == v[i - 1]:
                return float(f[i])
            return float(f[i - 1] + (f[i] - f[i - 1]) * (oos_level - v[i - 1]) / (v[i] - v[i - 1]))
    return None


def _figure(path: Path, methods: list[str], rows: list[dict], title: str) -> None:
    from matplotlib.figure import Figure

    cols = 2 if len(methods) > 1 else 1
    nrow = -(-len(methods) // cols)
    fig = Figure(figsize=(5.0 * cols, 3.6 * nrow), dpi=100, layout="constrained")
    axes = fig.subplots(nrow, cols, squeeze=False).ravel()
    for ax, method in zip(axes, methods):
        mine = [r for r in rows if r["method"] == method]
        f = np.array([r["fraction"] for r in mine])
        d = np.array([r["diff_mean"] for r in mine])
        ci = np.array([r["diff_ci95"] for r in mine])
        oos = np.array([r["oos_mean"] for r in mine])
        ax.axhline(0.0, color="0.6", lw=0.8)
        ax.errorbar(f, d, yerr=ci, fmt="o-", color="C0", capsize=3, ms=4,
                    label="variability - out-of-sample error")
        ax.plot(f, oos, "s--", color="C1", ms=3, lw=1, label="out-of-sample error")
        ax.set_title(TITLES[method], fontsize=10)
        ax.set_xlabel("fraction of training rows substituted")
        ax.set_ylabel("distance in the embedding")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    for ax in axes[len(methods):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=100)


def run_stability(out: Path, *, n: int = 698, dataset: str = "swiss-roll", noise: float = 0.0,
                  fractions=(0.02, 0.05, 0.1, 0.15, 0.2, 0.25), n_loo: int = 20,
                  repeats: int = 3, methods="mds,spectral,isomap,lle", n_neighbors: int = 10,
                  gamma: float | None = 0.05, tol: float = 1e-6, seed: int = 0) -> dict:
    """Training-set variability against out-of-sample error (Bengio et al. 2003, section 5).

    Parameters
    ----------
    out : Path
        Directory for ``stability.md``, ``stability.json`` and ``stability.png``.
    n : int
        Rows of the data set D.
    dataset : str
        A data set of :func:`ooc_spectral.datasets.generate`.
    noise : float
        Gaussian noise added to every coordinate.
    fractions : list of float
        Fractions of substituted training rows, each in (0, 1).
    n_loo : int
        Rows of F left out one at a time in step 2 (per split).
    repeats : int
        Random splits per fraction; their rows are pooled.
    methods : list of str or str
        Some of ``mds``, ``spectral``, ``isomap``, ``lle`` (comma-separated string or list).
    n_neighbors : int
        Neighbours of Isomap and LLE (10 in the paper).
    gamma : float or None
        Gaussian kernel coefficient of ``spectral`` (None: the median heuristic).
    tol : float
        Tolerance of the greedy dictionary of ``spectral``.
    seed : int
        Seed of the data, the splits and the estimators.

    Returns
    -------
    dict
        Paths of the outputs, the rows of the table and the substitution equivalents.
    """
    from ..io.datasets import generate

    n = check_int("stability", "n", n, low=10)
    n_loo = check_int("stability", "n_loo", n_loo, low=2)
    repeats = check_int("stability", "repeats", repeats, low=1)
    n_neighbors = check_int("stability", "n_neighbors", n_neighbors, low=1)
    seed = check_int("stability", "seed", seed, low=0)
    noise = check_float("stability", "noise", noise, low=0.0)
    tol = check_float("stability", "tol", tol, low=0.0)
    gamma = check_float("stability", "gamma", gamma, low=0.0, low_open=True, none=True)
    methods = _parse_methods(methods)
    fractions = _parse_fractions(fractions)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    X, _ = generate(dataset, n, noise=noise, seed=seed)
    t0 = time.perf_counter()
    # Hundreds of small fits: one BLAS thread each is as fast, and it avoids OpenBLAS's
    # busy-waiting threads slowing everything down 100-fold when the cores are shared.
    with _quiet_core(), threadpool_limits(limits=1, user_api="blas"):
        rows = _measure(X, methods, fractions, n_loo=n_loo, repeats=repeats,
                        n_neighbors=n_neighbors, gamma=gamma, tol=tol, seed=seed)
    crossing = {}
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        level = float(np.mean([r["oos_mean"] for r in mine]))
        crossing[method] = {
            "oos_error": level,
            "fraction": substitution_equivalent([r["fraction"] for r in mine],
                                                [r["variability_mean"] for r in mine], level)}
    wall = time.perf_counter() - t0

    params = {"n": n, "dataset": dataset, "noise": noise, "fractions": fractions, "n_loo": n_loo,
              "repeats": repeats, "methods": methods, "n_neighbors": n_neighbors,
              "gamma": gamma, "tol": tol, "seed": seed}
    title = (f"{dataset}, n={n}: training-set variability minus out-of-sample error "
             f"(mean and 95% CI over {n_loo * repeats} rows, {repeats} split(s) per point)")
    _figure(out / "stability.png", methods, rows, title)
    (out / "stability.json").write_text(json.dumps(
        {"params": params, "rows": rows, "substitution_equivalent": crossing,
         "wall_seconds": wall}, indent=2))
    (out / "stability.md").write_text(_table(params, rows, crossing, wall))
    return {"table": str(out / "stability.md"), "figure": str(out / "stability.png"),
            "json": str(out / "stability.json"), "substitution_equivalent": crossing,
            "wall_seconds": round(wall, 2)}


def _measure(X: np.ndarray, methods: list[str], fractions: list[float], *, n_loo: int,
             repeats: int, n_neighbors: int, gamma, tol: float, seed: int) -> list[dict]:
    """One row of the table per (method, fraction)."""
    rows = []
    for method in methods:
        fit = _model_factory(method, n_neighbors=n_neighbors, gamma=gamma, tol=tol, seed=seed)
        for fi, fraction in enumerate(fractions):
            var, oos, scale, var_all = [], [], [], []
            for r in range(repeats):
                rng = np.random.default_rng(np.random.SeedSequence([seed, fi, r, 0x57AB]))
                res = _one_split(fit, X, fraction, n_loo, rng)
                var.append(res["variability"])
                oos.append(res["oos"])
                scale.append(res["scale"])
                var_all.append(res["variability_all_F"])
            var, oos = np.concatenate(var), np.concatenate(oos)
            diff = var - oos
            se = float(diff.std(ddof=1) / np.sqrt(diff.size))
            rows.append({
                "method": method, "fraction": fraction, "F": res["F"], "n_train": res["n_train"],
                "pairs": int(diff.size), "variability_mean": float(var.mean()),
                "variability_all_F_mean": float(np.mean(var_all)),
                "oos_mean": float(oos.mean()), "diff_mean": float(diff.mean()),
                "diff_ci95": 1.96 * se, "embedding_rms": float(np.mean(scale)),
            })
            log.info("stability: %s, fraction %.3f: variability %.3g, out-of-sample %.3g",
                     method, fraction, rows[-1]["variability_mean"], rows[-1]["oos_mean"])
    return rows


def _table(params: dict, rows: list[dict], crossing: dict, wall: float) -> str:
    lines = [
        "# Stability of the out-of-sample extensions (Bengio et al. 2003, section 5)",
        "",
        f"Data: `{params['dataset']}`, n = {params['n']}, noise = {params['noise']}, seed = "
        f"{params['seed']}; 2-D embeddings; {params['n_neighbors']} neighbours (Isomap, LLE); "
        f"spectral: Gaussian kernel gamma = {params['gamma']}, greedy tol = {params['tol']}. "
        f"Per point: {params['repeats']} split(s), {params['n_loo']} left-out rows each. "
        f"Wall time {wall:.1f} s.",
        "",
        "*variability*: distance between the aligned embeddings of a row of F trained with F u R1 "
        "and with F u R2; *out-of-sample*: distance between the row's out-of-sample embedding "
        "(trained without it) and its embedding trained with it; *difference*: their mean "
        "difference with a 95% confidence interval. *rms*: root mean square norm of the "
        "centred reference embedding (the scale of the numbers of that method).",
        "",
        "| method | fraction substituted | \\|F\\| | n train | variability | out-of-sample | "
        "difference (95% CI) | rms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['fraction']:.3f} | {r['F']} | {r['n_train']} | "
            f"{r['variability_mean']:.3g} | {r['oos_mean']:.3g} | "
            f"{r['diff_mean']:.3g} ± {r['diff_ci95']:.2g} | {r['embedding_rms']:.3g} |")
    lines += ["", "Substitution equivalent: the fraction of substituted training rows whose "
              "variability equals the method's out-of-sample error (mean over the fractions), "
              "interpolating the variability linearly from 0 at no substitution (the paper finds "
              "1-4%):", ""]
    for method, c in crossing.items():
        f = c["fraction"]
        where = ("beyond the largest fraction run" if f is None else f"{100 * f:.1f}%")
        lines.append(f"- {method}: out-of-sample error {c['oos_error']:.3g}, as large as the "
                     f"variability at {where} of the training rows substituted")
    return "\n".join(lines) + "\n"


EXPERIMENTS = {"stability": run_stability}
