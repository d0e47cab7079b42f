"""The paper reproductions end to end, and the image loaders.

Every workflow of ``workflows/paper/`` runs through the command line
(``ooc-spectral run FILE --set STEP.param={...} --set STEP.out=...``; one as the real
console script, the others through its ``main`` in the test's process) at a reduced size and must write its markdown table, JSON and PNG figure. The
loaders read MNIST files the test writes itself (IDX, gzipped IDX, npz):
nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ooc_spectral.exceptions import (
    InvalidInputError,
    InvalidParameterError,
    StoreNotFoundError,
)
from ooc_spectral.experiments import available
from ooc_spectral.io.loaders import downscale, load_digits, load_mnist, read_idx

EXE = shutil.which("ooc-spectral") or "ooc-spectral"
ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / "workflows" / "paper"

#: workflow file -> (step id, reduced parameters, rows every table must hold)
REDUCED = {
    "ob2005-table1": ("table1",
                      '{datasets = "spiral", normalizations = "divisive", scale = 0.05, '
                      'tols = [0.01], repeats = 1, cache = false}',
                      ["dictionary better?", "(full Gram on all of D1)", "## Summary"]),
    "ob2005-figure3": ("figure3",
                       '{datasets = "spiral", normalizations = "additive", scale = 0.05, '
                       'tols = [0.01], cache = false}',
                       ["| n | full Gram | greedy tol=0.01 |"]),
    "ob2005-figure4": ("figure4",
                       '{datasets = "spiral", normalizations = "additive", scale = 0.05, '
                       'methods = "greedy,random,nystrom", repeats = 2, m_max = 6, cache = false}',
                       ["| greedy vs random | greedy vs Nyström |", "| 4 |", "| 6 |"]),
    "hm2011-fishbowl": ("fishbowl",
                        '{n = 300, repeats = 1, methods = "nystrom,gaussian-projection,greedy"}',
                        ["| Gaussian projection | m_gp = 10 |", "| greedy dictionary | m = 55 |"]),
    "hm2011-halo-ball": ("halo",
                         '{n = 300, gammas = [10.0], repeats = 1, methods = "nystrom,greedy"}',
                         ["Adjusted Rand index", "| exact (full W) | n = 300 | 1 ± 0 |"]),
    "hm2011-digits": ("digits",
                      '{n = 300, n_test = 60, m_grid = [30], m_table = 30, repeats = 1, cv = 3, '
                      'methods = "nystrom,greedy"}',
                      ["# correct of 60", "| Nyström (uniform) | m = 30 |"]),
}


#: the workflow run by the real console script, in its own process; the others run the
#: command line's ``main`` in this process (the same command, without a process's imports)
THROUGH_THE_CONSOLE_SCRIPT = "hm2011-halo-ball"


@pytest.fixture(scope="module")
def reduced_runs(tmp_path_factory, restore_logging_module):
    """Every paper workflow at its reduced size, each one ``ooc-spectral run FILE --set ...``.

    One runs as the console script in a process of its own (the experiments are
    single-threaded, so it uses the other core meanwhile); the others run ``main`` in
    this process, one after the other: the same command and outputs, without paying
    the import of the package, dask, scikit-learn and matplotlib five more times.
    """
    from ooc_spectral.batch.cli import main

    base = tmp_path_factory.mktemp("paper")

    def argv(name):
        step, params, _ = REDUCED[name]
        return ["run", str(WORKFLOWS / f"{name}.toml"), "--set", f"{step}.param={params}",
                "--set", f"{step}.out={base / name}", "--json", "--quiet"]

    proc = subprocess.Popen([EXE, *argv(THROUGH_THE_CONSOLE_SCRIPT)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    results = {}
    for name in sorted(set(REDUCED) - {THROUGH_THE_CONSOLE_SCRIPT}):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv(name))
        results[name] = (code, out.getvalue(), err.getvalue())
    out, err = proc.communicate(timeout=300)
    results[THROUGH_THE_CONSOLE_SCRIPT] = (proc.returncode, out, err)
    return results


@pytest.mark.parametrize("name", sorted(REDUCED))
def test_workflow_runs_at_reduced_size(reduced_runs, name):
    returncode, stdout, stderr = reduced_runs[name]
    assert returncode == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["status"] == "complete"
    result = summary["steps"][0]
    assert result["experiment"] == name
    table = Path(result["table"]).read_text()
    for text in REDUCED[name][2]:
        assert text in table, (text, table)
    png = Path(result["figure"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 5_000 < png.stat().st_size < 200_000
    assert f"]({png.name})" in table  # the table shows its figure
    data = json.loads(Path(result["json"]).read_text())
    assert data["experiment"] == name


def test_every_workflow_runs_an_experiment_that_exists():
    names = set(available())
    files = sorted(WORKFLOWS.glob("ob2005-*.toml")) + sorted(WORKFLOWS.glob("hm2011-*.toml"))
    assert {f.stem for f in files} == set(REDUCED)
    for f in files:
        assert f'experiment = "{f.stem}"' in f.read_text()
        assert f.stem in names
        assert f'out = "results/paper/{f.stem}"' in f.read_text()


def test_unknown_experiment_parameter_is_a_usage_error(main_, tmp_path):
    proc = main_("evaluate", "hm2011-fishbowl", "--out", tmp_path, "--param", "colour=red")
    assert proc.returncode == 2
    assert "has no parameter 'colour'" in proc.stderr


# --------------------------------------------------------------------------- #
# loaders, on tiny files written here
# --------------------------------------------------------------------------- #
def write_idx(path: Path, array: np.ndarray, code: int = 0x08, compress: bool = False) -> Path:
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    dtype = {0x08: ">u1", 0x0D: ">f4"}[code]
    raw = header + np.ascontiguousarray(array, dtype=dtype).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return path


@pytest.fixture
def mnist_like():
    """Five 28 x 28 images whose 2 x 2 block means are known, labels 0, 1, 2, 1, 0."""
    rng = np.random.default_rng(0)
    small = rng.integers(0, 64, size=(5, 14, 14))
    images = np.repeat(np.repeat(small, 2, axis=1), 2, axis=2) * 4  # 0..252, blocks constant
    images[:, ::2, ::2] += 3  # block means then end in .75
    labels = np.array([0, 1, 2, 1, 0])
    means = small * 4 + 0.75
    return images.astype(np.uint8), labels, means


def test_load_mnist_from_idx_files(tmp_path, mnist_like):
    images, labels, means = mnist_like
    img = write_idx(tmp_path / "train-images-idx3-ubyte", images)
    write_idx(tmp_path / "train-labels-idx1-ubyte", labels)
    X, y = load_mnist(img)
    np.testing.assert_array_equal(y, [0, 1, 1, 0])
    assert X.shape == (4, 196)
    np.testing.assert_allclose(X, means[[0, 1, 3, 4]].reshape(4, 196) / 255.0, rtol=1e-15)
    # the directory, gzipped files and all classes give the same images
    gz = tmp_path / "gz"
    gz.mkdir()
    write_idx(gz / "train-images-idx3-ubyte.gz", images, compress=True)
    write_idx(gz / "train-labels-idx1-ubyte.gz", labels, compress=True)
    X2, y2 = load_mnist(gz, classes=None, size=28)
    np.testing.assert_array_equal(y2, labels)
    np.testing.assert_allclose(X2, images.reshape(5, 784) / 255.0)
    X3, _ = load_mnist(gz, limit=2)
    np.testing.assert_allclose(X3, X[:2])


def test_load_mnist_from_npz(tmp_path, mnist_like):
    images, labels, means = mnist_like
    np.savez(tmp_path / "mnist.npz", x_train=images, y_train=labels, x_test=images[:2],
             y_test=labels[:2])
    X, y = load_mnist(tmp_path / "mnist.npz")
    np.testing.assert_array_equal(y, [0, 1, 1, 0])
    np.testing.assert_allclose(X, means[[0, 1, 3, 4]].reshape(4, 196) / 255.0)
    Xt, yt = load_mnist(tmp_path / "mnist.npz", subset="test", classes=[1])
    np.testing.assert_array_equal(yt, [1])
    np.savez(tmp_path / "flat.npz", images=images.reshape(5, 784), labels=labels)
    np.testing.assert_allclose(load_mnist(tmp_path / "flat.npz")[0], X)


def test_load_mnist_errors_name_the_problem(tmp_path, mnist_like):
    images, labels, _ = mnist_like
    with pytest.raises(StoreNotFoundError, match="never downloads"):
        load_mnist(tmp_path / "missing.npz")
    bad = tmp_path / "bad-images-idx3-ubyte"
    bad.write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(InvalidInputError, match="not an IDX file"):
        read_idx(bad)
    img = write_idx(tmp_path / "train-images-idx3-ubyte", images)
    img.write_bytes(img.read_bytes()[:-10])
    with pytest.raises(InvalidInputError, match="truncated"):
        read_idx(img)
    write_idx(tmp_path / "train-images-idx3-ubyte", images)
    with pytest.raises(InvalidParameterError, match="labels=PATH"):
        load_mnist(tmp_path / "train-images-idx3-ubyte")
    other = write_idx(tmp_path / "other-labels-idx1-ubyte", labels[:3])
    with pytest.raises(InvalidInputError, match="5 images but 3 labels"):
        load_mnist(tmp_path / "train-images-idx3-ubyte", labels=other)
    write_idx(tmp_path / "l-idx1-ubyte", labels)
    with pytest.raises(InvalidParameterError, match="divisor"):
        load_mnist(tmp_path / "train-images-idx3-ubyte", labels=tmp_path / "l-idx1-ubyte", size=10)
    with pytest.raises(InvalidInputError, match="no image has a label in \\[7\\]"):
        load_mnist(tmp_path / "train-images-idx3-ubyte", labels=tmp_path / "l-idx1-ubyte",
                   classes=[7])


def test_read_idx_float_data(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "f.idx", a, code=0x0D)), a)


def test_downscale_block_means():
    a = np.arange(16.0).reshape(1, 4, 4)
    np.testing.assert_array_equal(downscale(a), [[[2.5, 4.5], [10.5, 12.5]]])


def test_load_digits_offline():
    X, y = load_digits()
    assert X.shape == (1797, 64) and X.min() == 0.0 and X.max() == 1.0
    X01, y01 = load_digits(classes=(0, 1))
    assert set(y01.tolist()) == {0, 1} and len(y01) == int(np.sum(np.isin(y, [0, 1])))
