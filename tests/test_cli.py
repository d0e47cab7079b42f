"""The command line: exit codes, messages, outputs.

The real console script in subprocesses where the process is the subject (the fit whose
outputs the module reads, a real exit status and ``--json`` line, quiet stderr, an
external cluster, what a fresh interpreter imports); the other commands run ``main``
in this process (the ``main_`` fixture, tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import zarr

from ooc_spectral import GreedySpectralEmbedding

EXE = shutil.which("ooc-spectral") or "ooc-spectral"


def cli(*args, check=None, timeout=300, **kw):
    """Run the console script; returns the CompletedProcess."""
    proc = subprocess.run([EXE, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kw)
    if check is not None:
        assert proc.returncode == check, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def last_json(proc):
    return strict_loads(proc.stdout.strip().splitlines()[-1])


FAST = ["--workers", "1", "--threads-per-worker", "2", "-q"]


def strict_loads(text: str):
    """JSON as strict parsers read it: Infinity and NaN are not JSON (RFC 8259)."""
    def refuse(name):
        raise AssertionError(f"{name} is not JSON: strict parsers refuse it")
    return json.loads(text, parse_constant=refuse)


def test_reports_write_what_is_not_finite_as_null_for_strict_parsers():
    """report.json and the --json line wrote Infinity (an uncertified interval, an outside
    audit): JavaScript's JSON.parse refuses it and jq reads it as 1.8e308, a finite bound."""
    from ooc_spectral.io import strict_json

    text = strict_json.dumps({"interval": [[-np.inf, np.inf]], "b": np.float64(np.nan),
                              "rows": np.arange(3), "m": np.int64(7), "ok": 0.5, "when": "now"})
    assert strict_loads(text) == {"interval": [[None, None]], "b": None, "rows": [0, 1, 2],
                                  "m": 7, "ok": 0.5, "when": "now"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    cli("make-data", "swiss-roll", "--n", 6000, "--out", d / "roll.zarr", "--chunk-rows", 1000,
        "--seed", 1, check=0)
    return d / "roll.zarr"


@pytest.fixture(scope="module")
def fitted(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("fit") / "out"
    proc = cli("fit", data, "--out", out, "--n-components", 2, "--gamma", 0.05, "--tol", 1e-3,
               "--json", *FAST, check=0)
    return out, last_json(proc)


def test_make_data_writes_group_with_labels(data):
    g = zarr.open_group(str(data), mode="r")
    assert g["data"].shape == (6000, 3) and g["data"].chunks == (1000, 3)
    assert g["t"].shape == (6000,)
    t = g["t"][...]
    assert t.min() >= 1.5 * np.pi and t.max() <= 4.5 * np.pi
    assert g.attrs["ooc_spectral_dataset"]["complete"] is True


@pytest.mark.parametrize("mkl", [False, True])
def test_report_names_what_pass_2_ran_on(mkl):
    """``blas``, ``compiled_loops`` and ``pass2_block_rows`` of ``report.json`` are what a task
    of pass 2 used: the accelerators only on tasks of at least ACCEL_MIN_ENTRIES entries
    (rows x m). A small fit with MKL installed and on ran on OpenBLAS; the report said MKL."""
    from types import SimpleNamespace

    from conftest import mkl_backend

    from ooc_spectral._accel.fused import loops_backend
    from ooc_spectral._accel.support import ACCEL_MIN_ENTRIES
    from ooc_spectral.batch.jobs import pass2_libraries
    from ooc_spectral.core.planning import solve_block_rows

    def result(task_rows, m=800, exact=False):
        return SimpleNamespace(exact=exact, task_rows=task_rows, block_rows=2621,
                               dictionary=SimpleNamespace(size=m))

    large = result(ACCEL_MIN_ENTRIES // 800 + 1)
    small = result(ACCEL_MIN_ENTRIES // 800 - 1)
    with mkl_backend(mkl):
        got = pass2_libraries(large)
        assert got["blas"].startswith("mkl ") is mkl
        assert got["compiled_loops"] == loops_backend()
        assert got["pass2_block_rows"] == solve_block_rows(2621, 800, "C" if mkl else "F")
        assert (got["pass2_block_rows"] < 2621) is mkl  # the C order's sub-blocks of a few MiB
        got = pass2_libraries(small)
        assert got == {"blas": "openblas (scipy)", "compiled_loops": None, "pass2_block_rows": 2621}
        # the exact path has no pass 2: the process's view
        assert pass2_libraries(result(10, exact=True))["blas"].startswith("mkl ") is mkl


def test_make_data_bad_name_is_usage_error(main_, tmp_path):
    proc = main_("make-data", "moons", "--n", 10, "--out", tmp_path / "x.zarr")
    assert proc.returncode == 2
    assert "invalid choice: 'moons'" in proc.stderr


def test_fit_writes_embedding_model_and_report(data, fitted):
    out, summary = fitted
    assert summary["status"] == "complete" and summary["exit_code"] == 0
    report = strict_loads((out / "report.json").read_text())
    for key in ("n_samples", "n_features", "dictionary_size", "tol", "max_residual", "gamma",
                "eigenvalues", "normalization", "stages", "versions", "config_hash",
                "resumed_stages"):
        assert key in report
    assert report["n_samples"] == 6000 and report["n_features"] == 3
    assert report["blas"] == "openblas (scipy)"  # the suite's default reaches the command (conftest)
    from ooc_spectral._accel.fused import loops_backend

    # pass 2's tasks of this small fit are below the accelerators' block size: NumPy's calls
    # (test_report_names_what_pass_2_ran_on for large tasks)
    assert loops_backend() is None or report["compiled_loops"] is None
    assert report["pass2_block_rows"] == report["block_rows"]  # the F order keeps the planned size
    assert report["resumed_stages"] == []
    assert report["max_residual"] <= 1e-3
    for stage in ("scan", "pass2", "solve", "pass3"):
        assert report["stages"][stage]["seconds"] >= 0
        assert report["stages"][stage]["peak_memory_bytes"] > 0
    emb = zarr.open_array(str(out / "embedding"), mode="r")
    assert emb.chunks == (1000, 2)  # aligned with the input rows
    # the model loads, and equals the Python API on the same data and parameters
    model = GreedySpectralEmbedding.load(out / "model")
    X = zarr.open_group(str(data), mode="r")["data"][...]
    est = GreedySpectralEmbedding(n_components=2, gamma=0.05, tol=1e-3, random_state=0).fit(X)
    np.testing.assert_allclose(emb[...], est.embedding_, atol=1e-10)
    np.testing.assert_allclose(model.transform(X[:100]), est.embedding_[:100], atol=1e-10)
    assert zarr.open_group(str(out), mode="r").attrs["ooc_spectral_run"]["status"] == "complete"


def test_rerun_of_a_complete_run_is_a_no_op(main_, data, fitted):
    out, summary = fitted
    before = (out / "report.json").read_text()
    proc = main_("fit", data, "--out", out, "--n-components", 2, "--gamma", 0.05, "--tol", 1e-3,
                 "--json", *FAST)
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc)["config_hash"] == summary["config_hash"]
    assert (out / "report.json").read_text() == before


def test_fit_missing_store(tmp_path):
    proc = cli("fit", tmp_path / "nope.zarr", "--out", tmp_path / "o", "--json", "-q")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("ooc-spectral: error: no zarr array or group at")
    assert last_json(proc) == {"status": "error", "exit_code": 2,
                               "error": proc.stderr.strip().split("error: ", 1)[1]}


def test_fit_nan_in_data(main_, tmp_path):
    X = np.random.default_rng(0).normal(size=(3000, 3))
    X[2345, 2] = np.nan
    arr = zarr.create_array(str(tmp_path / "x.zarr"), shape=X.shape, chunks=(500, 3), dtype="f8")
    arr[...] = X
    proc = main_("fit", tmp_path / "x.zarr", "--out", tmp_path / "o", *FAST)
    assert proc.returncode == 2
    assert "X contains NaN at row 2345, column 2 (chunk 4 of 6, rows 2000-2499)" in proc.stderr
    # the output is not marked complete
    attrs = zarr.open_group(str(tmp_path / "o"), mode="r").attrs["ooc_spectral_run"]
    assert attrs["status"] == "failed" and "NaN" in attrs["error"]
    assert not (tmp_path / "o" / "report.json").exists()


def test_fit_out_of_range_parameter(main_, data, tmp_path):
    proc = main_("fit", data, "--out", tmp_path / "o", "--tol", -1, "-q")
    assert proc.returncode == 2
    assert "tol=-1.0 is out of range: expected a number >= 0.0" in proc.stderr
    proc = main_("fit", data, "--out", tmp_path / "o", "--kernel", "sigmoid", "-q")
    assert proc.returncode == 2 and "invalid choice: 'sigmoid'" in proc.stderr


def test_fit_different_configuration_on_existing_outdir(main_, data, fitted):
    out, _ = fitted
    proc = main_("fit", data, "--out", out, "--n-components", 3, "--gamma", 0.05, "--tol", 1e-3,
                 *FAST)
    assert proc.returncode == 2
    assert "holds a run with a different configuration" in proc.stderr
    assert "estimator.n_components: 2 -> 3" in proc.stderr and "--overwrite" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1  # one line says what went wrong


def test_overwrite_replaces_a_different_configuration(main_, data, tmp_path):
    out = tmp_path / "o"
    assert main_("fit", data, "--out", out, "--gamma", 0.05, "--tol", 1e-2, *FAST).returncode == 0
    assert main_("fit", data, "--out", out, "--gamma", 0.05, "--tol", 1e-3, "--overwrite",
                 *FAST).returncode == 0
    report = json.loads((out / "report.json").read_text())
    assert report["tol"] == 1e-3


def test_second_run_on_a_locked_outdir_refuses(main_, data, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    # a live holder: a process holding the lock's flock (what a running fit does)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from ooc_spectral.io.checkpoint import RunDirectory\n"
        f"r = RunDirectory({str(out)!r}); r.acquire('holder'); print('held', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = main_("fit", data, "--out", out, *FAST)
        assert proc.returncode == 2
        assert f"is locked by another run (pid {holder.pid} on {os.uname().nodename}" in proc.stderr
    finally:
        holder.kill()
        holder.wait()
    # the holder is dead now: the kernel released its lock, and the file left is taken over
    assert (out / ".lock").exists()
    assert main_("fit", data, "--out", out, "--gamma", 0.05, *FAST).returncode == 0
    assert not (out / ".lock").exists()


def test_transform_command(main_, data, fitted, tmp_path):
    out, _ = fitted
    new = tmp_path / "new.zarr"
    assert main_("make-data", "swiss-roll", "--n", 1500, "--out", new, "--seed", 9,
                 "--chunk-rows", 500).returncode == 0
    proc = main_("transform", out / "model", new, "--out", tmp_path / "t", "--json", *FAST)
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc)["n_samples"] == 1500
    got = zarr.open_array(str(tmp_path / "t" / "embedding"), mode="r")
    X = zarr.open_group(str(new), mode="r")["data"][...]
    want = GreedySpectralEmbedding.load(out / "model").transform(X)
    np.testing.assert_allclose(got[...], want, atol=1e-12)
    assert got.chunks == (500, 2)
    # the OUTDIR itself is accepted as MODEL
    assert main_("transform", out, new, "--out", tmp_path / "t2", *FAST).returncode == 0


def test_transform_wrong_features(main_, fitted, tmp_path):
    out, _ = fitted
    assert main_("make-data", "spiral", "--n", 100, "--out", tmp_path / "s.zarr").returncode == 0
    proc = main_("transform", out, tmp_path / "s.zarr", "--out", tmp_path / "t", *FAST)
    assert proc.returncode == 2 and "has 2 features, but the model was fitted with 3" in proc.stderr


def test_plot_scatter_and_density(main_, fitted, tmp_path):
    out, _ = fitted
    import matplotlib.image as mpimg

    for mode in ("never", "always"):
        png = tmp_path / f"{mode}.png"
        proc = main_("plot", out, "--out", png, "--density", mode, "--json", "-q")
        assert proc.returncode == 0, proc.stderr
        info = last_json(proc)
        assert info["color_by"] == "t" and info["density"] == (mode == "always")
        img = mpimg.imread(png)
        assert img.shape[0] > 300 and img.shape[1] > 300
        assert img[..., :3].std() > 0.05  # not a blank picture
    proc = main_("plot", out, "--out", tmp_path / "x.png", "--dims", "0,5", "-q")
    assert proc.returncode == 2 and "the embedding has 2 coordinates" in proc.stderr


def test_inspect(main_, fitted):
    out, summary = fitted
    proc = main_("inspect", out)
    assert proc.returncode == 0, proc.stderr
    assert "status           complete" in proc.stdout
    assert "dictionary" in proc.stdout and "certificate" in proc.stdout
    proc = main_("inspect", out / "model")
    assert proc.returncode == 0, proc.stderr
    assert "ooc-spectral model" in proc.stdout and "eigenvalues" in proc.stdout


WORKFLOW = """
[workflow]
name = "small"

[[step]]
run = "make-data"
name = "swiss-roll"
n = 3000
out = "data.zarr"
chunk_rows = 1000

[[step]]
run = "fit"
id = "embed"
input = "data.zarr"
out = "fit"
gamma = 0.05
n_components = 2
workers = 1

[[step]]
run = "plot"
outdir = "fit"
out = "fig.png"
"""


def test_run_workflow_with_override(main_, tmp_path):
    wf = tmp_path / "wf" / "small.toml"
    wf.parent.mkdir()
    wf.write_text(WORKFLOW)
    proc = main_("run", wf, "--set", "embed.n_components=3", "--set", "make-data.n=2500",
                 "--json", "-q")
    assert proc.returncode == 0, proc.stderr
    summary = last_json(proc)
    assert [s["step"] for s in summary["steps"]] == ["make-data", "embed", "plot"]
    # paths resolve relative to the workflow file
    attrs = zarr.open_group(str(wf.parent / "fit"), mode="r").attrs["ooc_spectral_run"]
    assert attrs["config"]["estimator"]["n_components"] == 3
    assert attrs["workflow"]["resolved"]["n_components"] == 3
    assert attrs["workflow"]["resolved"]["input"] == str(wf.parent / "data.zarr")
    assert zarr.open_array(str(wf.parent / "fit" / "embedding")).shape == (2500, 3)
    assert (wf.parent / "fig.png").stat().st_size > 10_000


@pytest.mark.parametrize("text, words", [
    (WORKFLOW.replace("gamma = 0.05", "gama = 0.05"), "step 1 (embed): unknown key 'gama'"),
    (WORKFLOW.replace("n = 3000", "n = \"many\""), "step 0 (make-data): argument --n: invalid int value: 'many'"),
    (WORKFLOW.replace('run = "plot"', 'run = "paint"'), "step 2: key 'run' is 'paint'"),
    (WORKFLOW.replace('input = "data.zarr"\n', ""), "step 1 (embed): missing required key 'input'"),
    ("[[step]\n", "not valid TOML"),
    # a quoted "false" is a non-empty string: it was read as true (an outside audit)
    (WORKFLOW.replace("workers = 1", 'workers = 1\naffine = "false"'),
     "step 1 (embed): key 'affine' = 'false' must be true or false (a TOML boolean), found str; "
     "write affine = false without quotes"),
    (WORKFLOW.replace("workers = 1", 'workers = 1\noverwrite = "false"'),
     "step 1 (embed): key 'overwrite' = 'false' must be true or false"),
])
def test_workflow_errors_name_file_step_and_key(main_, tmp_path, text, words):
    wf = tmp_path / "bad.toml"
    wf.write_text(text)
    proc = main_("run", wf, "-q")
    assert proc.returncode == 2
    assert str(wf) in proc.stderr and words in proc.stderr
    assert not (tmp_path / "data.zarr").exists()  # validated before any step ran


def test_fit_on_external_dask_cluster(data, tmp_path):
    from conftest import dask_scheduler

    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    sched, address = dask_scheduler(tmp_path, env=env)
    procs = [sched]
    try:
        for _ in range(2):
            procs.append(subprocess.Popen(["dask", "worker", address, "--nthreads", "1",
                                           "--no-dashboard"], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
        from distributed import Client

        with Client(address, timeout="60s") as c:
            c.wait_for_workers(2, timeout=60)
        out = tmp_path / "o"
        proc = cli("fit", data, "--out", out, "--scheduler", address, "--gamma", 0.05,
                   "--json", "-q", check=0)
        report = json.loads((out / "report.json").read_text())
        assert report["workers"] == 2 and report["scheduler"] == address
        assert last_json(proc)["status"] == "complete"
        ref = GreedySpectralEmbedding(gamma=0.05, random_state=0).fit(
            zarr.open_group(str(data), mode="r")["data"][...])
        np.testing.assert_allclose(zarr.open_array(str(out / "embedding"))[...], ref.embedding_,
                                   atol=1e-10)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)


def test_performance_report_and_quiet(data, tmp_path):
    html = tmp_path / "perf.html"
    proc = cli("fit", data, "--out", tmp_path / "o", "--gamma", 0.05, "--performance-report", html,
               *FAST, check=0)
    assert proc.stderr == ""  # --quiet: nothing on stderr when all goes well
    text = html.read_text()
    assert "<html" in text.lower() and "chunk_moments" in text


def test_evaluate_lists_and_rejects_unknown(main_, tmp_path):
    proc = main_("evaluate", "--list")
    assert proc.returncode == 0, proc.stderr
    for name in ("ob2005-table1", "ob2005-figure4", "hm2011-halo-ball"):
        assert f"{name}:" in proc.stdout
    proc = main_("evaluate", "no-such-experiment", "--out", tmp_path / "e", "-q")
    assert proc.returncode == 2
    assert "unknown experiment 'no-such-experiment'; expected one of:" in proc.stderr
    proc = main_("evaluate", "ob2005-figure3", "--out", tmp_path / "e", "--param", "bogus=1",
                 "-q")
    assert proc.returncode == 2 and "has no parameter 'bogus'" in proc.stderr


# ---------------------------------------------------------------------- #
# issue 38: one prefix, and "did you mean" for a misspelt option
# ---------------------------------------------------------------------- #
@pytest.mark.parametrize("args, said", [
    (["fit", "x.zarr", "--out", "o", "--n-componets", "3"],
     "unrecognized arguments: --n-componets 3; did you mean --n-components?"),
    (["fitt", "x.zarr"], "invalid choice: 'fitt'"),
    (["fit", "x.zarr", "--out", "o", "--kernel", "rbff"], "did you mean 'rbf'?"),
    (["fit", "x.zarr", "--out", "o", "--gama", "1", "--n-componets", "3"],
     "did you mean --gamma (for --gama), --n-components (for --n-componets)?"),
])
def test_argument_errors_one_prefix_and_a_suggestion(main_, args, said):
    proc = main_(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ooc-spectral: error: ")
    assert lines[0].count("ooc-spectral:") == 1, lines[0]
    assert said in lines[0]
    if args[0] == "fitt":
        assert "did you mean 'fit'?" in lines[0]


def test_nothing_close_suggests_nothing(main_):
    proc = main_("fit", "x.zarr", "--out", "o", "--zzzzzz", "1")
    assert proc.returncode == 2 and "did you mean" not in proc.stderr


def test_advice_of_the_issue_is_computed(main_, data, tmp_path):
    # issue 38, item 5: the command line's two cases
    proc = main_("fit", data, "--out", tmp_path / "a", "--n-components", 500, "-q")
    assert proc.returncode == 2, proc.stderr
    # issue 53, item 4: one advice, naming the parameter set, and following it works
    assert "gamma=None picks" not in proc.stderr and "--dictionary-size" not in proc.stderr
    advised = re.search(r"lower n_components to at most (\d+)", proc.stderr)
    assert advised is not None, proc.stderr
    proc = main_("fit", data, "--out", tmp_path / "a2", "--n-components", advised.group(1), "-q")
    assert proc.returncode == 0, proc.stderr
    proc = main_("fit", data, "--out", tmp_path / "b", "--gamma", 1e6, "--max-dictionary-size",
                 300, "-q")
    assert proc.returncode == 2, proc.stderr
    assert "after scanning 0 of" not in proc.stderr and "gamma=5e+05" not in proc.stderr
    assert "after scanning at least 301 of 6000 rows" in proc.stderr
    assert "leave gamma to the heuristic" in proc.stderr


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_holds_for_the_loggers_distributed_configures_when_imported_later(quiet):
    """``-q`` leaves the one-line error alone on stderr: importing distributed after the
    logging is configured (the cluster is started lazily) resets its loggers' levels from
    its own configuration (``distributed.client`` at warning), so a stopped scheduler's
    traceback came through. Without ``-q``, the machinery's info lines stay out too."""
    code = (
        "import logging, sys\n"
        "from ooc_spectral.batch.cli import configure_logging\n"
        f"configure_logging(quiet={quiet})\n"
        "assert 'distributed' not in sys.modules\n"
        "import distributed\n"
        "logging.getLogger('distributed.client').error('CLIENT-ERROR')\n"
        "logging.getLogger('distributed.scheduler').info('SCHEDULER-INFO')\n"
        "logging.getLogger('distributed.client').warning('CLIENT-WARNING')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "SCHEDULER-INFO" not in proc.stderr
    if quiet:
        assert "CLIENT-ERROR" not in proc.stderr and "CLIENT-WARNING" not in proc.stderr
    else:
        assert "CLIENT-ERROR" in proc.stderr and "CLIENT-WARNING" in proc.stderr


@pytest.mark.parametrize("quiet", [True, False])
def test_the_users_own_distributed_logging_levels_yield_only_to_quiet(quiet):
    """A level the user configured for distributed (dask's ``logging`` configuration, here
    by environment) stands without ``-q``; ``-q``, asked for on the command line, wins."""
    code = (
        "import logging, sys\n"
        "from ooc_spectral.batch.cli import configure_logging\n"
        f"configure_logging(quiet={quiet})\n"
        "import distributed\n"
        "logging.getLogger('distributed.scheduler').info('SCHEDULER-INFO')\n"
    )
    env = dict(os.environ, DASK_LOGGING='{"distributed": "info"}')
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert ("SCHEDULER-INFO" in proc.stderr) is (not quiet), proc.stderr


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_commands_that_start_no_cluster_import_no_dask_to_set_up_logging(fitted, command):
    """The logging set-up reaches into dask's configuration only for commands that may
    start a cluster; reading an OUTDIR does not pay dask's import for it."""
    out, _ = fitted
    code = (
        "import sys\n"
        "from ooc_spectral.batch.cli import main\n"
        f"rc = main([{command!r}, {str(out)!r}, '-q'])\n"
        "print(rc, 'dask' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.split()[-2:] == ["0", "False"], (proc.stdout, proc.stderr)
