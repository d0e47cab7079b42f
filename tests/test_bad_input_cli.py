"""The bad-input matrix, through the command line: exit code, message, nothing complete.

Each row writes a small zarr input, runs the command line's ``main(["fit", ...])``
in this process (the console script's process adds an import and nothing these rows
check; a real process's exit status on bad input: ``test_cli.py``), and checks the exit
code, the words of the one-line message, and that the output directory is not marked
complete when the run failed. The same inputs through the Python API are in
``test_bad_input.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

FAST = ["--workers", "1", "--threads-per-worker", "1", "-q", "--json"]


def write(path, X, chunk_rows=100):
    X = np.asarray(X)
    chunks = (max(1, min(chunk_rows, X.shape[0])),) + X.shape[1:] if X.ndim > 1 else (max(1, min(chunk_rows, X.shape[0] or 1)),)
    arr = zarr.create_array(str(path), shape=X.shape, chunks=chunks, dtype=X.dtype, overwrite=True)
    if X.size:
        arr[...] = X
    return path


def status(out):
    try:
        return zarr.open_group(str(out), mode="r").attrs["ooc_spectral_run"]["status"]
    except Exception:
        return None


rng = np.random.default_rng(0)
GOOD = rng.normal(size=(600, 3))


def with_nan():
    X = GOOD.copy()
    X[345, 1] = np.nan
    return X


def with_inf():
    X = GOOD.copy()
    X[420, 0] = -np.inf
    return X


FAILING = [
    ("nan-middle-chunk", with_nan(), [], "X contains NaN at row 345, column 1 (chunk 3 of 6, rows 300-399)"),
    ("inf", with_inf(), [], "X contains infinity at row 420, column 0 (chunk 4 of 6"),
    ("one-dimensional", GOOD[:, 0], [], "expected a 2-D array (n_samples, n_features), got 1-D"),
    ("three-dimensional", GOOD.reshape(600, 3, 1), [], "got 3-D"),
    ("zero-rows", np.empty((0, 3)), [], "has 0 rows"),
    ("one-row", GOOD[:1], [], "X has 1 row; at least 2 samples are needed"),
    ("zero-features", np.empty((10, 0)), [], "has 0 features"),
    # (within max_dictionary_size the exact problem answers: tests/test_constant_kernel.py)
    ("gamma-tiny-capped", GOOD, ["--gamma", "1e-14", "--max-dictionary-size", "500"],
     "the dictionary has only 1 point, so n_components=2 is not at most the dictionary size; "
     "with gamma=1e-14 the rbf kernel is nearly constant"),
    ("gamma-huge-capped", GOOD, ["--gamma", "1e6", "--max-dictionary-size", "50"],
     "the dictionary grew past max_dictionary_size=50"),
]


@pytest.mark.parametrize("name, X, extra, words", FAILING, ids=[f[0] for f in FAILING])
def test_bad_input_exits_2_with_message_and_nothing_complete(main_, tmp_path, name, X, extra,
                                                            words):
    data = write(tmp_path / "x.zarr", X)
    out = tmp_path / "out"
    proc = main_("fit", data, "--out", out, *extra, *FAST)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("ooc-spectral: error: ") and words in line, line
    assert json.loads(proc.stdout.strip().splitlines()[-1])["exit_code"] == 2
    assert status(out) != "complete"
    assert not (out / "report.json").exists()


def test_unreadable_chunk_is_named(main_, tmp_path):
    data = write(tmp_path / "x.zarr", GOOD)
    (tmp_path / "x.zarr" / "c" / "4" / "0").write_bytes(b"not a zstd frame")
    proc = main_("fit", data, "--out", tmp_path / "out", *FAST)
    assert proc.returncode == 2
    assert "could not read rows" in proc.stderr and "(chunk 4 of" in proc.stderr
    assert "restore or regenerate that chunk" in proc.stderr
    assert status(tmp_path / "out") != "complete"


def test_unwritable_output_fails_before_any_work(main_, tmp_path):
    data = write(tmp_path / "x.zarr", GOOD)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    proc = main_("fit", data, "--out", blocker / "out", *FAST)
    assert proc.returncode == 2
    assert "cannot create the output directory" in proc.stderr


@pytest.mark.parametrize("dtype", ["int32", "float16", "uint8"])
def test_integer_and_float16_are_accepted_and_computed_in_float64(main_, tmp_path, dtype):
    X = (GOOD * 10).astype(dtype) if dtype != "uint8" else (np.abs(GOOD) * 40).astype(dtype)
    data = write(tmp_path / "x.zarr", X)
    proc = main_("fit", data, "--out", tmp_path / "out", "--tol", "1e-2", *FAST)
    assert proc.returncode == 0, proc.stderr
    from ooc_spectral import GreedySpectralEmbedding

    ref = GreedySpectralEmbedding(tol=1e-2, random_state=0).fit(X.astype(np.float64))
    got = zarr.open_array(str(tmp_path / "out" / "embedding"))[...]
    np.testing.assert_allclose(got, ref.embedding_, atol=1e-10)


def test_duplicate_rows_never_make_the_factor_singular(main_, tmp_path):
    X = np.repeat(GOOD[:150], 4, axis=0)  # every row four times
    data = write(tmp_path / "x.zarr", X)
    proc = main_("fit", data, "--out", tmp_path / "out", "--tol", "0", *FAST)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["dictionary_size"] <= 150  # a duplicate never enters
    from ooc_spectral import GreedySpectralEmbedding

    model = GreedySpectralEmbedding.load(tmp_path / "out" / "model")
    assert len(np.unique(model.dictionary_, axis=0)) == len(model.dictionary_)
    L = model.spectral_map_.dictionary.L
    assert np.all(np.isfinite(L)) and np.all(np.diag(L) > 0)


def test_gamma_so_large_every_row_enters_is_explained(main_, tmp_path):
    data = write(tmp_path / "x.zarr", GOOD[:200])
    proc = main_("fit", data, "--out", tmp_path / "out", "--gamma", "1e6", "--workers", "1")
    assert proc.returncode == 0
    # more than half the rows entered: solved exactly on the full Gram matrix, and said so
    assert "half of the 200 rows entered the dictionary (gamma=1e+06)" in proc.stderr
    assert "solved exactly" in proc.stderr and "use a smaller gamma" in proc.stderr
