"""Batch semantics: ``ooc-spectral fit`` killed with SIGKILL resumes to the same result.

Each test starts the real console script in its own session, watches the output
directory until the run is inside the stage under test, kills the whole process
group (the client and the embedded cluster's workers) with SIGKILL, reruns the
same command (its ``main`` in this process: the killed process is the console
script's, the rerun's outcome is what is compared), and compares the final embedding
with an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from test_cli import EXE

#: Two scan windows of 65,536 rows, the second partial (2,064 rows). The seeded visiting
#: order (``--seed 0``, the command's default) reads the partial window first, so the
#: kill in the scan lands while the whole window is scanned (``test_visiting_order``).
N = 67_600
CHUNK = 1690  # 40 tasks: enough that each kill lands inside its pass
ARGS = ["--gamma", "0.05", "--tol", "1e-3", "--n-components", "3", "--chunk-rows", str(CHUNK),
        "--checkpoint-every", "1", "--workers", "2", "--threads-per-worker", "1", "-q",
        "--engine", "cluster"]  # SIGKILL of the client and its worker processes


def main(*args) -> int:
    """The command in this process: the data and the uninterrupted reference are not what
    this module tests (the killed runs and their reruns are, by the console script)."""
    from ooc_spectral.batch.cli import main

    return main([str(a) for a in args])


@pytest.fixture(scope="module")
def data(tmp_path_factory, restore_logging_module):
    d = tmp_path_factory.mktemp("resume")
    assert main("make-data", "swiss-roll", "--n", N, "--out", d / "roll.zarr", "--chunk-rows",
                CHUNK, "-q") == 0
    return d / "roll.zarr"


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory, restore_logging_module):
    out = tmp_path_factory.mktemp("ref") / "out"
    assert main("fit", data, "--out", out, *ARGS) == 0
    return zarr.open_array(str(out / "embedding"), mode="r")[...]


def _attrs(path: Path, key: str):
    try:
        return json.loads((path / "zarr.json").read_text())["attributes"].get(key)
    except (OSError, ValueError, KeyError):
        return None


def in_scan(out: Path) -> bool:
    scan = _attrs(out / "checkpoint", "scan")
    return bool(scan) and 1 <= scan["windows_done"] < -(-N // 65536)


def in_pass2(out: Path) -> bool:
    parts = out / "checkpoint" / "partials"
    return parts.exists() and any(_attrs(p, "partial") for p in parts.iterdir() if p.is_dir())


def in_pass3(out: Path) -> bool:
    """A written-marker of pass 3 holds its bytes: an output chunk is done. (An entry
    alone is not enough: the file exists, empty, before its bytes are written, and a kill
    then leaves no chunk done, nothing for the rerun to resume; seen in CI under load.)"""
    marks = out / "embedding_written" / "c"
    return marks.exists() and any(p.is_file() and p.stat().st_size > 0 for p in marks.rglob("*"))


def kill_when(out: Path, predicate, args) -> None:
    """Start ``fit``, SIGKILL its process group once ``predicate(out)`` holds."""
    proc = subprocess.Popen([EXE, "fit", *args], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 600
        while not predicate(out):
            assert proc.poll() is None, f"the run ended before the stage: {proc.stderr.read()}"
            assert time.time() < deadline
            time.sleep(0.005)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_visiting_order():
    """The scan of this module's data visits the partial window first (see ``N``)."""
    from ooc_spectral.core.planning import VISIT_WINDOW_ROWS, VisitOrder

    assert N // VISIT_WINDOW_ROWS == 1 and N % VISIT_WINDOW_ROWS
    assert list(VisitOrder(N, 0).windows) == [1, 0]


@pytest.mark.parametrize("stage, predicate, resumed", [
    ("scan", in_scan, {"scan"}),
    ("pass2", in_pass2, {"scan", "pass2"}),
    ("pass3", in_pass3, {"scan", "pass2", "pass3"}),
])
def test_sigkill_then_rerun_equals_uninterrupted_run(data, reference, tmp_path, stage, predicate,
                                                     resumed, restore_logging):
    out = tmp_path / "out"
    args = [str(data), "--out", str(out), *ARGS]
    kill_when(out, predicate, args)
    # a killed run never looks complete
    run = _attrs(out, "ooc_spectral_run")
    assert run["status"] == "running"
    assert not (out / "report.json").exists()
    if stage == "pass2":
        total = len(list((out / "checkpoint" / "partials").iterdir()))
        assert total >= 1
    # the same command resumes (in this process: the rerun's outcome is the subject here)
    assert main("fit", *args) == 0
    report = json.loads((out / "report.json").read_text())
    assert resumed <= set(report["resumed_stages"]), report["resumed_stages"]
    got = zarr.open_array(str(out / "embedding"), mode="r")[...]
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-12)
    assert _attrs(out, "ooc_spectral_run")["status"] == "complete"
    assert not (out / ".lock").exists()


def test_scheduler_loss_exits_1_and_the_rerun_resumes(data, reference, tmp_path,
                                                       restore_logging):
    """The dask scheduler dies mid-pass: exit code 1, and the same command resumes."""
    from conftest import dask_scheduler

    sched, address = dask_scheduler(tmp_path)
    procs = [sched]
    try:
        procs.append(subprocess.Popen(["dask", "worker", address, "--nthreads", "1",
                                       "--no-dashboard"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True))
        out = tmp_path / "out"
        args = [str(data), "--out", str(out), *ARGS]
        fit = subprocess.Popen([EXE, "fit", *args, "--scheduler", address],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 600
        while not in_pass2(out):
            assert fit.poll() is None, fit.stderr.read()
            assert time.time() < deadline
            time.sleep(0.005)
        os.killpg(procs[0].pid, signal.SIGKILL)  # the scheduler
        err = fit.communicate(timeout=300)[1]
        assert fit.returncode == 1, err
        assert err.strip().splitlines()[-1].startswith("ooc-spectral: error: ")
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    assert _attrs(out, "ooc_spectral_run")["status"] == "failed"
    assert main("fit", *args) == 0  # rerun, on the embedded cluster this time
    report = json.loads((out / "report.json").read_text())
    assert "scan" in report["resumed_stages"]
    got = zarr.open_array(str(out / "embedding"), mode="r")[...]
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-12)
