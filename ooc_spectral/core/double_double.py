"""Double-double arithmetic on float64 arrays, by error-free transformations.

A double-double number is an unevaluated sum ``hi + lo`` of two float64 with
``|lo| <= u |hi|``: about 106 significant bits (``u^2 = 2^-106 = 1.2e-32``) with float64
hardware and BLAS. Everything here is vectorized NumPy; products of matrices go through
the splitting of Ozaki, Ogita, Oishi and Rump on top of BLAS (:func:`exact_products`),
so that a c x m by m x q product in double-double costs a few dozen ``gemm`` calls.

Used where float64 cannot decide a residual (:mod:`ooc_spectral.core.extended`): the
kernel values, the dictionary's Gram matrix and the quadratic form of a row's
projection are then carried to about 1e-29 of their scale.

Error-free transformations (exact in IEEE float64 with round-to-nearest, barring
overflow and underflow): ``two_sum`` (Knuth), ``fast_two_sum`` (Dekker, ``|a| >= |b|``),
``two_prod`` (Dekker's splitting; no fused multiply-add in NumPy).

References
----------
T. J. Dekker, *A floating-point technique for extending the available precision*,
Numer. Math. 18 (1971). D. E. Knuth, *TAOCP* vol. 2, 4.2.2.
Y. Hida, X. S. Li and D. H. Bailey, *Algorithms for quad-double precision floating point
arithmetic*, ARITH-15 (2001) (the addition and exponential below).
K. Ozaki, T. Ogita, S. Oishi and S. M. Rump, *Error-free transformations of matrix
multiplication by using fast routines of matrix multiplication and its applications*,
Numerical Algorithms 59 (2012).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .error_free import _slices, _two_sum

__all__ = ["two_sum", "two_prod", "dd_add", "dd_mul", "dd_mul_d", "dd_div", "dd_sqrt", "dd_exp",
           "EXP_REL_ERROR", "exact_products", "split_rows", "GrowingSplit", "PRODUCT_REL_ERROR", "dd_row_dots", "OP_REL_ERROR"]

#: A bound on the relative error of one double-double multiplication, division or square
#: root, and of an addition relative to its operands' magnitudes (Hida, Li and Bailey's
#: algorithms: 2 to 4 u^2, with room).
OP_REL_ERROR = 8.0 * 2.0 ** -106

two_sum = _two_sum

#: 2^27 + 1, Dekker's splitting constant.
_SPLIT = 134217729.0
#: ln 2 as a sum of three float64 (the third for the reduction of arguments near -700).
_LN2_HI = 0.6931471805599453
_LN2_LO = 2.3190468138462996e-17
_LN2_LOLO = 5.707708438416212e-34
#: The exponential's argument is divided by 2^_SQUARINGS before its Taylor series.
_SQUARINGS = 10
_TAYLOR = 10


def _dd_const(q: Fraction) -> tuple[float, float]:
    hi = float(q)
    return hi, float(q - Fraction(hi))


#: 1/n! for n = 2..._TAYLOR, as double-doubles (exact rationals rounded twice).
_INV_FACT = [_dd_const(Fraction(1, math.factorial(n))) for n in range(_TAYLOR + 1)]

#: A bound on the relative error of :func:`dd_exp` (for arguments at most 0 and results above
#: 1e-290): the Taylor remainder (below 1e-40), about 40 double-double operations of
#: relative error at most 4 u^2 each in the series and the ten doublings, whose relative
#: error the doublings keep (``d(2e + e^2) = (2 + 2e) de`` on ``2e + e^2``), and the
#: reduction by ``k ln 2`` (``|k| <= 1000``, ln 2 to 1e-50 in three parts, the reduced
#: argument to ``2 u^2`` of ``|t|``: 1.7e-29 absolute at ``t = -700``, that much relative in
#: ``exp(t)``); 2^-94 = 5e-29 is above their sum. Checked against 60-digit arithmetic in
#: the tests.
EXP_REL_ERROR = 2.0 ** -94
#: A bound on ``|hi + lo - A B|`` of :func:`exact_products` relative to ``|A| |B|``
#: entrywise (what its slices leave out: their remainders below 2^-101 of each row's largest
#: entry, the products of order above the slices' count times ``beta`` bits; and the
#: two-sums), for inner dimensions up to 10^5.
PRODUCT_REL_ERROR = 2.0 ** -100


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = _SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def fast_two_sum(a, b):
    """``a + b = s + e`` exactly where ``|a| >= |b|`` (Dekker): ``e = b - (s - a)``, in place
    on arrays."""
    s = a + b
    if np.ndim(s) == 0:
        return s, b - (s - a)
    e = s - a
    np.subtract(b, e, out=e)
    return s, e


def two_prod(a, b):
    """``a b = p + e`` exactly (Dekker; no overflow in ``2^27 a``, no underflow)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def dd_add(ah, al, bh, bl):
    """``(ah + al) + (bh + bl)`` (the accurate addition: relative error about ``2 u^2`` of the
    operands' magnitudes, even under cancellation)."""
    s1, s2 = two_sum(ah, bh)
    t1, t2 = two_sum(al, bl)
    s2 = s2 + t1
    s1, s2 = fast_two_sum(s1, s2)
    s2 = s2 + t2
    return fast_two_sum(s1, s2)


def dd_mul(ah, al, bh, bl):
    """``(ah + al)(bh + bl)`` (relative error about ``4 u^2``)."""
    p, e = two_prod(ah, bh)
    e = e + (ah * bl + al * bh)
    return fast_two_sum(p, e)


def dd_mul_d(ah, al, b):
    """``(ah + al) b`` for a float64 ``b``."""
    p, e = two_prod(ah, b)
    e = e + al * b
    return fast_two_sum(p, e)


def dd_div(ah, al, bh, bl):
    """``(ah + al) / (bh + bl)``: ``q1 = ah / bh``, the remainder ``a - q1 b`` in
    double-double, ``q2`` its quotient by ``bh``."""
    q1 = ah / bh
    ph, pl = dd_mul_d(bh, bl, q1)
    rh, rl = dd_add(ah, al, -ph, -pl)
    q2 = (rh + rl) / bh
    return fast_two_sum(q1, q2)


def dd_sqrt(ah, al):
    """``sqrt(ah + al)`` for non-negative arguments: ``s = sqrt(ah)`` corrected by
    ``(a - s^2) / (2 s)`` (0 where ``ah`` is 0)."""
    s = np.sqrt(np.maximum(ah, 0.0))
    ph, pl = two_prod(s, s)
    rh, rl = dd_add(ah, al, -ph, -pl)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(s > 0, (rh + rl) / (2.0 * s), 0.0)
    return fast_two_sum(s, e)


def dd_exp(th: np.ndarray, tl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``exp(th + tl)`` as a double-double, for arguments at most 0 (kernel values): within
    :data:`EXP_REL_ERROR` of itself, or 0 where ``th < -667`` (absolute error 2.3e-290).

    ``t = k ln 2 + r`` (``k = round(t / ln 2)``, ``k ln 2`` from ln 2 in three parts by
    ``two_prod``), ``expm1(r / 2^10)`` by its Taylor series to order 10 (Horner, without
    the leading 1, whose subtraction would cancel 12 bits), then
    ten doublings ``expm1(2x) = 2 expm1(x) + expm1(x)^2``, and ``exp(t) = 2^k (1 + expm1(r))``.
    """
    th = np.asarray(th, dtype=np.float64)
    tl = np.asarray(tl, dtype=np.float64)
    tiny = th < -667.0  # exp below 2.3e-290: 0, within the absolute allowance
    k = np.rint(np.where(tiny, 0.0, th) / _LN2_HI)
    ph, pl = two_prod(k, np.full_like(k, _LN2_HI))
    qh, ql = two_prod(k, np.full_like(k, _LN2_LO))
    ph, pl = dd_add(ph, pl, qh, ql + k * _LN2_LOLO)  # k ln 2 to about 1e-45 |k|
    rh, rl = dd_add(np.where(tiny, 0.0, th), np.where(tiny, 0.0, tl), -ph, -pl)
    scale = 2.0 ** -_SQUARINGS
    rh, rl = rh * scale, rl * scale  # exact
    # Horner, without the leading 1: expm1(r) = r (1 + r (1/2 + r (1/6 + ...)))
    eh = np.full_like(rh, _INV_FACT[_TAYLOR][0])
    el = np.full_like(rh, _INV_FACT[_TAYLOR][1])
    for n in range(_TAYLOR - 1, 0, -1):
        eh, el = dd_mul(eh, el, rh, rl)
        eh, el = dd_add(eh, el, np.full_like(rh, _INV_FACT[n][0]), np.full_like(rh, _INV_FACT[n][1]))
    eh, el = dd_mul(eh, el, rh, rl)  # expm1(r / 2^10)
    for _ in range(_SQUARINGS):
        sh, sl = dd_mul(eh, el, eh, el)
        eh, el = dd_add(2.0 * eh, 2.0 * el, sh, sl)
    eh, el = dd_add(eh, el, np.ones_like(eh), np.zeros_like(eh))
    eh, el = np.ldexp(eh, k.astype(np.int64)), np.ldexp(el, k.astype(np.int64))
    return np.where(tiny, 0.0, eh), np.where(tiny, 0.0, el)


def _plan(inner: int) -> tuple[int, int]:
    """``(beta, slices)`` for an inner dimension: bits per slice such that a product of two
    slices summed over ``inner`` terms is exact, and enough slices for 100 bits."""
    beta = (51 - max(1, math.ceil(math.log2(max(inner, 2))))) // 2
    return beta, -(-100 // beta)


def split_rows(A: np.ndarray, inner: int):
    """The row slices of A for :func:`exact_products` with inner dimension ``inner`` (to
    reuse when A multiplies many right-hand sides)."""
    beta, slices = _plan(inner)
    return _slices(np.ascontiguousarray(A, dtype=np.float64), slices, beta)


def _grid(mu: np.ndarray) -> np.ndarray:
    """:func:`~ooc_spectral.core.error_free.row_grid` from the rows' largest magnitudes."""
    return np.frexp(np.where(mu > 0, mu, 1.0))[1].astype(np.float64)


class GrowingSplit:
    """:func:`split_rows` of a square matrix that grows by trailing rows and columns, its
    leading block unchanged (the double-double factor, or its transpose): rows whose grid
    the new columns leave unchanged keep their slices and slice only the new entries (the
    slicing is entrywise once a row's grid is fixed); the other rows and the new ones are
    sliced whole. The same slices as :func:`split_rows` of the whole matrix, for the cost
    of the new entries. ``lower``: the matrix is lower triangular, so that its leading
    rows' slices are also those of a leading block (views of a smaller size)."""

    def __init__(self, lower: bool):
        self.lower = lower
        self.n, self.plan = 0, None
        self.S: list[np.ndarray] = []
        self.R = np.zeros((0, 0))
        self.mu = np.zeros(0)

    def of(self, A: np.ndarray):
        """The slices of A (n x n, its leading block the matrix of the previous call)."""
        n = A.shape[0]
        plan = _plan(n)
        if plan == self.plan and (n == self.n or (n < self.n and self.lower)):
            return [S[:n, :n] for S in self.S], self.R[:n, :n]
        beta, count = plan
        k = self.n if plan == self.plan and n > self.n else 0
        if k == 0 or n > self.R.shape[0]:  # new storage, by doubling
            cap = max(n, 2 * self.R.shape[0], 16)
            S, R, mu = [np.zeros((cap, cap)) for _ in range(count)], np.zeros((cap, cap)), np.zeros(cap)
            for new, old in zip(S + [R], self.S + [self.R]):
                new[:k, :k] = old[:k, :k]
            mu[:k] = self.mu[:k]
            self.S, self.R, self.mu = S, R, mu
        redo = np.arange(k, n)
        if k:  # the old rows' new columns, on their grid where it stays
            block = A[:k, k:n]
            mu_new = np.maximum(self.mu[:k], np.max(np.abs(block), axis=1))
            tau_old, tau_new = _grid(self.mu[:k]), _grid(mu_new)
            keep = np.flatnonzero(tau_old == tau_new)
            parts, rest = _slices(block[keep], count, beta, tau_old[keep])
            for S, part in zip(self.S, parts):
                S[keep, k:n] = part
            self.R[keep, k:n] = rest
            self.mu[:k] = mu_new
            redo = np.r_[np.flatnonzero(tau_old != tau_new), redo]
        rows = A[redo, :n]
        parts, rest = _slices(rows, count, beta)
        for S, part in zip(self.S, parts):
            S[redo, :n] = part
        self.R[redo, :n] = rest
        self.mu[k:n] = np.max(np.abs(A[k:n, :n]), axis=1) if n > k else 0.0
        self.n, self.plan = n, plan
        return [S[:n, :n] for S in self.S], self.R[:n, :n]


def exact_products(A: np.ndarray, B: np.ndarray, split_a=None,
                   split_b=None) -> tuple[np.ndarray, np.ndarray]:
    """``A B`` as a double-double ``hi + lo`` with ``|hi + lo - A B| <= PRODUCT_REL_ERROR
    |A| |B|`` (entrywise): the rows of A and the columns of B split into parts of
    ``beta`` bits (about 21), enough of them for 100 bits, on each row's (column's) own
    grid (:func:`~ooc_spectral.core.error_free._slices`), so that every product of two
    parts is exact in float64 whatever order BLAS sums it in; the products of orders up to
    the parts' count are added by two-sum. ``split_a``: A's parts
    (:func:`split_rows`), where already made; ``split_b``: B's, those of ``B'``'s rows."""
    A = np.ascontiguousarray(A, dtype=np.float64)
    B = np.ascontiguousarray(B, dtype=np.float64)
    m = A.shape[1]
    if A.size == 0 or B.size == 0 or m == 0:
        z = np.zeros((A.shape[0], B.shape[1]))
        return z, z.copy()
    beta, slices = _plan(m)
    SA, RA = split_a if split_a is not None else _slices(A, slices, beta)
    SB, RB = split_b if split_b is not None else _slices(np.ascontiguousarray(B.T), slices, beta)
    if B.shape[1] <= A.shape[0]:
        hi, lo = _slice_products(SA, SB, slices)
    else:  # (A B)' = B' A': the narrow side's slices stacked
        hi, lo = (x.T for x in _slice_products(SB, SA, slices))
    lo += RA @ B + (A - RA) @ RB.T
    return fast_two_sum(hi, lo)


def _slice_products(SA, SB, slices: int):
    """``sum SA[p] SB[q]'`` over the orders ``p + q < slices`` added by two-sums into
    ``hi``, the order ``slices`` in float64 into ``lo`` (its own rounding far below
    ``u^2 |A||B|``); higher orders are left out (within PRODUCT_REL_ERROR). SB, the narrow
    side (n rows), stacked: one ``gemm`` per slice of SA, each entry of each product exact
    in float64 whatever order BLAS sums it in."""
    n = SB[0].shape[0]
    stacked = np.ascontiguousarray(np.concatenate(SB).T)  # m x (slices n), C-ordered for gemm
    hi = np.zeros((SA[0].shape[0], n))
    lo = np.zeros_like(hi)
    for p in range(slices):
        top = slices - p + (1 if p else 0)  # the orders below `slices`, and `slices` itself
        P = SA[p] @ stacked[:, :top * n]
        for q in range(slices - p):
            hi, e = two_sum(hi, P[:, q * n:(q + 1) * n])
            lo += e
        if p:
            lo += P[:, (slices - p) * n:(slices - p + 1) * n]
    return hi, lo


def dd_row_dots(ah, al, bh, bl) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise ``sum_j a_ij b_ij`` of two double-double (c x m) arrays, as a double-double
    per row: the products in double-double, summed by a pairwise tree of double-double
    additions (relative error at most ``(1 + log2 m) OP_REL_ERROR`` of ``sum |a||b|``)."""
    ph, pl = dd_mul(np.asarray(ah, dtype=np.float64), np.asarray(al, dtype=np.float64),
                    np.asarray(bh, dtype=np.float64), np.asarray(bl, dtype=np.float64))
    ph, pl = np.atleast_2d(ph), np.atleast_2d(pl)
    while ph.shape[1] > 1:
        if ph.shape[1] % 2:
            ph = np.concatenate([ph, np.zeros((ph.shape[0], 1))], axis=1)
            pl = np.concatenate([pl, np.zeros((pl.shape[0], 1))], axis=1)
        ph, pl = dd_add(ph[:, 0::2], pl[:, 0::2], ph[:, 1::2], pl[:, 1::2])
    if ph.shape[1] == 0:
        return np.zeros(ph.shape[0]), np.zeros(ph.shape[0])
    return ph[:, 0], pl[:, 0]
