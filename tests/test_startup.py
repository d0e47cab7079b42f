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


def test_a_small_in_memory_fit_imports_no_cluster_storage_or_compiled_loops():
    mods = _modules_after(_SMALL_FIT)
    assert "ooc_spectral" in mods and "sklearn" in mods
    assert not mods & HEAVY, sorted(mods & HEAVY)


def test_a_small_in_memory_fit_and_transform_build_no_dask_array():
    # the passes' tasks of numpy rows are dask.delayed calls on RowBlocks: importing
    # dask.array (and xarray with it) would be most of a small fit's fixed cost
    out = subprocess.run([sys.executable, "-c", _SMALL_FIT + "\nimport sys\n"
                          "print('dask.array' in sys.modules, 'dask' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["False", "True"], out.stdout


def test_a_small_fit_loads_neither_mkl_nor_llvm():
    import os

    if not os.path.exists("/proc/self/maps"):  # pragma: no cover - Linux only
        pytest.skip("no /proc/self/maps")
    out = subprocess.run([sys.executable, "-c", _SMALL_FIT + "\nmaps = open('/proc/self/maps')"
                          ".read()\nprint('libmkl' in maps, 'llvmlite' in maps)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["False", "False"], out.stdout


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
