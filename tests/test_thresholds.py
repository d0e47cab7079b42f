"""Each run-time check and bound at its value.

A check whose tolerance were 100x looser (or tighter) than its derivation would still pass
tests that corrupt a statistic by a lot; these put the corruption just past each threshold
(it raises) and just inside (it does not), with the thresholds written out from their
derivations in ``docs/user_guide/certificate.md``:

- ``check_spectrum``: the trace against the rows' squared norms (``2 gamma_{2m+2}`` of the
  scale), no eigenvalue below ``-(tau_C + 2 (m + 1) u lambda_max)``, none above
  ``sum k(x, x)`` plus its rounding;
- ``check_certificate``: a row beyond ``tol`` by more than the residuals' rounding;
- ``eigenvalue_error_bound_``: the sum of every row's certified residual, recomputed here
  from the fitted dictionary, and at least the exact residuals' sum (extended precision);
- Algorithm 2: the tol it returns holds for every sampled row in extended precision;
- ``transform`` by ``gemm`` and by ``trsm`` agree on held-out rows;
- non-positive degrees raise (divisive normalization, at fit and transform time).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
from sklearn.datasets import make_circles, make_moons

from ooc_spectral import DictionaryError, GreedySpectralEmbedding
from ooc_spectral.exceptions import DictionaryWarning, NumericalBreakdownError
from ooc_spectral.core.checks import check_certificate
from ooc_spectral.core.eigensolve import accumulation_error, check_spectrum
from ooc_spectral.core.kernels import RBFKernel
from ooc_spectral.core.rounding import U, gamma
from ooc_spectral.core.statistics import Certificate, Moments, RowSums

JUST = 0.02  # "just": 2% of the allowance either side of the threshold


def _moments(C: np.ndarray, sq: float, sum_kx: float, n: int = 1000) -> Moments:
    m = C.shape[0]
    sums = RowSums(sum_kx=sum_kx, max_kx=1.0, sum_dhat=0.0, sum_sq=sum_kx, certified=True)
    return Moments(n, np.zeros(m), C, sq, sums, Certificate(0.0, 0))


def _spectrum(values: np.ndarray, seed: int = 0) -> np.ndarray:
    m = len(values)
    Q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((m, m)))
    return (Q * values) @ Q.T


def test_the_trace_check_at_its_value():
    m = 40
    values = np.linspace(0.01, 3.0, m)
    C = _spectrum(values)
    trace = float(np.trace(C))
    allowed = 2 * gamma(2 * m + 2)
    for f, raises in ((1 - JUST, False), (1 + JUST, True)):
        # sq = trace + d with d = f * allowed * max(sq, trace) (the check's own scale)
        d = f * allowed * trace / (1 - f * allowed)
        mom = _moments(C, trace + d, sum_kx=10 * trace)
        if raises:
            with pytest.raises(NumericalBreakdownError, match="trace"):
                check_spectrum(C, np.sort(values), mom)
        else:
            check_spectrum(C, np.sort(values), mom)


def test_the_gram_check_at_its_value():
    m, n = 40, 1000
    values = np.linspace(0.0, 3.0, m)
    sum_kx = 500.0
    tau_C = accumulation_error(_moments(np.eye(m), 0.0, sum_kx, n).sums, n)
    eig_err = 2 * (m + 1) * U * 3.0
    for f, raises in ((1 - JUST, False), (1 + JUST, True)):
        vals = values.copy()
        vals[0] = -f * (tau_C + eig_err)
        C = np.diag(vals)
        mom = _moments(C, float(np.trace(C)), sum_kx, n)
        if raises:
            with pytest.raises(NumericalBreakdownError, match="a Gram matrix has none"):
                check_spectrum(C, vals, mom)
        else:
            check_spectrum(C, vals, mom)


def test_the_largest_eigenvalue_check_at_its_value():
    m, n = 40, 1000
    sum_kx = 7.0
    tau_C = accumulation_error(_moments(np.eye(m), 0.0, sum_kx, n).sums, n)
    # the allowance above sum k(x, x) at a top eigenvalue h: g sum_kx + tau_C + 2 (m + 1) u h
    h0 = sum_kx
    allowance = gamma(n + 2) * sum_kx + tau_C + 2 * (m + 1) * U * h0
    for f, raises in ((1 - JUST, False), (1 + JUST, True)):
        vals = np.zeros(m)
        vals[-1] = sum_kx + f * allowance
        C = np.diag(vals)
        mom = _moments(C, float(np.trace(C)), sum_kx, n)
        if raises:
            with pytest.raises(NumericalBreakdownError, match="exceeds sum k"):
                check_spectrum(C, vals, mom)
        else:
            check_spectrum(C, vals, mom)


@pytest.fixture(scope="module")
def fitted():
    X = make_circles(600, factor=0.3, noise=0.05, random_state=0)[0]
    est = GreedySpectralEmbedding(n_components=4, gamma=2.0, tol=1e-6, random_state=0).fit(X)
    return X, est


def test_the_certificate_check_at_its_value(fitted):
    X, est = fitted
    d = est.spectral_map_.dictionary
    tol = 1e-6
    m = d.size
    kmax = float(np.max(np.abs(d.kernel.diag(d.points, d.aux))))
    rounding = 3e-9
    sums = RowSums(1.0, kmax, 0.0, 1.0, 0.0, rounding, 0, True)
    from ooc_spectral.core.model import PIVOT_FLOOR

    slack = (PIVOT_FLOOR + 16.0 * (m + 2) * np.finfo(float).eps) * kmax + rounding
    check_certificate(Certificate(tol + (1 - JUST) * slack, 5), tol, m, d.kernel, d, kmax, sums)
    with pytest.raises(NumericalBreakdownError, match="row 5 may be at squared distance") as info:
        check_certificate(Certificate(tol + (1 + JUST) * slack, 5), tol, m, d.kernel, d, kmax,
                          sums)
    assert "Use tol >= " in str(info.value) and info.value.suggested_tol > tol


def test_the_eigenvalue_error_bound_is_its_definition(fitted):
    """b = sum over rows of min(dhat + E, tol) (the certified residuals, capped at tol for a
    complete scan), recomputed here row block by row block from the fitted dictionary, and
    at least the sum of the exact residuals."""
    from extended_precision import true_residuals

    from ooc_spectral.core.rounding import with_rounding
    from ooc_spectral.core.model import Dictionary

    X, est = fitted
    d = est.spectral_map_.dictionary
    if d.rounding is None:
        d = with_rounding(d, target=est.tol_, cap=est.tol_)
    total = 0.0
    for start in range(0, len(X), 128):
        B = X[start:start + 128]
        aux = d.kernel.aux(B)
        K, kx = d.kernel_block(B, aux)
        Z = d.solve(K)
        sq = Dictionary.row_norms(Z)
        dhat = kx - sq
        bounds, _, E, _ = d.rounding.certify(d, B, aux, kx, sq, dhat,
                                             d.rounding.cheap_coefficients(Z),
                                             lambda rows, Z=Z: Z[rows])
        assert np.all(E > 0)
        total += float(np.maximum(bounds, 0.0).sum())
    assert est.eigenvalue_error_bound_ == pytest.approx(total, rel=1e-9, abs=0)
    exact = np.maximum(true_residuals(est.kernel_, X, est.dictionary_), 0.0)
    assert exact.sum() <= est.eigenvalue_error_bound_
    assert exact.max() <= est.max_residual_ <= est.tol_


def test_algorithm2_tol_holds_for_every_sampled_row_in_extended_precision():
    from extended_precision import true_residuals

    from ooc_spectral.core.scan.search import search_dictionary

    X = make_moons(800, noise=0.05, random_state=1)[0]
    order = np.random.default_rng(0).permutation(len(X))
    k = RBFKernel(3.0)
    for m in (5, 30, 90):
        st, tol = search_dictionary(k, X[order], order, m)
        assert st.size == m
        exact = true_residuals(k, X, st.points)
        assert exact.max() <= tol, (m, exact.max(), tol)


@pytest.mark.parametrize("normalization", ["additive", "divisive"])
def test_gemm_and_trsm_transforms_agree_on_held_out_rows(normalization):
    X = make_moons(1500, noise=0.05, random_state=2)[0]
    train, held = X[:1000], X[1000:] + 0.01
    fits = {}
    for solver in ("gemm", "trsm"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = GreedySpectralEmbedding(n_components=3, gamma=1.0, tol=1e-6, solver=solver,
                                          normalization=normalization, random_state=0)
            fits[solver] = est.fit(train)
    np.testing.assert_array_equal(fits["gemm"].dictionary_indices_, fits["trsm"].dictionary_indices_)
    a, b = fits["gemm"].transform(held), fits["trsm"].transform(held)
    # both map the same rows through L^-T (folded or solved): equal to the solve's rounding
    scale = np.abs(a).max()
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-8 * scale)


def test_non_positive_degrees_raise():
    X = make_moons(400, noise=0.05, random_state=3)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = GreedySpectralEmbedding(n_components=2, gamma=1.0, tol=1e-4,
                                      normalization="divisive", random_state=0).fit(X)
    far = X[:3] + 1e3  # k(D, x) underflows to 0: degree 0, not positive
    for solver in ("gemm", "trsm"):
        smap = est.spectral_map_
        moved = dataclasses.replace(smap, dictionary=dataclasses.replace(smap.dictionary,
                                                                          solver=solver))
        with pytest.raises(DictionaryError, match="not positive"):
            moved.embed(far)
    from ooc_spectral.core.pass2 import check_degrees
    from ooc_spectral.core.statistics import Degrees

    fields = {f.name for f in dataclasses.fields(Degrees)}
    assert {"min_degree", "argmin"} <= fields
    for value, raises in ((0.0, True), (-1e-300, True), (1e-300, False)):
        stats = Degrees(3, np.eye(2), value, 7, Certificate(0.0, 0), None)
        if raises:
            with pytest.raises(DictionaryError, match="row 7"):
                check_degrees(stats)
        else:
            check_degrees(stats)


def test_tol_zero_capped_below_the_rows_is_refused_with_the_advice_that_works(monkeypatch):
    """tol=0 keeps every direction down to the pivot floor: the dictionary heads for every
    row. With ``max_dictionary_size`` one below the rows the exact problem is not taken and
    the scan stops early; its one advice is the one that works (a guessed larger tol headed
    for every row again: 1e-11, then 1e-10, ...), and following it gives the exact
    eigenvalues of D^-1/2 K D^-1/2 on the full Gram matrix. The refusal is told by the
    exact path's float64 scan of the first rows, before any double-double work (which took
    the refusal to 41-82 s, against seconds for the exact fit): none is allowed here."""
    import re

    from ooc_spectral.core.extended import ExtendedGram

    def no_double_double(*args, **kwargs):
        raise AssertionError("the refusal reached the double-double scan")

    from sklearn.datasets import make_swiss_roll
    from sklearn.metrics.pairwise import rbf_kernel

    from ooc_spectral.exceptions import DictionarySizeError

    X = make_swiss_roll(1500, random_state=0)[0]
    params = dict(n_components=3, gamma=0.05, tol=0.0, normalization="divisive", random_state=0)
    with monkeypatch.context() as patch, pytest.raises(DictionarySizeError) as info:
        patch.setattr(ExtendedGram, "grow", no_double_double)
        patch.setattr(ExtendedGram, "bounds", no_double_double)
        GreedySpectralEmbedding(max_dictionary_size=1499, **params).fit(X)
    message = str(info.value)
    assert "try tol=" not in message and "try gamma=" not in message
    advised = re.search(r"raise max_dictionary_size to (\d+) and it is solved exactly", message)
    assert advised is not None, message
    with pytest.warns(DictionaryWarning, match="no row is near the span"):
        est = GreedySpectralEmbedding(max_dictionary_size=int(advised.group(1)), **params).fit(X)
    K = rbf_kernel(X, gamma=0.05)
    d = K.sum(axis=1)
    reference = np.linalg.eigvalsh(K / np.sqrt(np.outer(d, d)))[::-1]
    np.testing.assert_allclose(est.eigenvalues_, reference[1:4], rtol=1e-10)  # 1: the constant


def test_kernels_with_negative_values_are_named_not_blamed_on_tol():
    """An indefinite polynomial kernel (coef0 < 0) failed in the eigensolve with advice to
    report a bug; linear and cosine kernels with the divisive normalization were told to
    lower tol, which cannot help: their exact degrees are negative. Each is named, and the
    advice works (found by an outside audit)."""
    from ooc_spectral import InvalidParameterError

    X = np.random.default_rng(0).normal(size=(300, 3))
    with pytest.raises(InvalidParameterError, match=r"coef0=-1.0.*use coef0 >= 0"):
        GreedySpectralEmbedding(kernel="poly", coef0=-1.0).fit(X)
    # (a few scan orders in a hundred are refused at this tol, with advice that works:
    # the degree-3 feature space has 20 dimensions, and its factor is ill-conditioned)
    est = GreedySpectralEmbedding(kernel="poly", coef0=1.0, gamma=0.3, tol=1e-6,
                                  random_state=0).fit(X)
    assert est.max_residual_ <= 1e-6
    refused = GreedySpectralEmbedding(kernel="poly", coef0=1.0, gamma=0.3, tol=1e-6,
                                      random_state=50, max_dictionary_size=299)  # greedy
    with pytest.raises(NumericalBreakdownError, match="Use tol >= ") as info:
        refused.fit(X)
    advised = refused.set_params(tol=info.value.suggested_tol).fit(X)
    assert advised.max_residual_ <= info.value.suggested_tol
    for kernel in ("linear", "cosine"):
        with pytest.raises(DictionaryError, match="negative whatever tol.*kernel='rbf'"):
            GreedySpectralEmbedding(kernel=kernel, normalization="divisive").fit(X)
    # the advice: rbf
    GreedySpectralEmbedding(kernel="rbf", normalization="divisive", tol=1e-2).fit(X)
    # the same kernels on data with non-negative kernel values are fitted
    P = np.abs(X)
    GreedySpectralEmbedding(kernel="linear", normalization="divisive").fit(P)


def test_a_model_saved_before_the_coef0_check_still_loads_and_transforms(tmp_path, monkeypatch):
    """The coef0 >= 0 check guards new fits only: a model fitted before it existed (this
    one fits, on non-negative data) loads and transforms as it did."""
    from ooc_spectral import InvalidParameterError
    from ooc_spectral.core.config import FitConfig

    P = np.abs(np.random.default_rng(0).normal(size=(300, 3)))
    params = dict(kernel="polynomial", degree=2, gamma=1.0, coef0=-0.1, tol=1e-3,
                  random_state=0)
    with pytest.raises(InvalidParameterError, match="coef0"):
        GreedySpectralEmbedding(**params).fit(P)
    with monkeypatch.context() as m:  # as before the check
        m.setattr(FitConfig, "_check_new_fit", lambda self: None)
        est = GreedySpectralEmbedding(**params).fit(P)
        est.save(tmp_path / "m")
    back = GreedySpectralEmbedding.load(tmp_path / "m")
    np.testing.assert_array_equal(back.transform(P), est.embedding_)


def test_negative_approximate_degrees_of_a_non_negative_kernel_blame_the_approximation():
    """The kernel is blamed for a negative degree only where it is negative between the
    dictionary's points and the row: on non-negative rows the linear kernel is not, and a
    negative degree there comes from a dictionary too small (an outside audit:
    dictionary_size=2 was told 'whatever tol', where dictionary_size=3 fits)."""
    from ooc_spectral.core.pass2 import check_degrees
    from ooc_spectral.core.statistics import Degrees
    from ooc_spectral.pipeline.fit import _negative_on

    X = np.random.default_rng(0).normal(size=(300, 3))
    P = np.abs(X) + 0.1
    d = GreedySpectralEmbedding(kernel="linear", normalization="divisive",
                                random_state=0).fit(P).spectral_map_.dictionary
    assert not _negative_on(d, P[:1])
    assert _negative_on(d, -P[:1])  # a row at an obtuse angle to the dictionary
    stats = Degrees(3, np.eye(2), -1.0, 7, Certificate(0.0, 0), None)
    with pytest.raises(DictionaryError, match="loose tol") as info:
        check_degrees(stats, None)
    assert "whatever tol" not in str(info.value)


def test_n_components_none_keeps_only_eigenvalues_certified_above_zero():
    """n_components=None kept an eigenvalue of 7.7e-23 whose interval was [-7e-11, 5.5e-10]
    (cosine rows 1e6 from the origin): a coordinate of noise, with no error (an outside
    audit). It keeps the eigenvalues whose interval lies above 0; with none, the error
    names a tol computed from the interval, and following it gives a certified spectrum."""
    import re

    from ooc_spectral.exceptions import DictionaryError

    A = np.random.default_rng(6).normal(size=(400, 3))
    X = np.c_[A, np.full(400, 5.0)] + 1e6
    kw = dict(n_components=None, kernel="cosine", random_state=0)
    with pytest.raises(DictionaryError, match=r"no eigenvalue .* certified above 0") as info:
        GreedySpectralEmbedding(tol=1e-6, **kw).fit(X)
    advice = float(re.search(r"Use tol <= ([0-9.e+-]+)", str(info.value)).group(1))
    est = GreedySpectralEmbedding(tol=advice, **kw).fit(X)
    assert est.eigenvalues_.shape[0] >= 1 and np.all(est.eigenvalue_interval_[:, 0] > 0)
    # where every eigenvalue is certified, as many as KernelPCA(None) keeps
    from sklearn.decomposition import KernelPCA

    Y = np.c_[A, A[:, 0] + A[:, 1]]
    ours = GreedySpectralEmbedding(n_components=None, kernel="linear", tol=1e-6).fit(Y)
    ref = KernelPCA(None, kernel="linear").fit(Y)
    assert ours.eigenvalues_.shape == ref.eigenvalues_.shape
    np.testing.assert_allclose(ours.eigenvalues_, ref.eigenvalues_, rtol=1e-10)
