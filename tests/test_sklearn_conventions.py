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
    params = _params_for(cls)
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


def _params_for(cls):
    params = {"random_state": 0} if "random_state" in cls().get_params() else {}
    if cls in (GreedySpectralEmbedding, GreedySpectralClustering):
        params["gamma"] = 0.05
    return params


def _apply(est, X):
    return est.predict(X) if isinstance(est, GreedySpectralClustering) else est.transform(X)


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_feature_names_are_recorded_and_new_rows_checked_against_them(cls):
    """Columns are matched by position: a DataFrame whose columns are reordered or renamed
    would be embedded wrongly without a word (0.7 and 16.2 off for GreedySpectralEmbedding
    and MetricMDS before this check), so it is refused as scikit-learn refuses it."""
    import warnings

    import pandas as pd

    X = pd.DataFrame(_data(150, 4) * [1.0, 2.0, 3.0, 4.0], columns=list("abcd"))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*feature names")  # none on its own names
        est = cls(**_params_for(cls)).fit(X)
        same = _apply(est, X)
    assert list(est.feature_names_in_) == list("abcd")
    with pytest.raises(ValueError, match="same order as they were in fit"):
        _apply(est, X[list("dcba")])
    with pytest.raises(ValueError, match="unseen at fit time"):
        _apply(est, X.rename(columns={"a": "z"}))
    # an array after a DataFrame: the values, and scikit-learn's warning, once
    with pytest.warns(UserWarning, match="does not have valid feature names") as caught:
        plain = _apply(est, X.to_numpy())
    assert len([w for w in caught if "feature names" in str(w.message)]) == 1
    np.testing.assert_array_equal(np.asarray(same), np.asarray(plain))
    # a refit on an array forgets the names; a DataFrame then is a warning
    est.fit(X.to_numpy())
    assert not hasattr(est, "feature_names_in_")
    with pytest.warns(UserWarning, match="fitted without feature names"):
        _apply(est, X)


def test_partial_fit_refuses_a_batch_with_other_columns_before_adding_it():
    import pandas as pd

    X = pd.DataFrame(_data(300, 3), columns=list("abc"))
    est = GreedySpectralEmbedding(gamma=0.05, tol=1e-2).partial_fit(X.iloc[:150])
    with pytest.raises(ValueError, match="same order as they were in fit"):
        est.partial_fit(X.iloc[150:][list("cba")])
    assert est.n_samples_fit_ == 150
    est.partial_fit(X.iloc[150:])
    assert est.n_samples_fit_ == 300 and list(est.feature_names_in_) == list("abc")


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


# ---------------------------------------------------------------------- #
# issue 38: the conventions users bring from scikit-learn and dask-ml
# ---------------------------------------------------------------------- #
def test_object_array_of_non_numbers_is_a_type_error():
    from ooc_spectral.exceptions import InvalidInputTypeError

    X = _data(20).astype(object)
    X[0, 0] = {"foo": "bar"}
    # as scikit-learn's check_dtype_object wants: a TypeError naming the conversion
    with pytest.raises(TypeError, match="argument must be a string.* number") as info:
        GreedySpectralEmbedding().fit(X)
    assert isinstance(info.value, InvalidInputTypeError)
    assert isinstance(info.value, InvalidInputError)  # still the package's input error


def test_np_matrix_is_refused_as_scikit_learn_does():
    with pytest.raises(TypeError, match="np.matrix is not supported"):
        GreedySpectralEmbedding().fit(np.matrix(_data(50)))


def test_partial_fit_offered_only_where_it_works():
    assert hasattr(GreedySpectralEmbedding(), "partial_fit")
    est = GreedySpectralEmbedding(normalization="divisive")
    assert not hasattr(est, "partial_fit")
    with pytest.raises(AttributeError, match="partial_fit"):
        est.partial_fit(_data(50))
    # set_params switches it back on
    assert hasattr(est.set_params(normalization="additive"), "partial_fit")


def test_clustering_takes_one_cluster():
    X = _data(150)
    est = GreedySpectralClustering(n_clusters=1, gamma=0.05, random_state=0).fit(X)
    assert est.cluster_centers_.shape[0] == 1
    np.testing.assert_array_equal(est.labels_, 0)
    np.testing.assert_array_equal(est.predict(X[:7]), 0)


def test_poly_is_kernel_pcas_name_for_polynomial():
    from sklearn.decomposition import KernelPCA

    X = _data(300)
    a = GreedySpectralEmbedding(kernel="poly", gamma=0.3, degree=2, tol=1e-9,
                                random_state=0).fit(X)
    b = GreedySpectralEmbedding(kernel="polynomial", gamma=0.3, degree=2, tol=1e-9,
                                random_state=0).fit(X)
    assert a.get_params()["kernel"] == "poly"  # parameters are kept as given
    np.testing.assert_array_equal(a.embedding_, b.embedding_)
    exact = KernelPCA(2, kernel="poly", gamma=0.3, degree=2, coef0=1.0,
                      eigen_solver="dense").fit(X)
    np.testing.assert_allclose(a.eigenvalues_, exact.eigenvalues_, rtol=1e-6)


def test_poly_is_kept_through_save_and_load_and_taken_by_the_baselines(tmp_path):
    X = _data(300)
    a = GreedySpectralEmbedding(kernel="poly", gamma=0.3, degree=2, tol=1e-6,
                                random_state=0).fit(X)
    a.save(tmp_path / "m")
    back = GreedySpectralEmbedding.load(tmp_path / "m")
    assert back.get_params() == a.get_params()
    np.testing.assert_array_equal(back.transform(X), a.embedding_)
    for cls in (ExactKernelEmbedding, NystromEmbedding, GaussianProjectionEmbedding):
        poly = cls(kernel="poly", gamma=0.3, degree=2, random_state=0).fit(X)
        named = cls(kernel="polynomial", gamma=0.3, degree=2, random_state=0).fit(X)
        np.testing.assert_array_equal(poly.embedding_, named.embedding_)


def test_kernel_callable_on_matrices_or_on_pairs():
    from sklearn.metrics.pairwise import rbf_kernel

    X = _data(400)
    builtin = GreedySpectralEmbedding(gamma=0.05, tol=1e-4, random_state=0).fit(X)
    calls = []

    def matrix_kernel(A, B, gamma):
        calls.append(A.shape)
        return rbf_kernel(A, B, gamma=gamma)

    m = GreedySpectralEmbedding(kernel=matrix_kernel, kernel_params={"gamma": 0.05}, tol=1e-4,
                                random_state=0).fit(X)
    assert m.kernel_.matrix_wise is True
    # one call per block, not one per entry (the per-pair form makes 10^5 calls here)
    assert len(calls) < 20 * len(m.dictionary_indices_)
    pair = GreedySpectralEmbedding(kernel=lambda x, y: np.exp(-0.05 * np.sum((x - y) ** 2)),
                                   tol=1e-4, random_state=0).fit(X[:150])
    assert pair.kernel_.matrix_wise is False
    np.testing.assert_array_equal(m.dictionary_indices_, builtin.dictionary_indices_)
    np.testing.assert_allclose(m.eigenvalues_, builtin.eigenvalues_, rtol=1e-9)
    np.testing.assert_allclose(np.abs(m.transform(X[:9])), np.abs(builtin.transform(X[:9])),
                               rtol=1e-7, atol=1e-9)
    # a per-pair function that gives another matrix on blocks stays per pair
    dot = GreedySpectralEmbedding(kernel=np.dot, normalization="additive", tol=1e-6,
                                  random_state=0).fit(_data(60))
    lin = GreedySpectralEmbedding(kernel="linear", tol=1e-6, random_state=0).fit(_data(60))
    assert dot.kernel_.matrix_wise is False
    np.testing.assert_allclose(dot.eigenvalues_, lin.eigenvalues_, rtol=1e-8)


@pytest.mark.parametrize("bad", [np.array([]), np.array(["rbf"]), ["rbf"], 3])
def test_malformed_kernel_is_named(bad):
    from ooc_spectral.exceptions import InvalidParameterError

    with pytest.raises(InvalidParameterError, match=r"kernel=.* has type .*: expected one of "
                                                    r"'rbf'.* or a callable"):
        GreedySpectralEmbedding(kernel=bad).fit(_data(50))


def test_float32_in_float32_out():
    X = _data(300)
    est = GreedySpectralEmbedding(gamma=0.3, random_state=0).fit(X.astype(np.float32))
    assert est.embedding_.dtype == np.float32
    assert est.transform(X[:5].astype(np.float32)).dtype == np.float32
    assert est.transform(X[:5]).dtype == np.float64  # float64 rows: float64
    ref = GreedySpectralEmbedding(gamma=0.3, random_state=0).fit(X.astype(np.float32)
                                                                  .astype(np.float64))
    # computed in float64, rounded once
    np.testing.assert_array_equal(est.embedding_, ref.embedding_.astype(np.float32))
    assert GreedySpectralEmbedding(gamma=0.3, random_state=0).fit(X).embedding_.dtype == np.float64
    forced = GreedySpectralEmbedding(gamma=0.3, output_dtype="float64",
                                     random_state=0).fit(X.astype(np.float32))
    assert forced.embedding_.dtype == np.float64
    assert "float32" in GreedySpectralEmbedding().__sklearn_tags__(
        ).transformer_tags.preserves_dtype


# ---------------------------------------------------------------------- #
# issue 38: each warning once
# ---------------------------------------------------------------------- #
_WARN_ONCE = """
import logging, sys, warnings
import numpy as np
from ooc_spectral import GreedySpectralEmbedding
X = np.random.default_rng(0).normal(size=(200, 3))
if sys.argv[1] == "filtered":
    warnings.simplefilter("ignore")
if sys.argv[1] == "logged":
    logging.getLogger("ooc_spectral").addHandler(logging.StreamHandler())
GreedySpectralEmbedding(gamma=50.0, random_state=0).fit(X)
"""


@pytest.mark.parametrize("mode, count", [("plain", 1), ("filtered", 0), ("logged", 1)])
def test_each_warning_once(mode, count):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _WARN_ONCE, mode], capture_output=True,
                          text=True, check=True)
    assert proc.stderr.count("entered the dictionary") == count, proc.stderr
    assert ("DictionaryWarning" in proc.stderr) == (mode == "plain")


def test_dictionary_warning_is_a_warning_in_python():
    from ooc_spectral.exceptions import DictionaryWarning

    with pytest.warns(DictionaryWarning, match="entered the dictionary"):
        GreedySpectralEmbedding(gamma=50.0, random_state=0).fit(_data(200))


# ---------------------------------------------------------------------- #
# issue 38: scikit-learn's own tools treat the estimators as they treat its own
# ---------------------------------------------------------------------- #
def test_clone_and_nested_params_through_a_pipeline():
    from sklearn.base import clone
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    pipe = Pipeline([("scale", StandardScaler()),
                     ("emb", GreedySpectralEmbedding(n_components=3, gamma=0.05))])
    params = pipe.get_params(deep=True)
    assert params["emb__gamma"] == 0.05 and params["emb__n_components"] == 3
    pipe.set_params(emb__gamma=0.2, emb__kernel="laplacian")
    assert (pipe["emb"].gamma, pipe["emb"].kernel) == (0.2, "laplacian")
    est = GreedySpectralEmbedding(gamma=0.3, tol=1e-4).set_output(transform="pandas")
    copy = clone(est)
    assert copy is not est and copy.get_params() == est.get_params()
    assert copy._sklearn_output_config == {"transform": "pandas"}
    with pytest.raises(ValueError, match=r"Invalid parameter 'gama'.*'gamma'"):
        est.set_params(gama=1.0)
    # a fitted clone equals the original fitted the same way
    X = _data(200)
    a = GreedySpectralEmbedding(n_components=2, gamma=0.1, random_state=0).fit_transform(X)
    b = clone(GreedySpectralEmbedding(n_components=2, gamma=0.1, random_state=0)).fit_transform(X)
    np.testing.assert_array_equal(a, b)


def test_grid_search_over_a_pipeline_scores_as_cross_validation_does():
    from sklearn.base import clone
    from sklearn.datasets import load_digits
    from sklearn.model_selection import GridSearchCV, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.svm import LinearSVC

    X, y = load_digits(return_X_y=True)
    X, y = X[:300] / 16.0, y[:300]
    pipe = make_pipeline(GreedySpectralEmbedding(n_components=10, tol=1e-2, random_state=0),
                         LinearSVC())
    gammas = [0.002, 0.005]
    grid = GridSearchCV(pipe, {"greedyspectralembedding__gamma": gammas}, cv=2,
                        error_score="raise").fit(X, y)
    for gamma, score in zip(gammas, grid.cv_results_["mean_test_score"]):
        alone = cross_val_score(clone(pipe).set_params(greedyspectralembedding__gamma=gamma),
                                X, y, cv=2)
        assert score == alone.mean() and score > 0.6, (gamma, score, alone)
    assert grid.best_estimator_[0].gamma == gammas[int(np.argmax(
        grid.cv_results_["mean_test_score"]))]


def test_global_transform_output_and_the_repr():
    import sklearn
    import pandas as pd

    X = _data(150)
    with sklearn.config_context(transform_output="pandas"):
        out = GreedySpectralEmbedding(n_components=2, gamma=0.05).fit_transform(X)
    assert isinstance(out, pd.DataFrame)
    assert list(out.columns) == ["greedyspectralembedding0", "greedyspectralembedding1"]
    # back to the default: arrays
    assert isinstance(GreedySpectralEmbedding(n_components=2, gamma=0.05).fit_transform(X),
                      np.ndarray)
    # print_changed_only, as scikit-learn's repr
    assert repr(GreedySpectralEmbedding()) == "GreedySpectralEmbedding()"
    assert repr(GreedySpectralEmbedding(n_components=3, gamma=0.1)) == \
        "GreedySpectralEmbedding(gamma=0.1, n_components=3)"
    html = GreedySpectralEmbedding(gamma=0.1)._repr_html_()
    assert "GreedySpectralEmbedding" in html and "gamma" in html


def test_tags_are_scikit_learns():
    from sklearn.base import is_clusterer
    from sklearn.utils import get_tags

    tags = get_tags(GreedySpectralEmbedding())
    assert tags.transformer_tags.preserves_dtype == ["float64", "float32"]
    assert tags.input_tags.sparse and not tags.target_tags.required
    assert is_clusterer(GreedySpectralClustering())
    assert get_tags(GreedySpectralClustering()).estimator_type == "clusterer"


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_every_estimator_is_a_scikit_learn_estimator(cls):
    """Subclasses of scikit-learn's own bases, not a copy of the protocol: check_estimator
    chooses checks by isinstance (the clustering checks by ClusterMixin) and warns about
    any other estimator, and metadata routing comes from BaseEstimator."""
    from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin

    est = cls()
    assert isinstance(est, BaseEstimator)
    mixin = ClusterMixin if cls is GreedySpectralClustering else TransformerMixin
    assert isinstance(est, mixin)
    assert est.get_metadata_routing() is not None


def test_a_saved_model_keeps_the_feature_names_and_checks_them(tmp_path):
    import pandas as pd

    X = pd.DataFrame(_data(200, 3) * [1.0, 5.0, 10.0], columns=list("abc"))
    est = GreedySpectralEmbedding(gamma=0.01, tol=1e-2, random_state=0).fit(X)
    est.save(tmp_path / "model")
    loaded = GreedySpectralEmbedding.load(tmp_path / "model")
    assert list(loaded.feature_names_in_) == list("abc")
    np.testing.assert_array_equal(loaded.transform(X), est.transform(X))
    with pytest.raises(ValueError, match="same order as they were in fit"):
        loaded.transform(X[list("cab")])
    # a model fitted on an array has no names to keep
    est.fit(X.to_numpy()).save(tmp_path / "plain")
    assert not hasattr(GreedySpectralEmbedding.load(tmp_path / "plain"), "feature_names_in_")


def test_a_first_partial_fit_batch_too_small_for_the_components_is_named():
    """partial_fit solves after every batch: a first batch of 1 row (streaming row by
    row) was told to grow the dictionary with a smaller tol or a larger gamma."""
    X = _data(6)
    with pytest.raises(InvalidInputError, match=r"first batch has 1 row.*at least "
                                                r"n_components \+ 1 = 3"):
        GreedySpectralEmbedding(n_components=2, gamma=0.5).partial_fit(X[:1])
    est = GreedySpectralEmbedding(n_components=2, gamma=0.5).partial_fit(X[:3])
    for i in range(3, 6):  # then row by row
        est.partial_fit(X[i:i + 1])
    assert est.n_samples_fit_ == 6


def test_a_dask_dataframes_names_are_recorded_and_checked_as_pandas_ones():
    """scikit-learn reads the names of pandas frames only: a dask DataFrame's were
    neither recorded nor checked, and its reordered columns were embedded by position."""
    import warnings

    import pandas as pd

    dd = pytest.importorskip("dask.dataframe")
    X = pd.DataFrame(_data(200, 4) * [1.0, 2.0, 3.0, 4.0], columns=list("abcd"))
    D = dd.from_pandas(X, npartitions=2)
    est = GreedySpectralEmbedding(gamma=0.05, random_state=0).fit(D)
    assert list(est.feature_names_in_) == list("abcd")
    with pytest.raises(ValueError, match="same order as they were in fit"):
        est.transform(D[list("dcba")])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*feature names")
        np.testing.assert_allclose(np.asarray(est.transform(X)), est.embedding_,
                                   rtol=0, atol=1e-12)


def test_mixed_type_column_names_are_refused_before_the_fit_changes_anything():
    import pandas as pd

    old = pd.DataFrame(_data(200, 4), columns=list("abcd"))
    est = GreedySpectralEmbedding(gamma=0.05, random_state=0).fit(old)
    before = est.transform(old[:5])
    mixed = pd.DataFrame(_data(200, 4, seed=1) * 3, columns=["a", "b", 2, 3])
    with pytest.raises(TypeError, match="string names"):
        est.fit(mixed)
    assert list(est.feature_names_in_) == list("abcd")
    np.testing.assert_array_equal(est.transform(old[:5]), before)
