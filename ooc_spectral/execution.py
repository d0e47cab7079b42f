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
    """

    def __init__(self, client=None, on_progress: Callable[[PartProgress], None] | None = None):
        self.client = client if client is not None else active_client()
        self.on_progress = on_progress

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
            from distributed import as_completed

            # The shared objects travel once, inside the graph (a dictionary's factor is
            # m^2 floats: 13 MiB at m = 1300): expected, so not worth dask's warning.
            with dask.config.set({"distributed.admin.large-graph-warning-threshold": "2GiB"}):
                futures = self.client.compute([parts[n] for n in names])
            by_key = {f.key: n for f, n in zip(futures, names)}
            try:
                for fut in as_completed(futures):
                    done(by_key[fut.key], fut.result())
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
