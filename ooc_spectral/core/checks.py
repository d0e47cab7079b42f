"""Run-time checks of a fit's numerics between its stages.

After the scan, the dictionary's Cholesky factor must be well enough conditioned for
float64 (:func:`check_conditioning`); after pass 2, every row's residual must be
within ``tol`` up to the rounding of the residual itself (:func:`check_certificate`).
Past either, the coordinates, the residuals and the spectrum computed from them are
rounding noise at the scale of the small eigenvalues, with every computed residual
still looking within tol: the fit stops with a message saying what to change.
"""

from __future__ import annotations

import logging
import math

import numpy as np
from scipy.linalg.lapack import dtrcon

from ..exceptions import DictionaryError, DictionaryWarning, NumericalBreakdownError, warn_once
from .eigensolve import check_n_components, spent_directions
from .kernels import Kernel
from .model import PIVOT_FLOOR, Dictionary
from .statistics import Certificate

log = logging.getLogger("ooc_spectral")

__all__ = ["CONDITION_LIMIT", "check_conditioning", "check_certificate", "check_dictionary",
           "certifiable_tol", "nice_ceil",
           "feature_space_dimension"]


#: Largest ``eps * cond_1(L)`` (LAPACK's estimate) the coordinates are trusted with:
#: between the condition numbers of healthy fits and those of fits whose eigenvalues
#: were wrong with every computed residual within tol (docs/measurements.md,
#: "Numerical thresholds").
CONDITION_LIMIT = 1e-4 / np.finfo(np.float64).eps


def feature_space_dimension(kernel: str, n_features: int, degree: int) -> int | None:
    """Dimension of a finite-dimensional kernel's feature space (None if infinite)."""
    if kernel in ("linear", "cosine"):
        return int(n_features)
    if kernel == "polynomial":
        return math.comb(int(n_features) + int(degree), int(degree))
    return None


def check_conditioning(dictionary: Dictionary, tol: float) -> None:
    """Raise :class:`NumericalBreakdownError` if the factor is too ill-conditioned.

    Past :data:`CONDITION_LIMIT` the coordinates of the rows (and so their
    residuals, which then look within ``tol``) are rounding noise at the scale of
    the small eigenvalues. Checked right after the scan, before any pass.
    """
    m = dictionary.size
    if dictionary.L is not None and m > 1:
        rcond, _ = dtrcon(dictionary.L, norm="1", uplo="L", diag="N")
        if rcond * CONDITION_LIMIT < 1.0:
            advice = conditioning_advice(dictionary, tol)
            raise _advised(advice, NumericalBreakdownError(
                f"the dictionary's Cholesky factor ({m} points) has condition number about "
                f"{1 / max(rcond, 1e-300):.2g}, beyond the {CONDITION_LIMIT:.2g} float64 arithmetic "
                f"resolves: at tol={tol:.3g} the rows' coordinates, residuals and spectrum would "
                f"be rounding noise at the scale of the small eigenvalues. Use tol >= "
                f"{advice:.2g}, or a smaller gamma"))


def conditioning_advice(dictionary: Dictionary, tol: float) -> float:
    """The tol to advise when the factor's rounding swamps the fit (its conditioning, or
    the eigenvalues' interval): 100 times ``tol``; at tol 0, which kept every direction
    down to the pivot floor, 100 times the smallest pivot that entered, which leaves out
    the directions that broke the factor. Checked before it is given
    (:func:`~ooc_spectral.pipeline.certification.advised`)."""
    if tol > 0:
        return tol * 100
    smallest = float(np.min(np.abs(np.diag(dictionary.L)))) ** 2 if dictionary.L is not None else 0.0
    return nice_ceil(100 * max(smallest, 1e-300))


def check_certificate(cert: Certificate, tol: float, m: int, kernel: Kernel, dictionary: Dictionary,
                      max_kx: float = 0.0, sums=None) -> None:
    """Raise :class:`NumericalBreakdownError` if a row is beyond ``tol`` after a full scan.

    A row's residual after pass 2 is the larger of its computed ``delta`` and, where
    pass 2 certified it (:class:`~ooc_spectral.core.rounding.FactorRounding`), the
    upper bound of its exact squared distance to the span, rounding included. The
    scan left every row within ``tol``; pass 2's computed ``delta`` may exceed it by
    its own rounding, bounded by the largest certified rounding term (or, uncertified,
    ``(PIVOT_FLOOR + 16 (m + 2) eps) max k(x, x)``). Beyond that, float64 cannot tell
    whether rows are within ``tol`` with this dictionary: the residuals, and the spectrum
    computed from the same coordinates, are rounding noise at that scale. The advice
    is the smallest tol the rounding allows (:func:`certifiable_tol`).
    """
    if tol <= 0:  # every direction: there is no tol to certify against
        return
    eps = np.finfo(np.float64).eps
    kmax = float(np.max(np.abs(kernel.diag(dictionary.points, dictionary.aux)))) if m else 1.0
    kmax = max(kmax, float(max_kx))
    rounding = float(sums.max_rounding) if sums is not None and sums.certified else 0.0
    slack = (PIVOT_FLOOR + 16.0 * (m + 2) * eps) * kmax + rounding
    worst = float(cert.max_delta)
    if worst > tol + slack:
        advice = certifiable_tol(max(rounding, worst - tol), tol)
        raise _advised(advice, NumericalBreakdownError(
            f"row {int(cert.argmax)} may be at squared distance {worst:.3g} from the "
            f"dictionary's span after the scan, beyond tol={tol:.3g} (the residuals' rounding "
            f"reaches {max(rounding, slack):.2g}): at this tol the dictionary's Cholesky factor "
            f"({m} points) is too ill-conditioned for float64 arithmetic to certify every row. "
            f"Use tol >= {advice:.2g}, or a smaller gamma"))


def _advised(tol: float, err: NumericalBreakdownError) -> NumericalBreakdownError:
    """``err`` carrying the tol its message advises (``suggested_tol``), which the fit
    replaces by one it checked (:meth:`~ooc_spectral.pipeline.fit.FitRun.advise_tol`)."""
    err.suggested_tol = float(tol)
    return err


def _too_few_points(dictionary: Dictionary, kernel: Kernel, gamma, tol: float, c,
                    n_features: int, spent: int) -> DictionaryError:
    """The error of a dictionary with fewer points than ``n_components`` needs. Its
    ``kind`` says why: ``"feature-space"`` (the kernel's feature space has no more
    directions), ``"groups"`` (groups of equal rows), ``"every-direction"`` (tol 0),
    ``"constant"`` (a kernel so wide it is nearly constant over the data), else ``"tol"``
    (a smaller tol could add points; where the exact problem is at hand the fit solves it
    instead, :mod:`ooc_spectral.pipeline.exact`)."""
    m = dictionary.size
    limit = max(m - spent, 0)
    scale = float(np.max(kernel.diag(dictionary.points)))
    dim = feature_space_dimension(c.kernel, n_features, c.degree)
    kind = "tol"
    if dim is not None and m >= dim:
        err = DictionaryError(
            f"n_components={c.n_components} exceeds the dimension of the {c.kernel} "
            f"kernel's feature space on {n_features} features ({dim}), which "
            f"the {m} dictionary points already span: no tol or gamma can add a "
            f"direction; lower n_components to at most {max(m - spent, 0)}")
        err.kind = "feature-space"
        return err
    if tol <= 0:  # tol 0 already asked for every direction: no tol adds one
        kind = "every-direction"
        why = ("at tol=0 every direction of the data that float64 tells apart from the span "
               "of the others is in the dictionary already")
    elif tol >= 0.1 * scale:
        why = f"tol={tol:.3g} is not small against k(x, x)={scale:.3g}"
    elif gamma is not None and c.kernel in ("rbf", "laplacian") and (
            apart := _largest_off_diagonal(dictionary) / scale) < 0.5:
        kind = "groups"
        why = (f"the {m} dictionary point{'s are' if m != 1 else ' is'} far apart under "
               f"the kernel (k between two of them at most {apart:.2g} of k(x, x)), and "
               f"every other row is within tol={tol:.3g} of their span: the data hold {m} "
               "groups of equal or nearly equal rows, and no kernel width, tol or "
               "dictionary size tells equal rows apart")
        if c.normalization == "additive":  # centred, m groups span m - 1 directions
            limit = max(m - 1, 0)
    elif gamma is not None and c.kernel in ("rbf", "laplacian") and m == 1:
        kind = "constant"  # every row within tol of one point: k(x, d) >= 1 - tol / 2
        why = (f"with gamma={gamma:.3g} the {c.kernel} kernel is nearly constant over the "
               f"data, so every row is within tol={tol:.3g} of the first point")
    else:
        why = f"every row is within tol={tol:.3g} of the span of the first points"
    diagnosis = (f"the dictionary has only {m} point{'s' if m != 1 else ''}, so n_components="
                 f"{c.n_components} is not {'below' if spent else 'at most'} the dictionary "
                 f"size; {why}")
    err = DictionaryError(f"{diagnosis}; lower n_components to at most {limit}")
    err.kind, err.diagnosis, err.limit, err.gamma = kind, diagnosis, limit, gamma
    return err


def nice_ceil(x: float, strictly: bool = False) -> float:
    """The smallest 1, 2 or 5 times a power of ten at least ``x`` (above it if ``strictly``)."""
    x = float(x)
    e = math.floor(math.log10(x)) - 1
    while True:
        for f in (1.0, 2.0, 5.0):
            v = f * 10.0 ** e
            if (v > x * (1 + 1e-12)) if strictly else (v >= x * (1 - 1e-12)):
                return v
        e += 1


def certifiable_tol(rounding: float, tol: float) -> float:
    """A tol whose certificate the rounding allows: 8 times the largest rounding term seen
    at ``tol`` (a larger tol gives a smaller, better conditioned dictionary, whose
    rounding is smaller still), rounded up to 1, 2 or 5 times a power of ten, and at
    least 10 tol."""
    return nice_ceil(max(8.0 * float(rounding), 10.0 * float(tol)))


def _largest_off_diagonal(dictionary: Dictionary) -> float:
    """The largest kernel value between two distinct points of a small dictionary, from
    its factor (``k(D, D) = L L^T``); inf for fewer than two points (no pair says the
    points are apart)."""
    if dictionary.size < 2:
        return math.inf
    G = dictionary.L @ dictionary.L.T
    np.fill_diagonal(G, -np.inf)
    return float(G.max())


def check_dictionary(dictionary: Dictionary, kernel: Kernel, gamma, tol: float, config,
                     n_rows: int, n_features: int) -> None:
    """Explain a degenerate dictionary: too small for ``n_components``, or every row."""
    c, m, n = config, dictionary.size, n_rows
    spent = spent_directions(c.affine, c.normalization, c.drop_first)
    width = ""
    if gamma is not None:
        width = f" (gamma={gamma:.3g})"
    wanted = 1 if c.n_components is None else c.n_components  # None: every direction
    if m == 0:
        raise DictionaryError(
            f"no row entered the dictionary: every row is within tol={tol:.3g} of the span "
            f"of none (the {c.kernel} kernel sees the {n_rows} rows as one point, k(x, x) at "
            "most tol), so there is nothing to embed; check the data, or lower tol")
    if m < wanted + spent:
        raise _too_few_points(dictionary, kernel, gamma, tol, c, n_features, spent)
    if c.dictionary_size is None and m == n:
        msg = (f"every one of the {n} rows entered the dictionary{width}: the kernel is so "
               "narrow that no row is near the span of the others; the result is the exact "
               "embedding at the cost of the full problem")
        if gamma is not None and c.kernel in ("rbf", "laplacian"):
            msg += f"; use a smaller gamma (try gamma={gamma / 10:.3g}) or a larger tol"
        warn_once(msg, DictionaryWarning, stacklevel=4)
    check_n_components(m, wanted, spent)
