"""Defects a third outside audit of issue 52 found, through the command line (``main(argv)``).

Each test was ``xfail(strict=True)`` while its defect stood; all are fixed (the marks are gone).
"""

from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np
import pytest
import zarr

from ooc_spectral.batch.cli import main


def _blobs(path, seed=1, n=3000, chunk=500):
    assert main(["make-data", "blobs", "--n", str(n), "--seed", str(seed), "--chunk-rows",
                 str(chunk), "--out", str(path), "-q"]) == 0
    return path


def _flip(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    with open(path, "wb") as f:
        f.write(bytes(data))


def test_a_checkpoint_part_from_another_run_never_makes_the_repaired_rows(tmp_path):
    one, two = _blobs(tmp_path / "in1.zarr", seed=1), _blobs(tmp_path / "in2.zarr", seed=2)
    fit = ["--chunk-rows", "500", "--dictionary-size", "20", "-q"]
    a, other = tmp_path / "A", tmp_path / "O"
    assert main(["fit", str(one), "--out", str(a), *fit]) == 0
    assert main(["fit", str(two), "--out", str(other), *fit]) == 0
    original = zarr.open_array(a / "embedding")[:]
    # the pass-2 partial sums of the other run, restored over this run's (a backup, an rsync
    # of two OUTDIRs): the same part names, as the configuration is the same
    parts = glob.glob(str(other / "checkpoint" / "partials" / "moments-*"))
    assert parts
    for part in parts:
        target = a / "checkpoint" / "partials" / os.path.basename(part)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(part, target)
    assert main(["verify", str(a), "-q"]) == 1  # verify names them: another run's
    # then an embedding chunk goes missing; verify names it, the fit's own command repairs it
    os.remove(a / "embedding" / "c" / "1" / "0")
    assert main(["verify", str(a), "-q"]) == 1
    assert main(["fit", str(one), "--out", str(a), *fit]) == 0
    repaired = zarr.open_array(a / "embedding")[:]
    # the promise: "the same command exits 0 with the result a fresh run gives"
    np.testing.assert_allclose(repaired, original, atol=1e-10)


def test_an_update_over_a_damaged_checkpoint_leaves_nothing_verify_calls_damaged(tmp_path):
    store, out = tmp_path / "in.zarr", tmp_path / "f"
    x = np.random.default_rng(0).normal(size=(3000, 3))
    arr = zarr.create_array(store, shape=(2000, 3), chunks=(500, 3), dtype="f8")
    arr[:] = x[:2000]
    assert main(["fit", str(store), "--out", str(out), "-q"]) == 0
    chunks = glob.glob(str(out / "checkpoint" / "scan_a" / "points" / "c" / "*" / "*"))
    assert chunks
    _flip(chunks[0])
    assert main(["verify", str(out), "-q"]) == 1
    # rows appended: the same fit command updates
    arr.resize((3000, 3))
    arr[2000:] = x[2000:]
    assert main(["fit", str(store), "--out", str(out), "-q"]) == 0
    assert zarr.open_array(out / "embedding").shape == (3000, 2)
    # exit 0 said the result is complete: verify must agree
    assert main(["verify", str(out), "-q"]) == 0


@pytest.mark.parametrize("case", ["fit-rechunked", "transform-rechunked", "transform-appended",
                                  "representatives-appended"])
def test_a_changed_input_at_the_same_path_starts_clean_whatever_its_chunks_or_rows(tmp_path,
                                                                                   case):
    store, fit, out = tmp_path / "in.zarr", tmp_path / "f", tmp_path / "t"
    x = np.random.default_rng(0).normal(size=(3000, 3))
    rows = 2000
    arr = zarr.create_array(store, shape=(rows, 3), chunks=(500, 3), dtype="f8")
    arr[:] = x[:rows]
    extra = (["--n-clusters", "3", "--affinity", "representatives"]
             if case.startswith("representatives") else [])
    assert main(["fit", str(store), "--out", str(fit), "-q", *extra]) == 0
    command = (["transform", str(fit), str(store), "--out", str(out), "-q"]
               if case.startswith("transform") else
               ["fit", str(store), "--out", str(fit), "-q", *extra])
    assert main(command) == 0
    if case.endswith("rechunked"):
        # tonight's file: the same values, written with another chunking
        shutil.rmtree(store)
        arr = zarr.create_array(store, shape=(rows, 3), chunks=(300, 3), dtype="f8")
        arr[:] = x[:rows]
    else:
        arr.resize((3000, 3))
        arr[2000:] = x[2000:]
        rows = 3000
    assert main(command) == 0
    target = out if case.startswith("transform") else fit
    assert zarr.open_array(target / "embedding").shape[0] == rows
    assert main(["verify", str(target), "-q"]) == 0


@pytest.mark.parametrize("command", ["fit", "transform"])
def test_overwrite_of_an_outdir_holding_the_input_deletes_nothing(tmp_path, capsys, command):
    data = _blobs(tmp_path / "in.zarr")
    model, out = tmp_path / "m", tmp_path / "f"
    assert main(["fit", str(data), "--out", str(model), "-q"]) == 0
    assert main(["fit", str(data), "--out", str(out), "--gamma", "0.5", "-q"]) == 0
    before = zarr.open_array(out / "embedding")[:]
    argv = (["fit", str(out / "embedding")] if command == "fit" else
            ["transform", str(model), str(out / "embedding")])
    capsys.readouterr()
    code = main([*argv, "--out", str(out), "--overwrite", "-q"])
    err = capsys.readouterr().err
    # refused before anything is deleted, as an --out inside the input is
    assert code == 2, err
    assert "input" in err and "NaN" not in err, err
    assert main(["verify", str(out), "-q"]) == 0
    np.testing.assert_array_equal(zarr.open_array(out / "embedding")[:], before)


def test_the_command_a_message_names_is_quoted_for_the_shell(tmp_path, capsys):
    import shlex

    data = _blobs(tmp_path / "in.zarr")
    out = tmp_path / "my out"
    assert main(["fit", str(data), "--out", str(out), "-q"]) == 0
    os.remove(out / "report.json")
    capsys.readouterr()
    assert main(["verify", str(out), "-q"]) == 1
    err = capsys.readouterr().err
    assert shlex.quote(str(out)) in err, err
