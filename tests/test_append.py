"""Rows appended to a fitted input: the same ``fit`` command updates (issue 16).

The oracle is exact kernel PCA of every row, projected on the final dictionary:
the centred coordinates ``z = L^-1 k(D, x)`` of all rows, their covariance's
eigenvectors, the projections on them (computed in memory here, at test size).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from scipy.linalg import eigh, solve_triangular
from sklearn.datasets import make_swiss_roll

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.runtime.cluster import ClusterOptions
from ooc_spectral.batch.jobs import FitJob, run_fit_job

from test_cli import cli
from test_resume import kill_when

N_OLD, N_NEW, CHUNK, P = 3000, 4000, 256, 5  # 3000 is not a multiple of 256: a partial chunk
PARAMS = dict(gamma=0.05, tol=1e-4, n_components=P, random_state=0)


@pytest.fixture(scope="module")
def rows():
    X, t = make_swiss_roll(N_NEW, random_state=0)
    return X[np.argsort(t)]  # sorted along the roll: the appended rows reach a new region


@pytest.fixture
def caplog(caplog):
    """caplog that also sees ``ooc_spectral``'s records when an earlier in-process CLI run
    gave that logger its own handler and stopped its propagation."""
    import logging

    logger = logging.getLogger("ooc_spectral")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def write_input(path: Path, X) -> zarr.Array:
    arr = zarr.create_array(str(path), shape=X.shape, chunks=(CHUNK, 3), dtype="f8")
    arr[:] = X
    return arr


def append(arr: zarr.Array, X) -> None:
    """What a nightly producer does: resize, then write the new rows after the old ones."""
    n = arr.shape[0]
    arr.resize((X.shape[0], X.shape[1]))
    arr[n:] = X[n:]


def fit(inp, out, cluster, **params):
    job = FitJob(str(inp), str(out), {**PARAMS, **params},
                 cluster=ClusterOptions(scheduler=cluster.scheduler_address))
    return run_fit_job(job)


def oracle(model_dir, X):
    """(eigenvalues, projections) of kernel PCA of X projected on the model's dictionary."""
    d = GreedySpectralEmbedding.load(model_dir).spectral_map_.dictionary
    K, _ = d.kernel_block(X)
    Z = solve_triangular(d.L, K.T, lower=True).T
    Zc = Z - Z.mean(axis=0)
    w, V = eigh(Zc.T @ Zc)
    return w[::-1][:P], Zc @ V[:, ::-1][:, :P]


def embedding(out) -> np.ndarray:
    return zarr.open_array(str(Path(out) / "embedding"), mode="r")[...]


def residuals(model_dir, X):
    d = GreedySpectralEmbedding.load(model_dir).spectral_map_.dictionary
    return d.residuals(*d.coordinates(X))[0]


def test_appended_rows_update_equals_the_oracle_keeps_signs_and_reruns_as_a_no_op(
        rows, tmp_path, cluster):
    arr = write_input(tmp_path / "x.zarr", rows[:N_OLD])
    first = fit(tmp_path / "x.zarr", tmp_path / "out", cluster)
    assert "update" not in first
    before = embedding(tmp_path / "out")

    append(arr, rows)
    rep = fit(tmp_path / "x.zarr", tmp_path / "out", cluster)
    up = rep["update"]
    assert (up["rows_before"], up["rows_added"]) == (N_OLD, N_NEW - N_OLD)
    assert up["dictionary_before"] == first["dictionary_size"]
    assert up["dictionary_points_added"] == rep["dictionary_size"] - first["dictionary_size"] > 0
    assert {"scan", "pass2", "solve", "model", "pass3"} <= set(rep["stages"])
    assert rep["n_samples"] == N_NEW and rep["input"]["shape"] == [N_NEW, 3]
    on_disk = json.loads((tmp_path / "out" / "report.json").read_text())
    assert on_disk["update"] == up

    # equal to the oracle on the final dictionary, for every row
    w, proj = oracle(tmp_path / "out" / "model", rows)
    E = embedding(tmp_path / "out")
    assert E.shape == (N_NEW, P)
    np.testing.assert_allclose(rep["eigenvalues"], w, rtol=1e-8)
    signs = np.sign(np.sum(proj * E, axis=0))
    np.testing.assert_allclose(E, proj * signs, rtol=0, atol=1e-8 * np.abs(proj).max())
    # every row within tol of the final span, and the reported residual is the worst one
    r = residuals(tmp_path / "out" / "model", rows)
    assert r.max() <= PARAMS["tol"]
    assert rep["max_residual"] <= PARAMS["tol"]
    # signs consistent with yesterday's embedding on yesterday's rows
    assert np.all(np.sum(E[:N_OLD, :3] * before[:, :3], axis=0) > 0)

    # the same command again: nothing to do
    again = fit(tmp_path / "x.zarr", tmp_path / "out", cluster)
    assert again["finished"] == rep["finished"]
    np.testing.assert_array_equal(embedding(tmp_path / "out"), E)

    # a second night: appended again, updated again from the new base
    more, _ = make_swiss_roll(1000, random_state=1)
    X3 = np.vstack([rows, more])
    append(arr, X3)
    rep3 = fit(tmp_path / "x.zarr", tmp_path / "out", cluster)
    assert (rep3["update"]["rows_before"], rep3["update"]["rows_added"]) == (N_NEW, 1000)
    w3, proj3 = oracle(tmp_path / "out" / "model", X3)
    np.testing.assert_allclose(rep3["eigenvalues"], w3, rtol=1e-8)
    E3 = embedding(tmp_path / "out")
    np.testing.assert_allclose(np.abs(E3), np.abs(proj3), rtol=0, atol=1e-8 * np.abs(proj3).max())


@pytest.mark.parametrize("changed_row", [10, N_OLD - 5], ids=["whole-chunk", "partial-chunk"])
def test_a_changed_prefix_is_not_taken_for_an_append(rows, tmp_path, cluster, changed_row, caplog):
    arr = write_input(tmp_path / "x.zarr", rows[:N_OLD])
    fit(tmp_path / "x.zarr", tmp_path / "out", cluster)
    X = rows.copy()
    X[changed_row] += 0.5
    arr[changed_row] = X[changed_row]
    append(arr, X)
    with caplog.at_level("WARNING", logger="ooc_spectral"):
        rep = fit(tmp_path / "x.zarr", tmp_path / "out", cluster)
    assert "update" not in rep  # refitted from scratch, every row read again
    assert rep["n_samples"] == N_NEW and rep["resumed_stages"] == []
    assert "fitting every row again" in caplog.text
    assert f"first {N_OLD} rows" in caplog.text
    fresh = fit(tmp_path / "x.zarr", tmp_path / "fresh", cluster)
    np.testing.assert_array_equal(embedding(tmp_path / "out"), embedding(tmp_path / "fresh"))
    assert rep["eigenvalues"] == fresh["eigenvalues"]


@pytest.mark.parametrize("params, why", [
    (dict(normalization="divisive", tol=1e-3), "divisive normalization"),
    (dict(tol=1e-3, fit_inverse_transform=True), "pre-image map"),
], ids=["divisive", "fit_inverse_transform"])
def test_a_configuration_that_cannot_be_updated_refits(rows, tmp_path, cluster, caplog,
                                                       params, why):
    arr = write_input(tmp_path / "x.zarr", rows[:N_OLD])
    fit(tmp_path / "x.zarr", tmp_path / "out", cluster, **params)
    append(arr, rows)
    with caplog.at_level("WARNING", logger="ooc_spectral"):
        rep = fit(tmp_path / "x.zarr", tmp_path / "out", cluster, **params)
    assert "update" not in rep and rep["n_samples"] == N_NEW
    assert why in caplog.text and "fitting every row again" in caplog.text
    model = GreedySpectralEmbedding.load(tmp_path / "out" / "model")
    assert model.n_samples_fit_ == N_NEW
    if params.get("fit_inverse_transform"):  # the refitted model still inverts
        back = model.inverse_transform(embedding(tmp_path / "out")[:50])
        assert back.shape == (50, 3) and np.all(np.isfinite(back))
        fresh = GreedySpectralEmbedding(**{**PARAMS, **params}).fit(rows)
        np.testing.assert_allclose(back, fresh.inverse_transform(fresh.transform(rows[:50])),
                                   rtol=1e-6, atol=1e-8 * np.abs(rows).max())


@pytest.fixture(scope="module")
def updated(rows, tmp_path_factory, cluster):
    """A directory with ``x.zarr`` (N_OLD rows fitted, then N_NEW: the rows appended) and
    ``out``, the OUTDIR of its fit and of the update: each test damages a copy of ``out``."""
    d = tmp_path_factory.mktemp("updated")
    arr = write_input(d / "x.zarr", rows[:N_OLD])
    fit(d / "x.zarr", d / "out", cluster, **UPDATED)
    append(arr, rows)
    assert fit(d / "x.zarr", d / "out", cluster, **UPDATED)["update"]["rows_added"] == \
        N_NEW - N_OLD
    return d


#: the updated OUTDIR's fits: gamma 0.03 keeps the refit of all N_NEW rows greedy (376
#: points, below sqrt(80 n) = 566, where the fit would solve the exact problem instead and
#: keep no factor to check)
UPDATED = dict(gamma=0.03)


@pytest.mark.parametrize("damage", ["report lost", "model description changed"])
def test_a_damaged_updated_outdir_is_refitted_not_repaired_from_the_first_fits_state(
        rows, updated, tmp_path, cluster, caplog, damage):
    """The checkpoint of an updated OUTDIR holds the first fit's scan and sums (of fewer
    rows): the repair of a damaged complete OUTDIR resumed them and wrote a model whose
    factor did not match its kernel and whose max_residual_ was false, exit 0 (found by an
    outside audit). Such an OUTDIR is fitted again, every row, and certified."""
    out = tmp_path / "out"
    shutil.copytree(updated / "out", out)
    if damage == "report lost":
        (out / "report.json").unlink()
    else:
        meta = out / "model" / "zarr.json"
        meta.write_text(meta.read_text().replace(f'"n_samples": {N_NEW}',
                                                 f'"n_samples": {N_NEW + 1}'))
    with caplog.at_level("WARNING", logger="ooc_spectral"):
        rep = fit(updated / "x.zarr", out, cluster, **UPDATED)
    assert "fitting every row again" in caplog.text
    assert rep["status"] == "complete" and rep["n_samples"] == N_NEW
    est = GreedySpectralEmbedding.load(out / "model")
    L, D = est.spectral_map_.dictionary.L, est.dictionary_
    np.testing.assert_allclose(L @ L.T, est.kernel_(D), atol=1e-12)
    Z = solve_triangular(L, est.kernel_(rows, D).T, lower=True)
    w = solve_triangular(L, np.ones(len(D)), lower=True)
    delta = est.kernel_.diag(rows) - (Z * Z).sum(0) + (1 - w @ Z) ** 2 / (w @ w)
    # this float64 formula carries its own rounding (sums of m squares of size up to k(x, x)):
    # it may exceed the certified bound by that much; extended precision below has no such slack
    own_rounding = 4 * len(D) * np.finfo(float).eps * est.kernel_.diag(rows).max()
    assert delta.max() <= est.max_residual_ + own_rounding and est.max_residual_ <= PARAMS["tol"]
    # and against residuals computed another way: extended precision, from differences
    from extended_precision import HAS_EXTENDED, true_residuals

    if HAS_EXTENDED:
        assert true_residuals(est.kernel_, rows, D).max() <= est.max_residual_
    np.testing.assert_allclose(est.transform(rows), embedding(out), rtol=0, atol=1e-10)


def test_a_float32_output_stays_float32_after_an_update(rows, tmp_path, cluster):
    arr = write_input(tmp_path / "x.zarr", rows[:N_OLD])
    fit(tmp_path / "x.zarr", tmp_path / "out", cluster, output_dtype="float32")
    append(arr, rows)
    rep = fit(tmp_path / "x.zarr", tmp_path / "out", cluster, output_dtype="float32")
    assert rep["update"]["rows_added"] == N_NEW - N_OLD
    E = zarr.open_array(str(tmp_path / "out" / "embedding"), mode="r")
    assert E.dtype == np.float32 and E.shape == (N_NEW, P)
    _, proj = oracle(tmp_path / "out" / "model", rows)
    signs = np.sign(np.sum(proj * E[...], axis=0))
    np.testing.assert_allclose(E[...], proj * signs, rtol=0,
                               atol=4 * np.finfo(np.float32).eps * np.abs(proj).max())


@pytest.mark.parametrize("case", ["fewer-rows", "unfinished-run-then-appended"])
def test_another_row_count_that_is_no_update_refits_instead_of_refusing(rows, tmp_path, cluster,
                                                                         case, caplog):
    from ooc_spectral.io.checkpoint import RunDirectory

    arr = write_input(tmp_path / "x.zarr", rows[:N_OLD])
    fit(tmp_path / "x.zarr", tmp_path / "out", cluster)
    if case == "fewer-rows":
        arr.resize((N_OLD - 1000, 3))
        n, words = N_OLD - 1000, f"not more than the {N_OLD} fitted"
    else:  # as a run killed before it finished leaves it
        RunDirectory(tmp_path / "out").mark("failed", error="killed")
        append(arr, rows)
        n, words = N_NEW, "did not finish"
    with caplog.at_level("WARNING", logger="ooc_spectral"):
        rep = fit(tmp_path / "x.zarr", tmp_path / "out", cluster)  # not exit 2: a nightly job
    assert "update" not in rep and rep["n_samples"] == n  # goes on working unattended
    assert words in caplog.text and "fitting every row again" in caplog.text
    fresh = fit(tmp_path / "x.zarr", tmp_path / "fresh", cluster)
    np.testing.assert_array_equal(embedding(tmp_path / "out"), embedding(tmp_path / "fresh"))


# --------------------------------------------------------------------------- #
# killed during an update, through the command line
# --------------------------------------------------------------------------- #
K_OLD, K_NEW, K_CHUNK = 9_000, 12_000, 150  # 80 output chunks: a kill lands among them
ARGS = ["--gamma", "0.05", "--tol", "1e-3", "--n-components", "3", "--checkpoint-every", "1",
        "--workers", "1", "--threads-per-worker", "1", "-q"]


def _update_phase(out: Path):
    try:
        attrs = json.loads((out / "zarr.json").read_text())["attributes"]["ooc_spectral_run"]
    except (OSError, ValueError, KeyError):
        return None
    return (attrs.get("update") or {}).get("phase")


def _written(out: Path) -> int:
    marks = out / "embedding_written" / "c"
    return len(list(marks.iterdir())) if marks.exists() else 0


def test_an_update_killed_in_each_phase_resumes_to_the_same_result(tmp_path):
    X, t = make_swiss_roll(K_NEW, random_state=2)
    X = X[np.argsort(t)]
    arr = zarr.create_array(str(tmp_path / "x.zarr"), shape=(K_OLD, 3), chunks=(K_CHUNK, 3),
                            dtype="f8")
    arr[:] = X[:K_OLD]
    cli("fit", tmp_path / "x.zarr", "--out", tmp_path / "ref", *ARGS, check=0)
    shutil.copytree(tmp_path / "ref", tmp_path / "killed")
    append(arr, X)
    cli("fit", tmp_path / "x.zarr", "--out", tmp_path / "ref", *ARGS, check=0)
    ref = json.loads((tmp_path / "ref" / "report.json").read_text())
    assert ref["update"]["rows_added"] == K_NEW - K_OLD

    args = [str(tmp_path / "x.zarr"), "--out", str(tmp_path / "killed"), *ARGS]
    out = tmp_path / "killed"
    kill_when(out, lambda o: _update_phase(o) == "solve", args)  # scan or pass 2
    assert _update_phase(out) == "solve"
    kill_when(out, lambda o: _update_phase(o) == "write" and _written(o) >= 3, args)  # pass 3
    assert _update_phase(out) == "write" and 3 <= _written(out) < K_NEW // K_CHUNK
    cli("fit", *args, check=0)
    rep = json.loads((out / "report.json").read_text())
    assert rep["status"] == "complete" and rep["update"]["resumed"] is True
    assert rep["update"]["rows_before"] == K_OLD
    assert rep["eigenvalues"] == ref["eigenvalues"]
    np.testing.assert_array_equal(embedding(out), embedding(tmp_path / "ref"))
