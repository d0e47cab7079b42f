"""Object storage end to end (issue 17), against a real S3-protocol server on 127.0.0.1.

One moto server (``ThreadedMotoServer``) serves the whole module; the client and
the dask workers reach it only through the standard AWS variables
(``AWS_ENDPOINT_URL`` and fake keys), or through ``--storage-options``. The
data are small (6000 rows) so the file stays fast; every fit uses the same
options, so the results compare to 1e-10.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

import ooc_spectral
from test_cli import EXE
from producers import producers_group

s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

N, CHUNK, TASK = 4000, 500, 1000  # 8 storage chunks, 4 tasks (and checkpoint segments)
FIT = ["--gamma", "0.02", "--tol", "1e-3", "--n-components", "3", "--chunk-rows", str(TASK),
       "--checkpoint-every", "1", "-q"]
THREADS = ["--engine", "threads"]  # no cluster start-up; workers: the tests that need them
BUCKET = "ooc"
# recognisable fake credentials: they must never appear in an output or a log
ENV_KEY_ID, ENV_SECRET = "AKIAOOC17ENVKEYID000", "ooc17-env-secret-never-written"
OPT_KEY_ID, OPT_SECRET = "AKIAOOC17OPTKEYID000", "ooc17-option-secret-never-written"


class _Throttle:
    """WSGI middleware: delays writes of checkpoint partials while ``on`` (pass 2 lasts), and
    makes a conditional write atomic, as S3 does.

    moto (5.2, ``S3Response.put_object``) checks ``If-None-Match: *`` / ``If-Match`` and then
    writes, without a lock, in a threaded server: under load two of eight runs creating the same
    lock object at once both passed the check (one failure of the lock test at load 28). S3
    decides a conditional write atomically; a lock here around every write gives the server
    that contract, so the lock tests test :class:`~ooc_spectral.io.storage.ObjectLock`, not
    moto's race."""

    def __init__(self, app):
        self.app, self.on, self.writes = app, False, threading.Lock()
        self.seen = None  # a list: every request's (method, path) is appended to it

    def __call__(self, environ, start_response):
        method = environ.get("REQUEST_METHOD")
        if self.seen is not None:
            self.seen.append((method, environ.get("PATH_INFO", "")))
        if self.on and method == "PUT" and "/partials/" in environ.get("PATH_INFO", ""):
            time.sleep(0.05)
        if method in ("PUT", "POST", "DELETE"):
            with self.writes:
                return self.app(environ, start_response)
        return self.app(environ, start_response)


@pytest.fixture(scope="module", autouse=True)
def _logging_of_the_module(restore_logging_module):
    """Module fixtures (``data``, ``local_fit``) and tests run main() in-process."""
    yield


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1, the AWS variables pointing at it, one bucket."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    throttle = _Throttle(server._server.app)
    server._server.app = throttle
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                            "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=ENV_KEY_ID,
                      AWS_SECRET_ACCESS_KEY=ENV_SECRET, AWS_DEFAULT_REGION="us-east-1")
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir(BUCKET)
    try:
        yield {"endpoint": endpoint, "fs": fs, "throttle": throttle}
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def run(*argv) -> int:
    from ooc_spectral.batch.cli import main

    return main([str(a) for a in argv])


def ls(fs, url: str) -> dict:
    """Every object under ``url``: key -> bytes."""
    fs.invalidate_cache()
    path = url.split("://", 1)[1]
    return {k: fs.cat_file(k) for k in fs.find(path)}


def embedding(loc):
    return zarr.open_array(f"{str(loc).rstrip('/')}/embedding", mode="r")[...]


@pytest.fixture(scope="module")
def data(s3, tmp_path_factory):
    """The same data set made locally and, by ``make-data --out s3://``, on S3."""
    d = tmp_path_factory.mktemp("s3data")
    assert run("make-data", "swiss-roll", "--n", N, "--chunk-rows", CHUNK,
               "--out", d / "roll.zarr", "-q") == 0
    url = f"s3://{BUCKET}/roll.zarr"
    assert run("make-data", "swiss-roll", "--n", N, "--chunk-rows", CHUNK, "--out", url,
               "-q") == 0
    return d / "roll.zarr", url


@pytest.fixture(scope="module")
def local_fit(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("localfit") / "out"
    assert run("fit", data[0], "--out", out, *FIT, *THREADS) == 0
    return out


def s3_fit(data, fs) -> str:
    """The OUTDIR ``test_fit_from_and_to_s3...`` writes from S3 to S3, which later tests
    read (or repair) rather than fit again: fitted here when such a test runs alone."""
    out = f"s3://{BUCKET}/fit"
    fs.invalidate_cache()
    if not fs.exists(f"{BUCKET}/fit/report.json"):
        assert run("fit", data[1], "--out", out, *FIT, *THREADS) == 0
    return out


# --------------------------------------------------------------------------- make-data
def test_make_data_to_s3_writes_the_same_values_as_locally(data, s3):
    local, url = data
    keys = ls(s3["fs"], url)
    assert f"{BUCKET}/roll.zarr/data/c/0/0" in keys and f"{BUCKET}/roll.zarr/zarr.json" in keys
    remote = zarr.open_group(url, mode="r")
    assert remote.attrs["ooc_spectral_dataset"]["complete"] is True
    np.testing.assert_array_equal(remote["data"][...], zarr.open_group(str(local))["data"][...])
    assert not any(p.name.startswith("s3") for p in local.parent.iterdir())


def test_a_data_set_on_s3_is_checked_as_an_array_too_and_a_killed_overwrite_is_finished(
        s3, monkeypatch):
    """The writer's per-chunk digests are checked for a data set's array opened by the caller
    on S3 (through its group, or at its own URL) as for a local one; ``make-data
    --overwrite`` killed while deleting (the chunks gone, the marker not yet) is finished by
    the same command, not refused as a foreign store."""
    from ooc_spectral.exceptions import DamagedDataError
    from ooc_spectral.io.source import open_source

    url, fs = f"s3://{BUCKET}/checked.zarr", s3["fs"]
    make = ["make-data", "blobs", "--n", 600, "--chunk-rows", 200, "--out", url, "-q"]
    assert run(*make) == 0
    rows = zarr.open_array(f"{url}/data", mode="r")[...]
    key = f"{BUCKET}/checked.zarr/data/c"
    fs.pipe_file(f"{key}/0/0", fs.cat_file(f"{key}/1/0"))  # chunk 1 copied over chunk 0
    fs.invalidate_cache()
    for arr in (zarr.open_group(url, mode="r")["data"], zarr.open_array(f"{url}/data", mode="r")):
        with pytest.raises(DamagedDataError, match="chunk 0"):
            open_source(arr).read_rows(0, 10)
    marker, deleted = f"{BUCKET}/checked.zarr/zarr.json", []
    from ooc_spectral.io import storage

    real_filesystem = storage.filesystem

    class Spy:  # the file system, its deletions recorded
        def __init__(self, fs):
            self.fs = fs

        def __getattr__(self, name):
            return getattr(self.fs, name)

        def rm(self, path, *args, **kwargs):
            deleted.append(str(path).rstrip("/"))
            return self.fs.rm(path, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(storage, "filesystem", lambda *a, **k: (lambda f, p: (Spy(f), p))(
            *real_filesystem(*a, **k)))
        assert run(*make, "--overwrite") == 0
    # the members one by one, the marker alone and last: a kill at any moment leaves it
    assert deleted and deleted[-1] == marker, deleted
    assert not any(marker.startswith(d + "/") or d == marker for d in deleted[:-1]), deleted
    fs.rm(f"{BUCKET}/checked.zarr/data", recursive=True)  # what a kill midway leaves
    fs.invalidate_cache()
    assert run(*make, "--overwrite") == 0
    assert run("verify", url, "-q") == 0
    np.testing.assert_array_equal(zarr.open_array(f"{url}/data", mode="r")[...], rows)


# --------------------------------------------------------------------------- fit
def test_fit_from_and_to_s3_equals_the_local_fit_and_the_rerun_is_a_no_op(
        data, local_fit, s3, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    out = f"s3://{BUCKET}/fit"
    assert run("fit", data[1], "--out", out, *FIT, *THREADS) == 0
    assert list(tmp_path.iterdir()) == []
    objects = ls(s3["fs"], out)
    report = json.loads(objects[f"{BUCKET}/fit/report.json"])
    local_report = json.loads((local_fit / "report.json").read_text())
    assert report["status"] == "complete" and report["outdir"] == out
    assert report["input"]["url"] == f"{data[1]}/data"
    np.testing.assert_allclose(embedding(out), embedding(local_fit), rtol=0, atol=1e-10)
    np.testing.assert_allclose(report["eigenvalues"], local_report["eigenvalues"], rtol=1e-10)
    assert report["dictionary_size"] == local_report["dictionary_size"]
    # the fingerprint is made of the objects' ETags
    fs = s3["fs"]
    etags = {k: v["ETag"] for k, v in fs.find(f"{BUCKET}/roll.zarr/data", detail=True).items()}
    assert report["input_fingerprint"]["n_objects"] == len(etags) == N // CHUNK + 1
    assert zarr.open_group(out).attrs["ooc_spectral_run"]["status"] == "complete"
    assert f"{BUCKET}/fit/.lock" not in objects  # released
    # the model loads from S3 and maps the training rows onto the embedding
    from ooc_spectral import GreedySpectralEmbedding

    est = GreedySpectralEmbedding.load(f"{out}/model")
    X = zarr.open_group(str(data[0]))["data"][:500]
    np.testing.assert_allclose(est.transform(X), embedding(out)[:500], atol=1e-8)

    # the rerun: nothing is recomputed, nothing is rewritten
    before = ls(fs, out)
    assert run("fit", data[1], "--out", out, *FIT, *THREADS) == 0
    assert ls(fs, out) == before
    # verify reads every chunk back from S3; inspect summarises the run there
    assert run("verify", out, "-q") == 0
    from ooc_spectral.batch.inspection import inspect_path

    text, info = inspect_path(out)
    assert text.startswith(f"ooc-spectral run at {out}") and info["status"] == "complete"
    assert info["report"]["eigenvalues"] == report["eigenvalues"]


def test_a_changed_input_on_s3_is_detected_by_its_etags(data, s3, tmp_path):
    """Issue 9 on S3: the same key rewritten with other bytes changes the fingerprint."""
    from ooc_spectral.io.source import open_source

    url = f"s3://{BUCKET}/changing.zarr"
    s3["fs"].copy(f"{BUCKET}/roll.zarr", f"{BUCKET}/changing.zarr", recursive=True)
    first = open_source(url).fingerprint()
    arr = zarr.open_group(url, mode="r+")["data"]
    arr[:CHUNK] = arr[:CHUNK] + 1.0  # one chunk rewritten, same size
    second = open_source(url).fingerprint()
    assert first["metadata_sha256"] == second["metadata_sha256"]
    assert first["listing_sha256"] != second["listing_sha256"]
    assert open_source(url).fingerprint() == second


def test_keys_the_store_refuses_are_exit_1_naming_the_urls_and_the_fix(data, s3, capsys):
    """moto's authentication on: every request with keys it does not know is a 403, which
    s3fs raises as a bare PermissionError("Forbidden"); the error names the command's
    URLs and where the credentials come from, and nothing is written."""
    from moto import settings as moto_settings

    out = f"s3://{BUCKET}/refused"
    before = ls(s3["fs"], f"s3://{BUCKET}")
    moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # every request is checked from now on
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        code = run("fit", data[1], "--out", out, *FIT, *THREADS)
    finally:
        moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")
        s3fs.S3FileSystem.clear_instance_cache()
    err = capsys.readouterr().err
    assert code == 1, err
    assert "PermissionError" in err and data[1] in err and out in err, err
    assert "AWS_ACCESS_KEY_ID" in err and "--storage-options" in err, err
    assert ls(s3["fs"], f"s3://{BUCKET}") == before


def test_a_store_that_cannot_be_reached_is_exit_1_for_every_command_without_tracebacks(
        tmp_path):
    """An endpoint where nothing listens (given on the command line): inspect said "not a
    zarr store", exit 2, while fit said exit 1, and each printed a traceback per request
    zarr left pending ("Exception ignored in: <coroutine ...>") after its message (an
    audit's finding). Now: exit 1 for each, one line saying the store could not be reached."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID="AKIAOOCCLOSEDPORT000", AWS_SECRET_ACCESS_KEY="never-used",
               AWS_DEFAULT_REGION="us-east-1", AWS_MAX_ATTEMPTS="3",
               OOC_SPECTRAL_READ_ATTEMPTS="1")  # retries: zarr's other requests still pending
    options = json.dumps({"endpoint_url": f"http://127.0.0.1:{port}"})
    url = "s3://bucket/data.zarr"
    for command in (["inspect", url], ["verify", url],
                    ["fit", url, "--out", str(tmp_path / "out"), "-q"]):
        proc = subprocess.run([EXE, *command, "--storage-options", options], env=env,
                              capture_output=True, text=True, cwd=tmp_path, timeout=300)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1, (command[0], proc.stderr)
        assert len(lines) == 1, (command[0], proc.stderr)  # no traceback after the message
        assert lines[0].startswith("ooc-spectral: error: ") and f"127.0.0.1:{port}" in lines[0]
        assert "could not be reached" in lines[0] and "is not a zarr store" not in lines[0]
    assert list(tmp_path.iterdir()) == []  # fit created nothing


def test_an_option_a_workflow_may_not_set_is_given_on_the_command_line(data, s3, tmp_path,
                                                                        capsys):
    """use_ssl = false in the file is exit 2 naming run --storage-options; given there,
    the same workflow runs."""
    wf = tmp_path / "wf.toml"
    wf.write_text(f'[storage_options]\nuse_ssl = false\n\n[[step]]\nrun = "inspect"\n'
                  f'path = "{data[1]}"\n')
    assert run("run", wf, "-q") == 2
    err = capsys.readouterr().err
    assert "use_ssl is not a storage option a workflow file may set" in err, err
    assert """--storage-options '{"use_ssl": ...}'""" in err, err
    wf.write_text(f'[[step]]\nrun = "inspect"\npath = "{data[1]}"\n')
    assert run("run", wf, "-q", "--storage-options", '{"use_ssl": false}',
               "--allow", f"read=s3://{BUCKET}") == 0, capsys.readouterr().err


def test_missing_credentials_are_exit_2_naming_the_aws_variables(data, s3, tmp_path,
                                                                 monkeypatch, capsys):
    """Issue 52, finding 7: no credentials at all was exit 1 ("run again") with a bare
    NoCredentialsError, so a nightly retry loop never ended. It is configuration: exit 2,
    naming the variables and the profile, for the commands that read and that write."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance to ask here
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        for command in (["fit", data[1], "--out", tmp_path / "out", *FIT, *THREADS],
                        ["verify", data[1]], ["inspect", data[1]],
                        ["make-data", "spiral", "--n", 100, "--out", f"s3://{BUCKET}/nocred"]):
            code = run(*command)
            err = capsys.readouterr().err
            assert code == 2, (command[0], err)
            assert "NoCredentialsError" in err and "AWS_ACCESS_KEY_ID" in err, err
            assert "AWS_PROFILE" in err and "run the same command again" not in err, err
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    assert not (tmp_path / "out").exists()


def test_an_s3_input_rewritten_while_transform_reads_it_is_exit_1(data, local_fit, s3,
                                                                   tmp_path, monkeypatch,
                                                                   capsys):
    """Issue 52: the input's fingerprint (ETags on S3) is checked at the end of a transform
    too; a writer between the first chunk and the last is exit 1, nothing complete."""
    from ooc_spectral.pipeline import writeback

    url = f"s3://{BUCKET}/rewritten.zarr"
    s3["fs"].copy(f"{BUCKET}/roll.zarr", f"{BUCKET}/rewritten.zarr", recursive=True)
    producers_group(url)  # rows its producer rewrites (a data set's are digested)
    original, calls = writeback._write_block, []

    def write_then_rewrite(*a, **kw):
        done = original(*a, **kw)
        calls.append(1)
        if len(calls) == 1:
            arr = zarr.open_group(url, mode="r+")["data"]
            arr[:] = arr[:] * 2.0
        return done

    monkeypatch.setattr(writeback, "_write_block", write_then_rewrite)
    out = tmp_path / "t"
    code = run("transform", local_fit, url, "--out", out, *THREADS, "-q")
    monkeypatch.setattr(writeback, "_write_block", original)
    err = capsys.readouterr().err
    assert code == 1 and "InputChangedError" in err, err
    assert not (out / "report.json").exists()
    assert run("transform", local_fit, url, "--out", out, *THREADS, "-q") == 0
    expected = zarr.open_array(str(data[0] / "data"), mode="r")[...]
    from ooc_spectral import GreedySpectralEmbedding

    model = GreedySpectralEmbedding.load(local_fit / "model")
    np.testing.assert_allclose(embedding(out), model.transform(expected.astype("f8") * 2.0),
                               rtol=0, atol=1e-10)


def test_a_complete_s3_outdir_missing_members_is_repaired_by_the_rerun(data, local_fit, s3):
    """The report and an embedding chunk deleted from a complete OUTDIR on S3: verify
    names them, and the same command restores them. The rerun removes the model and
    saves it again; zarr's shared file system instance still listed the removed model,
    and the save refused it ("a model or other data already exists", exit 2) before its
    listing was dropped (workflows/bench/adversarial.py, s3-deleted-*)."""
    fs = s3["fs"]
    out = s3_fit(data, fs)  # the S3 fit's OUTDIR, whole again at the end of this test
    assert run("verify", out, "-q") == 0  # its listings are now in this process's caches
    fs.rm(f"{BUCKET}/fit/report.json")
    fs.rm(f"{BUCKET}/fit/embedding/c/1/0")
    assert run("verify", out, "-q") == 1  # damage: exit 1, as for a local OUTDIR
    assert run("fit", data[1], "--out", out, *FIT, *THREADS) == 0
    assert run("verify", out, "-q") == 0
    np.testing.assert_allclose(embedding(out), embedding(local_fit), rtol=0, atol=1e-10)


# --------------------------------------------------------------------------- lock, SIGKILL
def _partials_done(fs, out: str) -> int:
    fs.invalidate_cache()
    base = out.split("://", 1)[1] + "/checkpoint/partials"
    done = 0
    try:
        found = fs.ls(base, detail=False)
    except FileNotFoundError:
        return 0
    for p in found:
        if p.endswith("zarr.json"):
            continue
        try:
            done += '"partial"' in fs.cat_file(p + "/zarr.json").decode()
        except FileNotFoundError:
            pass
    return done


def test_concurrent_fit_is_refused_naming_the_holder_and_sigkill_in_pass_2_resumes(
        data, local_fit, s3, capsys):
    fs, out = s3["fs"], f"s3://{BUCKET}/killed"
    s3["throttle"].on = True  # pass 2's checkpoint writes take a while
    try:
        proc = subprocess.Popen([EXE, "fit", data[1], "--out", out, *FIT, *THREADS],
                                start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.time() + 120
            while _partials_done(fs, out) < 1:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.time() < deadline
                time.sleep(0.02)
            # a second fit on the same OUTDIR while the first holds the lock
            capsys.readouterr()
            assert run("fit", data[1], "--out", out, *FIT, *THREADS) == 2
            err = capsys.readouterr().err
            assert "locked by another run" in err and f"pid {proc.pid} on {socket.gethostname()}" in err
            assert proc.poll() is None
            assert zarr.open_group(out).attrs["ooc_spectral_run"]["status"] == "running"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        s3["throttle"].on = False
    assert proc.returncode == -signal.SIGKILL
    saved = _partials_done(fs, out)
    assert 1 <= saved < N // TASK  # killed inside pass 2
    assert fs.exists(f"{BUCKET}/killed/.lock")  # the dead run's lease is left behind ...
    # ... and the rerun on this machine sees its process is gone, takes it over and resumes
    assert run("fit", data[1], "--out", out, *FIT, *THREADS, "--json") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "pass2" in summary["resumed_stages"]
    np.testing.assert_allclose(embedding(out), embedding(local_fit), rtol=0, atol=1e-10)
    assert not fs.exists(f"{BUCKET}/killed/.lock")


def test_a_checkpoint_part_is_written_without_reading_the_groups_above_it(s3, tmp_path):
    """zarr checks every group above a new array up to the store's root (a HEAD and a GET
    each, on S3): a pass-2 part sits four levels below the OUTDIR's root, about ten requests
    per array before its own. Written on stores rooted at the part and at each of its arrays,
    no group above the part is read or written; the part reads back whole, in the same
    objects as on a local disk."""
    from ooc_spectral.io.checkpoint import RunDirectory

    partial = {"mean": np.arange(3.0), "m2": np.eye(3), "rows": 500, "trace": 1.5}
    listings = []
    for out in (f"s3://{BUCKET}/parts/run", tmp_path / "run"):
        zarr.create_group(str(out), zarr_format=3)
        ck = RunDirectory(out).checkpoint(every=1)
        ck.save_partial("moments", 0, partial)  # the partials group made
        seen = s3["throttle"].seen = []
        try:
            ck.save_partial("moments", 1, {**partial, "rows": 499})
        finally:
            s3["throttle"].seen = None
        if isinstance(out, str):
            above = {f"/{BUCKET}/parts/run/zarr.json", f"/{BUCKET}/parts/run/checkpoint/zarr.json",
                     f"/{BUCKET}/parts/run/checkpoint/partials/zarr.json"}
            assert seen and not [r for r in seen if r[1] in above], seen
        fresh = RunDirectory(out).checkpoint(every=1)
        for segment, rows in ((0, 500), (1, 499)):
            back = fresh.load_partial("moments", segment)
            assert back["rows"] == rows and back["trace"] == 1.5
            np.testing.assert_array_equal(back["m2"], partial["m2"])
        assert fresh.discarded_partials == 0 and fresh.loaded_partials == 2
        listings.append(sorted(str(k).split("/run/", 1)[1] for k in (
            s3["fs"].find(f"{BUCKET}/parts/run") if isinstance(out, str)
            else (str(p) for p in out.rglob("*") if p.is_file()))))
    assert listings[0] == listings[1]


def test_object_lock_conditional_create_lease_and_takeover(s3, monkeypatch):
    from ooc_spectral.exceptions import LockedError
    from ooc_spectral.io.storage import ObjectLock

    fs, url = s3["fs"], f"s3://{BUCKET}/locks/a/.lock"
    # eight runs start together: exactly one creates the lock object
    locks = [ObjectLock(url) for _ in range(8)]
    barrier, outcome = threading.Barrier(8), {}

    def take(i):
        barrier.wait()
        try:
            locks[i].acquire(f"run {i}")
            outcome[i] = "held"
        except LockedError as exc:
            outcome[i] = str(exc)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, v in outcome.items() if v == "held"]
    assert len(winners) == 1
    assert all("locked by another run" in v and f"pid {os.getpid()}" in v
               for i, v in outcome.items() if i not in winners)
    locks[winners[0]].release()
    assert not fs.exists(url.split("://")[1])

    # a live holder elsewhere is refused by name; its expired lease is taken over
    foreign = {"pid": 4242, "host": "node-7.example", "boot_id": "x", "started": "then",
               "command": "fit s3://b/in", "holder": "h", "expires": time.time() + 60}
    fs.pipe_file(url.split("://")[1], json.dumps(foreign).encode())
    with pytest.raises(LockedError, match="pid 4242 on node-7.example"):
        ObjectLock(url).acquire()
    fs.pipe_file(url.split("://")[1], json.dumps({**foreign, "expires": time.time() - 1}).encode())
    monkeypatch.setenv("OOC_SPECTRAL_LEASE_SECONDS", "1.5")  # renewed every 0.5 s
    lock = ObjectLock(url)
    lock.acquire("the new run")
    assert json.loads(fs.cat_file(url.split("://")[1]))["holder"] == lock.holder_id
    lock.check()  # held: no error
    first = json.loads(fs.cat_file(url.split("://")[1]))["expires"]
    time.sleep(1.2)
    assert json.loads(fs.cat_file(url.split("://")[1]))["expires"] > first  # renewed
    # another run that overwrote the lock makes this one fail loudly before completing
    fs.pipe_file(url.split("://")[1], json.dumps({**foreign, "expires": time.time() + 60}).encode())
    deadline = time.time() + 10
    while lock._lost is None and time.time() < deadline:
        time.sleep(0.1)
    with pytest.raises(LockedError, match="another run took the lock"):
        lock.check()
    lock.release()
    assert json.loads(fs.cat_file(url.split("://")[1]))["pid"] == 4242  # not ours to delete


# --------------------------------------------------------------------------- transform
def test_transform_from_an_s3_model_to_an_s3_output(data, local_fit, s3, tmp_path,
                                                    monkeypatch):
    from ooc_spectral import GreedySpectralEmbedding

    monkeypatch.chdir(tmp_path)
    model, out = s3_fit(data, s3["fs"]), f"s3://{BUCKET}/transformed"
    assert run("transform", model, data[1], "--out", out, *THREADS, "-q") == 0
    assert list(tmp_path.iterdir()) == []
    X = zarr.open_group(str(data[0]))["data"][...]
    expected = GreedySpectralEmbedding.load(local_fit / "model").transform(X)
    np.testing.assert_allclose(embedding(out), expected, rtol=0, atol=1e-10)
    report = json.loads(s3["fs"].cat_file(f"{BUCKET}/transformed/report.json"))
    assert report["status"] == "complete" and report["model"] == model
    assert zarr.open_group(out).attrs["ooc_spectral_run"]["status"] == "complete"


# --------------------------------------------------------------------------- no shared files
def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               "mount -t tmpfs tmpfs /tmp"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_workers_that_cannot_see_the_clients_files_fit_from_and_to_s3(
        data, local_fit, s3, tmp_path, tmp_path_factory, monkeypatch):
    """The worker runs in its own mount namespace where an empty tmpfs covers pytest's
    temporary root: the client's temporary directory (where it runs, and where the
    local copy of the data is) does not exist there, while the installed package
    stays visible wherever the checkout lives (a checkout under /tmp included). Where ``unshare`` is not allowed, the client's temporary
    directory is removed before the passes instead. The worker has no AWS variables
    either: endpoint and keys reach it only as the command's ``--storage-options``,
    and its log does not show them."""
    from distributed import Client, LocalCluster

    client_dir = tmp_path / "client"
    client_dir.mkdir()
    (client_dir / "only-on-the-client").write_text("x")
    monkeypatch.chdir(client_dir)
    hidden = tmp_path_factory.getbasetemp()
    isolated = _unshare_works() and not Path(ooc_spectral.__file__).is_relative_to(hidden)
    with LocalCluster(n_workers=0, dashboard_address=":0", scheduler_port=0) as cluster:
        worker = ["dask", "worker", cluster.scheduler_address, "--nworkers", "1",
                  "--nthreads", "1", "--memory-limit", "2GiB", "--no-dashboard"]
        if isolated:
            worker = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                      f"mount -t tmpfs tmpfs {shlex.quote(str(hidden))} && cd / && exec "
                      + " ".join(worker)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        worker_log = open(tmp_path / "worker.log", "w+")
        proc = subprocess.Popen(worker, start_new_session=True, stdout=worker_log,
                                stderr=subprocess.STDOUT, cwd="/", env=env)
        try:
            with Client(cluster) as c:
                c.wait_for_workers(1, timeout=60)
                seen = c.run(lambda p=str(client_dir): os.path.exists(p))
            if isolated:
                assert list(seen.values()) == [False]  # the worker cannot see the client's files
            else:
                import shutil

                shutil.rmtree(client_dir)  # nothing a worker needs may live there
            out = f"s3://{BUCKET}/isolated"
            options = json.dumps({"endpoint_url": s3["endpoint"], "key": OPT_KEY_ID,
                                  "secret": OPT_SECRET,
                                  "client_kwargs": {"region_name": "us-east-1"}})
            assert run("fit", data[1], "--out", out, *FIT, "--scheduler",
                       cluster.scheduler_address, "--storage-options", options, "--json") == 0
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    report = json.loads(s3["fs"].cat_file(f"{BUCKET}/isolated/report.json"))
    assert report["workers"] == 1 and report["scheduler"] == cluster.scheduler_address
    np.testing.assert_allclose(embedding(out), embedding(local_fit), rtol=0, atol=1e-10)
    worker_log.seek(0)
    text = worker_log.read()
    assert "Starting Worker" in text or "Start worker" in text, text
    assert OPT_SECRET not in text and OPT_KEY_ID not in text


# --------------------------------------------------------------------------- missing backend
HIDE_S3FS = """
import sys, importlib.abc
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "s3fs" or name.startswith("s3fs."):
            raise ModuleNotFoundError("No module named 's3fs'", name="s3fs")
sys.meta_path.insert(0, Hide())
for m in [m for m in sys.modules if m == "s3fs" or m.startswith("s3fs.")]:
    del sys.modules[m]
from ooc_spectral.batch.cli import main
codes = [main(a) for a in ARGS]
print(codes)
"""


def test_output_url_without_s3fs_is_exit_2_naming_it_and_creates_nothing(data, tmp_path):
    args = [["make-data", "spiral", "--n", "10", "--out", "s3://b/d.zarr", "-q"],
            ["fit", str(data[0]), "--out", "s3://b/run", "-q"],
            ["transform", str(tmp_path / "model"), str(data[0]), "--out", "s3://b/t", "-q"],
            ["fit", "s3://b/in.zarr", "--out", str(tmp_path / "o"), "-q"]]
    proc = subprocess.run([sys.executable, "-c", HIDE_S3FS.replace("ARGS", repr(args))],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.stdout.strip().splitlines()[-1] == "[2, 2, 2, 2]", proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith("ooc-spectral: error:")]
    assert len(errors) == 4 and all("pip install s3fs" in e for e in errors), proc.stderr
    assert list(tmp_path.iterdir()) == []  # no 's3:' directory, nothing at all


def _gcsfs_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("gcsfs") is None


def _writing_command(command: str, data, tmp_path) -> list[str]:
    """The arguments of a command that writes to --out, before --out."""
    return {"make-data": ["make-data", "spiral", "--n", "10"],
            "fit": ["fit", str(data[0])],
            "transform": ["transform", str(tmp_path / "model"), str(data[0])]}[command]


@pytest.mark.parametrize("url, says", [
    ("nosuchscheme://bucket/run", "fsspec does not know"),
    pytest.param("gs://bucket/run", "pip install gcsfs", marks=pytest.mark.skipif(
        not _gcsfs_missing(), reason="gcsfs is installed")),
])
@pytest.mark.parametrize("command", ["make-data", "fit", "transform"])
def test_an_unknown_scheme_is_exit_2_and_creates_nothing(data, tmp_path, monkeypatch, command,
                                                         capsys, url, says):
    from ooc_spectral.exceptions import StorageBackendError
    from ooc_spectral.io.checkpoint import RunDirectory

    monkeypatch.chdir(tmp_path)
    args = _writing_command(command, data, tmp_path)
    assert run(*args, "--out", url, "-q") == 2
    assert says in capsys.readouterr().err
    with pytest.raises(StorageBackendError, match=says):
        RunDirectory(url)
    assert list(tmp_path.iterdir()) == []



@pytest.mark.parametrize("out, says", [
    ("s3:/bucket/run", "looks like a s3:// URL with its slashes missing"),
    ("s3:bucket/run", "write s3://bucket/run"),
    ("S3://bucket/run", "URL schemes are read in lower case only; write s3://bucket/run"),
    ("~/run", "starts with '~', which no shell expanded"),
    ("memory://run", "a memory:// store lives only as long as this command's process"),
])
@pytest.mark.parametrize("command", ["make-data", "fit", "transform"])
def test_an_output_that_would_land_where_nobody_looks_is_exit_2(data, tmp_path, monkeypatch,
                                                                 command, capsys, out, says):
    """Each of these exited 0 before (an outside audit): a local directory named 's3:'
    or '~', or a memory:// store gone when the command ended."""
    monkeypatch.chdir(tmp_path)
    args = _writing_command(command, data, tmp_path)
    assert run(*args, "--out", out, "-q") == 2
    assert says in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_workflow_path_that_looks_like_a_mistyped_url_is_exit_2(data, tmp_path, capsys):
    wf = tmp_path / "wf.toml"
    for out, says in [("s3:/bucket/run", "key 'out' = 's3:/bucket/run' looks like a s3:// URL"),
                      ("~/run", "key 'out' = '~/run' starts with '~'")]:
        wf.write_text(f'[[step]]\nrun = "fit"\ninput = "{data[0]}"\nout = "{out}"\n')
        assert run("run", str(wf), "-q") == 2
        assert says in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wf.toml"]

# --------------------------------------------------------------------------- secrets
def test_no_secret_in_the_report_the_outputs_or_the_logs(data, local_fit, s3, tmp_path):
    """Endpoint and credentials given only as storage options, in a workflow's
    [storage_options] table, a step's own table and ``run --storage-options`` (the
    process has no AWS variables): they are used, and written nowhere, not even in a
    -v log. (Workers given the options alone: the test above.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    fit_out, tr_out = f"s3://{BUCKET}/secret-fit", f"s3://{BUCKET}/secret-transform"
    wf = tmp_path / "wf.toml"
    wf.write_text(f"""
[workflow]
name = "object storage"

[storage_options]
endpoint_url = "{s3['endpoint']}"

[[step]]
run = "fit"
input = "{data[1]}"
out = "{fit_out}"
gamma = 0.02
tol = 1e-3
n_components = 3
chunk_rows = {TASK}
engine = "threads"
storage_options = {{ key = "{OPT_KEY_ID}", secret = "{OPT_SECRET}" }}

[[step]]
run = "transform"
model = "{fit_out}"
input = "{data[1]}"
out = "{tr_out}"
engine = "threads"
storage_options = {{ key = "{OPT_KEY_ID}", secret = "{OPT_SECRET}" }}
""")
    region = json.dumps({"client_kwargs": {"region_name": "us-east-1"}})
    # the file's endpoint and its s3:// outputs need the command line's permission (issue 37)
    flow = subprocess.run([EXE, "run", wf, "-v", "--storage-options", region,
                           "--allow", f"endpoint={s3['endpoint']}", "--allow", "outside-root",
                           "--allow", f"read=s3://{BUCKET}"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert flow.returncode == 0, flow.stderr
    assert "stage pass3" in flow.stderr  # -v: the log was there to search
    fs = s3["fs"]
    written = {**ls(fs, fit_out), **ls(fs, tr_out)}
    assert f"{BUCKET}/secret-fit/report.json" in written and len(written) > 20
    for secret in (OPT_SECRET, OPT_KEY_ID, ENV_SECRET, ENV_KEY_ID):
        assert secret not in flow.stderr + flow.stdout
        assert not [k for k, v in written.items() if secret.encode() in v]
    attrs = zarr.open_group(fit_out).attrs["ooc_spectral_run"]
    assert attrs["workflow"]["resolved"]["storage_options"] == {"key": "***", "secret": "***"}
    np.testing.assert_allclose(embedding(fit_out), embedding(local_fit), rtol=0, atol=1e-10)
    np.testing.assert_allclose(embedding(tr_out), embedding(local_fit), rtol=0, atol=1e-8)
