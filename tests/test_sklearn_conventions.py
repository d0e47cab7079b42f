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
