"""Every threshold and bound at its value, independently of the constant it tests (issue 53,
item 6: the faults an independent mutation audit injected and no test caught).

Each test asserts literal numbers the documented mathematics gives, not the module's
constant: a constant moved by 10x, a term dropped or an offset lost fails here. The
formulas are checked at the sizes where each of their terms is non-zero (a factor error
above 0, more than 64 points with some added since the last measurement).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.exceptions import DictionaryError, NumericalBreakdownError

U = 2.0 ** -53
EPS = 2.0 ** -52


def gamma_n(n):
    return n * U / (1 - n * U)


# --------------------------------------------------------------------------- #
# the scan's membership test (core/scan/certify.py)
# --------------------------------------------------------------------------- #
def test_resolved_is_a_quarter_of_tol():
    """A row not certified within tol enters when its rounding is at most a quarter of tol
    (its exact residual is then above tol / 2), and float64 cannot decide it past that."""
    from ooc_spectral.core.scan.certify import decide

    tol, floor = 1e-3, 1e-14
    assert decide(0.9e-3, 0.9e-3, floor, 0.24e-3, tol, 7) is True
    with pytest.raises(NumericalBreakdownError, match="row 7"):
        decide(0.9e-3, 0.9e-3, floor, 0.26e-3, tol, 7)


def test_an_entering_row_resolved_above_three_quarters_of_tol():
    from ooc_spectral.core.scan.certify import entered_resolved

    entered_resolved(1.1e-3, 0.34e-3, 1e-3, 3)  # 1.1 - 0.34 = 0.76 > 0.75
    with pytest.raises(NumericalBreakdownError):
        entered_resolved(1.1e-3, 0.36e-3, 1e-3, 3)  # 0.74 <= 0.75


def test_tol_zero_skips_a_row_certified_in_the_span_to_1e4_of_its_diagonal():
    """At tol 0 a row below the pivot floor is skipped when its certified residual is at
    most 1e-4 k(x, x), and undecidable past that."""
    from ooc_spectral.core.model import PIVOT_FLOOR
    from ooc_spectral.core.scan.certify import decide

    kx = 2.0
    floor = PIVOT_FLOOR * kx
    assert decide(0.0, 0.0, floor, 0.9e-4 * kx, 0.0, 5) is False
    with pytest.raises(NumericalBreakdownError, match="row 5"):
        decide(0.0, 0.0, floor, 1.1e-4 * kx, 0.0, 5)


# --------------------------------------------------------------------------- #
# the factor's conditioning (core/checks.py) and the kernel-space extension (pass2)
# --------------------------------------------------------------------------- #
def _diagonal_factor(cond):
    d = np.geomspace(1.0, 1.0 / cond, 6)
    return SimpleNamespace(size=6, L=np.diag(d))


def test_the_conditioning_limit_is_eps_cond_1e4():
    """eps cond_1(L) <= 1e-4 passes: cond 4.5e11 (1e-4 / eps) is the limit."""
    from ooc_spectral.core.checks import check_conditioning

    limit = 1e-4 / EPS  # 4.5e11
    check_conditioning(_diagonal_factor(0.9 * limit), 1e-6)
    with pytest.raises(NumericalBreakdownError, match="condition number"):
        check_conditioning(_diagonal_factor(1.1 * limit), 1e-6)


def test_the_kernel_space_extension_needs_eps_cond_squared_below_1e9():
    from ooc_spectral.core.pass2 import kernel_cross_is_accurate

    limit = math.sqrt(1e-9 / EPS)  # eps cond^2 = 1e-9 at cond 2.1e3
    assert kernel_cross_is_accurate(_diagonal_factor(0.95 * limit))
    assert not kernel_cross_is_accurate(_diagonal_factor(1.05 * limit))


# --------------------------------------------------------------------------- #
# the rounding bound's terms (core/rounding.py, core/scan/certify.py)
# --------------------------------------------------------------------------- #
def test_the_rbf_entry_error_is_its_formula():
    """``min(e^s (1 + 2u) - 1 + 2u, (8 g |x~|^2 + 2/e) c e^s + 2u)`` with
    ``s = g (|x~| (1 + 2u) + r)^2 c`` and ``c = 1.01 (2 dim + 8) u``."""
    from ooc_spectral.core.kernels import RBFKernel
    from ooc_spectral.core.rounding import entry_error

    k = RBFKernel(0.7)
    X = np.array([[3.0, 4.0, 0.0], [0.1, 0.0, 0.0], [30.0, 40.0, 0.0]])
    sq = np.einsum("ij,ij->i", X, X)
    radius = 2.5
    got = entry_error(k, X, sq, np.ones(3), radius)
    c = 1.01 * (2 * 3 + 8) * U
    xn = np.sqrt(sq) * (1 + 2 * U)
    s = 0.7 * (xn + radius) ** 2 * c
    direct = np.expm1(s) * (1 + 2 * U) + 2 * U
    weighted = (8 * 0.7 * sq + 2 / math.e) * c * np.exp(s) + 2 * U
    np.testing.assert_allclose(got, np.minimum(direct, weighted), rtol=1e-12)
    # the row near the origin takes the weighted form; abs=0: approx's default absolute
    # tolerance, 1e-12, would pass any value at this scale (1e-15)
    assert got[1] == pytest.approx((8 * 0.7 * 0.01 + 2 / math.e) * 14 * 1.01 * U + 2 * U,
                                   rel=1e-6, abs=0)


def test_the_scan_bound_counts_the_points_added_since_the_measurement():
    """Past 64 points the factor's backward error is measured on a grid; the points added
    since enter through their a-priori errors: ``theta_n (2 A - A_n) A_n``."""
    from ooc_spectral.core.kernels import RBFKernel
    from ooc_spectral.core.scan.certify import ScanRounding, measure_size

    assert [measure_size(s) for s in (64, 65, 67, 68, 72, 73)] == [64, 64, 64, 68, 72, 72]
    r = ScanRounding(RBFKernel(1.0))
    m = 80
    r.measured, r.theta_o, r.ell = 72, 2e-15, 1.3
    r.apriori = np.r_[np.full(72, 1e-16), 5e-14, 7e-14, np.full(6, 1e-15)]
    sq, kx, eta = np.array([0.6]), np.array([1.0]), np.array([3e-16])
    A, An = np.array([40.0]), np.array([9.0])
    got = r.bound(m, sq, kx, eta, A, An, solved=False)
    g2m = gamma_n(2 * m + 2)
    zn = math.sqrt(0.6 * (1 + gamma_n(m)))
    want = (2 * 40 * (3e-16 + g2m * 1.3 * zn) + 2e-15 * 40 ** 2 + 7e-14 * (2 * 40 - 9) * 9
            + gamma_n(m + 2) * (0.6 + 1.0)) * (1 + 8 * U)
    assert got[0] == pytest.approx(want, rel=1e-12, abs=0)
    assert 7e-14 * (2 * 40 - 9) * 9 > 0.5 * want  # the term for the new points dominates


def test_the_eigenvalue_allowance_carries_the_factor_error():
    """``g`` gains ``theta (sum_j |b_j|_1)^2`` (the dictionary's Gram matrix is ``L L' -
    Delta``): with theta 1e-6 and L = I, each allowance grows by about that times
    ``lambda_i``."""
    from ooc_spectral.core.eigensolve import spectrum_allowance

    rng = np.random.default_rng(5)
    m, p = 12, 3
    Q, _ = np.linalg.qr(rng.standard_normal((m, m)))
    lam_all = np.sort(rng.uniform(1.0, 10.0, m))[::-1]
    C = (Q * lam_all) @ Q.T
    C = 0.5 * (C + C.T)
    W = Q[:, :p]
    smap = SimpleNamespace(components=W, eigenvalues=lam_all[:p])
    sums = SimpleNamespace(certified=True, sum_sq=0.0, sum_kx=0.0, sum_xi2=0.0)

    def allowances(theta):
        d = SimpleNamespace(rounding=SimpleNamespace(theta=theta), L=np.eye(m))
        return spectrum_allowance(d, C, smap, sums, depth=m)

    lo0, up0 = allowances(0.0)
    lo1, up1 = allowances(1e-6)
    S = float(np.sum(np.abs(W).sum(axis=0))) ** 2
    np.testing.assert_allclose(up1 - up0, 1e-6 * S * lam_all[:p], rtol=1e-3)
    assert np.all(lo1 - lo0 > 0.5 * 1e-6 * S * lam_all[:p])


# --------------------------------------------------------------------------- #
# Algorithm 2's last step (core/scan/search.py)
# --------------------------------------------------------------------------- #
def test_algorithm2s_last_step_returns_the_tol_the_result_meets():
    """Step 25 fills up to the size from the eps_minus dictionary at eps_plus and below;
    the tol it may claim is eps_minus, which every row meets (exact residuals). Reached here
    with no search iterations, on data with ties (rows repeated)."""
    from extended_precision import true_residuals
    from sklearn.datasets import make_moons

    from ooc_spectral.core.kernels import RBFKernel
    import ooc_spectral.core.scan.search as search
    from ooc_spectral.core.scan.search import search_dictionary

    X = np.repeat(make_moons(150, noise=0.05, random_state=1)[0], 2, axis=0)
    order = np.random.default_rng(0).permutation(len(X))
    k = RBFKernel(3.0)
    calls = []

    def scan(*args, certify=True, **kwargs):
        calls.append(certify)  # step 25 scans without certifying (it promises no tol)
        return scan_rows(*args, certify=certify, **kwargs)

    scan_rows = search.scan_rows
    search.scan_rows = scan
    try:
        for m in (7, 25, 40):  # three search steps: no trial hits the size exactly
            calls.clear()
            st, tol = search_dictionary(k, X[order], order, m, iterations=3)
            assert st.size == m and False in calls
            assert true_residuals(k, X, st.points).max() <= tol, m
    finally:
        search.scan_rows = scan_rows


# --------------------------------------------------------------------------- #
# the eigensolves (core/eigensolve.py)
# --------------------------------------------------------------------------- #
def test_n_components_one_beyond_the_rank_is_refused():
    """Three groups of equal rows: three dictionary points whose centred span has two
    directions. n_components = 2 fits, 3 = rank + 1 is refused naming the rank."""
    X = np.repeat(np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]]), 50, axis=0)
    est = GreedySpectralEmbedding(2, gamma=0.2, random_state=0).fit(X)
    assert est.eigenvalues_.shape == (2,) and est.dictionary_.shape[0] == 3
    with pytest.raises(DictionaryError, match=r"n_components=3 exceeds the number of directions"
                                              r".*\(2, with a dictionary of 3 points"):
        GreedySpectralEmbedding(3, gamma=0.2, random_state=0).fit(X)


@pytest.mark.parametrize("greedy", [True, False])
def test_subset_degrees_report_the_normalized_kernels_eigenvalues_over_n(greedy):
    """degree_estimate='subset': the Gram matrix of the normalized kernel is n times
    D^-1/2 K D^-1/2 (degrees of the subset), and its eigenvalues divided by n are reported,
    by the greedy path and by the exact one."""
    from sklearn.datasets import make_moons

    X = make_moons(300, noise=0.05, random_state=0)[0]
    # the greedy path at tol 1e-8; at 1e-12, which float64 cannot certify, the exact one
    params = dict(n_components=3, gamma=2.0, tol=1e-8 if greedy else 1e-12,
                  normalization="divisive", degree_estimate="subset", degree_subset_size=100,
                  drop_first=False, random_state=0)
    est = GreedySpectralEmbedding(**params).fit(X)
    assert (est.spectral_map_.dictionary.L is not None) == greedy
    kernel = est.kernel_
    K = kernel(X)  # the normalized kernel's Gram matrix
    ref = np.linalg.eigvalsh(K)[::-1][:3] / len(X)
    np.testing.assert_allclose(est.eigenvalues_, ref, rtol=1e-6)


# --------------------------------------------------------------------------- #
# pass 2 in sub-blocks (core/pass2.py) and kernels in pieces (core/kernels.py)
# --------------------------------------------------------------------------- #
def test_the_smallest_degree_names_its_row_across_sub_blocks():
    """A block taken in sub-blocks of 8 rows names the row of its smallest degree by its
    number in the data (offset + its place in the block), not its place in a sub-block."""
    from sklearn.datasets import make_moons

    from ooc_spectral.core.pass2 import chunk_degrees

    X = make_moons(200, noise=0.05, random_state=0)[0]
    est = GreedySpectralEmbedding(2, gamma=2.0, tol=1e-3, random_state=0).fit(X)
    d = est.spectral_map_.dictionary
    block = X[:40].copy()
    block[29] = [50.0, 50.0]  # far from every point: the smallest degree, 0
    Y = d.project(block, orthogonal=True)[0]
    total = Y.sum(axis=0)
    part = chunk_degrees(block, d, 1000, total, block_rows=8)
    assert part.argmin == 1029
    assert part.certificate.argmax == 1029  # the farthest row too


@pytest.mark.parametrize("name", ["laplacian", "linear", "polynomial", "cosine"])
def test_column_sums_of_a_block_in_several_pieces(name):
    """A kernel block of 3 x 2^17 entries is computed in pieces; its column sums, added
    piece by piece, are the block's."""
    from ooc_spectral.core.kernel_choice import make_kernel

    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(3000, 4)), rng.normal(size=(131, 4))
    kernel = make_kernel(name, gamma=0.3, degree=2, coef0=1.0)
    out = np.empty((3000, 131))
    sums = np.empty(131)
    kernel.pairwise_into(out, X, Y, kernel.aux(X), kernel.aux(Y), col_sums=sums)
    ref = kernel.pairwise(X, Y)
    np.testing.assert_allclose(out, ref, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(sums, ref.sum(axis=0), rtol=1e-11)


# --------------------------------------------------------------------------- #
# the linear kernel's explicit bound (core/explicit_features.py) at its formula
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("coef0", [0.0, 2.0])
def test_the_explicit_bound_is_its_formula(coef0):
    """``(1 + 8u) [gamma_f (|v| + |w|)^2 + coef0 (|1 - s| + e)^2]`` with the residual
    ``v = (x - c) - P' a``, its rounding ``w = (gamma_{m+3} (|x - c| + |a|'|P|) + u |v|)
    (1 + gamma_{m+2})``, both norms inflated by ``1 + gamma_{d+4}``, and for the constant
    feature ``e = (gamma_{m+2} |a|_1 + u)(1 + gamma_{m+2})`` (``(|1 - s| + e + u)(1 + 2u)``):
    on rows nearly in the span, where the rounding term is most of the bound."""
    from ooc_spectral.core.explicit_features import explicit_residual_bounds
    from ooc_spectral.core.kernels import LinearKernel, PolynomialKernel

    rng = np.random.default_rng(9)
    P = rng.normal(size=(3, 5)) * 1e3
    A = rng.normal(size=(3, 4))
    A /= A.sum(axis=0)  # affine combinations: the constant feature's residual about 0 too
    X = A.T @ P + 1e-14 * rng.normal(size=(4, 5))  # nearly in the span, coefficients A
    kernel = (LinearKernel() if coef0 == 0 else
              PolynomialKernel(gamma=0.5, degree=1, coef0=coef0))
    g = 1.0 if coef0 == 0 else 0.5
    got = explicit_residual_bounds(kernel, X, P, A)
    m, d = P.shape
    V = X - A.T @ P
    W = (gamma_n(m + 3) * (np.abs(X) + np.abs(A.T) @ np.abs(P)) + U * np.abs(V)) * (1 + gamma_n(m + 2))
    grow = 1 + gamma_n(d + 4)
    vv, ww = g * np.sum(V * V, axis=1), g * np.sum(W * W, axis=1)
    if coef0:
        e = (gamma_n(m + 2) * np.abs(A).sum(axis=0) + U) * (1 + gamma_n(m + 2))
        vv = vv + coef0 * (1 - A.sum(axis=0)) ** 2
        ww = ww + coef0 * e * e
    want = ((np.sqrt(vv) + np.sqrt(ww)) * grow) ** 2 * (1 + 8 * U)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert np.all(np.sqrt(ww) > 1e-3 * np.sqrt(vv))  # the rounding term is not negligible here


def test_a_row_resolved_against_its_own_residual_only_when_certainly_beyond_tol():
    """Its spread past a quarter of tol, the row enters only when its residual is certainly
    beyond tol (lower > tol) and resolved against itself; at lower = 0.79 tol it is
    undecidable."""
    from ooc_spectral.core.scan.certify import decide

    tol, floor = 1e-3, 1e-14
    # spread 0.26 tol: not within a quarter of tol, within a quarter of dhat = 1.05 tol
    with pytest.raises(NumericalBreakdownError):
        decide(1.05e-3, 1.05e-3, floor, 0.26e-3, tol, 2, 1.31e-3, 0.79e-3)
    # the same spread on a residual of 4 tol: certainly beyond tol, resolved
    assert decide(4e-3, 4e-3, floor, 0.9e-3, tol, 2) is True


def test_the_double_double_kernel_error_is_its_formula():
    """``eta = 1.1 (2^-94 + (3 dim + 12) u^2 / e) + 2.3e-290``."""
    from ooc_spectral.core.extended import kernel_dd
    from ooc_spectral.core.kernels import RBFKernel

    X = np.random.default_rng(0).normal(size=(4, 3))
    _, _, eta = kernel_dd(RBFKernel(1.0), X, X)
    # abs=0: approx's default absolute tolerance, 1e-12, would pass any eta below it
    assert eta == pytest.approx(1.1 * (2.0 ** -94 + 21 * U * U / math.e) + 2.3e-290, rel=1e-12,
                                abs=0)


def test_the_double_double_bound_carries_the_factors_error():
    """``theta |a|_1^2`` is in the double-double bound: a factor error raised by 1e-8 raises
    each row's upper bound by at least 1e-8 ``|a|_1^2`` (``a = M^-1 k``)."""
    from sklearn.datasets import make_moons

    from ooc_spectral.core.extended import ExtendedGram
    from ooc_spectral.core.kernels import RBFKernel

    X = make_moons(60, noise=0.05, random_state=0)[0]
    k = RBFKernel(2.0)
    D = X[:12]
    L = np.linalg.cholesky(k(D, D))
    Z = np.linalg.solve(L, k(D, X[12:20])).T
    gram = ExtendedGram(k)
    up0, _ = gram.bounds(L, D, X[12:20], Z)
    gram.theta += 1e-8
    up1, _ = gram.bounds(L, D, X[12:20], Z)
    A1 = np.abs(np.linalg.solve(k(D, D), k(D, X[12:20]))).sum(axis=0)
    assert np.all(up1 - up0 >= 0.99e-8 * A1 ** 2)
