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
from producers import producers_group

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
def test_verify_names_a_missing_member_exit_1_and_the_rerun_restores_it(small, fresh, tmp_path,
                                                                        capsys, member):
    out = tmp_path / "out"
    _fit(small, out)
    if member.startswith("garbled "):
        (out / member.split()[1]).write_text('{"status": "comp')
    else:
        _remove(out / member)
    code, err = run("verify", out, capsys=capsys)
    assert code == 1, err  # damage, as a damaged chunk is (an outside audit: it was 2)
    assert "run ooc-spectral fit" in err and str(out) in err
    code, err = run("fit", small, "--out", out, *FIT, capsys=capsys)
    assert code == 0, err
    code, err = run("verify", out, capsys=capsys)
    assert code == 0, err
    emb = zarr.open_array(str(out / "embedding"), mode="r")[...]
    assert np.array_equal(emb, fresh[0])  # bit-identical to a fresh run
    report = json.loads((out / "report.json").read_text())
    assert report["config_hash"] == fresh[1]["config_hash"]


# ------------------------------------------------------------------ 7: damaged JSON is exit 2 (verify: 1)
@pytest.mark.parametrize("where", ["zarr.json", "model/zarr.json", "model/w/zarr.json"])
def test_a_garbled_json_is_exit_2_naming_the_file_never_retry_forever(small, fresh, tmp_path,
                                                                      capsys, where):
    out = tmp_path / "out"
    _fit(small, out)
    (out / where).write_text("{\"zarr_format\": 3, \"node_")
    code, err = run("verify", out, capsys=capsys)
    assert code == 1, err  # verify found damage: exit 1 (the commands that read it: 2)
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
    assert run("verify", out, capsys=capsys)[0] == 1
    code, err = run("fit", small, "--out", out, *FIT, capsys=capsys)
    assert code == 0, err
    code, err = run("verify", out, capsys=capsys)
    assert code == 0, err
    assert np.array_equal(zarr.open_array(str(out / "embedding"), mode="r")[...], fresh[0])


# ------------------------------------------------------------------ 11: transform spares its model
@pytest.fixture(scope="module")
def fitted(small, tmp_path_factory):
    """A complete fit OUTDIR, and a second one of other options (another model)."""
    d = tmp_path_factory.mktemp("fitted")
    _fit(small, d / "fit")
    code, err = run("fit", small, "--out", d / "other", "--gamma", "0.08", *FIT[2:])
    assert code == 0, err
    return d / "fit", d / "other"


def _copy_fit(fitted, tmp_path) -> Path:
    import shutil

    shutil.copytree(fitted[0], tmp_path / "fit", symlinks=True)
    return tmp_path / "fit"


@pytest.mark.parametrize("model, out", [
    ("fit/model", "fit"),  # --out holds the model
    ("fit", "fit"),  # --out is the OUTDIR given as the model
    ("fit/model", "fit/model"),
    ("fit", "fit/model"),  # --out inside the model's directory
    ("fit/model", "fit/model/t"),
    ("fit", "link"),  # the same directory by another name: resolved paths compared
], ids=["out-holds-model", "out-is-outdir", "out-is-model", "out-is-outdir-member",
        "out-inside-model", "out-a-symlink-to-outdir"])
def test_transform_refuses_an_out_that_is_holds_or_is_inside_its_model(small, fitted, tmp_path,
                                                                      capsys, model, out):
    """transform MODEL IN --out OUT --overwrite deleted the fit OUTDIR holding the very model
    it applied, exit 0 (an outside audit): refused up front, exit 2, nothing deleted."""
    _copy_fit(fitted, tmp_path)
    (tmp_path / "link").symlink_to(tmp_path / "fit", target_is_directory=True)
    before = snapshot(tmp_path)
    code, err = run("transform", tmp_path / model, small, "--out", tmp_path / out,
                    "--overwrite", *FIT[6:], capsys=capsys)
    assert code == 2, err
    assert "the model this command applies" in err and "choose an --out outside" in err, err
    assert snapshot(tmp_path) == before
    # an --out beside the model is still fine
    code, err = run("transform", tmp_path / model, small, "--out", tmp_path / "t", *FIT[6:],
                    capsys=capsys)
    assert code == 0, err


def test_transform_of_an_outdir_refuses_a_model_of_another_run_as_verify_does(
        small, fitted, tmp_path, capsys):
    import shutil

    fit = _copy_fit(fitted, tmp_path)
    shutil.rmtree(fit / "model")
    shutil.copytree(fitted[1] / "model", fit / "model")  # a wrong backup restored
    code, err = run("verify", fit, capsys=capsys)
    assert code == 1 and "not this run's" in err, err
    code, err = run("transform", fit, small, "--out", tmp_path / "t", *FIT[6:], capsys=capsys)
    assert code == 2, err
    assert "model: not this run's" in err and f"--out {fit}" in err, err
    assert not (tmp_path / "t").exists()
    assert run("fit", small, "--out", fit, *FIT, capsys=capsys)[0] == 0  # the advice works
    code, err = run("transform", fit, small, "--out", tmp_path / "t", *FIT[6:], capsys=capsys)
    assert code == 0, err
    assert np.array_equal(zarr.open_array(str(tmp_path / "t" / "embedding"), mode="r")[...],
                          zarr.open_array(str(fit / "embedding"), mode="r")[...])


def test_transform_of_an_unfinished_fit_names_the_fit_to_rerun(small, fitted, tmp_path, capsys):
    """A killed fit's OUTDIR (status running, no model nor report yet): transform said "save
    the model again" (an outside audit); the fit did not finish, and its rerun resumes."""
    fit = _copy_fit(fitted, tmp_path)
    _remove(fit / "model")
    _remove(fit / "report.json")
    meta = json.loads((fit / "zarr.json").read_text())
    meta["attributes"]["ooc_spectral_run"]["status"] = "running"
    (fit / "zarr.json").write_text(json.dumps(meta))
    code, err = run("transform", fit, small, "--out", tmp_path / "t", *FIT[6:], capsys=capsys)
    assert code == 2, err
    assert "the fit did not finish" in err and "rerun the same fit command" in err, err
    assert f"ooc-spectral fit {small}" in err and "save the model again" not in err, err
    assert not (tmp_path / "t").exists()
    assert run("fit", small, "--out", fit, *FIT, capsys=capsys)[0] == 0
    code, err = run("transform", fit, small, "--out", tmp_path / "t", *FIT[6:], capsys=capsys)
    assert code == 0, err


# ------------------------------------------------------------------ 12: verify's exit code
@pytest.mark.parametrize("damage", ["embedding chunk", "model array", "report.json",
                                    "model of another run", "garbled zarr.json"])
def test_verify_exits_1_for_every_kind_of_damage(small, fitted, tmp_path, capsys, damage):
    """verify documents "exit 1 when any" damage, but a deleted report or another run's model
    was exit 2, a chunk exit 1, with the same remedy (an outside audit)."""
    import shutil

    fit = _copy_fit(fitted, tmp_path)
    if damage == "embedding chunk":
        _remove(fit / "embedding" / "c" / "0" / "0")
    elif damage == "model array":
        _remove(fit / "model" / "w")
    elif damage == "report.json":
        _remove(fit / "report.json")
    elif damage == "model of another run":
        shutil.rmtree(fit / "model")
        shutil.copytree(fitted[1] / "model", fit / "model")
    else:
        (fit / "zarr.json").write_text('{"zarr_format": 3, "node_')
    code, err = run("verify", fit, capsys=capsys)
    assert code == 1, err
    assert "ooc-spectral fit" in err or "run the command again" in err, err  # the repair
    assert run("verify", tmp_path / "nothing", capsys=capsys)[0] == 2  # nothing to check


# ------------------------------------------------------------------ 5: verify of a data set
def _dataset_complete(path: Path, complete: bool) -> None:
    meta = json.loads((path / "zarr.json").read_text())
    meta["attributes"]["ooc_spectral_dataset"]["complete"] = complete
    (path / "zarr.json").write_text(json.dumps(meta))


def test_verify_of_an_unfinished_data_set_names_make_data_as_the_fit_does(small, tmp_path,
                                                                          capsys):
    """verify on a data set whose make-data was killed advised `ooc-spectral fit INPUT --out
    <the data set>` (an outside audit); it says what the fit's refusal says: rerun make-data."""
    import shutil

    data = tmp_path / "x.zarr"
    shutil.copytree(small, data)
    _dataset_complete(data, False)  # what a killed make-data leaves
    code, verr = run("verify", data, capsys=capsys)
    assert code == 1, verr
    assert "make-data again with --overwrite" in verr and "ooc-spectral fit" not in verr, verr
    code, ferr = run("fit", data, "--out", tmp_path / "fit", *FIT, capsys=capsys)
    assert code == 2, ferr
    advice = ferr.strip().splitlines()[-1].split("(complete: false): ", 1)[1]
    assert advice in verr  # one wording, from one place
    # a finished data set damaged since: its writer writes it again, not a fit into it
    _dataset_complete(data, True)
    _remove(data / "data" / "c" / "1" / "0")
    code, err = run("verify", data, capsys=capsys)
    assert code == 1, err
    assert "the same `ooc-spectral make-data` command again" in err, err
    assert "ooc-spectral fit" not in err, err


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
    code, err = run("run", wf, "-q", "--allow", "read=s3://b", capsys=capsys)
    assert code == 2 and "--allow endpoint=" in err, err


def test_an_allowed_endpoint_passes_the_check():
    from ooc_spectral.batch.workflow import check_storage_options
    from ooc_spectral.exceptions import WorkflowError

    opts = {"endpoint_url": "http://127.0.0.1:9000/", "client_kwargs": {"region_name": "x"}}
    check_storage_options(opts, {"endpoint=http://127.0.0.1:9000"}, "w")
    with pytest.raises(WorkflowError, match="--allow endpoint=http://127.0.0.1:9000/"):
        check_storage_options(opts, {"endpoint=http://127.0.0.1:9001"}, "w")
    check_storage_options({"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}},
                          {"endpoint=http://127.0.0.1:9000"}, "w")
    # credentials the file brings itself, and anon: no permission needed
    check_storage_options({"key": "k", "secret": "s", "token": "t", "anon": False}, set(), "w")
    # inside an array of tables, an array of endpoints (an audit's finding): not options a
    # file may set at all, with an endpoint allowed or not
    for nested in ({"x": [{"endpoint_url": "http://127.0.0.1:9001"}]},
                   {"endpoint_urls": ["http://127.0.0.1:9001"]}):
        for allow in (set(), {"endpoint=http://127.0.0.1:9001"}):
            with pytest.raises(WorkflowError, match="not a storage option a workflow file may"):
                check_storage_options(nested, allow, "w")


@pytest.mark.parametrize("options, key", [
    ({"use_ssl": False}, "use_ssl"),
    ({"config_kwargs": {"proxies": {"http": "http://127.0.0.1:9"}}}, "config_kwargs"),
    ({"client_kwargs": {"verify": False}}, "client_kwargs.verify"),
    ({"client_kwargs": {"proxies": {"https": "http://127.0.0.1:9"}}}, "client_kwargs.proxies"),
    ({"client_kwargs": {"region_name": "x", "use_ssl": False}}, "client_kwargs.use_ssl"),
    ({"s3_additional_kwargs": {"ACL": "public-read"}}, "s3_additional_kwargs"),
    ({"account_name": "attacker"}, "account_name"),
    ({"s3": {"endpoint_url": "http://127.0.0.1:9"}}, "s3"),  # per-protocol options
    ({"client_kwargs": "http://127.0.0.1:9"}, "client_kwargs"),
    ({"anon": "false"}, "anon must be a boolean"),  # a string "false" is true to Python
    ({"endpoint_url": ["http://127.0.0.1:9"]}, "endpoint_url must be a string"),
])
def test_a_workflow_may_set_only_the_storage_options_of_its_allow_list(options, key):
    """An allow-list (an audit's finding: botocore's proxies, spelled
    config_kwargs = {proxies = {http = ...}}, and use_ssl = false got past a check of option
    names): anything else is exit 2 naming the option and the command line that gives it,
    whatever --allow says."""
    from ooc_spectral.batch.workflow import check_storage_options
    from ooc_spectral.exceptions import WorkflowError

    allow = {"endpoint=http://127.0.0.1:9", "outside-root", "scheduler", "overwrite"}
    with pytest.raises(WorkflowError) as info:
        check_storage_options(options, allow, "w.toml: [storage_options]")
    message = str(info.value)
    assert message.startswith(f"w.toml: [storage_options]: {key}"), message
    if "must be a" not in key:
        assert "--storage-options" in message, message
        assert "127.0.0.1" not in message and "public-read" not in message  # no value echoed


@pytest.mark.parametrize("table", [
    # the audit's reproduction: a proxy for every request, and no TLS
    'use_ssl = false\nconfig_kwargs = {{ proxies = {{ http = "http://127.0.0.1:{port}", '
    'https = "http://127.0.0.1:{port}" }} }}\n',
    'client_kwargs = {{ proxies = {{ http = "http://127.0.0.1:{port}" }} }}\n',
])
def test_a_workflow_cannot_route_requests_through_a_proxy_of_its_choosing(
        tmp_path, capsys, monkeypatch, table):
    """The listener stands in for the file's proxy; the credentials are fake. With --allow
    endpoint=... for the proxy's own URL too: a proxy is no endpoint."""
    import socket

    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAOOCPROXYTEST0000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "never-sent")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    wf = _workflow(tmp_path, "[storage_options]\n" + table.format(port=port)
                   + '[[step]]\nrun = "inspect"\npath = "s3://some-bucket/data.zarr"\n')
    for allow in ((), ("--allow", f"endpoint=http://127.0.0.1:{port}")):
        code, err = run("run", wf, "-q", *allow, capsys=capsys)
        assert code == 2, err
        assert "is not a storage option a workflow file may set" in err, err
        assert "--storage-options" in err and "Traceback" not in err, err
    with pytest.raises(socket.timeout):  # no request ever reached it
        listener.accept()
    listener.close()


# ------------------------------------------------------------------ 5: a restored mtime
def test_a_chunk_rewritten_with_its_mtime_restored_is_seen_and_the_rerun_refits(tmp_path, capsys):
    import shutil

    src = tmp_path / "x.zarr"
    assert run("make-data", "swiss-roll", "--n", 1200, "--out", src, "--chunk-rows", 400,
               "-q") == (0, "")
    producers_group(src)  # rows its producer rewrites
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


def test_an_outdir_a_workflow_wrote_names_the_workflow_as_its_repair(small, tmp_path, capsys):
    """verify's repair for the OUTDIR of a workflow's step is the workflow (the steps' options
    are in the file, not on a command line), and rerunning it repairs the OUTDIR."""
    opts = 'gamma = 0.05\ntol = 0.01\nn_components = 2\nengine = "threads"\n'
    wf = _workflow(tmp_path, f'[[step]]\nrun = "fit"\ninput = "{small}"\nout = "fit"\n{opts}'
                             f'[[step]]\nrun = "transform"\nmodel = "fit"\ninput = "{small}"\n'
                             'out = "emb"\n')
    assert run("run", wf, "-q", capsys=capsys)[0] == 0
    good = np.asarray(zarr.open_array(str(wf.parent / "emb" / "embedding"), mode="r")[...])
    for name in ("fit", "emb"):
        chunk = next(p for p in (wf.parent / name / "embedding" / "c").rglob("*") if p.is_file())
        chunk.unlink()
        code, err = run("verify", wf.parent / name, capsys=capsys)
        assert code == 1 and f"ooc-spectral run {wf}" in err and "ooc-spectral transform" not in err, err
    assert run("run", wf, "-q", capsys=capsys)[0] == 0
    for name in ("fit", "emb"):
        assert run("verify", wf.parent / name, capsys=capsys)[0] == 0
    again = np.asarray(zarr.open_array(str(wf.parent / "emb" / "embedding"), mode="r")[...])
    np.testing.assert_array_equal(again, good)


def test_verify_says_when_a_model_is_of_a_format_this_version_cannot_read(tmp_path, capsys):
    """A model written by a newer version (its description resealed with format 4) is intact
    byte for byte, but transform refuses it: verify says so beside "intact"."""
    from ooc_spectral import GreedySpectralEmbedding
    from ooc_spectral.io.integrity import sealed
    from ooc_spectral.io.persistence import ATTRS_KEY, MODEL_KEY

    X = np.random.default_rng(0).normal(size=(200, 3))
    path = tmp_path / "model.zarr"
    GreedySpectralEmbedding(n_components=2, gamma=0.05, tol=1e-2, random_state=0).fit(X).save(path)
    assert run("verify", path, capsys=capsys)[0] == 0
    group = zarr.open_group(str(path), mode="r+")
    meta = {k: v for k, v in dict(group.attrs[MODEL_KEY]).items() if k != ATTRS_KEY}
    group.attrs[MODEL_KEY] = sealed({**meta, "format": 4}, key=ATTRS_KEY)
    code, out = run("verify", path, capsys=capsys)
    assert code == 0 and "intact" in out and "the model has format 4" in out, out
    assert "transform and load refuse it" in out, out
    code, err = run("transform", path, tmp_path / "x.zarr", "--out", tmp_path / "o", capsys=capsys)
    assert code == 2 and "has format 4" in err, err
