"""The numerical core against references that do not share its arithmetic (issue 53: the
11 survivors of the independent mutation audit, workflows/audit/results.md).

Each test checks a bound, a threshold or a result of ``ooc_spectral.core`` against a value
computed another way: the kernel in mpmath at 60 digits or more, the exact Gram matrix of
all the rows, or a formula derived from the mathematics the docstring states (never the
module's own expression). Small data: each test runs in about a second.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

U = 2.0 ** -53


def mp_kernel(kernel, X, D, dps: int = 60) -> np.ndarray:
    """``k(x, d)`` of the float64 rows at ``dps`` digits (the Gaussian kernel from the
    differences, the dot-product kernels from the exact products), as an object array of
    mpmath numbers (c x m)."""
    name = kernel.name
    c = getattr(kernel, "center", None)
    with mpmath.workdps(dps):
        def rows(A):
            A = np.asarray(A, dtype=np.float64)
            cc = [mpmath.mpf(0)] * A.shape[1] if c is None else [mpmath.mpf(float(v)) for v in c]
            return [[mpmath.mpf(float(v)) - w for v, w in zip(r, cc)] for r in A]

        R, P = rows(X), rows(D)
        out = np.empty((len(R), len(P)), dtype=object)
        for i, x in enumerate(R):
            for j, d in enumerate(P):
                if name == "rbf":
                    s = mpmath.fsum((a - b) ** 2 for a, b in zip(x, d))
                    v = mpmath.exp(-mpmath.mpf(float(kernel.gamma)) * s)
                else:
                    t = mpmath.fsum(a * b for a, b in zip(x, d))
                    if name == "polynomial":
                        t = (mpmath.mpf(float(kernel.gamma)) * t
                             + mpmath.mpf(float(kernel.coef0))) ** int(kernel.degree)
                    v = t
                out[i, j] = v
    return out


def mp_error(computed, exact, dps: int = 60) -> np.ndarray:
    """``|computed - exact|`` entrywise (computed float64, or a double-double pair
    ``(hi, lo)`` taken as ``hi + lo``)."""
    hi, lo = computed if isinstance(computed, tuple) else (computed, np.zeros_like(computed))

    def err(h, l, e):
        return float(abs(mpmath.mpf(float(h)) + mpmath.mpf(float(l)) - e))

    with mpmath.workdps(dps):
        return np.vectorize(err, otypes=[float])(hi, lo, exact)


# --------------------------------------------------------------------------- #
# kernel-entry errors (core/rounding.py entry_error): sound against 60 digits
# --------------------------------------------------------------------------- #
def test_the_linear_entry_error_holds_for_short_rows_against_a_far_dictionary():
    """``|x . d (float64) - x . d| <= eta(x)`` for every dictionary point d: the rounding of
    a dot product grows with ``|x| |d|``, so rows 1e6 times shorter than the dictionary's
    farthest point still carry an error of about ``u |x| |d|``, far above ``u |x|^2``."""
    from ooc_spectral.core.kernels import LinearKernel
    from ooc_spectral.core.rounding import entry_error

    rng = np.random.default_rng(6)
    k = LinearKernel()
    D = rng.normal(size=(6, 40)) * 1e6
    X = rng.normal(size=(30, 40))
    radius = float(np.max(np.linalg.norm(D, axis=1)))
    eta = entry_error(k, X, None, k.diag(X), radius, float(np.max(k.diag(D))))
    err = mp_error(k.pairwise(X, D), mp_kernel(k, X, D)).max(axis=1)
    assert np.all(err <= eta)
    assert np.max(err / eta) > 1e-3  # the bound is not vacuous


def test_the_polynomial_entry_error_holds_where_the_base_is_far_above_one():
    """Degree 3 with ``t = gamma x . d`` about 1000, on rows along the dictionary point (so
    ``|t|`` reaches its Cauchy-Schwarz bound ``gamma |x| |d|``): ``t^3`` moves by about
    ``3 t^2 dt`` for a rounding ``dt`` of the base (the derivative of ``t^p`` is
    ``p t^(p-1)``); the bound holds for every row against 60 digits."""
    from ooc_spectral.core.kernels import PolynomialKernel
    from ooc_spectral.core.rounding import entry_error

    rng = np.random.default_rng(7)
    k = PolynomialKernel(gamma=0.7, degree=3, coef0=0.0)
    D = np.array([[0.6, 1.3]])
    X = math.sqrt(1000 / 0.7) / np.linalg.norm(D) * (1 + 0.1 * rng.random(size=(2000, 1))) * D
    radius = float(np.linalg.norm(D))
    eta = entry_error(k, X, None, k.diag(X), radius, float(k.diag(D)[0]))
    err = mp_error(k.pairwise(X, D), mp_kernel(k, X, D))[:, 0]
    assert np.all(err <= eta), np.max(err / eta)
    assert np.max(err / eta) > 0.1  # the bound is not vacuous


# --------------------------------------------------------------------------- #
# the double-double Gaussian kernel (core/extended.py kernel_dd) against 60 digits
# --------------------------------------------------------------------------- #
def test_the_double_double_gaussian_kernel_is_within_eta_where_differences_are_inexact():
    """Rows near the origin against points of the other sign and other magnitudes: every
    ``x_j - p_j`` rounds in float64 (``h + l`` with ``l != 0``), so the squared distance
    needs its cross term ``2 h l``; ``hi + lo`` is within ``eta`` of the 60-digit kernel."""
    from ooc_spectral.core.extended import kernel_dd
    from ooc_spectral.core.kernels import RBFKernel

    rng = np.random.default_rng(17)
    k = RBFKernel(0.3)
    X = rng.normal(size=(12, 3)) * np.array([1.0, 1e-3, 1e-7])
    P = -rng.normal(size=(5, 3)) * np.array([1e-9, 1.0, 1e-2]) + 1e-17
    kh, kl, eta = kernel_dd(k, X, P)
    err = mp_error((kh, kl), mp_kernel(k, X, P, dps=60))
    assert np.all(err <= eta), np.max(err) / eta
    # float64 alone is far from it: the double-double carries the digits
    assert np.max(mp_error(k.pairwise(X, P), mp_kernel(k, X, P))) > 1e6 * eta


# --------------------------------------------------------------------------- #
# the exact path (core/eigensolve.py solve_exact, pipeline/exact.py exact_interval)
# --------------------------------------------------------------------------- #
def _two_clusters(rng, n):
    """n rows of one feature, half at b and half at b + d (b about 1e4, d below 0.1): the
    centred Gram matrix's one eigenvalue, ``n (d / 2)^2`` exactly, is far below the
    entries (about 1e8), whose roundings, repeated in every entry of a block, add up
    across the n rows."""
    from fractions import Fraction

    b = 1e4 * (1 + rng.random())
    X = np.r_[np.full(n // 2, b), np.full(n // 2, b + 0.1 * rng.random())][:, None]
    xs = [Fraction(float(v)) for v in X[:, 0]]
    mean = sum(xs) / n
    return X, float(sum((x - mean) ** 2 for x in xs))


def test_the_exact_paths_interval_holds_far_from_the_origin():
    """Every entry of the computed Gram matrix within ``eta`` bounds its 2-norm error by
    ``n eta``, not ``eta``: on rows 1e4 from the origin whose rounding errors repeat in
    every entry of a block, the exact eigenvalue (rational arithmetic) is inside the
    interval and more than ``eta + 8 n u lambda`` from the computed one."""
    from ooc_spectral.core.eigensolve import solve_exact
    from ooc_spectral.core.kernels import LinearKernel
    from ooc_spectral.pipeline.exact import exact_interval

    rng = np.random.default_rng(30)
    k = LinearKernel()
    n = 32
    beyond = 0
    for _ in range(12):
        X, lam = _two_clusters(rng, n)
        smap, _, _ = solve_exact(k, X, 1, affine=False)
        lo, hi = exact_interval(k, X, smap)[0]
        assert lo <= lam <= hi
        # one feature: eta is a few u |x| |d| (a product and the bound's own allowance),
        # below 5.1 u max|x|^2
        eta = 5.1 * U * float(np.max(X)) ** 2
        beyond += abs(float(smap.eigenvalues[0]) - lam) > eta + 8 * n * U * lam
    assert beyond  # where the factor n is needed


def test_the_exact_paths_interval_holds_far_from_the_origin_on_more_rows():
    """Two clusters of 146 rows, at 19679.26... and 0.00147 above it: the computed column
    means are off by about 43 ``u max|K|`` (not the one ``u max|K|`` of a rounding), the
    same in every column of a block, and the eigenvalue (exact: rational arithmetic) is
    about 5 half-widths outside the interval allowed before the centring's own term
    (found by a mutation audit's test writer)."""
    from fractions import Fraction

    from ooc_spectral.core.eigensolve import solve_exact
    from ooc_spectral.core.kernels import LinearKernel
    from ooc_spectral.pipeline.exact import exact_interval

    b = 19679.261899246467
    X = np.r_[np.full(146, b), np.full(146, b + 0.0014706304973515216)][:, None]
    xs = [Fraction(float(v)) for v in X[:, 0]]
    mean = sum(xs) / len(xs)
    lam = float(sum((x - mean) ** 2 for x in xs))
    smap, _, _ = solve_exact(LinearKernel(), X, 1, affine=False)
    lo, hi = exact_interval(LinearKernel(), X, smap)[0]
    assert lo <= lam <= hi


def test_the_exact_path_keeps_every_direction_kernel_pca_keeps():
    """``n_components=None``: every eigenvalue of the centred Gram matrix above ``1e-12``
    of the largest is kept, as scikit-learn's ``KernelPCA`` keeps them: a direction at
    ``1e-11`` of the largest (far above the Gram matrix's rounding, ``1e-16``) is one."""
    from sklearn.decomposition import KernelPCA

    from ooc_spectral.core.eigensolve import solve_exact
    from ooc_spectral.core.kernels import LinearKernel

    rng = np.random.default_rng(28)
    Q, _ = np.linalg.qr(rng.normal(size=(40, 4)) - rng.normal(size=(40, 4)).mean(axis=0))
    Q -= Q.mean(axis=0)
    X = Q * np.array([1.0, 0.6, 0.3, math.sqrt(2e-11)])
    ref = np.linalg.eigvalsh(np.cov(X.T, bias=True) * len(X))  # = the centred Gram's
    assert 5e-12 < ref[0] / ref[-1] < 5e-11
    kept = KernelPCA(kernel="linear").fit(X).eigenvalues_
    smap, _, _ = solve_exact(LinearKernel(), X, None, affine=False)
    assert len(smap.eigenvalues) == len(kept) == 4
    np.testing.assert_allclose(np.sort(smap.eigenvalues), ref, rtol=1e-4)


# --------------------------------------------------------------------------- #
# the scan's cheap coefficient bound (core/scan/certify.py ScanRounding.cheap)
# --------------------------------------------------------------------------- #
def test_the_scans_cheap_coefficients_bound_the_exact_solution():
    """``A = c'|z| >= |L^-T z|_1`` for the float64 factor L solved exactly (60 digits): for
    the first point alone (``c_1 >= 1 / L_11``, the one entry of its row of ``L^-1``) and
    for random z on every point."""
    from ooc_spectral.core.kernels import RBFKernel
    from ooc_spectral.core.scan.certify import ScanRounding

    rng = np.random.default_rng(23)
    k = RBFKernel(0.5)
    P = rng.normal(size=(6, 3))
    L = np.linalg.cholesky(k(P, P))
    r = ScanRounding.rebuild(k, L, P, None)
    Z = np.r_[np.eye(6)[:1], rng.normal(size=(20, 6)), np.abs(rng.normal(size=(5, 6)))]
    with mpmath.workdps(60):
        Lm = mpmath.matrix(L.tolist())
        exact = [float(mpmath.fsum(abs(v) for v in
                                   mpmath.lu_solve(Lm.T, mpmath.matrix(z.tolist()))))
                 for z in Z]
    A, _ = r.cheap(Z)
    assert np.all(A >= exact), (A / exact).min()
    assert np.all(A <= 1e3 * np.asarray(exact))  # a bound, not a vacuous one


# --------------------------------------------------------------------------- #
# the coordinates' perturbation xi (core/rounding.py FactorRounding.certify)
# --------------------------------------------------------------------------- #
def _dictionary(kernel, P):
    """The dictionary of the rows P in that order (every one enters: a scan at tol 0
    without certification), with its rounding constants."""
    from ooc_spectral.core.rounding import with_rounding
    from ooc_spectral.core.scan.blocked import scan_rows
    from ooc_spectral.core.scan.state import DictionaryState

    state = DictionaryState(kernel, P.shape[1], True)
    scan_rows(state, P, np.arange(len(P)), 0.0, certify=False)
    d = with_rounding(state.freeze())
    assert d.size == len(P)
    return d


def test_the_coordinate_perturbation_covers_the_kernels_rounding():
    """``xi`` bounds the computed coordinates' backward error against the exact kernel:
    ``max_j |(L z~)_j - k(x, d_j)| <= xi`` (L and z~ as computed, the sum and the kernel at
    60 digits). Rows 300 from the origin: the Gaussian kernel from the expanded square
    loses about ``u |x|^2`` in its exponent, so the kernel's own rounding is most of it."""
    from ooc_spectral.core.kernels import RBFKernel
    from ooc_spectral.core.model import Dictionary

    rng = np.random.default_rng(9)
    k = RBFKernel(0.5)
    X = 300.0 + rng.normal(size=(25, 3))
    d = _dictionary(k, X[:5])
    aux = k.aux(X)
    K, kx = d.kernel_block(X, aux, order="C")
    Z = d.solve(np.ascontiguousarray(K))
    sq = Dictionary.row_norms(Z)
    _, xi, _, _ = d.rounding.certify(d, X, aux, kx, sq, kx - sq,
                                     d.rounding.cheap_coefficients(Z), lambda r: Z[r])
    exact = mp_kernel(k, X, d.points)
    L = d.L
    with mpmath.workdps(60):
        mp = np.vectorize(mpmath.mpf, otypes=[object])
        LZ = mp(L) @ mp(Z).T  # exact: every product and sum at 60 digits
        back = np.array([[float(abs(LZ[j, r] - exact[r, j])) for j in range(d.size)]
                         for r in range(len(X))]).max(axis=1)
    assert np.all(back <= xi), (back / xi).max()
    assert np.max(back / xi) > 1e-3  # the bound is not vacuous


# --------------------------------------------------------------------------- #
# the linear kernel's explicit lower estimate (core/explicit_features.py)
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("steps, off", [(None, 0.0), (0, 1e-3)])
def test_the_explicit_lower_estimate_is_below_the_exact_residual(steps, off):
    """Standardised wine against its first 12 rows (13 features: every row keeps a
    residual): ``(|f| - |w| - ||L^-1|| |Phi_D' f|)^2`` is at most the exact residual (80
    digits) for every row, with the coefficients the factor gives (refined) and with
    coefficients off by 1e-3 left as they are (``f`` then has a part in the span, which
    the estimate must take away, not add)."""
    from extended_precision import exact_residuals
    from sklearn.datasets import load_wine
    from sklearn.preprocessing import StandardScaler

    from ooc_spectral.core.explicit_features import explicit_residual_bounds
    from ooc_spectral.core.kernels import LinearKernel

    X = StandardScaler().fit_transform(load_wine().data)
    P, R = X[:12], X[12:60]
    L = np.linalg.cholesky(P @ P.T)
    A = np.linalg.solve(P @ P.T, P @ R.T)
    A += off * np.random.default_rng(14).normal(size=A.shape)
    inv = 1.01 * np.linalg.norm(np.linalg.inv(L), 2)  # an upper bound of ||L^-1||_2
    kw = {} if steps is None else {"steps": steps}
    upper, lower = explicit_residual_bounds(LinearKernel(), R, P, A, L, inverse_norm=inv, **kw)
    exact = exact_residuals(LinearKernel(), R, P)
    assert np.all(lower <= exact) and np.all(exact <= upper)
    assert np.max(lower / exact) > 0.5  # an estimate, not 0


# --------------------------------------------------------------------------- #
# pass-2 statistics (core/pass2.py) against their definitions on the coordinates
# --------------------------------------------------------------------------- #
def _coordinates(kernel, d, X):
    """``Z = L^-1 k(D, x)`` for every row (c x m): the kernel in extended precision from
    the rows' differences, the dictionary's factor L solved in float64."""
    from extended_precision import kernel_matrix
    from scipy.linalg import solve_triangular

    K = kernel_matrix(kernel, d.points, X).astype(np.float64)
    return solve_triangular(d.L, K, lower=True).T


def test_the_kernel_space_extension_is_the_moments_on_the_grown_dictionary():
    """After the dictionary grows from 5 to 8 points, the extended moments are the mean and
    centred sum of squares of the coordinates on the 8 points, computed from their
    definition (every block: old, cross and new)."""
    from sklearn.datasets import make_moons

    from ooc_spectral.core.kernels import RBFKernel
    from ooc_spectral.core.pass2 import chunk_kernel_cross, chunk_moments, extend_moments_kernel

    X = make_moons(80, noise=0.1, random_state=26)[0]
    k = RBFKernel(0.5)
    d_old, d_new = _dictionary(k, X[:5]), _dictionary(k, X[:8])
    np.testing.assert_allclose(d_new.L[:5, :5], d_old.L, rtol=1e-13, atol=1e-15)
    ext = extend_moments_kernel(chunk_moments(X, d_old, 0), chunk_kernel_cross(X, d_new, 0, 5),
                                d_new, 5)
    Z = _coordinates(k, d_new, X)
    mean = Z.mean(axis=0)
    m2 = (Z - mean).T @ (Z - mean)
    np.testing.assert_allclose(ext.mean, mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(ext.m2, m2, rtol=0, atol=1e-8 * np.abs(m2).max())
    assert np.abs(m2[5:, 5:]).max() > 1e-2 * np.abs(m2).max()  # the new block is not small


def test_the_exact_degrees_statistic_is_its_definition():
    """Divisive normalization, exact degrees: ``S = sum y y' / d`` with ``d = y . total``
    (``D^-1/2``: each coordinate row divided by the square root of its degree), from the
    coordinates' definition."""
    from sklearn.datasets import make_moons

    from ooc_spectral.core.kernels import RBFKernel
    from ooc_spectral.core.pass2 import chunk_degrees

    X = make_moons(60, noise=0.1, random_state=25)[0]
    k = RBFKernel(0.5)
    d = _dictionary(k, X[:6])
    Z = _coordinates(k, d, X)
    total = Z.sum(axis=0)
    deg = Z @ total
    assert deg.min() > 0 and deg.max() > 2 * deg.min()  # degrees far from 1 and not equal
    got = chunk_degrees(X, d, 0, total)
    np.testing.assert_allclose(got.S, (Z / deg[:, None]).T @ Z, rtol=1e-9, atol=0)
    assert got.min_degree == pytest.approx(deg.min(), rel=1e-9)


# --------------------------------------------------------------------------- #
# the scan's entering rows (core/scan/blocked.py): which pivots come from double-double
# --------------------------------------------------------------------------- #
def test_an_entering_pivot_rounded_beyond_1_in_400_comes_from_double_double(monkeypatch):
    """A row enters with its float64 pivot only when the pivot's rounding E is at most
    1/400 of ``max(dhat, tol)`` (1% of the quarter of tol that decides membership);
    beyond that its row of the factor is taken in double-double. Every entering row's E
    and dhat are recorded as the scan computed them, and every call of the double-double
    path; moons at tol 1e-8 have rows on both sides, and one at 0.4%."""
    from sklearn.datasets import make_moons

    from ooc_spectral.core.kernels import RBFKernel
    from ooc_spectral.core.scan import certify
    from ooc_spectral.core.scan.blocked import scan_rows
    from ooc_spectral.core.scan.state import DictionaryState

    seen, extended = {}, set()
    bounds, coordinates = (certify.ScanRounding.residual_bounds,
                           certify.ScanRounding.extended_coordinates)

    def residual_bounds(self, L, Z, dhat, delta, X, *args):
        E, up, low = bounds(self, L, Z, dhat, delta, X, *args)
        seen.update((x.tobytes(), (float(e), float(d))) for x, e, d in zip(X, E, dhat))
        return E, up, low

    def extended_coordinates(self, points, x):
        extended.add(x.tobytes())
        return coordinates(self, points, x)

    monkeypatch.setattr(certify.ScanRounding, "residual_bounds", residual_bounds)
    monkeypatch.setattr(certify.ScanRounding, "extended_coordinates", extended_coordinates)
    X = make_moons(150, noise=0.05, random_state=3)[0]
    tol = 1e-8
    state = DictionaryState(RBFKernel(1.0), 2, True)
    state.rounding.extended_allowed = True
    scan_rows(state, X, np.arange(len(X)), tol)
    ratio = {p.tobytes(): seen[p.tobytes()][0] / max(seen[p.tobytes()][1], tol)
             for p in state.points[1:state.size] if p.tobytes() in seen}
    assert len(ratio) == state.size - 1
    for key, r in ratio.items():
        if not 0.95 / 400 < r < 1.05 / 400:  # clear of the threshold's own rounding
            assert (key in extended) == (r > 1 / 400), r
    assert any(1.2 / 400 < r < 10 / 400 for r in ratio.values())
    assert any(r < 0.5 / 400 for r in ratio.values())


def test_lanczos_gives_way_to_lapack_after_a_quarter_of_n_products():
    """dense_top_eigenpairs lets ARPACK run at most about n/4 products (ncv at first,
    ncv - k a restart), then solves with LAPACK: a tight pair at the top of a 2000 x 2000
    matrix took thousands of products before. The answer is LAPACK's, to rounding."""
    import scipy.sparse.linalg

    from ooc_spectral.core import eigensolve

    rng = np.random.default_rng(0)
    n, k = 2000, 2
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    spectrum = np.concatenate([[1.0, 1.0 - 1e-9], rng.uniform(0.0, 0.999, n - 2)])
    K = (Q * spectrum) @ Q.T
    K = 0.5 * (K + K.T)
    seen = {}
    real = scipy.sparse.linalg.eigsh

    def spy(*args, **kw):
        seen.update(kw)
        return real(*args, **kw)

    scipy.sparse.linalg.eigsh = spy
    try:
        vals, V = eigensolve.dense_top_eigenpairs(K, k)
    finally:
        scipy.sparse.linalg.eigsh = real
    ncv = seen["ncv"]
    assert ncv + (seen["maxiter"] - 1) * (ncv - k) <= 0.25 * n + ncv  # about n/4 products
    assert seen["maxiter"] >= 3
    np.testing.assert_allclose(vals, [1.0 - 1e-9, 1.0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.abs(V.T @ (Q[:, :2] @ Q[:, :2].T) @ V), np.eye(2), atol=1e-6)
