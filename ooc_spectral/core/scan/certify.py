"""The scan's membership test, with the rounding of every residual bounded.

The scan skips a row only when the row is certainly within ``tol`` of the span of
the dictionary: its computed residual plus a bound on the rounding of that residual
(:mod:`ooc_spectral.core.rounding`) is at most ``tol``. A row it cannot certify
enters the dictionary, provided the rounding is small against ``tol`` (at most
:data:`RESOLVED` of it: the entering row's pivot is then resolved, not rounding
noise); otherwise float64 cannot decide the row at this ``tol`` with this dictionary,
and the scan stops with :class:`~ooc_spectral.exceptions.NumericalBreakdownError`
naming the smallest tol the rounding allows. Every row the scan skipped is then
within ``tol`` in exact arithmetic, with the final dictionary too (adding points
only lowers a residual): pass 2's certificate is capped at ``tol``.

:class:`ScanRounding` keeps the bound's constants as the dictionary grows, as a
function of the dictionary alone (its factor, points and kernel), so that a scan
resumed from a checkpoint makes the decisions of an uninterrupted one:

- the row sums ``c`` of ``|L^-1|`` (the cheap bound ``|a|_1 <= c'|z|``), one per
  point, from the point's own coefficients ``a = L^-T z`` when it entered, inflated
  by :data:`COEF_SAFETY` for the rounding of that solve;
- the factor's backward error: measured (:func:`~ooc_spectral.core.rounding.factor_error`)
  for the rows added since the last measurement each time the dictionary reaches a
  size of the grid :func:`measure_size`, and for the points added since, the a-priori
  bound of their own row (a triangular solve and a square root: ``gamma_{2m} l |z| + eta +
  gamma_{m+2} (|z|^2 + k(x, x))``); the bound's ``theta A^2`` term becomes
  ``theta_o A^2 + 2 theta_n A A_n`` with ``A_n`` the coefficients' weight on the new
  points.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import solve_triangular

from ...exceptions import NumericalBreakdownError
from ..model import PIVOT_FLOOR
from ..explicit_features import explicit_features, explicit_residual_bounds
from ..extended import ExtendedGram, extended_kernel
from ..rounding import U, diag_error, entry_error, factor_error, gamma, kernel_center

__all__ = ["ScanRounding", "RESOLVED", "ZERO_TOL_SKIP", "COEF_SAFETY", "measure_size", "decide",
           "entered_resolved", "undecidable", "uncertifiable"]

#: Largest rounding bound, as a fraction of tol, with which a row may enter the
#: dictionary: below it, a row that is not certainly within tol is certainly beyond
#: tol minus this fraction, so its pivot is resolved.
RESOLVED = 0.25
#: At tol 0, the largest certified squared residual of a row skipped as in the span, as
#: a fraction of ``k(x, x)``. Rows in the exact span are certified to the resolution
#: their float64 values allow: about 1e-13 near the origin, 2e-8 and 2e-6 for a linear
#: kernel on unit-spread data 1e6 and 1e8 from it. A rounding bound past this is of the
#: order of the directions it could hide (0.02 to 3e3 on Gaussian kernels whose factor
#: float64 no longer resolves), and the row cannot be decided.
ZERO_TOL_SKIP = 1e-4

#: Factor on the coefficient sums computed by the scan's own solves: it covers their
#: forward error while it is below 100%, which the factor's conditioning check
#: (:data:`~ooc_spectral.core.checks.CONDITION_LIMIT`, eps cond <= 1e-4) leaves far behind.
COEF_SAFETY = 2.0

#: The factor's backward error is measured at every size up to this one, then each time
#: the dictionary has grown by a sixteenth (the cost stays a small multiple of one
#: measurement of the whole factor, O(m^3) by BLAS).
MEASURE_EVERY_UP_TO = 64


def measure_size(size: int) -> int:
    """The largest size of the measurement grid not above ``size``: every size up to
    :data:`MEASURE_EVERY_UP_TO`, then ``g + g // 16``."""
    if size <= MEASURE_EVERY_UP_TO:
        return int(size)
    g = MEASURE_EVERY_UP_TO
    while g + g // 16 <= size:
        g += g // 16
    return g


def decide(delta: float, dhat: float, floor: float, rounding: float, tol: float,
           row: int, upper: float | None = None, lower: float | None = None) -> bool:
    """Whether a row enters the dictionary: False to skip it, True to add it; raises
    :class:`~ooc_spectral.exceptions.NumericalBreakdownError` when float64 cannot decide.

    ``rounding`` is E of the row's residual ``dhat`` (its exact residual is at most
    ``dhat + E``, or ``upper`` where a sharper bound is known: explicit features; at least
    ``dhat - E``, or ``lower`` where larger, the row's *spread* being half the width of the
    two). A row certified within tol (its upper bound at most tol) is skipped when its
    ``delta`` is within tol too, or when it is numerically in the span (``dhat`` below
    the pivot ``floor``); it enters when its ``delta`` exceeds tol (the paper's rule).
    A row not certified enters if its pivot is above the floor and resolved: its spread at
    most :data:`RESOLVED` of tol (its exact residual is then above ``tol - 2E``), or, its
    exact residual certainly above tol (``lower > tol``), at most :data:`RESOLVED` of its
    residual.
    ``tol <= 0`` asks for every direction of the data: a row above the floor enters
    when its pivot is resolved (its rounding at most :data:`RESOLVED` of ``dhat``); a
    row below it is skipped when certified in the span to :data:`ZERO_TOL_SKIP` of
    ``k(x, x)``, rounding included (``dhat + E``, the bound pass 2 then reports). Any
    other row cannot be told from a direction of its own, and float64 cannot decide it:
    its exact residual may be far from 0 while ``dhat`` is cancellation noise, or 0
    while ``dhat`` is a pivot of noise.
    """
    upper = dhat + rounding if upper is None else min(upper, dhat + rounding)
    lower = dhat - rounding if lower is None else max(lower, dhat - rounding)
    spread = max(0.5 * (upper - lower), 0.0)
    # in the span: certified, or computed there and not known above it (double-double)
    inspan = upper <= floor or (dhat <= floor and lower <= floor)
    if tol <= 0:  # every direction: enter resolved pivots, skip rows certified in the span
        if not inspan:
            if spread <= RESOLVED * dhat:
                return delta > tol
        elif upper <= floor * (ZERO_TOL_SKIP / PIVOT_FLOOR):
            return False
        raise uncertifiable(spread, tol, row)
    if upper <= tol:
        return delta > tol and not inspan
    # resolved: within RESOLVED of tol (its exact residual is then above tol - 2 spread), or,
    # a row certainly beyond tol, within RESOLVED of its own residual (on data of a large
    # scale, such as a linear kernel on raw columns, a first pivot of 4.7e3 known to 9e-12)
    if inspan or not (spread <= RESOLVED * tol or (spread <= RESOLVED * dhat and lower > tol)):
        raise uncertifiable(spread, tol, row)
    return True


def entered_resolved(delta: float, rounding: float, tol: float, row: int,
                     lower: float | None = None) -> None:
    """After a row entered on ``delta > tol``: raise if its own rounding leaves it possibly
    below ``(1 - RESOLVED) tol`` (its pivot would be rounding noise at this tol); ``lower``,
    where known against the dictionary it entered, a sharper estimate of its ``delta``
    from below (double-double, explicit features)."""
    low = delta - rounding if lower is None else max(lower, delta - rounding)
    if tol > 0 and delta > tol and low <= (1.0 - RESOLVED) * tol:
        raise uncertifiable(rounding, tol, row)


def undecidable(dhat, upper, lower, tol: float) -> np.ndarray:
    """Which rows :func:`decide` cannot decide with these bounds (vectorized): neither
    certified within tol (at tol 0: resolved) nor resolved. The pivot floor and the tol-0
    rule for rows in the span are left out: this selects the rows worth bounding again."""
    spread = np.maximum(0.5 * (upper - lower), 0.0)
    if tol <= 0:
        return spread > RESOLVED * np.maximum(dhat, 0.0)
    resolved = (spread <= RESOLVED * tol) | ((spread <= RESOLVED * dhat) & (lower > tol))
    return (upper > tol) & ~resolved


def uncertifiable(rounding: float, tol: float, row: int | None = None) -> NumericalBreakdownError:
    """The error of a scan that cannot decide a row at ``tol``."""
    from ..checks import certifiable_tol

    which = f"row {row}" if row is not None else "a row"
    if not math.isfinite(rounding):  # the kernel's parameters are past float64's range
        err = NumericalBreakdownError(
            f"the rounding bound of {which}'s residual overflows float64 ({rounding}): the "
            "kernel's parameters are past the range float64 computes it in for these rows "
            "(a gamma or coef0 near 1e308, a huge degree, or rows near float64's limits); use "
            "parameters of ordinary size (gamma=None picks the median heuristic) or rescale "
            "the rows")
        err.suggested_tol = None
        return err
    advice = certifiable_tol(rounding, tol)
    if tol <= 0:
        said = (f"tol={tol:.3g} asks for every direction of the data, but the rounding of "
                f"{which}'s residual reaches {rounding:.2g}: the dictionary's Cholesky factor is "
                "too ill-conditioned for float64 arithmetic to tell whether the row is in its "
                "span or a direction of its own")
    else:
        said = (f"at tol={tol:.3g} the rounding of {which}'s residual reaches {rounding:.2g} (more "
                f"than {RESOLVED:g} of tol): the dictionary's Cholesky factor is too "
                "ill-conditioned for float64 arithmetic to tell whether the row is within tol")
    err = NumericalBreakdownError(f"{said}. Use tol >= {advice:.2g}, or a smaller gamma")
    err.suggested_tol = advice
    return err


class ScanRounding:
    """The rounding bound's constants of a growing dictionary (see the module docstring).

    ``coef`` (m,), ``apriori`` (m,): each point's inverse row sum and a-priori backward
    error; ``measured``/``theta_o``: the measured prefix and its backward error; the
    largest row norm of L, distance from the kernel's centre and ``|k(d, d)|``.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        #: decide in double-double the rows float64 cannot (:mod:`~ooc_spectral.core.extended`;
        #: the fit allows it where the exact problem is not at hand), and the dictionary's
        #: Gram matrix in double-double, grown when first needed
        self.extended_allowed = False
        self.extended: ExtendedGram | None = None
        self.coef = np.empty(0)
        self.apriori = np.empty(0)
        self.measured = 0
        self.theta_o = 0.0
        self.ell = 0.0
        self.radius = 0.0
        self.kmax = 0.0
        self.min_weight = math.inf

    def copy(self) -> "ScanRounding":
        new = ScanRounding(self.kernel)
        new.__dict__.update({k: (v.copy() if isinstance(v, (np.ndarray, ExtendedGram)) else v)
                             for k, v in self.__dict__.items()})
        return new

    # -- growth ------------------------------------------------------------ #
    def appended(self, L: np.ndarray, x: np.ndarray, x_aux, points: np.ndarray, aux) -> float:
        """Account for the point just appended as row ``m = len(L) - 1`` of L.

        Returns the rounding bound of its own residual when it entered (the E of
        its row against the dictionary before it), for the scan's check.
        """
        m = L.shape[0] - 1
        z, pivot = L[m, :m], float(L[m, m])
        kernel = self.kernel
        X = x[None, :]
        xa = None if x_aux is None else np.asarray(x_aux)[None, ...]
        kx = kernel.diag(X, xa)
        sq = float(z @ z)
        eta = float(entry_error(kernel, X, xa, kx, self.radius, max(self.kmax, 1e-300),
                                None if math.isinf(self.min_weight) else self.min_weight)[0]) if m else 0.0
        a = (solve_triangular(L[:m, :m], z, lower=True, trans="T", check_finite=False)
             if m else np.empty(0))
        A = float(np.abs(a).sum())
        An = float(np.abs(a[self.measured:]).sum())
        E = self.bound(m, np.array([sq]), kx, np.array([eta]), np.array([A]), np.array([An]),
                       solved=True, kx_error=diag_error(kernel, X, xa, kx))[0] if m else 0.0
        if m and explicit_features(kernel) is not None:  # its residual from below, directly
            _, low = explicit_residual_bounds(kernel, X, points[:m], a[:, None], L[:m, :m],
                                              inverse_norm=self.inverse_norm(m))
            E = min(E, max(pivot * pivot - float(low[0]), 0.0))
        # this point's row of L^-1 is [-a'/p, 1/p]; its sum of magnitudes:
        self.coef = np.append(self.coef, COEF_SAFETY * (A + 1.0) / pivot * (1 + gamma(m + 2)))
        g2 = gamma(2 * m + 2)
        row = (g2 * self.ell * math.sqrt(sq) + eta + gamma(m + 2) * (sq + abs(float(kx[0])))
               + 4 * U * pivot * pivot) * (1 + 8 * U)
        self.apriori = np.append(self.apriori, row)
        self.ell = max(self.ell, math.sqrt(sq + pivot * pivot) * (1 + gamma(m + 2)))
        c = kernel_center(kernel)
        dx = x if c is None else x - np.asarray(c, dtype=np.float64)
        # hypot scales: rows at 1e300 (a cosine kernel takes any scale) do not overflow
        self.radius = max(self.radius, math.hypot(*np.ravel(dx).tolist()) * (1 + gamma(len(x) + 2)))
        self.kmax = max(self.kmax, abs(float(kx[0])))
        if getattr(kernel, "name", "") == "subset-normalized":
            self.min_weight = min(self.min_weight, float(np.asarray(xa)[0, 1]))
        g = measure_size(m + 1)
        if g > self.measured:
            self.remeasure(L, points, g)
        return E

    def remeasure(self, L: np.ndarray, points: np.ndarray, g: int) -> None:
        """Measure the backward error of rows ``measured:g`` of L (their exact products
        with every row before them against the exact kernel values; O(k g^2) for k rows)."""
        new = factor_error(self.kernel, points[:g], L[:g, :g], start=self.measured)
        if new.size:
            self.theta_o = max(self.theta_o, float(np.max(new)))
        self.measured = g

    @classmethod
    def rebuild(cls, kernel, L: np.ndarray, points: np.ndarray, aux) -> "ScanRounding":
        """The constants of a dictionary restored from a checkpoint: the same computation,
        point by point, as while the scan added them."""
        r = cls(kernel)
        for m in range(L.shape[0]):
            r.appended(L[: m + 1, : m + 1], points[m], None if aux is None else aux[m],
                       points[: m + 1], None)
        return r

    # -- the bound --------------------------------------------------------- #
    def inverse_norm(self, m: int) -> float:
        """An upper bound of ``||L^-1||_2`` for the first m points: ``sqrt(||.||_1 ||.||_inf)``
        from the inverse row sums (every column sum is at most their total)."""
        c = self.coef[:m]
        return float(math.sqrt(float(np.sum(c)) * float(np.max(c)))) if c.size else 0.0

    @property
    def theta_n(self) -> float:
        """The largest a-priori backward error of the points added since the measurement."""
        tail = self.apriori[self.measured:]
        return float(np.max(tail)) if tail.size else 0.0

    def bound(self, m: int, sq, kx, eta, A, An, *, solved: bool, kx_error=0.0) -> np.ndarray:
        """E of :func:`~ooc_spectral.core.rounding.residual_rounding` with the backward
        error split between the measured prefix and the points added since."""
        sq = np.asarray(sq, dtype=np.float64)
        A = np.asarray(A, dtype=np.float64)
        An = np.minimum(np.asarray(An, dtype=np.float64), A)
        g2m = gamma(2 * m + 2)
        zn = np.sqrt(np.maximum(sq, 0.0) * (1 + gamma(m)))
        if self.measured:
            theta_o, theta_n = self.theta_o, self.theta_n
        else:  # nothing measured yet: the a-priori bound on every point
            theta_o, theta_n, An = 0.0, self.theta_n, A
        with np.errstate(over="ignore", invalid="ignore"):
            E = (2 * A * (eta + g2m * self.ell * zn) + theta_o * A * A
                 + theta_n * (2 * A - An) * An
                 + gamma(m + 2) * (np.abs(sq) + np.abs(kx)) + kx_error)
            if solved:
                E = E + (math.sqrt(max(m, 1)) * g2m * self.ell * A) ** 2
        E = E * (1 + 8 * U)
        return np.where(np.isnan(E), np.inf, E)

    def row_errors(self, X, x_aux, kx) -> np.ndarray:
        return entry_error(self.kernel, X, x_aux, kx, self.radius, max(self.kmax, 1e-300),
                           None if math.isinf(self.min_weight) else self.min_weight)

    def cheap(self, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(A, A_n)`` bounds for each row z of Z (c x m): ``c'|z|`` and its part on the
        points after the measured prefix."""
        m = Z.shape[1]
        aZ = np.abs(Z)
        A = aZ @ self.coef[:m]
        An = aZ[:, self.measured:] @ self.coef[self.measured:m] if m > self.measured else np.zeros(len(Z))
        return A, An

    @staticmethod
    def sharp(L: np.ndarray, Z: np.ndarray, measured: int, solutions: bool = False):
        """``(|a|_1, |a_n|_1)`` for a the computed solutions of ``L' a = z`` (and, with
        ``solutions``, those: m x c)."""
        if Z.shape[0] == 0 or L.shape[0] == 0:
            A = np.zeros((L.shape[0], Z.shape[0]))
        else:
            A = solve_triangular(L, np.ascontiguousarray(Z.T), lower=True, trans="T",
                                 check_finite=False)
        aA = np.abs(A)
        out = aA.sum(axis=0), aA[measured:].sum(axis=0)
        return out + (A,) if solutions else out

    def residual_bounds(self, L: np.ndarray, Z: np.ndarray, dhat: np.ndarray, delta: np.ndarray,
                        X: np.ndarray, x_aux, kx: np.ndarray, tol: float,
                        points: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(E, upper, lower)`` for each row of a block against the dictionary L (c x m
        coordinates Z): E the rounding of its computed residual, by the cheap bound and
        the sharp one for the rows the cheap one does not certify; ``upper`` an upper bound
        of its exact residual, ``dhat + E`` or, for a kernel with explicit features (given
        the dictionary's ``points``), the direct bound of
        :mod:`~ooc_spectral.core.explicit_features` where smaller; ``lower``, ``dhat - E``
        or that module's estimate from below where larger (:func:`decide`)."""
        m = L.shape[0]
        eta = self.row_errors(X, x_aux, kx)
        kerr = diag_error(self.kernel, X, x_aux, kx)
        A, An = self.cheap(Z)
        E = self.bound(m, np.einsum("ij,ij->i", Z, Z), kx, eta, A, An, solved=False, kx_error=kerr)
        explicit = points is not None and m and explicit_features(self.kernel) is not None
        undecided = dhat + E > tol
        if not explicit:  # the rows the cheap bound already has enter: no solve for them
            undecided &= ~self.enters(dhat, E, kx, tol)
        if explicit:  # also the rows the affine delta would add (every row bounded again:
            # delta unknown): in the span (certified), they do not enter, and a row whose
            # float64 residual is noise above the floor is told apart from one beyond it
            undecided |= (delta > tol) if delta is not None else True
        undecided = np.flatnonzero(undecided)
        if undecided.size:
            Zu = Z[undecided]
            As, Ans, a = self.sharp(L, Zu, self.measured, solutions=True)
            ku = kerr if np.ndim(kerr) == 0 else kerr[undecided]
            E[undecided] = np.minimum(E[undecided], self.bound(
                m, np.einsum("ij,ij->i", Zu, Zu), kx[undecided], eta[undecided], As, Ans,
                solved=True, kx_error=ku))
        upper, lower = dhat + E, dhat - E
        if undecided.size and explicit:
            up, low = explicit_residual_bounds(self.kernel, X[undecided], points, a, L,
                                               inverse_norm=self.inverse_norm(m))
            upper[undecided] = np.minimum(upper[undecided], up)
            lower[undecided] = np.maximum(lower[undecided], low)
        if points is not None and m and self.can_extend():
            self.extend(L, points, X, Z, dhat, upper, lower, tol)
        return E, upper, lower

    def enters(self, dhat: np.ndarray, E: np.ndarray, kx: np.ndarray, tol: float) -> np.ndarray:
        """The rows whose bound E already decides that they enter: certainly beyond tol and
        above the pivot floor (``dhat - E`` past both) with E resolved (:func:`decide`),
        and, where the fit decides in double-double, small enough for the entering row's
        coordinates to stay in float64 (the scan's test, ``E <= RESOLVED / 100`` of its
        residual). A sharper E decides the same for them, so the scan's choices are those
        of the sharp bound; only its cost differs (a triangular solve per entering row,
        O(m^2), most of a scan whose dictionary grows fast)."""
        if tol <= 0:
            return np.zeros(np.shape(dhat), dtype=bool)
        lower = dhat - E
        floor = PIVOT_FLOOR * np.maximum(np.abs(kx), np.finfo(np.float64).tiny)
        resolved = (E <= RESOLVED * tol) | (E <= RESOLVED * dhat)
        if self.can_extend():
            resolved &= E <= 0.01 * RESOLVED * np.maximum(dhat, tol)
        return (lower > tol) & (lower > floor) & resolved

    def can_extend(self) -> bool:
        """Whether rows float64 cannot decide are decided in double-double."""
        return self.extended_allowed and extended_kernel(self.kernel)

    def extend(self, L, points, X, Z, dhat, upper, lower, tol) -> None:
        """Narrow ``[lower, upper]`` in place by the double-double bounds
        (:meth:`ExtendedGram.bounds <ooc_spectral.core.extended.ExtendedGram.bounds>`) for the
        rows :func:`decide` would find undecidable with the float64 ones."""
        rows = np.flatnonzero(undecidable(dhat, upper, lower, tol))
        if rows.size == 0:
            return
        up, low = self.extended_bounds(L, points, X[rows], Z[rows])
        upper[rows] = np.minimum(upper[rows], up)
        lower[rows] = np.maximum(lower[rows], low)

    def extended_coordinates(self, points, x) -> tuple[np.ndarray, float]:
        """A row's coordinates and residual against ``points``, from the double-double
        factor, rounded to float64 (the factor's new row where float64 cannot resolve it)."""
        if self.extended is None:
            self.extended = ExtendedGram(self.kernel)
        z, dhat = self.extended.coordinates(points, x[None, :])
        return z[0], float(dhat[0])

    def extended_bounds(self, L, points, X, Z) -> tuple[np.ndarray, np.ndarray]:
        """The double-double ``(upper, lower)`` of rows against the first ``len(L)`` points."""
        if self.extended is None:
            self.extended = ExtendedGram(self.kernel)
        # the scan bounds a row again as points enter: its coordinates kept (scan_rows
        # forgets them for each part of rows, so that a resumed scan decides the same)
        return self.extended.bounds(L, points, X, Z, remember=True)

    def row_bound(self, L: np.ndarray, z: np.ndarray, x: np.ndarray, x_aux, kxx: float,
                  points: np.ndarray | None = None, tol: float = 0.0):
        """``(E, upper, lower)`` of one row against the dictionary L
        (:meth:`residual_bounds`, the sharp bound)."""
        m = L.shape[0]
        if m == 0:
            E = float(np.max(np.atleast_1d(diag_error(self.kernel, x[None, :], x_aux,
                                                      np.array([kxx])))))
            return E, kxx + E, kxx - E
        X = x[None, :]
        kx = np.array([kxx])
        eta = self.row_errors(X, x_aux, kx)
        A, An, a = self.sharp(L, z[None, :], self.measured, solutions=True)
        E = float(self.bound(m, np.array([float(z @ z)]), kx, eta, A, An, solved=True,
                             kx_error=diag_error(self.kernel, X, x_aux, kx))[0])
        dhat = kxx - float(z @ z)
        upper, lower = dhat + E, dhat - E
        if points is not None and explicit_features(self.kernel) is not None:
            up, low = explicit_residual_bounds(self.kernel, X, points, a, L,
                                               inverse_norm=self.inverse_norm(m))
            upper, lower = min(upper, float(up[0])), max(lower, float(low[0]))
        if points is not None and self.can_extend():
            up, low = np.array([upper]), np.array([lower])
            self.extend(L, points, X, z[None, :], np.array([dhat]), up, low, tol)
            upper, lower = float(up[0]), float(low[0])
        return E, upper, lower
