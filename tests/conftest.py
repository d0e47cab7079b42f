"""Shared fixtures: data sets, zarr stores on disk, a real LocalCluster."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import zarr
from sklearn.datasets import make_swiss_roll
from threadpoolctl import threadpool_limits


@pytest.fixture(scope="session", autouse=True)
def one_blas_thread():
    """One BLAS thread in the test process (subprocesses and workers set their own).

    The fits here are small; OpenBLAS's busy-waiting threads make them many times
    slower when the two cores are shared with the LocalCluster workers or another
    job. Where a result could depend on the thread count the library fixes it itself;
    the tests of that set two threads again (``test_estimator.py``'s pre-image round trip).
    """
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(autouse=True)
def fixed_fresh_seeds(request, monkeypatch):
    """``random_state=None`` draws its seeds from the test's id, not the OS, in this process.

    A fit left at the default random state scans in a fresh random order; a test that
    does so would otherwise pass or fail by the draw (a polynomial kernel at tol 1e-6 is
    refused, with advice, for about one scan order in twenty). Every test now sees the
    same orders on every run and machine; a claim meant for every order names its seeds.
    """
    import itertools
    import zlib

    from ooc_spectral.core import config

    base = zlib.crc32(request.node.nodeid.encode())
    draws = itertools.count()
    monkeypatch.setattr(config, "fresh_seed", lambda: int(
        np.random.SeedSequence([base, next(draws)]).generate_state(1)[0] >> 1))


#: the environment variable of the dask config ``ooc-spectral.mkl``
MKL_ENV = "DASK_OOC_SPECTRAL__MKL"


@pytest.fixture(scope="session", autouse=True)
def openblas_by_default():
    """The suite runs pass 2 on SciPy's OpenBLAS, what every installation has, in this
    process and in the commands and workers it starts (the dask config and its
    environment variable); the tests that want Intel MKL (the ``mkl`` extra,
    installed with the test extra on x86-64) ask for it with :func:`mkl_backend`."""
    with _mkl_setting(False):
        yield


@contextlib.contextmanager
def _mkl_setting(on: bool):
    import os

    import dask

    before = os.environ.get(MKL_ENV)
    os.environ[MKL_ENV] = str(bool(on))
    try:
        with dask.config.set({"ooc-spectral.mkl": bool(on)}):
            yield
    finally:
        if before is None:
            os.environ.pop(MKL_ENV, None)
        else:
            os.environ[MKL_ENV] = before


@contextlib.contextmanager
def mkl_backend(on: bool = True):
    """Pass 2's solve and accumulation on MKL (``on``) or OpenBLAS within the block;
    skips the test where MKL is not installed."""
    from ooc_spectral._accel import blas as _blas

    with _mkl_setting(on):
        if on and _blas.mkl() is None:
            pytest.skip("Intel MKL is not installed (pip install -e '.[mkl]')")
        yield


@pytest.fixture(scope="session", autouse=True)
def workers_by_forkserver():
    """The tests' own LocalClusters start workers as the embedded one does: forked from
    one server that imported the pass modules once (:func:`ooc_spectral.runtime.
    cluster.embedded_worker_start`), not each a fresh interpreter (about 2 s of CPU each)."""
    from ooc_spectral.runtime.cluster import embedded_worker_start

    with embedded_worker_start():
        yield


def write_zarr(path, X, chunk_rows, *, name=None, dtype=None):
    """Write X to a zarr v3 array at ``path`` (or ``path/name`` in a group)."""
    X = np.asarray(X) if dtype is None else np.asarray(X, dtype=dtype)
    if name is None:
        arr = zarr.create_array(str(path), shape=X.shape, chunks=(chunk_rows, X.shape[1]),
                                dtype=X.dtype, overwrite=True)
    else:
        group = zarr.open_group(str(path), mode="a")
        arr = group.create_array(name, shape=X.shape, chunks=(chunk_rows, X.shape[1]),
                                 dtype=X.dtype, overwrite=True)
    arr[...] = X
    return arr


@pytest.fixture(scope="session")
def swiss_roll():
    X, t = make_swiss_roll(2500, random_state=0)
    return X, t


def dask_scheduler(tmp_path, env=None, timeout: float = 60.0):
    """``(process, address)`` of a ``dask scheduler`` started in its own session on a free
    port, once its scheduler file is complete: the file appears before the scheduler has
    written it (an empty file read too early is a JSON error, not an address)."""
    import json
    import subprocess
    import time

    sched_file = tmp_path / "scheduler.json"
    proc = subprocess.Popen(["dask", "scheduler", "--scheduler-file", str(sched_file), "--port",
                             "0", "--no-dashboard"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + timeout
    while True:
        try:
            return proc, json.loads(sched_file.read_text())["address"]
        except (FileNotFoundError, ValueError, KeyError):
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise AssertionError(f"the dask scheduler did not start within {timeout} s "
                                     f"(exit code {proc.poll()})") from None
            time.sleep(0.05)


@pytest.fixture(scope="session")
def cluster():
    """A real dask.distributed LocalCluster with two worker processes."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0", memory_limit="2GiB") as c:
        yield c


@pytest.fixture
def client(cluster):
    """A Client on the session's LocalCluster, the default client for the test only."""
    from distributed import Client

    with Client(cluster) as c:
        yield c


#: The files that take longest (``--durations``, 2 cores), started first: with ``--dist
#: loadfile`` a file runs on one test process, and a long file started last would run
#: alone at the end while the other process sits idle. xdist keeps this order only with
#: ``--no-loadscope-reorder`` (pyproject.toml); files not named here follow, in
#: collection order. A new file that takes more than about 20 s belongs in this list.
LONGEST_FIRST = ("test_object_storage.py", "test_append.py", "test_batch_safety.py",
                 "test_resume.py", "test_exactness.py", "test_readme.py", "test_audit_52b.py",
                 "test_command_contract.py", "test_rpcholesky.py", "test_cli.py",
                 "test_docs.py", "test_baselines.py", "test_scan.py", "test_reproductions.py",
                 "test_integrity.py", "test_reliability.py", "test_prefix_scan.py")


@contextlib.contextmanager
def _logging_restored():
    """An in-process ``main()`` configures the ``ooc_spectral`` logger (its own stderr
    handler, no propagation) and dask's levels; put them back, so that later tests'
    ``caplog`` sees the records and no handler writes to a closed capture."""
    import logging

    names = ("ooc_spectral", "distributed", "tornado", "asyncio", "bokeh")
    saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).level,
                 logging.getLogger(n).propagate) for n in names}
    try:
        yield
    finally:
        for n, (handlers, level, propagate) in saved.items():
            logger = logging.getLogger(n)
            logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate


@pytest.fixture
def restore_logging():
    """For a test that runs ``main()`` in-process (see :func:`_logging_restored`)."""
    with _logging_restored():
        yield


@pytest.fixture
def main_(capsys, restore_logging):
    """``main_("fit", ...)``: the command line's ``main`` in this process, read as a
    console script's process is read: a :class:`subprocess.CompletedProcess` of the exit
    code and what it wrote (``capsys``). For the tests whose subject is a command's
    outcome, not its process: a process pays the import of the package, dask and
    distributed, and its own shutdown, on every call (about 2 s on two quiet cores, 10 s
    under load). Signals, kills, a real exit status, what a fresh interpreter imports and
    a process's quiet stderr stay with the console script (``test_cli.cli``)."""
    import subprocess

    from ooc_spectral.batch.cli import main

    def run(*args) -> subprocess.CompletedProcess:
        argv = [str(a) for a in args]
        capsys.readouterr()  # what came before is not this command's
        code = main(argv)
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, captured.out, captured.err)

    return run


@pytest.fixture(scope="module")
def restore_logging_module():
    """For a module whose module-scoped fixtures run ``main()`` in-process: request it
    from an autouse module fixture, so that it saves the state before they run."""
    with _logging_restored():
        yield


def _numba_cache_is_current() -> bool:
    """Whether numba's disk cache of the compiled loops (beside the module, where a
    checkout keeps it) is newer than their source."""
    from pathlib import Path

    import ooc_spectral

    accel = Path(ooc_spectral.__file__).parent / "_accel"
    index = list((accel / "__pycache__").glob("fused_numba.*.nbi"))
    source = (accel / "fused_numba.py").stat().st_mtime
    return bool(index) and min(f.stat().st_mtime for f in index) >= source


def pytest_configure(config):
    """In a fresh checkout, compile the loops once before the test processes start: each
    process that imports them before numba's disk cache exists compiles every loop itself
    (about 10 s of CPU each; the two workers, their dask workers and the command lines they
    start did so side by side). The controller only, and only where the cache is missing or
    older than the source."""
    import importlib.util
    import os
    import subprocess
    import sys

    if hasattr(config, "workerinput") or importlib.util.find_spec("numba") is None:
        return
    if _numba_cache_is_current():
        return
    # a failure here is left to the tests that use the loops to report
    subprocess.run([sys.executable, "-c", "from ooc_spectral._accel import fused_numba"],
                   env=dict(os.environ), capture_output=True, check=False, timeout=600)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept


@pytest.fixture(autouse=True)
def package_logger_restored():
    """Every test starts and ends with the package logger in its library state: no handler
    of its own, level NOTSET, propagating, enabled. Commands run in-process (``main([...])``,
    in a test or a module fixture) attach the command line's handler and stop propagation,
    as a command's process should; left in place, a later test in the same worker would see
    warnings as log lines (:func:`~ooc_spectral.exceptions.warn_once`) and nothing in
    ``caplog``."""
    import logging

    def clean():
        log = logging.getLogger("ooc_spectral")
        log.handlers[:] = []
        log.setLevel(logging.NOTSET)
        log.propagate = True
        for name, lg in list(logging.root.manager.loggerDict.items()):
            if name.split(".")[0] == "ooc_spectral" and isinstance(lg, logging.Logger):
                lg.disabled = False

    clean()
    yield
    clean()
