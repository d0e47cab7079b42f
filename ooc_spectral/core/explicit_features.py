"""Residuals of kernels whose feature map is explicit: PCA's certificate near the truth.

The linear kernel ``k(x, y) = (x - c).(y - c)`` (``c`` its centre, or 0) and the degree-1
polynomial kernel ``(gamma (x - c).(y - c) + coef0)`` (``MetricMDS``'s) have finite,
explicit feature maps: ``phi(x) = x - c``, and ``[sqrt(gamma) (x - c), sqrt(coef0)]``.
A row's squared distance to the span of the dictionary's features is then, for *any*
coefficient vector ``a``,

    r*(x) <= |phi(x) - sum_i a_i phi(d_i)|^2
           = gamma |(x - c) - P' a|^2 + coef0 (1 - sum_i a_i)^2,      P = D - c,

a sum of squares, computed without the cancellation of ``k(x, x) - |z|^2`` that the
general bound (:mod:`ooc_spectral.core.rounding`) must carry: that bound grows with the
square of the coefficients (``theta |a|_1^2``, the factor's backward error), which on
raw, badly scaled data (breast cancer's columns span six decades) put ``max_residual_``
at 5e-4 where the exact residuals were 7.5e-10, and at a small tol refused rows that are
exactly in the span (standardised data: every row once the dictionary holds d points).
Here the rounding is that of the sum of squares itself, about ``eps`` of the rows'
scale, whatever the factor's condition.

Rounding of the computed ``v = fl(fl(x - c) - fl(P' a))`` against the exact
``v* = (x - c) - (D - c)' a`` (every operation within ``u`` of its exact result, a sum of
m products within ``gamma_m`` of the sum of magnitudes; Higham, Thm 3.1)::

    |v - v*| <= w = gamma_{m+3} (|x - c| + |P|' |a|) + u |v|     (entrywise)

so ``|v*| <= |v| + |w|`` and ``r*`` is at most ``gamma (|v| + |w|)^2 + coef0 (|1 - s| + e)^2``
with ``s`` the computed sum of ``a`` and ``e = gamma_m sum |a_i|``; each computed norm is
inflated by its own rounding. The coefficients ``a`` come from the factor
(``L' a = z``), but any vector serves: a poor one gives a larger, still valid, bound.
"""

from __future__ import annotations

import math

import numpy as np

from .error_free import U, gamma, kernel_center

__all__ = ["explicit_features", "explicit_factor", "explicit_residual_bounds", "REFINE_STEPS"]

#: Refinements of the coefficients before the bound (:func:`explicit_residual_bounds`).
REFINE_STEPS = 2


def explicit_features(kernel) -> tuple[float, float] | None:
    """``(gamma, coef0)`` of a kernel whose feature map is ``[sqrt(gamma) (x - c),
    sqrt(coef0)]``: the linear kernel ``(1, 0)`` and the degree-1 polynomial kernel; None
    for any other."""
    from .kernels import LinearKernel, PolynomialKernel

    if type(kernel) is LinearKernel:
        return 1.0, 0.0
    if type(kernel) is PolynomialKernel and int(kernel.degree) == 1 and kernel.coef0 >= 0:
        return float(kernel.gamma), float(kernel.coef0)
    return None


def explicit_factor(kernel, points: np.ndarray) -> np.ndarray | None:
    """The Cholesky factor ``L`` (m x m, lower, positive diagonal) of the dictionary's Gram
    matrix ``M = Phi Phi'`` from its explicit features ``Phi`` (m x f, the rows
    ``[sqrt(gamma) (d - c), sqrt(coef0)]`` of :func:`explicit_features`), by Gram-Schmidt
    applied twice on the features, one point after the other: ``L' = R`` of ``Phi' = Q R``.

    The factor the scan grows from ``k(x, x) - |z|^2`` has its last pivots to about
    ``u k(x, x) / dhat`` relative (the cancellation), and the coordinates ``L^-1 k``
    inherit ``u cond(M)`` (a 400 x 2 PCA whose second point is nearly aligned with the
    first through the centre, ``cond(M) = 1.3e9``: eigenvalues 2e-8 off). Orthogonalised on
    the features, each pivot is a norm, within ``u |phi(d)|`` of itself (Higham, Thm 19.13,
    for Householder's; Gram-Schmidt twice matches it), so the coordinates lose only
    ``u cond(L) = u sqrt(cond(M))``. Row j depends on the first j + 1 points alone (a grown
    dictionary keeps its leading block bit for bit). None where the features are not
    independent (a pivot not positive, or more points than features) or not finite."""
    g, c0 = explicit_features(kernel)
    P = np.array(points, dtype=np.float64)
    center = kernel_center(kernel)
    if center is not None:
        P = P - np.asarray(center, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        F = np.sqrt(g) * P
        if c0 > 0:
            F = np.hstack([F, np.full((P.shape[0], 1), math.sqrt(c0))])
    m, f = F.shape
    if m > f or not np.all(np.isfinite(F)):
        return None
    Q = np.zeros((f, m))
    L = np.zeros((m, m))
    for j in range(m):
        a = F[j].copy()
        r = np.zeros(j)
        for _ in range(2):  # twice is enough (Giraud et al., 2005): Q orthonormal to u
            s = Q[:, :j].T @ a
            a -= Q[:, :j] @ s
            r += s
        pivot = float(np.linalg.norm(a))
        if not (pivot > 0 and math.isfinite(pivot)):
            return None
        L[j, :j], L[j, j] = r, pivot
        Q[:, j] = a / pivot
    return L


def explicit_residual_bounds(kernel, X: np.ndarray, points: np.ndarray, A: np.ndarray,
                             L: np.ndarray | None = None, steps: int = REFINE_STEPS,
                             inverse_norm: float | None = None):
    """Upper bounds of the exact squared feature-space distance of each row of X to the
    span of the dictionary ``points``, from the coefficient vectors ``A`` (m x c, one
    column per row of X): the module's bound. ``kernel`` must have
    :func:`explicit_features`.

    With the dictionary's factor ``L`` (``L L'`` its Gram matrix), the coefficients are
    first refined ``steps`` times by the normal equations of the least-squares problem in
    feature space, ``L L' da = Phi_D' f`` with ``f`` the feature-space residual: the
    coefficients the factor gives lose ``eps cond(L L')`` of their accuracy (raw data whose
    columns span decades), and the bound is only as close to the exact residual as the
    coefficients are to the best ones; any coefficients give a valid bound.

    With ``inverse_norm``, an upper bound of ``||L^-1||_2``, also lower estimates
    ``(|f| - |w| - inverse_norm |Phi_D' f|)^2``: the distance of ``phi(x)`` to the span is
    that of ``f``, at least ``|f|`` less ``f``'s own projection on the span,
    ``|L^-1 Phi_D' f|`` (with L for the exact factor: an estimate, for the scan's decision
    whether a row's pivot is resolved, not a bound the certificate uses). Returns
    ``(upper, lower)`` then."""
    from scipy.linalg import solve_triangular

    g, c0 = explicit_features(kernel)
    X = np.ascontiguousarray(X, dtype=np.float64)
    P = np.ascontiguousarray(points, dtype=np.float64)
    A = np.array(A, dtype=np.float64)
    m, d = P.shape
    if X.shape[0] == 0:
        return np.zeros(0) if inverse_norm is None else (np.zeros(0), np.zeros(0))
    center = kernel_center(kernel)
    if center is not None:
        center = np.asarray(center, dtype=np.float64)
        X, P = X - center, P - center

    def normal(A):  # the feature-space residual, and Phi_D' of it (m x c)
        V = X - A.T @ P
        off = 1.0 - A.sum(axis=0)
        return V, off, g * (P @ V.T) + (c0 * off if c0 > 0 else 0.0)

    for _ in range(steps if L is not None and m else 0):
        _, _, rhs = normal(A)
        step = solve_triangular(L, solve_triangular(L, rhs, lower=True, check_finite=False),
                                lower=True, trans="T", check_finite=False)
        if not np.all(np.isfinite(step)):
            break
        A += step
    V, off, rhs = normal(A)
    mag = np.abs(X) + np.abs(A.T) @ np.abs(P)
    W = (gamma(m + 3) * mag + U * np.abs(V)) * (1 + gamma(m + 2))
    with np.errstate(over="ignore", invalid="ignore"):
        grow = 1 + gamma(d + 4)
        vv = g * np.einsum("ij,ij->i", V, V)
        ww = g * np.einsum("ij,ij->i", W, W)
        if c0 > 0:  # the constant feature sqrt(coef0): (1 - sum a), within e of its value
            e = (gamma(m + 2) * np.abs(A).sum(axis=0) + U) * (1 + gamma(m + 2))
            vv = vv + c0 * off * off
            ww = ww + c0 * e * e
        f, w = np.sqrt(vv) * grow, np.sqrt(ww) * grow
        upper = (f + w) ** 2 * (1 + 8 * U)
        upper = np.where(np.isnan(upper), math.inf, upper)
        if inverse_norm is None:
            return upper
        inside = inverse_norm * np.sqrt(np.einsum("ij,ij->j", rhs, rhs)) * grow
        lower = np.maximum(f / grow - w - inside, 0.0) ** 2 * (1 - 8 * U)
    return upper, np.where(np.isnan(lower), 0.0, lower)
