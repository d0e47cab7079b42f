"""Every run ends, every error is named, no workflow can hurt its host (issue 13).

The real console script in subprocesses: SIGTERM and SIGKILL at chosen moments,
workers killed, a scheduler address that is not dask, memory limits too small,
stale and garbled locks taken over by racing processes, workflow files asking
for what only the command line may grant.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

from ooc_spectral.io.checkpoint import RunDirectory
from ooc_spectral.exceptions import InterruptedRun, OutputNotWritableError
from test_cli import EXE, FAST, cli, last_json

N = 60_000
ARGS = ["--gamma", "0.05", "--tol", "1e-3", "--n-components", "3", "--chunk-rows", "1000",
        "--checkpoint-every", "1", "-q"]
LOCAL = ["--workers", "2", "--threads-per-worker", "1", "--engine", "cluster"]


def _main(*args) -> int:
    """A command in this process, for the module's data and references (what the tests
    compare with, not what they test: the console script runs the commands under test)."""
    from ooc_spectral.batch.cli import main

    return main([str(a) for a in args])


@pytest.fixture(scope="module")
def roll(tmp_path_factory, restore_logging_module):
    d = tmp_path_factory.mktemp("safety")
    assert _main("make-data", "swiss-roll", "--n", N, "--out", d / "roll.zarr", "--chunk-rows",
                 1000, "-q") == 0
    return d / "roll.zarr"


@pytest.fixture(scope="module")
def small(tmp_path_factory, restore_logging_module):
    d = tmp_path_factory.mktemp("small")
    assert _main("make-data", "swiss-roll", "--n", 3000, "--out", d / "roll.zarr",
                 "--chunk-rows", 1000, "-q") == 0
    return d / "roll.zarr"


@pytest.fixture(scope="module")
def reference(roll, tmp_path_factory, restore_logging_module):
    out = tmp_path_factory.mktemp("ref") / "out"
    assert _main("fit", roll, "--out", out, *ARGS, *LOCAL) == 0
    return zarr.open_array(str(out / "embedding"), mode="r")[...]


#: the signal and worker-loss tests' data: 60 tasks of 400 rows, as many as ``roll``'s, so
#: a signal or a kill lands inside pass 2 as surely; a third of the rows (each run then
#: costs less)
MID = ["--chunk-rows", "400"]


@pytest.fixture(scope="module")
def mid(tmp_path_factory, restore_logging_module):
    d = tmp_path_factory.mktemp("mid")
    assert _main("make-data", "swiss-roll", "--n", 24_000, "--out", d / "roll.zarr", *MID,
                 "-q") == 0
    return d / "roll.zarr"


@pytest.fixture(scope="module")
def mid_reference(mid, tmp_path_factory, restore_logging_module):
    out = tmp_path_factory.mktemp("midref") / "out"
    assert _main("fit", mid, "--out", out, *ARGS, *LOCAL, *MID) == 0
    return zarr.open_array(str(out / "embedding"), mode="r")[...]


def run_attrs(out: Path) -> dict:
    return json.loads((out / "zarr.json").read_text())["attributes"]["ooc_spectral_run"]


def in_pass2(out: Path) -> bool:
    parts = out / "checkpoint" / "partials"
    try:
        return any((p / "zarr.json").exists() and "partial" in
                   json.loads((p / "zarr.json").read_text()).get("attributes", {})
                   for p in parts.iterdir() if p.is_dir())
    except (OSError, ValueError):
        return False


def wait_until(proc, predicate, timeout=300):
    deadline = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, f"the run ended first: {proc.communicate()}"
        assert time.time() < deadline
        time.sleep(0.005)


# --------------------------------------------------------------------------- signals
# SIGHUP (the SSH session closed) and SIGUSR1 (a batch system's warning) interrupt the run
# as SIGTERM does, not end the process by their default action (exit 129/138, left running)
@pytest.mark.parametrize("sig, engine", [(signal.SIGTERM, "cluster"), (signal.SIGINT, "cluster"),
                                         (signal.SIGHUP, "threads"), (signal.SIGUSR1, "threads")],
                         ids=["SIGTERM", "SIGINT", "SIGHUP-threads", "SIGUSR1-threads"])
def test_sigterm_in_pass2_marks_interrupted_releases_the_lock_and_the_rerun_resumes(
        mid, mid_reference, tmp_path, sig, engine, main_):
    out = tmp_path / "out"
    args = ["fit", str(mid), "--out", str(out), *ARGS, *LOCAL[:-1], engine, *MID, "--json"]
    proc = subprocess.Popen([EXE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        wait_until(proc, lambda: in_pass2(out))
        proc.send_signal(sig)  # SIGTERM: what systemd, SLURM and Kubernetes send
        # liveness, not speed: the run ends (a hang raises TimeoutExpired); no wall-clock
        # assertion, so a loaded machine cannot fail it
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, stderr  # "rerun"
    assert f"interrupted by {sig.name}" in stderr and "resumes" in stderr
    assert json.loads(stdout.strip().splitlines()[-1])["status"] == "interrupted"
    attrs = run_attrs(out)
    assert attrs["status"] == "interrupted" and sig.name in attrs["error"]
    assert not (out / ".lock").exists() and not (out / "report.json").exists()
    proc = main_(*args)  # the rerun: the same command, in this process
    assert proc.returncode == 0, proc.stderr
    assert "pass2" in last_json(proc)["resumed_stages"]
    got = zarr.open_array(str(out / "embedding"), mode="r")[...]
    np.testing.assert_allclose(got, mid_reference, rtol=0, atol=1e-12)
    assert run_attrs(out)["status"] == "complete"


def test_a_signal_whose_exception_python_dropped_still_interrupts_the_run(
        small, tmp_path, monkeypatch, capsys, restore_logging):
    """A signal handler runs wherever the main thread is: inside a weakref callback
    (as in a CI run, 2026-11-25) its InterruptedRun is printed as "Exception ignored"
    and dropped, and the fit ran to the end with exit 0. The signal is noted and
    raised again where the run moves on: exit 1, OUTDIR marked interrupted, no lock."""
    import gc
    import weakref

    from ooc_spectral.runtime import execution
    from ooc_spectral.batch.cli import main

    original = execution.Executor.run
    sent = []

    class Handle:
        pass

    def run_after_a_dropped_signal(self, *args, **kwargs):
        if not sent:
            sent.append(True)

            def callback(_):
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(10_000):  # the handler runs in here; its exception is dropped
                    pass

            handle = Handle()
            ref = weakref.ref(handle, callback)  # noqa: F841 (the callback needs it alive)
            del handle
            gc.collect()
        return original(self, *args, **kwargs)

    dropped = []
    monkeypatch.setattr(execution.Executor, "run", run_after_a_dropped_signal)
    monkeypatch.setattr(sys, "unraisablehook", lambda info: dropped.append(info.exc_type))
    out = tmp_path / "out"
    code = main(["fit", str(small), "--out", str(out), *ARGS, "--engine", "threads", "--json"])
    captured = capsys.readouterr()
    assert sent and dropped == [InterruptedRun]  # the handler's own raise was dropped
    assert code == 1, captured.err
    assert "interrupted by SIGTERM" in captured.err
    assert run_attrs(out)["status"] == "interrupted"
    assert not (out / ".lock").exists() and not (out / "report.json").exists()


def test_a_signal_dropped_after_the_last_step_is_logged_and_never_reaches_a_later_run(
        small, tmp_path, monkeypatch, capsys, restore_logging):
    """Dropped after the run's last check (writing the report): the run is complete, exit 0
    with a warning, and nothing is left pending for the next run in this process."""
    from ooc_spectral import exceptions
    from ooc_spectral.batch.cli import main

    original = RunDirectory.write_report
    seen = []

    def note_late(self, report):
        exceptions.note_interrupt(signal.SIGTERM)  # as the handler does before its raise
        seen.append(True)
        return original(self, report)

    monkeypatch.setattr(RunDirectory, "write_report", note_late)
    out = tmp_path / "out"
    code = main(["fit", str(small), "--out", str(out), *ARGS[:-1], "--engine", "threads"])
    assert seen and code == 0
    assert "SIGTERM arrived as the run ended" in capsys.readouterr().err
    assert run_attrs(out)["status"] == "complete"
    exceptions.raise_if_interrupted()  # nothing pending: a library fit here is not interrupted


# --------------------------------------------------------------------------- liveness
def _scheduler(tmp_path):
    from conftest import dask_scheduler

    return dask_scheduler(tmp_path)


def test_all_workers_killed_in_pass2_exit_1_within_the_bound_and_the_lock_is_released(
        mid, tmp_path):
    from distributed import Client

    sched, address = _scheduler(tmp_path)
    procs = [sched]
    try:
        worker = subprocess.Popen(["dask", "worker", address, "--nthreads", "1", "--no-nanny",
                                   "--no-dashboard"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(worker)
        # the worker connected before the run starts: the 3 s below count from its death only
        with Client(address, timeout=60) as c:
            c.wait_for_workers(1, timeout=240)
        out = tmp_path / "out"
        # faulthandler: if the run does not end, SIGABRT prints where each thread waits
        env = dict(os.environ, DASK_OOC_SPECTRAL__NO_WORKERS_TIMEOUT="3s", PYTHONFAULTHANDLER="1")
        fit = subprocess.Popen([EXE, "fit", str(mid), "--out", str(out), *ARGS, *MID,
                                "--scheduler", address], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=env)
        procs.append(fit)
        wait_until(fit, lambda: in_pass2(out))
        os.killpg(worker.pid, signal.SIGKILL)  # the only worker: none is left
        # liveness, not speed: the run must end (3 s without a worker, then it fails); the
        # bound is generous so that a loaded machine cannot fail it, and the message names
        # the 3 s that ended it
        try:
            _, stderr = fit.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            fit.send_signal(signal.SIGABRT)
            _, stderr = fit.communicate(timeout=60)
            pytest.fail(f"the run did not end 240 s after its last worker died; its threads:\n"
                        f"{stderr[-12000:]}")
        assert fit.returncode == 1, stderr
        assert "no dask worker has been connected to the scheduler for 3 s" in stderr
        assert run_attrs(out)["status"] == "failed"
        assert not (out / ".lock").exists()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                if p is not procs[-1] or len(procs) < 3:
                    os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_memory_limit_too_small_for_a_worker_is_exit_2_before_any_work(main_, small, tmp_path):
    out = tmp_path / "out"
    proc = main_("fit", small, "--out", out, "--memory-limit", "100MiB", *FAST)
    assert proc.returncode == 2, proc.stderr  # "before any work": nothing is created (below)
    assert "--memory-limit 100MiB is too small" in proc.stderr
    assert "pass --memory-limit 512MiB or more" in proc.stderr
    assert not out.exists()


def test_memory_limit_too_small_for_a_task_is_exit_2_naming_it_and_quiet_is_quiet(roll, tmp_path):
    # workers stay alive at 300 MiB but are killed by their nanny in every pass-2 task: the
    # task budget is set above what the limit holds (by default it follows the limit), and
    # the kernel block of a sub-block is let grow to that budget (by default it is kept
    # within 16 MiB of cache). One task of all 60,000 rows: its c x m blocks alone are
    # about 660 MB, so even a worker forked light from the fork server is killed
    out = tmp_path / "out"
    proc = cli("fit", roll, "--out", out, *ARGS, *LOCAL, "--memory-limit", "300MiB",
               "--chunk-rows", "60000", timeout=480,
               # restarted workers may take a while to come back on a loaded machine: the
               # no-worker timeout is not what this test is about
               env=dict(os.environ, DASK_OOC_SPECTRAL__TASK_MEMORY="1GiB",
                        DASK_OOC_SPECTRAL__CACHE_BLOCK="1GiB",
                        DASK_OOC_SPECTRAL__NO_WORKERS_TIMEOUT="300s"))
    assert proc.returncode == 2, proc.stderr
    assert "each worker's memory limit is 300MiB, too small for one task" in proc.stderr
    assert "a task up to 1024MiB" in proc.stderr
    assert "pass --memory-limit 1344MiB or more" in proc.stderr
    # --quiet: no nanny warnings, no distributed traceback, only our one line
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("ooc-spectral: error:")
    assert run_attrs(out)["status"] == "failed" and not (out / ".lock").exists()


@pytest.mark.slow
def test_the_task_budget_follows_the_memory_limit_so_300MiB_workers_finish(roll, reference,
                                                                        tmp_path):
    """The same run as above with the default budget: its tasks work in sub-blocks within
    what a 300 MiB worker holds, so it completes with the reference embedding (issue 18)."""
    out = tmp_path / "out"
    proc = cli("fit", roll, "--out", out, *ARGS, *LOCAL, "--memory-limit", "300MiB",
               "--chunk-rows", "24000", "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["engine"] == "cluster" and report["block_rows"] < 24000
    got = zarr.open_array(str(out / "embedding"), mode="r")[...]
    np.testing.assert_allclose(got, reference, rtol=0, atol=1e-10)


def _silent_server():
    """A TCP server that accepts connections and never says anything."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    return srv


def _http_400_server():
    """A TCP server answering every connection with an HTTP 400 at once (a proxy)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv


@pytest.mark.parametrize("server, words", [
    (_silent_server, "sent no dask handshake within 2 s"),
    (_http_400_server, "does not speak dask's protocol"),
])
def test_a_scheduler_address_that_is_not_dask_is_exit_2_within_the_timeout(small, tmp_path,
                                                                           server, words):
    srv = server()
    try:
        port = srv.getsockname()[1]
        env = dict(os.environ, DASK_OOC_SPECTRAL__CONNECT_TIMEOUT="2s")
        # liveness, not speed: the command ends (a hang raises TimeoutExpired after a
        # generous bound); the message names the 2 s time-out that ended it
        proc = cli("fit", small, "--out", tmp_path / "o", "--scheduler", f"tcp://127.0.0.1:{port}",
                   "-q", env=env, timeout=240)
        assert proc.returncode == 2, proc.stderr
        assert words in proc.stderr and "not a dask scheduler" in proc.stderr
        assert not (tmp_path / "o" / ".lock").exists()
    finally:
        srv.close()


def test_a_python_http_server_as_scheduler_is_refused(small, tmp_path):
    http = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = http.stdout.readline()  # "Serving HTTP on 127.0.0.1 port NNNN ..."
        port = int(line.split(" port ")[1].split()[0])
        env = dict(os.environ, DASK_OOC_SPECTRAL__CONNECT_TIMEOUT="2s")
        proc = cli("fit", small, "--out", tmp_path / "o", "--scheduler", f"127.0.0.1:{port}",
                   "-q", env=env, timeout=60)
        assert proc.returncode == 2 and "not a dask scheduler" in proc.stderr
    finally:
        http.kill()
        http.wait()


# --------------------------------------------------------------------------- beginnings
def test_sigkill_right_after_outdir_creation_then_the_same_command_finishes(small, tmp_path):
    for attempt in range(1):
        out = tmp_path / f"out{attempt}"
        args = ["fit", str(small), "--out", str(out), *FAST]
        proc = subprocess.Popen([EXE, *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_until(proc, out.exists, timeout=60)
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            proc.wait()
        cli(*args, check=0)
        assert run_attrs(out)["status"] == "complete"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


BEGINNINGS = {
    "empty directory, empty lock": {".lock": ""},
    "garbled lock": {".lock": '{"pid": 12'},
    "group without attributes (an older version killed mid-begin)": {
        ".lock": "", "zarr.json": '{"zarr_format": 3, "node_type": "group", "attributes": {}}',
        "checkpoint/zarr.json": '{"zarr_format": 3, "node_type": "group", "attributes": {}}'},
    "torn zarr.json (a full disk)": {"zarr.json": ""},
    "zarr's temporary file": {"zarr.0123abcd.partial": "{\"zarr_fo"},
}


@pytest.mark.parametrize("files", BEGINNINGS.values(), ids=list(BEGINNINGS))
def test_what_a_killed_beginning_leaves_is_started_over(tmp_path, files):
    out = tmp_path / "out"
    for name, text in files.items():
        _write(out / name, text)
    rundir = RunDirectory(out)
    with rundir:
        rundir.acquire("test")
        assert rundir.begin({"a": 1}, overwrite=False) is False
        assert rundir.status() == "running"
        rundir.checkpoint(1)
    assert not (out / ".lock").exists()
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "zarr.json"]


def test_a_real_sigkill_after_an_empty_lock_resumes_with_the_same_command(main_, small, tmp_path):
    out = tmp_path / "out"
    _write(out / ".lock", "")  # what a process killed between creating and writing it left
    assert main_("fit", small, "--out", out, *FAST).returncode == 0
    assert run_attrs(out)["status"] == "complete" and not (out / ".lock").exists()


TAKEOVER = r'''
import json, os, sys
from ooc_spectral.io.checkpoint import RunDirectory
from ooc_spectral.exceptions import LockedError

root, rounds = sys.argv[1], int(sys.argv[2])
stale = [json.dumps({"pid": 2**22 + 7, "host": os.uname().nodename, "started": "x"}),
         "", '{"pid": 4', json.dumps({"pid": os.getpid(), "host": os.uname().nodename}),
         json.dumps({"pid": 1, "host": "another-container"})]
results = []
for i in range(rounds):
    d = os.path.join(root, f"r{i}")
    os.makedirs(d)
    with open(os.path.join(d, ".lock"), "w") as f:
        f.write(stale[i % len(stale)])  # dead pid, empty, garbled, live reused pid, other host
    go_r, go_w = os.pipe()
    res_r, res_w = os.pipe()
    done_r, done_w = os.pipe()
    kids = []
    for k in range(2):
        pid = os.fork()
        if pid == 0:
            os.read(go_r, 1)
            try:
                RunDirectory(d).acquire("taker")
                won = b"1"
            except LockedError:
                won = b"0"
            os.write(res_w, won)
            if won == b"1":  # hold it until the other one has tried, however loaded the machine
                os.read(done_r, 1)
            os._exit(0)
        kids.append(pid)
    os.write(go_w, b"xx")  # both start at once
    got = b""
    while len(got) < 2:  # both tried (a winner still holds the lock)
        got += os.read(res_r, 2 - len(got))
    os.write(done_w, b"xx")
    for pid in kids:
        os.waitpid(pid, 0)
    results.append(got.decode())
print(json.dumps(results))
'''


def test_two_processes_taking_over_one_stale_lock_exactly_one_wins_20_times(tmp_path):
    proc = subprocess.run([sys.executable, "-c", TAKEOVER, str(tmp_path), "20"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert len(results) == 20
    assert all(sorted(r) == ["0", "1"] for r in results), results


# --------------------------------------------------------------------------- overwrite, workflows
def _foreign(tmp_path) -> Path:
    d = tmp_path / "precious"
    (d / "sub").mkdir(parents=True)
    (d / "thesis.tex").write_text("years of work")
    (d / "sub" / "data.csv").write_text("1,2,3")
    return d


def _unchanged(d: Path) -> bool:
    return ((d / "thesis.tex").read_text() == "years of work"
            and (d / "sub" / "data.csv").read_text() == "1,2,3")


def test_fit_overwrite_on_a_directory_that_is_no_output_refuses_and_deletes_nothing(
        main_, small, tmp_path):
    d = _foreign(tmp_path)
    proc = main_("fit", small, "--out", d, "--overwrite", *FAST)
    assert proc.returncode == 2
    assert "not an ooc-spectral output directory" in proc.stderr and "nothing was deleted" in proc.stderr
    assert _unchanged(d) and not (d / ".lock").exists()
    # a zarr group that is not a run is no output either
    g = tmp_path / "group.zarr"
    zarr.open_group(str(g), mode="w").attrs["mine"] = 1
    proc = main_("fit", small, "--out", g, "--overwrite", *FAST)
    assert proc.returncode == 2 and zarr.open_group(str(g), mode="r").attrs["mine"] == 1


def test_workflow_overwrite_refuses_a_foreign_directory_even_when_allowed(main_, small, tmp_path,
                                                                          monkeypatch):
    d = _foreign(tmp_path)
    wf = tmp_path / "w.toml"
    wf.write_text(f'[[step]]\nrun = "fit"\ninput = "{small}"\nout = "{d}"\noverwrite = true\n'
                  'workers = 1\n')
    monkeypatch.chdir(tmp_path)
    for allow in ([], ["--allow", "overwrite"]):
        proc = main_("run", wf, *allow, "-q")
        assert proc.returncode == 2, proc.stderr
        assert "not an ooc-spectral output directory" in proc.stderr
        assert _unchanged(d)


def test_workflow_overwrite_takes_effect_only_when_the_command_line_allows_it(main_, small,
                                                                             tmp_path):
    out = tmp_path / "o"
    assert main_("fit", small, "--out", out, "--tol", "1e-2", *FAST).returncode == 0  # the setup
    wf = tmp_path / "w.toml"
    wf.write_text(f'[[step]]\nrun = "fit"\ninput = "{small}"\nout = "o"\ntol = 1e-3\n'
                  'overwrite = true\nworkers = 1\n')
    proc = cli("run", wf, cwd=tmp_path)
    assert proc.returncode == 2  # overwrite ignored: the other configuration is kept
    assert "overwrite = true ignored" in proc.stderr and "different configuration" in proc.stderr
    assert run_attrs(out)["config"]["estimator"]["tol"] == 1e-2
    proc = cli("run", wf, "--allow", "overwrite", "-q", cwd=tmp_path, check=0)
    assert run_attrs(out)["config"]["estimator"]["tol"] == 1e-3
    assert proc.stderr == ""  # run -q: the step's cluster is quiet too


def test_workflow_root_above_the_working_directory_is_refused(main_, tmp_path, monkeypatch):
    work = tmp_path / "a" / "b"
    wf = work / "flows" / "w.toml"
    wf.parent.mkdir(parents=True)
    wf.write_text('[workflow]\nroot = "../../.."\n[[step]]\nrun = "make-data"\n'
                  'name = "spiral"\nn = 10\nout = "x.zarr"\n')
    monkeypatch.chdir(work)
    proc = main_("run", wf)
    assert proc.returncode == 2 and "above the directory the command runs in" in proc.stderr
    assert "--allow outside-cwd" in proc.stderr
    assert not (tmp_path / "x.zarr").exists()
    assert main_("run", wf, "--allow", "outside-cwd", "-q").returncode == 0
    assert (tmp_path / "x.zarr" / "zarr.json").exists()


@pytest.mark.parametrize("text, named", [
    ("step = [1, 2]\n", "step 0 is 1, not a table"),
    ('step = ["fit"]\n', "step 0 is 'fit', not a table"),
    ('workflow = 3\n[[step]]\nrun = "fit"\n', "workflow = 3 must be a table"),
    ('[workflow]\nroot = 5\n[[step]]\nrun = "fit"\n', "root = 5 must be a string"),
], ids=["step ints", "step strings", "workflow int", "root int"])
def test_a_workflow_of_the_wrong_shape_is_exit_2_naming_the_key(main_, tmp_path, monkeypatch,
                                                                text, named):
    """Found by an audit: each of these ended in a bare AttributeError or TypeError, exit 1
    (which says 'transient, run again')."""
    wf = tmp_path / "w.toml"
    wf.write_text(text)
    monkeypatch.chdir(tmp_path)
    proc = main_("run", wf)
    assert proc.returncode == 2 and named in proc.stderr, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr


def test_an_evaluate_step_whose_out_is_the_root_writes_nothing_above_it(main_, tmp_path,
                                                                        monkeypatch):
    """The ob2005 experiments' reference cache was written beside ``out`` (OUT/..), above the
    workflow's root when out = "." (found by an audit); it lives under ``out`` now."""
    root = tmp_path / "parent" / "root"
    root.mkdir(parents=True)
    wf = root / "wf.toml"
    wf.write_text('[workflow]\nroot = "."\n[[step]]\nrun = "evaluate"\n'
                  'experiment = "ob2005-table1"\nout = "."\nparam = { datasets = "spiral", '
                  'normalizations = "additive", scale = 0.02, repeats = 1, tols = "1e-2" }\n')
    monkeypatch.chdir(root)
    assert main_("run", wf, "-q").returncode == 0
    written = [p for p in (tmp_path / "parent").rglob("*") if p.is_file()]
    assert any(".reference-cache" in p.parts for p in written)  # the cache was used
    assert all(p.is_relative_to(root) for p in written), [str(p) for p in written]
    # a shared cache is a path like out: resolved under the root, refused above it
    text = wf.read_text()
    wf.write_text(text.replace('out = "."', 'out = "."\ncache_dir = "shared/cache"'))
    assert main_("run", wf, "-q").returncode == 0
    assert list((root / "shared" / "cache").glob("reference-*.npz"))
    wf.write_text(text.replace('out = "."', 'out = "."\ncache_dir = "../cache"'))
    proc = main_("run", wf, "-q")
    assert proc.returncode == 2 and "cache_dir" in proc.stderr, proc.stderr
    assert not (tmp_path / "parent" / "cache").exists()
    # nor as an experiment parameter, which no path check sees (a second audit)
    wf.write_text(text.replace('tols = "1e-2"', f'tols = "1e-2", cache_dir = "{tmp_path / "c"}"'))
    proc = main_("run", wf, "-q")
    assert proc.returncode == 2 and "--cache-dir" in proc.stderr, proc.stderr
    assert not (tmp_path / "c").exists()


def test_the_quickstart_root_from_the_repository_root_stays_valid(monkeypatch):
    from ooc_spectral.batch.workflow import load_workflow

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    wf = load_workflow("workflows/quickstart.toml")
    assert wf["root"] == repo


def test_workflow_naming_a_scheduler_needs_the_command_line_permission(main_, small, tmp_path,
                                                                       monkeypatch):
    wf = tmp_path / "w.toml"
    wf.write_text(f'[[step]]\nrun = "fit"\ninput = "{small}"\nout = "o"\n'
                  'scheduler = "tcp://127.0.0.1:1"\n')
    monkeypatch.chdir(tmp_path)
    proc = main_("run", wf, "-q")
    assert proc.returncode == 2 and "--allow scheduler" in proc.stderr
    assert "runs code in this process" in proc.stderr and not (tmp_path / "o").exists()
    # allowed (flag or environment): it is used, here an address where nothing listens (exit 1)
    monkeypatch.setenv("OOC_SPECTRAL_ALLOW", "scheduler")
    proc = main_("run", wf, "-q")
    assert proc.returncode == 1 and "cannot connect to the dask scheduler" in proc.stderr


# --------------------------------------------------------------------------- make-data, URLs
def test_make_data_larger_than_the_free_space_is_exit_2_and_writes_nothing(main_, tmp_path):
    for extra in (["--n", str(2**63 - 1)], ["--n", "10", "--dim", str(10**11)]):
        proc = main_("make-data", "spiral", *extra, "--out", tmp_path / "big.zarr", "-q")
        assert proc.returncode == 2 and "free" in proc.stderr and "GiB" in proc.stderr
        assert not (tmp_path / "big.zarr").exists()


# URLs as outputs: tests/test_object_storage.py (issue 17)


# --------------------------------------------------------------------------- the exit-code table
@pytest.mark.parametrize("code, why", [
    (0, "already complete"),
    (1, "scheduler unreachable"),
    (2, "bad option"),
    (2, "bad memory limit"),
    (2, "missing store"),
])
def test_exit_code_table(main_, small, tmp_path, code, why):
    """The README's table, one row each (SIGTERM, workers lost, memory: tests above)."""
    args = {
        "already complete": ["fit", small, "--out", tmp_path / "o", *FAST],
        "scheduler unreachable": ["fit", small, "--out", tmp_path / "o", "--scheduler",
                                  "tcp://127.0.0.1:1", "-q"],
        "bad option": ["fit", small, "--out", tmp_path / "o", "--no-such-option"],
        "bad memory limit": ["fit", small, "--out", tmp_path / "o", "--memory-limit", "lots"],
        "missing store": ["fit", tmp_path / "nothing.zarr", "--out", tmp_path / "o", *FAST],
    }[why]
    if why == "already complete":  # 0: success; then the same command on the complete OUTDIR
        assert main_(*args).returncode == 0
    proc = cli(*args)
    assert proc.returncode == code, proc.stderr
    if code:
        assert proc.stderr.startswith("ooc-spectral: error:")


@pytest.mark.parametrize("scale", [1e155, 1e200])
def test_finite_values_whose_squared_norms_overflow_are_named(main_, tmp_path, scale):
    X = np.random.default_rng(0).standard_normal((3000, 3)) * scale
    arr = zarr.create_array(str(tmp_path / "big.zarr"), shape=X.shape, chunks=(1000, 3),
                            dtype="f8")
    arr[...] = X
    proc = main_("fit", tmp_path / "big.zarr", "--out", tmp_path / "o", *FAST)
    assert proc.returncode == 2, proc.stderr
    assert "squared norm overflows float64" in proc.stderr and "scale the data" in proc.stderr


def test_inspect_names_a_live_holder_only(tmp_path):
    from ooc_spectral.batch.inspection import inspect_path

    out = tmp_path / "out"
    rundir = RunDirectory(out)
    rundir.acquire("fit x")
    rundir.begin({"a": 1}, overwrite=False)
    text, _ = inspect_path(out)
    assert f"locked by        pid {os.getpid()}" in text
    # what a killed run leaves: the file, but no lock
    holder = (out / ".lock").read_text()
    rundir.release()
    (out / ".lock").write_text(holder)
    text, _ = inspect_path(out)
    assert "locked by" not in text and "status           running" in text


def _private_mount_namespace() -> list[str] | None:
    """``unshare`` arguments for a private mount namespace where a tmpfs can be mounted."""
    for cmd in (["unshare", "--mount", "--propagation", "private"], ["unshare", "-rm"]):
        try:
            ok = subprocess.run([*cmd, "sh", "-c", "mount -t tmpfs -o size=1m none /mnt"],
                                capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return cmd
    return None


def test_a_full_disk_through_the_cli_is_exit_1_and_the_rerun_with_space_finishes(tmp_path, main_):
    """The exit-code table's "the disk filled up" row on a real full file system: OUTDIR on
    a 1 MiB tmpfs (in a private mount namespace) that the run's outputs cannot fit (the
    30,000 x 4 embedding alone is 0.9 MiB, the checkpoint's m x m partials come first):
    exit 1 naming the cause, status failed, no complete embedding; the same command after
    the tmpfs grows finishes, equal to a fit on a roomy disk."""
    unshare = _private_mount_namespace()
    if unshare is None:
        pytest.skip("no private mount namespace (unshare) on this machine to fill a disk in")
    # the data and the roomy fit in this process: the runs on the full disk are the subject
    assert main_("make-data", "swiss-roll", "--n", "30000", "--out", tmp_path / "in.zarr",
                 "-q").returncode == 0
    args = f"--gamma 0.05 --tol 1e-3 --n-components 4 --engine threads -q"
    (tmp_path / "mnt").mkdir()
    script = f"""
        mount -t tmpfs -o size=1m none mnt || exit 99
        {EXE} fit in.zarr --out mnt/out {args} 2> err1.txt; echo $? > code1.txt
        python -c "import json; print(json.dumps(json.load(open('mnt/out/zarr.json'))
                   ['attributes']['ooc_spectral_run']['status']))" > status1.txt
        ls mnt/out > listing1.txt
        mount -o remount,size=64m mnt
        {EXE} fit in.zarr --out mnt/out {args} 2> err2.txt; echo $? > code2.txt
        cp -r mnt/out out-copy
    """
    proc = subprocess.run([*unshare, "sh", "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    read = lambda name: (tmp_path / name).read_text().strip()  # noqa: E731
    assert read("code1.txt") == "1", read("err1.txt")
    assert "No space left on device" in read("err1.txt")
    assert "free space" in read("err1.txt") and "rerun the same command" in read("err1.txt")
    assert read("status1.txt") == '"failed"'
    assert read("code2.txt") == "0", read("err2.txt")
    assert main_("fit", tmp_path / "in.zarr", "--out", tmp_path / "fresh",
                 *args.split()).returncode == 0
    got = zarr.open_array(str(tmp_path / "out-copy" / "embedding"), mode="r")
    want = zarr.open_array(str(tmp_path / "fresh" / "embedding"), mode="r")
    assert got.attrs["complete"] and got.shape == (30000, 4)
    np.testing.assert_allclose(got[...], want[...], rtol=0, atol=1e-12 * np.abs(want[...]).max())


def test_a_full_disk_while_creating_the_embedding_is_a_runtime_failure(tmp_path, monkeypatch):
    import errno

    from ooc_spectral.pipeline import writeback

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    import zarr

    monkeypatch.setattr(zarr, "open_group", full)  # writeback imports zarr when it writes
    out = writeback.EmbeddingOutput(str(tmp_path / "o"), 10, 2, 5)
    with pytest.raises(OSError) as info:
        out.prepare()
    assert info.value.errno == errno.ENOSPC
    assert not isinstance(info.value, OutputNotWritableError)  # exit 1 ("rerun"), not 2


def test_a_result_lost_with_the_last_worker_before_it_is_gathered_ends_the_pass():
    # The race behind a hang seen in CI: a part finishes, then every worker dies before the
    # client gathers its result; dask reschedules the part and the plain fut.result() waited
    # for ever. The Executor must raise WorkersLostError once no worker is left.
    import dask
    import dask.array as da
    from distributed import Client, LocalCluster

    from ooc_spectral.exceptions import WorkersLostError
    from ooc_spectral.runtime.execution import Executor

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        with dask.config.set({"ooc-spectral.no-workers-timeout": "2s"}):
            ex = Executor(client)
            fut = client.compute(da.ones((100, 10), chunks=(50, 10)).sum())
            deadline = time.time() + 30
            while fut.status != "finished":
                assert time.time() < deadline
                time.sleep(0.01)
            cluster.sync(next(iter(cluster.workers.values())).close)
            # liveness, not speed: _result must end (raise) rather than wait for ever; it runs
            # in a daemon thread so that a hang fails the test after a generous bound
            outcome = _outcome_within(lambda: ex._result("pass 2", fut))
            assert outcome, "_result still waiting 240 s after the last worker left"
            assert isinstance(outcome[0], WorkersLostError), outcome[0]
            assert "before its result was gathered" in str(outcome[0])


def _outcome_within(call, bound: float = 240.0) -> list:
    """``[result or exception]`` of ``call()`` run in a daemon thread, or ``[]`` if it is
    still running after ``bound`` seconds: liveness, not speed (a hang fails the test
    after a generous bound instead of hanging the suite)."""
    outcome: list = []

    def run():
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 -- examined by the caller
            outcome.append(exc)

    waiter = threading.Thread(target=run, daemon=True)
    waiter.start()
    waiter.join(timeout=bound)
    return outcome


_RELEASE = threading.Event()


def _wait_for_release():
    return _RELEASE.wait(120)


def test_a_scheduler_that_stops_answering_ends_the_pass(monkeypatch):
    # A stopped scheduler (SIGSTOP, a frozen VM) keeps its connections open and never
    # answers: client.scheduler_info() in the pass's checks waited for ever, past the
    # watchdog (workflows/bench/adversarial.py, wd-scheduler-stopped). Each question now
    # waits SCHEDULER_ANSWER_SECONDS, and a scheduler unanswered for no-workers-timeout
    # ends the pass with StalledRunError (exit 1, the rerun resumes).
    import asyncio

    import dask
    from distributed import Client, LocalCluster

    from ooc_spectral.exceptions import StalledRunError
    from ooc_spectral.runtime import execution

    async def never(**kwargs):
        await asyncio.sleep(3600)

    monkeypatch.setattr(execution, "SCHEDULER_ANSWER_SECONDS", 0.5)
    _RELEASE.clear()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        try:
            with dask.config.set({"ooc-spectral.no-workers-timeout": "2s"}):
                ex = execution.Executor(client)
                client.scheduler.identity = never  # the scheduler stops answering
                outcome = _outcome_within(lambda: ex.run("pass 2", {0: dask.delayed(
                    _wait_for_release, pure=False)()}))
            assert outcome, "the pass still waiting 240 s after the scheduler stopped answering"
            assert isinstance(outcome[0], StalledRunError), outcome[0]
            assert "the dask scheduler has not answered" in str(outcome[0])
        finally:
            del client.scheduler.identity
            _RELEASE.set()
