"""Rounding bounds: what turns a computed residual into a certified one.

The certificate of a fit (``max_residual_``) claims that every row's squared
feature-space distance to the span of the dictionary, computed in exact arithmetic
from the same float64 rows and the same kernel, is at most a stated number. The
residuals the passes compute, ``dhat = k(x, x) - |z|^2`` with ``z = L^-1 k(D, x)``,
carry rounding that grows with the coefficients of the projection; at small tol, or
on data far from the origin, it exceeds the residuals themselves. This module bounds
that rounding, so that ``dhat + E`` is an upper bound of the exact residual.

The bound (the derivation is in ``docs/user_guide/certificate.md``)
--------------------------------------------------------
For a row x, let ``k~`` be its computed kernel row against the m dictionary points
(each entry within ``eta(x)`` of the exact value, :func:`entry_error`), ``L`` the
float64 factor the passes use and ``Delta = L L' - M`` its distance to the exact
dictionary Gram matrix ``M`` (``|Delta_ij| <= theta``, measured by
:func:`factor_error`), ``z`` the computed coordinates, satisfying
``(L + F) z = k~`` with ``|F| <= gamma_{2m} |L|`` (a backward-stable triangular solve),
and ``a`` any coefficient vector, ``y = L' a``. Since the exact residual is the
minimum over all coefficient vectors of ``|phi(x) - sum_i a_i phi(d_i)|^2``,

    r*(x) <= Q(a) = (k(x,x) - |z|^2) + |y - z|^2 + 2 a'(e - F z) - a' Delta a

with ``e = k~ - k``, an identity in exact arithmetic. Bounding each term,

    r*(x) <= dhat + 2 A (eta + gamma_{2m} l |z|) + theta A^2 + m (gamma_{2m} l A)^2
             + gamma_{m+1} (|z|^2 + |k(x,x)|) + |k~(x,x) - k(x,x)|

with ``A = |a|_1`` and ``l`` the largest row norm of L. ``a`` is either ``L^-T z``
itself (then ``y = z``, the fourth term vanishes, and ``A <= c'|z|`` with ``c`` an
upper bound of the row sums of ``|L^-1|``, :func:`inverse_row_sums`: the cheap bound,
O(m) a row) or the computed solution of ``L' a = z`` (the sharp bound, O(m^2) a row,
for the rows the cheap one cannot certify). ``theta`` is measured, not assumed: the
product ``L L'`` is formed without rounding (:func:`exact_gram`, the error-free
splitting of Ozaki et al. on top of BLAS) and compared with the dictionary's Gram
matrix in extended precision (:func:`accurate_gram`).

Everything here is pure NumPy on small arrays: m x m once per dictionary, O(m) or
O(m^2) per row.

References
----------
N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002
(Thm 3.1 and Lemma 3.1 for inner products, Thm 8.5 for triangular systems).
K. Ozaki, T. Ogita, S. Oishi and S. M. Rump, *Error-free transformations of matrix
multiplication by using fast routines of matrix multiplication and its
applications*, Numerical Algorithms 59 (2012).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .error_free import EXTENDED, U, accurate_gram, exact_gram, gamma, kernel_center
from .explicit_features import explicit_features, explicit_residual_bounds

__all__ = [
    "U",
    "gamma",
    "exact_gram",
    "EXTENDED",
    "accurate_gram",
    "factor_error",
    "inverse_row_sums",
    "entry_error",
    "diag_error",
    "kernel_center",
    "FactorRounding",
    "residual_rounding",
    "with_rounding",
]


def factor_error(kernel, points: np.ndarray, L: np.ndarray, start: int = 0) -> np.ndarray:
    """Per row i of L (from ``start``), an upper bound of ``max_j |(L L' - M)_ij|``, M the
    exact Gram matrix.

    ``L L'`` is formed without rounding (:func:`exact_gram`), M accurately
    (:func:`accurate_gram`); the difference of the two double-double matrices is taken
    with its own rounding bounded (``3u`` of itself), so the result is a measurement of
    the factor's backward error, not the a-priori ``gamma_{m+1} |L||L'|`` (which is
    about m times larger).
    """
    m = L.shape[0]
    if m == 0 or start >= m:
        return np.zeros(0)
    hi, lo, neglected = exact_gram(L, start)
    mh, ml, err = accurate_gram(kernel, points, start)
    D = (hi - mh) + (lo - ml)
    bound = np.abs(D) * (1 + 4 * U) + (neglected + err + 2 * U * U * np.abs(hi))
    return np.max(bound, axis=1)


def inverse_row_sums(L: np.ndarray) -> np.ndarray:
    """An upper bound of the row sums of ``|L^-1|`` (``+inf`` where none can be certified).

    From the computed inverse X and its residual ``R = I - X L`` (taken in float64 with
    its rounding, ``gamma_m |X||L|``, added): ``|L^-1| <= |X| + |L^-1||R|``, so the row
    sums ``s`` of ``|L^-1|`` satisfy ``s (1 - ||R||_inf) <= |X| 1`` once
    ``||R||_inf < 1/2``.
    """
    from scipy.linalg import solve_triangular

    L = np.asarray(L, dtype=np.float64)
    m = L.shape[0]
    if m == 0:
        return np.zeros(0)
    X = solve_triangular(L, np.eye(m), lower=True, check_finite=False)
    aX, aL = np.abs(X), np.abs(L)
    R = np.eye(m) - X @ L
    r = float(np.max(np.abs(R).sum(axis=1) + gamma(m + 1) * (aX @ aL).sum(axis=1)))
    if not np.isfinite(r) or r >= 0.5:
        return np.full(m, np.inf)
    return aX.sum(axis=1) * (1 + gamma(m)) / (1.0 - r)


# --------------------------------------------------------------------------- #
# the fast path's kernel values
# --------------------------------------------------------------------------- #
def _expm1_bound(s: np.ndarray | float):
    """``e^s (1 + 2u) - 1`` for the exponent error s (the exp itself within 1 ulp)."""
    return np.expm1(s) * (1 + 2 * U) + 2 * U


def entry_error(kernel, X: np.ndarray, x_aux, kx: np.ndarray, radius: float,
                kmax: float = 1.0, min_weight: float | None = None) -> np.ndarray:
    """For each row of X, a bound on ``|k~(x, d) - k(x, d)|`` over every dictionary point d.

    ``k~`` is the value the passes compute (:meth:`~ooc_spectral.kernels.Kernel.pairwise`),
    ``k`` the exact kernel of the float64 rows. ``radius`` is the largest distance of a
    dictionary point from the kernel's centre (its norm where there is no centre);
    ``kx`` the rows' computed ``k(x, x)``; ``kmax`` the largest ``|k(d, d)|``;
    ``min_weight`` the dictionary's smallest degree (subset-normalized kernels only).

    - rbf, ``exp(-gamma |x~ - d~|^2)`` from one product of rows augmented with their
      squared norms (x~ = x - centre): the exponent is within
      ``sigma = gamma (|x~| + |d~|)^2 (2 dim + 8) u`` (the product of length dim + 2, the
      norms, the scaling and the centring), so the value within ``k (e^sigma (1 + 2u) - 1)``;
      as ``k gamma |x - d|^2 <= 1/e``, also within about
      ``(8 gamma |x~|^2 + 2/e)(2 dim + 8) u``: the smaller of the two.
    - laplacian, from differences: the exponent within ``gamma_{dim+1}`` of itself, the
      value within ``gamma_{dim+1} / e + 2u``.
    - linear, ``x~ . d~``: ``(gamma_dim + 2u) |x~| |d~|``; polynomial and cosine likewise
      through their outer functions.
    """
    from .kernels import (CosineKernel, LaplacianKernel, LinearKernel, PolynomialKernel,
                          RBFKernel, SubsetNormalizedKernel)

    X = np.asarray(X)
    dim = X.shape[1]
    c = X.shape[0]
    if isinstance(kernel, RBFKernel):
        sq = np.asarray(x_aux if x_aux is not None else kernel.aux(X), dtype=np.float64)
        xn = np.sqrt(np.maximum(sq, 0.0)) * (1 + 2 * U)
        coef = (2 * dim + 8) * U * 1.01
        g = float(kernel.gamma)
        sig_far = g * (xn + radius) ** 2 * coef
        direct = _expm1_bound(sig_far)
        # k sigma with k <= exp(-g |x - d|^2): at most (8 g |x~|^2 + 2/e) coef, times e^sigma
        weighted = (8 * g * sq + 2 / math.e) * coef * np.exp(np.minimum(sig_far, 50.0)) + 2 * U
        return np.minimum(direct, weighted)
    if isinstance(kernel, LaplacianKernel):
        return np.full(c, gamma(dim + 1) / math.e * 1.01 + 2 * U * 1.01)
    if isinstance(kernel, LinearKernel):
        xn = np.sqrt(np.maximum(np.abs(kx), 0.0))
        return (gamma(dim) + 4 * U) * xn * radius * 1.01
    if isinstance(kernel, PolynomialKernel):
        # the rows as the kernel moves them (degree 1 takes a centre), as the linear
        # kernel's kx: uncentred norms made rows 1e10 from the origin look imprecise
        # (MetricMDS refused epoch-millisecond data; an outside audit)
        center = kernel_center(kernel)
        Xm = X if center is None else X - np.asarray(center, dtype=np.float64)
        xn = np.sqrt(np.maximum(np.einsum("ij,ij->i", Xm, Xm), 0.0)) * (1 + gamma(dim))
        g, c0, p = float(kernel.gamma), float(kernel.coef0), int(kernel.degree)
        v = g * xn * radius + abs(c0)  # bounds |gamma x.d + coef0|
        dv = g * xn * radius * (gamma(dim) + 2 * U) + U * v
        return (p * (v + dv) ** max(p - 1, 0) * dv * 1.01 + 4 * U * v ** p)
    if isinstance(kernel, CosineKernel):
        return np.full(c, (2 * dim + 10) * U * 1.01)
    if isinstance(kernel, SubsetNormalizedKernel):
        base = kernel.base
        aux = kernel.aux(X) if x_aux is None else x_aux
        b_aux = aux[:, 0] if base.has_aux else None
        deg = aux[:, 1]
        b_kx = base.diag(X, b_aux)
        eta = entry_error(base, X, b_aux, b_kx, radius, 1.0)
        # the degrees are the kernel's weights (part of its definition); the base values
        # are divided by sqrt(deg_x deg_d), deg_d >= the dictionary's smallest degree
        dmin = float(min_weight) if min_weight is not None else float(np.min(deg))
        return eta / np.sqrt(deg * dmin) * (1 + 4 * U) + 4 * U * kmax / np.sqrt(deg * dmin)
    # a user's callable: assumed accurate to a few ulp of its largest value
    return np.full(c, 16 * U * max(kmax, 1.0))


def diag_error(kernel, X: np.ndarray, x_aux, kx: np.ndarray) -> np.ndarray | float:
    """A bound on ``|k~(x, x) - k(x, x)|`` for the rows of X (0 where the diagonal is exact)."""
    from .kernels import LinearKernel, PolynomialKernel, SubsetNormalizedKernel

    dim = np.shape(X)[1]
    if isinstance(kernel, LinearKernel):  # |x~|^2, centring included
        return (gamma(dim) + 4 * U) * np.abs(kx) * 1.01
    if isinstance(kernel, PolynomialKernel):
        p = int(kernel.degree)
        return np.abs(kx) * (p * (gamma(dim + 2) + 2 * U) * 1.01 + 4 * U)
    if isinstance(kernel, SubsetNormalizedKernel):
        return 8 * U * np.abs(kx)
    return 0.0  # rbf, laplacian, cosine: 1 (or 0) exactly; a callable: taken as it is


# --------------------------------------------------------------------------- #
# per dictionary, per row
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class FactorRounding:
    """What the residual bound needs of a dictionary, computed once (O(m^3), BLAS).

    Attributes
    ----------
    size : int
        m.
    theta : float
        Upper bound of ``max |L L' - M|`` (:func:`factor_error`).
    ell : float
        Largest row norm of L (times ``1 + 4u``).
    inverse_sums : ndarray of shape (m,)
        Upper bounds of the row sums of ``|L^-1|`` (:func:`inverse_row_sums`; ``inf``
        where none could be certified: only the sharp bound is then used).
    radius : float
        Largest distance of a dictionary point from the kernel's centre.
    kmax : float
        Largest ``|k(d, d)|``.
    min_weight : float or None
        The dictionary's smallest degree (subset-normalized kernels).
    target : float
        The residual the fit promises (its tol, or ``inf``): rows whose cheap bound
        exceeds it get the sharp one (:meth:`certify`).
    cap : float
        A bound every row's exact residual already has (the tol of a scan that
        certified each row it skipped, ``inf`` otherwise): :meth:`certify` returns at
        most this.
    extended : ExtendedGram or None
        The dictionary's Gram matrix in double-double (:mod:`~ooc_spectral.core.extended`):
        rows the float64 bounds leave beyond the target are bounded with it.
    """

    size: int
    theta: float
    ell: float
    inverse_sums: np.ndarray
    radius: float
    kmax: float
    min_weight: float | None = None
    target: float = math.inf
    cap: float = math.inf
    extended: object = None

    @classmethod
    def of(cls, kernel, points: np.ndarray, L: np.ndarray, aux=None, *, target: float = math.inf,
           cap: float = math.inf, extended=None) -> "FactorRounding":
        points = np.ascontiguousarray(points, dtype=np.float64)
        m = points.shape[0]
        if m == 0 or L is None:
            return cls(m, 0.0, 0.0, np.zeros(m), 0.0, 0.0, None, float(target), float(cap))
        if extended is not None:
            extended.grow(points)
        theta = float(np.max(factor_error(kernel, points, L)))
        ell = float(np.sqrt(np.max(np.einsum("ij,ij->i", L, L)))) * (1 + 4 * U) * (1 + gamma(m))
        c = kernel_center(kernel)
        P = points if c is None else points - np.asarray(c, dtype=np.float64)
        radius = float(np.sqrt(np.max(np.einsum("ij,ij->i", P, P)))) * (1 + gamma(P.shape[1] + 2))
        aux = aux if aux is not None else kernel.aux(points)
        kd = kernel.diag(points, aux)
        weight = None
        if getattr(kernel, "name", "") == "subset-normalized":
            weight = float(np.min(aux[:, 1]))
        return cls(m, theta, ell, inverse_row_sums(L), radius, float(np.max(np.abs(kd))), weight,
                   float(target), float(cap), extended)

    def row_errors(self, kernel, X, x_aux, kx) -> np.ndarray:
        """``eta(x)`` of :func:`entry_error` for the rows of X against this dictionary."""
        return entry_error(kernel, X, x_aux, kx, self.radius, self.kmax, self.min_weight)

    def cheap_coefficients(self, Z: np.ndarray) -> np.ndarray:
        """An upper bound of ``|L^-T z|_1`` for each row z of Z (``c' |z|``)."""
        if not np.all(np.isfinite(self.inverse_sums)):
            return np.full(Z.shape[0], np.inf)
        return np.abs(Z) @ self.inverse_sums

    def sharp_coefficients(self, L: np.ndarray, Z: np.ndarray, solutions: bool = False):
        """``|a|_1`` for ``a`` the computed solution of ``L' a = z``, each row z of Z (any
        vector a works in the bound; the solve's residual enters through
        :func:`residual_rounding`'s ``solved`` term); with ``solutions``, also the
        solutions (m x c)."""
        from scipy.linalg import solve_triangular

        A = (solve_triangular(L, np.ascontiguousarray(Z.T), lower=True, trans="T",
                              check_finite=False) if Z.shape[0] else np.zeros((L.shape[0], 0)))
        return (np.abs(A).sum(axis=0), A) if solutions else np.abs(A).sum(axis=0)

    def bound(self, sq, kx, eta, coef, *, solved: bool, kx_error=0.0,
              shift=0.0) -> np.ndarray:
        """:func:`residual_rounding` with this dictionary's constants."""
        return residual_rounding(self.size, self.theta, self.ell, sq, kx, eta, coef,
                                 solved=solved, kx_error=kx_error, shift=shift)

    def certify(self, dictionary, X: np.ndarray, x_aux, kx: np.ndarray, sq: np.ndarray,
                dhat: np.ndarray, cheap: np.ndarray | None, uncentred, shift: float = 0.0):
        """Every row's certified residual: an upper bound of its exact squared distance to
        the dictionary's span.

        Parameters
        ----------
        dictionary : Dictionary
            Its kernel and factor.
        X, x_aux, kx : the rows, their ``kernel.aux`` and computed ``k(x, x)``
        sq, dhat : ndarray of shape (c,)
            The computed ``|z|^2`` and ``k(x, x) - |z|^2``.
        cheap : ndarray of shape (c,) or None
            ``|z| . inverse_sums`` (:meth:`cheap_coefficients`), None where not computed.
        uncentred : callable
            ``uncentred(rows)``: those rows' coordinates (c' x m), for the sharp bound.
        shift : float
            How far those coordinates may be from the computed ones, per entry (0 when
            they are the computed ones; the rounding of a centring and its undoing else).

        Returns
        -------
        bounds : ndarray of shape (c,)
            ``min(dhat + E, cap)``.
        xi : ndarray of shape (c,)
            Each row's coordinate perturbation bound ``eta + gamma_{2m} l |z|`` (the
            eigenvalues' lower allowance, :func:`eigenvalue_allowance`).
        rounding : ndarray of shape (c,)
            E.
        sharp : int
            Rows that needed the sharp bound.
        """
        kernel, m = dictionary.kernel, self.size
        eta = self.row_errors(kernel, X, x_aux, kx)
        kerr = diag_error(kernel, X, x_aux, kx)
        if cheap is None:
            cheap = np.full(X.shape[0], np.inf)
        E = self.bound(sq, kx, eta, cheap, solved=False, kx_error=kerr)
        pos = np.maximum(dhat, 0.0)
        explicit = explicit_features(kernel) is not None
        # the sharp bound where the cheap one misses the target; with explicit features,
        # wherever the rounding is not small against the residual (a bound near the truth)
        need = np.flatnonzero((E > 1e-3 * pos) & (explicit | (dhat + E > self.target)))
        sharp = int(need.size)
        if sharp:
            coef, a = self.sharp_coefficients(dictionary.L, uncentred(need), True)
            kerr_n = kerr if np.ndim(kerr) == 0 else kerr[need]
            shift_n = shift * (np.sqrt(np.maximum(sq[need], 0.0)) + math.sqrt(m)) if shift else 0.0
            E[need] = np.minimum(E[need], self.bound(sq[need], kx[need], eta[need], coef,
                                                     solved=True, kx_error=kerr_n, shift=shift_n))
            if explicit:  # any coefficients bound the residual: the computed ones
                direct = explicit_residual_bounds(kernel, X[need], dictionary.points, a,
                                                  dictionary.L)
                E[need] = np.minimum(E[need], direct - dhat[need])
            beyond = need[dhat[need] + E[need] > self.target]
            if self.extended is not None and beyond.size:  # double-double (core/extended.py)
                up, _ = self.extended.bounds(dictionary.L, dictionary.points, X[beyond],
                                             uncentred(beyond))
                E[beyond] = np.minimum(E[beyond], up - dhat[beyond])
        bounds = np.minimum(dhat + E, self.cap)
        xi = eta + gamma(2 * m + 2) * self.ell * np.sqrt(np.maximum(sq, 0.0) * (1 + gamma(m)))
        return bounds, xi, E, sharp

    def to_report(self) -> dict:
        """The constants, for ``report.json``."""
        finite = self.inverse_sums[np.isfinite(self.inverse_sums)]
        return {"factor_backward_error": self.theta, "factor_row_norm": self.ell,
                "inverse_row_sum_max": float(np.max(finite)) if finite.size == self.size
                and self.size else None,
                "dictionary_radius": self.radius}


def with_rounding(dictionary, *, target: float = math.inf, cap: float = math.inf,
                  extended=None):
    """``dictionary`` with its :class:`FactorRounding` attached (O(m^3) once): what pass 2
    certifies every row's residual with. ``target`` and ``cap`` as there; ``extended``, the
    dictionary's Gram matrix in double-double
    (:class:`~ooc_spectral.core.extended.ExtendedGram`, grown here to the whole dictionary),
    bounds in double-double the rows still beyond the target."""
    import dataclasses

    if dictionary.L is None:
        return dictionary
    r = FactorRounding.of(dictionary.kernel, dictionary.points, dictionary.L, dictionary.aux,
                          target=target, cap=cap, extended=extended)
    return dataclasses.replace(dictionary, rounding=r)


def residual_rounding(m: int, theta: float, ell: float, sq, kx, eta, coef, *,
                      solved: bool, kx_error=0.0, shift=0.0) -> np.ndarray:
    """``E``: the computed residual ``dhat`` plus E bounds the exact one (module docstring).

    Parameters
    ----------
    m : int
    theta, ell : float
        :class:`FactorRounding`'s constants.
    sq : ndarray of shape (c,)
        The computed ``|z|^2`` of the rows.
    kx : ndarray of shape (c,)
        The computed ``k(x, x)``.
    eta : ndarray of shape (c,)
        The rows' kernel-entry error bounds (:func:`entry_error`).
    coef : ndarray of shape (c,)
        ``|a|_1`` (sharp, ``solved=True``) or an upper bound of ``|L^-T z|_1`` (cheap).
    solved : bool
        Whether ``coef`` belongs to a computed solution of ``L' a = z`` (adds its
        residual's square, second order).
    kx_error : float or ndarray
        :func:`diag_error`.
    shift : float or ndarray
        With ``solved``: how far (2-norm) the coordinates solved for may be from the
        computed ones (:meth:`FactorRounding.certify`).
    """
    sq = np.asarray(sq, dtype=np.float64)
    g2m = gamma(2 * m + 2)
    zn = np.sqrt(np.maximum(sq, 0.0) * (1 + gamma(m)))
    A = np.asarray(coef, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        E = (2 * A * (eta + g2m * ell * zn) + theta * A * A
             + gamma(m + 2) * (np.abs(sq) + np.abs(kx)) + kx_error)
        if solved:  # |L' a - z|^2: the solve's residual and any shift of z
            E = E + (math.sqrt(m) * g2m * ell * A + shift) ** 2
    E = E * (1 + 8 * U)
    return np.where(np.isnan(E), np.inf, E)
