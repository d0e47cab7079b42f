"""Property-based tests of the scan (hypothesis), with a fixed example budget.

On random small data sets, kernels, tolerances and block sizes:

- the blocked scan selects exactly the point-by-point scan's dictionary, also
  when local certificates rule rows out (a second test turns them on from two
  dictionary points);
- the factor stays positive definite and is the Cholesky factor of k(D, D);
- every row is within ``tol`` of the final dictionary's span, or in its linear
  span (a row whose pivot would vanish never enters: see ``PIVOT_FLOOR``);
- every dictionary point was beyond ``tol`` of the points selected before it.

Residuals are recomputed from scratch with dense linear algebra; the slack
``SLACK * k(x, x)`` is the rounding of that recomputation, not a tolerance on
the algorithm.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.linalg import solve_triangular

from ooc_spectral.core.kernels import LaplacianKernel, LinearKernel, PolynomialKernel, RBFKernel
from ooc_spectral.core.scan import local_certificate
from ooc_spectral.core.model import PIVOT_FLOOR
from ooc_spectral.core.scan.blocked import pointwise_scan, scan_rows
from ooc_spectral.core.scan.state import DictionaryState

SLACK = 1e-9

BUDGET = settings(max_examples=200, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def problems(draw):
    n = draw(st.integers(2, 60))
    d = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * draw(st.sampled_from([0.1, 1.0, 5.0]))
    if draw(st.booleans()):  # some exact duplicates
        k = draw(st.integers(1, n))
        X = np.concatenate([X, X[rng.integers(0, n, size=k)]])
        X = X[rng.permutation(len(X))]
    kind = draw(st.sampled_from(["rbf", "laplacian", "linear", "polynomial"]))
    gamma = draw(st.floats(1e-2, 10.0))
    kernel = {"rbf": RBFKernel(gamma), "laplacian": LaplacianKernel(gamma),
              "linear": LinearKernel(), "polynomial": PolynomialKernel(gamma / 10, 2, 1.0)}[kind]
    tol = 10 ** draw(st.floats(-6, 0))
    affine = draw(st.booleans())
    block = draw(st.sampled_from([1, 3, 16, 64]))
    return X, kernel, tol, affine, block


def residuals(kernel, D, X, affine):
    """(delta, dhat) of the rows of X against the dictionary rows D, from scratch."""
    L = np.linalg.cholesky(kernel(D))
    Z = solve_triangular(L, kernel(X, D).T, lower=True).T
    dhat = kernel.diag(X) - np.sum(Z * Z, axis=1)
    if not affine:
        return dhat, dhat
    w = solve_triangular(L, np.ones(len(D)), lower=True)
    alpha = 1 - Z @ w
    return dhat + alpha**2 / (w @ w), dhat


@BUDGET
@given(problems())
def test_scan_properties(problem):
    check_scan(problem)


@settings(BUDGET, max_examples=100)
@given(problems())
def test_scan_properties_with_local_certificates(problem):
    """The same, with local certificates from 2 dictionary points on (neighbourhoods of 3)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local_certificate, "LOCAL_MIN_SIZE", 2)
        mp.setattr(local_certificate, "LOCAL_SIZE", 3)
        check_scan(problem)


def check_scan(problem):
    X, kernel, tol, affine, block = problem
    rows = np.arange(len(X))
    st_ = DictionaryState(kernel, X.shape[1], affine)
    scan_rows(st_, X, rows, tol, block_rows=block)
    ref = pointwise_scan(kernel, X, rows, tol, affine=affine)
    # blocked = point by point
    np.testing.assert_array_equal(st_.indices, ref.indices)
    m = st_.size
    if m == 0:  # every row is within tol of the origin (not affine), or has k(x, x) = 0
        kx = kernel.diag(X)
        assert np.all((kx <= tol) & (not affine) | (kx <= PIVOT_FLOOR * 10))
        return
    D = st_.points
    scale = np.maximum(np.abs(kernel.diag(X)), 1.0)
    # positive definite factor of k(D, D)
    assert np.all(np.diag(st_.L) > 0) and np.all(np.isfinite(st_.L))
    np.testing.assert_allclose(st_.L @ st_.L.T, kernel(D), rtol=0,
                               atol=SLACK * np.abs(kernel(D)).max())
    # every row within tol, or (its pivot would vanish) in the linear span
    delta, dhat = residuals(kernel, D, X, affine)
    ok = (delta <= tol + SLACK * scale) | (dhat <= PIVOT_FLOOR * scale + SLACK * scale)
    assert ok.all(), (delta[~ok], dhat[~ok], tol)
    # every dictionary point was beyond tol of the ones before it
    for j in range(1, m):
        dj, _ = residuals(kernel, D[:j], D[j : j + 1], affine)
        assert dj[0] > tol - SLACK * max(1.0, abs(kernel.diag(D[j : j + 1])[0]))
