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
  of :data:`CHECK_ROWS` rows reaches with it at the same ``tol``.

Anything else is returned as it was raised. Used by the estimator's ``fit`` and by the
command line's fit job, around :meth:`~ooc_spectral.pipeline.fit.FitRun.run`.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from ..core.eigensolve import spent_directions
from ..core.kernel_choice import GAMMA_SAMPLE_SIZE, median_heuristic_gamma
from ..core.planning import SAMPLE_PURPOSE, plan_sample
from ..exceptions import DictionaryError, DictionarySizeError

__all__ = ["with_advice", "CHECK_ROWS", "FAR_ABOVE"]

#: Rows of the seeded sample a suggested gamma is checked on.
CHECK_ROWS = 2000
#: A gamma this many times the median heuristic's is called far above it.
FAR_ABOVE = 100.0


def with_advice(err: BaseException, config, source) -> BaseException:
    """``err``, or an error of the same class whose advice is computed and checked.

    ``config`` is the fit's :class:`~ooc_spectral.core.config.FitConfig`, ``source`` its
    :class:`~ooc_spectral.io.source.DataSource`. Never raises: where the advice cannot
    be computed the original error is returned."""
    try:
        if isinstance(err, DictionarySizeError):
            return _past_the_limit(err, config, source) or err
        if isinstance(err, DictionaryError):
            return _too_few_points(err, config, source) or err
    except Exception:  # advice is a courtesy: never hide the error it was for
        return err
    return err


def _too_few_points(err, c, source):
    text = str(err)
    m = re.search(r"the dictionary has only (\d+) points?", text)
    if (m is None or c.n_components is None or "feature space" in text
            or "groups of equal" in text):
        return None
    spent = spent_directions(c.affine, c.normalization, c.drop_first)
    # dictionary_size must exceed n_components (the configuration's own check) and give
    # the normalization's spent directions
    need = max(c.n_components + spent, c.n_components + 1)
    if c.gamma is None:
        # the hint named the heuristic this fit had used: say what it chose instead
        text = text.replace("use a larger gamma (gamma=None picks the median heuristic)",
                            "use a larger gamma than the median heuristic's (it chose "
                            "this one)")
    if need > source.n_rows:
        advice = (f"X has {source.n_rows} rows, so at most {source.n_rows - spent} "
                  "components exist")
    elif need > c.max_dictionary_size:
        advice = (f"raise max_dictionary_size to {need} and ask for dictionary_size={need} "
                  f"(--dictionary-size {need})")
    else:
        advice = (f"ask for dictionary_size={need} (--dictionary-size {need}) instead of tol: "
                  f"the selection then takes exactly {need} points"
                  + (f" (from a sample of sample_size rows: raise it to at least {need})"
                     if need > c.sample_size else ""))
    if "; or lower n_components" not in text:
        return None
    return type(err)(text.replace("; or lower n_components", f"; or {advice}; or lower "
                                  "n_components", 1))


def _past_the_limit(err, c, source):
    text = str(err)
    m = re.search(r"after scanning (\d+) of (\d+) rows", text)
    if m is not None and int(m.group(1)) <= c.max_dictionary_size:
        # every dictionary point is a scanned row: the window's count lags behind
        text = text.replace(m.group(0), f"after scanning at least {c.max_dictionary_size + 1} "
                                        f"of {m.group(2)} rows")
    if callable(c.kernel) or c.kernel not in ("rbf", "laplacian") or c.gamma is None:
        return type(err)(text) if text != str(err) else None
    sample = source.read_index(plan_sample(source.n_rows, GAMMA_SAMPLE_SIZE, c.random_state,
                                           SAMPLE_PURPOSE["gamma"]))
    median = median_heuristic_gamma(c.kernel, sample)
    if median is None or c.gamma < FAR_ABOVE * median:
        return type(err)(text) if text != str(err) else None
    found = _scan_size(c, source, median)
    checked = ("" if found is None else
               f": a greedy scan of a seeded sample of {found[1]} rows at that gamma and "
               f"tol={c.tol:.3g} keeps {found[0]} points")
    head = text.split(";", 1)[0]
    return type(err)(
        f"{head}; gamma={c.gamma:.3g} is {c.gamma / median:.3g} times the median heuristic's "
        f"{median:.3g}, so the kernel sees almost no row near another and nearly every row "
        f"enters the dictionary: leave gamma to the heuristic (gamma=None, or drop --gamma) or "
        f"try gamma={median:.3g}{checked}; or raise max_dictionary_size")


def _scan_size(c, source, gamma: float) -> tuple[int, int] | None:
    """The dictionary size a greedy scan of a seeded sample reaches at ``gamma`` and
    ``c.tol`` (None if that scan fails: then no figure is quoted)."""
    from ..io.source import open_source
    from .fit import FitRun

    rows = plan_sample(source.n_rows, CHECK_ROWS, c.random_state, SAMPLE_PURPOSE["gamma"])
    X = np.asarray(source.read_index(rows), dtype=np.float64)
    cfg = dataclasses.replace(c, gamma=float(gamma), dictionary_size=None, selection="greedy",
                              scan="full", n_components=1)
    try:
        run = FitRun(cfg, open_source(X))
        kernel, _ = run.resolve_kernel()
        dictionary, _, _ = run.build_dictionary(kernel)
    except Exception:
        return None
    return int(dictionary.size), len(rows)
