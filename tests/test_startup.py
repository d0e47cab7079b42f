"""What a command-line run imports: a small job's fixed cost (issue 18, item 2).

Every ``ooc-spectral`` command, and every worker process of the embedded
cluster, starts a Python interpreter; scikit-learn's import alone took most of
the package's import time. The command line's fit path and the worker's task
code do not need it: the estimators and ``NotFittedError`` (a subclass of
scikit-learn's) are imported on first use.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import sklearn.exceptions

import ooc_spectral
from ooc_spectral import exceptions


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                          "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_fit_command_path_does_not_import_scikit_learn():
    mods = _modules_after("import ooc_spectral.batch.cli, ooc_spectral.batch.jobs, "
                          "ooc_spectral.pipeline.accumulate, ooc_spectral.pipeline.writeback")
    assert "ooc_spectral" in mods and "dask" in mods
    assert "sklearn" not in mods


def test_fit_transform_and_verify_on_the_threads_engine_import_neither_sklearn_nor_distributed(
        tmp_path):
    """The command line saves and reads models without the estimator (scikit-learn's
    import), and names dask's threaded scheduler by its function (its name made dask
    import distributed to look for a client); the model it writes is the one
    ``GreedySpectralEmbedding.save`` writes after the same fit."""
    import zarr

    from ooc_spectral import GreedySpectralEmbedding

    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 3))
    zarr.create_array(str(tmp_path / "x.zarr"), shape=X.shape, chunks=(500, 3), dtype="f8")[:] = X
    out, emb = tmp_path / "out", tmp_path / "emb"
    args = ["--gamma", "0.3", "--tol", "1e-2", "--n-components", "2", "--engine", "threads",
            "--random-state", "4", "-q"]
    x = str(tmp_path / "x.zarr")
    # the estimator's fit and save come after the modules are listed, in the same process
    # (one BLAS set-up: a float can differ between processes, not within one)
    code = (f"import sys\nfrom ooc_spectral.cli import main\n"
            f"assert main(['fit', {x!r}, '--out', {str(out)!r}, *{args!r}]) == 0\n"
            f"assert main(['transform', {str(out)!r}, {x!r}, '--out', {str(emb)!r}, "
            f"'--engine', 'threads', '-q']) == 0\n"
            f"assert main(['verify', {str(out)!r}, '-q']) == 0\n"
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
            "import zarr\nfrom ooc_spectral import GreedySpectralEmbedding\n"
            "est = GreedySpectralEmbedding(n_components=2, gamma=0.3, tol=1e-2, random_state=4,"
            f" output_dtype='float64').fit(zarr.open_array({x!r}, mode='r'))\n"
            f"est.save({str(tmp_path / 'saved')!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    mods = set(proc.stdout.split())
    assert "ooc_spectral" in mods and "dask" in mods
    assert not mods & {"sklearn", "distributed"}, sorted(mods & {"sklearn", "distributed"})
    # the model is the estimator's: same arrays (digest), same attributes but the timings
    cli_meta = zarr.open_group(str(out / "model"), mode="r").attrs["ooc_spectral_model"]
    est_meta = zarr.open_group(str(tmp_path / "saved"), mode="r").attrs["ooc_spectral_model"]
    assert cli_meta["arrays_sha256"] == est_meta["arrays_sha256"]
    assert set(cli_meta) == set(est_meta)
    for key in est_meta:
        if key not in ("fitted", "attrs_sha256"):  # the digest covers the timings
            assert cli_meta[key] == est_meta[key], key
    assert set(cli_meta["fitted"]) == set(est_meta["fitted"])
    for key, value in est_meta["fitted"].items():
        if key != "timings_":
            assert cli_meta["fitted"][key] == value, key
    # and the transform job's rows are the loaded estimator's
    E = zarr.open_array(str(emb / "embedding"), mode="r")[...]
    loaded = GreedySpectralEmbedding.load(out)
    np.testing.assert_allclose(E, loaded.transform(X), rtol=1e-12, atol=1e-12)


def test_the_fit_command_on_a_zarr_input_imports_no_dask_array(tmp_path):
    """A zarr input reaches the passes as RowBlocks (dask.delayed reads) and the command
    keeps no lazy view of the embedding it wrote: no dask.array, and so neither xarray nor
    pandas, which it imports wherever xarray is installed (issue 54)."""
    import zarr

    X = np.random.default_rng(0).normal(size=(3000, 3))
    zarr.create_array(str(tmp_path / "x.zarr"), shape=X.shape, chunks=(500, 3), dtype="f8")[:] = X
    code = ("import sys\nfrom ooc_spectral.cli import main\n"
            f"assert main(['fit', {str(tmp_path / 'x.zarr')!r}, '--out', {str(tmp_path / 'out')!r}, "
            "'--gamma', '0.3', '--tol', '1e-2', '--n-components', '2', '--engine', 'threads', "
            "'-q']) == 0\nprint(' '.join(sorted(sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    mods = set(proc.stdout.split())
    assert "ooc_spectral.pipeline.writeback" in mods and "zarr" in mods
    assert not mods & {"dask.array", "xarray", "sklearn"}, sorted(mods & {"dask.array", "xarray"})


def test_not_fitted_error_is_scikit_learns_and_one_class():
    cls = ooc_spectral.NotFittedError
    assert cls is exceptions.NotFittedError is ooc_spectral.exceptions.NotFittedError
    assert issubclass(cls, sklearn.exceptions.NotFittedError)
    assert issubclass(cls, ooc_spectral.OocSpectralError)
    assert issubclass(cls, ValueError) and issubclass(cls, AttributeError)
    assert f"{cls.__module__}.{cls.__qualname__}" == "ooc_spectral.exceptions.NotFittedError"


def test_the_estimators_and_star_import_resolve():
    namespace: dict = {}
    exec("from ooc_spectral import *", namespace)
    for name in ooc_spectral.__all__:
        assert name in namespace, name
    from ooc_spectral.estimators.embedding import GreedySpectralEmbedding

    assert namespace["GreedySpectralEmbedding"] is GreedySpectralEmbedding
    assert "GreedySpectralClustering" in dir(ooc_spectral)


# ---------------------------------------------------------------------- #
# issue 38: start-up proportional to the work
# ---------------------------------------------------------------------- #
#: What a small in-memory fit, ``--help`` and an argument error must not import.
#: (xarray: dask.array imports it wherever it is installed, and a numpy fit builds no
#: dask array; pandas is not here: scikit-learn imports it wherever it is installed.)
HEAVY = {"distributed", "zarr", "fsspec", "matplotlib", "numba", "llvmlite", "xarray"}

_SMALL_FIT = """
import numpy as np
from ooc_spectral import GreedySpectralEmbedding
X = np.random.default_rng(0).normal(size=(2000, 3))
est = GreedySpectralEmbedding(n_components=2, gamma=0.004, tol=1e-3, random_state=0).fit(X)
est.transform(X[:10])
"""


@pytest.fixture(scope="module")
def small_fit_process():
    """What a fresh interpreter holds after :data:`_SMALL_FIT`: the top-level modules, whether
    ``dask.array`` and ``dask`` were imported, whether MKL's and llvmlite's libraries are
    mapped (None where there is no ``/proc/self/maps``). One process for the three tests
    that read it."""
    import json

    code = _SMALL_FIT + (
        "\nimport json, os, sys\n"
        "maps = open('/proc/self/maps').read() if os.path.exists('/proc/self/maps') else None\n"
        "print(json.dumps({'modules': sorted({m.split('.')[0] for m in sys.modules}),\n"
        "                  'dask.array': 'dask.array' in sys.modules, 'dask': 'dask' in sys.modules,\n"
        "                  'libmkl': None if maps is None else 'libmkl' in maps,\n"
        "                  'llvmlite': None if maps is None else 'llvmlite' in maps}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_small_in_memory_fit_imports_no_cluster_storage_or_compiled_loops(small_fit_process):
    mods = set(small_fit_process["modules"])
    assert "ooc_spectral" in mods and "sklearn" in mods
    assert not mods & HEAVY, sorted(mods & HEAVY)


def test_a_small_in_memory_fit_and_transform_build_no_dask_array(small_fit_process):
    # the passes' tasks of numpy rows are dask.delayed calls on RowBlocks: importing
    # dask.array (and xarray with it) would be most of a small fit's fixed cost
    got = (small_fit_process["dask.array"], small_fit_process["dask"])
    assert got == (False, True), small_fit_process


def test_a_small_fit_loads_neither_mkl_nor_llvm(small_fit_process):
    if small_fit_process["libmkl"] is None:  # pragma: no cover - Linux only
        pytest.skip("no /proc/self/maps")
    got = (small_fit_process["libmkl"], small_fit_process["llvmlite"])
    assert got == (False, False), small_fit_process


def test_importing_the_package_and_estimator_imports_nothing_heavy():
    mods = _modules_after("import ooc_spectral\nooc_spectral.GreedySpectralEmbedding")
    assert not mods & HEAVY, sorted(mods & HEAVY)


def test_the_command_lines_help_and_argument_errors_import_only_numpy():
    code = ("import contextlib, io\nfrom ooc_spectral.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['fit', '--help'])\n    main(['fit', 'x', '--n-componets', '3'])\n"
            "    main(['--help'])\n")
    mods = _modules_after(code)
    assert not mods & (HEAVY | {"dask", "scipy", "sklearn", "pandas", "xarray"}), sorted(mods)


def test_compiled_loops_only_for_large_blocks():
    from ooc_spectral._accel import blas, fused

    if fused.numba_loops() is None:  # pragma: no cover - numba not installed here
        return
    with fused.loops_for(fused.LOOPS_MIN_ELEMENTS - 1):
        assert fused.numba_loops() is None
    with fused.loops_for(fused.LOOPS_MIN_ELEMENTS):
        assert fused.numba_loops() is not None
    with fused.loops_for(None):  # not said: wherever available, as before
        assert fused.numba_loops() is not None
    if blas.mkl() is not None:  # MKL installed: the same gate
        with fused.loops_for(0):
            assert blas.mkl() is None
