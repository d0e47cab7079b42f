"""In-memory rows cut into the parallel passes' tasks, without ``dask.array``.

:meth:`~ooc_spectral.io.source.DataSource.task_view` gives numpy input to the passes as
a :class:`RowBlocks`: the part of a dask array's interface they use (``chunks``,
``to_delayed``, ``shape``), each task a ``dask.delayed`` slice of the array. Importing
``dask.array`` (and, wherever it is installed, xarray and pandas with it) would be most
of a small in-memory fit's fixed cost (issue 38).

Imports: NumPy; dask's core (``dask.delayed``) when the tasks are made.
"""

from __future__ import annotations

import uuid

import numpy as np

__all__ = ["RowBlocks"]


class RowBlocks:
    """Rows of an in-memory array (or of a sparse matrix read as dense rows) as tasks of
    ``sizes`` rows each, in row order.

    Each task slices its rows from the array, held once in the graph (as
    ``da.from_array`` holds it); a sparse matrix is densified task by task.
    """

    def __init__(self, rows, sizes: tuple[int, ...]):
        self._rows = rows
        self.shape = (int(rows.shape[0]), int(rows.shape[1]))
        self.dtype = np.dtype(rows.dtype)
        self.chunks = (tuple(int(r) for r in sizes), (self.shape[1],))
        #: Row boundaries of the tasks: task i holds rows ``bounds[i]:bounds[i + 1]``.
        self.bounds = np.concatenate([[0], np.cumsum(self.chunks[0], dtype=np.int64)])
        self._name = f"rows-{uuid.uuid4().hex}"

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
