"""Bad input gets a clear exception: the type, and the words that name the problem."""

from __future__ import annotations

import numpy as np
from sklearn.decomposition import PCA
import pytest
import zarr

from ooc_spectral import (
    DictionaryError,
    GreedySpectralEmbedding,
    InvalidInputError,
    InvalidParameterError,
    NonFiniteInputError,
    NotFittedError,
    OutputNotWritableError,
    StoreNotFoundError,
    UsageError,
)
from ooc_spectral.core.planning import plan_sample

from conftest import write_zarr

rng = np.random.default_rng(0)
X = rng.normal(size=(600, 3))


def fit(data, **kw):
    params = dict(n_components=2, tol=1e-2, random_state=0) | kw
    return GreedySpectralEmbedding(**params).fit(data)


@pytest.mark.parametrize("bad, words", [
    (np.ones(10), "expected a 2-D array"),
    (np.ones((4, 3, 2)), "got 3-D"),
    (np.ones((0, 3)), "0 rows"),
    (np.ones((5, 0)), "0 features"),
    (np.array([["a", "b"], ["c", "d"]]), "real numeric dtype"),
    (np.ones((5, 2), dtype=complex), "real numeric dtype"),
    (np.array([[object(), 1]], dtype=object), "real numeric dtype"),
    (np.ones((1, 3)), "at least 2 samples"),
])
def test_bad_shapes_and_dtypes(bad, words):
    with pytest.raises(InvalidInputError, match=words) as info:
        fit(bad)
    assert isinstance(info.value, ValueError) and isinstance(info.value, UsageError)


@pytest.mark.parametrize("value, kind", [(np.nan, "NaN"), (np.inf, "infinity"), (-np.inf, "infinity")])
def test_non_finite_value_in_a_middle_chunk_names_chunk_and_row(tmp_path, value, kind):
    Xb = X.copy()
    Xb[345, 1] = value
    arr = write_zarr(tmp_path / "x.zarr", Xb, 100)
    with pytest.raises(NonFiniteInputError) as info:
        fit(arr)
    msg = str(info.value)
    assert f"X contains {kind} at row 345, column 1" in msg
    assert "chunk 3 of 6, rows 300-399" in msg
    assert "remove or impute" in msg
    assert info.value.row == 345 and info.value.chunk == 3


def test_non_finite_found_in_pass_2_names_chunk_and_row(tmp_path):
    # dictionary_size runs Algorithm 2 on a sample: the bad row is met by pass 2
    n = 3000
    Xb = np.random.default_rng(1).normal(size=(n, 3))
    sample = set(plan_sample(n, 500, 0, 3).tolist())
    bad = next(r for r in range(1500, n) if r not in sample)
    Xb[bad, 0] = np.nan
    arr = write_zarr(tmp_path / "x.zarr", Xb, 250)
    with pytest.raises(NonFiniteInputError, match=f"NaN at row {bad}, column 0 .chunk {bad // 250} of 12"):
        fit(arr, dictionary_size=20, sample_size=500)


def test_non_finite_in_transform_input():
    est = fit(X)
    Xn = X[:50].copy()
    Xn[7, 2] = np.nan
    with pytest.raises(NonFiniteInputError, match="row 7, column 2"):
        est.transform(Xn)


@pytest.mark.parametrize("param, value, words", [
    ("n_components", 0, "n_components=0 is out of range: expected an integer >= 1"),
    ("n_components", 2.5, "n_components=2.5 has type float: expected an integer"),
    ("kernel", "sigmoid", "kernel='sigmoid' is not valid: expected one of 'rbf'"),
    ("gamma", 0.0, "gamma=0.0 is out of range: expected a number > 0.0"),
    ("gamma", np.nan, "gamma=nan is not finite"),
    ("tol", -1e-3, "tol=-0.001 is out of range: expected a number >= 0.0"),
    ("normalization", "both", "normalization='both' is not valid"),
    ("degree_estimate", "guess", "degree_estimate='guess' is not valid"),
    ("dictionary_size", 1, "dictionary_size=1 is out of range"),
    ("max_dictionary_size", 1, "max_dictionary_size=1 is out of range"),
    ("affine", "yes", "affine='yes' has type str: expected True or False"),
    ("random_state", -1, "random_state=-1 is out of range"),
    ("chunk_rows", 0, "chunk_rows=0 is out of range"),
])
def test_parameters_out_of_range(param, value, words):
    with pytest.raises(InvalidParameterError) as info:
        fit(X, **{param: value})
    assert words in str(info.value)
    assert isinstance(info.value, ValueError)


def test_inconsistent_parameters():
    with pytest.raises(InvalidParameterError, match="n_components=5 is not below dictionary_size=5"):
        fit(X, n_components=5, dictionary_size=5)
    with pytest.raises(InvalidParameterError, match="exceeds max_dictionary_size=10"):
        fit(X, dictionary_size=50, max_dictionary_size=10)


def test_n_components_not_below_dictionary_size_says_what_to_change():
    # a very loose tol keeps the dictionary tiny
    with pytest.raises(DictionaryError) as info:
        fit(X, n_components=3, tol=10.0, max_dictionary_size=599)  # exact not at hand
    msg = str(info.value)
    assert "the dictionary has only 1 point, so n_components=3 is not at most the dictionary size" in msg
    assert "tol=10 is not small against k(x, x)=1" in msg
    # one advice, checked (issue 53): following it fits
    assert "ask for dictionary_size=4 (--dictionary-size 4) instead of tol" in msg
    est = fit(X, n_components=3, dictionary_size=4, max_dictionary_size=599)
    assert est.eigenvalues_.shape == (3,) and np.all(np.diff(est.eigenvalues_) <= 0)


def test_missing_store(tmp_path):
    with pytest.raises(StoreNotFoundError, match="no zarr array or group at") as info:
        fit(str(tmp_path / "nope.zarr"))
    assert isinstance(info.value, FileNotFoundError)


def test_group_without_a_single_data_array(tmp_path):
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    g.create_array("a", shape=(10, 2), dtype="f8")
    g.create_array("b", shape=(10, 2), dtype="f8")
    with pytest.raises(InvalidInputError, match="holds 2 2-D arrays .a, b.; expected one"):
        fit(str(tmp_path / "g.zarr"))


def test_transform_with_wrong_number_of_features():
    est = fit(X)
    with pytest.raises(InvalidInputError, match="X has 4 features, but GreedySpectralEmbedding "
                                                "was fitted with 3 features"):
        est.transform(np.ones((5, 4)))


def test_not_fitted():
    with pytest.raises(NotFittedError, match="not fitted yet; call fit"):
        GreedySpectralEmbedding().transform(X)


def test_unwritable_output_fails_before_any_work(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    import ooc_spectral.pipeline.scan as prefix_scan

    def no_scan(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("the scan started before the output was checked")

    monkeypatch.setattr(prefix_scan, "scan_source", no_scan)  # pass 1's GreedyScan.run
    with pytest.raises(OutputNotWritableError, match="cannot write the output"):
        GreedySpectralEmbedding(random_state=0).fit(X, output=str(blocker / "out.zarr"))


def test_unknown_input_type():
    with pytest.raises(InvalidInputError):
        fit({"a": 1})


@pytest.mark.parametrize("affine", [False, True])
def test_kernel_pca_may_use_every_dictionary_direction(affine):
    # kernel PCA uses the orthogonal projection: its centred coordinates span all m
    # directions, with or without the affine constraint on the selection
    Xs = np.random.default_rng(5).normal(size=(200, 2))
    X3 = np.column_stack([Xs, Xs.sum(1) ** 2])
    est = GreedySpectralEmbedding(n_components=3, kernel="linear", tol=1e-9, affine=affine,
                                  random_state=0).fit(X3)
    assert est.dictionary_.shape[0] == 3 and est.embedding_.shape == (200, 3)
    ref = PCA(n_components=3).fit(X3)
    np.testing.assert_allclose(est.eigenvalues_, ref.explained_variance_ * 199, rtol=1e-10)


@pytest.mark.parametrize("where", ["scan", "pass 2"])
def test_unreadable_chunk_raises_store_read_error_naming_it(tmp_path, where):
    from ooc_spectral import StoreReadError

    n = 30_000
    arr = write_zarr(tmp_path / "x.zarr", np.random.default_rng(2).normal(size=(n, 3)), 250)
    # pass 2: Algorithm 2 searches a sample (gamma given: no other sample) that does not
    # touch the damaged chunk, so a worker of pass 2 is the first to read it
    kw = dict(dictionary_size=20, sample_size=400, gamma=0.5) if where == "pass 2" else {}
    sample = set(plan_sample(n, 400, 0, 3).tolist())
    bad = next(c for c in range(n // 250) if not sample & set(range(250 * c, 250 * c + 250))) \
        if where == "pass 2" else 5
    (tmp_path / "x.zarr" / "c" / str(bad) / "0").write_bytes(b"not a zstd frame")
    with pytest.raises(StoreReadError) as info:
        fit(arr, **kw)
    assert f"(chunk {bad} of" in str(info.value) and "restore or regenerate" in str(info.value)
    assert isinstance(info.value, OSError) and isinstance(info.value, UsageError)


@pytest.mark.parametrize("params", [dict(gamma=1e308), dict(kernel="polynomial", coef0=1e308),
                                    dict(kernel="polynomial", degree=1_000_000)])
def test_kernel_parameters_past_float64s_range_are_named_not_an_overflow(params):
    """gamma=1e308, coef0=1e308 or degree=10**6 are accepted, and the scan's rounding bound
    is then infinite: its advice raised a raw OverflowError ('cannot convert float infinity
    to integer'), exit 1 on the command line (an outside audit)."""
    from ooc_spectral.exceptions import NumericalBreakdownError

    X = np.random.default_rng(0).normal(size=(300, 3))
    with pytest.raises(NumericalBreakdownError, match="overflows float64.*ordinary size"):
        GreedySpectralEmbedding(random_state=0, **params).fit(X)


@pytest.mark.parametrize("params", [{"gamma": 0.1}, {}, {"kernel": "linear"},
                                    {"kernel": "polynomial"}])
@pytest.mark.parametrize("n, row", [(1000, 5), (1000, 300), (5000, 4000)])
def test_a_row_whose_squares_overflow_is_named_by_its_number(params, n, row):
    """A finite value of 1e300 (its square past float64): the error names the row by its
    number in the data set. It was named by its place in whatever block the kernel met
    first ("row 0 (of this block)"): the rows come in a seeded order, and a sample row
    that large moves the kernel's centre (the sample's mean) so that every row overflows
    (an audit)."""
    X = np.random.default_rng(0).normal(size=(n, 3))
    X[row, 0] = 1e300
    with pytest.raises(InvalidInputError, match=rf"^row {row} has finite values up to 1e\+300 "
                                                r"whose squared norm overflows float64"):
        GreedySpectralEmbedding(2, random_state=0, **params).fit(X)
