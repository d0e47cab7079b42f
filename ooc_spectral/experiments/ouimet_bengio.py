"""Reproductions of Ouimet & Bengio (2005), section 5: Table 1, Figure 3, Figure 4.

All three use the section 5 protocol (:class:`~ooc_spectral.experiments.evaluation.Protocol`):
a random split D1 / D2 / D3, the exact embedding of D2 U D3 as the reference,
training on (part of) D1, the out-of-sample embedding of D2 aligned to the
reference by linear regression, and the mean squared difference with its 95%
confidence interval over the test points.

Data sets (``datasets=...``):

``spiral``  the paper's 2-D spiral (:mod:`ooc_spectral.datasets`), the paper's
            sizes ``|D1| = 3333, |D2| = 3330, |D3| = 3332``, 2 components,
            ``gamma = 0.05`` (the paper gives no width for the spiral);
``digits``  scikit-learn's bundled 8 x 8 digits (all ten classes, 1797 images:
            ``|D1| = 600, |D2| = 600, |D3| = 597``), the offline stand-in for
            MNIST. 2 components: the third and fourth kernel PCA eigenvalues of
            the ten classes are too close for a third coordinate to be
            reproducible from one sample to the next (the exact method's own
            error stops decreasing with n). ``gamma`` one tenth of the median
            heuristic ``1 / median ||x - y||^2``: a wide kernel, as the paper's
            ``sigma = 31.6`` on MNIST is, which gives the paper's range of
            dictionary sizes (tens to a few hundred points);
``mnist``   classes 0 and 1 of MNIST at 14 x 14 from files you already have
            (``mnist=PATH``), the paper's sizes ``3365 / 3267 / 3332``, 3
            components, the paper's ``sigma = 31.6`` (``gamma = 1 / (2 sigma^2)``,
            pixels in [0, 1]).

``scale`` multiplies every size and training-size grid (for quick runs).
Every experiment runs single-threaded (one BLAS thread, dask's synchronous
scheduler: :func:`~ooc_spectral.experiments._paper_common.single_threaded`), and
timings are the CPU seconds of the fit (best of ``repeats``): the cost of each
method on one core, steadier than wall time on a shared machine. Wall seconds
are in the JSON.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..baselines.exact import ExactKernelEmbedding
from ..baselines.nystrom import NystromEmbedding
from ..estimators.embedding import GreedySpectralEmbedding
from .evaluation import paired_difference
from ..exceptions import InvalidParameterError, OocSpectralError
from . import _paper_common as pc

log = logging.getLogger("ooc_spectral.experiments")

__all__ = ["EXPERIMENTS", "run_table1", "run_figure3", "run_figure4", "DATASETS"]

DATASETS = {
    "spiral": {"sizes": (3333, 3330, 3332), "n_components": 2, "gamma": 0.05,
               "tols": [0.1, 0.01, 0.001, 0.0001, 1e-05, 1e-06], "figure3_tols": [0.01, 0.0001],
               "exact_sizes": [50, 100, 150, 200, 250, 325, 400, 550, 700, 1000, 1300, 2000,
                               2700, 3333],
               "train_sizes": [100, 250, 500, 1000, 1500, 2000, 2500, 3333],
               "m_grid": [3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024]},
    "digits": {"sizes": (600, 600, 597), "n_components": 2, "gamma": "median/10",
               "tols": [0.1, 0.03, 0.01, 0.003, 0.001], "figure3_tols": [0.03, 0.01],
               "exact_sizes": [25, 50, 75, 100, 150, 200, 250, 300, 400, 500, 600],
               "train_sizes": [50, 100, 150, 200, 300, 400, 500, 600],
               "m_grid": [3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 400]},
    "mnist": {"sizes": (3365, 3267, 3332), "n_components": 3, "gamma": 1.0 / (2 * 31.6**2),
              "tols": [0.1, 0.01, 0.001, 0.0001, 1e-05], "figure3_tols": [0.01, 0.0001],
              "exact_sizes": [50, 100, 125, 250, 325, 400, 550, 700, 1000, 1300, 2000, 3365],
              "train_sizes": [100, 250, 500, 1000, 1500, 2000, 2500, 3365],
              "m_grid": [4, 8, 16, 22, 32, 44, 65, 128, 256, 512, 900]},
}
NORMALIZATIONS = ("additive", "divisive")
LABEL = {"additive": "kernel PCA", "divisive": "spectral clustering"}
FIG4_METHODS = ("greedy", "random", "nystrom", "nystrom-largest-diagonal", "nystrom-volume")
FIG4_LABEL = {"greedy": "greedy dictionary + projection",
              "random": "random dictionary + projection",
              "nystrom": "Nyström on a random subset",
              "nystrom-largest-diagonal": "Nyström, largest diagonal",
              "nystrom-volume": "Nyström, volume sampling"}


# --------------------------------------------------------------------------- #
# shared set-up
# --------------------------------------------------------------------------- #
class _Setup:
    """One data set at one scale: data, split sizes, gamma, and cached protocols."""

    def __init__(self, name: str, *, scale: float, seed: int, mnist, cache_dir, spiral_noise):
        if name not in DATASETS:
            raise InvalidParameterError(
                f"dataset {name!r} is not valid: expected some of {', '.join(DATASETS)}"
            )
        spec = DATASETS[name]
        self.name = name
        self.seed = seed
        self.sizes = tuple(max(10, int(round(s * scale))) for s in spec["sizes"])
        total = sum(self.sizes)
        noise = spiral_noise if name == "spiral" else None
        self.X, _ = pc.load_dataset(name, total, seed=seed, noise=noise, mnist=mnist)
        if len(self.X) < total:
            raise InvalidParameterError(
                f"dataset {name!r} has {len(self.X)} rows but the split needs {total}; lower scale"
            )
        self.n_components = spec["n_components"]
        if spec["gamma"] == "median/10":
            self.gamma = 0.1 * pc.median_gamma(self.X, seed)
        else:
            self.gamma = float(spec["gamma"])
        self.spec = spec
        self.scale = scale
        self.cache_dir = cache_dir
        self.noise = noise
        self._protocols = {}

    def grid(self, key: str) -> list[int]:
        n1 = self.sizes[0]
        vals = sorted({min(n1, max(self.n_components + 2, int(round(v * self.scale))))
                       for v in self.spec[key]})
        return vals

    def m_grid(self) -> list[int]:
        return [m for m in self.spec["m_grid"] if self.n_components < m < self.sizes[0]]

    def protocol(self, normalization: str):
        if normalization not in self._protocols:
            key = {"dataset": self.name, "sizes": self.sizes, "seed": self.seed,
                   "gamma": self.gamma, "normalization": normalization,
                   "n_components": self.n_components, "noise": self.noise,
                   "n_rows": len(self.X), "checksum": float(np.sum(self.X[:, 0]))}
            log.info("%s / %s: reference embedding on D2 U D3 (%d rows)", self.name,
                     normalization, self.sizes[1] + self.sizes[2])
            self._protocols[normalization] = pc.cached_protocol(
                self.cache_dir, key, self.X, n_train=self.sizes[0], n_test=self.sizes[1],
                n_extra=self.sizes[2], n_components=self.n_components,
                normalization=normalization, gamma=self.gamma, random_state=self.seed)
        return self._protocols[normalization]

    def describe(self) -> str:
        n1, n2, n3 = self.sizes
        return (f"`{self.name}`: |D1| = {n1}, |D2| = {n2}, |D3| = {n3}, "
                f"{self.n_components} components, gamma = {self.gamma:.4g}")


def _setups(out: Path, datasets, scale, seed, mnist, cache, spiral_noise,
            cache_dir=None) -> list[_Setup]:
    """The data sets of an experiment. The exact references are cached in ``cache_dir``
    (``evaluate --cache-dir``, a path a workflow resolves under its root like ``out``),
    by default under ``out``: never beside it, where out = "." would reach above a
    workflow's root."""
    names = pc.as_list("datasets", datasets)
    pc.check_choices("datasets", names, tuple(DATASETS))
    if not pc.as_bool("cache", cache):
        cache_dir = None
    else:
        cache_dir = Path(cache_dir) if cache_dir else out / ".reference-cache"
    return [_Setup(n, scale=pc.as_float("scale", scale, 0.0), seed=pc.as_int("seed", seed, 0),
                   mnist=mnist, cache_dir=cache_dir,
                   spiral_noise=pc.as_float("spiral_noise", spiral_noise, 0.0, inclusive=True))
            for n in names]


def _tols(tols, setup: _Setup, key: str) -> list[float]:
    """The ``tols`` parameter, or the data set's default grid."""
    if tols in (None, "None", "null"):
        return list(setup.spec[key])
    return pc.as_list("tols", tols, float)


def _norms(normalizations) -> list[str]:
    norms = pc.as_list("normalizations", normalizations)
    pc.check_choices("normalizations", norms, NORMALIZATIONS)
    return norms


def _greedy(setup: _Setup, norm: str, seed: int, **kw) -> GreedySpectralEmbedding:
    return GreedySpectralEmbedding(setup.n_components, gamma=setup.gamma, normalization=norm,
                                   random_state=seed, **kw)


def _exact(setup: _Setup, norm: str) -> ExactKernelEmbedding:
    return ExactKernelEmbedding(setup.n_components, gamma=setup.gamma, normalization=norm)


def _error_axes(ax, xlabel: str, title: str) -> None:
    """A panel of generalization error (log scale) against ``xlabel``, with its legend
    (the x scale is the caller's)."""
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("generalization error")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def _row(result) -> dict:
    d = result.to_dict()
    d["error_mean"] = result.error.mean
    d["error_ci95"] = result.error.ci95
    return d


# --------------------------------------------------------------------------- #
# Table 1: error at equal time, dictionary vs full Gram
# --------------------------------------------------------------------------- #
@pc.single_threaded_experiment
def run_table1(out: Path, datasets="spiral,digits", normalizations="additive,divisive",
               tols=None, scale=1.0, repeats=3, seed=0,
               mnist=None, cache=True, spiral_noise=0.0, cache_dir=None) -> dict:
    """Table 1: generalization error at equal running time, greedy dictionary vs full Gram matrix.

    The full-Gram method (exact kernel PCA / spectral clustering, out of sample
    by the Nyström formula) is trained on the first n rows of D1 for a grid of
    n; the greedy dictionary method on all of D1 for a grid of ``tol``. Each
    dictionary run is set against the largest n the full-Gram method can train
    on in at most the same CPU time.
    """
    setups = _setups(out, datasets, scale, seed, mnist, cache, spiral_noise, cache_dir)
    norms = _norms(normalizations)
    repeats = pc.as_int("repeats", repeats)
    plt = pc.pyplot()
    fig, axes = plt.subplots(len(norms), len(setups), figsize=(5.2 * len(setups), 4.0 * len(norms)),
                             squeeze=False)
    md = ["# Table 1 (Ouimet & Bengio 2005): generalization error at equal time",
          "", "Full Gram matrix (exact method trained on the first n rows of D1) against the "
          "greedy dictionary (trained on all of D1), out-of-sample error on D2 under the "
          "section 5 protocol (mean squared difference to the reference after linear "
          "alignment, ± 95% CI over the test points). Time: CPU seconds of the fit on one "
          f"core (one BLAS thread, synchronous scheduler), best of {repeats}. Last column: "
          "the mean per-point difference dictionary − full Gram on the same test points, "
          "relative to the full Gram's error, and with its paired 95% CI.", ""]
    data = {"experiment": "ob2005-table1", "runs": []}
    verdicts = []
    for c, setup in enumerate(setups):
        md.append(f"## {setup.describe()}")
        for r, norm in enumerate(norms):
            proto, exact, greedy = _table1_runs(setup, norm, tols, repeats)
            rows = []
            for g in sorted(greedy, key=lambda x: x.fit_cpu_seconds):
                e, e_cells, better, won = _table1_verdict(g, exact)
                if e is not None:
                    verdicts.append((setup.name, norm, won))
                rows.append([pc.fmt(g.fit_cpu_seconds), *e_cells,
                             f"n = {g.n_train}, m = {g.info.get('m')} (tol {g.info['tol']:g})",
                             str(g.error), better])
            md += _table1_section(norm, exact, rows)
            data["runs"].append({"dataset": setup.name, "normalization": norm,
                                 "gamma": setup.gamma, "sizes": setup.sizes,
                                 "reference_seconds": proto.reference_seconds,
                                 "exact": [_row(e) for e in exact],
                                 "greedy": [_row(g) for g in greedy]})
            _table1_panel(axes[r, c], setup, norm, exact, greedy)
    figure = pc.save_figure(fig, out / "ob2005-table1.png")
    n_disjoint = sum(1 for v in verdicts if v[2])
    summary = (f"At equal CPU time the dictionary method's error is below the full Gram "
               f"method's (paired 95% CI of the difference below 0) in {n_disjoint} of "
               f"{len(verdicts)} comparisons.")
    md += ["", "## Summary", "", summary, "", "![error against time](ob2005-table1.png)"]
    data["summary"] = summary
    paths = pc.write_outputs(out, "ob2005-table1", "\n".join(md), data)
    return {**paths, "figure": figure, "summary": summary}


def _table1_runs(setup, norm: str, tols, repeats: int):
    """The experiment of one (data set, normalization): the full-Gram runs over the
    grid of n and the dictionary runs over the grid of tol (a tol that fails is logged
    and skipped). Returns ``(protocol, exact, greedy)``."""
    proto = setup.protocol(norm)
    exact = []
    for n in setup.grid("exact_sizes"):
        res = proto.evaluate(_exact(setup, norm), n, repeats=repeats)
        exact.append(res)
        log.info("table1 %s %s exact n=%d: %s (%.3f s cpu)", setup.name, norm, n,
                 res.error, res.fit_cpu_seconds)
    greedy = []
    for tol in _tols(tols, setup, "tols"):
        try:
            res = proto.evaluate(_greedy(setup, norm, setup.seed, tol=tol), repeats=repeats)
        except OocSpectralError as exc:
            log.warning("table1 %s %s greedy tol=%g: %s", setup.name, norm, tol, exc)
            continue
        res.info["tol"] = tol
        greedy.append(res)
        log.info("table1 %s %s greedy tol=%g m=%d: %s (%.3f s cpu)", setup.name, norm,
                 tol, res.info.get("m", -1), res.error, res.fit_cpu_seconds)
    return proto, exact, greedy


def _table1_verdict(g, exact):
    """The verdict on one dictionary run ``g``: against the largest n the full-Gram method
    trains on in at most ``g``'s CPU time, by the paired 95% CI of the per-point
    difference. Returns ``(that run or None, its two table cells, verdict text, won)``."""
    affordable = [e for e in exact if e.fit_cpu_seconds <= g.fit_cpu_seconds]
    e = max(affordable, key=lambda x: x.n_train) if affordable else None
    if e is None:
        return None, ["—", f"(smallest n = {exact[0].n_train} needs "
                           f"{pc.fmt(exact[0].fit_cpu_seconds)} s)"], \
            "exact cannot train on any n in that time", False
    diff = paired_difference(g, e)
    rel = f"{100 * diff.mean / e.error.mean:+.1f}%"
    if diff.high < 0:
        better, won = f"yes: {rel} ({diff})", True
    elif diff.low > 0:
        better, won = f"no, full Gram better: {rel} ({diff})", False
    else:
        better, won = f"tie: {rel} ({diff})", False
    return e, [f"n = {e.n_train}", str(e.error)], better, won


def _table1_section(norm: str, exact, rows) -> list[str]:
    """The report of one (data set, normalization): the table of verdicts (with the
    full-Gram fit on all of D1 last) and every full-Gram run, as markdown lines."""
    full = exact[-1]
    rows = rows + [[pc.fmt(full.fit_cpu_seconds), f"n = {full.n_train}", str(full.error),
                    "", "", "(full Gram on all of D1)"]]
    return ["", f"### {LABEL[norm]} ({norm})", "",
            pc.md_table(["CPU time (s)", "full Gram: max n", "full Gram: error ± 95% CI",
                         "dictionary: size", "dictionary: error ± 95% CI",
                         "dictionary better?"], rows),
            "", "<details><summary>every full-Gram run</summary>", "",
            pc.md_table(["n", "CPU s", "wall s", "error ± 95% CI"],
                        [[e.n_train, pc.fmt(e.fit_cpu_seconds), pc.fmt(e.fit_seconds),
                          str(e.error)] for e in exact]),
            "", "</details>"]


def _table1_panel(ax, setup, norm: str, exact, greedy) -> None:
    """The figure panel of one (data set, normalization): error against CPU time."""
    for series, style, label in ((exact, "o-", "full Gram, n = first rows of D1"),
                                 (greedy, "s--", f"greedy dictionary, n = {setup.sizes[0]}")):
        series = sorted(series, key=lambda x: x.fit_cpu_seconds)
        t = [x.fit_cpu_seconds for x in series]
        m = [x.error.mean for x in series]
        ci = [x.error.ci95 for x in series]
        ax.errorbar(t, m, yerr=ci, fmt=style, ms=4, capsize=2, label=label)
    for e, ok in zip(exact, pc.sparse_labels([e.fit_cpu_seconds for e in exact], 2.5)):
        if ok:
            ax.annotate(f"n={e.n_train}", (e.fit_cpu_seconds, e.error.mean), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
    gs = sorted(greedy, key=lambda x: x.fit_cpu_seconds)
    for g, ok in zip(gs, pc.sparse_labels([g.fit_cpu_seconds for g in gs], 1.5)):
        if ok:
            ax.annotate(f"m={g.info.get('m')}", (g.fit_cpu_seconds, g.error.mean),
                        fontsize=7, textcoords="offset points", xytext=(3, -10))
    ax.set_xscale("log")
    _error_axes(ax, "CPU seconds (fit)", f"{setup.name}: {LABEL[norm]}")


# --------------------------------------------------------------------------- #
# Figure 3: error against the training size
# --------------------------------------------------------------------------- #
@pc.single_threaded_experiment
def run_figure3(out: Path, datasets="spiral,digits", normalizations="additive,divisive",
                tols=None, scale=1.0, seed=0, mnist=None, cache=True,
                spiral_noise=0.0, cache_dir=None) -> dict:
    """Figure 3: generalization error against the training-set size, dictionary vs full Gram.

    For each n of a grid the full-Gram method and the greedy dictionary (one
    curve per ``tol``) are trained on the first n rows of D1; the full-Gram
    curve at n is also the Nyström method with eigenvectors estimated on n
    random points.
    """
    setups = _setups(out, datasets, scale, seed, mnist, cache, spiral_noise, cache_dir)
    norms = _norms(normalizations)
    plt = pc.pyplot()
    fig, axes = plt.subplots(len(norms), len(setups), figsize=(5.2 * len(setups), 4.0 * len(norms)),
                             squeeze=False)
    md = ["# Figure 3 (Ouimet & Bengio 2005): error against training-set size", "",
          "Out-of-sample error on D2 (± 95% CI over the test points) of the full Gram method "
          "and of the greedy dictionary at fixed tol, both trained on the first n rows of D1. "
          "m is the dictionary size reached at that n.", ""]
    data = {"experiment": "ob2005-figure3", "runs": []}
    for c, setup in enumerate(setups):
        md.append(f"## {setup.describe()}")
        for r, norm in enumerate(norms):
            proto = setup.protocol(norm)
            sizes = setup.grid("train_sizes")
            tol_list = _tols(tols, setup, "figure3_tols")
            exact = [proto.evaluate(_exact(setup, norm), n) for n in sizes]
            greedy = {tol: [] for tol in tol_list}
            for tol in tol_list:
                for n in sizes:
                    try:
                        greedy[tol].append(proto.evaluate(_greedy(setup, norm, setup.seed, tol=tol), n))
                    except OocSpectralError as exc:
                        log.warning("figure3 %s %s tol=%g n=%d: %s", setup.name, norm, tol, n, exc)
                        greedy[tol].append(None)
            header = ["n", "full Gram"] + [f"greedy tol={t:g}" for t in tol_list]
            rows = []
            for i, n in enumerate(sizes):
                cells = [n, str(exact[i].error)]
                for t in tol_list:
                    g = greedy[t][i]
                    cells.append("n/a" if g is None else f"{g.error} (m = {g.info.get('m')})")
                rows.append(cells)
            md += ["", f"### {LABEL[norm]} ({norm})", "", pc.md_table(header, rows)]
            ax = axes[r, c]
            ax.errorbar(sizes, [e.error.mean for e in exact], yerr=[e.error.ci95 for e in exact],
                        fmt="o-", color="k", ms=4, capsize=2, label="full Gram (= Nyström on n points)")
            for t in tol_list:
                pts = [(n, g) for n, g in zip(sizes, greedy[t]) if g is not None]
                if not pts:
                    continue
                mmax = max(g.info.get("m", 0) for _, g in pts)
                ax.errorbar([n for n, _ in pts], [g.error.mean for _, g in pts],
                            yerr=[g.error.ci95 for _, g in pts], fmt="s--", ms=4, capsize=2,
                            label=f"greedy tol={t:g}, m ≤ {mmax}")
            pc.log_xticks(ax, sizes)
            _error_axes(ax, "training size n", f"{setup.name}: {LABEL[norm]}")
            data["runs"].append({"dataset": setup.name, "normalization": norm, "sizes": sizes,
                                 "exact": [_row(e) for e in exact],
                                 "greedy": {str(t): [None if g is None else _row(g) for g in v]
                                            for t, v in greedy.items()}})
    figure = pc.save_figure(fig, out / "ob2005-figure3.png")
    md += ["", "![error against training size](ob2005-figure3.png)"]
    paths = pc.write_outputs(out, "ob2005-figure3", "\n".join(md), data)
    return {**paths, "figure": figure}


# --------------------------------------------------------------------------- #
# Figure 4: greedy vs random dictionary vs Nyström on a subset, against m
# --------------------------------------------------------------------------- #
def _fig4_estimator(method: str, setup: _Setup, norm: str, m: int, seed: int):
    if method == "greedy":
        return _greedy(setup, norm, seed, dictionary_size=m, selection="greedy",
                       max_dictionary_size=max(5000, m))
    if method == "random":
        return _greedy(setup, norm, seed, dictionary_size=m, selection="random",
                       max_dictionary_size=max(5000, m))
    selection = {"nystrom": "uniform", "nystrom-largest-diagonal": "largest-diagonal",
                 "nystrom-volume": "volume"}[method]
    return NystromEmbedding(setup.n_components, n_landmarks=m, selection=selection,
                            gamma=setup.gamma, normalization=norm, random_state=seed)


@pc.single_threaded_experiment
def run_figure4(out: Path, datasets="spiral,digits", normalizations="additive,divisive",
                methods="greedy,random,nystrom,nystrom-largest-diagonal,nystrom-volume",
                m_max=None, volume_max_m=64, repeats=5, scale=1.0, seed=0, mnist=None,
                cache=True, spiral_noise=0.0, cache_dir=None) -> dict:
    """Figure 4: error against subset size m, greedy vs random dictionary vs Nyström on a subset.

    All methods see all of D1. The dictionary methods (greedy, random) project
    every row of D1 on the span of their m points; the Nyström methods
    estimate the eigenvectors on their m points only. Every point is repeated
    over ``repeats`` seeds (visiting order, random subsets); the table gives the
    mean error over seeds with a 95% t-interval across seeds.
    """
    setups = _setups(out, datasets, scale, seed, mnist, cache, spiral_noise, cache_dir)
    norms = _norms(normalizations)
    meths = pc.as_list("methods", methods)
    pc.check_choices("methods", meths, FIG4_METHODS)
    repeats = pc.as_int("repeats", repeats)
    volume_max_m = pc.as_int("volume_max_m", volume_max_m)
    m_cap = None if m_max in (None, "None", "null") else pc.as_int("m_max", m_max)
    plt = pc.pyplot()
    fig, axes = plt.subplots(len(norms), len(setups), figsize=(5.2 * len(setups), 4.0 * len(norms)),
                             squeeze=False)
    md = ["# Figure 4 (Ouimet & Bengio 2005): greedy vs random dictionary vs Nyström", "",
          "All of D1 is used for training. Error: out-of-sample error on D2 under the section 5 "
          f"protocol, mean over {repeats} seeds ± 95% t-interval across seeds "
          "(n/a: the method cannot select m points, e.g. m above the numerical rank).", ""]
    data = {"experiment": "ob2005-figure4", "repeats": repeats, "runs": []}
    verdicts = []
    for c, setup in enumerate(setups):
        md.append(f"## {setup.describe()}")
        ms = [m for m in setup.m_grid() if m_cap is None or m <= m_cap]
        for r, norm in enumerate(norms):
            proto = setup.protocol(norm)
            results = {meth: {} for meth in meths}
            for meth in meths:
                for m in ms:
                    if meth == "nystrom-volume" and m > volume_max_m:
                        continue
                    errs = []
                    for k in range(repeats):
                        try:
                            res = proto.evaluate(_fig4_estimator(meth, setup, norm, m, setup.seed + k))
                            errs.append(res.error.mean)
                        except (OocSpectralError, np.linalg.LinAlgError) as exc:
                            log.info("figure4 %s %s %s m=%d: %s", setup.name, norm, meth, m, exc)
                            errs.append(np.nan)
                    if np.all(np.isnan(errs)):
                        continue
                    mean, half = pc.mean_ci(errs)
                    results[meth][m] = {"mean": mean, "ci95": half, "runs": errs}
                    log.info("figure4 %s %s %s m=%d: %s", setup.name, norm, meth, m,
                             pc.fmt_ci(mean, half))
            rows = []
            for m in ms:
                cells = [m]
                for meth in meths:
                    v = results[meth].get(m)
                    cells.append("n/a" if v is None else pc.fmt_ci(v["mean"], v["ci95"]))
                g, rd, ny = (results.get(k, {}).get(m) for k in ("greedy", "random", "nystrom"))
                vs_random = _compare(g, rd, ("greedy", "random"))
                vs_nystrom = _compare(g, ny, ("greedy", "Nyström"))
                cells += [vs_random, vs_nystrom]
                verdicts.append(((setup.name, norm, m), vs_random, vs_nystrom))
                rows.append(cells)
            md += ["", f"### {LABEL[norm]} ({norm})", "",
                   pc.md_table(["m"] + [FIG4_LABEL[k] for k in meths]
                               + ["greedy vs random", "greedy vs Nyström"], rows)]
            ax = axes[r, c]
            styles = {"greedy": "o-", "random": "s-", "nystrom": "^-",
                      "nystrom-largest-diagonal": "v:", "nystrom-volume": "d:"}
            for meth in meths:
                pts = sorted(results[meth].items())
                if pts:
                    ax.errorbar([m for m, _ in pts], [v["mean"] for _, v in pts],
                                yerr=[v["ci95"] for _, v in pts], fmt=styles[meth], ms=4,
                                capsize=2, label=FIG4_LABEL[meth])
            pc.log_xticks(ax, ms)
            _error_axes(ax, "subset size m", f"{setup.name}: {LABEL[norm]}, n = {setup.sizes[0]}")
            data["runs"].append({"dataset": setup.name, "normalization": norm, "m": ms,
                                 "results": {k: {str(m): v for m, v in d.items()}
                                             for k, d in results.items()}})
    figure = pc.save_figure(fig, out / "ob2005-figure4.png")
    md += ["", "![error against subset size](ob2005-figure4.png)", "",
           "Comparison columns: `a < b` when Welch's 95% interval for the difference of the "
           "mean errors (across seeds) excludes 0, otherwise `no significant difference` "
           "with the order of the means; n/a where a method has no result "
           "(a dictionary cannot outgrow the kernel's numerical rank: past it every row is "
           "in the span of the others to rounding; volume sampling is run up to "
           "`volume_max_m`)."]
    data["verdicts"] = [{"dataset": d, "normalization": n, "m": m, "greedy_vs_random": a,
                         "greedy_vs_nystrom": b} for (d, n, m), a, b in verdicts]
    paths = pc.write_outputs(out, "ob2005-figure4", "\n".join(md), data)
    return {**paths, "figure": figure}


def _compare(a, b, names: tuple[str, str]) -> str:
    """``a`` against ``b``: Welch's 95% interval for the difference of the mean errors.

    The seeds of the two methods are independent (a visiting order, a random
    subset), so the comparison is unpaired.
    """
    if a is None or b is None:
        return "n/a"
    from scipy import stats

    x = np.asarray([v for v in a["runs"] if np.isfinite(v)])
    y = np.asarray([v for v in b["runs"] if np.isfinite(v)])
    if len(x) < 2 or len(y) < 2:
        return "n/a"
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    diff = x.mean() - y.mean()
    se = np.sqrt(va + vb)
    if se == 0:
        return "equal" if diff == 0 else (f"{names[0]} < {names[1]}" if diff < 0
                                          else f"{names[1]} < {names[0]}")
    df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1))
    half = stats.t.ppf(0.975, df) * se
    lo, hi = names
    if diff + half < 0:
        return f"{lo} < {hi}"
    if diff - half > 0:
        return f"{hi} < {lo}"
    return f"no significant difference ({lo} {'<' if diff < 0 else '>'} {hi} in mean)"


EXPERIMENTS = {
    "ob2005-table1": run_table1,
    "ob2005-figure3": run_figure3,
    "ob2005-figure4": run_figure4,
}
