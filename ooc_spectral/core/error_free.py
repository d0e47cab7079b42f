"""Error-free transformations on float64 BLAS, and the dictionary's Gram matrix accurately.

The rounding bounds (:mod:`ooc_spectral.core.rounding`) need two matrices without the
rounding they bound: the product ``L L'`` of the factor, formed exactly by the splitting of
Ozaki, Ogita, Oishi and Rump on top of BLAS (:func:`exact_gram`), and the exact Gram
matrix of the dictionary's float64 rows, from differences in extended precision
(:func:`accurate_gram`). Pure NumPy on small arrays.

References
----------
N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002.
K. Ozaki, T. Ogita, S. Oishi and S. M. Rump, *Error-free transformations of matrix
multiplication by using fast routines of matrix multiplication and its
applications*, Numerical Algorithms 59 (2012).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["U", "gamma", "EXTENDED", "exact_gram", "kernel_center", "accurate_gram"]

#: Unit roundoff of float64 (half the machine epsilon).
U = float(np.finfo(np.float64).eps) / 2

#: The extended-precision type where it has at least a 64-bit significand (x87's
#: 80-bit format on x86-64, IEEE quad on aarch64 Linux), else None (where
#: ``long double`` is float64: Windows, macOS on ARM); :func:`accurate_gram` then
#: works in compensated float64 with a larger, stated error.
EXTENDED = np.longdouble if np.finfo(np.longdouble).nmant >= 63 else None


def gamma(n: float) -> float:
    """``gamma_n = n u / (1 - n u)``: the relative error bound of n roundings (Higham 3.1)."""
    nu = float(n) * U
    if nu >= 1.0:
        return math.inf
    return nu / (1.0 - nu)


# --------------------------------------------------------------------------- #
# L L' without rounding
# --------------------------------------------------------------------------- #
def _slice_bits(m: int) -> int:
    """Bits per slice so that any product of two slices summed over m terms is exact:
    each entry of a slice has at most ``beta + 1`` significant bits on its row's grid, a
    product at most ``2 beta + 2``, a sum of m of them at most ``2 beta + 2 + log2 m``."""
    return (51 - max(1, math.ceil(math.log2(max(m, 2))))) // 2


def row_grid(A: np.ndarray) -> np.ndarray:
    """The exponents ``tau_i`` of :func:`_slices`: ``max_j |A_ij| < 2^tau_i`` (1 for a zero row)."""
    mu = np.max(np.abs(A), axis=1) if A.shape[1] else np.zeros(A.shape[0])
    _, tau = np.frexp(np.where(mu > 0, mu, 1.0))
    return tau.astype(np.float64)


def _slices(A: np.ndarray, count: int, beta: int,
            tau: np.ndarray | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """``A = S_1 + ... + S_count + R`` row by row, without rounding.

    Row i of ``S_p`` holds multiples of ``2^(tau_i - p beta)`` with ``|A_ij| <= 2^tau_i``;
    ``|R_ij| <= 2^(tau_i - count beta - 1)``. Each slice is extracted with one addition and
    one subtraction of ``sigma = 0.75 * 2^(tau_i - p beta + 53)``, which round the
    remainder to that grid exactly (the two operands stay in sigma's binade). ``tau``: the
    rows' exponents (:func:`row_grid`) where already known (columns of a wider matrix).
    """
    tau = row_grid(A) if tau is None else tau
    R = np.array(A, dtype=np.float64, copy=True)
    out = []
    for p in range(1, count + 1):
        sigma = (0.75 * np.exp2(tau - p * beta + 53))[:, None]
        S = (R + sigma) - sigma
        R -= S  # exact: S is R rounded to a grid finer than R's own ulp allows
        out.append(S)
    return out, R


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a + b = s + e`` exactly (Knuth): ``e = (a - (s - bb)) + (b - bb)``, ``bb = s - a``,
    the same operations in the same order on arrays in place (three temporaries, not six:
    the double-double products spend most of their time here)."""
    s = a + b
    bb = s - a
    if np.ndim(s) == 0:
        return s, (a - (s - bb)) + (b - bb)
    e = s - bb
    np.subtract(a, e, out=e)
    np.subtract(b, bb, out=bb)
    e += bb
    return s, e


def exact_gram(L: np.ndarray, start: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """Rows ``start:`` of ``L L'`` as an unevaluated sum ``hi + lo``, and a bound on what
    it leaves out.

    The rows of L are split into four slices (:func:`_slices`) whose pairwise products
    are exact in float64 whatever order BLAS sums them in; the products of slice orders
    ``p + q <= 5`` are formed by ``gemm`` and added without rounding (two-sum), so
    ``|hi + lo - L L'| <= neglected`` entrywise, with ``neglected`` about
    ``m 2^(-4 beta)`` times the rows' largest entries (``beta`` about 20): below
    ``1e-21`` of ``max |L|^2`` for m up to 10^4.

    Returns
    -------
    hi, lo : ndarray of shape (m - start, m)
    neglected : float
    """
    L = np.ascontiguousarray(L, dtype=np.float64)
    m = L.shape[0]
    k = m - int(start)
    if m == 0 or k <= 0:
        return np.zeros((max(k, 0), m)), np.zeros((max(k, 0), m)), 0.0
    beta = _slice_bits(m)
    S, _ = _slices(L, 4, beta)
    hi = np.zeros((k, m))
    lo = np.zeros((k, m))
    # one gemm per slice of the rows start: against the slices it pairs with, stacked (each
    # entry exact whatever BLAS groups, so the same products as one gemm per pair), added
    # in the order p, then q
    stacked = np.ascontiguousarray(np.concatenate(S).T)  # m x 4m
    for p in range(4):
        n = 4 - p  # q with p + q <= 3 (from 0: the orders up to 5 above)
        P = S[p][start:] @ stacked[:, :n * m]
        for q in range(n):
            hi, e = _two_sum(hi, P[:, q * m:(q + 1) * m])
            lo += e
    mu = np.max(np.abs(L), axis=1)
    scale = float(np.max(mu)) ** 2 * 4.0  # 2^tau_i <= 2 mu_i
    neglected = m * scale * 32.0 * 2.0 ** (-4 * beta) + 16 * U * U * scale  # and the two-sums'
    return hi, lo, neglected


# --------------------------------------------------------------------------- #
# the dictionary's Gram matrix, accurately
# --------------------------------------------------------------------------- #
def kernel_center(kernel) -> np.ndarray | None:
    """The centre a kernel moves its rows by before evaluating (its base kernel's for a
    subset-normalized one), or None."""
    base = getattr(kernel, "base", None)
    return getattr(base if base is not None else kernel, "center", None)


def accurate_gram(kernel, P: np.ndarray, start: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """Rows ``start:`` of the exact Gram matrix ``M = k(P, P)`` of the float64 rows P, as
    ``hi + lo``, and a bound ``err`` on ``|hi + lo - M|`` (entrywise, absolute).

    Computed from the rows themselves (differences, not the expanded square of the fast
    path) in :data:`EXTENDED` precision where available (``err`` about ``1e-18`` of the
    entries), else in float64 (``err`` a few units of ``eps``). A kernel this module does
    not know (a user's callable) is taken as computed, with an assumed error of
    ``16 eps`` of its largest value: a user's function can only be trusted as far as it
    is accurate.
    """
    from .kernels import (CosineKernel, LaplacianKernel, LinearKernel, PolynomialKernel,
                          RBFKernel, SubsetNormalizedKernel)

    P = np.ascontiguousarray(P, dtype=np.float64)
    R = P[int(start):]
    m = P.shape[0]
    T = EXTENDED if EXTENDED is not None else np.float64
    ext = EXTENDED is not None
    rel = (P.shape[1] + 8.0) * float(np.finfo(T).eps)
    c = kernel_center(kernel)
    if isinstance(kernel, (RBFKernel, LaplacianKernel)):
        Pt, Rt = P.astype(T), R.astype(T)
        acc = np.zeros((R.shape[0], m), dtype=T)
        for j in range(P.shape[1]):
            diff = Rt[:, j:j + 1] - Pt[None, :, j]
            acc += diff * diff if isinstance(kernel, RBFKernel) else np.abs(diff)
        K = np.exp(-T(kernel.gamma) * acc)
        if not ext:  # float64 differences: each term within 3u, the sum within (d + 2) u
            d = P.shape[1]
            t_err = gamma(d + 3) / math.e  # k * t * relerr(t) <= relerr / e
            return K, np.zeros_like(K), float(t_err + 4 * U)
    elif isinstance(kernel, (LinearKernel, PolynomialKernel, CosineKernel)):
        Pt, Rt = P.astype(T), R.astype(T)
        if c is not None:
            Pt = Pt - np.asarray(c, dtype=np.float64).astype(T)
            Rt = Rt - np.asarray(c, dtype=np.float64).astype(T)
        G = Rt @ Pt.T if not ext or R.shape[0] * P.shape[1] * m <= 5e7 else _extended_products(Rt, Pt)
        dG = np.einsum("ik,ik->i", Rt, Rt)  # the rows' own squared norms
        if isinstance(kernel, LinearKernel):
            K = G
        elif isinstance(kernel, PolynomialKernel):
            p = int(kernel.degree)
            K = (T(kernel.gamma) * G + T(kernel.coef0)) ** p
            mag = (float(kernel.gamma) * float(np.max(np.einsum("ik,ik->i", Pt, Pt)))
                   + abs(float(kernel.coef0))) ** p
            rel *= (p + 2) * mag / max(float(np.max(np.abs(K))), 1e-300)
        else:
            nr, npn = np.sqrt(dG), np.sqrt(np.einsum("ik,ik->i", Pt, Pt))
            inv_r = np.where(nr > 0, 1 / np.where(nr > 0, nr, 1), 0)
            inv_p = np.where(npn > 0, 1 / np.where(npn > 0, npn, 1), 0)
            K = G * inv_r[:, None] * inv_p[None, :]
        if not ext:
            mag = np.abs(Pt).sum(axis=1)
            bound = gamma(P.shape[1] + 4) * float(np.max(mag)) ** 2
            if isinstance(kernel, LinearKernel):
                return K, np.zeros_like(K), bound
            return K, np.zeros_like(K), float(16 * U * np.max(np.abs(K)) + bound * 64)
    elif isinstance(kernel, SubsetNormalizedKernel):
        hi, lo, err = accurate_gram(kernel.base, P, start)
        deg = kernel.aux(P)[:, 1]  # the weights are part of this kernel's definition
        s = 1.0 / np.sqrt(deg)
        K = (hi + lo) * s[int(start):, None] * s[None, :]
        return K, np.zeros_like(K), float(err * np.max(s) ** 2 + 8 * U * np.max(np.abs(K)))
    else:
        K = np.asarray(kernel(R, P), dtype=np.float64)
        return K, np.zeros_like(K), float(16 * U * np.max(np.abs(K)) if K.size else 0.0)
    hi = K.astype(np.float64)
    lo = (K - hi.astype(T)).astype(np.float64)
    return hi, lo, float(rel * float(np.max(np.abs(hi)))) if m else 0.0


def _extended_products(Rt: np.ndarray, Pt: np.ndarray) -> np.ndarray:
    """``Rt Pt'`` for extended-precision rows, blockwise (NumPy's extended matmul has no
    BLAS; blocks keep its temporaries small)."""
    out = np.empty((Rt.shape[0], Pt.shape[0]), dtype=Pt.dtype)
    step = 256
    for a in range(0, Rt.shape[0], step):
        out[a:a + step] = np.einsum("ik,jk->ij", Rt[a:a + step], Pt)
    return out
