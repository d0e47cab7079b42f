"""KernelPCA's features (issue 15): n_components=None, the cosine and callable kernels,
inverse_transform (fit_inverse_transform, alpha), each against scikit-learn's KernelPCA."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest
from sklearn.datasets import make_circles, make_s_curve
from sklearn.decomposition import KernelPCA

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.exceptions import (DictionaryWarning, InvalidParameterError, ModelNotSavableError,
                                     NotFittedError)


@pytest.fixture(scope="module")
def circles():
    X, _ = make_circles(400, noise=0.05, factor=0.3, random_state=0)
    return X


def _same_up_to_sign(A, B, atol):
    """Columns of A and B equal up to each column's sign."""
    assert A.shape == B.shape
    signs = np.sign(np.sum(A * B, axis=0))
    np.testing.assert_allclose(A * signs, B, atol=atol, rtol=0)


def _exact_fit(X, **params):
    """A fit on the exact path (tol=0 keeps every direction: half the rows enter), its
    warning silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DictionaryWarning)
        return GreedySpectralEmbedding(tol=0.0, random_state=0, **params).fit(X)


# --------------------------------------------------------------------------- #
# n_components=None
# --------------------------------------------------------------------------- #
def test_n_components_none_keeps_every_direction_as_kernelpca(circles):
    # the degree-2 polynomial kernel on 2 features: a 6-dimensional feature space whose
    # centred Gram matrix has rank 5; KernelPCA(None) keeps exactly those 5
    ref = KernelPCA(None, kernel="poly", gamma=1.0, degree=2, coef0=1.0,
                    eigen_solver="dense").fit(circles)
    est = GreedySpectralEmbedding(None, kernel="polynomial", gamma=1.0, degree=2, coef0=1.0,
                                  tol=1e-10, random_state=0).fit(circles)
    assert ref.eigenvalues_.shape == (5,) and est.eigenvalues_.shape == (5,)
    assert est.get_feature_names_out().shape == (5,)
    np.testing.assert_allclose(est.eigenvalues_, ref.eigenvalues_, rtol=1e-9)
    _same_up_to_sign(est.embedding_, ref.transform(circles), atol=1e-8)


def test_n_components_none_exact_path_rbf_equals_kernelpca():
    # a small, well-spread rbf problem: every eigenvalue far above rounding
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    ref = KernelPCA(None, kernel="rbf", gamma=0.3, eigen_solver="dense").fit(X)
    est = _exact_fit(X, n_components=None, gamma=0.3)
    assert est.max_residual_ == 0.0  # the exact path
    assert est.eigenvalues_.shape == ref.eigenvalues_.shape
    np.testing.assert_allclose(est.eigenvalues_, ref.eigenvalues_, rtol=1e-9,
                               atol=1e-12 * ref.eigenvalues_[0])
    _same_up_to_sign(est.transform(X[:10])[:, :10], ref.transform(X[:10])[:, :10], atol=1e-8)


def test_n_components_none_divisive_is_the_leading_part_of_every_component(circles):
    full = GreedySpectralEmbedding(None, normalization="divisive", gamma=2.0, tol=1e-4,
                                   random_state=0).fit(circles)
    p = full.eigenvalues_.shape[0]
    assert 3 < p < full.dictionary_.shape[0]
    assert np.all(full.eigenvalues_ > 0)
    three = GreedySpectralEmbedding(3, normalization="divisive", gamma=2.0, tol=1e-4,
                                    random_state=0).fit(circles)
    np.testing.assert_allclose(full.eigenvalues_[:3], three.eigenvalues_, rtol=1e-10)
    _same_up_to_sign(full.embedding_[:, :3], three.embedding_, atol=1e-9)


def test_n_components_none_written_to_an_output(circles, tmp_path):
    est = GreedySpectralEmbedding(None, kernel="polynomial", gamma=1.0, degree=2, tol=1e-10,
                                  random_state=0)
    est.fit(circles, output=str(tmp_path / "emb.zarr"))
    assert est.embedding_.shape == (400, 5)
    np.testing.assert_allclose(np.asarray(est.embedding_), est.transform(circles), atol=1e-10)


# --------------------------------------------------------------------------- #
# cosine kernel
# --------------------------------------------------------------------------- #
def test_cosine_kernel_equals_kernelpca():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 6)) + 0.5
    X[7] = 0.0  # a zero row: k(0, y) = 0 as scikit-learn's cosine_similarity
    ref = KernelPCA(4, kernel="cosine", eigen_solver="dense").fit(X)
    est = GreedySpectralEmbedding(4, kernel="cosine", tol=1e-10, random_state=0).fit(X)
    assert est.dictionary_.shape[0] <= 8  # a 6-dimensional feature space
    np.testing.assert_allclose(est.eigenvalues_, ref.eigenvalues_, rtol=1e-9)
    _same_up_to_sign(est.embedding_, ref.transform(X), atol=1e-9)
    X_new = rng.normal(size=(20, 6))
    _same_up_to_sign(est.transform(X_new), ref.transform(X_new), atol=1e-9)
    # n_components=None: the 6 directions minus the one the centring removes... or all 6
    ref_all = KernelPCA(None, kernel="cosine", eigen_solver="dense").fit(X)
    est_all = GreedySpectralEmbedding(None, kernel="cosine", tol=1e-10, random_state=0).fit(X)
    np.testing.assert_allclose(est_all.eigenvalues_, ref_all.eigenvalues_, rtol=1e-9)


# --------------------------------------------------------------------------- #
# callable kernels
# --------------------------------------------------------------------------- #
def gauss(x, y, scale):
    """A user's kernel on two rows, as scikit-learn's callable kernels."""
    return float(np.exp(-np.sum((x - y) ** 2) / scale))


@pytest.fixture(scope="module")
def small_circles(circles):
    return circles[::2].copy()  # 200 rows: a callable costs one Python call per entry


@pytest.fixture(scope="module")
def callable_fit(small_circles):
    return GreedySpectralEmbedding(3, kernel=gauss, kernel_params={"scale": 0.5}, tol=1e-6,
                                   random_state=0).fit(small_circles)


def test_callable_kernel_equals_kernelpca(small_circles, callable_fit):
    X = small_circles
    ref = KernelPCA(3, kernel=gauss, kernel_params={"scale": 0.5}, eigen_solver="dense").fit(X)
    est = callable_fit
    assert est.dictionary_.shape[0] < 100 and est.gamma_ is None
    assert est.max_residual_ <= 1e-6
    # Weyl's interval around each exact eigenvalue
    assert np.all(ref.eigenvalues_ >= est.eigenvalues_ - 1e-9)
    assert np.all(ref.eigenvalues_ <= est.eigenvalues_ + est.eigenvalue_error_bound_ + 1e-9)
    _same_up_to_sign(est.transform(X[:30]), ref.transform(X[:30]), atol=1e-6)  # 3.4e-8 measured
    # with every direction kept (tol=0) half the rows enter: the exact path, to rounding
    with pytest.warns(DictionaryWarning, match="solved exactly"):
        exact = GreedySpectralEmbedding(3, kernel=gauss, kernel_params={"scale": 0.5}, tol=0.0,
                                        random_state=0).fit(X)
    _same_up_to_sign(exact.transform(X), ref.transform(X), atol=1e-12)
    np.testing.assert_allclose(exact.eigenvalues_, ref.eigenvalues_, rtol=1e-12)
    # the same numbers as the built-in rbf kernel with gamma = 1 / scale
    rbf = GreedySpectralEmbedding(3, gamma=2.0, tol=1e-6, random_state=0).fit(X)
    np.testing.assert_array_equal(est.dictionary_indices_, rbf.dictionary_indices_)
    np.testing.assert_allclose(est.eigenvalues_, rbf.eigenvalues_, rtol=1e-10)


def test_callable_kernel_on_a_local_cluster(small_circles, callable_fit, client):
    X = da.from_array(small_circles, chunks=50)
    scale = 0.5

    def local_gauss(x, y, s):  # defined here: travels to the workers by value
        return float(np.exp(-np.sum((x - y) ** 2) / s))

    est = GreedySpectralEmbedding(3, kernel=local_gauss, kernel_params={"s": scale}, tol=1e-6,
                                  random_state=0).fit(X)
    np.testing.assert_array_equal(est.dictionary_indices_, callable_fit.dictionary_indices_)
    np.testing.assert_allclose(est.eigenvalues_, callable_fit.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(est.embedding_), callable_fit.embedding_, atol=1e-10)


def test_saving_a_callable_kernel_is_refused(callable_fit, tmp_path):
    path = tmp_path / "model.zarr"
    with pytest.raises(ModelNotSavableError, match="callable.*cannot be saved without pickle"):
        callable_fit.save(path)
    assert not path.exists()  # nothing written


def test_kernel_params_need_a_callable(small_circles):
    with pytest.raises(InvalidParameterError, match="kernel_params is only used by a callable"):
        GreedySpectralEmbedding(kernel="rbf", kernel_params={"gamma": 1.0}).fit(small_circles)


# --------------------------------------------------------------------------- #
# inverse_transform
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("p", [2, 6])
def test_inverse_transform_equals_kernelpca_with_every_row_in_the_dictionary(p):
    X, _ = make_circles(150, noise=0.05, factor=0.3, random_state=1)
    ref = KernelPCA(p, kernel="rbf", gamma=20.0, eigen_solver="dense",
                    fit_inverse_transform=True, alpha=0.1).fit(X)
    with pytest.warns(DictionaryWarning, match="solved exactly"):
        est = GreedySpectralEmbedding(p, gamma=20.0, tol=1e-6, fit_inverse_transform=True,
                                      alpha=0.1, random_state=0).fit(X)
    assert est.dictionary_.shape[0] == 150  # the exact path: every row
    _same_up_to_sign(est.X_transformed_fit_, ref.X_transformed_fit_, atol=1e-10)
    np.testing.assert_allclose(est.dual_coef_, ref.dual_coef_, atol=1e-8)
    rng = np.random.default_rng(0)
    X_new = rng.uniform(-1, 1, size=(40, 2))
    np.testing.assert_allclose(est.inverse_transform(est.transform(X_new)),
                               ref.inverse_transform(ref.transform(X_new)), atol=1e-8)
    np.testing.assert_allclose(est.inverse_transform(est.embedding_),
                               ref.inverse_transform(ref.transform(X)), atol=1e-8)


@pytest.fixture(scope="module")
def s_curve_fit():
    X, _ = make_s_curve(1400, random_state=0)
    train, test = X[:1200], X[1200:]
    est = GreedySpectralEmbedding(10, gamma=0.5, dictionary_size=100, tol=None,
                                  fit_inverse_transform=True, alpha=1e-3,
                                  random_state=0).fit(train)
    return est, train, test


def test_inverse_transform_reconstructs_held_out_rows_of_a_manifold(s_curve_fit):
    est, train, test = s_curve_fit
    assert est.X_transformed_fit_.shape == (100, 10) and est.dual_coef_.shape == (100, 3)
    rec = est.inverse_transform(est.transform(test))
    rms = np.sqrt(np.mean(np.sum((test - train.mean(axis=0)) ** 2, axis=1)))
    err = np.sqrt(np.mean(np.sum((rec - test) ** 2, axis=1)))
    # 0.38% of the data's RMS radius with 100 of 1200 rows (KernelPCA on all 1200: 0.37%);
    # the mean alone is 100%
    assert err < 0.01 * rms
    # the pre-image map is the ridge solution on the statistics of every row: its objective
    # is the minimum, that of the same regression solved in memory (whose coefficients,
    # ill-conditioned, differ in the last digits)
    kern = est.kernel_.without_center()  # the pre-image's kernel, on embedding coordinates
    E, C = est.embedding_, est.X_transformed_fit_
    K, K_cc = kern(E, C), kern(C, C)

    def objective(B):
        return np.sum((train - K @ B) ** 2) + 1e-3 * np.trace(B.T @ K_cc @ B)

    B = np.linalg.solve(K.T @ K + 1e-3 * K_cc, K.T @ train)
    assert objective(est.dual_coef_) <= objective(B) * (1 + 1e-9)


def test_inverse_transform_lazy_input_persistence_and_errors(s_curve_fit, tmp_path):
    est, train, test = s_curve_fit
    E = est.transform(test)
    expected = est.inverse_transform(E)
    lazy = est.inverse_transform(da.from_array(E, chunks=70))
    assert isinstance(lazy, da.Array)
    np.testing.assert_allclose(lazy.compute(), expected, rtol=0, atol=1e-13)
    est.save(tmp_path / "m.zarr")
    back = GreedySpectralEmbedding.load(tmp_path / "m.zarr")
    assert back.alpha == 1e-3 and back.fit_inverse_transform
    np.testing.assert_array_equal(back.inverse_transform(E), expected)
    with pytest.raises(ValueError, match="3 columns, but the embedding .* has 10"):
        est.inverse_transform(test)
    bad = E.copy()
    bad[4, 1] = np.nan
    with pytest.raises(ValueError, match="row 4"):
        est.inverse_transform(bad)
    plain = GreedySpectralEmbedding(2, gamma=0.5, tol=1e-2, random_state=0).fit(train[:300])
    with pytest.raises(NotFittedError, match="fit_inverse_transform=True"):
        plain.inverse_transform(plain.embedding_)
    with pytest.raises(InvalidParameterError, match="normalization='additive'"):
        GreedySpectralEmbedding(normalization="divisive",
                                fit_inverse_transform=True).fit(train[:50])
