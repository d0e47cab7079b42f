"""Reference answers that do not share the library's arithmetic.

The certificate and the eigenvalue interval are checked against quantities computed
another way: kernel values from the rows' differences (never the expanded square the
library uses), in extended precision (``numpy.longdouble``, a 64-bit significand on
x86-64), and the residuals by a Cholesky factorization and triangular solves in that
precision (not the float64 factor the fit returns). Slow (no BLAS), so for the small
data sets of the tests.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

LD = np.longdouble
HAS_EXTENDED = np.finfo(LD).nmant >= 63


def _center(kernel):
    base = getattr(kernel, "base", None)
    c = getattr(base if base is not None else kernel, "center", None)
    return None if c is None else np.asarray(c, dtype=np.float64)


def kernel_matrix(kernel, X, Y) -> np.ndarray:
    """``k(X, Y)`` of the library's kernel object, in extended precision, from differences."""
    name = kernel.name
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    if name in ("rbf", "laplacian"):
        Xl, Yl = X.astype(LD), Y.astype(LD)
        acc = np.zeros((X.shape[0], Y.shape[0]), dtype=LD)
        for j in range(X.shape[1]):
            diff = Xl[:, j:j + 1] - Yl[None, :, j]
            acc += diff * diff if name == "rbf" else np.abs(diff)
        return np.exp(-LD(kernel.gamma) * acc)
    c = _center(kernel)
    Xl, Yl = X.astype(LD), Y.astype(LD)
    if c is not None:
        Xl, Yl = Xl - c.astype(LD), Yl - c.astype(LD)
    G = np.einsum("ik,jk->ij", Xl, Yl)
    if name == "linear":
        return G
    if name == "polynomial":
        return (LD(kernel.gamma) * G + LD(kernel.coef0)) ** int(kernel.degree)
    if name == "cosine":
        nx = np.sqrt(np.einsum("ik,ik->i", Xl, Xl))
        ny = np.sqrt(np.einsum("ik,ik->i", Yl, Yl))
        with np.errstate(divide="ignore", invalid="ignore"):
            K = G / nx[:, None] / ny[None, :]
        return np.where(np.isfinite(K), K, LD(0))
    raise ValueError(f"no extended-precision reference for kernel {name!r}")


def kernel_diag(kernel, X) -> np.ndarray:
    """``k(x, x)`` for every row, in extended precision."""
    X = np.asarray(X, dtype=np.float64)
    name = kernel.name
    if name in ("rbf", "laplacian"):
        return np.ones(len(X), dtype=LD)
    c = _center(kernel)
    Xl = X.astype(LD) if c is None else X.astype(LD) - c.astype(LD)
    sq = np.einsum("ik,ik->i", Xl, Xl)
    if name == "linear":
        return sq
    if name == "polynomial":
        return (LD(kernel.gamma) * sq + LD(kernel.coef0)) ** int(kernel.degree)
    if name == "cosine":
        return (sq > 0).astype(LD)
    raise ValueError(f"no extended-precision reference for kernel {name!r}")


def cholesky(M: np.ndarray) -> np.ndarray:
    M = np.array(M, dtype=LD)
    m = M.shape[0]
    L = np.zeros_like(M)
    for j in range(m):
        s = M[j, j] - L[j, :j] @ L[j, :j]
        if not s > 0:
            raise np.linalg.LinAlgError(f"the dictionary's Gram matrix is not positive definite "
                                        f"in extended precision at pivot {j} ({float(s):.3g})")
        L[j, j] = np.sqrt(s)
        if j + 1 < m:
            L[j + 1:, j] = (M[j + 1:, j] - L[j + 1:, :j] @ L[j, :j]) / L[j, j]
    return L


def forward(L: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``L^-1 B`` for lower-triangular L (m x m) and B (m x n), in extended precision.

    Computed on the transposes (n x m, rows contiguous): each step's dot products then
    run along memory, twice as fast as down B's columns (NumPy has no BLAS for
    ``longdouble``); the same sums in the same order."""
    L = np.asarray(L, dtype=LD)
    Bt = np.array(B, dtype=LD).T.copy()
    Xt = np.empty_like(Bt)
    for i in range(L.shape[0]):
        Xt[:, i] = (Bt[:, i] - Xt[:, :i] @ L[i, :i]) / L[i, i]
    return Xt.T


def true_residuals(kernel, X, D) -> np.ndarray:
    """Every row's squared feature-space distance to the span of the dictionary rows D
    (exact arithmetic up to about 1e-19 relative), as float64."""
    M = kernel_matrix(kernel, D, D)
    L = cholesky(M)
    Z = forward(L, kernel_matrix(kernel, D, X))
    return (kernel_diag(kernel, X) - np.sum(Z * Z, axis=0)).astype(np.float64)


def reference_eigenvalues(kernel, X, p: int) -> tuple[np.ndarray, float]:
    """The p largest eigenvalues of the exact centred Gram matrix and their rounding.

    The Gram matrix from differences in extended precision, rounded once to float64,
    centred and eigensolved by LAPACK (``eigh``). The allowance covers the one rounding
    of every entry (``n u max|K|`` in the 2-norm) and the eigensolver's backward error
    (``8 n u lambda_1``).
    """
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    K = kernel_matrix(kernel, X, X)
    mu = K.mean(axis=0)
    Kc = (K - mu[None, :] - mu[:, None] + mu.mean()).astype(np.float64)
    vals = np.linalg.eigvalsh(0.5 * (Kc + Kc.T))[::-1][:p]
    u = np.finfo(np.float64).eps / 2
    allowance = n * u * float(np.max(np.abs(Kc))) * 2 + 8 * n * u * float(vals[0])
    return vals, allowance


def exact_residuals(kernel, X, D, dps: int = 80) -> np.ndarray:
    """Every row's squared feature-space distance to the span of the dictionary rows D, for
    the kernels whose values are polynomials in the float64 rows: linear and polynomial
    (with their centre). ``k(x, x) - k' M^-1 k`` at ``dps`` digits (mpmath): every value of
    the rows and the kernel values exact (the products of 53-bit numbers and their sums over
    the features fit in 80 digits), the solve's rounding about ``1e-80`` times ``M``'s
    condition: the reference for bounds far below what extended precision resolves (a
    linear kernel's rows in the span: residual 0 to 1e-60). Pure Python: small m and a few
    hundred rows at most."""
    import mpmath

    name = kernel.name
    if name not in ("linear", "polynomial"):
        raise ValueError(f"no reference for kernel {name!r}")
    mpmath.mp.dps = dps
    c = _center(kernel)

    def rows(A):
        A = np.asarray(A, dtype=np.float64)
        cc = [mpmath.mpf(0)] * A.shape[1] if c is None else [mpmath.mpf(float(v)) for v in c]
        return [[mpmath.mpf(float(v)) - w for v, w in zip(r, cc)] for r in A]

    if name == "polynomial":
        g, c0, p = (mpmath.mpf(float(kernel.gamma)), mpmath.mpf(float(kernel.coef0)),
                    int(kernel.degree))

        def k(a, b):
            return (g * mpmath.fsum(x * y for x, y in zip(a, b)) + c0) ** p
    else:
        def k(a, b):
            return mpmath.fsum(x * y for x, y in zip(a, b))

    P, R = rows(D), rows(X)
    m = len(P)
    M = mpmath.matrix(m, m)
    for i in range(m):
        for j in range(i + 1):
            M[i, j] = M[j, i] = k(P[i], P[j])
    Lc = mpmath.cholesky(M)  # once: every row is one substitution
    out = []
    for r in R:
        z = _forward_mp(Lc, [k(p, r) for p in P])
        out.append(float(k(r, r) - mpmath.fsum(v * v for v in z)))
    return np.asarray(out)


def precise_residuals(kernel, X, D, dps: int = 40) -> np.ndarray:
    """The rows' squared distances to the span of D, to about ``dps`` decimal digits.

    Kernel values from the rows' exact decimal expansions at ``dps`` digits (mpmath); the
    Cholesky factor of the dictionary's Gram matrix and the substitutions in fixed point on
    Python integers (:func:`_fixed_cholesky`: every value an integer multiple of
    ``2**-FIXED_BITS``, about 1e-77, each operation rounded once at that resolution), far
    below the kernel values' own rounding. For the rows where long double cannot decide a
    bound (its own rounding, about 1e-19 times the factor's condition, is comparable to the
    gap); pure Python, so a few rows against dictionaries of a few hundred points."""
    import mpmath

    mpmath.mp.dps = dps
    name = kernel.name
    X = np.asarray(X, dtype=np.float64)
    D = np.asarray(D, dtype=np.float64)
    if name not in ("rbf", "laplacian"):
        raise ValueError(f"no mpmath reference for kernel {name!r}")
    g = mpmath.mpf(float(kernel.gamma))

    def k(a, b):
        if name == "rbf":
            s = mpmath.fsum((x - y) ** 2 for x, y in zip(a, b))
        else:
            s = mpmath.fsum(abs(x - y) for x, y in zip(a, b))
        return _fixed(mpmath.exp(-g * s))

    P = [[mpmath.mpf(float(v)) for v in row] for row in D]  # exact: a float is a binary fraction
    m = len(P)
    L = _fixed_cholesky([[k(P[i], P[j]) for j in range(i + 1)] for i in range(m)])
    one = 1 << FIXED_BITS
    out = []
    for x in X:
        x = [mpmath.mpf(float(v)) for v in x]
        z = _fixed_forward(L, [k(d, x) for d in P])
        # k(x, x) = 1 for both kernels; the sum of squares carries 2 * FIXED_BITS
        out.append(float(Fraction(one * one - sum(v * v for v in z), one * one)))
    return np.asarray(out)


#: The resolution of :func:`_fixed_cholesky`'s fixed point: ``2**-FIXED_BITS``.
FIXED_BITS = 256


def _fixed(v) -> int:
    """An mpmath number in [-1, 1] as the nearest integer multiple of ``2**-FIXED_BITS``."""
    import mpmath

    return int(mpmath.nint(mpmath.ldexp(v, FIXED_BITS)))


def _fixed_cholesky(M: list) -> list:
    """The lower Cholesky factor of a symmetric positive definite matrix with entries in
    [-1, 1] (the lower triangle as rows, fixed point :func:`_fixed`), in fixed point: row i
    of the factor as a list of ``i + 1`` integers. Exact integer products and sums; each
    division and square root rounds down once, at ``2**-FIXED_BITS``: a backward error of
    about ``m 2**-FIXED_BITS`` in every entry (every entry of the factor is at most 1 in
    magnitude, the diagonal of M being at most 1)."""
    from math import isqrt

    bits = FIXED_BITS
    L = []
    for i, row in enumerate(M):
        Li = []
        for j in range(i):
            Lj = L[j]  # map stops at Li's j entries: Lj's first j, not its diagonal
            Li.append(((row[j] << bits) - sum(map(int.__mul__, Li, Lj))) // Lj[j])
        s = (row[i] << bits) - sum(v * v for v in Li)
        if not s > 0:
            raise np.linalg.LinAlgError(f"the dictionary's Gram matrix is not positive definite "
                                        f"at {4 * bits // 13} digits at pivot {i}")
        Li.append(isqrt(s))
        L.append(Li)
    return L


def _fixed_forward(L: list, b: list) -> list:
    """``L^-1 b`` in the fixed point of :func:`_fixed_cholesky` (each entry rounded down once)."""
    z = []
    for i, Li in enumerate(L):
        z.append(((b[i] << FIXED_BITS) - sum(map(int.__mul__, Li, z))) // Li[i])
    return z


def _forward_mp(L, b):
    import mpmath

    n = L.rows
    z = [mpmath.mpf(0)] * n
    for i in range(n):
        z[i] = (b[i] - mpmath.fsum(L[i, j] * z[j] for j in range(i))) / L[i, i]
    return z
