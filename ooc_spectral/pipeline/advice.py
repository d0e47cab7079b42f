"""Advice computed from the situation, and checked, for the dictionary's errors (issue 38).

The scan's errors are raised deep in the core with what the core knows: a dictionary
too small for ``n_components``, or one that grew past ``max_dictionary_size``. Their
first advice was written from the parameters alone and could contradict the run: "use
a larger gamma (gamma=None picks the median heuristic)" to a fit that used the median
heuristic, or "gamma=5e+05" to a fit at gamma=1e6 whose kernel saw no row near another
("after scanning 0 of 20000 rows" besides). :func:`with_advice` looks at the run and
replaces that advice with one that is computed and, where a scan can tell, checked:

- too few points for ``n_components``: ``dictionary_size`` = ``n_components`` plus
  the directions the normalization spends, which selects exactly that many points
  (within ``max_dictionary_size`` and the rows; otherwise the limit to raise or the
  ``n_components`` to lower);
- past ``max_dictionary_size`` with a gamma far above the median heuristic's: that
  value (``gamma=None``), and the dictionary size a greedy scan of a seeded sample
  of :data:`CHECK_ROWS` rows reaches with it at the same ``tol``;
- a dictionary heading for every row (the scan's early stop): where only
  ``max_dictionary_size`` keeps the exact problem, the cap that solves it exactly (the
  fit tells this from the exact path's own float64 scan of the first rows, before any
  costlier work); elsewhere the first larger tol or smaller gamma with which a greedy
  scan of that sample, stopping as the fit does, keeps a small dictionary.

Anything else is returned as it was raised. Used by the estimator's ``fit`` and by the
command line's fit job, around :meth:`~ooc_spectral.pipeline.fit.FitRun.run`.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np

from ..core.eigensolve import spent_directions
from ..core.kernel_choice import GAMMA_SAMPLE_SIZE, median_heuristic_gamma
from ..core.planning import SAMPLE_PURPOSE, plan_sample
from ..exceptions import DictionaryError, DictionarySizeError

__all__ = ["with_advice", "CHECK_ROWS", "FAR_ABOVE", "WAY_OUT_STEPS"]

#: Rows of the seeded sample a suggested gamma is checked on.
CHECK_ROWS = 2000
#: A gamma this many times the median heuristic's is called far above it.
FAR_ABOVE = 100.0


def with_advice(err: BaseException, config, source, names: dict | None = None) -> BaseException:
    """``err``, or an error of the same class whose advice is computed and checked.

    ``config`` is the fit's :class:`~ooc_spectral.core.config.FitConfig`, ``source`` its
    :class:`~ooc_spectral.io.source.DataSource`; ``names`` maps a parameter of the fit to
    the one the user set for it (``{"n_components": "n_clusters"}`` for a clustering
    estimator that passed its ``n_clusters`` on), so that the message names what the user
    can change. Never raises: where the advice cannot be computed the original error is
    returned (renamed)."""
    try:
        new = None
        if isinstance(err, DictionarySizeError):
            new = _past_the_limit(err, config, source)
        elif isinstance(err, DictionaryError):
            new = _too_few_points(err, config, source) or _unreachable(err, config)
        return _renamed(new or err, names)
    except Exception:  # advice is a courtesy: never hide the error it was for
        return err


def _renamed(err: BaseException, names: dict | None) -> BaseException:
    """``err`` with each parameter name of ``names`` replaced by the user's (itself where
    nothing is renamed)."""
    text = str(err)
    for ours, theirs in (names or {}).items():
        text = re.sub(rf"\b{ours}\b", theirs, text)
    if text == str(err):
        return err
    new = type(err)(text)
    new.__dict__.update(err.__dict__)
    return new


def _too_few_points(err, c, source):
    """One advice for a dictionary too small for ``n_components`` at this tol (the exact
    problem not at hand, or the fit would have solved it): ``dictionary_size`` = the
    components plus the directions the normalization spends, where Algorithm 2 reaches
    that size on a seeded sample with a factor float64 resolves (checked here); else the
    most components the dictionary gives."""
    kind = getattr(err, "kind", None)
    if kind == "constant":  # the exact problem at the gamma asked, else a gamma that works
        return (_capped_exact(err, c, source, head=err.diagnosis)
                or _wider_than_the_heuristic(err, c, source))
    if kind != "tol" or c.n_components is None:
        return None
    spent = spent_directions(c.affine, c.normalization, c.drop_first)
    # dictionary_size must exceed n_components (the configuration's own check) and give
    # the normalization's spent directions
    need = max(c.n_components + spent, c.n_components + 1)
    if need > source.n_rows:
        advice = (f"X has {source.n_rows} rows, so at most {source.n_rows - spent} "
                  "components exist: lower n_components to at most "
                  f"{min(source.n_rows - spent, err.limit)}")
    elif need <= c.max_dictionary_size and (checked := _reaches(c, source, need, err.gamma)):
        advice = (f"ask for dictionary_size={need} (--dictionary-size {need}) instead of tol: "
                  f"{checked}" + (f" (the sample is sample_size rows: raise it to at least "
                                  f"{need})" if need > c.sample_size else ""))
    else:
        return None  # lowering n_components, the error's own advice, is what works
    return type(err)(f"{err.diagnosis}; {advice}")


def _wider_than_the_heuristic(err, c, source):
    """A kernel nearly constant over the data at a gamma the user set far below the median
    heuristic's: that gamma, checked by a greedy scan of a seeded sample."""
    if c.gamma is None or c.n_components is None:
        return None
    sample = source.read_index(plan_sample(source.n_rows, GAMMA_SAMPLE_SIZE, c.random_state,
                                           SAMPLE_PURPOSE["gamma"]))
    median = median_heuristic_gamma(c.kernel, sample)
    if median is None or c.gamma > median / FAR_ABOVE:
        return None
    found = _scan_size(c, source, median)
    spent = spent_directions(c.affine, c.normalization, c.drop_first)
    if found is None or found[0] < c.n_components + spent:
        return None
    return type(err)(
        f"{err.diagnosis}; gamma={c.gamma:.3g} is {median / c.gamma:.3g} times below the median "
        f"heuristic's {median:.3g}: leave gamma to the heuristic (gamma=None, or drop --gamma) "
        f"or try gamma={median:.3g}: a greedy scan of a seeded sample of {found[1]} rows at "
        f"that gamma and tol={c.tol:.3g} keeps {found[0]} points")


def _unreachable(err, c):
    """``dictionary_size`` beyond the points outside the span of the others: the size they
    allow holds fewer components than asked for, so the advice names both parameters."""
    m = re.search(r"only (\d+) of the \d+ sampled rows are outside the span of the others; "
                  r"ask for dictionary_size <= \d+", str(err))
    if m is None or c.n_components is None or c.n_components < int(m.group(1)):
        return None
    k = int(m.group(1))
    return type(err)(str(err).replace(
        m.group(0), m.group(0) + f" with n_components at most {k - 1} (it must be below "
        "dictionary_size)"))


def _reaches(c, source, size: int, gamma) -> str:
    """Whether a fit with ``dictionary_size=size`` works on a seeded sample of at least
    :data:`CHECK_ROWS` rows at the fit's ``gamma`` (the whole pipeline: Algorithm 2, the
    factor's conditioning, pass 2, the spectrum and its interval), said as such; "" where
    it does not."""
    from ..exceptions import NumericalBreakdownError
    from ..io.source import open_source
    from .fit import FitRun

    rows = plan_sample(source.n_rows, max(CHECK_ROWS, 2 * size), c.random_state,
                       SAMPLE_PURPOSE["gamma"])
    X = np.asarray(source.read_index(rows), dtype=np.float64)
    cfg = dataclasses.replace(c, dictionary_size=size, tol=None, scan="full",
                              gamma=gamma if gamma is not None else c.gamma,
                              sample_size=max(c.sample_size, len(rows)))
    try:
        with warnings.catch_warnings():  # the check's own warnings are not the user's
            warnings.simplefilter("ignore")
            FitRun(cfg, open_source(X)).run()
    except (DictionaryError, NumericalBreakdownError):
        return ""
    return (f"a fit with it on a seeded sample of {len(rows)} rows (Algorithm 2, the "
            "certificate, the spectrum) works")


def _past_the_limit(err, c, source):
    """One advice for a dictionary past ``max_dictionary_size``: a gamma far above the
    median heuristic's, that value; a dictionary heading for every row (``err.early``)
    where only the cap keeps the exact problem, the cap that takes it; any other dictionary
    heading for every row, a larger tol or a smaller gamma that keeps a seeded sample's
    dictionary from doing so (:func:`_early_way_out`)."""
    text = str(err)
    m = re.search(r"after scanning (\d+) of (\d+) rows", text)
    if m is not None and int(m.group(1)) <= c.max_dictionary_size:
        # every dictionary point is a scanned row: the window's count lags behind
        text = text.replace(m.group(0), f"after scanning at least {c.max_dictionary_size + 1} "
                                        f"of {m.group(2)} rows")
    new = _far_above_the_heuristic(err, text, c, source)
    early = getattr(err, "early", None)
    if new is None and early is not None:
        new = _capped_exact(err, c, source) or _early_way_out(err, c, source)
    elif new is None and c.dictionary_selection == "greedy":  # the scan's own size hint,
        new = _early_way_out(err, c, source, text=text, early=False)  # checked the same way
    if new is None:
        return type(err)(text) if text != str(err) else None
    new.early = early
    return new


def _far_above_the_heuristic(err, text, c, source):
    """A gamma the user set far above the median heuristic's (every row enters): that
    value, checked by a greedy scan of a seeded sample; None otherwise."""
    if callable(c.kernel) or c.kernel not in ("rbf", "laplacian") or c.gamma is None:
        return None
    sample = source.read_index(plan_sample(source.n_rows, GAMMA_SAMPLE_SIZE, c.random_state,
                                           SAMPLE_PURPOSE["gamma"]))
    median = median_heuristic_gamma(c.kernel, sample)
    if median is None or c.gamma < FAR_ABOVE * median:
        return None
    found = _scan_size(c, source, median)
    if found is not None and found[0] >= min(c.max_dictionary_size, found[1] // 2):
        return None  # the heuristic's gamma keeps no small dictionary either: not the way out
    checked = ("" if found is None else
               f": a greedy scan of a seeded sample of {found[1]} rows at that gamma and "
               f"tol={c.tol:.3g} keeps {found[0]} points")
    head = text.split(";", 1)[0]
    return type(err)(
        f"{head}; gamma={c.gamma:.3g} is {c.gamma / median:.3g} times the median heuristic's "
        f"{median:.3g}, so the kernel sees almost no row near another and nearly every row "
        f"enters the dictionary: leave gamma to the heuristic (gamma=None, or drop --gamma) or "
        f"try gamma={median:.3g}{checked}; or raise max_dictionary_size")


def _capped_exact(err, c, source, head: str | None = None):
    """Only ``max_dictionary_size`` kept the exact problem from a fit whose dictionary heads
    for every row, or whose kernel is nearly constant over the data (``head``, the error's
    diagnosis): a cap at the rows solves it exactly (the exact path's own scan stopped
    the fit: following the advice takes that path), where a guessed larger tol or smaller
    gamma may head for every row again (tol=0 asks for every direction); a kernel so
    nearly constant that even the exact problem resolves nothing is refused there, with
    its own advice."""
    from .exact import capped_exact

    if not capped_exact(c, source.n_rows):
        return None
    n = source.n_rows
    head = str(err).split('; ', 1)[0] if head is None else head
    return type(err)(f"{head}; the exact problem on all {n} rows fits in memory: raise "
                     f"max_dictionary_size to {n} and it is solved exactly")


#: The larger tols and smaller gammas :func:`_early_way_out` tries, in this order: each
#: ``(tol factor, gamma divisor)``.
WAY_OUT_STEPS = ((10.0, 1.0), (1.0, 2.0), (100.0, 1.0), (1.0, 4.0), (1000.0, 1.0), (1.0, 10.0))


def _early_way_out(err, c, source, text: str | None = None, early: bool = True):
    """A dictionary heading for every row where the exact problem is not at hand: the first
    of a larger tol or a smaller gamma (:data:`WAY_OUT_STEPS`, gamma for the Gaussian and
    Laplacian kernels) with which a greedy scan of a seeded sample of :data:`CHECK_ROWS`
    rows, stopping as the fit does (:data:`~ooc_spectral.pipeline.exact.EARLY_STOP`, the
    cap), keeps a dictionary below both; the early stop looks at the first 640 rows of
    the visiting order, a seeded random subset of the sample as of the data. Where none
    does, says what was tried. Without ``early``, a greedy dictionary that grew past the
    cap without heading for every row: the same steps, the sample's scan without the early
    stop (in place of the scan's unchecked "try tol x 10, or gamma / 2"); ``text``, the
    error's message where it was already reworded."""
    from ..core.kernel_choice import resolve_kernel

    smooth = not callable(c.kernel) and c.kernel in ("rbf", "laplacian")
    gamma = resolve_kernel(c, source)[1] if smooth else None
    tol = max(float(c.tol), 1e-12)
    head = (str(err) if text is None else text).split("; ", 1)[0]
    tried, rows = [], min(CHECK_ROWS, source.n_rows)
    for times, over in WAY_OUT_STEPS:
        if over != 1.0 and gamma is None:
            continue
        t, g = tol * times, (None if gamma is None else gamma / over)
        if over == 1.0 and t >= 1.0:
            continue
        found = _scan_size(c, source, g, tol=t, early=early)
        tried.append(f"tol={t:.3g}" if over == 1.0 else f"gamma={g:.3g}")
        if found is None or found[0] >= min(c.max_dictionary_size, found[1] // 2):
            continue
        what = (f"use a larger tol: try tol={t:.3g}" if over == 1.0 else
                f"use a smoother kernel: try gamma={g:.3g}")
        return type(err)(
            f"{head}; {what} (a greedy scan of a seeded sample of {found[1]} rows at "
            f"{tried[-1]} keeps {found[0]} points" + (", without the early stop" if early else "")
            + "), or raise max_dictionary_size")
    if not early:
        return type(err)(
            f"{head}; none of {', '.join(tried)} keeps a greedy scan of a seeded sample of "
            f"{rows} rows below max_dictionary_size={c.max_dictionary_size} (or half the "
            "sample): raise max_dictionary_size")
    return type(err)(
        f"{head}; none of {', '.join(tried)} keeps a greedy scan of a seeded sample "
        f"of {rows} rows from heading for every row: the kernel sees no row near "
        "another at these parameters; raise max_dictionary_size, or use a kernel or "
        "features in which rows are near one another")


def _scan_size(c, source, gamma, tol: float | None = None,
               early: bool = False) -> tuple[int, int] | None:
    """The dictionary size a greedy scan of a seeded sample reaches at ``gamma`` (None: the
    fit's) and ``tol`` (None: ``c.tol``), in float64 (None if that scan fails: then no figure
    is quoted); the scan stops at half the sample or the cap (a dictionary that large is no
    way out), which is then the size given, and with ``early`` where the fit's scan stops
    early (:data:`~ooc_spectral.pipeline.exact.EARLY_STOP`)."""
    from ..io.source import open_source
    from .exact import EARLY_STOP
    from .fit import FitRun

    rows = plan_sample(source.n_rows, CHECK_ROWS, c.random_state, SAMPLE_PURPOSE["gamma"])
    X = np.asarray(source.read_index(rows), dtype=np.float64)
    cfg = dataclasses.replace(c, gamma=c.gamma if gamma is None else float(gamma),
                              tol=c.tol if tol is None else float(tol), dictionary_size=None,
                              selection="greedy", scan="full", n_components=1)
    half = max(2, len(rows) // 2)
    try:
        run = FitRun(cfg, open_source(X))
        run._scan_limit = min(half, c.max_dictionary_size)
        if early:
            run._scan_early = EARLY_STOP
        kernel, _ = run.resolve_kernel()
        dictionary, _, _ = run.build_dictionary(kernel)
    except DictionarySizeError:
        return min(half, c.max_dictionary_size), len(rows)
    except Exception:
        return None
    return int(dictionary.size), len(rows)
