"""Running graphs: dask's threaded scheduler or a ``dask.distributed`` cluster.

The parallel passes are built as graphs of independent *parts* (a segment of
pass 2, a block of pass 3). :class:`Executor` computes them with whatever
scheduler is active and hands each finished part to a callback as soon as it
is done, so a checkpoint can record it and a progress line can count it:

- under a distributed ``Client`` (the default client, or one given): all parts
  are submitted at once and collected with ``as_completed``; lost workers'
  tasks are recomputed by the scheduler;
- otherwise: parts are computed in small batches with ``dask.compute`` (the
  threaded scheduler, or whatever ``dask.config`` says).

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
from threadpoolctl import threadpool_limits

from .exceptions import WorkerMemoryError, WorkersLostError

__all__ = ["Executor", "PartProgress", "shared", "active_client", "compute", "task_blas_threads"]


@contextmanager
def task_blas_threads():
    """One BLAS thread per task while dask's threaded scheduler runs tasks side by side.

    The threaded scheduler runs one task per core; letting each task's BLAS
    start one thread per core as well oversubscribes the machine (and makes
    OpenBLAS spin). Distributed workers already pin BLAS to one thread; the
    synchronous scheduler keeps every BLAS thread.
    """
    import dask.threaded

    if dask.base.get_scheduler() is dask.threaded.get and (os.cpu_count() or 1) > 1:
        with threadpool_limits(1):
            yield
    else:
        yield


def compute(*collections):
    """``dask.compute`` with :func:`task_blas_threads`."""
    with task_blas_threads():
        return dask.compute(*collections)


def shared(obj: Any):
    """``obj`` as one key of the graph (a ``dask.delayed`` literal)."""
    return dask.delayed(obj, pure=True)


def active_client():
    """The default ``distributed.Client``, or None when there is none."""
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
        Defaults to the active default client, if any.
    on_progress : callable, optional
        Called with a :class:`PartProgress` after each part.

    Notes
    -----
    Under a distributed client a pass always ends: when no worker is connected
    for ``ooc-spectral.no-workers-timeout`` (dask config, default 60 s; env
    ``DASK_OOC_SPECTRAL__NO_WORKERS_TIMEOUT``) it raises :class:`WorkersLostError`,
    and a task that killed every worker that ran it (dask's ``KilledWorker``)
    raises :class:`WorkerMemoryError` when the workers' memory limit is below
    what a task needs, :class:`WorkersLostError` otherwise.
    """

    def __init__(self, client=None, on_progress: Callable[[PartProgress], None] | None = None):
        self.client = client if client is not None else active_client()
        self.on_progress = on_progress
        self.no_workers_timeout = no_workers_timeout()
        self.memory_limit = worker_memory_limit(self.client) if self.client is not None else None

    @property
    def distributed(self) -> bool:
        return self.client is not None

    def run(self, label: str, parts: Mapping[Hashable, Any],
            on_result: Callable[[Hashable, Any], None] | None = None) -> dict:
        """Compute every part; returns ``{name: result}``.

        ``on_result(name, result)`` is called in the client as each part
        finishes (in completion order); the returned dict is keyed by name, so
        callers combine results in their own fixed order.
        """
        names = list(parts)
        results: dict = {}
        t0 = time.perf_counter()
        total = len(names)

        def done(name, value):
            results[name] = value
            if on_result is not None:
                on_result(name, value)
            if self.on_progress is not None:
                self.on_progress(PartProgress(label, len(results), total, time.perf_counter() - t0))

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
            finally:
                for f in futures:
                    f.release()
            return results
        batch = max(1, 2 * (os.cpu_count() or 1))
        for a in range(0, total, batch):
            chunk = names[a : a + batch]
            values = compute(*[parts[n] for n in chunk])
            for n, v in zip(chunk, values):
                done(n, v)
        return results

    # -- liveness under a distributed client --------------------------------- #
    def _completed(self, label: str, futures):
        """Yield futures as they finish; raise when no worker is left for too long.

        ``as_completed`` is drained without blocking (O(1) per finished part);
        between parts the cluster is checked every :data:`POLL_SECONDS`.
        """
        from distributed import as_completed

        ac = as_completed(futures)
        since_no_worker = None
        last_check = time.monotonic()
        while not ac.is_empty():
            if ac.has_ready():
                since_no_worker = None
                yield next(ac)
                continue
            time.sleep(0.02)
            now = time.monotonic()
            if now - last_check < POLL_SECONDS:
                continue
            last_check = now
            if self._n_workers():
                since_no_worker = None
                continue
            since_no_worker = now if since_no_worker is None else since_no_worker
            if now - since_no_worker >= self.no_workers_timeout:
                raise WorkersLostError(
                    f"{label}: no dask worker has been connected to the scheduler for "
                    f"{self.no_workers_timeout:g} s ({ac.count()} of {len(futures)} parts "
                    "unfinished); start workers (or check why they die) and rerun the same "
                    "command: it resumes"
                )

    def _n_workers(self) -> int:
        try:
            return len(self.client.scheduler_info().get("workers", {}))
        except Exception:  # the scheduler is gone: the future's result will say so
            return 1

    def _result(self, label: str, fut):
        from distributed import KilledWorker

        try:
            return fut.result()
        except KilledWorker as exc:
            raise killed_worker_error(label, exc, self.memory_limit) from None


#: Seconds between two checks of the cluster while a pass waits for its parts.
POLL_SECONDS = 1.0


def no_workers_timeout() -> float:
    """Seconds a pass waits with no worker connected before it fails."""
    from dask.utils import parse_timedelta

    return float(parse_timedelta(dask.config.get("ooc-spectral.no-workers-timeout", "60s")))


def worker_memory_limit(client) -> int | None:
    """The smallest memory limit of the connected workers (None when unlimited or unknown)."""
    try:
        limits = [w.get("memory_limit") for w in client.scheduler_info().get("workers", {}).values()]
    except Exception:
        return None
    limits = [int(v) for v in limits if v]
    return min(limits) if limits else None


def killed_worker_error(label: str, exc: BaseException, memory_limit: int | None):
    """The named error for dask's ``KilledWorker``: too little memory, or workers dying."""
    from .cluster import WORKER_BASELINE, format_bytes, smallest_memory_limit
    from .planning import DEFAULT_TASK_MEMORY

    task = getattr(exc, "task", None) or "a task"
    if memory_limit:
        need = smallest_memory_limit()
        if memory_limit < need:
            return WorkerMemoryError(
                f"{label}: the workers were killed while running {task}: each worker's memory "
                f"limit is {format_bytes(memory_limit)}, too small for one task of this run "
                f"(a worker uses about {format_bytes(WORKER_BASELINE)} before any task, a "
                f"task up to {format_bytes(DEFAULT_TASK_MEMORY)}); pass --memory-limit "
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

