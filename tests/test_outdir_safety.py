"""Nothing outside OUTDIR is touched, and nothing damaged is called intact (issue 37).

Each test reproduces one of the issue's measured defects and asserts the safe
outcome: the parent directory's listing and digests unchanged, exit 2 with a message
naming the fix, or a result bit-identical to a fresh run.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import zarr

from ooc_spectral.batch.cli import main

FAST = ["--workers", "1", "--threads-per-worker", "1", "-q"]
FIT = ["--gamma", "0.05", "--tol", "1e-2", "--n-components", "2", "--engine", "threads",
       "--threads-per-worker", "1", "-q"]


def snapshot(root: Path) -> dict:
    """Every path under ``root`` (links not followed) with its kind and content digest."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def _loggers() -> dict:
    import logging

    return {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level,
                logging.getLogger(n).propagate)
            for n in ("ooc_spectral", "distributed", "tornado", "asyncio", "bokeh")}


_DEFAULT_LOGGERS = _loggers()  # at collection, before any test of any file ran


@pytest.fixture(autouse=True)
def _logging_restored():
    """``main`` configures the package's and dask's loggers for a command line; put them
    back after each test, so the tests that run after these see the defaults."""
    import logging

    yield
    for n, (handlers, level, propagate) in _DEFAULT_LOGGERS.items():
        log = logging.getLogger(n)
        log.handlers[:] = handlers
        log.setLevel(level)
        log.propagate = propagate


def run(*args, capsys=None) -> tuple[int, str]:
    code = main([str(a) for a in args])
    if capsys is None:
        return code, ""
    captured = capsys.readouterr()
    return code, captured.err + captured.out


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("in")
    assert main(["make-data", "swiss-roll", "--n", "1200", "--out", str(d / "x.zarr"),
                 "--chunk-rows", "400", "-q"]) == 0
    return d / "x.zarr"


def _thesis(tmp_path: Path) -> Path:
    d = tmp_path / "parent" / "d"
    d.mkdir(parents=True)
    (d / "thesis.tex").write_text("years of work")
    (tmp_path / "parent" / "victim.txt").write_text("keep me")
    return d


# ------------------------------------------------------------------ 1: data loss outside OUTDIR
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_fit_into_a_foreign_directory_creates_nothing_there(small, tmp_path, capsys, overwrite):
    d = _thesis(tmp_path)
    before = snapshot(tmp_path / "parent")
    code, err = run("fit", small, "--out", d, *overwrite, *FIT, capsys=capsys)
    assert code == 2, err
    assert "not an ooc-spectral output directory" in err and "choose another --out" in err
    assert snapshot(tmp_path / "parent") == before  # no zarr.json, no checkpoint/, no .lock


def test_make_data_overwrite_never_deletes_what_it_did_not_write(small, tmp_path, capsys):
    d = _thesis(tmp_path)
    # the sequence: a refused fit into d, then make-data --overwrite into d
    run("fit", small, "--out", d, *FIT, capsys=capsys)
    before = snapshot(tmp_path / "parent")
    code, err = run("make-data", "spiral", "--n", 1000, "--out", d, "--overwrite", "-q",
                    capsys=capsys)
    assert code == 2 and "nothing was deleted" in err, err
    assert snapshot(tmp_path / "parent") == before
    # a user's own zarr group (it has a zarr.json) is not a data set of this tool either
    g = tmp_path / "parent" / "mine.zarr"
    zarr.open_group(str(g), mode="w").attrs["mine"] = 1
    zarr.open_group(str(g), mode="a").create_array("a", shape=(3,), dtype="f8")[...] = 1.0
    before = snapshot(tmp_path / "parent")
    code, err = run("make-data", "spiral", "--n", 1000, "--out", g, "--overwrite", "-q",
                    capsys=capsys)
    assert code == 2 and "ooc_spectral_dataset" in err, err
    assert snapshot(tmp_path / "parent") == before
    # ... while a data set this tool wrote is replaced
    own = tmp_path / "own.zarr"
    assert run("make-data", "spiral", "--n", 500, "--out", own, "-q")[0] == 0
    assert run("make-data", "spiral", "--n", 600, "--out", own, "--overwrite", "-q")[0] == 0
    assert zarr.open_group(str(own), mode="r")["data"].shape[0] == 600


def test_workflow_make_data_overwrite_allowed_still_spares_a_users_group(tmp_path, capsys):
    g = tmp_path / "mine.zarr"
    zarr.open_group(str(g), mode="w").attrs["mine"] = 1
    wf = tmp_path / "w.toml"
    wf.write_text('[[step]]\nrun = "make-data"\nname = "spiral"\nn = 500\nout = "mine.zarr"\n'
                  'overwrite = true\n')
    before = snapshot(tmp_path)
    code, err = run("run", wf, "--allow", "overwrite", "-q", capsys=capsys)
    assert code == 2 and "nothing was deleted" in err, err
    assert snapshot(tmp_path) == before


def test_a_model_saved_over_a_foreign_directory_is_refused(tmp_path):
    from ooc_spectral import GreedySpectralEmbedding
    from ooc_spectral.exceptions import OutputNotWritableError

    X = np.random.default_rng(0).normal(size=(200, 3))
    est = GreedySpectralEmbedding(n_components=2, gamma=0.5, tol=1e-2).fit(X)
    d = _thesis(tmp_path)
    before = snapshot(tmp_path / "parent")
    with pytest.raises(OutputNotWritableError, match="nothing was deleted"):
        est.save(d, overwrite=True)
    assert snapshot(tmp_path / "parent") == before
    est.save(tmp_path / "m")
    est.save(tmp_path / "m", overwrite=True)  # a model replaces a model


# ------------------------------------------------------------------ 8: a planted .lock symlink
def test_a_lock_symlink_to_a_foreign_file_is_refused_never_written_through(small, tmp_path,
                                                                          capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(victim)
    before = snapshot(tmp_path)
    code, err = run("fit", small, "--out", out, *FIT, capsys=capsys)
    assert code == 2 and "symbolic link" in err and "remove the link" in err, err
    assert victim.read_text() == "keep me"
    assert snapshot(tmp_path) == before


def test_a_report_temporary_planted_as_a_symlink_is_replaced_not_followed(tmp_path):
    from ooc_spectral.io.safety import write_file_atomic

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "report.json.partial").symlink_to(victim)
    write_file_atomic(tmp_path / "report.json", b"{}")
    assert victim.read_text() == "keep me"
    assert (tmp_path / "report.json").read_text() == "{}"


# ------------------------------------------------------------------ 6: verify checks completeness
def _fit(small, out, capsys=None):
    code, err = run("fit", small, "--out", out, *FIT, capsys=capsys)
    assert code == 0, err
    return zarr.open_array(str(out / "embedding"), mode="r")[...]


@pytest.fixture(scope="module")
def fresh(small, tmp_path_factory):
    out = tmp_path_factory.mktemp("fresh") / "out"
    emb = _fit(small, out)
    return emb, json.loads((out / "report.json").read_text())


def _remove(p: Path) -> None:
    import shutil

    shutil.rmtree(p) if p.is_dir() else p.unlink()


@pytest.mark.parametrize("member", ["embedding", "model", "embedding/zarr.json", "report.json",
                                    "garbled report.json", "embedding_written"])
def test_verify_names_a_missing_member_exit_2_and_the_rerun_restores_it(small, fresh, tmp_path,
                                                                        capsys, member):
    out = tmp_path / "out"
    _fit(small, out)
    if member.startswith("garbled "):
        (out / member.split()[1]).write_text('{"status": "comp')
    else:
        _remove(out / member)
    code, err = run("verify", out, capsys=capsys)
    assert code == 2, err
    assert "run ooc-spectral fit" in err and str(out) in err
    code, err = run("fit", small, "--out", out, *FIT, capsys=capsys)
    assert code == 0, err
    code, err = run("verify", out, capsys=capsys)
    assert code == 0, err
    emb = zarr.open_array(str(out / "embedding"), mode="r")[...]
    assert np.array_equal(emb, fresh[0])  # bit-identical to a fresh run
    report = json.loads((out / "report.json").read_text())
    assert report["config_hash"] == fresh[1]["config_hash"]


# ------------------------------------------------------------------ 7: damaged JSON is exit 2
@pytest.mark.parametrize("where", ["zarr.json", "model/zarr.json", "model/w/zarr.json"])
def test_a_garbled_json_is_exit_2_naming_the_file_never_retry_forever(small, fresh, tmp_path,
                                                                      capsys, where):
    out = tmp_path / "out"
    _fit(small, out)
    (out / where).write_text("{\"zarr_format\": 3, \"node_")
    code, err = run("verify", out, capsys=capsys)
    assert code == 2, err
    assert "not valid JSON" in err or "garbled" in err
    code, err = run("transform", out / "model", small, "--out", tmp_path / "t", *FIT[6:],
                    capsys=capsys)
    # the model is intact when only OUTDIR's own zarr.json is garbled
    assert code == (0 if where == "zarr.json" else 2), err
    assert "damaged" in err or code == 0
    code, err = run("fit", small, "--out", out, *FIT, capsys=capsys)
    if where == "zarr.json":  # the run's configuration is lost: named, with the repair
        assert code == 2 and "zarr.json" in err and "rm -r" in err, err
    else:  # the rerun repairs what it can
        assert code == 0, err
        assert run("verify", out, capsys=capsys)[0] == 0
        emb = zarr.open_array(str(out / "embedding"), mode="r")[...]
        assert np.array_equal(emb, fresh[0])


def test_a_garbled_checkpoint_part_is_repaired_by_the_rerun(small, fresh, tmp_path, capsys):
    out = tmp_path / "out"
    _fit(small, out)
    parts = sorted((out / "checkpoint").rglob("zarr.json"))
    victim = [p for p in parts if p.parent.parent.name == "partials"] or parts[1:]
    victim[0].write_text("{garbled")
    # a flipped chunk of a part as well
    chunks = [p for p in (out / "checkpoint").rglob("*") if p.is_file() and p.name != "zarr.json"]
    data = bytearray(chunks[-1].read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunks[-1].write_bytes(bytes(data))
    assert run("verify", out, capsys=capsys)[0] in (1, 2)
    code, err = run("fit", small, "--out", out, *FIT, capsys=capsys)
    assert code == 0, err
    code, err = run("verify", out, capsys=capsys)
    assert code == 0, err
    assert np.array_equal(zarr.open_array(str(out / "embedding"), mode="r")[...], fresh[0])


def test_a_scheduler_of_an_unknown_transport_is_exit_2_before_anything_is_created(small,
                                                                                 tmp_path, capsys):
    before = snapshot(tmp_path)
    code, err = run("fit", small, "--out", tmp_path / "o", "--scheduler", "udp://127.0.0.1:9",
                    "-q", capsys=capsys)
    assert code == 2 and "tcp://HOST:PORT" in err, err
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------ 4: a workflow stays in its root
def _workflow(tmp_path: Path, text: str) -> Path:
    root = tmp_path / "flow"
    root.mkdir(exist_ok=True)
    wf = root / "w.toml"
    wf.write_text(text)
    return wf


@pytest.mark.parametrize("step", [
    'run = "fit"\ninput = "{small}"\nout = "fit"\nperformance_report = "{victim}"\n',
    'run = "plot"\noutdir = "{small}"\nout = "{victim}"\n',
    'run = "fit"\ninput = "{small}"\nout = "file://{outside}"\n',
    'run = "fit"\ninput = "{small}"\nout = "{outside}"\n',
    'run = "make-data"\nname = "spiral"\nn = 100\nout = "link/x.zarr"\n',
])
def test_a_workflow_writes_only_under_its_root(small, tmp_path, capsys, step):
    victim = tmp_path / "victim.pdf"
    victim.write_bytes(b"%PDF precious")
    (tmp_path / "flow").mkdir()
    (tmp_path / "flow" / "link").symlink_to(tmp_path)  # a link inside the root, leading out
    wf = _workflow(tmp_path, "[[step]]\n" + step.format(small=small, victim=victim,
                                                        outside=tmp_path / "elsewhere"))
    before = snapshot(tmp_path)
    code, err = run("run", wf, "-q", capsys=capsys)
    assert code == 2 and "--allow outside-root" in err, err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("table", [
    '[storage_options]\nendpoint_url = "http://127.0.0.1:{port}"\n',
    '[storage_options.client_kwargs]\nendpoint_url = "http://127.0.0.1:{port}"\n',
])
def test_a_workflow_cannot_send_requests_to_an_endpoint_the_command_line_did_not_allow(
        tmp_path, capsys, table):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    wf = _workflow(tmp_path, table.format(port=port)
                   + '[[step]]\nrun = "fit"\ninput = "s3://bucket/x.zarr"\nout = "fit"\n')
    code, err = run("run", wf, "-q", capsys=capsys)
    assert code == 2, err
    assert f"--allow endpoint=http://127.0.0.1:{port}" in err
    with pytest.raises(socket.timeout):  # no request ever reached it
        listener.accept()
    listener.close()
    # a step's own table too
    wf = _workflow(tmp_path, '[[step]]\nrun = "fit"\ninput = "s3://b/x.zarr"\nout = "fit"\n'
                   f'storage_options = {{ endpoint_url = "http://127.0.0.1:{port}" }}\n')
    code, err = run("run", wf, "-q", capsys=capsys)
    assert code == 2 and "--allow endpoint=" in err, err


def test_an_allowed_endpoint_passes_the_check():
    from ooc_spectral.batch.workflow import check_endpoints
    from ooc_spectral.exceptions import WorkflowError

    opts = {"endpoint_url": "http://127.0.0.1:9000/", "client_kwargs": {"region_name": "x"}}
    check_endpoints(opts, {"endpoint=http://127.0.0.1:9000"}, "w")
    with pytest.raises(WorkflowError):
        check_endpoints(opts, {"endpoint=http://127.0.0.1:9001"}, "w")
    # inside an array of tables, and an array of endpoints (an audit's finding)
    for nested in ({"x": [{"endpoint_url": "http://127.0.0.1:9001"}]},
                   {"endpoint_urls": ["http://127.0.0.1:9001"]}):
        with pytest.raises(WorkflowError, match="--allow endpoint=http://127.0.0.1:9001"):
            check_endpoints(nested, set(), "w")
    check_endpoints({"x": [{"endpoint_url": "http://127.0.0.1:9000"}]},
                    {"endpoint=http://127.0.0.1:9000"}, "w")


# ------------------------------------------------------------------ 5: a restored mtime
def test_a_chunk_rewritten_with_its_mtime_restored_is_seen_and_the_rerun_refits(tmp_path, capsys):
    import shutil

    src = tmp_path / "x.zarr"
    assert run("make-data", "swiss-roll", "--n", 1200, "--out", src, "--chunk-rows", 400,
               "-q") == (0, "")
    out = tmp_path / "out"
    _fit(src, out)
    arr = zarr.open_group(str(src), mode="r+")["data"]
    chunk = next(p for p in (src / "data").rglob("*") if p.is_file() and p.name != "zarr.json")
    st = chunk.stat()
    rows = arr[:400]
    arr[:400] = rows[::-1]  # the same bytes in another order: same size
    os.utime(chunk, ns=(st.st_atime_ns, st.st_mtime_ns))  # touch -r
    assert chunk.stat().st_size == st.st_size and chunk.stat().st_mtime_ns == st.st_mtime_ns
    code, err = run("fit", src, "--out", out, *FIT, capsys=capsys)
    assert code == 0, err
    assert "changed since the run" in err  # not a no-op with yesterday's result
    copy = tmp_path / "copy.zarr"
    shutil.copytree(src, copy)
    fresh = _fit(copy, tmp_path / "fresh")
    assert np.array_equal(zarr.open_array(str(out / "embedding"), mode="r")[...], fresh)


# ------------------------------------------------------------------ 2, 9: absent chunks
def _sharded(path: Path, n=1200, d=3, written=None, write_empty=True):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(n, d))
    arr = zarr.create_array(str(path), shape=(n, d), shards=(400, d), chunks=(100, d),
                            dtype="f8", fill_value=0.0,
                            config={"write_empty_chunks": write_empty})
    if written is None:
        arr[...] = X
    else:
        for a, b in written:
            arr[a:b] = X[a:b]
    return X


def test_inner_chunks_a_shard_never_wrote_are_refused_not_read_as_zeros(tmp_path, capsys):
    src = tmp_path / "s.zarr"
    # a writer killed mid-shard: rows 500-599 never written; every shard object exists
    _sharded(src, written=[(0, 500), (600, 1200)])
    code, err = run("fit", src, "--out", tmp_path / "o", *FIT, capsys=capsys)
    assert code == 2, err
    assert "never written" in err and "rows 500-599" in err and "ooc_spectral_complete" in err
    assert not (tmp_path / "o").exists()
    # complete sharded data pass
    full = tmp_path / "full.zarr"
    _sharded(full)
    assert run("fit", full, "--out", tmp_path / "o2", *FIT, capsys=capsys)[0] == 0


def test_chunks_zarr_left_out_as_fill_are_accepted_when_the_data_say_complete(tmp_path, capsys):
    src = tmp_path / "z.zarr"
    rng = np.random.default_rng(4)
    X = rng.normal(size=(1200, 3))
    X[400:800] = 0.0  # a chunk of fill value: zarr does not write it (write_empty_chunks)
    g = zarr.open_group(str(src), mode="w")
    g.create_array("data", shape=X.shape, chunks=(400, 3), dtype="f8", fill_value=0.0)[...] = X
    assert not (src / "data" / "c" / "1").exists()
    code, err = run("fit", src, "--out", tmp_path / "o", *FIT, capsys=capsys)
    assert code == 2 and "ooc_spectral_complete = true" in err, err  # names how
    g.attrs["ooc_spectral_complete"] = True  # the user says so
    code, err = run("fit", src, "--out", tmp_path / "o", *FIT, capsys=capsys)
    assert code == 0, err
    # the same rows written out in full give the same embedding, bit for bit
    dense = tmp_path / "dense.zarr"
    h = zarr.open_group(str(dense), mode="w")
    h.create_array("data", shape=X.shape, chunks=(400, 3), dtype="f8", fill_value=0.0,
                   config={"write_empty_chunks": True})[...] = X
    ref = _fit(dense, tmp_path / "ref")
    assert np.array_equal(zarr.open_array(str(tmp_path / "o" / "embedding"), mode="r")[...], ref)


# ------------------------------------------------------------------ 10: swapped parts
def test_two_checkpoint_parts_swapped_are_discarded_and_the_result_is_bit_identical(
        small, fresh, tmp_path, capsys, caplog):
    import logging

    seg = ["--chunk-rows", "200", "--checkpoint-every", "1"]
    ref = tmp_path / "ref"
    assert run("fit", small, "--out", ref, *FIT, *seg)[0] == 0
    out = tmp_path / "out"
    assert run("fit", small, "--out", out, *FIT, *seg)[0] == 0
    parts = sorted(p for p in (out / "checkpoint" / "partials").iterdir()
                   if p.is_dir() and "_" in p.name and not p.name.startswith("base"))
    assert len(parts) >= 2, parts
    a, b = parts[0], parts[1]
    tmp = a.with_name("swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    next(p for p in (out / "embedding").rglob("*") if p.is_file() and p.name != "zarr.json"
         ).unlink()  # the rerun goes back to its checkpoint
    with caplog.at_level(logging.WARNING, logger="ooc_spectral"):
        code, err = run("fit", small, "--out", out, *FIT, *seg, capsys=capsys)
    assert code == 0, err
    assert "holds the part" in err + caplog.text
    assert np.array_equal(zarr.open_array(str(out / "embedding"), mode="r")[...],
                          zarr.open_array(str(ref / "embedding"), mode="r")[...])


# ------------------------------------------------------------------ 3: the progress watchdog
def test_workers_paused_at_their_memory_limit_end_the_run_naming_the_limit():
    import dask
    from distributed import Client, LocalCluster
    from distributed.core import Status

    from ooc_spectral.exceptions import StalledRunError
    from ooc_spectral.runtime.execution import Executor

    # memory_limit=0: no memory monitor that would resume the worker we pause by hand
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, memory_limit=0,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        def pause(dask_worker):
            dask_worker.status = Status.paused

        client.run(pause)
        executor = Executor(client)
        with dask.config.set({"ooc-spectral.paused-timeout": "2s"}):
            with pytest.raises(StalledRunError, match="paused at its memory limit.*--memory-limit"):
                executor.run("pass2", {0: dask.delayed(sum)([1, 2])})
        # the error is a runtime failure: exit 1 on the command line, not 2
        from ooc_spectral.exceptions import UsageError

        assert not issubclass(StalledRunError, UsageError)


@pytest.mark.parametrize("keys", ['chunk_rows = 1\n', 'workers = 64\n'])
def test_a_workflow_asking_for_40k_files_or_64_workers_needs_allow_resources(tmp_path, capsys,
                                                                           keys):
    wf = _workflow(tmp_path, '[[step]]\nrun = "make-data"\nname = "spiral"\nn = 40000\n'
                   'out = "d.zarr"\n' + keys)
    if "workers" in keys:  # make-data has no workers: a fit step asks for them
        wf.write_text('[[step]]\nrun = "fit"\ninput = "d.zarr"\nout = "fit"\n' + keys)
    before = snapshot(tmp_path)
    code, err = run("run", wf, "-q", capsys=capsys)
    assert code == 2 and "--allow resources" in err, err
    assert snapshot(tmp_path) == before


def test_a_content_fingerprint_sees_a_rewrite_that_keeps_every_stat(tmp_path, monkeypatch):
    from ooc_spectral.io.source import open_source

    src = tmp_path / "x.zarr"
    assert run("make-data", "swiss-roll", "--n", 800, "--out", src, "--chunk-rows", 400,
               "-q") == (0, "")
    monkeypatch.setenv("OOC_SPECTRAL_FINGERPRINT", "content")
    before = open_source(str(src)).fingerprint()
    assert open_source(str(src)).fingerprint() == before  # reading changes nothing
    for chunk in (src / "data").rglob("*"):  # new times, same bytes: the same content
        os.utime(chunk, ns=(1, 1))
    assert open_source(str(src)).fingerprint() == before
    arr = zarr.open_group(str(src), mode="r+")["data"]
    arr[:400] = arr[:400][::-1]
    assert open_source(str(src)).fingerprint()["listing_sha256"] != before["listing_sha256"]


def test_sigterm_while_the_command_starts_is_exit_1(monkeypatch, capsys):
    import signal
    import time

    import ooc_spectral.batch.cli as batch_cli

    real = batch_cli.build_parser

    def slow_start():
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the command line is built
        time.sleep(0.5)
        return real()

    monkeypatch.setattr(batch_cli, "build_parser", slow_start)
    code, err = run("inspect", "/nonexistent", capsys=capsys)
    assert code == 1 and "interrupted by SIGTERM while starting" in err, err
