"""GreedySpectralEmbedding against known answers.

- additive at tol=1e-8 equals scikit-learn's exact KernelPCA (projections,
  eigenvalues, out-of-sample transform);
- divisive with exact degrees equals the dense top eigenvectors of D^-1/2 K D^-1/2;
- numpy, dask and zarr inputs, three chunk layouts, the threaded scheduler and a
  LocalCluster all give the same result;
- save/load round trip, scikit-learn conventions.
"""

from __future__ import annotations

import inspect
import warnings

import dask.array as da
import numpy as np
import pytest
import zarr
from sklearn.base import clone
from sklearn.decomposition import KernelPCA

from ooc_spectral import GreedySpectralEmbedding, InvalidInputError
from ooc_spectral.core.config import parameter_fields
from ooc_spectral.core.kernels import RBFKernel

from conftest import write_zarr

GAMMA = 0.05


def align_signs(E, R):
    """Flip the columns of E to agree in sign with R."""
    s = np.sign(np.sum(E * R, axis=0))
    s[s == 0] = 1
    return E * s


def rel_err(A, B):
    return np.max(np.abs(A - B)) / np.max(np.abs(B))


#: gamma=0.01: the greedy path (a dictionary of about 350 of the 2000 rows);
#: gamma=GAMMA: more than half the rows enter, so the fit takes the exact path.
TOL = {0.01: 2e-7, 0.2: 1e-6}


@pytest.fixture(scope="module", params=[0.01, 0.2], ids=["greedy", "exact"])
def kpca_case(swiss_roll, request):
    X, _ = swiss_roll
    Xtr, Xte = X[:2000], X[2000:]
    gamma = request.param
    # greedy: the smallest tol of the 1-2-5 grid float64 certifies on these rows (below it
    # the fit refuses); exact: at gamma 0.2 half the rows enter, so the exact path
    est = GreedySpectralEmbedding(n_components=3, gamma=gamma, tol=TOL[gamma],
                                  random_state=0).fit(Xtr)
    kp = KernelPCA(n_components=3, kernel="rbf", gamma=gamma, eigen_solver="dense").fit(Xtr)
    return Xtr, Xte, est, kp


def test_additive_matches_sklearn_kernel_pca(kpca_case):
    Xtr, _, est, kp = kpca_case
    ref = kp.transform(Xtr)  # = fit_transform's projections, exact Gram
    E = align_signs(est.embedding_, ref)
    assert rel_err(E, ref) < 1e-6
    np.testing.assert_allclose(est.eigenvalues_, kp.eigenvalues_, rtol=1e-6)
    # greedy: the dictionary is much smaller than the data, and every row is within tol;
    # exact: every row is its own dictionary point
    if est.gamma_ == 0.01:
        assert est.dictionary_.shape[0] < 0.25 * Xtr.shape[0]
        assert 0 < est.max_residual_ <= TOL[0.01]
    else:
        assert est.dictionary_.shape[0] == Xtr.shape[0]
        assert est.max_residual_ == 0.0


def test_additive_transform_matches_sklearn_out_of_sample(kpca_case):
    Xtr, Xte, est, kp = kpca_case
    ref = kp.transform(Xte)
    s = np.sign(np.sum(est.embedding_ * kp.transform(Xtr), axis=0))
    assert rel_err(est.transform(Xte) * s, ref) < 1e-6


def test_transform_on_training_rows_gives_training_embedding(kpca_case):
    Xtr, _, est, _ = kpca_case
    np.testing.assert_allclose(est.transform(Xtr), est.embedding_, rtol=0, atol=1e-12)


def dense_normalized_eigvecs(X, gamma, k):
    K = RBFKernel(gamma)(X)
    d = K.sum(axis=1)
    N = K / np.sqrt(np.outer(d, d))
    vals, vecs = np.linalg.eigh(N)
    return vals[::-1][:k], vecs[:, ::-1][:, :k]


@pytest.mark.parametrize("affine", [True, False])
def test_divisive_exact_degrees_matches_dense_eigenvectors(swiss_roll, affine):
    X = swiss_roll[0][:1500]
    vals, V = dense_normalized_eigvecs(X, GAMMA, 4)
    # the smallest tol of the 1-2-5 grid that float64 certifies on these rows
    est = GreedySpectralEmbedding(n_components=3, gamma=GAMMA, tol=2e-6, normalization="divisive",
                                  degree_estimate="exact", affine=affine, random_state=0).fit(X)
    E = est.embedding_
    ref = V[:, 1:4]  # the trivial first eigenvector is dropped
    coef, *_ = np.linalg.lstsq(ref, E, rcond=None)
    assert np.max(np.abs(ref @ coef - E)) < 1e-8  # alignment residual
    np.testing.assert_allclose(np.linalg.norm(E, axis=0), 1.0, atol=1e-10)  # unit norm
    np.testing.assert_allclose(est.eigenvalues_, vals[1:4], rtol=1e-8)
    np.testing.assert_allclose(np.abs(np.sum(E * ref, axis=0)), 1.0, atol=1e-8)
    np.testing.assert_allclose(est.transform(X), E, atol=1e-12)


def test_divisive_keeps_trivial_eigenvector_when_asked(swiss_roll):
    X = swiss_roll[0][:800]
    vals, V = dense_normalized_eigvecs(X, GAMMA, 2)
    est = GreedySpectralEmbedding(n_components=2, gamma=GAMMA, tol=2e-6, normalization="divisive",
                                  drop_first=False, random_state=0).fit(X)
    np.testing.assert_allclose(est.eigenvalues_[0], 1.0, atol=1e-10)
    # the trivial eigenvector is proportional to sqrt(degree)
    d = RBFKernel(GAMMA)(X).sum(axis=1)
    v0 = np.sqrt(d) / np.linalg.norm(np.sqrt(d))
    np.testing.assert_allclose(np.abs(est.embedding_[:, 0]), v0, atol=1e-8)


def test_divisive_subset_degrees_approximates_exact(swiss_roll):
    X = swiss_roll[0][:1500]
    _, V = dense_normalized_eigvecs(X, GAMMA, 3)
    est = GreedySpectralEmbedding(n_components=2, gamma=GAMMA, tol=1e-4, normalization="divisive",
                                  degree_estimate="subset", degree_subset_size=1500,
                                  random_state=0).fit(X)
    # with the subset = every row, the subset degrees are the exact (mean) degrees
    coef, *_ = np.linalg.lstsq(V[:, 1:3], est.embedding_, rcond=None)
    assert np.max(np.abs(V[:, 1:3] @ coef - est.embedding_)) < 1e-4
    np.testing.assert_allclose(est.transform(X), est.embedding_, atol=1e-12)


# --------------------------------------------------------------------------- #
# same answer whatever the input type, chunking and scheduler
# --------------------------------------------------------------------------- #
#: A greedy fit of the 2,500-row roll (271 points; at GAMMA the dictionary passes
#: exact_limit and the fit is exact).
PARAMS = dict(n_components=3, gamma=0.02, tol=1e-4, random_state=7)


@pytest.fixture(scope="module")
def reference_fit(swiss_roll):
    X = swiss_roll[0]
    return X, GreedySpectralEmbedding(**PARAMS).fit(X)


def _same(est, ref, tol=1e-10):
    np.testing.assert_array_equal(est.dictionary_indices_, ref.dictionary_indices_)
    np.testing.assert_array_equal(est.dictionary_, ref.dictionary_)
    np.testing.assert_allclose(np.asarray(est.embedding_), np.asarray(ref.embedding_), rtol=0, atol=tol)
    np.testing.assert_allclose(est.eigenvalues_, ref.eigenvalues_, rtol=tol)
    assert est.max_residual_ == pytest.approx(ref.max_residual_, rel=1e-9)


def test_dask_input_gives_a_lazy_dask_embedding_with_the_same_values(reference_fit):
    X, ref = reference_fit
    est = GreedySpectralEmbedding(**PARAMS).fit(da.from_array(X, chunks=(300, 3)))
    assert isinstance(est.embedding_, da.Array)
    _same(est, ref)


@pytest.mark.parametrize("chunk_rows", [97, 500, 2500])
def test_zarr_chunk_layouts_give_same_result(tmp_path, reference_fit, chunk_rows):
    X, ref = reference_fit
    arr = write_zarr(tmp_path / "x.zarr", X, chunk_rows)
    est = GreedySpectralEmbedding(**PARAMS).fit(arr)
    _same(est, ref)
    # also through the path of a group holding the data array
    write_zarr(tmp_path / "g.zarr", X, chunk_rows, name="data")
    _same(GreedySpectralEmbedding(**PARAMS).fit(str(tmp_path / "g.zarr")), ref)


def test_pass_chunking_does_not_change_result(reference_fit):
    X, ref = reference_fit
    _same(GreedySpectralEmbedding(**PARAMS, chunk_rows=128).fit(X), ref)


def _moment_tasks(dask_scheduler) -> int:
    return sum(sum(tp.state_counts.values()) for name, tp in dask_scheduler.task_prefixes.items()
               if "chunk_moments" in str(name))


def test_local_cluster_gives_same_result(tmp_path, reference_fit, client):
    X, ref = reference_fit
    assert ref.dictionary_.shape[0] < X.shape[0]  # a greedy fit: pass 2 runs on the workers
    write_zarr(tmp_path / "x.zarr", X, 400)
    before = client.run_on_scheduler(_moment_tasks)
    est = GreedySpectralEmbedding(**PARAMS).fit(str(tmp_path / "x.zarr"),
                                                output=str(tmp_path / "out.zarr"))
    _same(est, ref)
    # the workers did this fit's pass 2: the scheduler saw more of its tasks than before
    assert client.run_on_scheduler(_moment_tasks) > before


def test_float32_and_int_inputs_are_computed_in_float64(reference_fit):
    X, _ = reference_fit
    # 800 rows: on this integer grid every row enters, so the fit takes the exact path (at
    # 2500 rows too; there it cost 9 s of the suite's CPU per fit)
    Xi = np.round(X[:800] * 4).astype(np.int32)
    a = GreedySpectralEmbedding(**PARAMS).fit(Xi)
    b = GreedySpectralEmbedding(**PARAMS).fit(Xi.astype(np.float64))
    _same(a, b, tol=0)
    X32 = X.astype(np.float32)
    # computed in float64 whatever the input; float32 input is given back in float32
    # unless output_dtype says otherwise (issue 38)
    c = GreedySpectralEmbedding(**PARAMS, output_dtype="float64").fit(X32)
    d = GreedySpectralEmbedding(**PARAMS).fit(X32.astype(np.float64))
    _same(c, d, tol=0)
    e = GreedySpectralEmbedding(**PARAMS).fit(X32)
    assert e.embedding_.dtype == np.float32
    np.testing.assert_array_equal(e.embedding_, d.embedding_.astype(np.float32))


# --------------------------------------------------------------------------- #
# output store, persistence, conventions
# --------------------------------------------------------------------------- #
def test_output_store_is_chunk_aligned_and_marked_complete(tmp_path, reference_fit):
    X, ref = reference_fit
    write_zarr(tmp_path / "x.zarr", X, 300)
    out = tmp_path / "emb.zarr"
    est = GreedySpectralEmbedding(**PARAMS).fit(str(tmp_path / "x.zarr"), output=str(out))
    arr = zarr.open_array(str(out / "embedding"), mode="r")
    assert arr.chunks == (300, 3)
    assert arr.attrs["complete"] is True
    np.testing.assert_allclose(arr[...], ref.embedding_, atol=1e-10)
    np.testing.assert_allclose(est.embedding_.compute(), arr[...], atol=0)
    assert zarr.open_array(str(out / "embedding_written"))[...].all()


@pytest.mark.parametrize("kw", [dict(), dict(normalization="divisive"),
                                dict(normalization="divisive", degree_estimate="subset"),
                                dict(kernel="laplacian", tol=0.2),
                                dict(kernel="polynomial", degree=2),
                                # the pre-image pass needs the folded map first, in the
                                # client: it was solved there on every BLAS thread, and the
                                # loaded model's rows differed by 7e-16 (an outside audit)
                                dict(fit_inverse_transform=True)])
def test_save_load_transforms_identically(tmp_path, swiss_roll, kw):
    X = swiss_roll[0][:1200]
    est = GreedySpectralEmbedding(**(dict(n_components=2, tol=1e-3, random_state=1) | kw)).fit(X)
    assert est.dictionary_.shape[0] < len(X)
    est.save(tmp_path / "model.zarr")
    back = GreedySpectralEmbedding.load(tmp_path / "model.zarr")
    Xn = swiss_roll[0][1200:1500]
    np.testing.assert_array_equal(back.transform(Xn), est.transform(Xn))
    np.testing.assert_array_equal(back.transform(X), est.embedding_)
    assert back.get_params() == est.get_params()
    assert back.gamma_ == est.gamma_ and back.max_residual_ == est.max_residual_
    np.testing.assert_array_equal(back.dictionary_indices_, est.dictionary_indices_)
    # the saved model is zarr arrays and JSON, nothing pickled
    g = zarr.open_group(str(tmp_path / "model.zarr"), mode="r")
    assert all(g[k].dtype.kind in "fiu" for k in g.array_keys())


def test_a_model_loads_from_an_outdir_without_a_warning_and_an_array_path_is_named(
        tmp_path, swiss_roll):
    """A fit's OUTDIR holds report.json beside its zarr groups: loading its model looks
    the group up by name (listing the members made zarr warn of report.json, on every
    ``ooc-spectral transform``); a zarr array passed as a model is named as one."""
    X = swiss_roll[0][:600]
    est = GreedySpectralEmbedding(n_components=2, tol=1e-2, random_state=1).fit(X)
    out = tmp_path / "out"
    zarr.open_group(str(out), mode="w")
    est.save(out / "model")
    (out / "report.json").write_text("{}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = GreedySpectralEmbedding.load(out)
    np.testing.assert_array_equal(back.transform(X[:50]), est.transform(X[:50]))
    write_zarr(tmp_path / "x.zarr", X, 300)
    with pytest.raises(InvalidInputError, match="is a zarr array, not a saved model"):
        GreedySpectralEmbedding.load(tmp_path / "x.zarr")


def test_save_onto_an_existing_path_is_one_clear_refusal_and_overwrite_replaces_a_model(
        tmp_path, swiss_roll):
    """A notebook cell that saves, run twice: the refusal names the model and the fix, with
    no zarr traceback chained under it; ``overwrite=True`` replaces the model (the README's
    example), and data that is not a model is refused either way, and kept."""
    from ooc_spectral.exceptions import OutputNotWritableError

    X = swiss_roll[0][:600]
    est = GreedySpectralEmbedding(n_components=2, tol=1e-2, random_state=1).fit(X)
    est.save(tmp_path / "m.zarr")
    with pytest.raises(OutputNotWritableError,
                       match=r"a saved model already exists at .*m\.zarr'; pass overwrite=True"
                       ) as info:
        est.save(tmp_path / "m.zarr")
    assert info.value.__cause__ is None and info.value.__suppress_context__
    other = GreedySpectralEmbedding(n_components=2, tol=1e-2, random_state=2).fit(X)
    assert not np.array_equal(other.dictionary_indices_, est.dictionary_indices_)
    other.save(tmp_path / "m.zarr", overwrite=True)
    back = GreedySpectralEmbedding.load(tmp_path / "m.zarr")
    np.testing.assert_array_equal(back.dictionary_indices_, other.dictionary_indices_)
    write_zarr(tmp_path / "x.zarr", X, 300, name="data")
    for overwrite in (False, True):
        with pytest.raises(OutputNotWritableError, match="is not a saved model|not a model"):
            est.save(tmp_path / "x.zarr", overwrite=overwrite)
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "x.zarr"))["data"][...], X)


def test_sklearn_conventions(swiss_roll):
    est = GreedySpectralEmbedding(n_components=2, tol=1e-2, random_state=3)
    params = est.get_params()
    assert params["tol"] == 1e-2 and params["kernel"] == "rbf"
    est.set_params(tol=0.2, kernel="laplacian")
    assert est.tol == 0.2 and est.kernel == "laplacian"
    c = clone(est)
    assert c.get_params() == est.get_params() and c is not est
    est.fit(swiss_roll[0][:500])
    assert est.get_params() == c.get_params()  # fit does not touch parameters
    assert est.n_features_in_ == 3 and est.n_samples_fit_ == 500
    assert not hasattr(c, "embedding_")


def test_parameters_declared_once():
    sig = inspect.signature(GreedySpectralEmbedding.__init__)
    declared = {f.name: f.default for f in parameter_fields()}
    in_init = {k: p.default for k, p in sig.parameters.items() if k != "self"}
    assert in_init == declared


def test_gamma_heuristic_is_seeded_median(swiss_roll):
    X = swiss_roll[0][:800]  # below the 1000-row sample: every row is used
    est = GreedySpectralEmbedding(n_components=2, tol=1e-2, random_state=0).fit(X)
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)[np.triu_indices(800, 1)]
    assert est.gamma_ == pytest.approx(1.0 / np.median(d2), rel=1e-12)
    again = GreedySpectralEmbedding(n_components=2, tol=1e-2, random_state=0).fit(X)
    assert again.gamma_ == est.gamma_


def test_dictionary_size_returns_exactly_m_points(swiss_roll):
    X = swiss_roll[0]
    for m in (5, 40, 123):
        est = GreedySpectralEmbedding(n_components=2, dictionary_size=m, gamma=GAMMA,
                                      random_state=0).fit(X)
        assert est.dictionary_.shape == (m, 3)
        assert len(set(est.dictionary_indices_.tolist())) == m
        # n <= sample_size: the search ran on every row, so the found tol holds for all
        assert est.max_residual_ <= est.tol_ * (1 + 1e-9)


def test_dictionary_size_on_a_sample_of_larger_data(swiss_roll):
    X = swiss_roll[0]
    est = GreedySpectralEmbedding(n_components=2, dictionary_size=30, sample_size=600,
                                  gamma=GAMMA, random_state=0).fit(X)
    assert est.dictionary_.shape == (30, 3)
    again = GreedySpectralEmbedding(n_components=2, dictionary_size=30, sample_size=600,
                                    gamma=GAMMA, random_state=0).fit(X)
    np.testing.assert_array_equal(again.dictionary_indices_, est.dictionary_indices_)


def test_a_model_fitted_with_its_preimage_map_loads_to_the_same_rows_bit_for_bit(tmp_path):
    """The pre-image pass needs the folded map L^-T W first, in the client, where BLAS ran
    on every thread; a loaded model folds it inside a task on one: rows differed by up to
    7e-16 after save and load (an outside audit's case). The map is now folded on one
    BLAS thread wherever it is first needed. (BLAS on two threads here, as outside the
    suite: the suite's fixture pins it to one.)"""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=2, user_api="blas"):
        _preimage_map_round_trips(tmp_path)


def _preimage_map_round_trips(tmp_path):
    for seed in range(3):
        rng = np.random.default_rng(seed)
        X, Xn = rng.normal(size=(400, 3)), rng.normal(size=(50, 3))
        est = GreedySpectralEmbedding(2, gamma=0.2, tol=1e-3, random_state=0,
                                      fit_inverse_transform=True).fit(X)
        est.save(tmp_path / f"m{seed}")
        back = GreedySpectralEmbedding.load(tmp_path / f"m{seed}")
        np.testing.assert_array_equal(back.transform(Xn), est.transform(Xn))
        np.testing.assert_array_equal(back.transform(X), est.embedding_)
