"""The GIL-free triangular solve of pass 2 (:mod:`ooc_spectral._blas`)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import solve_triangular

from ooc_spectral._blas import gil_free_trsm, longest_gil_stall, solve_lower_transposed
from ooc_spectral.kernels import RBFKernel


def _factor(m, seed=0, jitter=1e-10):
    """The Cholesky factor of a Gaussian Gram matrix: ill-conditioned like the scan's."""
    rng = np.random.default_rng(seed)
    P = rng.standard_normal((m, 3))
    return np.linalg.cholesky(RBFKernel(gamma=0.5)(P) + jitter * np.eye(m)), rng


def test_the_capsule_is_found_on_this_scipy():
    assert gil_free_trsm() is not None


@pytest.mark.parametrize("c, m", [(1, 1), (1, 7), (5, 1), (257, 64), (2000, 301)])
def test_bitwise_equal_to_solve_triangular_and_in_place(c, m):
    L, rng = _factor(m)
    K = rng.standard_normal((c, m))
    ref = solve_triangular(L, K.T, lower=True, check_finite=False).T
    work = K.copy()
    got = solve_lower_transposed(L, work)
    assert got is work  # solved in place
    if c > 1:
        assert np.array_equal(got, ref)
    else:  # LAPACK solves one right-hand side with trsv, not trsm: the last bits differ
        np.testing.assert_allclose(got, ref, rtol=1e-13, atol=0)
    # and it solves the system: Z L' = K to rounding
    np.testing.assert_allclose(got @ L.T, K, rtol=0, atol=1e-9 * np.abs(K).max())


@pytest.mark.parametrize("layout", ["fortran", "slice", "readonly", "float32"])
def test_other_layouts_take_the_scipy_path_with_the_same_result(layout):
    L, rng = _factor(40)
    K = rng.standard_normal((300, 80))[:, :40].copy()
    ref = solve_triangular(L, K.T, lower=True, check_finite=False).T
    if layout == "fortran":
        arg = np.asfortranarray(K)
    elif layout == "slice":
        big = np.zeros((300, 90))
        big[:, 10:50] = K
        arg = big[:, 10:50]
    elif layout == "readonly":
        arg = K.copy()
        arg.flags.writeable = False
    else:
        arg = K.astype(np.float32)
        ref = solve_triangular(L, arg.astype(np.float64).T, lower=True, check_finite=False).T
    got = solve_lower_transposed(L, arg.copy() if layout == "readonly" else arg)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())


def test_another_thread_runs_during_the_solve():
    """A Python thread spinning beside the solve is never stalled for most of it
    (``solve_triangular`` stalls it for the whole call: ``gil_release.py``)."""
    L, rng = _factor(400, jitter=1e-6)
    K = rng.standard_normal((40_000, 400))
    duration, stall = longest_gil_stall(lambda: solve_lower_transposed(L, K))
    assert duration > 0.02
    assert stall < 0.5 * duration, (stall, duration)
