"""The double-double factor grown point by point at the cost of the new entries (issue 53,
tol 1e-12 at most 10x the tol 1e-6 fit): the slices of a growing factor equal those made
from scratch, the one-point solve's stated residual bound holds against 60-digit
arithmetic, and a factor grown from the rows the scan kept is the factor grown from
scratch to its own double-double error. Small arrays: each test well under a second.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from sklearn.datasets import make_s_curve

from ooc_spectral.core.double_double import GrowingSplit, split_rows


def _factor(n: int, seed: int = 0) -> np.ndarray:
    X = np.random.default_rng(seed).normal(size=(n, 3))
    K = np.exp(-2.0 * np.square(X[:, None] - X[None]).sum(-1)) + 1e-9 * np.eye(n)
    return np.linalg.cholesky(K)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_growing_split_is_the_split_from_scratch(transposed):
    """Sizes one by one, across the plan's changes at 65 and 129 points (fewer bits per
    slice), jumps, and back to smaller sizes: every slice and the remainder bit for bit
    those of :func:`split_rows` of the whole matrix. The transposed factor's rows gain an
    entry at each size and some change grid (their largest entry grows): those are sliced
    again, the others only in the new column."""
    L = _factor(150)
    grid = GrowingSplit(lower=not transposed)
    regridded = 0
    for m in list(range(1, 70)) + [60, 71, 72, 128, 129, 131, 150, 50, 51]:
        A = L[:m, :m].T if transposed else L[:m, :m]
        before = grid.mu[:grid.n].copy()
        S, R = grid.of(A)
        S0, R0 = split_rows(np.ascontiguousarray(A), m)
        assert len(S) == len(S0)
        for a, b in zip(S, S0):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(R, R0)
        k = min(before.size, m)
        regridded += int(np.sum(np.frexp(np.maximum(before[:k], 1e-300))[1]
                                != np.frexp(np.maximum(grid.mu[:k], 1e-300))[1]))
    assert (regridded > 0) == transposed  # the path that re-slices a row is taken


def test_a_one_point_solve_bounds_its_residual():
    """``solve_dd`` on a 1 x 1 factor (the scan's block substitution for one new point): a
    division whose stated ``rho`` bounds ``|k - l z|`` computed in 60 digits."""
    from ooc_spectral.core.extended import solve_dd

    rng = np.random.default_rng(1)
    lh, ll = 3.7e-6, 1.1e-22
    Kh = rng.uniform(-1, 1, size=(7, 1))
    Kl = Kh * rng.uniform(-1, 1, size=(7, 1)) * 2.0 ** -54
    Zh, Zl, rho = solve_dd(np.array([[lh]]), np.array([[ll]]), Kh, Kl)
    mpmath.mp.dps = 60
    for i in range(7):
        k = mpmath.mpf(float(Kh[i, 0])) + mpmath.mpf(float(Kl[i, 0]))
        z = mpmath.mpf(float(Zh[i, 0])) + mpmath.mpf(float(Zl[i, 0]))
        r = abs(k - (mpmath.mpf(lh) + mpmath.mpf(ll)) * z)
        assert r <= rho[i]
        assert rho[i] < 1e-28 * abs(float(Kh[i, 0]))  # and it is a double-double's residual


def test_a_factor_grown_from_kept_rows_is_the_factor_from_scratch():
    """The scan bounds a row, then it enters: the factor's new row is the row's kept
    coordinates (block substitution), not a second solve. Grown one point at a time with
    every point first bounded (kept), against a factor grown from scratch: the same
    double-double factor to 1e-24, the same measured backward error to 1%, and a row's
    bounds against either within a thousandth of their width."""
    from ooc_spectral.core.extended import ExtendedGram
    from ooc_spectral.core.kernels import RBFKernel

    X = make_s_curve(120, random_state=0)[0]
    kernel = RBFKernel(gamma=0.5)
    kept, fresh = ExtendedGram(kernel), ExtendedGram(kernel)
    kept.grow(X[:20])
    fresh.grow(X[:20])
    for m in range(20, 60):
        L = kept.factor(m)
        kept.bounds(L, X, X[m:m + 3], None, remember=True)  # the next rows, kept
        kept.grow(X[:m + 1])
        fresh.grow(X[:m + 1])
    Lk, Lf = kept._L, fresh._L
    np.testing.assert_allclose(Lk[0][:60, :60] + Lk[1][:60, :60],
                               Lf[0][:60, :60] + Lf[1][:60, :60], rtol=0, atol=1e-24)
    assert kept.theta == pytest.approx(fresh.theta, rel=1e-2, abs=0)
    R = X[100:]
    up, low = kept.bounds(kept.factor(60), X, R, None)
    up0, low0 = fresh.bounds(fresh.factor(60), X, R, None)
    slack = 1e-3 * (up0 - low0) + 2 * np.spacing(np.abs(up0))
    assert np.all(np.abs(up - up0) <= slack) and np.all(np.abs(low - low0) <= slack)


def test_a_point_added_alone_carries_its_measured_backward_error():
    """A point added alone to the double-double factor takes its row's backward error from
    its coordinates' measured residual and its diagonal (no product of the whole factor):
    ``theta`` still bounds ``max |L L' - K|`` against the exact kernel (40 digits), and is
    that of the factor grown two points at a time (measured by exact products) to 10x:
    a factor of 30 points (smallest pivot 1e-2; theta is then about the kernel values' eta)."""
    from ooc_spectral.core.extended import ExtendedGram
    from ooc_spectral.core.kernels import RBFKernel

    X = make_s_curve(40, random_state=0)[0]
    one, two = ExtendedGram(RBFKernel(gamma=0.5)), ExtendedGram(RBFKernel(gamma=0.5))
    one.grow(X[:4])
    two.grow(X[:4])
    for m in range(4, 30):
        one.bounds(one.factor(m), X, X[m:m + 2], None, remember=True)  # kept, as the scan does
        one.grow(X[:m + 1])
        if m % 2 == 0:
            two.grow(X[:m + 2])
    assert two.theta / 10 <= one.theta <= 10 * two.theta
    mpmath.mp.dps = 40
    Lh, Ll = one._L[0][:30, :30], one._L[1][:30, :30]
    L = [[mpmath.mpf(float(Lh[i, j])) + mpmath.mpf(float(Ll[i, j])) for j in range(i + 1)]
         for i in range(30)]
    worst = mpmath.mpf(0)
    for i in range(30):
        for j in range(i + 1):
            d2 = sum((mpmath.mpf(float(a)) - mpmath.mpf(float(b))) ** 2 for a, b in zip(X[i], X[j]))
            gram = sum(L[i][k] * L[j][k] for k in range(j + 1))
            worst = max(worst, abs(gram - mpmath.exp(-mpmath.mpf(0.5) * d2)))
    assert worst <= one.theta
