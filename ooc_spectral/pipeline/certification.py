"""The fit's certificate around its passes: the spectrum's interval, the rounding report,
and the advice of a breakdown checked before it is given.

- :func:`eigenvalue_interval`: every exact eigenvalue's interval from pass 2's certified
  sums and the eigensolve (:func:`~ooc_spectral.core.eigensolve.spectrum_allowance`);
  :func:`keep_certified`, the eigenvalues ``n_components=None`` keeps (those above 0).
- :func:`rounding_report`: the certificate's rounding terms for ``report.json``.
- :func:`advised` / :func:`advise_tol`: a :class:`~ooc_spectral.exceptions.NumericalBreakdownError`
  of a tol-based fit names the smallest tol whose scan certifies every row of this data
  (all of it when small, a seeded sample otherwise), found by scanning, not guessed: a
  user who follows the message gets a certified fit.
"""

from __future__ import annotations

import re

import numpy as np

from ..core import planning
from ..core.checks import check_conditioning, conditioning_advice, nice_ceil
from ..core.eigensolve import eigenvalue_error_bound, spectrum_allowance
from ..core.kernels import Kernel
from ..core.model import Dictionary, SpectralMap
from ..core.planning import VisitOrder
from ..core.scan.blocked import scan_rows
from ..core.scan.state import DictionaryState
from ..exceptions import DictionaryError, DictionarySizeError, NumericalBreakdownError

__all__ = ["ADVICE_ROWS", "advised", "advise_tol", "certified_spectrum", "eigenvalue_interval",
           "keep_certified", "rounding_report"]

#: Rows of the sample on which the advised tol of a breakdown is checked.
ADVICE_ROWS = 20_000


def eigenvalue_interval(dictionary: Dictionary, stats, smap: SpectralMap, depth: int,
                        tol: float) -> np.ndarray:
    """``[lambda_i - lower_i, lambda_i + b + upper_i]`` for each computed eigenvalue
    (:func:`~ooc_spectral.core.eigensolve.spectrum_allowance`), shape (p, 2).

    Raises :class:`NumericalBreakdownError` where an end is not finite: the factor's
    rounding then swamps the eigenvalues (``||G - I|| >= 1/2`` there), and a spectrum
    float64 cannot certify is refused, not returned with an interval of ``[-inf, inf]``.
    The advice is :func:`~ooc_spectral.core.checks.conditioning_advice`'s, as for a factor
    too ill-conditioned, checked by :func:`advised` before it is given.
    """
    lower, upper = spectrum_allowance(dictionary, stats.m2, smap, stats.sums, depth)
    b = eigenvalue_error_bound(stats.sums, dictionary.size)
    lam = np.asarray(smap.eigenvalues, dtype=np.float64)
    interval = np.column_stack([lam - lower, lam + b + upper])
    if np.all(np.isfinite(interval)):
        return interval
    advice = conditioning_advice(dictionary, tol)
    err = NumericalBreakdownError(
        f"the eigenvalues cannot be certified: the rounding of the dictionary's Cholesky "
        f"factor ({dictionary.size} points) swamps them, so no interval around them is finite. "
        f"Use tol >= {advice:.2g} (with dictionary_size, a smaller one), or a smaller gamma")
    err.suggested_tol = advice
    raise err


def certified_spectrum(dictionary: Dictionary, stats, smap: SpectralMap, depth: int, tol: float,
                       n_components, additive: bool) -> tuple[SpectralMap, np.ndarray | None]:
    """``(smap, interval)``: :func:`eigenvalue_interval` of the additive normalization
    (None for the divisive one), and with ``n_components=None`` the map cut to the
    eigenvalues it certifies above 0 (:func:`keep_certified`)."""
    if not additive:
        return smap, None
    return keep_certified(smap, eigenvalue_interval(dictionary, stats, smap, depth, tol),
                          n_components)


def keep_certified(smap: SpectralMap, interval: np.ndarray, n_components):
    """With ``n_components=None`` ("every direction"), the leading eigenpairs whose
    interval lies above 0: an eigenvalue above the eigensolve's rounding whose interval
    reaches 0 may be no direction of the exact problem (cosine rows 1e6 from the origin
    kept 7.7e-23 in ``[-7e-11, 5.5e-10]``, a coordinate of noise; an outside audit).
    Raises :class:`~ooc_spectral.exceptions.DictionaryError` when none is."""
    if n_components is not None or np.all(interval[:, 0] > 0):
        return smap, interval
    k = int(np.argmin(interval[:, 0] > 0))
    if k == 0:
        # a direction of eigenvalue at most hi spreads the n rows by about hi / n each: a
        # tol below that lets the dictionary resolve it
        hi, n = float(interval[0, 1]), max(int(smap.n_samples), 1)
        advice = nice_ceil(hi / n) / 10 if hi > 0 else 0.0
        raise DictionaryError(
            f"no eigenvalue of the centred Gram matrix is certified above 0 (the largest, "
            f"{smap.eigenvalues[0]:.3g}, may be anywhere in [{interval[0, 0]:.3g}, {hi:.3g}]): "
            "the data's directions in feature space are below what this dictionary resolves"
            + (f". Use tol <= {advice:.2g} (about the squared spread of {n} rows along such a "
               "direction)" if advice > 0 else "")
            + ", or check the data and the kernel (rows far from the origin are nearly "
            "parallel to a cosine kernel)")
    cut = SpectralMap(smap.dictionary, smap.mode, smap.center, smap.components[:, :k].copy(),
                      smap.eigenvalues[:k].copy(), smap.n_samples)
    return cut, interval[:k]


def rounding_report(dictionary: Dictionary, sums) -> dict | None:
    """The certificate's rounding terms for ``report.json``: the dictionary's constants
    (:meth:`FactorRounding.to_report <ooc_spectral.core.rounding.FactorRounding.to_report>`)
    and pass 2's largest rounding term and count of rows that needed the sharp bound."""
    r = dictionary.rounding
    if r is None:
        return None
    out = r.to_report()
    if sums is not None and sums.certified:
        out.update({"max_rounding": sums.max_rounding, "sharp_rows": sums.sharp_rows,
                    "sum_certified_residuals": sums.sum_dhat})
    return out


def advised(run, err: NumericalBreakdownError, kernel: Kernel) -> NumericalBreakdownError:
    """``err`` with the tol its message advises replaced by one :func:`advise_tol` checked
    on the data of ``run`` (a :class:`~ooc_spectral.pipeline.fit.FitRun`); ``err`` itself
    where it advises no tol or the fit is not tol-based."""
    c = run.config
    if getattr(err, "suggested_tol", None) is None or c.dictionary_size is not None or c.tol is None:
        return err
    # tol 0 (every direction) has no grid point above it: search from 1/100 of the advice
    start = float(c.tol) if c.tol > 0 else max(float(err.suggested_tol) / 100, 1e-300)
    advice, checked = advise_tol(run, kernel, start)
    msg = re.sub(r"Use tol >= [0-9.e+-]+", f"Use tol >= {advice:.2g}", str(err))
    if checked:
        msg += f" (tol={advice:.2g} is certified on {checked})"
    new = NumericalBreakdownError(msg)
    new.suggested_tol = advice
    return new


def advise_tol(run, kernel: Kernel, tol: float) -> tuple[float, str]:
    """The smallest tol of the grid ``1, 2, 5 x 10^k`` above ``tol`` whose scan certifies
    every row of the data (in the fit's visiting order, when it has at most
    :data:`ADVICE_ROWS` rows; else of a seeded sample of that many, and the advice is
    then doubled, since more rows make a larger dictionary) with a factor the passes
    resolve; and what it was checked on ("" if no tol below ``k(x, x)`` is)."""
    c, s = run.config, run.source
    if s.n_rows <= ADVICE_ROWS:
        rows = VisitOrder(s.n_rows, c.random_state, window=planning.VISIT_WINDOW_ROWS).global_order()
        X = s.read_index(np.arange(s.n_rows))[rows]
        what = "every row in this fit's order"
    else:
        sorted_rows, X = run._sample("advice", ADVICE_ROWS)
        perm = np.random.default_rng(np.random.SeedSequence([c.random_state, 0xAD])).permutation(
            len(sorted_rows))
        rows, X = sorted_rows[perm], X[perm]
        what = f"a seeded sample of {len(rows)} rows"
    scale = float(np.max(np.abs(kernel.diag(X[: min(len(X), 4096)])))) or 1.0
    t = tol
    while t < scale:
        t = nice_ceil(t, strictly=True)
        state = DictionaryState(kernel, s.n_features, c.affine)
        try:
            scan_rows(state, X, rows, t, limit=c.max_dictionary_size)
            check_conditioning(state.freeze(), t)
        except (NumericalBreakdownError, DictionarySizeError):
            continue
        return (t if s.n_rows <= ADVICE_ROWS else nice_ceil(2 * t)), what
    return nice_ceil(scale), ""
