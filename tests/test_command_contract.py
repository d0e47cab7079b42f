"""Every command that writes an OUTDIR keeps fit's promises (issue 52).

One test per finding of the issue, through the command line (``main([...])`` in-process,
or the console script in a subprocess where a signal or a pause is what is tested), on
real zarr stores: a damaged ``transform`` OUTDIR is repaired by the same command; an input
rewritten while ``transform`` or the update reads it is ``InputChangedError``, exit 1,
never a complete mix; ``representatives_model`` carries digests; a workflow file reads no
URL the command line did not allow; SIGTERM after the model stage is an exit code, never
death by the signal; a chunk copied over another chunk of the same OUTDIR is found; a
deleted chunk is "missing". And the contract's other commands: ``make-data`` and
``import`` check what they wrote when run again, and repair it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from ooc_spectral.batch.cli import main
from test_outdir_safety import run
from producers import producers_group

FIT = ["--gamma", "0.05", "--tol", "1e-2", "--n-components", "2", "--engine", "threads",
       "--threads-per-worker", "1", "--chunk-rows", "500", "-q"]
REPS = ["--affinity", "representatives", "--n-clusters", "3", "--n-representatives", "60",
        "--engine", "threads", "--threads-per-worker", "1", "-q"]


@pytest.fixture(scope="module", autouse=True)
def _logging_of_the_module(restore_logging_module):
    yield


def emb(out, name="embedding") -> np.ndarray:
    return zarr.open_array(str(Path(out) / name), mode="r")[...]


def status(out) -> str | None:
    try:
        return json.loads((Path(out) / "zarr.json").read_text())["attributes"][
            "ooc_spectral_run"]["status"]
    except (OSError, ValueError, KeyError):
        return None


def chunk_files(arr_dir: Path) -> list[Path]:
    return sorted(p for p in (arr_dir / "c").rglob("*") if p.is_file())


def flip(path: Path) -> None:
    b = bytearray(path.read_bytes())
    b[len(b) // 2] ^= 0x10
    path.write_bytes(bytes(b))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("contract")
    assert main(["make-data", "swiss-roll", "--n", "3000", "--out", str(d / "x.zarr"),
                 "--chunk-rows", "500", "-q"]) == 0
    assert main(["make-data", "swiss-roll", "--n", "3000", "--out", str(d / "y.zarr"),
                 "--chunk-rows", "500", "--seed", "7", "-q"]) == 0
    return d


@pytest.fixture(scope="module")
def fitted(data):
    out = data / "fit"
    assert main(["fit", str(data / "x.zarr"), "--out", str(out), *FIT]) == 0
    return out


@pytest.fixture(scope="module")
def transformed(data, fitted):
    out = data / "t"
    assert main(["transform", str(fitted), str(data / "x.zarr"), "--out", str(out),
                 "--chunk-rows", "500", "-q"]) == 0
    return out, emb(out)


@pytest.fixture(scope="module")
def clustered(data):
    out = data / "reps"
    assert main(["fit", str(data / "x.zarr"), "--out", str(out), *REPS]) == 0
    return out, emb(out), emb(out, "labels")


# ------------------------------------------------------------------ finding 1 (and 8)
def _damage(out: Path, how: str) -> None:
    chunks = chunk_files(out / "embedding")
    if how == "flipped chunk":
        flip(chunks[1])
    elif how == "deleted chunk":
        chunks[1].unlink()
    elif how == "chunk copied over another of the same OUTDIR":
        shutil.copyfile(chunks[0], chunks[2])
    elif how == "deleted embedding":
        shutil.rmtree(out / "embedding")
    elif how == "deleted report.json":
        (out / "report.json").unlink()


@pytest.mark.parametrize("how", ["flipped chunk", "deleted chunk",
                                 "chunk copied over another of the same OUTDIR",
                                 "deleted embedding", "deleted report.json"])
def test_a_damaged_transform_outdir_is_repaired_by_the_same_command(data, fitted, transformed,
                                                                   tmp_path, capsys, how):
    """Finding 1: verify named the damage and the transform command that repairs it, and
    that command exited 0 changing nothing (the old report returned unchecked)."""
    ref_out, ref = transformed
    out = tmp_path / "t"
    shutil.copytree(ref_out, out)
    _damage(out, how)
    code, text = run("verify", out, capsys=capsys)
    assert code == 1 and "ooc-spectral transform" in text, text
    if how == "deleted chunk":  # finding 8: missing, not "damaged"
        assert "embedding: missing: chunk embedding/c/1/0" in text, text
        assert "damaged: chunk embedding/c/1/0" not in text, text
    if how.startswith("chunk copied"):  # finding 8: the digest's key holds the chunk's index
        assert "embedding: damaged: chunk embedding/c/2/0" in text, text
    code, text = run("transform", fitted, data / "x.zarr", "--out", out, "--chunk-rows", 500,
                     capsys=capsys)
    assert code == 0 and "repairing it" in text, text
    assert run("verify", out)[0] == 0
    np.testing.assert_array_equal(emb(out), ref)


def test_a_flipped_labels_chunk_of_a_representatives_transform_is_repaired(data, clustered,
                                                                          tmp_path, capsys):
    """Finding 1, for ``transform FIT_OUTDIR`` of a representatives fit (predict)."""
    fit_out = clustered[0]
    out = tmp_path / "t"
    assert run("transform", fit_out, data / "x.zarr", "--out", out, "-q") == (0, "")
    labels, coords = emb(out, "labels"), emb(out)
    np.testing.assert_array_equal(labels, clustered[2])  # predict on the rows fitted
    flip(chunk_files(out / "labels")[2])
    code, text = run("verify", out, capsys=capsys)
    assert code == 1 and "labels: damaged: chunk labels/c/2" in text, text
    assert run("transform", fit_out, data / "x.zarr", "--out", out, "-q")[0] == 0
    assert run("verify", out)[0] == 0
    np.testing.assert_array_equal(emb(out, "labels"), labels)
    np.testing.assert_array_equal(emb(out), coords)


# ------------------------------------------------------------------ findings 2 and 3
def _rewrite_every_row(path: Path) -> None:
    arr = zarr.open_array(str(path / "data"), mode="r+")
    arr[...] = arr[...][::-1] * 1.5


def test_an_input_rewritten_while_transform_runs_is_exit_1_never_complete(
        data, fitted, tmp_path, monkeypatch, capsys):
    """Finding 2: paused after its first output chunk, every row rewritten, resumed: exit 0
    and complete with rows of both inputs. Now InputChangedError (exit 1), nothing complete,
    and the same command then gives the transform of the input as it is."""
    from ooc_spectral.pipeline import writeback

    inp, out = tmp_path / "in.zarr", tmp_path / "t"
    producers_group(inp, copy_of=data / "x.zarr")  # rows its producer rewrites
    original, calls = writeback._write_block, []

    def write_then_rewrite(*a, **kw):  # the threads engine: the tasks run in this process
        done = original(*a, **kw)
        calls.append(1)
        if len(calls) == 1:  # after the first output chunk
            _rewrite_every_row(inp)
        return done

    monkeypatch.setattr(writeback, "_write_block", write_then_rewrite)
    code, text = run("transform", fitted, inp, "--out", out, "--chunk-rows", 500,
                     "--threads-per-worker", 1, "--engine", "threads", "-q", capsys=capsys)
    monkeypatch.setattr(writeback, "_write_block", original)
    assert code == 1 and "InputChangedError" in text and "changed while this run read it" in text
    assert status(out) == "failed" and not (out / "report.json").exists()
    assert run("verify", out)[0] == 1  # not complete
    assert run("transform", fitted, inp, "--out", out, "--chunk-rows", 500, "-q")[0] == 0
    fresh = tmp_path / "fresh"
    assert run("transform", fitted, inp, "--out", fresh, "--chunk-rows", 500, "-q")[0] == 0
    np.testing.assert_array_equal(emb(out), emb(fresh))


def test_an_input_rewritten_during_an_update_is_exit_1_never_recorded(data, tmp_path,
                                                                     monkeypatch, capsys):
    """Finding 3: rows appended, then every row rewritten while the update ran: exit 0 with
    ``update`` recorded and an embedding that is not the OUTDIR's model applied to the
    input. Now InputChangedError (exit 1); the same command then refits on the input as it
    is, equal to a fresh fit of it."""
    from ooc_spectral.batch import append

    inp, out = tmp_path / "in.zarr", tmp_path / "fit"
    producers_group(inp, copy_of=data / "x.zarr")  # rows its producer rewrites
    assert run("fit", inp, "--out", out, *FIT) == (0, "")
    arr = zarr.open_array(str(inp / "data"), mode="r+")
    more = zarr.open_array(str(data / "y.zarr" / "data"), mode="r")[:1000]
    arr.resize((4000, arr.shape[1]))
    arr[3000:] = more
    original = append.solve_update

    def solve_then_rewrite(*a, **kw):
        result = original(*a, **kw)
        _rewrite_every_row(inp)
        return result

    monkeypatch.setattr(append, "solve_update", solve_then_rewrite)
    code, text = run("fit", inp, "--out", out, *FIT[:-1], capsys=capsys)
    monkeypatch.setattr(append, "solve_update", original)
    assert "updating the fit" in text
    assert code == 1 and "InputChangedError" in text, text
    assert status(out) != "complete"
    assert run("fit", inp, "--out", out, *FIT)[0] == 0
    report = json.loads((out / "report.json").read_text())
    assert report["n_samples"] == 4000 and "update" not in report
    fresh = tmp_path / "fresh"
    assert run("fit", inp, "--out", fresh, *FIT)[0] == 0
    np.testing.assert_array_equal(emb(out), emb(fresh))


# ------------------------------------------------------------------ finding 4
def _edit_neighbors(out: Path) -> None:
    meta_path = out / "representatives_model" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["attributes"]["ooc_spectral_representatives"]["n_neighbors"] = 1
    meta_path.write_text(json.dumps(meta))


@pytest.mark.parametrize("how", ["flipped byte of the centres", "deleted chunk",
                                 "n_neighbors edited to 1", "copied from a run with another seed"])
def test_representatives_model_carries_digests(data, clustered, tmp_path, capsys, how):
    """Finding 4: each of these passed verify ("intact"), the fit's rerun left it, and
    transform FIT_OUTDIR gave other labels, exit 0. Now verify exit 1 names it, transform
    refuses it (exit 2, naming the fit to rerun), and the fit's rerun repairs it."""
    ref_out, ref_emb, ref_labels = clustered
    out = tmp_path / "reps"
    shutil.copytree(ref_out, out)
    model = out / "representatives_model"
    if how == "flipped byte of the centres":
        flip(chunk_files(model / "centers")[0])
    elif how == "deleted chunk":
        chunk_files(model / "coefficients")[0].unlink()
    elif how == "n_neighbors edited to 1":
        _edit_neighbors(out)
    else:
        other = tmp_path / "other"
        assert run("fit", data / "x.zarr", "--out", other, *REPS, "--seed", 3)[0] == 0
        shutil.rmtree(model)
        shutil.copytree(other / "representatives_model", model)
    code, text = run("verify", out, capsys=capsys)
    assert code == 1 and "representatives_model" in text, text
    code, text = run("transform", out, data / "x.zarr", "--out", tmp_path / "t", "-q",
                     capsys=capsys)
    assert code == 2 and "ooc-spectral fit" in text and not (tmp_path / "t").exists(), text
    code, text = run("fit", data / "x.zarr", "--out", out, *REPS, capsys=capsys)
    assert code == 0 and "repairing it" in text, text
    assert run("verify", out)[0] == 0
    np.testing.assert_array_equal(emb(out, "labels"), ref_labels)
    np.testing.assert_array_equal(emb(out), ref_emb)


# ------------------------------------------------------------------ finding 5
def test_a_workflow_file_reads_no_url_the_command_line_did_not_allow(data, tmp_path, capsys):
    """Finding 5: ``input = "http://127.0.0.1:PORT/x.zarr"`` made an inspect step send 12
    GETs and a fit step 121, exit 0. Now exit 2 naming ``--allow read=URL``, and no request
    is sent; with the permission the step reads it."""
    import functools
    import http.server
    import threading

    requests = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            requests.append(self.path)

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(data)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/x.zarr"
    try:
        flow = tmp_path / "w.toml"
        flow.write_text(f'[[step]]\nrun = "inspect"\npath = "{url}"\n\n'
                        f'[[step]]\nrun = "fit"\ninput = "{url}"\nout = "fit"\n'
                        'gamma = 0.05\ntol = 0.01\nn_components = 2\nengine = "threads"\n')
        code, text = run("run", flow, "-q", capsys=capsys)
        assert code == 2 and f"--allow read={url}" in text, text
        assert requests == [] and not (tmp_path / "fit").exists()
        flow.write_text(f'[[step]]\nrun = "inspect"\npath = "{url}"\n')
        code, text = run("run", flow, "-q", "--allow", "read=http://127.0.0.1:1", capsys=capsys)
        assert code == 2 and requests == [], text  # another prefix allows nothing here
        code, text = run("run", flow, "-q", "--allow", f"read={url}", capsys=capsys)
        assert code == 0 and requests, text
    finally:
        server.shutdown()


# ------------------------------------------------------------------ finding 6
def test_sigterm_just_after_the_model_stage_is_an_exit_code_not_death_by_the_signal(
        data, fitted, tmp_path):
    """Finding 6: SIGTERM just after the model stage (the last: the run complete, its
    outcome printed, the process ending) ended the process by the signal (143): the
    handlers were put back before the interpreter shut down. Now a signal after the outcome
    exits with the outcome's code (0: complete); earlier ones are exit 1, OUTDIR resumable
    (every stage's, in workflows/bench/adversarial.py). The embedded cluster makes the end
    of the process last (its workers close), as it does in a nightly job."""
    from test_cli import EXE

    out = tmp_path / "fit"
    args = ["fit", data / "x.zarr", "--out", out, *FIT[:6], "--chunk-rows", 500,
            "--engine", "cluster", "--workers", 1, "--threads-per-worker", 1, "-q", "--json"]
    proc = subprocess.Popen([EXE, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    summary = proc.stdout.readline()  # the outcome is printed: the process is ending now
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, 1), (proc.returncode, summary, err)
    assert json.loads(summary)["exit_code"] == proc.returncode == 0  # the run had completed
    assert status(out) == "complete"
    assert run("fit", data / "x.zarr", "--out", out, *FIT)[0] == 0
    assert run("verify", out)[0] == 0
    np.testing.assert_array_equal(emb(out), emb(fitted))  # a fresh fit with the same options


# ------------------------------------------------------------------ finding 8
def test_a_deleted_checkpoint_part_chunk_is_missing_and_the_rerun_repairs_it(
        data, fitted, tmp_path, capsys):
    """Finding 8: a deleted chunk of a checkpoint part was not tested; verify names it
    missing (exit 1), the same fit command discards the part, and verify is then clean."""
    out = tmp_path / "fit"
    shutil.copytree(fitted, out)
    victim = next(p for p in sorted((out / "checkpoint" / "partials").rglob("*"))
                  if p.is_file() and p.name != "zarr.json")
    victim.unlink()
    code, text = run("verify", out, capsys=capsys)
    rel = str(victim.relative_to(out).parent.parent.parent)
    assert code == 1 and "missing: chunk" in text and rel in text, text
    assert run("fit", data / "x.zarr", "--out", out, *FIT)[0] == 0
    assert run("verify", out)[0] == 0
    np.testing.assert_array_equal(emb(out), emb(fitted))


def test_an_embedding_chunk_copied_over_another_of_the_same_fit_is_found_and_repaired(
        data, fitted, tmp_path, capsys):
    """Finding 8, for fit: the chunk digest's key includes the chunk's index."""
    out = tmp_path / "fit"
    shutil.copytree(fitted, out)
    chunks = chunk_files(out / "embedding")
    shutil.copyfile(chunks[0], chunks[3])
    code, text = run("verify", out, capsys=capsys)
    assert code == 1 and "embedding: damaged: chunk embedding/c/3/0" in text, text
    assert run("fit", data / "x.zarr", "--out", out, *FIT)[0] == 0
    assert run("verify", out)[0] == 0
    np.testing.assert_array_equal(emb(out), emb(fitted))


# ------------------------------------------------------------------ the data sets' writers
def test_make_data_run_again_checks_its_digests_and_writes_a_damaged_data_set_again(
        tmp_path, capsys):
    out = tmp_path / "d.zarr"
    args = ["make-data", "spiral", "--n", 2000, "--out", out, "--chunk-rows", 500, "-q"]
    assert run(*args)[0] == 0
    ref = zarr.open_array(str(out / "data"), mode="r")[...]
    assert run("verify", out)[0] == 0
    chunks = chunk_files(out / "data")
    shutil.copyfile(chunks[0], chunks[1])  # a chunk over another of the same array
    code, text = run("verify", out, capsys=capsys)
    assert code == 1 and "data: damaged: chunk data/c/1/0" in text, text
    code, text = run(*args[:-1], capsys=capsys)
    assert code == 0 and "writing it again" in text, text
    assert run("verify", out)[0] == 0
    np.testing.assert_array_equal(zarr.open_array(str(out / "data"), mode="r")[...], ref)


def test_import_run_again_is_a_checked_no_op_repairs_damage_and_follows_its_source(
        tmp_path, capsys):
    src, out = tmp_path / "t.npy", tmp_path / "imp.zarr"
    X = np.random.default_rng(0).normal(size=(1500, 3))
    np.save(src, X)
    args = ["import", src, "--out", out, "--chunk-rows", 500, "-q"]
    assert run(*args)[0] == 0
    assert run(*args)[0] == 0  # the same command: intact, nothing to do (it was exit 2)
    chunk_files(out / "data")[1].unlink()
    code, text = run("verify", out, capsys=capsys)
    assert code == 1 and "data: missing: chunk data/c/1/0" in text, text
    assert run(*args)[0] == 0 and run("verify", out)[0] == 0
    np.testing.assert_array_equal(zarr.open_array(str(out / "data"), mode="r")[...], X)
    np.save(src, X[::-1])  # the table rewritten: the same command imports it again
    assert run(*args)[0] == 0
    np.testing.assert_array_equal(zarr.open_array(str(out / "data"), mode="r")[...], X[::-1])


def test_a_table_rewritten_while_import_reads_it_is_exit_1_never_complete(
        tmp_path, monkeypatch, capsys):
    from ooc_spectral.io import importing

    src, out = tmp_path / "t.npy", tmp_path / "imp.zarr"
    X = np.random.default_rng(1).normal(size=(1500, 3))
    np.save(src, X)
    original = importing._numeric

    def numeric_then_rewrite(block, names, dtype):
        np.save(src, X * 2)  # a writer replaces the file while the import reads it
        return original(block, names, dtype)

    monkeypatch.setattr(importing, "_numeric", numeric_then_rewrite)
    code, text = run("import", src, "--out", out, "--chunk-rows", 500, "-q", capsys=capsys)
    monkeypatch.setattr(importing, "_numeric", original)
    assert code == 1 and "InputChangedError" in text, text
    assert zarr.open_group(str(out), mode="r").attrs["ooc_spectral_import"]["complete"] is False
    assert run("import", src, "--out", out, "--chunk-rows", 500, "-q")[0] == 0
    np.testing.assert_array_equal(zarr.open_array(str(out / "data"), mode="r")[...], X * 2)


# ------------------------------------------------------------------ found by the adversarial pass
def test_markers_copied_from_another_output_are_not_refused_forever(data, transformed,
                                                                    tmp_path, capsys):
    """``embedding_written`` of another transform copied in: verify names it, and the same
    command writes the output whole again. It was refused by every rerun ("another run
    replaced the output"), also once the run had been marked failed."""
    ref_out, ref = transformed
    out, other = tmp_path / "t", tmp_path / "other"
    shutil.copytree(ref_out, out)
    fitted = data / "fit"
    assert run("transform", fitted, data / "x.zarr", "--out", other, "--chunk-rows", 500,
               "-q")[0] == 0
    shutil.rmtree(out / "embedding_written")
    shutil.copytree(other / "embedding_written", out / "embedding_written")
    code, text = run("verify", out, capsys=capsys)
    assert code == 1 and "embedding_written: not this run's" in text, text
    meta = json.loads((out / "zarr.json").read_text())  # and a run left failed, not complete
    meta["attributes"]["ooc_spectral_run"]["status"] = "failed"
    (out / "zarr.json").write_text(json.dumps(meta))
    assert run("transform", fitted, data / "x.zarr", "--out", out, "--chunk-rows", 500,
               "-q")[0] == 0
    assert run("verify", out)[0] == 0
    np.testing.assert_array_equal(emb(out), ref)


def test_a_dangling_symlink_as_outdir_is_exit_2_naming_its_target(data, tmp_path, capsys):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere" / "out")
    code, text = run("fit", data / "x.zarr", "--out", link, *FIT, capsys=capsys)
    assert code == 2 and "does not exist" in text and "nowhere" in text, text
    assert not (tmp_path / "nowhere").exists()
