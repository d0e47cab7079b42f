"""A row's residual decided in double-double where float64 cannot (rbf, laplacian).

The float64 bound (:mod:`ooc_spectral.core.rounding`) carries ``theta |a|_1^2``, the
factor's backward error times the square of the projection's coefficients: at a small
tol the coefficients grow (``|a|_1`` of 10^2 to 10^5 at tol 1e-12) and the float64 factor
(condition numbers to 1e9, ``eps cond(M)`` above 1) certifies no residual of that size:
below about tol 5e-8 the Gaussian kernel's fits were refused. Here the same computation
is carried out in double-double (about 106 bits, :mod:`~ooc_spectral.core.double_double`):

- the kernel values from exact differences (:func:`kernel_dd`: two-sums, the exponential
  :func:`~ooc_spectral.core.double_double.dd_exp`), each within ``eta`` (about 1e-29);
- the dictionary's Gram matrix ``M`` and its Cholesky factor ``L`` in double-double, grown
  with the dictionary (:class:`ExtendedGram`), whose backward error ``theta =
  max |L L' - M|`` is measured (``L_hi L_hi'`` by
  :func:`~ooc_spectral.core.double_double.exact_products`, the rest in float64);
- a row's coordinates ``z = L^-1 k`` by a float64 solve refined with residuals in
  double-double (:func:`solve_dd`), and float64 coefficients ``a`` refined against
  ``L' a = z``.

For any coefficients ``a`` (``y = L' a``, ``e = k~ - k``, ``Delta = L L' - M``), exactly:

    Q(a) = (k(x, x) - |z|^2) + |y - z|^2 - 2 a'(k~ - L z) + 2 a'e - a' Delta a,

and the exact residual is at most ``Q(a)``, so

    r*(x) <= dhat + |z - L' a|^2 + 2 A (rho + eta) + theta A^2 + (rounding of dhat),

with ``A = |a|_1``, ``rho`` the measured ``max |k~ - L z|`` and ``|z - L' a|`` measured (each
with the rounding of its measurement). Every term but ``dhat`` is about ``1e-30 A^2`` or
smaller: 1e-20 at ``A = 10^5``. ``dhat`` less the same terms is the scan's estimate from
below (whether an entering row's pivot is resolved), as for float64.

The cost is paid only for the rows float64 cannot decide (the scan's, and pass 2's
beyond its target) and for the dictionary's factor, grown when such a row needs it.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
from scipy.linalg import solve_triangular

from .double_double import (EXP_REL_ERROR, OP_REL_ERROR, PRODUCT_REL_ERROR, GrowingSplit, dd_add,
                            dd_div, dd_exp, dd_mul, dd_mul_d, dd_row_dots, dd_sqrt,
                            exact_products, split_rows, two_prod, two_sum)
from .error_free import U

__all__ = ["extended_kernel", "kernel_dd", "solve_dd", "ExtendedGram", "SOLVE_STEPS"]

_U2 = U * U
#: Refinements of a double-double triangular solve (from float64's 16 digits, each gains
#: about 8 at the condition numbers of a small tol's factor, 1e8 to 1e9).
SOLVE_STEPS = 2
#: Rows whose coordinates :meth:`ExtendedGram.bounds` keeps, where asked to
#: (:meth:`ExtendedGram.keep_rows`): the scan bounds again at most a few hundred rows.
KEPT_ROWS = 1024


def extended_kernel(kernel) -> bool:
    """Whether :func:`kernel_dd` evaluates ``kernel`` (the Gaussian and Laplacian kernels)."""
    from .kernels import LaplacianKernel, RBFKernel

    return type(kernel) in (RBFKernel, LaplacianKernel)


def kernel_dd(kernel, X: np.ndarray, P: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """``k(X, P)`` (c x m) as a double-double ``hi + lo``, and ``eta``, a bound on
    ``|hi + lo - k|`` entrywise, ``k`` the exact kernel of the float64 rows.

    The differences ``x_j - p_j`` are exact as two-sums ``h + l``; the Gaussian kernel's
    squares ``h^2`` exact by :func:`~ooc_spectral.core.double_double.two_prod` and
    ``2 h l + l^2`` (at most ``3 u h^2``) in float64, the Laplacian's ``|h + l|`` exactly;
    summed in double-double, so the distance is within ``(3 dim + 7) u^2`` of itself, the
    exponent ``-gamma s`` within ``(3 dim + 12) u^2`` of itself, and the value within
    ``(3 dim + 12) u^2 / e`` (``k |t| <= 1/e``) plus the exponential's own error
    (:data:`~ooc_spectral.core.double_double.EXP_REL_ERROR`).
    """
    from .kernels import RBFKernel

    X = np.ascontiguousarray(X, dtype=np.float64)
    P = np.ascontiguousarray(P, dtype=np.float64)
    c, m, d = X.shape[0], P.shape[0], X.shape[1]
    sh, sl = np.zeros((c, m)), np.zeros((c, m))
    gaussian = isinstance(kernel, RBFKernel)
    for j in range(d):
        h, l = two_sum(X[:, j:j + 1], -P[None, :, j])
        if gaussian:
            ph, pl = two_prod(h, h)
            sh, sl = dd_add(sh, sl, ph, pl + (2.0 * h * l + l * l))
        else:
            sg = np.where(h < 0, -1.0, 1.0)
            sh, sl = dd_add(sh, sl, sg * h, sg * l)
    th, tl = dd_mul_d(sh, sl, -float(kernel.gamma))
    kh, kl = dd_exp(th, tl)
    return kh, kl, _kernel_eta(kernel, d)


def _kernel_eta(kernel, dim: int) -> float:
    """The bound ``eta`` of :func:`kernel_dd` on rows of ``dim`` features."""
    return float(1.1 * (EXP_REL_ERROR + (3 * dim + 12) * _U2 / math.e) + 2.3e-290)


def _gamma(n: int) -> float:
    """``gamma_n`` for operations of relative error :data:`OP_REL_ERROR`."""
    nu = n * OP_REL_ERROR
    return nu / (1.0 - nu) if nu < 1 else math.inf


def _times(Lh, Ll, Bh, Bl=None, split=None):
    """``L B`` (L m x m, B m x c) in double-double: ``L_hi B_hi`` by exact products (``split``,
    L_hi's slices where already made), the cross terms in float64; within
    ``(PRODUCT_REL_ERROR + 4 u^2) |L| |B|`` entrywise."""
    ph, pl = exact_products(Lh, Bh, split_a=split)
    cross = Ll @ Bh if Bl is None else Lh @ Bl + Ll @ Bh
    return dd_add(ph, pl, cross, np.zeros_like(ph))


def solve_dd(Lh, Ll, Kh, Kl, steps: int = SOLVE_STEPS, split=None):
    """Rows ``Z`` (c x m) with ``L Z' = K'`` in double-double, L lower triangular: the float64
    solve with ``L_hi``, refined ``steps`` times by the residual ``K - L Z'`` in
    double-double (each step gains ``log10(1 / (u cond(L)))`` digits while ``u cond(L)``
    is below 1). Returns ``(Zh, Zl, rho)``, ``rho`` per row a bound on
    ``max |K - L Z'|`` for the returned Z: the last residual, measured, and its rounding."""
    m, c = Lh.shape[0], Kh.shape[0]
    if m == 0:
        return np.zeros((c, 0)), np.zeros((c, 0)), np.zeros(c)
    if m == 1:  # one point: a double-double division, its residual measured as below
        Zh, Zl = dd_div(Kh, Kl, np.full_like(Kh, Lh[0, 0]), np.full_like(Kh, Ll[0, 0]))
        ph, pl = dd_mul(np.full_like(Zh, Lh[0, 0]), np.full_like(Zh, Ll[0, 0]), Zh, Zl)
        rh, rl = dd_add(Kh, Kl, -ph, -pl)
        mag = abs(Lh[0, 0]) * np.abs(Zh[:, 0]) + np.abs(Kh[:, 0])
        return Zh, Zl, np.abs(rh + rl)[:, 0] * (1 + 2 * U) + (PRODUCT_REL_ERROR + 8 * _U2) * mag
    Zh = solve_triangular(Lh, np.ascontiguousarray(Kh.T), lower=True, check_finite=False).T
    Zl = np.zeros_like(Zh)
    split = split_rows(Lh, m) if split is None else split

    def residual(Zh, Zl):
        ph, pl = _times(Lh, Ll, np.ascontiguousarray(Zh.T), np.ascontiguousarray(Zl.T), split)
        return dd_add(Kh.T, Kl.T, -ph, -pl)

    for _ in range(steps):
        rh, _ = residual(Zh, Zl)
        d = solve_triangular(Lh, rh, lower=True, check_finite=False).T
        if not np.all(np.isfinite(d)):
            break
        Zh, Zl = dd_add(Zh, Zl, d, np.zeros_like(d))
    rh, rl = residual(Zh, Zl)
    mag = np.abs(Lh) @ np.abs(Zh.T) + np.abs(Kh.T)
    rho = (np.max(np.abs(rh + rl) * (1 + 2 * U) + (PRODUCT_REL_ERROR + 8 * _U2) * mag, axis=0)
           if c else np.zeros(0))
    return Zh, Zl, rho


def _dd_gram(Ah, Al, Bh=None, Bl=None, split_b=None):
    """``A B'`` of double-double rows (``B = A`` when omitted): ``A_hi B_hi'`` by exact
    products (``split_b``: ``B_hi``'s parts, :func:`split_rows`, where already made), the
    cross terms in float64 (within ``2 u^2 |A||B|``, the lows' own ``u``)."""
    Bh, Bl = (Ah, Al) if Bh is None else (Bh, Bl)
    ph, pl = exact_products(Ah, np.ascontiguousarray(Bh.T), split_b=split_b)
    return dd_add(ph, pl, Ah @ Bl.T + Al @ Bh.T, np.zeros_like(ph))


class ExtendedGram:
    """The dictionary's Gram matrix ``M = k(D, D)`` and its Cholesky factor in
    double-double, grown with the dictionary (storage by doubling), and the residual
    bounds of rows against it (:meth:`bounds`). ``eta`` bounds every entry's error,
    ``theta`` the factor's backward error."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.size = 0
        self._M = (np.zeros((0, 0)), np.zeros((0, 0)))
        self._L = (np.zeros((0, 0)), np.zeros((0, 0)))
        self.eta = 0.0
        self.theta = 0.0
        self.ell = 0.0
        self._splits: dict | None = None  # the factor's parts for exact products
        self._solved: dict = {}  # the last rows solved, per size: their coordinates
        #: rows whose coordinates :meth:`bounds` keeps between calls (``remember``): row
        #: bytes -> (size, zh, zl, rho, kernel row hi, lo), at most KEPT_ROWS of them
        self._rows: OrderedDict | None = None

    def copy(self) -> "ExtendedGram":
        new = ExtendedGram(self.kernel)
        new.__dict__.update({k: (tuple(a.copy() for a in v) if isinstance(v, tuple) else v)
                             for k, v in self.__dict__.items()
                             if k not in ("_splits", "_solved", "_rows")})
        return new

    def _split(self, m: int, transposed: bool):
        """The parts of the factor (or its transpose) of the first m points, grown with the
        factor (:class:`~ooc_spectral.core.double_double.GrowingSplit`)."""
        if self._splits is None:
            self._splits = {False: GrowingSplit(lower=True), True: GrowingSplit(lower=False)}
        Lh = self._L[0][:m, :m]
        return self._splits[transposed].of(Lh.T if transposed else Lh)

    def _reserve(self, m: int) -> None:
        cap = self._M[0].shape[0]
        if m <= cap:
            return
        cap = max(m, 2 * cap, 16)
        old = self.size
        grown = []
        for pair in (self._M, self._L):
            new = tuple(np.zeros((cap, cap)) for _ in range(2))
            for a, b in zip(new, pair):
                a[:old, :old] = b[:old, :old]
            grown.append(new)
        self._M, self._L = grown

    def grow(self, points: np.ndarray) -> "ExtendedGram":
        """Extend to the first ``len(points)`` points (the rows already held unchanged):
        their kernel rows; the factor's new rows against the old ones by substitution, and
        among themselves by a right-looking Cholesky of their Schur complement; the
        backward error of the new rows, measured."""
        m0, m = self.size, int(points.shape[0])
        if m <= m0:
            return self
        self._reserve(m)
        (Mh, Ml), (Lh, Ll) = self._M, self._L
        # their coordinates against the points before them: the scan bounded an entering
        # row against them just before (kept: its kernel row too), else solved here
        Zh, Zl, rho, eta, kh, kl = self._row_coordinates(points, points[m0:m], m0,
                                                         self._rows is not None, kernel=True)
        if m - m0 == 1:  # k(x, x) = 1 exactly (rbf, laplacian)
            nh, nl, eta_n = np.ones((1, 1)), np.zeros((1, 1)), 0.0
        else:
            nh, nl, eta_n = kernel_dd(self.kernel, points[m0:m], points[m0:m])
        kh, kl = np.concatenate([kh, nh], axis=1), np.concatenate([kl, nl], axis=1)
        Mh[m0:m, :m], Ml[m0:m, :m] = kh, kl
        Mh[:m0, m0:m], Ml[:m0, m0:m] = kh[:, :m0].T, kl[:, :m0].T
        self.eta = max(self.eta, eta, eta_n)
        Lh[m0:m, :m0], Ll[m0:m, :m0] = Zh, Zl
        Sh, Sl = _dd_gram(Zh, Zl)
        Sh, Sl = dd_add(kh[:, m0:m], kl[:, m0:m], -Sh, -Sl)  # the Schur complement
        for j in range(m - m0):
            dh, dl = Sh[j, j:j + 1], Sl[j, j:j + 1]
            if not dh[0] > 0:  # not positive in double-double: the factor stops resolving
                dh, dl = np.array([np.finfo(np.float64).tiny]), np.zeros(1)
            ph, pl = dd_sqrt(dh, dl)
            Lh[m0 + j, m0 + j], Ll[m0 + j, m0 + j] = ph[0], pl[0]
            if m0 + j + 1 < m:
                ch, cl = dd_div(Sh[j + 1:, j], Sl[j + 1:, j], np.full(m - m0 - j - 1, ph[0]),
                                np.full(m - m0 - j - 1, pl[0]))
                Lh[m0 + j + 1:m, m0 + j], Ll[m0 + j + 1:m, m0 + j] = ch, cl
                oh, ol = dd_mul(ch[:, None], cl[:, None], ch[None, :], cl[None, :])
                Sh[j + 1:, j + 1:], Sl[j + 1:, j + 1:] = dd_add(Sh[j + 1:, j + 1:], Sl[j + 1:, j + 1:],
                                                                -oh, -ol)
        if m - m0 == 1 and m0:  # one point: its row's backward error is measured already
            bound = self._point_error(float(rho[0]), Zh, Zl, m0)
        else:  # backward error of the new rows: L L' by exact products, against M
            Gh, Gl = _dd_gram(Lh[m0:m, :m], Ll[m0:m, :m], Lh[:m, :m], Ll[:m, :m],
                              split_b=self._split(m, False))
            D = (Gh - Mh[m0:m, :m]) + (Gl - Ml[m0:m, :m])
            mag = np.abs(Lh[m0:m, :m]) @ np.abs(Lh[:m, :m]).T
            bound = float(np.max(np.abs(D) * (1 + 4 * U) + (PRODUCT_REL_ERROR + 4 * _U2) * mag))
        self.theta = max(self.theta, bound + self.eta + 1e-300)
        self.ell = max(self.ell, float(np.sqrt(np.max(np.einsum("ij,ij->i", Lh[m0:m, :m],
                                                                Lh[m0:m, :m])))))
        self.size = m
        return self

    def _point_error(self, rho: float, Zh, Zl, n: int) -> float:
        """``max_j |(L L' - M)_nj|`` for the factor's row n (one point added to n points)
        whose coordinates ``z = L[n, :n]`` were solved with ``rho`` bounding ``max |k~ - L z|``
        against the same leading factor: off the diagonal, ``(L L')_nj = (L z)_j`` and
        ``M_nj = k~_j``, so that bound; on it, ``|z|^2 + l_nn^2 - M_nn`` in double-double
        (:func:`~ooc_spectral.core.double_double.dd_row_dots`, within ``(1 + log2 n)`` of
        :data:`~ooc_spectral.core.double_double.OP_REL_ERROR`, a product and two additions:
        ``(log2 n + 8) OP_REL_ERROR`` of the magnitudes, with room)."""
        (Mh, Ml), (Lh, Ll) = self._M, self._L
        zh, zl = dd_row_dots(Zh, Zl, Zh, Zl)
        ph, pl = dd_mul(Lh[n, n:n + 1], Ll[n, n:n + 1], Lh[n, n:n + 1], Ll[n, n:n + 1])
        sh, sl = dd_add(zh, zl, ph, pl)
        dh, dl = dd_add(sh, sl, -Mh[n, n:n + 1], -Ml[n, n:n + 1])
        scale = abs(float(zh[0])) + float(ph[0]) + abs(float(Mh[n, n]))
        diag = (abs(float(dh[0] + dl[0])) * (1 + 4 * U)
                + (math.log2(max(n, 2)) + 8) * OP_REL_ERROR * scale * (1 + 4 * U))
        return max(rho * (1 + 4 * U), diag)

    def factor(self, m: int | None = None) -> np.ndarray:
        """The factor of the first m points rounded to float64 (within ``u`` of each entry of
        the double-double one)."""
        m = self.size if m is None else m
        return self._L[0][:m, :m] + self._L[1][:m, :m]

    def coordinates(self, points: np.ndarray, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows' coordinates ``z = L^-1 k(D, x)`` and residuals ``1 - |z|^2`` against the
        points (the factor grown to them), computed in double-double, rounded to float64."""
        m = points.shape[0]
        self.grow(points)
        key = (m, np.ascontiguousarray(X).tobytes())
        if key in self._solved:  # the rows bounds() just solved
            return self._solved[key]
        (Lh, Ll) = (a[:m, :m] for a in self._L)
        kh, kl, _ = kernel_dd(self.kernel, X, points)
        zh, zl, _ = solve_dd(Lh, Ll, kh, kl, split=self._split(m, False))
        sqh, sql = dd_row_dots(zh, zl, zh, zl)
        dh, dl = dd_add(np.ones(X.shape[0]), np.zeros(X.shape[0]), -sqh, -sql)
        return zh + zl, dh + dl

    def forget_rows(self) -> None:
        """Forget the rows :meth:`bounds` kept (``remember=True``): the scan starts afresh
        for each part of rows it scans, so that what it decides never depends on rows kept
        from before a checkpoint."""
        self._rows = None

    def _row_coordinates(self, points: np.ndarray, X: np.ndarray, m: int, remember: bool,
                         kernel: bool = False):
        """``(zh, zl, rho, eta)``: the rows' double-double coordinates against the first m
        points (:func:`solve_dd`), ``rho`` per row bounding ``max |k~ - L z|``, ``eta`` the
        kernel values' error (and, with ``kernel``, the rows' kernel values ``kh + kl``
        against the m points). With ``remember``, rows kept against a smaller dictionary of
        m0 points keep their m0 coordinates (the factor only gains rows) and solve for the
        new ones by block substitution: ``r = k_new - L_21 z_old`` in double-double (within
        ``(PRODUCT_REL_ERROR + 8 u^2)(|L_21| |z_old| + |k_new|)``), then ``L_22 z_new = r``
        (:func:`solve_dd`, its own measured residual), so ``rho`` is the largest of the
        kept one and the new block's, each with its rounding."""
        c = X.shape[0]
        (Lh, Ll) = (a[:m, :m] for a in self._L)
        if not remember:
            kh, kl, eta = kernel_dd(self.kernel, X, points[:m])
            zh, zl, rho = solve_dd(Lh, Ll, kh, kl, split=self._split(m, False) if m else None)
            return (zh, zl, rho, eta) + ((kh, kl) if kernel else ())
        if self._rows is None:
            self._rows = OrderedDict()
        kept = self._rows
        keys = [X[i].tobytes() for i in range(c)]
        zh, zl, rho = np.zeros((c, m)), np.zeros((c, m)), np.zeros(c)
        Kh, Kl = np.zeros((c, m)), np.zeros((c, m))
        start = np.zeros(c, dtype=np.int64)
        for i, key in enumerate(keys):
            got = kept.get(key)
            if got is not None and got[0] <= m:
                m0 = got[0]
                zh[i, :m0], zl[i, :m0], rho[i], start[i] = got[1], got[2], got[3], m0
                Kh[i, :m0], Kl[i, :m0] = got[4], got[5]
        eta = 0.0
        for m0 in np.unique(start):
            rows = np.flatnonzero(start == m0)
            m0 = int(m0)
            if m0 == m:
                continue
            kh, kl, eta = kernel_dd(self.kernel, X[rows], points[m0:m])
            Kh[rows, m0:m], Kl[rows, m0:m] = kh, kl
            if m0:  # r = k_new - L_21 z_old
                ph, pl = _times(Lh[m0:m, :m0], Ll[m0:m, :m0], np.ascontiguousarray(zh[rows, :m0].T),
                                np.ascontiguousarray(zl[rows, :m0].T))
                rh, rl = dd_add(kh.T, kl.T, -ph, -pl)
                err = (PRODUCT_REL_ERROR + 8 * _U2) * (np.abs(Lh[m0:m, :m0]) @ np.abs(zh[rows, :m0].T)
                                                       + np.abs(kh.T))
                kh, kl = np.ascontiguousarray(rh.T), np.ascontiguousarray(rl.T)
                extra = np.max(err, axis=0)
            else:
                extra = np.zeros(rows.size)
            if m0:
                nh, nl, nrho = solve_dd(Lh[m0:m, m0:m], Ll[m0:m, m0:m], kh, kl)
                rho[rows] = np.maximum(rho[rows], (nrho + extra) * (1 + 2 * U))
            else:  # as without remember
                nh, nl, rho[rows] = solve_dd(Lh, Ll, kh, kl,
                                             split=self._split(m, False) if m else None)
            zh[rows, m0:m], zl[rows, m0:m] = nh, nl
        eta = max(eta, _kernel_eta(self.kernel, X.shape[1]))
        for i, key in enumerate(keys):
            kept[key] = (m, zh[i].copy(), zl[i].copy(), float(rho[i]), Kh[i].copy(), Kl[i].copy())
            kept.move_to_end(key)
        while len(kept) > KEPT_ROWS:
            kept.popitem(last=False)
        return (zh, zl, rho, eta) + ((Kh, Kl) if kernel else ())

    def bounds(self, L: np.ndarray, points: np.ndarray, X: np.ndarray, Z: np.ndarray,
               remember: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(upper, lower)`` for the rows of X against the dictionary's first
        ``m = len(L)`` points: ``upper`` bounds each row's exact squared distance to their
        span, ``lower`` estimates it from below (the module's bound; L and Z, the float64
        factor and coordinates, are not used: the double-double ones are computed).

        With ``z`` the double-double coordinates (``rho`` bounding ``|k~ - L z|``), ``a``
        float64 coefficients refined against ``L' a = z``, ``s = z - L' a`` measured, and
        for any such a, exactly: ``Q(a) = (k(x, x) - |z|^2) + |s|^2 - 2 a'(k~ - L z) + 2 a'e -
        a' Delta a``, so ``r* <= dhat + |s|^2 + 2 A (rho + eta) + theta A^2``, A = ``|a|_1``."""
        m, c = L.shape[0], X.shape[0]
        if c == 0:
            return np.zeros(0), np.zeros(0)
        self.grow(points[:m])
        (Lh, Ll) = (a[:m, :m] for a in self._L)
        zh, zl, rho, eta_k = self._row_coordinates(points, X, m, remember)
        a = solve_triangular(Lh, np.ascontiguousarray(zh.T), lower=True, trans="T",
                             check_finite=False)
        LhT, LlT = np.ascontiguousarray(Lh.T), np.ascontiguousarray(Ll.T)
        split = self._split(m, True)
        sqh, sql = dd_row_dots(zh, zl, zh, zl)
        dh, dl = dd_add(np.ones(c), np.zeros(c), -sqh, -sql)  # k(x, x) = 1
        dhat, sq = dh + dl, sqh + sql
        self._solved = {(m, np.ascontiguousarray(X[i:i + 1]).tobytes()): (zh[i:i + 1] + zl[i:i + 1],
                                                                        dhat[i:i + 1])
                        for i in range(c)}
        # any coefficients serve: the float64 ones, refined once where |z - L'a|^2 is above
        # the other terms (it is about (u |L| |a|)^2 against theta |a|_1^2: seldom)
        s2, E, sh = self._terms(a, LhT, LlT, split, zh, zl, rho, sq, eta_k)
        rows = np.flatnonzero(s2 > E)
        if rows.size:
            a = a[:, rows] + solve_triangular(Lh, sh[:, rows], lower=True, trans="T",
                                              check_finite=False)
            s2r, Er, _ = self._terms(a, LhT, LlT, split, zh[rows], zl[rows], rho[rows], sq[rows],
                                     eta_k)
            better = s2r + Er < s2[rows] + E[rows]
            s2[rows[better]], E[rows[better]] = s2r[better], Er[better]
        with np.errstate(over="ignore", invalid="ignore"):
            upper = dhat + (s2 * (1 + 4 * U) + E)
            lower = dhat - E
        bad = ~np.isfinite(upper)
        upper[bad], lower[bad] = math.inf, -math.inf
        return upper, lower

    def _terms(self, a, LhT, LlT, split, zh, zl, rho, sq, eta_k):
        """``(|s|^2, E, s_hi)`` of :meth:`bounds` for coefficients ``a`` (m x c): ``s = z - L' a``
        by exact products, with the rounding of its measurement; E the terms
        ``2 A (rho + eta) + theta A^2`` and the rounding of ``dhat``."""
        m = LhT.shape[0]
        yh, yl = _times(LhT, LlT, a, split=split)
        sh, sl = dd_add(zh.T, zl.T, -yh, -yl)
        s_err = (PRODUCT_REL_ERROR + 8 * _U2) * (np.abs(LhT) @ np.abs(a) + np.abs(zh.T))
        s2 = np.einsum("ij,ij->j", np.abs(sh + sl) + s_err, np.abs(sh + sl) + s_err)
        A = np.abs(a).sum(axis=0) * (1 + _gamma(m))
        with np.errstate(over="ignore", invalid="ignore"):
            E = (2 * A * (rho + max(eta_k, self.eta)) + self.theta * A * A
                 + _gamma(int(math.log2(max(m, 2))) + 4) * (np.abs(sq) + 1.0) + 1e-300)
            return s2, E * (1 + 8 * U), sh
