"""Running graphs: dask's threaded scheduler or a ``dask.distributed`` cluster.

The parallel passes are built as graphs of independent *parts* (a segment of
pass 2, a block of pass 3). :class:`Executor` computes them with whatever
scheduler is active and hands each finished part to a callback as soon as it
is done, so a checkpoint can record it and a progress line can count it:

- under a distributed ``Client`` (the default client, or one given): all parts
  are submitted at once and collected with ``as_completed``; lost workers'
  tasks are recomputed by the scheduler;
- otherwise: all parts are computed in one ``dask.compute`` with the threaded
  scheduler (``threads`` threads in this process), or whatever ``dask.config``
  says; each part is handed over as soon as its last task finishes (a dask
  callback, in this thread), so there is no barrier between batches.

:attr:`Executor.threads` (the task slots: every worker's threads, or the
threads of this process) and :attr:`Executor.task_memory` (the budget of one
task) are what :func:`~ooc_spectral.core.planning.plan_tasks` plans with.

Objects every task needs (the dictionary, the spectral map) are put in the
graph once with :func:`shared`, as a single key, not copied into each task.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping

import dask
import dask.base

from .._accel.threads import one_thread
from ..exceptions import WorkerMemoryError, WorkersLostError, raise_if_interrupted
from .memory import (WORKER_BASELINE, cache_block_bytes, format_bytes, smallest_memory_limit,
                     task_memory_budget)

__all__ = ["Executor", "PartProgress", "shared", "active_client", "compute", "task_blas_threads",
           "task_threads"]


@contextmanager
def task_blas_threads():
    """One BLAS thread per task while dask's threaded scheduler runs tasks side by side.

    The threaded scheduler runs one task per core; letting each task's BLAS
    start one thread per core as well oversubscribes the machine (and makes
    OpenBLAS spin). Distributed workers already pin BLAS to one thread; the
    synchronous scheduler keeps every BLAS thread. No scheduler configured and no
    client (``get_scheduler()`` is None, the Python API's default) means dask's
    threaded scheduler too, where unpinned BLAS made pass 2 more than twice as slow
    (docs/measurements.md, "One BLAS thread per task").
    """
    import dask.threaded

    if _scheduler() in (None, dask.threaded.get) and (os.cpu_count() or 1) > 1:
        with one_thread():
            yield
    else:
        yield


def _scheduler():
    """``dask.base.get_scheduler()``, without importing ``distributed`` to learn that there
    is no client: None where nothing is configured and ``distributed`` is not loaded
    (dask's own default, the threaded scheduler for arrays and delayed)."""
    import sys

    if "distributed" not in sys.modules and dask.config.get("scheduler", None) is None:
        return None
    return dask.base.get_scheduler()


def _default_scheduler() -> dict:
    """``dask.compute``'s keyword naming the threaded scheduler where :func:`_scheduler`
    found none: dask would otherwise import ``distributed`` to look for a client, most of a
    small fit's start-up (docs/measurements.md, "Start-up and resident costs"). Empty where a scheduler or client is set."""
    import dask.threaded

    # the function, not its name: dask looks for a client to resolve a name
    return {"scheduler": dask.threaded.get} if _scheduler() is None else {}


def compute(*collections):
    """``dask.compute`` with :func:`task_blas_threads`."""
    with task_blas_threads():
        return dask.compute(*collections, **_default_scheduler())


def task_threads(client=None) -> int:
    """Task slots of the scheduler: the client's workers' threads, else this process's."""
    if client is None:
        client = active_client()
    if client is not None:
        try:
            workers = client.scheduler_info().get("workers", {}).values()
            total = sum(int(w.get("nthreads", 1)) for w in workers)
        except Exception:
            total = 0
        if total:
            return total
    return int(dask.config.get("num_workers", None) or os.cpu_count() or 1)


def shared(obj: Any):
    """``obj`` as one key of the graph (a ``dask.delayed`` literal)."""
    return dask.delayed(obj, pure=True)


def active_client():
    """The default ``distributed.Client``, or None when there is none.

    A process that has not imported ``distributed`` has no client: it is not imported
    to find that out (most of a small fit's fixed cost; docs/measurements.md, "Start-up and resident costs")."""
    import sys

    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import default_client
    except ImportError:  # pragma: no cover - distributed is a dependency
        return None
    try:
        client = default_client()
    except ValueError:
        return None
    return client if client.status == "running" else None


@dataclass
class PartProgress:
    """Progress of a parallel pass, as reported to the callback."""

    label: str
    done: int
    total: int
    elapsed: float


class Executor:
    """Compute named parts of a graph, reporting each as it finishes.

    Parameters
    ----------
    client : distributed.Client, optional
        Defaults to the active default client, if any (unless ``local``).
    on_progress : callable, optional
        Called with a :class:`PartProgress` after each part.
    local : bool
        Run in this process with dask's threaded scheduler even if a default
        client exists (the embedded engine's choice for small inputs).
    threads : int, optional
        Threads of the local engine (default: dask's ``num_workers``, else the cores).
    task_memory : int, optional
        Memory budget of one task (default: from the workers' memory limit,
        :func:`task_memory_budget`).

    Notes
    -----
    Under a distributed client a pass always ends: when no worker is connected
    for ``ooc-spectral.no-workers-timeout`` (dask config, default 60 s; env
    ``DASK_OOC_SPECTRAL__NO_WORKERS_TIMEOUT``) it raises :class:`WorkersLostError`,
    and a task that killed every worker that ran it (dask's ``KilledWorker``)
    raises :class:`WorkerMemoryError` when the workers' memory limit is below
    what a task needs, :class:`WorkersLostError` otherwise. Each question to the
    scheduler waits at most :data:`SCHEDULER_ANSWER_SECONDS`: a scheduler that does not
    answer for ``no-workers-timeout`` (stopped, frozen) raises :class:`StalledRunError`.
    """

    def __init__(self, client=None, on_progress: Callable[[PartProgress], None] | None = None,
                 *, local: bool = False, threads: int | None = None,
                 task_memory: int | None = None):
        self.client = None if local else (client if client is not None else active_client())
        self.on_progress = on_progress
        self.no_workers_timeout = no_workers_timeout()
        self.memory_limit = worker_memory_limit(self.client) if self.client is not None else None
        if self.client is not None:
            self.threads = task_threads(self.client)
            per_worker = _threads_per_worker(self.client)
        else:
            self.threads = int(threads or dask.config.get("num_workers", None) or os.cpu_count() or 1)
            per_worker = self.threads
        self.task_memory = int(task_memory) if task_memory else task_memory_budget(
            self.memory_limit, per_worker)
        self.cache_block = cache_block_bytes()

    @property
    def distributed(self) -> bool:
        return self.client is not None

    def run(self, label: str, parts: Mapping[Hashable, Any],
            on_result: Callable[[Hashable, Any], None] | None = None, *,
            keep: bool = True) -> dict:
        """Compute every part; returns ``{name: result}``.

        ``on_result(name, result)`` is called in the client as each part
        finishes (in completion order); the returned dict is keyed by name, so
        callers combine results in their own fixed order. With ``keep=False``
        the results are only handed to ``on_result`` (the dict is empty): a
        caller that folds them as they come holds none of them. On a cluster a
        part's result is released from its worker as soon as it is gathered.
        """
        raise_if_interrupted()
        names = list(parts)
        results: dict = {}
        t0 = time.perf_counter()
        total = len(names)
        finished = [0]

        def done(name, value):
            raise_if_interrupted()
            finished[0] += 1
            if keep:
                results[name] = value
            if on_result is not None:
                on_result(name, value)
            if self.on_progress is not None:
                self.on_progress(PartProgress(label, finished[0], total, time.perf_counter() - t0))

        if not names:
            return results
        if self.client is not None:
            # The shared objects travel once, inside the graph (a dictionary's factor is
            # m^2 floats: 13 MiB at m = 1300): expected, so not worth dask's warning.
            with dask.config.set({"distributed.admin.large-graph-warning-threshold": "2GiB"}):
                futures = self.client.compute([parts[n] for n in names])
            by_key = {f.key: n for f, n in zip(futures, names)}
            try:
                for fut in self._completed(label, futures):
                    done(by_key[fut.key], self._result(label, fut))
                    fut.release()  # the worker may drop it now: results do not pile up there
            finally:
                for f in futures:
                    f.release()
            return results
        return self._run_local(names, parts, done, keep)

    def values(self, label: str, *collections) -> tuple:
        """Each collection computed (one :meth:`run`), the results in the given order."""
        out = self.run(label, dict(enumerate(collections)))
        return tuple(out[i] for i in range(len(collections)))

    def _run_local(self, names, parts, done, keep: bool = True) -> dict:
        """Every part in one ``dask.compute``; each handed to ``done`` as it finishes."""
        import dask.threaded
        from dask.callbacks import Callback

        by_key = {}
        for n in names:
            key = getattr(parts[n], "key", None)
            if key is not None:
                by_key[key] = n
        seen: dict = {}

        class _Finished(Callback):
            def _posttask(self, key, result, dsk, state, worker_id):
                n = by_key.get(key)
                if n is not None and n not in seen:
                    seen[n] = True
                    done(n, result)

        kwargs = _default_scheduler()
        if kwargs or _scheduler() is dask.threaded.get:
            kwargs["num_workers"] = self.threads
        with task_blas_threads(), _Finished():
            values = dask.compute(*[parts[n] for n in names], **kwargs)
        for n, v in zip(names, values):  # parts whose key the optimizer renamed
            if n not in seen:
                seen[n] = True
                done(n, v)
        return {n: v for n, v in zip(names, values)} if keep else {}

    # -- liveness under a distributed client --------------------------------- #
    def _completed(self, label: str, futures):
        """Yield futures as they finish; raise when no worker is left for too long.

        ``as_completed`` is drained without blocking (O(1) per finished part);
        between parts the cluster is checked every :data:`POLL_SECONDS`.
        """
        from distributed import as_completed

        ac = as_completed(futures)
        since_no_worker = None
        last_check = last_progress = time.monotonic()
        while not ac.is_empty():
            if ac.has_ready():
                since_no_worker = None
                last_progress = time.monotonic()
                yield next(ac)
                continue
            time.sleep(0.02)
            now = time.monotonic()
            if now - last_check < POLL_SECONDS:
                continue
            last_check = now
            detail = f"{ac.count()} of {len(futures)} parts unfinished"
            since_no_worker = self._check_workers(label, since_no_worker, detail)
            self._check_progress(label, now - last_progress, detail)

    def _check_progress(self, label: str, idle: float, detail: str) -> None:
        """The progress watchdog: raise :class:`StalledRunError` when no part finished for
        ``paused_timeout`` seconds while every worker is paused (dask pauses a worker at
        its memory limit's pause fraction, and a paused worker is not a lost one), or for
        ``stall_timeout`` seconds whatever the reason (off unless configured)."""
        from ..exceptions import StalledRunError

        paused_timeout, stall_timeout = watchdog_timeouts()
        if idle < min(paused_timeout, stall_timeout):
            return
        identity = scheduler_identity(self.client)  # None: the scheduler did not answer
        workers = list((identity or {}).get("workers", {}).values())
        paused = bool(workers) and all(w.get("status") == "paused" for w in workers)
        limit = worker_memory_limit(self.client, identity or {})
        if paused and idle >= paused_timeout:
            from ..core.planning import DEFAULT_TASK_MEMORY

            need = max(2 * limit if limit else 0,
                       smallest_memory_limit(int(self.task_memory or DEFAULT_TASK_MEMORY)))
            raise StalledRunError(
                f"{label}: every worker is paused at its memory limit"
                + (f" ({format_bytes(limit)})" if limit else "")
                + f" and no part finished for {idle:.0f} s ({detail}); dask pauses a worker "
                "whose memory passes the pause fraction of its limit, and it never resumed: "
                f"pass --memory-limit {format_bytes(need)} or more (or fewer "
                "--threads-per-worker), then rerun the same command: it resumes")
        if idle >= stall_timeout:
            raise StalledRunError(
                f"{label}: no part finished for {idle:.0f} s ({detail}; "
                f"ooc-spectral.stall-timeout); the workers"
                + (f" (memory limit {format_bytes(limit)} each)" if limit else "")
                + " stopped making progress"
                + (f" and the dask scheduler does not answer within {SCHEDULER_ANSWER_SECONDS:g} s"
                   if identity is None else "")
                + ": check their logs and memory, then rerun the same command: it resumes")

    def _check_workers(self, label: str, since: float | None, detail: str) -> float | None:
        """When no worker has been connected since ``since`` (updated and returned; None
        while workers are there) for ``no_workers_timeout``, raise :class:`WorkersLostError`;
        when the scheduler has not answered for that long (stopped, or a host that no
        longer routes), :class:`StalledRunError`."""
        n = self._n_workers()
        now = time.monotonic()
        if n:
            return None
        since = now if since is None else since
        if now - since >= self.no_workers_timeout:
            if n is None:
                from ..exceptions import StalledRunError

                raise StalledRunError(
                    f"{label}: the dask scheduler has not answered for {now - since:.0f} s "
                    f"({detail}; each question waits {SCHEDULER_ANSWER_SECONDS:g} s, "
                    "ooc-spectral.no-workers-timeout bounds the whole): check that it runs "
                    "(not stopped, not overloaded) and rerun the same command: it resumes")
            raise WorkersLostError(
                f"{label}: no dask worker has been connected to the scheduler for "
                f"{self.no_workers_timeout:g} s ({detail}); start workers (or check why they "
                "die) and rerun the same command: it resumes"
            )
        return since

    def _n_workers(self) -> int | None:
        """The scheduler's workers, or None when it did not answer (a scheduler that is
        gone also fails the futures, whose results then say so)."""
        identity = scheduler_identity(self.client)
        return None if identity is None else len(identity.get("workers", {}))

    def _result(self, label: str, fut):
        """The result of a finished part, gathered from the worker that holds it.

        If that worker dies before the result is gathered, dask recomputes the part:
        the wait then goes on only while some worker is connected (a run whose workers
        are all gone must end, not wait for a result nobody will compute).
        """
        from distributed import KilledWorker

        since = None
        while True:
            try:
                return fut.result(timeout=POLL_SECONDS)
            except KilledWorker as exc:
                raise killed_worker_error(label, exc, self.memory_limit, self.task_memory) from None
            except TimeoutError:
                if fut.status == "error":  # the part's own error (it may be a TimeoutError)
                    raise
                since = self._check_workers(label, since, "a finished part's worker died "
                                            "before its result was gathered")


#: Seconds between two checks of the cluster while a pass waits for its parts.
POLL_SECONDS = 1.0
#: Seconds one check waits for the scheduler's answer: a stopped scheduler (SIGSTOP, a
#: frozen VM) keeps its connections open and never answers, and ``client.scheduler_info()``
#: would wait for ever; a scheduler unanswered through ``no-workers-timeout`` ends the pass.
SCHEDULER_ANSWER_SECONDS = 10.0


def scheduler_identity(client, timeout: float | None = None) -> dict | None:
    """The scheduler's identity (its ``workers`` included), or None when it did not answer
    within ``timeout`` seconds (default :data:`SCHEDULER_ANSWER_SECONDS`) or the
    connection failed."""
    try:
        return client.sync(client.scheduler.identity,
                           callback_timeout=SCHEDULER_ANSWER_SECONDS if timeout is None
                           else timeout)
    except Exception:  # timed out, or the connection is gone
        return None


def watchdog_timeouts() -> tuple[float, float]:
    """``(paused, stall)`` seconds of the progress watchdog (dask config
    ``ooc-spectral.paused-timeout``, default 300 s, and ``ooc-spectral.stall-timeout``,
    default off; env ``DASK_OOC_SPECTRAL__PAUSED_TIMEOUT`` and ``..._STALL_TIMEOUT``)."""
    from dask.utils import parse_timedelta

    paused = parse_timedelta(dask.config.get("ooc-spectral.paused-timeout", "300s"))
    stall = dask.config.get("ooc-spectral.stall-timeout", None)
    stall = float("inf") if stall in (None, False, "off", "none") else parse_timedelta(stall)
    return float(paused), float(stall)


def no_workers_timeout() -> float:
    """Seconds a pass waits with no worker connected before it fails."""
    from dask.utils import parse_timedelta

    return float(parse_timedelta(dask.config.get("ooc-spectral.no-workers-timeout", "60s")))


def _threads_per_worker(client) -> int:
    try:
        workers = client.scheduler_info().get("workers", {}).values()
        return max([int(w.get("nthreads", 1)) for w in workers] or [1])
    except Exception:
        return 1


def worker_memory_limit(client, identity: dict | None = None) -> int | None:
    """The smallest memory limit of the connected workers (None when unlimited or unknown,
    or the scheduler did not answer), from ``identity`` if given
    (:func:`scheduler_identity`), else asked of the scheduler."""
    if identity is None:
        identity = scheduler_identity(client)
    limits = [int(w["memory_limit"]) for w in (identity or {}).get("workers", {}).values()
              if w.get("memory_limit")]
    return min(limits) if limits else None


def killed_worker_error(label: str, exc: BaseException, memory_limit: int | None,
                        task_memory: int | None = None):
    """The named error for dask's ``KilledWorker``: too little memory, or workers dying."""
    from ..core.planning import DEFAULT_TASK_MEMORY

    task = getattr(exc, "task", None) or "a task"
    budget = int(task_memory or DEFAULT_TASK_MEMORY)
    if memory_limit:
        need = smallest_memory_limit(budget)
        if memory_limit < need:
            return WorkerMemoryError(
                f"{label}: the workers were killed while running {task}: each worker's memory "
                f"limit is {format_bytes(memory_limit)}, too small for one task of this run "
                f"(a worker uses about {format_bytes(WORKER_BASELINE)} before any task, a "
                f"task up to {format_bytes(budget)}); pass --memory-limit "
                f"{format_bytes(need)} or more"
            )
        return WorkersLostError(
            f"{label}: every worker that ran {task} died (each worker's memory limit is "
            f"{format_bytes(memory_limit)}); if they were killed for memory, raise "
            "--memory-limit; see the worker logs, then rerun the same command: it resumes"
        )
    return WorkersLostError(
        f"{label}: every worker that ran {task} died; see the worker logs, then rerun the "
        "same command: it resumes"
    )

