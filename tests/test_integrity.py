"""Unattended batch jobs never report stale or damaged results (issue 12).

Replaced inputs, half-written inputs, damaged outputs, models and checkpoints,
transient and permanent read errors, workers in another working directory and
long-lived workers across runs: each is made for real on zarr stores and a real
dask.distributed cluster, and the result is compared with a fresh run's.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster
from zarr.storage import LocalStore, WrapperStore

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.runtime.cluster import ClusterOptions
from ooc_spectral.datasets import make_data
from ooc_spectral.exceptions import (
    DamagedDataError,
    OutputNotWritableError,
    StoreReadError,
    TransientReadError,
    UsageError,
)
from ooc_spectral.batch.jobs import FitJob, run_fit_job
from ooc_spectral.io.persistence import attrs_digest

from test_cli import EXE, cli as console  # noqa: F401
from test_resume import in_pass2, kill_when
from producers import producers_group


def cli(*args, **kw):
    """The console script (``test_cli.cli``), except ``verify`` and ``transform`` (without
    keywords), run by ``main`` in this process: verify starts no cluster and imports no dask
    (``test_cli.py::test_commands_that_start_no_cluster_import_no_dask_to_set_up_logging``),
    and the one transform below is refused on loading the model; a process would add only
    its start and shutdown (about 2 s, 10 s under load) to each of these checks."""
    import contextlib
    import io
    import subprocess

    from ooc_spectral.batch.cli import main

    if args[0] not in ("verify", "transform") or kw:
        return console(*args, **kw)
    logs = [logging.getLogger(n) for n in ("ooc_spectral", "distributed", "distributed.client",
                                            "distributed.gc", "tornado", "tornado.application",
                                            "asyncio", "bokeh")]
    saved = [(list(g.handlers), g.level, g.propagate) for g in logs]  # main configures them
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        for g, (handlers, level, propagate) in zip(logs, saved):
            g.handlers[:], g.level, g.propagate = handlers, level, propagate
    return subprocess.CompletedProcess([str(a) for a in args], code, out.getvalue(),
                                       err.getvalue())

PARAMS = {"n_components": 2, "gamma": 0.01, "tol": 1e-2, "random_state": 0, "chunk_rows": 4000,
          "output_dtype": "float64"}  # what the command line writes
CLI_ARGS = ["--gamma", "0.01", "--tol", "1e-2", "--n-components", "2", "--chunk-rows", "4000",
            "-q"]


@pytest.fixture(autouse=True)
def _propagate(monkeypatch):
    """Let caplog see ooc_spectral's log (the CLI's main(), run in-process, turns it off)."""
    monkeypatch.setattr(logging.getLogger("ooc_spectral"), "propagate", True)


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cl:
        yield cl


def _job(inp, out, cluster, **kw) -> dict:
    return run_fit_job(FitJob(input=str(inp), outdir=str(out), params=dict(PARAMS),
                              cluster=ClusterOptions(scheduler=cluster.scheduler_address), **kw))


def _emb(out) -> np.ndarray:
    return zarr.open_array(str(Path(out) / "embedding"), mode="r")[...]


def _model_arrays(out) -> dict:
    g = zarr.open_group(str(Path(out) / "model"), mode="r")
    return {k: g[k][...] for k in g.array_keys()}


def _flip_byte(path: Path, at: int = 40) -> None:
    b = bytearray(path.read_bytes())
    b[min(at, len(b) - 1)] ^= 0x10
    path.write_bytes(bytes(b))


@pytest.fixture(scope="module")
def roll(tmp_path_factory):
    d = tmp_path_factory.mktemp("integrity")
    make_data("swiss-roll", 20_000, d / "in.zarr", chunk_rows=2000, seed=1)
    make_data("swiss-roll", 20_000, d / "in2.zarr", chunk_rows=2000, seed=2)
    return d


@pytest.fixture(scope="module")
def complete_run(roll, cluster, tmp_path_factory):
    """A complete OUTDIR of ``in.zarr`` (copied by tests that damage it)."""
    out = tmp_path_factory.mktemp("ref") / "out"
    report = _job(roll / "in.zarr", out, cluster)
    return out, report


# --------------------------------------------------------------------------- #
# 1. replaced inputs
# --------------------------------------------------------------------------- #
def test_replaced_input_on_a_complete_outdir_gives_the_new_result(roll, cluster, complete_run,
                                                                  tmp_path, caplog):
    ref_out, ref_report = complete_run
    fresh2 = tmp_path / "fresh2"
    _job(roll / "in2.zarr", fresh2, cluster)
    # tonight's file at yesterday's path, same shape and chunking
    inp = tmp_path / "today.zarr"
    shutil.copytree(roll / "in.zarr", inp)
    out = tmp_path / "out"
    first = _job(inp, out, cluster)
    assert first["input_fingerprint"]["listing_sha256"]
    np.testing.assert_array_equal(_emb(out), _emb(ref_out))
    shutil.rmtree(inp)
    shutil.copytree(roll / "in2.zarr", inp)
    with caplog.at_level(logging.WARNING, logger="ooc_spectral"):
        second = _job(inp, out, cluster)
    assert "changed since the run" in caplog.text
    assert second["input_fingerprint"] != first["input_fingerprint"]
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk["input_fingerprint"] == second["input_fingerprint"]
    assert second["resumed_stages"] == []
    np.testing.assert_array_equal(_emb(out), _emb(fresh2))
    assert not np.array_equal(_emb(out), _emb(ref_out))
    # unchanged input: the complete result is reused, nothing recomputed
    third = _job(inp, out, cluster)
    assert third["finished"] == second["finished"]


def test_transform_of_a_replaced_input_is_never_the_old_result(roll, cluster, complete_run,
                                                               tmp_path):
    from ooc_spectral.batch.jobs import TransformJob, run_transform_job

    ref_out, _ = complete_run
    inp, out = tmp_path / "new.zarr", tmp_path / "t"
    shutil.copytree(roll / "in.zarr", inp)
    opts = ClusterOptions(scheduler=cluster.scheduler_address)
    run_transform_job(TransformJob(model=str(ref_out / "model"), input=str(inp), out=str(out),
                                   cluster=opts))
    first = _emb(out)
    shutil.rmtree(inp)
    shutil.copytree(roll / "in2.zarr", inp)
    report = run_transform_job(TransformJob(model=str(ref_out / "model"), input=str(inp),
                                            out=str(out), cluster=opts))
    assert report["input_fingerprint"]["listing_sha256"]
    expected = GreedySpectralEmbedding.load(ref_out / "model").transform(
        zarr.open_array(str(roll / "in2.zarr" / "data"))[...].astype(np.float64))
    np.testing.assert_allclose(_emb(out), expected, rtol=0, atol=1e-12)
    assert not np.allclose(_emb(out), first)


def test_input_changed_while_the_fit_ran_is_never_marked_complete(roll, cluster, tmp_path,
                                                                  monkeypatch):
    """A late writer changes rows after pass 2: the result would be new rows through a
    model of the old ones. It exited 0 with such a mix before (an outside audit); now
    the run fails (exit 1), nothing is complete, and the rerun equals a fresh fit."""
    from ooc_spectral.exceptions import InputChangedError
    from ooc_spectral.pipeline.fit import FitRun

    inp, out = tmp_path / "in.zarr", tmp_path / "out"
    producers_group(inp, copy_of=roll / "in.zarr")  # rows its producer rewrites
    original = FitRun.run

    def run_then_a_late_write(self, *a, **kw):
        result = original(self, *a, **kw)
        arr = zarr.open_array(str(inp / "data"), mode="r+")
        arr[4000:6000] = arr[4000:6000] + 0.5
        return result

    monkeypatch.setattr(FitRun, "run", run_then_a_late_write)
    with pytest.raises(InputChangedError, match="changed while this run read it"):
        _job(inp, out, cluster)
    monkeypatch.setattr(FitRun, "run", original)
    assert not (out / "report.json").exists()
    assert zarr.open_group(str(out), mode="r").attrs["ooc_spectral_run"]["status"] != "complete"
    report = _job(inp, out, cluster)
    assert report["resumed_stages"] == []
    fresh = tmp_path / "fresh"
    _job(inp, fresh, cluster)
    np.testing.assert_array_equal(_emb(out), _emb(fresh))


@pytest.mark.parametrize("where", ["inside", "equal"])
def test_an_output_inside_the_input_is_exit_2_and_leaves_the_input_alone(roll, tmp_path, where):
    """--out in.zarr/run made every rerun see a changed input (its own files), and
    --out in.zarr failed with zarr's error and exit 1 (an outside audit)."""
    inp = tmp_path / "in.zarr"
    shutil.copytree(roll / "in.zarr", inp)
    before = sorted(p.relative_to(inp) for p in inp.rglob("*"))
    out = inp / "run" if where == "inside" else inp
    proc = cli("fit", inp, "--out", out, "-q", check=2)
    assert ("inside the input" if where == "inside" else "is the input") in proc.stderr
    assert "choose an --out outside the input store" in proc.stderr
    assert sorted(p.relative_to(inp) for p in inp.rglob("*")) == before


def test_transform_with_a_refitted_model_is_never_the_old_result(roll, cluster, tmp_path, caplog):
    """The same transform command after the model at the same path was refitted: the
    old rows are not reported (they were, with exit 0, before; an outside audit)."""
    from ooc_spectral.batch.jobs import TransformJob, run_transform_job

    # float64 as the command line computes and writes (float32 rows give float32 in Python)
    X1 = zarr.open_array(str(roll / "in.zarr" / "data"))[...].astype(np.float64)
    X2 = zarr.open_array(str(roll / "in2.zarr" / "data"))[...].astype(np.float64)
    model, out = tmp_path / "model", tmp_path / "t"
    GreedySpectralEmbedding(n_components=2, gamma=0.05, random_state=0).fit(X1).save(model)
    job = TransformJob(model=str(model), input=str(roll / "in.zarr"), out=str(out),
                       cluster=ClusterOptions(scheduler=cluster.scheduler_address))
    first = run_transform_job(job)
    np.testing.assert_allclose(_emb(out), GreedySpectralEmbedding.load(model).transform(X1),
                               rtol=0, atol=1e-12)
    assert run_transform_job(job)["finished"] == first["finished"]  # unchanged: reused
    GreedySpectralEmbedding(n_components=2, gamma=0.05, random_state=0).fit(X2).save(
        model, overwrite=True)
    with caplog.at_level(logging.WARNING, logger="ooc_spectral"):
        second = run_transform_job(job)
    assert second["finished"] != first["finished"]
    assert "the model" in caplog.text and "changed" in caplog.text
    expected = GreedySpectralEmbedding.load(model).transform(X1)
    np.testing.assert_allclose(_emb(out), expected, rtol=0, atol=1e-12)
    assert not np.allclose(expected, GreedySpectralEmbedding(n_components=2, gamma=0.05,
                                                             random_state=0).fit(X1).transform(X1))


def test_replaced_input_after_a_kill_is_never_mixed(roll, cluster, tmp_path, main_):
    big = tmp_path / "big.zarr"
    # 40 tasks of 500 rows: the kill lands in pass 2, between two partials
    make_data("swiss-roll", 20_000, big, chunk_rows=500, seed=1)
    out = tmp_path / "out"
    args = [str(big), "--out", str(out), *CLI_ARGS, "--chunk-rows", "500",
            "--checkpoint-every", "1", "--scheduler", cluster.scheduler_address]
    kill_when(out, in_pass2, args)
    # the input is replaced before the resume
    make_data("swiss-roll", 20_000, big, chunk_rows=500, seed=2, overwrite=True)
    # the rerun and the fresh fit: the same commands in this process (the kill was the
    # console script's)
    assert main_("fit", *args).returncode == 0
    report = json.loads((out / "report.json").read_text())
    assert report["resumed_stages"] == [], report["resumed_stages"]
    fresh = tmp_path / "fresh"
    assert main_("fit", str(big), "--out", str(fresh), *CLI_ARGS, "--chunk-rows", "500",
                 "--scheduler", cluster.scheduler_address).returncode == 0
    np.testing.assert_array_equal(_emb(out), _emb(fresh))


# --------------------------------------------------------------------------- #
# 2. damaged outputs and models
# --------------------------------------------------------------------------- #
def test_verify_finds_damaged_and_missing_embedding_chunks_and_the_rerun_repairs(
        roll, cluster, complete_run, tmp_path):
    ref_out, _ = complete_run
    out = tmp_path / "out"
    shutil.copytree(ref_out, out)
    assert cli("verify", out).returncode == 0
    _flip_byte(out / "embedding" / "c" / "3" / "0")
    (out / "embedding" / "c" / "5" / "0").unlink()
    proc = cli("verify", out)
    assert proc.returncode == 1, proc.stderr
    assert "embedding/c/3/0" in proc.stdout and "embedding/c/5/0" in proc.stdout
    assert "checksum" in proc.stdout
    report = _job(roll / "in.zarr", out, cluster)
    assert report["status"] == "complete"
    np.testing.assert_array_equal(_emb(out), _emb(ref_out))
    assert cli("verify", out).returncode == 0


def test_a_complete_outdir_whose_embedding_metadata_is_gone_is_rewritten(
        roll, cluster, complete_run, tmp_path):
    ref_out, _ = complete_run
    out = tmp_path / "out"
    shutil.copytree(ref_out, out)
    (out / "embedding" / "zarr.json").unlink()
    _flip_byte(out / "model" / "cholesky" / "c" / "0" / "0")
    # a member a complete OUTDIR must hold is gone: exit 1 naming the command (issue 37)
    proc = cli("verify", out)
    assert proc.returncode == 1 and "ooc-spectral fit" in proc.stderr, proc.stderr
    _job(roll / "in.zarr", out, cluster)
    np.testing.assert_array_equal(_emb(out), _emb(ref_out))
    GreedySpectralEmbedding.load(out / "model")
    assert cli("verify", out).returncode == 0


def test_a_resized_embedding_is_not_complete_and_the_rerun_writes_it_whole(
        roll, cluster, complete_run, tmp_path):
    """Every chunk of a truncated embedding decodes: its shape against the run's report
    tells it (verify said intact and the rerun 'already complete', found by an audit)."""
    ref_out, _ = complete_run
    out = tmp_path / "out"
    shutil.copytree(ref_out, out)
    arr = zarr.open_array(str(out / "embedding"), mode="r+")
    arr.resize((arr.shape[0] - arr.chunks[0], arr.shape[1]))
    proc = cli("verify", out)
    assert proc.returncode == 1 and "resized or replaced" in proc.stderr, proc.stderr
    _job(roll / "in.zarr", out, cluster)
    np.testing.assert_array_equal(_emb(out), _emb(ref_out))
    assert cli("verify", out).returncode == 0


@pytest.mark.parametrize("with_marker", [False, True], ids=["chunk", "chunk and its marker"])
def test_an_embedding_chunk_from_another_run_is_found_and_written_again(
        roll, cluster, complete_run, tmp_path, with_marker):
    """Each written-marker holds a digest of its chunk keyed by the run: a chunk copied
    from another run's OUTDIR decodes and passes its checksum, but not the digest (verify
    said intact and the rerun 'already complete', found by an outside audit)."""
    ref_out, _ = complete_run
    other = tmp_path / "other"
    _job(roll / "in2.zarr", other, cluster)
    out = tmp_path / "out"
    shutil.copytree(ref_out, out)
    shutil.copy(other / "embedding" / "c" / "1" / "0", out / "embedding" / "c" / "1" / "0")
    if with_marker:
        shutil.copy(other / "embedding_written" / "c" / "1", out / "embedding_written" / "c" / "1")
    assert not np.array_equal(_emb(out), _emb(ref_out))
    proc = cli("verify", out)
    assert proc.returncode == 1 and "embedding/c/1/0" in proc.stdout + proc.stderr, proc
    assert "another run" in proc.stdout + proc.stderr
    _job(roll / "in.zarr", out, cluster)
    np.testing.assert_array_equal(_emb(out), _emb(ref_out))
    assert cli("verify", out).returncode == 0


@pytest.mark.parametrize("member", ["model", "embedding"])
def test_a_member_copied_from_another_run_is_not_this_runs_and_the_rerun_replaces_it(
        roll, cluster, complete_run, tmp_path, member):
    """A whole member restored from another OUTDIR (a wrong backup) is self-consistent: its
    digests match it. The report names the run's own (the model's arrays digest, the
    embedding's run id), so verify refuses it and the rerun writes the run's own again
    (found by a second outside audit: both passed verify and the rerun, exit 0)."""
    ref_out, _ = complete_run
    other = tmp_path / "other"
    _job(roll / "in2.zarr", other, cluster)
    out = tmp_path / "out"
    shutil.copytree(ref_out, out)
    names = ["model"] if member == "model" else ["embedding", "embedding_written"]
    for name in names:
        shutil.rmtree(out / name)
        shutil.copytree(other / name, out / name)
    proc = cli("verify", out)
    assert proc.returncode == 1 and "not this run's" in proc.stdout + proc.stderr, proc
    _job(roll / "in.zarr", out, cluster)
    np.testing.assert_array_equal(_emb(out), _emb(ref_out))
    got, ref = _model_arrays(out), _model_arrays(ref_out)
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
    assert cli("verify", out).returncode == 0


def test_a_model_array_of_fill_values_is_stored_and_an_absent_one_proven_by_the_digest(tmp_path):
    """The exact path (half the rows enter the dictionary) saves w = 0: zarr left that
    chunk out, and verify called the fresh OUTDIR damaged forever (a second audit)."""
    X = np.random.default_rng(3).normal(size=(300, 3))
    zarr.create_array(str(tmp_path / "in.zarr"), shape=X.shape, chunks=(64, 3),
                      dtype="f8")[:] = X
    out = tmp_path / "out"
    cli("fit", tmp_path / "in.zarr", "--out", out, "--tol", "1e-6", "--gamma", "5",
        "--engine", "threads", "-q", check=0)
    w = zarr.open_array(str(out / "model" / "w"), mode="r")[...]
    assert not w.any()  # the exact path's w
    assert (out / "model" / "w" / "c" / "0").is_file()
    assert cli("verify", out).returncode == 0
    (out / "model" / "w" / "c" / "0").unlink()  # a model saved before: the digest proves it
    assert cli("verify", out).returncode == 0


def test_an_output_chunk_equal_to_the_fill_value_is_stored_and_verify_passes(tmp_path):
    """An embedding chunk that is all NaN (the embedding's fill value) and a labels chunk
    all -1 (theirs) are stored like any other: the arrays are created with
    write_empty_chunks=True, but zarr does not keep that runtime setting when a worker
    opens the array again, so such a chunk was left out, read as never written, and
    transform rewrote it forever (an audit: an embedding chunk of NaN)."""
    from ooc_spectral.io.integrity import missing_chunks
    from ooc_spectral.pipeline.cluster_output import LABELS, LABELS_WRITTEN, ClusterOutput
    from ooc_spectral.pipeline.writeback import EMBEDDING, WRITTEN, write_marked

    out = ClusterOutput(str(tmp_path / "out"), 6, 2, 3).prepare()
    rows = [(EMBEDDING, WRITTEN, np.full((3, 2), np.nan), np.ones((3, 2))),
            (LABELS, LABELS_WRITTEN, np.full(3, -1), np.arange(3))]
    for name, marks, fill, other in rows:
        write_marked(out.url, name, marks, fill, 0, 3, 3, out.run_id)
        write_marked(out.url, name, marks, other, 3, 6, 3, out.run_id)
        arr = zarr.open_array(str(tmp_path / "out" / name), mode="r")
        assert missing_chunks(arr) == [], name
        np.testing.assert_array_equal(arr[:3], fill)
        assert zarr.open_array(str(tmp_path / "out" / marks), mode="r")[...].all(), name


def test_a_flipped_byte_in_a_model_array_makes_load_raise(complete_run, tmp_path):
    ref_out, _ = complete_run
    model = tmp_path / "model"
    shutil.copytree(ref_out / "model", model)
    GreedySpectralEmbedding.load(model)  # intact
    _flip_byte(model / "components" / "c" / "0" / "0")
    with pytest.raises(DamagedDataError, match="components"):
        GreedySpectralEmbedding.load(model)
    # a deleted chunk reads back as fill values: the digest catches it
    shutil.rmtree(model)
    shutil.copytree(ref_out / "model", model)
    (model / "eigenvalues" / "c" / "0").unlink()
    with pytest.raises(DamagedDataError, match="digest"):
        GreedySpectralEmbedding.load(model)


def _edit_model_meta(model: Path, edit) -> None:
    path = model / "zarr.json"
    doc = json.loads(path.read_text())
    edit(doc["attributes"]["ooc_spectral_model"])
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("edit, match", [
    (lambda m: m["kernel"].update(gamma=m["kernel"]["gamma"] * 1.6), "description"),
    (lambda m: m["fitted"].update(max_residual_=1e-12), "description"),
    (lambda m: m["params"].update(n_components=1), "description"),
    (lambda m: m.pop("attrs_sha256"), "no digest"),
    # the arrays' digest gone, the description's recomputed to match: still refused
    (lambda m: (m.pop("arrays_sha256"), m.update(attrs_sha256=attrs_digest(m))), "no digest"),
], ids=["kernel gamma", "certificate", "params", "no description digest", "no arrays digest"])
def test_a_changed_model_description_makes_load_and_verify_fail(complete_run, tmp_path, edit,
                                                                 match):
    """The model's zarr.json (kernel, parameters, certificate) is covered by its own digest,
    ``attrs_sha256``: a changed digit is refused by load, by transform and by verify (the
    arrays' digest alone let a changed gamma transform every row differently, exit 0)."""
    ref_out, _ = complete_run
    model = tmp_path / "model"
    shutil.copytree(ref_out / "model", model)
    _edit_model_meta(model, edit)
    with pytest.raises(DamagedDataError, match=match):
        GreedySpectralEmbedding.load(model)
    proc = cli("verify", model)  # damage: exit 1, the rerun repairs it (docs/user_guide/batch.md)
    assert proc.returncode == 1 and "digest" in proc.stderr, (proc.returncode, proc.stderr)
    proc = cli("transform", model, ref_out / "model" / "dictionary", "--out", tmp_path / "t", "-q",
               "--engine", "threads")
    assert proc.returncode == 2 and match in proc.stderr, (proc.returncode, proc.stderr)


def test_a_format_2_model_without_a_description_digest_still_loads(complete_run, tmp_path):
    ref_out, _ = complete_run
    model = tmp_path / "model"
    shutil.copytree(ref_out / "model", model)
    _edit_model_meta(model, lambda m: (m.pop("attrs_sha256"), m.update(format=2)))
    old, new = GreedySpectralEmbedding.load(model), GreedySpectralEmbedding.load(ref_out / "model")
    X = new.dictionary_[:20] + 0.1
    np.testing.assert_array_equal(old.transform(X), new.transform(X))
    assert cli("verify", model).returncode == 0


# --------------------------------------------------------------------------- #
# 3. checkpoints that heal
# --------------------------------------------------------------------------- #
def _damage_checkpoint(out: Path, how: str) -> None:
    parts = sorted(p for p in (out / "checkpoint" / "partials").iterdir() if p.is_dir())
    assert len(parts) >= 3
    part = parts[len(parts) // 2]
    if how == "deleted part":
        shutil.rmtree(part)
    elif how == "deleted file":  # the crash loop of issue 12: KeyError: 'mean'
        arrays = sorted(p for p in part.iterdir() if p.is_dir())
        (arrays[0] / "zarr.json").unlink()
    elif how == "truncated chunk":
        chunk = next(p for p in sorted(part.rglob("*")) if p.is_file() and p.name != "zarr.json")
        chunk.write_bytes(chunk.read_bytes()[:7])
    elif how == "garbled chunk":
        chunk = next(p for p in sorted(part.rglob("*")) if p.is_file() and p.name != "zarr.json")
        b = bytearray(chunk.read_bytes())
        b[: min(16, len(b))] = os.urandom(min(16, len(b)))
        chunk.write_bytes(bytes(b))
    elif how == "edited scalar":  # valid JSON, a plausible value: the digest covers it
        meta_path = part / "zarr.json"
        doc = json.loads(meta_path.read_text())
        scalars = doc["attributes"]["partial"]["scalars"]
        key = next(k for k, v in sorted(scalars.items()) if isinstance(v, float) and v)
        scalars[key] /= 1000
        meta_path.write_text(json.dumps(doc))
    elif how == "edited scan pointer":
        meta_path = out / "checkpoint" / "zarr.json"
        doc = json.loads(meta_path.read_text())
        doc["attributes"]["scan"]["tol"] *= 10
        meta_path.write_text(json.dumps(doc))
    elif how == "scan state":
        slot = json.loads((out / "checkpoint" / "zarr.json").read_text())["attributes"]["scan"]["slot"]
        _flip_byte(next(p for p in (out / "checkpoint" / slot / "L").rglob("*")
                        if p.is_file() and p.name != "zarr.json"))


@pytest.mark.parametrize("how", ["deleted part", "deleted file", "truncated chunk",
                                 "garbled chunk", "edited scalar", "scan state",
                                 "edited scan pointer"])
def test_a_damaged_checkpoint_is_recomputed(roll, cluster, complete_run, tmp_path, caplog, how):
    ref_out, ref_report = complete_run
    out = tmp_path / "out"
    shutil.copytree(ref_out, out)
    _damage_checkpoint(out, how)
    # the run must go back to its checkpoint: damage one embedding chunk as well
    (out / "embedding" / "c" / "0" / "0").unlink()
    with caplog.at_level(logging.WARNING, logger="ooc_spectral"):
        report = _job(roll / "in.zarr", out, cluster)
    if how != "deleted part":
        assert "damaged" in caplog.text and "discarding" in caplog.text
    assert report["status"] == "complete"
    for key in ("max_residual", "eigenvalue_error_bound", "eigenvalue_interval", "eigenvalues"):
        assert report[key] == ref_report[key], key
    np.testing.assert_array_equal(_emb(out), _emb(ref_out))
    got, ref = _model_arrays(out), _model_arrays(ref_out)
    assert got.keys() == ref.keys()
    for k in ref:
        np.testing.assert_array_equal(got[k], ref[k], err_msg=k)


# --------------------------------------------------------------------------- #
# 4. transient vs permanent read errors
# --------------------------------------------------------------------------- #
class FlakyStore(WrapperStore):
    """Fails reads of chosen chunk keys with ConnectionError, counted across processes.

    ``where="client"`` fails only reads in the process that made the store (the
    scan runs there); ``where="workers"`` only reads in other processes (passes
    2 and 3). The worker reads of a key are numbered 1, 2, ... across all
    processes (files made with O_EXCL in ``counter``); reads numbered in
    ``fail`` raise.
    """

    def __init__(self, store, keys=(), fail=(), where="client", counter="", owner=None):
        super().__init__(store)
        self.keys, self.fail, self.where = tuple(keys), tuple(fail), where
        self.counter, self.owner = str(counter), owner if owner is not None else os.getpid()

    def _with_store(self, store):
        return type(self)(store, self.keys, self.fail, self.where, self.counter, self.owner)

    def __getstate__(self):
        return {"store": self._store, "keys": self.keys, "fail": self.fail, "where": self.where,
                "counter": self.counter, "owner": self.owner}

    def __setstate__(self, state):
        self.__init__(state["store"], state["keys"], state["fail"], state["where"],
                      state["counter"], state["owner"])

    def _ordinal(self, key: str) -> int:
        for i in range(1, 10_000):
            name = os.path.join(self.counter, f"{key.replace('/', '_')}.{i}")
            try:
                os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                return i
            except FileExistsError:
                continue
        raise AssertionError

    async def get(self, key, prototype, byte_range=None):
        here = os.getpid() == self.owner
        if key in self.keys and (here if self.where == "client" else not here):
            if self._ordinal(key) in self.fail:
                raise ConnectionError(f"injected network failure reading {key}")
        return await self._store.get(key, prototype, byte_range)


def _flaky_array(path: Path, counter: Path, **kw):
    counter.mkdir(exist_ok=True)
    store = FlakyStore(LocalStore(str(path)), counter=counter, **kw)
    return zarr.open_array(store=store, path="data", mode="r")


@pytest.mark.parametrize("where, fail, stage", [
    # the scan runs in the client and reads each chunk once: its read fails twice, then succeeds
    ("client", (1, 2), "scan"),
    # an undisturbed run reads the chunk twice on workers (checked with a recording store):
    # first pass 2, then pass 3
    ("workers", (1, 2), "pass2"),      # pass 2's reads 1, 2 fail, 3 succeeds
    ("workers", (2, 3), "pass3"),      # pass 2 reads once (1); pass 3's reads 2, 3 fail, 4 succeeds
])
def test_transient_read_errors_are_retried(roll, cluster, complete_run, tmp_path, monkeypatch,
                                           caplog, where, fail, stage):
    monkeypatch.setenv("OOC_SPECTRAL_READ_BACKOFF", "0.01")
    ref_out, _ = complete_run
    key = "data/c/3/0"
    arr = _flaky_array(roll / "in.zarr", tmp_path / "counter", keys=[key], fail=fail, where=where)
    with Client(cluster) as client:
        client.run(os.environ.__setitem__, "OOC_SPECTRAL_READ_BACKOFF", "0.01")
        with caplog.at_level(logging.WARNING, logger="ooc_spectral"):
            est = GreedySpectralEmbedding(**PARAMS).fit(arr, output=str(tmp_path / "out"))
    counted = sorted(int(p.name.split(".")[-1]) for p in (tmp_path / "counter").iterdir())
    assert max(counted) > max(fail), "the injected failures did not all happen"
    np.testing.assert_array_equal(np.asarray(est.embedding_), _emb(ref_out))
    if where == "client":
        assert "retry" in caplog.text


@pytest.mark.parametrize("where", ["client", "workers"])
def test_transient_read_errors_that_persist_exit_1(roll, cluster, tmp_path, monkeypatch, where):
    monkeypatch.setenv("OOC_SPECTRAL_READ_BACKOFF", "0.01")
    monkeypatch.setenv("OOC_SPECTRAL_READ_ATTEMPTS", "3")
    arr = _flaky_array(roll / "in.zarr", tmp_path / "counter", keys=["data/c/3/0"],
                       fail=range(1, 100), where=where)
    with Client(cluster), pytest.raises(TransientReadError, match="after 3 tries") as info:
        # the read settings travel with the task (read in the client when the graph is made)
        GreedySpectralEmbedding(**PARAMS).fit(arr, output=str(tmp_path / "out"))
    assert not isinstance(info.value, UsageError)  # the CLI maps it to exit 1
    from ooc_spectral.batch.cli import EXIT_FAILURE, main

    monkeypatch.setattr("ooc_spectral.batch.cli.cmd_fit", lambda args: (_ for _ in ()).throw(info.value))
    assert main(["fit", "x", "--out", str(tmp_path / "o")]) == EXIT_FAILURE


def test_a_garbled_input_chunk_exits_2_naming_it(roll, cluster, tmp_path):
    inp = tmp_path / "in.zarr"
    shutil.copytree(roll / "in.zarr", inp)
    chunk = inp / "data" / "c" / "4" / "0"
    b = bytearray(chunk.read_bytes())
    b[: 32] = os.urandom(32)
    chunk.write_bytes(bytes(b))
    proc = cli("fit", inp, "--out", tmp_path / "out", *CLI_ARGS,
               "--scheduler", cluster.scheduler_address)
    assert proc.returncode == 2, proc.stderr
    assert "chunk 4" in proc.stderr and "rows 8000-9999" in proc.stderr


# --------------------------------------------------------------------------- #
# 5. paths and missing chunks
# --------------------------------------------------------------------------- #
def test_workers_in_another_directory_and_relative_paths(roll, complete_run, tmp_path,
                                                         monkeypatch, caplog):
    ref_out, _ = complete_run
    elsewhere, here = tmp_path / "workers_cwd", tmp_path / "client_cwd"
    elsewhere.mkdir()
    here.mkdir()
    shutil.copytree(roll / "in.zarr", here / "in.zarr")
    monkeypatch.chdir(elsewhere)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cl:
        monkeypatch.chdir(here)
        with Client(cl) as c:
            assert set(c.run(os.getcwd).values()) == {str(elsewhere)}
        report = _job("in.zarr", "out", cl)
        assert report["outdir"] == str(here / "out")
        np.testing.assert_array_equal(_emb(here / "out"), _emb(ref_out))
        assert not (elsewhere / "out").exists()
        # the same command with absolute paths is the same run: already complete
        with caplog.at_level(logging.INFO, logger="ooc_spectral"):
            again = _job(here / "in.zarr", here / "out", cl)
        assert again["finished"] == report["finished"]
        assert "already holds the complete result" in caplog.text


def test_the_worker_preflight_names_the_path_as_the_worker_sees_it(roll, cluster, tmp_path):
    from ooc_spectral.exceptions import MissingChunkError, StoreNotFoundError
    from ooc_spectral.io.verify import check_readable_here

    with Client(cluster) as client:
        seen = client.submit(check_readable_here, str(roll / "in.zarr"), pure=False).result()
        assert "working directory" in seen
        with pytest.raises(StoreNotFoundError, match="working directory"):
            client.submit(check_readable_here, str(tmp_path / "absent.zarr"), pure=False).result()
        inp = tmp_path / "in.zarr"
        shutil.copytree(roll / "in.zarr", inp)
        (inp / "data" / "c" / "0" / "0").unlink()
        with pytest.raises(MissingChunkError, match="c/0/0.*does not exist on"):
            client.submit(check_readable_here, str(inp / "data"), pure=False).result()


def test_a_missing_input_chunk_exits_2_naming_it(roll, cluster, tmp_path):
    inp = tmp_path / "in.zarr"
    shutil.copytree(roll / "in.zarr", inp)
    (inp / "data" / "c" / "6" / "0").unlink()
    proc = cli("fit", inp, "--out", tmp_path / "out", *CLI_ARGS,
               "--scheduler", cluster.scheduler_address)
    assert proc.returncode == 2, proc.stderr
    # the chunk's key within its array, and the array (the group's data array, opened
    # from its own metadata since 56f97b9)
    assert "chunk 'c/6/0' (rows 12000-13999)" in proc.stderr
    assert f"of the input {inp}/data does not exist" in proc.stderr
    with pytest.raises(StoreReadError, match="c/6/0"):
        from ooc_spectral.io.source import open_source

        open_source(str(inp)).fingerprint()


def test_fit_output_refuses_another_configurations_store(roll, tmp_path):
    out = tmp_path / "emb.zarr"
    GreedySpectralEmbedding(**PARAMS).fit(str(roll / "in.zarr"), output=str(out))
    before = _emb(out)
    other = dict(PARAMS, n_components=3)
    with pytest.raises(OutputNotWritableError, match="already holds an embedding"):
        GreedySpectralEmbedding(**other).fit(str(roll / "in2.zarr"), output=str(out))
    np.testing.assert_array_equal(_emb(out), before)
    # what a fit that died leaves (never marked complete) is started over
    zarr.open_array(str(out / "embedding"), mode="r+").attrs["complete"] = False
    est = GreedySpectralEmbedding(**other).fit(str(roll / "in2.zarr"), output=str(out))
    assert _emb(out).shape == (20_000, 3)
    assert zarr.open_array(str(out / "embedding")).attrs["complete"] is True


def test_an_input_marked_incomplete_is_refused(roll, tmp_path):
    inp = tmp_path / "half.zarr"
    shutil.copytree(roll / "in.zarr", inp)
    g = zarr.open_group(str(inp), mode="r+")
    g.attrs["ooc_spectral_dataset"] = dict(g.attrs["ooc_spectral_dataset"], complete=False)
    proc = cli("fit", inp, "--out", tmp_path / "out", *CLI_ARGS, "--workers", "1")
    assert proc.returncode == 2, proc.stderr
    assert "incomplete" in proc.stderr
    assert not (tmp_path / "out" / "report.json").exists()


# --------------------------------------------------------------------------- #
# 6. no stale state on long-lived workers
# --------------------------------------------------------------------------- #
def test_long_lived_workers_across_overwrite_with_another_shape_and_chunking(roll, tmp_path):
    a, b = tmp_path / "a.zarr", tmp_path / "b.zarr"
    make_data("swiss-roll", 12_000, a, chunk_rows=3000, seed=4)
    make_data("swiss-roll", 20_000, b, chunk_rows=2500, seed=5)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cl:
        out = tmp_path / "out"
        _job(a, out, cl)
        _job(b, out, cl, overwrite=True)  # the same worker processes, the same OUTDIR path
        fresh = tmp_path / "fresh"
        _job(b, fresh, cl)
    got = _emb(out)
    assert got.shape == (20_000, 2)
    np.testing.assert_array_equal(got, _emb(fresh))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_stale_consolidated_metadata_never_hides_appended_rows(tmp_path, zarr_format):
    """A group with consolidated metadata, rows appended to its array without consolidating
    again: the input has the array's own row count (the stale count was fitted silently
    before; an outside audit)."""
    import warnings

    from ooc_spectral.io.source import open_source

    loc = tmp_path / "in.zarr"
    g = zarr.open_group(str(loc), mode="w", zarr_format=zarr_format)
    a = g.create_array("data", shape=(800, 3), chunks=(100, 3), dtype="f8")
    a[:] = np.random.default_rng(1).standard_normal((800, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr: consolidated metadata is not in the v3 spec
        zarr.consolidate_metadata(str(loc))
    assert open_source(str(loc)).n_rows == 800
    a = zarr.open_array(str(loc / "data"), mode="r+")
    a.resize((1000, 3))
    a[800:] = 5.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert zarr.open_group(str(loc), mode="r")["data"].shape[0] == 800  # zarr: stale
    src = open_source(str(loc))
    assert src.n_rows == 1000
    np.testing.assert_array_equal(src.read_rows(900, 1000), np.full((100, 3), 5.0))
