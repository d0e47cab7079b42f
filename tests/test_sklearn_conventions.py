"""Issue 15, step 1: scikit-learn conventions of every public estimator.

NotFittedError is scikit-learn's; ``tol=None`` with ``dictionary_size``; feature-count
messages name the estimator that was called; every ``transform`` checks NaN/inf.
"""

import numpy as np
import pytest
import sklearn.exceptions

from ooc_spectral import GreedySpectralClustering, GreedySpectralEmbedding
from ooc_spectral.baselines import (
    ExactKernelEmbedding,
    GaussianProjectionEmbedding,
    NystromEmbedding,
)
from ooc_spectral.exceptions import InvalidInputError, NonFiniteInputError, NotFittedError
from ooc_spectral.manifold import (
    DiffusionMap,
    Isomap,
    LandmarkIsomap,
    LaplacianEigenmaps,
    LocallyLinearEmbedding,
    MetricMDS,
)

ESTIMATORS = [GreedySpectralEmbedding, GreedySpectralClustering, ExactKernelEmbedding,
              NystromEmbedding, GaussianProjectionEmbedding, LaplacianEigenmaps, DiffusionMap,
              MetricMDS, Isomap, LandmarkIsomap, LocallyLinearEmbedding]


def _data(n=120, d=3, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d))


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_not_fitted_error_is_sklearns(cls):
    est = cls()
    method = est.predict if hasattr(est, "predict") and not hasattr(est, "transform") \
        else est.transform
    with pytest.raises(sklearn.exceptions.NotFittedError) as info:
        method(_data(5))
    # ours, so also in the package's hierarchy
    assert isinstance(info.value, NotFittedError)
    assert cls.__name__ in str(info.value)


def test_tol_none_with_dictionary_size():
    X = _data(300)
    a = GreedySpectralEmbedding(tol=None, dictionary_size=37, random_state=0).fit(X)
    b = GreedySpectralEmbedding(dictionary_size=37, random_state=0).fit(X)
    assert len(a.dictionary_indices_) == 37
    np.testing.assert_array_equal(a.dictionary_indices_, b.dictionary_indices_)
    np.testing.assert_array_equal(a.embedding_, b.embedding_)
    # without dictionary_size, tol is still required
    with pytest.raises(ValueError, match="tol=None"):
        GreedySpectralEmbedding(tol=None).fit(X)


def test_clustering_feature_count_message_names_clustering():
    X = _data(150)
    est = GreedySpectralClustering(n_clusters=2, random_state=0).fit(X)
    with pytest.raises(InvalidInputError, match="but GreedySpectralClustering was fitted"):
        est.predict(_data(5, d=4))
    np.testing.assert_array_equal(est.predict(X), est.labels_)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_gaussian_projection_transform_checks_finite(bad):
    X = _data(150)
    est = GaussianProjectionEmbedding(random_state=0).fit(X)
    Y = X[:10].copy()
    Y[4, 2] = bad
    with pytest.raises(NonFiniteInputError, match="row 4, column 2") as info:
        est.transform(Y)
    assert info.value.row == 4


# ---------------------------------------------------------------------- #
# feature names and set_output (pandas) in a pipeline
# ---------------------------------------------------------------------- #
TRANSFORMERS = [c for c in ESTIMATORS if c is not GreedySpectralClustering]


@pytest.mark.parametrize("cls", TRANSFORMERS, ids=lambda c: c.__name__)
def test_pandas_output_in_pipeline(cls):
    import pandas as pd
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X = pd.DataFrame(_data(150), columns=["a", "b", "c"], index=np.arange(150) + 1000)
    params = {"random_state": 0} if "random_state" in cls().get_params() else {}
    if cls is GreedySpectralEmbedding:
        params["gamma"] = 0.05
    pipe = make_pipeline(StandardScaler(), cls(**params)).set_output(transform="pandas")
    out = pipe.fit_transform(X)
    names = [f"{cls.__name__.lower()}{i}" for i in range(2)]
    assert isinstance(out, pd.DataFrame)
    assert list(out.columns) == names
    assert list(out.index) == list(X.index)
    # the fitted attribute is still an array (set_output wraps only the return values)
    assert isinstance(pipe[-1].embedding_, np.ndarray)
    # the values are the plain-array pipeline's
    plain = make_pipeline(StandardScaler(), cls(**params)).fit_transform(X.to_numpy())
    np.testing.assert_allclose(out.to_numpy(), plain, rtol=1e-10, atol=1e-12)
    new = pipe.transform(X.iloc[:7])
    assert list(new.columns) == names and list(new.index) == list(X.index[:7])
    assert list(pipe.get_feature_names_out()) == names


def test_feature_names_in_recorded():
    import pandas as pd

    X = pd.DataFrame(_data(150), columns=["a", "b", "c"])
    est = GreedySpectralEmbedding(gamma=0.05, random_state=0).fit(X)
    assert list(est.feature_names_in_) == ["a", "b", "c"]
    est.fit(X.to_numpy())
    assert not hasattr(est, "feature_names_in_")


def test_get_feature_names_out_before_fit_is_not_fitted():
    with pytest.raises(sklearn.exceptions.NotFittedError):
        GreedySpectralEmbedding().get_feature_names_out()


# ---------------------------------------------------------------------- #
# input conversion: object arrays of numbers, sparse input densified block by block
# ---------------------------------------------------------------------- #
def _make(cls):
    params = {"random_state": 0} if "random_state" in cls().get_params() else {}
    if cls is GreedySpectralClustering:
        params["n_clusters"] = 2
    if cls in (GreedySpectralEmbedding, GreedySpectralClustering):
        params["gamma"] = 0.05
    return cls(**params)


def _out(est, X):
    return est.fit(X).labels_ if isinstance(est, GreedySpectralClustering) \
        else est.fit_transform(X)


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_object_array_of_numbers_is_converted(cls):
    X = _data(120)
    np.testing.assert_array_equal(_out(_make(cls), X.astype(object)), _out(_make(cls), X))


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_sparse_input_equals_dense(cls):
    # scipy.sparse and dask arrays of sparse chunks are densified block by block
    import dask.array as da
    import scipy.sparse as sp

    X = _data(120)
    X[np.abs(X) < 0.5] = 0.0
    dense = _out(_make(cls), X)
    S = sp.csr_matrix(X)
    np.testing.assert_array_equal(_out(_make(cls), S), dense)
    lazy = da.from_array(S, chunks=(60, 3), asarray=False)
    est = _make(cls)  # held: GaussianProjectionEmbedding's lazy output lives in its scratch
    np.testing.assert_allclose(np.asarray(_out(est, lazy)), dense, rtol=1e-10, atol=1e-12)


def test_object_array_of_strings_is_named():
    with pytest.raises(InvalidInputError, match="object array that does not convert"):
        GreedySpectralEmbedding().fit(np.array([["a", "b"], ["c", "d"]], dtype=object))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_gaussian_projection_fit_checks_finite(bad):
    X = _data(150)
    X[77, 1] = bad
    with pytest.raises(NonFiniteInputError, match="row 77, column 1"):
        GaussianProjectionEmbedding(gamma=0.5, random_state=0).fit(X)
