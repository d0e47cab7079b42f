"""The certificate is true: checked by arithmetic that does not fail the same way (issue 36).

- Every fit either raises :class:`NumericalBreakdownError` whose advice, followed, gives a
  certified fit, or returns ``max_residual_`` at least every row's exact squared distance
  to the dictionary's span (recomputed from differences in extended precision on the
  fit's own dictionary) and an eigenvalue interval holding the exact centred Gram
  matrix's eigenvalues: across offsets of the data from 0 to 1e6, tol from 1e-3 to
  1e-12 and 0, the Gaussian kernel (median and fixed gamma), the Laplacian, the linear kernel
  and ``MetricMDS``, on three data sets, and with a constant column of 1e4 added.
- The rounding bounds' pieces against exact arithmetic (fractions, extended precision).

The whole grid is ``workflows/bench/certificate_grid.py`` (its table is in
``workflows/bench/results/certificate_grid.md``); here a stratified part of it runs in
every CI run and the rest is marked ``slow``.
"""

from __future__ import annotations

import re
import warnings
from fractions import Fraction

import numpy as np
import pytest
from sklearn.datasets import make_circles, make_moons, make_s_curve

from extended_precision import HAS_EXTENDED, LD, exact_residuals, forward, kernel_matrix, \
    reference_eigenvalues, true_residuals
from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.exceptions import NumericalBreakdownError
from ooc_spectral.manifold import MetricMDS

pytestmark = pytest.mark.skipif(not HAS_EXTENDED, reason="needs an extended-precision long double")

OFFSETS = [0.0, 10.0, 30.0, 100.0, 1e3, 1e4, 1e5, 1e6]
TOLS = [1e-3, 1e-6, 1e-8, 1e-10, 1e-12, 0.0]
KERNELS = ["rbf-median", "rbf-0.5", "rbf-5", "laplacian", "linear", "mds"]
DATASETS = ["circles", "moons", "s-curve"]
N = 300
P = 4


def dataset(name: str) -> np.ndarray:
    if name == "circles":
        return make_circles(N, factor=0.3, noise=0.05, random_state=0)[0]
    if name == "moons":
        return make_moons(N, noise=0.05, random_state=0)[0]
    return make_s_curve(N, random_state=0)[0]


def estimator(kernel: str, tol: float, **params):
    """``params``: more estimator parameters (``max_dictionary_size`` below the rows keeps
    the greedy path where the exact problem would be at hand)."""
    if kernel == "mds":
        return MetricMDS(n_components=2, tol=tol, random_state=0, **params)
    if kernel.startswith("rbf"):
        gamma = None if kernel == "rbf-median" else float(kernel.split("-")[1])
        return GreedySpectralEmbedding(n_components=P, kernel="rbf", gamma=gamma, tol=tol,
                                       random_state=0, **params)
    return GreedySpectralEmbedding(n_components=P if kernel == "laplacian" else 2, kernel=kernel,
                                   tol=tol, random_state=0, **params)


def fit_or_follow_advice(kernel: str, X: np.ndarray, tol: float, **params):
    """The fit, or the fit at the tol a breakdown advises (which must then succeed):
    returns ``(estimator, tol used, advised)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return estimator(kernel, tol, **params).fit(X), tol, False
        except NumericalBreakdownError as err:
            found = re.search(r"Use tol >= ([0-9.e+-]+)", str(err))
            assert found, f"a breakdown without advice: {err}"
            advice = float(found.group(1))
            assert advice > tol
            return estimator(kernel, advice, **params).fit(X), advice, True


def exceeds_bound(kernel, X, points, bound: float) -> np.ndarray:
    """Exact residuals of the rows that may exceed ``bound``: long double first; the rows
    whose long-double residual reaches within 1e-3 of the bound (long double's own rounding
    can be that large at a small tol) again at 40 digits. Returns the largest residual
    found, the reference of each checked row being the most precise one computed."""
    true = true_residuals(kernel, X, points)
    close = np.flatnonzero(true >= bound * (1 - 1e-3))
    if close.size and kernel.name in ("rbf", "laplacian"):
        from extended_precision import precise_residuals

        close = close[np.argsort(-true[close])][:8]
        true[close] = precise_residuals(kernel, X[close], points)
    return true


def check_certified(kernel: str, X: np.ndarray, est, tol: float, rows=None) -> dict:
    """Every guarantee of a returned fit, against references computed another way
    (``rows``: the rows whose residuals are checked, every one by default; a linear kernel's
    80-digit references take at most 40 of them, the largest residual's row first)."""
    core = est.embedding_estimator_ if kernel == "mds" else est
    d = core.spectral_map_.dictionary
    out = {"m": d.size, "max_residual": core.max_residual_}
    if d.L is not None:  # the exact path has no factor: every row is a dictionary point
        # kernels polynomial in the rows (linear, polynomial): 80 digits, since their bounds
        # go far below what long double resolves (rows in the span: 0)
        rational = d.kernel.name in ("linear", "polynomial")
        R = X if rows is None else X[rows]
        if rational and len(R) > 40:
            R = np.vstack([X[core.max_residual_row_:core.max_residual_row_ + 1],
                           R[:: -(-len(R) // 39)]])
        true = (exact_residuals(d.kernel, R, d.points) if rational
                else exceeds_bound(d.kernel, R, d.points, core.max_residual_))
        out["true_max"] = float(true.max())
        assert core.max_residual_ >= true.max(), (core.max_residual_, true.max())
        if core.dictionary_size is None and core.scan == "full" and tol > 0:
            assert core.max_residual_ <= tol
    ref, allowance = reference_eigenvalues(d.kernel, X, core.eigenvalues_.shape[0])
    lo, hi = core.eigenvalue_interval_[:, 0], core.eigenvalue_interval_[:, 1]
    out["below"] = float(np.max(lo - ref))
    out["above"] = float(np.max(ref - hi))
    assert np.all(ref >= lo - allowance), (ref - lo).min()
    assert np.all(ref <= hi + allowance), (hi - ref).min()
    lam = core.eigenvalues_
    assert np.all(hi >= lam + core.eigenvalue_error_bound_ - 4 * np.finfo(float).eps * np.abs(lam))
    return out


def _case(dataset_name, kernel, offset, tol):
    X = dataset(dataset_name) + offset
    est, used, _ = fit_or_follow_advice(kernel, X, tol)
    check_certified(kernel, X, est, used)


def _grid():
    """Every case; one in seven runs in CI (every pair of kernel, offset and tol is among
    them), the rest are marked slow (``-m slow``; all of them: the grid benchmark)."""
    cases = []
    for i, (ds, kernel, offset, tol) in enumerate(
            (ds, k, o, t) for ds in DATASETS for k in KERNELS for o in OFFSETS for t in TOLS):
        marks = () if i % 7 == 0 else (pytest.mark.slow,)
        cases.append(pytest.param(ds, kernel, offset, tol, marks=marks,
                                  id=f"{ds}-{kernel}-{offset:g}-{tol:g}"))
    return cases


@pytest.mark.parametrize("dataset_name, kernel, offset, tol", _grid())
def test_every_fit_is_certified_or_refuses_with_advice_that_works(dataset_name, kernel, offset, tol):
    _case(dataset_name, kernel, offset, tol)


@pytest.mark.parametrize("kernel", ["rbf-0.5", "linear"])
@pytest.mark.parametrize("tol", [1e-6, 1e-10])
def test_a_constant_column_changes_nothing_the_kernel_sees(kernel, tol):
    """A constant column of 1e4 (a year, an ID) leaves the rbf Gram matrix and the
    linear kernel's centred one as they are: the same certified spectrum."""
    X = make_s_curve(N, random_state=1)[0]
    Xc = np.column_stack([X, np.full(len(X), 1e4)])
    a, tol_a, _ = fit_or_follow_advice(kernel, X, tol)
    b, tol_b, _ = fit_or_follow_advice(kernel, Xc, tol)
    check_certified(kernel, X, a, tol_a)
    check_certified(kernel, Xc, b, tol_b)
    if tol_a == tol_b:
        ia, ib = a.eigenvalue_interval_, b.eigenvalue_interval_
        # both intervals hold the same exact eigenvalues: they overlap
        assert np.all(np.maximum(ia[:, 0], ib[:, 0]) <= np.minimum(ia[:, 1], ib[:, 1]) * (1 + 1e-12))


def test_the_audits_cases_are_certified_or_refused():
    """The outside audit's silent cases: circles moved by 1e4 at tol 1e-6 (0.8% off,
    exit 0), by 1e5 at the advised tol 1.4e-4 (3.7e-4 off), centred at tol 1e-12
    (199 rows beyond tol): each is now right or refused with advice that works."""
    X = make_circles(1000, factor=0.3, noise=0.05, random_state=0)[0]
    for offset, tol, gamma in [(1e4, 1e-6, 0.5), (1e5, 1.4e-4, 0.5), (0.0, 1e-12, None),
                               (10.0, 1e-10, 0.5), (500.0, 1e-10, 0.5)]:
        kernel = "rbf-median" if gamma is None else "rbf-0.5"
        est, used, _ = fit_or_follow_advice(kernel, X + offset, tol)
        check_certified(kernel, X + offset, est, used)


# --------------------------------------------------------------------------- #
# the pieces, against exact arithmetic
# --------------------------------------------------------------------------- #
def test_the_factor_product_is_formed_without_rounding():
    from ooc_spectral.core.rounding import exact_gram

    rng = np.random.default_rng(1)
    m = 10
    L = np.tril(rng.standard_normal((m, m)) * np.exp2(rng.integers(-30, 5, (m, m))))
    hi, lo, neglected = exact_gram(L)
    for i in range(m):
        for j in range(m):
            exact = sum(Fraction(L[i, k]) * Fraction(L[j, k]) for k in range(m))
            assert abs(float(exact - (Fraction(hi[i, j]) + Fraction(lo[i, j])))) <= neglected
    # rows from an offset: the same rows of the whole product
    hi2, lo2, _ = exact_gram(L, start=6)
    np.testing.assert_array_equal(hi2 + lo2, (hi + lo)[6:])


def test_the_measured_backward_error_bounds_the_exact_one():
    from ooc_spectral.core.rounding import factor_error, inverse_row_sums

    X = make_circles(600, factor=0.3, noise=0.05, random_state=0)[0]
    est = GreedySpectralEmbedding(n_components=4, gamma=0.5, tol=1e-6, random_state=0).fit(X)
    d = est.spectral_map_.dictionary
    L = d.L.astype(LD)
    exact = np.abs(L @ L.T - kernel_matrix(d.kernel, d.points, d.points)).max(axis=1).astype(float)
    theta = factor_error(d.kernel, d.points, d.L)
    assert np.all(theta >= exact) and np.all(theta <= 4 * exact + 1e-17)
    inv = forward(L, np.eye(d.size, dtype=LD))
    sums = np.abs(inv).sum(axis=1).astype(float)
    bound = inverse_row_sums(d.L)
    assert np.all(bound >= sums) and np.all(bound <= 1.01 * sums)


@pytest.mark.parametrize("offset", [0.0, 1e3, 1e6])
@pytest.mark.parametrize("name", ["rbf", "laplacian", "linear", "polynomial", "cosine"])
def test_kernel_entry_errors_bound_the_fast_evaluation(name, offset):
    from ooc_spectral.core.kernel_choice import data_center, make_kernel
    from ooc_spectral.core.rounding import entry_error

    rng = np.random.default_rng(2)
    X = rng.standard_normal((200, 5)) + offset
    center = data_center(X[:50]) if name in ("rbf", "linear") else None
    kernel = make_kernel(name, gamma=0.3, degree=3 if name == "polynomial" else 1, coef0=1.0,
                         center=center)
    if name == "polynomial":
        X = X - offset  # a polynomial kernel far from the origin is huge, not imprecise
    D, R = X[:40], X[40:]
    K = kernel.pairwise(R, D, kernel.aux(R), kernel.aux(D))
    exact = kernel_matrix(kernel, R, D)
    actual = np.abs(K - exact).max(axis=1).astype(float)
    c = np.zeros(X.shape[1]) if center is None else center
    radius = float(np.sqrt(((D - c) ** 2).sum(axis=1)).max()) * (1 + 1e-15)
    kx = kernel.diag(R, kernel.aux(R))
    eta = entry_error(kernel, R, kernel.aux(R), kx, radius, float(np.max(np.abs(kernel.diag(D)))))
    assert np.all(eta >= actual)


@pytest.mark.parametrize("offset", [1e6, 1e10, 1.7e12])
def test_the_degree_one_kernels_entry_error_bounds_the_moved_rows_not_the_offset(offset):
    """The degree-1 polynomial kernel (MetricMDS's) moves rows by a centre; its entry error
    is bounded from the moved rows, tight enough to certify rows 1.7e12 from the origin."""
    from ooc_spectral.core.kernel_choice import data_center, make_kernel
    from ooc_spectral.core.rounding import entry_error

    X = np.random.default_rng(4).standard_normal((200, 3)) * [2.0, 1.0, 0.5] + offset
    kernel = make_kernel("polynomial", gamma=0.3, degree=1, coef0=1.0, center=data_center(X[:50]))
    D, R = X[:40], X[40:]
    actual = np.abs(kernel.pairwise(R, D) - kernel_matrix(kernel, R, D)).max(axis=1).astype(float)
    Dm = D - np.asarray(kernel.center)
    radius = float(np.sqrt((Dm ** 2).sum(axis=1)).max()) * (1 + 1e-15)
    kx = kernel.diag(R)
    eta = entry_error(kernel, R, None, kx, radius, float(np.max(np.abs(kernel.diag(D)))))
    assert np.all(eta >= actual)
    assert eta.max() < 1e-12  # of the moved rows' scale, not the offset's (1e-3 before)


def test_the_centre_makes_the_gaussian_kernel_translation_invariant():
    """Rows moved by 1e6 give the unmoved rows' kernel values to rounding of the data's
    own extent, where the expanded square of uncentred rows loses ~1e-4."""
    from ooc_spectral.core.kernel_choice import data_center, make_kernel

    X = make_circles(200, factor=0.3, noise=0.05, random_state=0)[0]
    ref = make_kernel("rbf", gamma=0.5)(X)
    Y = X + 1e6
    moved = make_kernel("rbf", gamma=0.5, center=data_center(Y))(Y)
    plain = make_kernel("rbf", gamma=0.5)(Y)
    assert np.abs(moved - ref).max() < 1e-9
    assert np.abs(plain - ref).max() > 1e-6  # what the centre prevents


def test_tol_zero_is_exact_or_certified_never_certified_by_the_cancellation_it_bounds():
    """tol=0 skipped every row whose computed residual was below the pivot floor, and the
    certificate was capped at tol: on 800 rows of 1-D normal data max_residual_ was 5.6e-14
    and eigenvalue_error_bound_ 0 while a row was at squared distance 0.47 (60-digit
    mpmath), the embedding 3.7% off KernelPCA and Laplacian eigenmaps 31% off, exit 0
    (an outside audit). A row now counts as in the span at tol 0 only when certified there,
    rounding included: otherwise kernel PCA solves the exact problem tol 0 asks for, and
    the divisive normalization refuses with advice that works."""
    from sklearn.decomposition import KernelPCA

    from ooc_spectral.exceptions import DictionaryWarning
    from ooc_spectral.manifold import LaplacianEigenmaps

    X = np.random.default_rng(801).normal(size=(800, 1))
    with pytest.warns(DictionaryWarning, match=r"tol=0 asks for every direction.*800 x 800"):
        est = GreedySpectralEmbedding(n_components=3, tol=0, random_state=0).fit(X)
    ref = KernelPCA(3, kernel="rbf", gamma=est.gamma_, eigen_solver="dense").fit(X)
    R = ref.transform(X)
    E = est.embedding_ * np.sign(np.sum(est.embedding_ * R, axis=0))
    assert np.abs(E - R).max() <= 1e-10 * np.abs(R).max()
    check_certified("rbf-median", X, est, 0.0)
    # the divisive normalization too solves the exact problem where it is at hand: the
    # Laplacian eigenmaps of the full Gram matrix, D^-1/2 v for the unit eigenvectors v of
    # D^-1/2 K D^-1/2 (the first, trivial one dropped)
    with pytest.warns(DictionaryWarning, match=r"tol=0 asks for every direction.*800 x 800"):
        le = LaplacianEigenmaps(2, tol=0, random_state=0).fit(X)
    K = np.exp(-le.gamma_ * (X - X.T) ** 2)
    deg = K.sum(axis=1)
    vals, V = np.linalg.eigh(K / np.sqrt(np.outer(deg, deg)))
    F = V[:, ::-1][:, 1:3] / np.sqrt(deg)[:, None]
    G = le.embedding_ * np.sign(np.sum(le.embedding_ * F, axis=0))
    assert np.abs(G - F).max() <= 1e-8 * np.abs(F).max()
    np.testing.assert_allclose(le.eigenvalues_, vals[::-1][1:3], rtol=1e-10)
    assert le.volume_ == pytest.approx(deg.sum(), rel=1e-12)
    # where it is not (more rows than max_dictionary_size), a refusal with advice that works
    with pytest.raises(NumericalBreakdownError, match=r"tol=0 asks for every direction") as info:
        LaplacianEigenmaps(2, tol=0, random_state=0, max_dictionary_size=799).fit(X)
    advice = info.value.suggested_tol
    assert advice > 0 and f"Use tol >= {advice:.2g}" in str(info.value)
    le = LaplacianEigenmaps(2, tol=advice, random_state=0, max_dictionary_size=799).fit(X)
    d = le.embedding_estimator_.spectral_map_.dictionary
    true = true_residuals(d.kernel, X, d.points)
    assert true.max() <= le.embedding_estimator_.max_residual_ <= advice


@pytest.mark.parametrize("offset", [0.0, 1e6, 1e8, 1.7e12])
def test_tol_zero_keeps_rows_in_the_exact_span_out_with_an_honest_certificate(offset):
    """MetricMDS runs at tol 0: the rows of 3-D data are in the span of 4 of them, which
    float64 certifies to the resolution of its values (about 1e-13 of k(x, x) at the
    origin, 2e-6 at 1e8 from it). The certificate is that bound, not 0, and holds. At
    1.7e12 (epoch milliseconds) the degree-1 kernel's rounding bound took the rows'
    uncentred norms and MetricMDS was refused (an outside audit); it bounds the moved rows."""
    from sklearn.datasets import make_s_curve

    X = make_s_curve(1500, random_state=0)[0] + offset
    mds = MetricMDS(n_components=2, random_state=0).fit(X)
    core = mds.embedding_estimator_
    assert core.spectral_map_.dictionary.size == 4  # the greedy path, not the exact one
    check_certified("mds", X, mds, 0.0)
    assert core.max_residual_ > 0
    # duplicated rows at tol 0: the six distinct ones, certified within rounding
    dup = np.repeat(np.random.default_rng(0).normal(size=(6, 3)), 50, axis=0) + offset
    est = GreedySpectralEmbedding(n_components=3, tol=0, gamma=0.5, random_state=0).fit(dup)
    assert est.spectral_map_.dictionary.size == 6
    check_certified("rbf-0.5", dup, est, 0.0)


def test_an_interval_float64_cannot_make_finite_is_refused_not_returned(monkeypatch):
    """Where the factor's rounding swamps the eigenvalues the interval's ends are not
    finite; the fit refuses (the README's promise) with a tol to use, instead of returning
    eigenvalue_interval_ = [-inf, inf]."""
    from ooc_spectral.pipeline import certification

    X = make_moons(N, noise=0.05, random_state=0)[0]
    swamped = lambda *a, **k: (np.full(2, np.inf), np.full(2, np.inf))  # noqa: E731
    monkeypatch.setattr(certification, "spectrum_allowance", swamped)
    with pytest.raises(NumericalBreakdownError, match=r"eigenvalues cannot be certified.*Use tol >="):
        # more rows than max_dictionary_size: the exact problem is not at hand
        GreedySpectralEmbedding(n_components=2, gamma=0.5, tol=1e-6, random_state=0,
                                max_dictionary_size=N - 1).fit(X)


@pytest.mark.parametrize("kernel", ["rbf", "laplacian", "linear", "polynomial", "cosine"])
def test_every_kernel_at_its_defaults_and_tol_zero_is_certified_or_refused_with_advice(kernel):
    """tol 0 with each kernel's other defaults, on data 10 from the origin: the exact path,
    a certificate that holds against long-double references, or a refusal whose advice,
    followed, gives one."""
    X = make_moons(N, noise=0.05, random_state=0)[0] + 10.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            est, used = GreedySpectralEmbedding(kernel=kernel, tol=0, random_state=0).fit(X), 0.0
        except NumericalBreakdownError as err:
            used = float(re.search(r"Use tol >= ([0-9.e+-]+)", str(err)).group(1))
            est = GreedySpectralEmbedding(kernel=kernel, tol=used, random_state=0).fit(X)
    check_certified(kernel, X, est, used)
