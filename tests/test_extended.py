"""Certified all the way down, PCA near the truth, the exact path where it is at hand
(issue 53 items 1-3 and 5; issue 51 item 5).

Every answer here is checked against arithmetic that does not share the library's: 40- to
80-digit mpmath, the full Gram matrix. Small data, so
that each test is cheap; the grid of offsets, kernels and tols is
``workflows/bench/certificate_grid.py``'s.
"""

from __future__ import annotations

import math
import warnings

import mpmath
import numpy as np
import pytest
from sklearn.datasets import load_wine, make_moons, make_s_curve
from sklearn.preprocessing import StandardScaler

from extended_precision import exact_residuals, precise_residuals
from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.exceptions import DictionarySizeError, DictionaryWarning

U = 2.0 ** -53


# --------------------------------------------------------------------------- #
# double-double arithmetic (core/double_double.py), against 60-digit mpmath
# --------------------------------------------------------------------------- #
def _mp(h, l):
    return mpmath.mpf(float(h)) + mpmath.mpf(float(l))


def test_double_double_exp_and_its_stated_error():
    """exp of arguments down to -667 within 2^-94 (5e-29) of itself, the constant itself
    pinned (the certificate's entry error takes it), and below -667 zero."""
    from ooc_spectral.core.double_double import EXP_REL_ERROR, dd_exp

    assert EXP_REL_ERROR == 2.0 ** -94
    mpmath.mp.dps = 60
    rng = np.random.default_rng(0)
    t = -np.concatenate([rng.uniform(0, 1, 60), rng.uniform(0, 60, 60), rng.uniform(0, 667, 60)])
    tl = t * rng.uniform(-1, 1, t.size) * 1e-17
    h, l = dd_exp(t, tl)
    worst = max(abs(_mp(x, y) / mpmath.exp(_mp(a, b)) - 1) for a, b, x, y in zip(t, tl, h, l))
    assert worst <= EXP_REL_ERROR
    assert worst <= 1e-28
    h, l = dd_exp(np.array([-668.0]), np.zeros(1))
    assert h[0] == 0.0 and l[0] == 0.0


def test_exact_products_within_their_stated_error():
    from ooc_spectral.core.double_double import PRODUCT_REL_ERROR, exact_products

    assert PRODUCT_REL_ERROR == 2.0 ** -100
    mpmath.mp.dps = 60
    rng = np.random.default_rng(1)
    for m in (2, 300, 2500):
        A = rng.normal(size=(2, m)) * np.exp(rng.uniform(-20, 20, (2, m)))
        B = rng.normal(size=(m, 2))
        H, L = exact_products(A, B)
        for i in range(2):
            for j in range(2):
                exact = mpmath.fsum(mpmath.mpf(A[i, k]) * mpmath.mpf(B[k, j]) for k in range(m))
                mag = float(np.abs(A[i]) @ np.abs(B[:, j]))
                assert abs(_mp(H[i, j], L[i, j]) - exact) <= PRODUCT_REL_ERROR * mag


@pytest.mark.parametrize("name", ["rbf", "laplacian"])
def test_double_double_kernel_values_within_eta(name):
    """Kernel values from exact differences within their stated eta, itself below 1e-28."""
    from ooc_spectral.core.extended import kernel_dd
    from ooc_spectral.core.kernels import LaplacianKernel, RBFKernel

    kernel = RBFKernel(3.0) if name == "rbf" else LaplacianKernel(0.7)
    X = make_moons(30, noise=0.05, random_state=0)[0] + 1e3  # far from the origin
    kh, kl, eta = kernel_dd(kernel, X[:6], X[6:])
    assert eta <= 1e-28
    mpmath.mp.dps = 60
    g = mpmath.mpf(kernel.gamma)
    for i in range(6):
        for j in range(24):
            d = [mpmath.mpf(X[i, t]) - mpmath.mpf(X[6 + j, t]) for t in range(2)]
            s = mpmath.fsum(v * v for v in d) if name == "rbf" else mpmath.fsum(abs(v) for v in d)
            assert abs(_mp(kh[i, j], kl[i, j]) - mpmath.exp(-g * s)) <= eta


# --------------------------------------------------------------------------- #
# the greedy path at tol 1e-12 (core/extended.py), against 40-digit references
# --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def greedy_1e12():
    """moons at the median gamma, tol 1e-12, the exact problem out of reach
    (max_dictionary_size below the rows): float64 decides no row near tol (it refused below
    5e-8 before issue 53); double-double does."""
    X = make_moons(200, noise=0.05, random_state=0)[0] + 1e3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = GreedySpectralEmbedding(n_components=3, tol=1e-12, random_state=0,
                                      max_dictionary_size=199).fit(X)
    return X, est


def test_tol_1e12_on_the_greedy_path_is_certified(greedy_1e12):
    from extended_precision import reference_eigenvalues

    X, est = greedy_1e12
    d = est.spectral_map_.dictionary
    assert d.L is not None and d.size < len(X)  # the greedy path
    assert est.max_residual_ <= 1e-12
    rows = np.r_[est.max_residual_row_, np.arange(0, len(X), 25)]
    exact = precise_residuals(d.kernel, X[rows], d.points)
    assert np.all(exact <= est.max_residual_)
    # the Gram matrix from differences in extended precision (1e3 from the origin, a
    # float64 kernel's own rounding is 1e-10)
    ref, allowance = reference_eigenvalues(d.kernel, X, 3)
    lo, hi = est.eigenvalue_interval_[:, 0], est.eigenvalue_interval_[:, 1]
    assert np.all(ref >= lo - allowance) and np.all(ref <= hi + allowance)
    np.testing.assert_allclose(est.eigenvalues_, ref, rtol=1e-9)


def test_double_double_bounds_are_near_the_truth(greedy_1e12):
    """The double-double bound of a row against the dictionary is the exact residual within
    1e-18 (float64's bound there was beyond tol itself), and never below it."""
    from ooc_spectral.core.extended import ExtendedGram

    X, est = greedy_1e12
    d = est.spectral_map_.dictionary
    rows = np.arange(0, len(X), 20)
    Z = d.solve(np.ascontiguousarray(d.kernel_block(X[rows], order="C")[0]))
    upper, lower = ExtendedGram(d.kernel).bounds(d.L, d.points, X[rows], Z)
    exact = precise_residuals(d.kernel, X[rows], d.points)
    assert np.all(exact <= upper)
    assert np.all(upper - exact <= 1e-18)
    assert np.all(lower <= exact + 1e-18)


# --------------------------------------------------------------------------- #
# PCA: the linear kernel's residuals from explicit features (core/explicit_features.py)
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("tol", [0.1, 1e-3, 1e-8, 1e-12, 0.0])
def test_standardised_wine_is_pca_at_every_tol(tol):
    """The linear kernel on standardised wine was refused at every tol ('the top eigenvalue
    837.6 exceeds sum k(x, x) = 2314'): the trace equals sum k(x, x) exactly for centred
    data, and the check had no room for the rows' own rounding. Now PCA, certified: every
    row in the span of 13 points, its exact residual 0 (80 digits), the bound below 1e-18."""
    from sklearn.decomposition import PCA

    X = StandardScaler().fit_transform(load_wine().data)
    est = GreedySpectralEmbedding(n_components=2, kernel="linear", tol=tol, random_state=0).fit(X)
    assert est.spectral_map_.dictionary.L is not None and est.dictionary_.shape[0] == 13
    assert est.max_residual_ <= 1e-18
    exact = exact_residuals(est.kernel_, X[::9], est.dictionary_)
    assert np.all(np.abs(exact) <= 1e-50)  # 0, to 80-digit arithmetic
    pca = PCA(2).fit(X)
    np.testing.assert_allclose(est.eigenvalues_, pca.explained_variance_ * (len(X) - 1),
                               rtol=1e-12)


def test_the_linear_kernel_bound_is_near_the_truth_where_residuals_are_not_zero():
    """Raw breast-cancer-like columns spanning six decades, and a tol that leaves
    residuals: the bound is at least the exact residual (80 digits) and at most 1e-6
    relative (plus 1e-20) above it, where the float64 bound was 6e5 times the truth."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 6)) * np.geomspace(1e3, 1e-3, 6)
    est = GreedySpectralEmbedding(n_components=2, kernel="linear", tol=1e-3, affine=False,
                                  random_state=0).fit(X)
    d = est.spectral_map_.dictionary
    assert d.size < 6  # the smallest directions are left out: residuals above 0
    from ooc_spectral.core.rounding import with_rounding
    from ooc_spectral.core.model import Dictionary

    d = with_rounding(d, target=est.tol_, cap=math.inf)
    K, kx = d.kernel_block(X, order="C")
    Z = d.solve(np.ascontiguousarray(K))
    sq = Dictionary.row_norms(Z)
    bounds, _, _, _ = d.rounding.certify(d, X, None, kx, sq, kx - sq,
                                         d.rounding.cheap_coefficients(Z), lambda r: Z[r])
    exact = exact_residuals(d.kernel, X, d.points)
    assert np.all(bounds >= exact)
    assert np.all(bounds <= exact * (1 + 1e-6) + 1e-20)
    assert np.any(exact > 1e-8)


# --------------------------------------------------------------------------- #
# the exact path where it is at hand (pipeline/exact.py)
# --------------------------------------------------------------------------- #
def test_the_exact_paths_size_follows_the_memory():
    """A quarter of the memory for four n x n float64 matrices, and at most
    max_dictionary_size rows (the exact path holds every row as a dictionary point)."""
    from types import SimpleNamespace

    from ooc_spectral.pipeline.exact import exact_at_hand, exact_max_rows

    assert exact_max_rows(2 ** 30) == math.isqrt(2 ** 30 // 4 // 32) == 2896
    assert exact_max_rows(24 * 2 ** 30) == 14188
    c = SimpleNamespace(dictionary_size=None, dictionary_selection="greedy",
                        max_dictionary_size=5000)
    assert exact_at_hand(c, 2896, memory=2 ** 30)
    assert not exact_at_hand(c, 2897, memory=2 ** 30)
    assert not exact_at_hand(SimpleNamespace(**{**vars(c), "max_dictionary_size": 2000}), 2001,
                             memory=2 ** 30)
    assert not exact_at_hand(SimpleNamespace(**{**vars(c), "dictionary_size": 50}), 100,
                             memory=2 ** 30)


def test_a_tol_float64_cannot_certify_is_solved_exactly_where_at_hand():
    """The S-curve at tol 1e-12 (dictionary of more than 200 points, factor of condition
    1e9): 300 rows fit, so kernel PCA is solved on the full Gram matrix, and said so."""
    from sklearn.decomposition import KernelPCA

    X = make_s_curve(300, random_state=0)[0]
    with pytest.warns(DictionaryWarning, match="solved exactly on the 300 x 300"):
        est = GreedySpectralEmbedding(n_components=4, gamma=5.0, tol=1e-12, random_state=0).fit(X)
    assert est.max_residual_ == 0.0 and est.spectral_map_.dictionary.L is None
    ref = KernelPCA(4, kernel="rbf", gamma=5.0, eigen_solver="dense").fit(X).eigenvalues_
    lo, hi = est.eigenvalue_interval_[:, 0], est.eigenvalue_interval_[:, 1]
    assert np.all(ref >= lo) and np.all(ref <= hi)


def test_a_divisive_dictionary_heading_for_every_row_switches_to_the_exact_solve():
    """The divisive fit of 1,000 rows at a gamma under which no row is near another took
    every row one point at a time (digits standardised: 1,797 rows, 30-112 s); on 1,000 rows
    its 283rd point stops it (``sqrt(80 n)``, before the rows 240 to 320 are through: the
    exact problem is the cheaper one), and the spectral embedding of the full Gram matrix
    (Ng, Jordan & Weiss) is the answer."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(1000, 20))
    with pytest.warns(DictionaryWarning, match=r"283 of the 1000 rows .*solved exactly on the "
                                               r"1000 x 1000 Gram matrix"):
        est = GreedySpectralEmbedding(n_components=3, gamma=0.5, normalization="divisive",
                                      random_state=0).fit(X)
    K = np.exp(-0.5 * ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1))
    deg = K.sum(axis=1)
    S = K / np.sqrt(np.outer(deg, deg))
    vals = np.linalg.eigvalsh(S)[::-1]
    np.testing.assert_allclose(est.eigenvalues_, vals[1:4], rtol=1e-12)
    # unit eigenvectors of D^-1/2 K D^-1/2 (their eigenvalues are close: the vectors
    # themselves are ill-determined, their equation is not)
    V, lam = est.embedding_, est.eigenvalues_
    assert np.abs(S @ V - V * lam).max() <= 1e-12
    np.testing.assert_allclose(V.T @ V, np.eye(3), atol=1e-12)


def test_a_dictionary_heading_for_every_row_where_the_exact_problem_is_not_at_hand_stops_early():
    """More rows than max_dictionary_size and every row entering: the scan stops early,
    naming the way out, instead of growing to the cap one point at a time. The cap is what
    keeps the exact problem here, so a float64 scan of the first 640 rows tells it, before
    any double-double work (as elsewhere:
    tests/test_advice.py::test_a_dictionary_heading_for_every_row_gets_one_checked_way_out)."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(3000, 20))
    # the message's count is the proof that it stopped at row 640, not after 2000 points
    with pytest.raises(DictionarySizeError, match=r"took 76 of the 80 rows 560 to 640.*stopped "
                                                  r"early.*raise max_dictionary_size to 3000"):
        GreedySpectralEmbedding(gamma=5.0, max_dictionary_size=2000, random_state=0).fit(X)


def test_a_dictionary_that_settles_below_the_cap_is_not_refused_as_heading_for_every_row():
    """A 2,000-row swiss roll at gamma 0.12 with max_dictionary_size=1000: its dictionary
    settles at 866 points, below the cap, but took 76 of the rows 240 to 320, and the early
    refusal (where only the cap keeps the exact problem) said it heads for every row (an
    audit: 14,000 rows at gamma 0.12 too). The refusal now reads the rows 560 to 640, and
    the fit is the certified greedy one."""
    rng = np.random.default_rng(0)
    t = 1.5 * np.pi * (1 + 2 * rng.random(2000))
    X = np.c_[t * np.cos(t), 21 * rng.random(2000), t * np.sin(t)]
    est = GreedySpectralEmbedding(2, gamma=0.12, max_dictionary_size=1000, random_state=0).fit(X)
    assert est.spectral_map_.dictionary.L is not None  # greedy, not the exact path
    assert est.spectral_map_.dictionary.size == 866
    assert est.max_residual_ <= 1e-3


def test_a_dictionary_that_slows_down_is_not_switched():
    """A swiss roll whose dictionary settles at a fifth of the rows: its first 320 rows enter
    at 94%, rows 240 to 320 at 84%: the early stop does not take it for a dictionary heading
    for every row. On 2,500 rows it grows past ``sqrt(80 n)`` = 448 points, where the exact
    problem costs less than the greedy one (:func:`~ooc_spectral.pipeline.exact.exact_limit`),
    and is solved exactly there, not at row 320."""
    from sklearn.datasets import make_swiss_roll

    X = make_swiss_roll(2500, random_state=0)[0]
    with pytest.warns(DictionaryWarning, match=r"448 of the 2500 rows .*cheaper one") as seen:
        est = GreedySpectralEmbedding(n_components=3, gamma=0.05, tol=1e-4, random_state=0).fit(X)
    assert not any("240 to 320" in str(w.message) for w in seen)
    assert est.spectral_map_.dictionary.L is None and est.dictionary_.shape[0] == len(X)


def test_bounds_of_rows_kept_between_calls_equal_those_from_scratch():
    """The scan bounds a row again each time a point enters; with its double-double
    coordinates kept (``remember``), only the new points' are solved for (block
    substitution). The bounds are those of the solve from scratch, down to residuals of
    1e-13 on a dictionary grown to 250 points, to a thousandth of their interval's width and
    two ulps (the two coordinates differ in their last double-double digits, 1e-24 at 250
    points, which the bound's ``|z - L'a|^2`` term sees in its last bit; and no row kept
    leaks into a gram that forgot them: the same again after ``forget_rows``)."""
    from ooc_spectral.core.extended import ExtendedGram
    from ooc_spectral.core.kernels import RBFKernel

    X = make_s_curve(300, random_state=0)[0]
    kernel = RBFKernel(gamma=0.5)
    P, R = X[:250], X[250:]
    kept, fresh = ExtendedGram(kernel), ExtendedGram(kernel)
    smallest = np.inf
    for m in list(range(10, 250, 40)) + [250]:
        L = kept.grow(P[:m]).factor(m)
        fresh.grow(P[:m])
        if m == 170:
            kept.forget_rows()
        up, low = kept.bounds(L, P, R, None, remember=True)
        up0, low0 = fresh.bounds(L, P, R, None)
        # within a thousandth of the interval's width and the rounding of the sums (2 ulps)
        slack = 1e-3 * (up0 - low0) + 2 * np.spacing(np.abs(up0))
        assert np.all(np.abs(up - up0) <= slack)
        assert np.all(np.abs(low - low0) <= slack)
        smallest = min(smallest, float(np.min(up0)))
    assert smallest < 1e-12
