"""Run-time checks of a fit's numerics between its stages.

After the scan, the dictionary's Cholesky factor must be well enough conditioned for
float64 (:func:`check_conditioning`); after pass 2, every row's residual must be
within ``tol`` up to the rounding of the residual itself (:func:`check_certificate`).
Past either, the coordinates, the residuals and the spectrum computed from them are
rounding noise at the scale of the small eigenvalues, with every computed residual
still looking within tol: the fit stops with a message saying what to change.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg.lapack import dtrcon

from ..exceptions import NumericalBreakdownError
from .kernels import Kernel
from .model import PIVOT_FLOOR, Dictionary
from .statistics import Certificate

__all__ = ["CONDITION_LIMIT", "check_conditioning", "check_certificate", "feature_space_dimension"]


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
            raise NumericalBreakdownError(
                f"the dictionary's Cholesky factor ({m} points) has condition number about "
                f"{1 / max(rcond, 1e-300):.2g}, beyond the {CONDITION_LIMIT:.2g} float64 arithmetic "
                f"resolves: at tol={tol:.3g} the rows' coordinates, residuals and spectrum would "
                f"be rounding noise at the scale of the small eigenvalues. Use a larger tol "
                f"(try tol={tol * 100:.2g}) or a smaller gamma")


def check_certificate(cert: Certificate, tol: float, m: int, kernel: Kernel, dictionary: Dictionary,
                      max_kx: float = 0.0) -> None:
    """Raise :class:`NumericalBreakdownError` if a row is beyond ``tol`` after a full scan.

    The scan guarantees ``delta_t <= tol`` for every row (the span only grows), so
    pass 2's ``max delta`` can exceed ``tol`` only by the rounding of ``delta``
    itself (allowed: ``(PIVOT_FLOOR + 16 (m + 2) eps) max k(x, x)``; the scan
    never adds a row whose unconstrained residual is below the pivot floor). More means the factor is too
    ill-conditioned for float64 at this tol: the residuals, and the spectrum
    computed from the same coordinates, are rounding noise at that scale.
    ``max_kx`` is the largest ``k(x, x)`` of the rows, when pass 2 measured it.
    """
    eps = np.finfo(np.float64).eps
    kmax = float(np.max(np.abs(kernel.diag(dictionary.points, dictionary.aux)))) if m else 1.0
    kmax = max(kmax, float(max_kx))
    # the scan never adds a row below the pivot floor, and delta's own rounding
    slack = (PIVOT_FLOOR + 16.0 * (m + 2) * eps) * kmax
    worst = float(cert.max_delta)
    if worst > tol + slack:
        raise NumericalBreakdownError(
            f"row {int(cert.argmax)} is at squared distance {worst:.3g} from the dictionary's "
            f"span after the scan, beyond tol={tol:.3g} (rounding allows {slack:.2g}): at this tol "
            f"the dictionary's Cholesky factor ({m} points) is too ill-conditioned for float64 "
            f"arithmetic, so its residuals and spectrum would be rounding noise. Use tol >= "
            f"{max(10 * worst, 10 * slack):.2g}, or a smaller gamma")
