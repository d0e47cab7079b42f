"""Each rounding bound and membership threshold at its value (issue 36).

The certificate's bounds are loose by design (worst-case rounding), so a fit's answers
rarely come near them and a bound ten or a hundred times too small would still pass
every end-to-end test. Here each one is pinned where it can be:

- soundness against an exact answer where a perturbation can be made large enough to
  reach the bound: the cheap coefficient bound against the exact ``|L^-T z|_1``; the
  spectrum's allowances against eigenvalues moved on purpose, whose exact values are
  known;
- its documented formula (``docs/user_guide/certificate.md``), recomputed here from
  the definitions (Higham's ``gamma_n = n u / (1 - n u)``), where the bound is a
  worst case no computation reaches;
- the scan's membership thresholds just inside and just past each of them.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.linalg import solve_triangular

from ooc_spectral.core.eigensolve import accumulation_error, spectrum_allowance
from ooc_spectral.core.kernels import RBFKernel
from ooc_spectral.core.rounding import inverse_row_sums, residual_rounding
from ooc_spectral.core.scan.certify import RESOLVED, decide, entered_resolved
from ooc_spectral.exceptions import NumericalBreakdownError

U = 2.0 ** -53


def gamma_n(n):
    return n * U / (1 - n * U)


def spd_factor(m, seed=0, cond=1e3):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((m, m)))
    M = (Q * np.geomspace(1.0, 1.0 / cond, m)) @ Q.T
    return np.linalg.cholesky(M)


# --------------------------------------------------------------------------- #
# the residual bound E (rounding.residual_rounding)
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("solved", [False, True])
def test_residual_rounding_is_its_formula(solved):
    """E = (1 + 8u) [2 A (eta + g_{2m+2} l |z| sqrt(1 + g_m)) + theta A^2
    + g_{m+2} (|z|^2 + |k(x,x)|) + kx_error] (+ (sqrt(m) g_{2m+2} l A + shift)^2 solved)."""
    rng = np.random.default_rng(1)
    m, c = 40, 7
    theta, ell = 3e-14, 1.7
    sq = rng.uniform(0.1, 1.0, c)
    kx = rng.uniform(0.9, 1.1, c)
    eta = rng.uniform(1e-16, 1e-15, c)
    A = rng.uniform(1.0, 50.0, c)
    kerr, shift = 2e-16, 1e-15
    got = residual_rounding(m, theta, ell, sq, kx, eta, A, solved=solved, kx_error=kerr,
                            shift=shift)
    g2m = gamma_n(2 * m + 2)
    zn = np.sqrt(sq * (1 + gamma_n(m)))
    want = (2 * A * (eta + g2m * ell * zn) + theta * A * A
            + gamma_n(m + 2) * (sq + kx) + kerr)
    if solved:
        want = want + (math.sqrt(m) * g2m * ell * A + shift) ** 2
    want = want * (1 + 8 * U)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_cheap_coefficients_bound_the_exact_solution():
    """``c'|z| >= |L^-T z|_1`` for every z (c the certified row sums of |L^-1|), and it is
    within a small factor of the worst z (a sign pattern of a row of L^-1)."""
    L = spd_factor(30, seed=2)
    c = inverse_row_sums(L)
    Linv = solve_triangular(L, np.eye(30), lower=True)
    exact_rows = np.abs(Linv).sum(axis=1)
    assert np.all(c >= exact_rows * (1 - 1e-12))
    assert np.all(c <= 4 * exact_rows)  # a bound near its value, not one 100x too large
    rng = np.random.default_rng(3)
    Z = rng.standard_normal((200, 30))
    exact = np.abs(solve_triangular(L, Z.T, lower=True, trans="T")).sum(axis=0)
    from ooc_spectral.core.rounding import FactorRounding

    r = FactorRounding(30, 0.0, 1.0, c, 1.0, 1.0)
    cheap = r.cheap_coefficients(Z)
    np.testing.assert_allclose(cheap, np.abs(Z) @ c, rtol=1e-13)
    assert np.all(cheap >= exact * (1 - 1e-12))


# --------------------------------------------------------------------------- #
# the accumulation's rounding and the spectrum's allowances (eigensolve)
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("certified", [True, False])
def test_accumulation_error_is_its_formula(certified):
    """tau_C = 4 gamma_{depth+4} sum |z|^2 (pass 2's sum_sq; sum k(x, x) without it)."""
    sums = SimpleNamespace(certified=certified, sum_sq=123.5, sum_kx=130.25)
    scale = 123.5 if certified else 130.25
    for depth in (1, 1000, 2_000_000):
        assert accumulation_error(sums, depth) == pytest.approx(
            4 * gamma_n(depth + 4) * scale, rel=1e-12, abs=0)


def _moved_spectrum(p=4, m=12, delta=1e-6, sign=1.0, seed=5, certified=False):
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((m, m)))
    exact = np.sort(rng.uniform(1.0, 10.0, m))[::-1]
    C = (Q * exact) @ Q.T
    C = 0.5 * (C + C.T)
    true = np.linalg.eigvalsh(C)[::-1][:p]
    W = Q[:, :p]
    smap = SimpleNamespace(components=W, eigenvalues=true + sign * delta)
    sums = SimpleNamespace(certified=True, sum_sq=0.0, sum_kx=0.0, sum_xi2=0.0)
    # certified: the dictionary's factor and rounding constants enter (an exact factor
    # here, L = I, theta = 0); else the eigensolve's own rounding alone
    dictionary = (SimpleNamespace(rounding=SimpleNamespace(theta=0.0), L=np.eye(m))
                  if certified else SimpleNamespace(rounding=None, L=None))
    lower, upper = spectrum_allowance(dictionary, C, smap, sums, depth=m)
    return true, smap.eigenvalues, lower, upper


@pytest.mark.parametrize("certified", [False, True])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-3])
def test_lower_allowance_covers_eigenvalues_reported_too_high(delta, certified):
    """Eigenvalues reported delta above the exact ones (a residual ``C W - W Lambda`` of
    norm about delta): the lower allowance reaches down to the exact ones, and not
    more than a small factor past them."""
    true, lam, lower, _ = _moved_spectrum(delta=delta, sign=+1.0, certified=certified)
    assert np.all(lam - lower <= true)
    assert np.all(lower <= 10 * delta)


@pytest.mark.parametrize("certified", [False, True])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-3])
def test_upper_allowance_covers_eigenvalues_reported_too_low(delta, certified):
    true, lam, _, upper = _moved_spectrum(delta=delta, sign=-1.0, certified=certified)
    assert np.all(lam + upper >= true)
    assert np.all(upper <= 10 * delta)


# --------------------------------------------------------------------------- #
# the scan's membership test (scan.certify.decide, entered_resolved)
# --------------------------------------------------------------------------- #
TOL = 1e-3
FLOOR = 1e-14


def test_a_row_certified_within_tol_is_skipped():
    # dhat + E just inside tol, delta within tol: skipped
    assert decide(0.9 * TOL, 0.9 * TOL, FLOOR, 0.099 * TOL, TOL, 0) is False


def test_a_row_whose_rounding_reaches_past_tol_enters():
    # delta and dhat within tol, but dhat + E just past tol with a resolved E: it is
    # not certified within tol, so it enters (never skipped on its computed value alone)
    assert decide(0.9 * TOL, 0.9 * TOL, FLOOR, 0.101 * TOL, TOL, 0) is True


def test_an_unresolved_rounding_raises_with_advice():
    # not certified, rounding just past RESOLVED * tol: float64 cannot decide
    with pytest.raises(NumericalBreakdownError) as err:
        decide(0.9 * TOL, 0.9 * TOL, FLOOR, (RESOLVED + 0.01) * TOL, TOL, 7)
    assert "row 7" in str(err.value) and err.value.suggested_tol > TOL
    # just inside RESOLVED: the row enters
    assert decide(0.9 * TOL, 0.9 * TOL, FLOOR, (RESOLVED - 0.01) * TOL, TOL, 7) is True


def test_an_entering_row_must_be_resolved():
    # entered on delta > tol, but delta - E just below (1 - RESOLVED) tol: raises
    with pytest.raises(NumericalBreakdownError):
        entered_resolved(1.1 * TOL, 1.1 * TOL - (1 - RESOLVED) * TOL + 1e-9 * TOL, TOL, 3)
    # just above it: accepted
    entered_resolved(1.1 * TOL, 1.1 * TOL - (1 - RESOLVED) * TOL - 1e-6 * TOL, TOL, 3)


# --------------------------------------------------------------------------- #
# the Gaussian kernel's clip
# --------------------------------------------------------------------------- #
def test_a_negative_computed_distance_gives_one_never_more():
    """``|x|^2 + |y|^2 - 2 x.y`` can round below zero for close rows far from the
    centre; the kernel clips it, so no entry exceeds k(x, x) = 1."""
    k = RBFKernel(gamma=1.0)
    S = np.array([[0.5, -0.0, -1.0]])  # the exponent -gamma d^2: 0.5 is a distance < 0
    out = k.monotone_to_kernel(S.copy())
    np.testing.assert_allclose(out, [[1.0, 1.0, math.exp(-1.0)]], rtol=1e-15)
    rng = np.random.default_rng(0)
    X = 1e4 + 1e-6 * rng.standard_normal((50, 3))
    K = k.pairwise(X, X)
    assert np.all(K <= 1.0)


# --------------------------------------------------------------------------- #
# pass 2's certificate check (checks.check_certificate)
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("rounding", [0.0, 1e-9])
def test_the_certificate_check_at_its_slack(rounding):
    """A row may exceed tol after pass 2 by ``(1e3 eps + 16 (m + 2) eps) max k(x, x)``
    plus the largest certified rounding term: just inside passes, just past raises."""
    from ooc_spectral.core.checks import check_certificate

    eps = np.finfo(np.float64).eps
    m, tol = 20, 1e-6
    kernel = RBFKernel(gamma=1.0)  # k(x, x) = 1
    pts = np.random.default_rng(0).standard_normal((m, 2))
    dictionary = SimpleNamespace(points=pts, aux=kernel.aux(pts))
    sums = SimpleNamespace(max_rounding=rounding, certified=True)
    slack = (1e3 * eps + 16.0 * (m + 2) * eps) * 1.0 + rounding
    inside = SimpleNamespace(max_delta=tol + 0.99 * slack, argmax=4)
    check_certificate(inside, tol, m, kernel, dictionary, sums=sums)
    past = SimpleNamespace(max_delta=tol + 1.01 * slack, argmax=4)
    with pytest.raises(NumericalBreakdownError, match="row 4"):
        check_certificate(past, tol, m, kernel, dictionary, sums=sums)


# --------------------------------------------------------------------------- #
# pass 2's degrees (divisive normalization)
# --------------------------------------------------------------------------- #
def test_a_zero_degree_is_reported_not_divided_by():
    """A row of degree exactly 0 leaves the chunk's sums finite and is reported as the
    smallest degree (the fit then refuses it by name); dividing by sqrt(0) would turn
    the sums into inf and NaN."""
    from sklearn.datasets import make_moons

    from ooc_spectral import GreedySpectralEmbedding
    from ooc_spectral.core.pass2 import chunk_degrees

    X = make_moons(200, noise=0.05, random_state=0)[0]
    est = GreedySpectralEmbedding(n_components=2, gamma=2.0, tol=1e-3, random_state=0).fit(X)
    dictionary = est.spectral_map_.dictionary
    total = np.zeros(dictionary.size)  # every row's degree y . total is exactly 0
    part = chunk_degrees(X[:50], dictionary, 100, total)
    assert part.min_degree == 0.0 and part.argmin == 100
    assert np.all(np.isfinite(part.S))
    Y = dictionary.project(X[:50], orthogonal=True)[0]
    np.testing.assert_allclose(part.S, Y.T @ Y, rtol=1e-10, atol=1e-12)
