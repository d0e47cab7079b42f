"""The engine for the size, tasks for every thread, memory by budget, float32 output (issue 18).

- :func:`~ooc_spectral.runtime.cluster.choose_engine`: threads in this process for small
  inputs, the embedded LocalCluster for large ones, a scheduler address always wins;
- :func:`~ooc_spectral.core.planning.plan_tasks`: at least two tasks per thread when the
  input allows it (a task may read a row range of a storage chunk), a requested
  ``chunk_rows`` used as given;
- sub-blocks (:func:`~ooc_spectral.core.planning.plan_block_rows`): a task's kernel block
  within the budget whatever m; splitting changes nothing but rounding, and a
  storage-chunk layout change changes nothing;
- ``output_dtype="float32"``: the float64 values rounded once.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

from conftest import write_zarr
from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.core.pass2 import chunk_moments, combine
from ooc_spectral.runtime.cluster import ClusterOptions, choose_engine
from ooc_spectral.exceptions import InvalidParameterError
from ooc_spectral.core.planning import (BALANCE_TOLERANCE, DEFAULT_TASK_MEMORY, MIN_TASK_ROWS,
                                        balanced_tail, makespan_loss, plan_block_rows, plan_tasks,
                                        row_chunks, tasks_tag)
from ooc_spectral.pipeline.writeback import EmbeddingOutput, _embed_block

PARAMS = dict(n_components=3, gamma=0.05, tol=1e-3, random_state=0)


# --------------------------------------------------------------------------- engine
def test_auto_engine_is_threads_for_small_inputs_and_the_cluster_for_large_ones():
    auto = ClusterOptions()
    assert choose_engine(auto, 10**6)[0] == "threads"
    assert choose_engine(auto, 128 * 2**20)[0] == "threads"
    assert choose_engine(auto, 128 * 2**20 + 1)[0] == "cluster"
    assert choose_engine(auto, None)[0] == "cluster"
    # what only worker processes can give takes the cluster at any size
    assert choose_engine(ClusterOptions(memory_limit="2GiB"), 10)[0] == "cluster"
    assert choose_engine(auto, 10, needs_cluster=True)[0] == "cluster"
    # explicit choices and an address
    assert choose_engine(ClusterOptions(engine="cluster"), 10)[0] == "cluster"
    assert choose_engine(ClusterOptions(engine="threads"), 2**40)[0] == "threads"
    kind, why = choose_engine(ClusterOptions(scheduler="tcp://127.0.0.1:1"), 10)
    assert kind == "cluster" and "tcp://127.0.0.1:1" in why
    with pytest.raises(InvalidParameterError, match="drop one of them"):
        choose_engine(ClusterOptions(scheduler="tcp://127.0.0.1:1", engine="threads"), 10)


def test_threshold_is_dask_config(monkeypatch):
    import dask

    with dask.config.set({"ooc-spectral.threads-max-bytes": "1MiB"}):
        assert choose_engine(ClusterOptions(), 2**20)[0] == "threads"
        assert choose_engine(ClusterOptions(), 2**20 + 1)[0] == "cluster"


def _worker_view():
    import os
    import sys

    from ooc_spectral._accel.threads import blas_thread_counts

    return os.getppid(), "ooc_spectral.pipeline.fit" in sys.modules, sorted(blas_thread_counts())


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_embedded_workers_start_by_the_configured_method_with_one_blas_thread(method):
    """Forked from one preloaded server (the default) or spawned: either way each worker
    pins BLAS to one thread, and a forked one has the pass modules before its first task."""
    import os

    import dask

    from ooc_spectral.runtime.cluster import dask_client

    with dask.config.set({"ooc-spectral.worker-start-method": method}), \
            dask_client(ClusterOptions(workers=2, quiet=True)) as client:
        views = list(client.run(_worker_view).values())
    assert len(views) == 2
    for parent, preloaded, blas in views:
        assert blas == [1], blas
        if method == "forkserver":
            # the parent of a worker is the fork server, not this process's nanny
            assert parent != os.getpid() and preloaded
    if method == "forkserver":
        assert views[0][0] == views[1][0]  # one server for both


def test_embedded_workers_keep_glibc_allocator_thresholds_unless_configured():
    """distributed's MALLOC_TRIM_THRESHOLD_=65536 made every sub-block array a fresh mmap
    (measured: 3.4 s more system time per worker on a 10^7-row fit); the embedded
    workers leave it unset, keep distributed's other variables, and take a configured one."""
    import dask

    from ooc_spectral.runtime.cluster import worker_pre_spawn_environ

    env = worker_pre_spawn_environ()
    assert "MALLOC_TRIM_THRESHOLD_" not in env
    assert str(env["OPENBLAS_NUM_THREADS"]) == "1" and str(env["OMP_NUM_THREADS"]) == "1"
    for value, expected in ((65536, 65536), ("64 KiB", 65536), ("0", 0)):
        with dask.config.set({"ooc-spectral.worker-malloc-trim-threshold": value}):
            assert worker_pre_spawn_environ()["MALLOC_TRIM_THRESHOLD_"] == expected


def _worker_env(name):
    import os

    return os.environ.get(name)


def test_a_variable_set_after_the_fork_server_started_reaches_later_workers(monkeypatch):
    """Forked workers inherit the fork server's environment, frozen at the process's first
    cluster; a credential or endpoint set after it must still reach a later cluster's
    workers, as it would reach spawned ones."""
    from ooc_spectral.runtime.cluster import dask_client

    with dask_client(ClusterOptions(workers=1, quiet=True)):
        pass  # the server runs from here on
    monkeypatch.setenv("OOC_SPECTRAL_TEST_LATE_VARIABLE", "set-late")
    with dask_client(ClusterOptions(workers=1, quiet=True)) as client:
        seen = list(client.run(_worker_env, "OOC_SPECTRAL_TEST_LATE_VARIABLE").values())
    assert seen == ["set-late"]


def _worker_diagnostics():
    import dask

    return (dask.config.get("distributed.worker.profile.enabled"),
            str(dask.config.get("distributed.admin.tick.interval")),
            str(dask.config.get("distributed.admin.system-monitor.interval")))


def _http_status(url: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.parametrize("diagnostics", [None, True])
def test_the_embedded_workers_run_without_the_dashboards_diagnostics_unless_asked(diagnostics):
    """The workers' profiler, the event loops' 20 ms tick and the system monitor take a few
    percent of the cores from the passes (``cluster.EMBEDDED_DIAGNOSTICS_OFF``): the
    embedded cluster's workers run without them, and with them when the config says so;
    the client process's config is as it was afterwards. The dashboard (bokeh's server,
    1 to 1.6 s of CPU a run to start) is served only with the diagnostics."""
    import dask

    from ooc_spectral.runtime.cluster import dask_client

    before = _worker_diagnostics()
    setting = {} if diagnostics is None else {"ooc-spectral.cluster-diagnostics": diagnostics}
    with dask.config.set(setting), dask_client(ClusterOptions(workers=1, quiet=True)) as client:
        seen = list(client.run(_worker_diagnostics).values())
        scheduler_tick = client.run_on_scheduler(
            lambda: str(__import__("dask").config.get("distributed.admin.tick.interval")))
        http = client.cluster.scheduler.http_server.port
        status = _http_status(f"http://127.0.0.1:{http}/status")
    assert http not in (0, 8787)  # a free port, not one two runs would contend for
    if diagnostics:
        assert seen == [before] and status == 200
    else:
        assert seen == [(False, "500ms", "2s")] and scheduler_tick == "500ms"
        assert status == 404
    assert _worker_diagnostics() == before


def test_worker_start_method_fork_is_refused():
    import dask

    from ooc_spectral.runtime.cluster import dask_client

    with dask.config.set({"ooc-spectral.worker-start-method": "fork"}), \
            pytest.raises(InvalidParameterError, match="'forkserver' or 'spawn'"):
        with dask_client(ClusterOptions(workers=1, quiet=True)):
            pass


# --------------------------------------------------------------------------- tasks
@pytest.mark.parametrize("n, storage, threads", [
    (200_000, 700_000, 2), (10**5, 10**5, 2), (10**6, 262_144, 2), (10**6, 262_144, 8),
    (3 * 262_144, 262_144, 2), (50_000, 1000, 4)])
def test_every_thread_gets_two_tasks_when_the_input_allows(n, storage, threads):
    plan = plan_tasks(n, 8, storage, threads=threads, itemsize=4)
    assert plan.n_tasks == -(-n // plan.rows)
    assert plan.n_tasks >= 2 * threads or plan.rows <= MIN_TASK_ROWS
    # interior task boundaries fall on output chunk boundaries, which are whole storage
    # chunks or row ranges inside one
    assert plan.rows % plan.output_chunk_rows == 0
    assert plan.output_chunk_rows == storage or plan.output_chunk_rows == plan.rows
    if plan.rows >= storage:
        assert plan.rows % storage == 0


def _greedy_makespan(sizes, threads):
    """Each task, in the given order, to the thread that is free first."""
    free = [0] * threads
    for r in sizes:
        free[free.index(min(free))] += r
    return max(free)


@pytest.mark.parametrize("n, storage, threads", [
    (2_000_000, 262_144, 2), (5 * 262_144, 262_144, 2), (5 * 262_144 + 7, 262_144, 2),
    (10**8, 262_144, 2), (10**7, 262_144, 2), (40 * 65_536 + 1000, 65_536, 32),
    (3 * 262_144 + 200_000, 262_144, 4), (200_000, 700_000, 2), (50_000, 1000, 4)])
def test_the_reduction_passes_end_with_every_thread_busy(n, storage, threads):
    """Pass 2's tasks: the plan's equal tasks (whole storage chunks), the last ones
    re-split when a thread would otherwise finish more than BALANCE_TOLERANCE after
    the ideal. The re-split tasks start once the whole ones are done (``accumulate``'s
    ``tail``), whichever order the threads take the whole ones in."""
    plan = plan_tasks(n, 8, storage, threads=threads, itemsize=4)
    sizes = plan.reduce_chunks(n)
    assert sum(sizes) == n and max(sizes) <= plan.rows and min(sizes) > 0
    ideal = n / threads
    before = _greedy_makespan([plan.rows] * (n // plan.rows) + [n % plan.rows] * (n % plan.rows > 0),
                              threads)
    assert before / ideal - 1 == pytest.approx(makespan_loss(n, plan.rows, threads))
    if plan.tail:
        assert before / ideal - 1 > BALANCE_TOLERANCE
        head = sizes[:len(sizes) - len(plan.tail)]
        # the first tasks are unchanged, whole storage chunks, as many for every thread
        assert set(head) == {plan.rows} and len(head) % threads == 0
        assert plan.rows % storage == 0 or plan.rows < storage
        assert len(plan.tail) == threads and max(plan.tail) - min(plan.tail) <= 1
        assert min(plan.tail) >= min(MIN_TASK_ROWS, plan.rows)
        # the whole tasks first (equal: any order), then one re-split task per thread
        assert len(head) // threads * plan.rows + max(plan.tail) <= ideal + 1
        # left to itself a scheduler may give both re-split tasks to one thread
        if head and threads == 2:
            mixed = (plan.tail[0], head[0], plan.tail[1]) + head[1:]
            assert _greedy_makespan(mixed, threads) > ideal * (1 + BALANCE_TOLERANCE)
    else:
        assert sizes == (plan.rows,) * (n // plan.rows) + ((n % plan.rows,) if n % plan.rows else ())
        # balanced already, or the re-split tasks would be too short to pay for themselves
        assert before / ideal - 1 <= BALANCE_TOLERANCE or (
            (n - threads * ((n // plan.rows) // threads) * plan.rows) // threads < MIN_TASK_ROWS)


def test_balanced_tail_and_its_checkpoint_tag():
    # 2 * 10^6 rows in 262,144-row chunks on two threads: 7.63 chunks, one thread did 4
    assert makespan_loss(2_000_000, 262_144, 2) == pytest.approx(4 * 262_144 / 10**6 - 1)
    assert balanced_tail(2_000_000, 262_144, 2) == (213_568, 213_568)
    assert balanced_tail(8 * 262_144, 262_144, 2) == ()  # four whole chunks each
    assert balanced_tail(5 * 262_144, 262_144, 1) == ()  # one thread is never unbalanced
    # a requested task size is used as given
    assert plan_tasks(2_000_000, 16, 262_144, threads=2, requested=262_144).tail == ()
    # partials of one task layout are never taken for another's
    plan = plan_tasks(2_000_000, 16, 262_144, threads=2, itemsize=4)
    regular = (262_144,) * 7 + (2_000_000 - 7 * 262_144,)
    assert tasks_tag(regular) == "r262144"
    assert tasks_tag(plan.reduce_chunks(2_000_000)).startswith("r262144-")
    assert tasks_tag(plan.reduce_chunks(2_000_000)) != tasks_tag(
        plan_tasks(2_000_000, 16, 262_144, threads=4, itemsize=4).reduce_chunks(2_000_000))


def test_accumulate_runs_the_re_split_tasks_after_the_whole_ones(fitted):
    """The re-split tail is its own last segment, computed by a second run of the
    executor once the whole tasks' segments are done; the moments equal those of
    equal tasks."""
    import dask.array as da

    from ooc_spectral.pipeline.accumulate import accumulate
    from ooc_spectral.runtime.execution import Executor

    class Recording(Executor):
        def run(self, label, parts, on_result=None, *, keep=True):
            calls.append((label, sorted(parts)))
            return super().run(label, parts, on_result, keep=keep)

    X, est = fitted
    d = est.spectral_map_.dictionary
    n = len(X)
    rows = n // 5  # five equal tasks on two threads: four whole ones, the fifth in two
    sizes = (rows,) * 4 + (rows - rows // 2, rows // 2) + ((n - 5 * rows,) if n % 5 else ())
    sizes = sizes[:4] + (sum(sizes[4:]) - sum(sizes[4:]) // 2, sum(sizes[4:]) // 2)
    calls = []
    got = accumulate(da.from_array(X, chunks=(sizes, X.shape[1])), d, "moments",
                     executor=Recording(local=True, threads=2), max_segments=3, tail=2)
    assert len(calls) == 2 and calls[1][0].endswith("last 2 tasks")
    assert calls[1][1] == [max(calls[0][1]) + 1]  # one segment: the tail
    calls.clear()
    ref = accumulate(da.from_array(X, chunks=(rows, X.shape[1])), d, "moments",
                     executor=Recording(local=True, threads=2), max_segments=3)
    assert len(calls) == 1
    assert got.n == ref.n == n
    np.testing.assert_allclose(got.mean, ref.mean, rtol=0, atol=1e-13)
    np.testing.assert_allclose(got.m2, ref.m2, rtol=0, atol=1e-11 * np.abs(ref.m2).max())


class _PartialsInMemory:
    """A :class:`~ooc_spectral.pipeline.accumulate.PartialStore` in a dict, ``parts``."""

    def __init__(self):
        self.parts = {}

    def load_partial(self, stage, segment):
        return self.parts.get((stage, segment))

    def save_partial(self, stage, segment, partial):
        self.parts[(stage, segment)] = partial


def _counting_executor(ran: list):
    """A local two-thread executor that appends the segments each pass computes to ``ran``."""
    from ooc_spectral.runtime.execution import Executor

    class Counting(Executor):
        def run(self, label, parts, on_result=None, *, keep=True):
            ran.extend(parts)
            return super().run(label, parts, on_result, keep=keep)

    return Counting(local=True, threads=2)


def test_partials_of_other_libraries_are_recomputed_not_mixed(fitted, monkeypatch):
    """A pass resumed under other libraries (MKL or OpenBLAS, numba's loops or NumPy's: the
    same values to rounding, not bit for bit) computes every segment afresh; under the
    same ones it takes them all. The libraries' name is that of a task's block: the
    accelerators serve only blocks of at least ACCEL_MIN_ENTRIES entries."""
    import dask
    import dask.array as da

    from ooc_spectral._accel import blas as _blas
    from ooc_spectral._accel.fused import loops_backend
    from ooc_spectral._accel.support import ACCEL_MIN_ENTRIES
    from ooc_spectral.pipeline import accumulate as acc

    partials, ran = _PartialsInMemory(), []
    store = partials.parts
    X, est = fitted
    d = est.spectral_map_.dictionary

    def run():
        ran.clear()
        return acc.accumulate(da.from_array(X, chunks=(len(X) // 4, X.shape[1])), d, "moments",
                              executor=_counting_executor(ran), store=partials, max_segments=2)

    first = run()
    assert len(ran) == 2 and len(store) == 2
    run()
    assert ran == []  # the same libraries: every segment taken
    monkeypatch.setattr(acc, "libraries_tag", lambda entries: "l-other")
    other = run()
    assert len(ran) == 2 and len(store) == 4  # another name: computed afresh, not mixed
    np.testing.assert_allclose(other.m2, first.m2, rtol=0, atol=1e-11 * np.abs(first.m2).max())
    # the name follows the libraries a task's block would use, and only those
    assert ACCEL_MIN_ENTRIES == 8_388_608  # 2^23, pinned: the edges below are literals
    small, large = 8_388_607, 8_388_608
    for key, on, off in (("ooc-spectral.numba", True, False), ("ooc-spectral.mkl", True, False)):
        with dask.config.set({key: on}):
            tags_on = (_blas.libraries_tag(small), _blas.libraries_tag(large))
        with dask.config.set({key: off}):
            tags_off = (_blas.libraries_tag(small), _blas.libraries_tag(large))
        assert tags_on[0] == tags_off[0]  # a small block uses neither
        with dask.config.set({key: on}):
            in_use = (loops_backend() if key.endswith("numba") else _blas.mkl()) is not None
        assert (tags_on[1] != tags_off[1]) is in_use, key
    # a task's entries: its rows x the dictionary's points; the preimage pass's problem
    # counts the spectral map's dictionary, as its tasks' gate does
    from types import SimpleNamespace

    from ooc_spectral.core.pass2 import block_entries

    assert block_entries(10_486, SimpleNamespace(size=800)) == 8_388_800
    problem = SimpleNamespace(spectral_map=SimpleNamespace(dictionary=SimpleNamespace(size=800)))
    assert block_entries(10_485, problem) == 8_388_000


def test_partials_of_a_re_split_tail_resume_only_the_same_tasks(fitted):
    """Resume: a pass whose segments were all saved recomputes nothing with the same
    tasks (tail included) and gives the same moments; with other tasks its stage name
    (tasks_tag) differs and every segment is computed afresh."""
    import dask.array as da

    from ooc_spectral.pipeline.accumulate import accumulate
    X, est = fitted
    d = est.spectral_map_.dictionary
    rows = len(X) // 5
    rest = len(X) - 4 * rows
    tailed = (rows,) * 4 + (rest - rest // 2, rest // 2)
    store, ran = _PartialsInMemory(), []

    def run(sizes, tail):
        return accumulate(da.from_array(X, chunks=(sizes, X.shape[1])), d, "moments",
                          executor=_counting_executor(ran), store=store, max_segments=3,
                          stage=f"moments-{tasks_tag(sizes)}", tail=tail)

    first = run(tailed, 2)
    assert len(ran) == len(store.parts) == 3  # two segments of whole tasks and the tail
    ran.clear()
    again = run(tailed, 2)
    assert ran == []
    np.testing.assert_array_equal(again.m2, first.m2)
    np.testing.assert_array_equal(again.mean, first.mean)
    other = run(tuple(row_chunks(len(X), rows)), 0)
    assert len(ran) == 3 and len(store.parts) == 6
    np.testing.assert_allclose(other.m2, first.m2, rtol=0, atol=1e-11 * np.abs(first.m2).max())


@pytest.mark.parametrize("normalization", ["additive", "divisive"])
def test_a_fit_with_a_balanced_tail_equals_one_without(tmp_path, restore_logging, normalization):
    """Five 8,192-row chunks on two threads: pass 2 re-splits the fifth chunk in two
    (six tasks), pass 3 writes the five whole chunks; the embedding equals that of the
    plain five tasks (``--chunk-rows 8192``) to rounding. Kernel PCA, and spectral
    embedding (its two reductions, the kernel sums and the degrees)."""
    from ooc_spectral.batch.cli import main

    rng = np.random.default_rng(5)
    X = rng.standard_normal((5 * 8192, 3))
    write_zarr(tmp_path / "x.zarr", X, 8192)
    # gamma 0.1: a dictionary of 236 rows (at 0.3, 652: four times the cost per fit)
    common = ["--gamma", "0.1", "--tol", "1e-4", "--n-components", "3", "-q", "--engine",
              "threads", "--normalization", normalization]
    assert main(["fit", str(tmp_path / "x.zarr"), "--out", str(tmp_path / "a"), *common]) == 0
    assert main(["fit", str(tmp_path / "x.zarr"), "--out", str(tmp_path / "b"), *common,
                 "--chunk-rows", "8192"]) == 0
    a, b = (json.loads((tmp_path / k / "report.json").read_text()) for k in "ab")
    plan = plan_tasks(len(X), 3, 8192, threads=a["threads"], itemsize=8)
    assert a["tasks"] == b["tasks"] == b["pass2_tasks"] == 5
    assert a["pass2_tasks"] == len(plan.reduce_chunks(len(X)))
    if a["threads"] == 2:
        assert a["pass2_tasks"] == 6
    ea, eb = (zarr.open_array(str(tmp_path / k / "embedding"), mode="r") for k in "ab")
    assert ea.chunks[0] == eb.chunks[0] == 8192
    assert a["dictionary_size"] == b["dictionary_size"]
    np.testing.assert_allclose(a["eigenvalues"], b["eigenvalues"], rtol=1e-11)
    np.testing.assert_allclose(ea[...], eb[...], rtol=0, atol=1e-9 * np.abs(eb[...]).max())


def test_many_storage_chunks_give_whole_chunk_tasks():
    plan = plan_tasks(10**8, 32, 65_536, threads=2, itemsize=4)
    assert plan.rows % 65_536 == 0 and plan.output_chunk_rows == 65_536 and plan.note is None


def test_requested_chunk_rows_is_honoured_or_the_reason_given():
    plan = plan_tasks(10**6, 8, 262_144, threads=2, requested=65_536, itemsize=4)
    assert plan.rows == 65_536 and plan.output_chunk_rows == 65_536 and plan.note is None
    plan = plan_tasks(10**6, 8, 262_144, threads=2, requested=300_000, itemsize=4)
    assert plan.rows == 300_000 and plan.note is None
    plan = plan_tasks(1000, 8, 1000, threads=2, requested=5000, itemsize=4)
    assert plan.rows == 1000 and "more than the 1000 rows" in plan.note
    plan = plan_tasks(10**8, 1000, 10**6, threads=2, requested=10**6, itemsize=4)
    assert plan.rows == 10**6 and "kept as asked" in plan.note


@pytest.mark.parametrize("m", [300, 1058, 3000])
def test_sub_blocks_keep_a_task_within_its_budget_whatever_m(m):
    rows, d = 262_144, 8
    block = plan_block_rows(rows, d, m, itemsize=4)
    # the task's input, three m x m matrices and three c x m blocks of one sub-block
    need = rows * d * 4 + block * d * 8 + 3 * 8 * m * m + 3 * 8 * m * block
    assert need <= DEFAULT_TASK_MEMORY
    assert block >= 256
    # past the budget only the m x m matrices, the input and one smallest sub-block remain
    m = 4000
    block = plan_block_rows(rows, d, m, itemsize=4)
    assert block == 256


# --------------------------------------------------------------------------- sub-blocks
@pytest.fixture(scope="module")
def fitted(swiss_roll):
    X = swiss_roll[0]
    return X, GreedySpectralEmbedding(**PARAMS).fit(X)


def test_sub_blocks_give_the_moments_and_embedding_of_the_whole_block(fitted):
    X, est = fitted
    d = est.spectral_map_.dictionary
    whole = chunk_moments(X, d, 0)
    for rows in (256, 999):
        split = chunk_moments(X, d, 0, block_rows=rows)
        assert split.n == whole.n and split.certificate.argmax == whole.certificate.argmax
        np.testing.assert_allclose(split.mean, whole.mean, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(split.m2, whole.m2, rtol=1e-12, atol=1e-12)
        assert split.certificate.max_delta == whole.certificate.max_delta
        np.testing.assert_allclose(_embed_block(X, est.spectral_map_, block_rows=rows),
                                   _embed_block(X, est.spectral_map_), rtol=0, atol=1e-13)
    # the partial of a split block is its sub-blocks' partials combined in row order: the
    # same sums, with the pairwise updates added once at the end (to rounding)
    parts = combine(combine(chunk_moments(X[:1000], d, 0), chunk_moments(X[1000:2000], d, 1000)),
                    chunk_moments(X[2000:], d, 2000))
    folded = chunk_moments(X, d, 0, block_rows=1000)
    assert folded.n == parts.n and folded.certificate == parts.certificate
    assert folded.sums == parts.sums
    np.testing.assert_array_equal(folded.mean, parts.mean)
    np.testing.assert_allclose(folded.m2, parts.m2, rtol=0, atol=1e-14 * np.abs(parts.m2).max())
    np.testing.assert_array_equal(folded.m2, folded.m2.T)
    assert folded.sq == pytest.approx(parts.sq, rel=1e-14)


def test_in_memory_row_blocks_give_the_dask_views_tasks_and_values(fitted):
    """Numpy rows reach the passes as :class:`RowBlocks` (no dask array): the same task
    layout as ``to_dask``'s, the same pass-2 statistic and the same embedding, bit for
    bit; a sparse matrix is densified task by task, to the dense rows' values."""
    import dask.array as da
    import scipy.sparse

    from ooc_spectral.io.row_blocks import RowBlocks
    from ooc_spectral.io.source import open_source
    from ooc_spectral.pipeline.accumulate import accumulate
    from ooc_spectral.pipeline.writeback import map_rows
    from ooc_spectral.runtime.execution import Executor

    X, est = fitted
    smap = est.spectral_map_
    source = open_source(X)
    sizes = (700, 700, 700, len(X) - 2100)
    view, ref = source.task_view(sizes), source.to_dask(sizes)
    assert isinstance(view, RowBlocks) and isinstance(ref, da.Array)
    assert view.chunks == ref.chunks and view.shape == ref.shape
    assert source.task_view(1000).chunks == source.to_dask(1000).chunks
    blocks = view.to_delayed().ravel()
    assert [b.compute().shape[0] for b in blocks] == list(sizes)
    ex = Executor(local=True, threads=2)
    got = accumulate(view, smap.dictionary, "moments", executor=ex, max_segments=2)
    want = accumulate(ref, smap.dictionary, "moments", executor=ex, max_segments=2)
    assert got.n == want.n == len(X) and got.certificate == want.certificate
    np.testing.assert_array_equal(got.mean, want.mean)
    np.testing.assert_array_equal(got.m2, want.m2)
    E = map_rows(view, smap, chunk_starts=source.chunk_starts, block_rows=300)
    assert isinstance(E, np.ndarray) and E.shape == (len(X), smap.n_components)
    np.testing.assert_array_equal(
        E, map_rows(ref, smap, chunk_starts=source.chunk_starts, block_rows=300).compute())
    np.testing.assert_allclose(E, est.embedding_, rtol=0, atol=1e-13)  # other sub-blocks
    np.testing.assert_array_equal(
        map_rows(view, smap, block_rows=300, dtype="float32"), E.astype(np.float32))
    sparse = open_source(scipy.sparse.csr_matrix(X))
    np.testing.assert_array_equal(map_rows(sparse.task_view(sizes), smap, block_rows=300), E)


def test_a_storage_chunk_layout_change_changes_nothing(tmp_path, swiss_roll):
    """One storage chunk, 300-row chunks, tasks of 777 rows (row ranges across chunks),
    tasks split inside a chunk: the same dictionary and embedding."""
    X = swiss_roll[0]
    results = []
    for chunks, kw in [(len(X), {}), (300, {}), (300, dict(chunk_rows=777)),
                       (len(X), dict(chunk_rows=400))]:
        path = tmp_path / f"x{chunks}-{kw.get('chunk_rows')}.zarr"
        write_zarr(path, X, chunks)
        est = GreedySpectralEmbedding(**PARAMS, **kw).fit(str(path), output=str(path) + ".out")
        results.append((est.dictionary_indices_, est.embedding_.compute()))
    for idx, emb in results[1:]:
        np.testing.assert_array_equal(idx, results[0][0])
        np.testing.assert_allclose(emb, results[0][1], rtol=0, atol=1e-10)


def test_a_resumed_output_keeps_its_chunks(tmp_path):
    out = EmbeddingOutput(str(tmp_path / "o"), 1000, 2, 250).prepare()
    again = EmbeddingOutput(str(tmp_path / "o"), 1000, 2, 1000).prepare(resume=True)
    assert again.chunk_rows == 250 and again.task_rows(600) == 500 and again.task_rows(100) == 250


# --------------------------------------------------------------------------- float32
def test_float32_output_is_the_float64_embedding_rounded(tmp_path, fitted):
    X, est64 = fitted
    est32 = GreedySpectralEmbedding(**PARAMS, output_dtype="float32").fit(X)
    assert est32.embedding_.dtype == np.float32 and est64.embedding_.dtype == np.float64
    np.testing.assert_array_equal(est32.embedding_, est64.embedding_.astype(np.float32))
    np.testing.assert_array_equal(est32.eigenvalues_, est64.eigenvalues_)
    t = est32.transform(X[:500])
    assert t.dtype == np.float32
    np.testing.assert_array_equal(t, est64.transform(X[:500]).astype(np.float32))
    # written to zarr, and kept by save/load
    write_zarr(tmp_path / "x.zarr", X, 500)
    est = GreedySpectralEmbedding(**PARAMS, output_dtype="float32").fit(
        str(tmp_path / "x.zarr"), output=str(tmp_path / "out"))
    arr = zarr.open_array(str(tmp_path / "out" / "embedding"), mode="r")
    assert arr.dtype == np.float32
    np.testing.assert_array_equal(arr[...], est64.embedding_.astype(np.float32))
    est.save(tmp_path / "model")
    assert GreedySpectralEmbedding.load(tmp_path / "model").output_dtype == "float32"
    with pytest.raises(InvalidParameterError, match="output_dtype"):
        GreedySpectralEmbedding(output_dtype="float16").fit(X)


def test_cli_float32_auto_engine_and_tasks_in_the_report(tmp_path, swiss_roll, restore_logging):
    """``fit --output-dtype float32`` (in process: the command line's parsing and job),
    on the auto engine (threads here), then ``transform`` with that model."""
    from ooc_spectral.batch.cli import main

    X = swiss_roll[0]
    write_zarr(tmp_path / "x.zarr", X, len(X))  # one storage chunk: tasks split it
    common = ["--gamma", "0.05", "--tol", "1e-3", "--n-components", "3", "-q"]
    assert main(["fit", str(tmp_path / "x.zarr"), "--out", str(tmp_path / "f32"),
                 "--output-dtype", "float32", *common]) == 0
    report = json.loads((tmp_path / "f32" / "report.json").read_text())
    assert report["output_dtype"] == "float32" and report["engine"] == "threads"
    assert report["tasks"] >= 2 * report["threads"] or report["task_rows"] <= MIN_TASK_ROWS
    e32 = zarr.open_array(str(tmp_path / "f32" / "embedding"), mode="r")[...]
    ref = GreedySpectralEmbedding(**PARAMS).fit(str(tmp_path / "x.zarr"))  # same tasks
    e64 = ref.embedding_.compute()
    assert e32.dtype == np.float32 and e64.dtype == np.float64
    np.testing.assert_array_equal(e32, e64.astype(np.float32))
    assert main(["transform", str(tmp_path / "f32"), str(tmp_path / "x.zarr"), "--out",
                 str(tmp_path / "t"), "-q"]) == 0
    t = zarr.open_array(str(tmp_path / "t" / "embedding"), mode="r")[...]
    assert t.dtype == np.float32
    np.testing.assert_allclose(t, e64, rtol=0, atol=4 * np.finfo(np.float32).eps * np.abs(e64).max())
