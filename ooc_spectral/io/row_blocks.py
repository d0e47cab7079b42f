"""Rows cut into the parallel passes' tasks, without ``dask.array``.

:meth:`~ooc_spectral.io.source.DataSource.task_view` gives numpy and zarr input to the
passes as a :class:`RowBlocks`: the part of a dask array's interface they use (``chunks``,
``to_delayed``, ``shape``), each task a ``dask.delayed`` call that slices its rows from the
array in memory or reads them from the store. Importing ``dask.array`` (and, wherever it
is installed, xarray and pandas with it) would be most of a small fit's fixed cost and
of every command-line process's start (issues 38 and 54).

Imports: NumPy; dask's core (``dask.delayed``) when the tasks are made.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

import numpy as np

__all__ = ["RowBlocks"]


class RowBlocks:
    """Rows as tasks of ``sizes`` rows each, in row order.

    ``rows`` is anything sliced by rows into an ndarray (``rows[a:b]``) with ``shape``
    and ``dtype``: an in-memory array (held once in the graph, as ``da.from_array``
    holds it), a sparse matrix read as dense rows (densified task by task), or a reader
    of a store (:class:`~ooc_spectral.io.source.DataSource`'s zarr reader, which reads
    and checks each task's rows where the task runs).

    ``lazy``, for rows not in memory: a function returning the same tasks as a dask
    array (:meth:`as_dask`), for results that must stay lazy (the embedding of a zarr
    input without an output location).
    """

    def __init__(self, rows, sizes: tuple[int, ...], *,
                 lazy: Callable[[], Any] | None = None):
        self._rows = rows
        self._lazy = lazy
        self.shape = (int(rows.shape[0]), int(rows.shape[1]))
        self.dtype = np.dtype(rows.dtype)
        self.chunks = (tuple(int(r) for r in sizes), (self.shape[1],))
        #: Row boundaries of the tasks: task i holds rows ``bounds[i]:bounds[i + 1]``.
        self.bounds = np.concatenate([[0], np.cumsum(self.chunks[0], dtype=np.int64)])
        self._name = f"rows-{uuid.uuid4().hex}"

    @property
    def in_memory(self) -> bool:
        """Whether the rows are held in this process (their results are computed at once)."""
        return self._lazy is None

    def as_dask(self):
        """The same tasks as a dask array (rows not in memory only)."""
        if self._lazy is None:
            raise TypeError("in-memory RowBlocks have no lazy view; use to_delayed()")
        return self._lazy()

    def to_delayed(self) -> np.ndarray:
        """One ``Delayed`` per task (an object array of shape ``(tasks, 1)``)."""
        import dask

        whole = dask.delayed(self._rows, name=self._name)
        out = np.empty((len(self.chunks[0]), 1), dtype=object)
        for i in range(len(self.chunks[0])):
            a, b = int(self.bounds[i]), int(self.bounds[i + 1])
            out[i, 0] = dask.delayed(_slice_rows, pure=True)(whole, a, b,
                                                             dask_key_name=f"{self._name}-{i}")
        return out


def _slice_rows(rows, start: int, stop: int):
    return rows[start:stop]
