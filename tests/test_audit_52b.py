"""Defects a second outside audit of issue 52 found, through the command line (``main(argv)``).

Each test was ``xfail(strict=True)`` while its defect stood; every one is fixed now (the
marks are gone).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr

from ooc_spectral.batch.cli import main
from ooc_spectral.io.integrity import COMPLETE_ATTR


def _user_array(path, seed=0, n=600, chunk=200):
    arr = zarr.create_array(path, shape=(n, 3), chunks=(chunk, 3), dtype="f8")
    arr[:] = np.random.default_rng(seed).normal(size=(n, 3))
    return arr


def test_a_rewritten_input_whose_chunk_directory_is_a_symlink_is_not_the_old_result(tmp_path):
    store = tmp_path / "in.zarr"
    arr = _user_array(store)
    # the chunk directory lives on another volume, reached through a symbolic link
    os.rename(store / "c", tmp_path / "chunks")
    os.symlink(tmp_path / "chunks", store / "c")
    # a link back up inside it: the listing follows links, each directory once
    os.symlink(tmp_path / "chunks", tmp_path / "chunks" / "loop")
    # zarr reads every chunk through the link, and so does the fit: no chunk is "missing"
    # (it used to say all were, and to ask the user to mark the data complete)
    assert COMPLETE_ATTR not in arr.attrs
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert main(["fit", str(store), "--out", str(out), "-q"]) == 0
    zarr.open_array(store, mode="r+")[:] = np.random.default_rng(7).normal(size=(600, 3)) * 3 + 10
    assert main(["fit", str(store), "--out", str(out), "-q"]) == 0
    assert main(["fit", str(store), "--out", str(fresh), "-q"]) == 0
    old = zarr.open_array(out / "embedding")[:]
    new = zarr.open_array(fresh / "embedding")[:]
    np.testing.assert_allclose(old, new, atol=1e-10)


def _blobs(path):
    """A make-data input of 30,000 rows for the fit and transform writers."""
    assert main(["make-data", "blobs", "--n", "30000", "--chunk-rows", "4096", "--out",
                 str(path), "-q"]) == 0
    return path


@pytest.mark.parametrize("writer", ["make-data", "import", "transform", "fit"])
def test_overwrite_killed_while_deleting_is_repaired_by_the_same_command(tmp_path, writer):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "d.zarr"
    if writer == "make-data":
        first = ["make-data", "blobs", "--n", "100000", "--chunk-rows", "256", "--out",
                 str(out), "-q"]
        assert main(first + ["--seed", "1"]) == 0
        again = first + ["--seed", "2", "--overwrite"]
    elif writer == "fit":
        data = _blobs(tmp_path / "in.zarr")
        first = ["fit", str(data), "--out", str(out), "--chunk-rows", "256", "--tol", "1e-2",
                 "-q"]
        assert main(first + ["--gamma", "0.5"]) == 0
        again = first + ["--gamma", "1.0", "--overwrite"]
    elif writer == "transform":
        data = _blobs(tmp_path / "in.zarr")
        for fit, gamma in (("f1", "0.5"), ("f2", "1.0")):
            assert main(["fit", str(data), "--out", str(tmp_path / fit), "--gamma", gamma,
                         "--tol", "1e-2", "-q"]) == 0
        first = ["transform", str(data), "--out", str(out), "--chunk-rows", "256", "-q"]
        assert main(first[:1] + [str(tmp_path / "f1")] + first[1:]) == 0
        again = first[:1] + [str(tmp_path / "f2")] + first[1:] + ["--overwrite"]
    else:
        table = tmp_path / "t.npy"
        np.save(table, np.random.default_rng(0).normal(size=(100000, 3)))
        first = ["import", str(table), "--chunk-rows", "256", "--out", str(out), "-q"]
        assert main(first + ["--columns", "0,1"]) == 0
        again = first + ["--columns", "0,2", "--overwrite"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
         os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "ooc_spectral.batch.cli", *again], env=env)
    deadline = time.monotonic() + 120
    while (out / "zarr.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.0005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # the same command, run again, repairs or starts clean
    assert main(again) == 0
    assert main(["verify", str(out), "-q"]) == 0


@pytest.mark.parametrize("which", ["embedding", "dataset-array", "user-array"])
def test_verify_of_an_intact_array_is_not_damage(tmp_path, capsys, which):
    if which == "user-array":
        target = tmp_path / "u.zarr"
        _user_array(target)
    else:
        data = tmp_path / "d.zarr"
        assert main(["make-data", "blobs", "--n", "600", "--chunk-rows", "200", "--out",
                     str(data), "-q"]) == 0
        target = data / "data"
        if which == "embedding":
            assert main(["fit", str(data), "--out", str(tmp_path / "f"), "-q"]) == 0
            target = tmp_path / "f" / "embedding"
    capsys.readouterr()
    code = main(["verify", str(target), "-q"])
    err = capsys.readouterr().err
    # intact: 0 (checked) or 2 (nothing this command checks there, named), never 1
    assert code in (0, 2), err
    assert "ContainsArrayError" not in err


@pytest.mark.parametrize("which", ["AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"])
def test_a_garbled_aws_configuration_file_is_exit_2_naming_it(tmp_path, monkeypatch, capsys,
                                                              which):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    garbled = tmp_path / "aws-file"
    garbled.write_text("[default\nbroken")
    monkeypatch.setenv(which, str(garbled))
    # no request is needed to see it: the endpoint is a closed port
    code = main(["fit", "s3://bucket/x.zarr", "--out", str(tmp_path / "out"), "-q",
                 "--storage-options", '{"endpoint_url": "http://127.0.0.1:9"}'])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(garbled) in err


@pytest.mark.parametrize("damage", ["deleted", "changed"])
def test_plot_of_a_damaged_outdir_is_not_exit_0(tmp_path, capsys, damage):
    pytest.importorskip("matplotlib")
    data, out = tmp_path / "d.zarr", tmp_path / "f"
    assert main(["make-data", "blobs", "--n", "1200", "--chunk-rows", "300", "--out", str(data),
                 "-q"]) == 0
    assert main(["fit", str(data), "--out", str(out), "--chunk-rows", "300", "-q"]) == 0
    emb = zarr.open_array(out / "embedding", mode="r+")
    if damage == "deleted":
        os.remove(out / "embedding" / "c" / "1" / "0")
    else:
        block = emb[300:600]
        block[:, 0] += 50.0
        emb[300:600] = block
    assert main(["verify", str(out), "-q"]) == 1
    capsys.readouterr()
    code = main(["plot", str(out), "--out", str(tmp_path / "p.png"), "-q"])
    err = capsys.readouterr().err
    assert code != 0, "a damaged embedding was drawn with exit 0"
    # refused as transform refuses a damaged model (exit 2), naming the chunk and the repair
    assert code == 2, err
    assert "embedding/c/1/0" in err and "ooc-spectral fit" in err, err
    assert not (tmp_path / "p.png").exists()
    # the fit the message names repairs it, and the plot is then drawn
    assert main(["fit", str(data), "--out", str(out), "--chunk-rows", "300", "-q"]) == 0
    assert main(["plot", str(out), "--out", str(tmp_path / "p.png"), "-q"]) == 0


def test_verify_sees_an_edited_run_configuration(tmp_path, capsys):
    import json

    data, out = tmp_path / "d.zarr", tmp_path / "f"
    assert main(["make-data", "blobs", "--n", "600", "--chunk-rows", "200", "--out", str(data),
                 "-q"]) == 0
    assert main(["fit", str(data), "--out", str(out), "--tol", "1e-2", "-q"]) == 0
    meta = json.loads((out / "zarr.json").read_text())
    meta["attributes"]["ooc_spectral_run"]["config"]["estimator"]["tol"] = 1e-3
    (out / "zarr.json").write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["verify", str(out), "-q"]) == 1
    assert "zarr.json" in capsys.readouterr().err
    # a model whose run record was edited is not applied
    code = main(["transform", str(out), str(data), "--out", str(tmp_path / "t"), "-q"])
    assert code == 2, capsys.readouterr().err
    # the fit's own command restores the record (the results are the run's: kept), and
    # the command with the edited value is refused as another configuration
    assert main(["fit", str(data), "--out", str(out), "--tol", "1e-3", "-q"]) == 2
    before = (out / "report.json").read_bytes()
    assert main(["fit", str(data), "--out", str(out), "--tol", "1e-2", "-q"]) == 0
    meta = json.loads((out / "zarr.json").read_text())
    assert meta["attributes"]["ooc_spectral_run"]["config"]["estimator"]["tol"] == 1e-2
    assert (out / "report.json").read_bytes() == before
    assert main(["verify", str(out), "-q"]) == 0


@pytest.mark.parametrize("command", ["verify", "transform"])
def test_a_file_given_as_outdir_or_model_is_exit_2(tmp_path, capsys, command):
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n3,4\n")
    data = tmp_path / "d.zarr"
    assert main(["make-data", "blobs", "--n", "600", "--chunk-rows", "200", "--out", str(data),
                 "-q"]) == 0
    capsys.readouterr()
    if command == "verify":
        code = main(["verify", str(table), "-q"])
    else:
        code = main(["transform", str(table), str(data), "--out", str(tmp_path / "t"), "-q"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "NotADirectoryError" not in err


def test_plot_colored_by_damaged_labels_of_the_input_is_not_exit_0(tmp_path, capsys):
    import shutil

    pytest.importorskip("matplotlib")
    data, out = tmp_path / "d.zarr", tmp_path / "f"
    assert main(["make-data", "blobs", "--n", "600", "--chunk-rows", "200", "--out", str(data),
                 "-q"]) == 0
    assert main(["fit", str(data), "--out", str(out), "-q"]) == 0
    shutil.copyfile(data / "label" / "c" / "0", data / "label" / "c" / "1")
    assert main(["verify", str(data), "-q"]) == 1
    code = main(["plot", str(out), "--out", str(tmp_path / "p.png"), "--color-by", "label",
                 "-q"])
    err = capsys.readouterr().err
    assert code != 0, "labels that are not make-data's were drawn with exit 0"
    # refused as a fit refuses the damaged data set (exit 2), naming the chunk and make-data
    assert code == 2, err
    assert "label/c/1" in err and "make-data" in err, err
    assert not (tmp_path / "p.png").exists()
    # the embedding itself is intact: drawn without the labels
    assert main(["plot", str(out), "--out", str(tmp_path / "p.png"), "--color-by", "none",
                 "-q"]) == 0
