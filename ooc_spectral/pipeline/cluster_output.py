"""The clustering's write-back: the embedding and the labels of every row, resumable.

:class:`ClusterOutput` is an :class:`~ooc_spectral.pipeline.writeback.EmbeddingOutput`
(array ``embedding``, its per-chunk markers ``embedding_written``, checksums, the
``complete`` attribute last) with, beside it in the same group, the array ``labels``
(``n``, int32, the same row chunks, fill -1) and its markers ``labels_written``. One
task computes a row chunk's coordinates once and writes both (coordinates, then
labels, each followed by its marker), so a rerun writes only the chunks not yet marked
in either array. Before a rerun trusts chunks marked written, missing or damaged ones
are unmarked (:meth:`EmbeddingOutput.audit`, and the same check of the labels).
"""

from __future__ import annotations

import dask
import numpy as np
import zarr

from .._validation import check_finite
from ..exceptions import ConfigurationMismatchError
from ..io.integrity import checksummed, damaged_chunks, digest_check, missing_chunks
from ..runtime.execution import Executor, shared
from .writeback import (EMBEDDING, WRITTEN, EmbeddingOutput, _chunk_list, _open, read_markers,
                        write_marked)

__all__ = ["ClusterOutput", "LABELS", "LABELS_WRITTEN"]

LABELS = "labels"
LABELS_WRITTEN = "labels_written"


def _write_both(block, cmap, url: str, start: int, stop: int, chunk_rows: int,
                run_id: str | None, options=None) -> int:
    X = np.ascontiguousarray(block, dtype=np.float64)
    check_finite(X, start)
    E = cmap.embed(X)
    labels = cmap.labels_of(E)
    write_marked(url, EMBEDDING, WRITTEN, E, start, stop, chunk_rows, run_id, options)
    write_marked(url, LABELS, LABELS_WRITTEN, labels, start, stop, chunk_rows, run_id, options)
    return stop - start


class ClusterOutput(EmbeddingOutput):
    """The embedding and the labels in one output group (see the module docstring)."""

    def prepare(self, *, resume: bool = False) -> "ClusterOutput":
        super().prepare(resume=resume)
        group = zarr.open_group(self.url, mode="a")
        if resume and LABELS in group and LABELS_WRITTEN in group:
            arr = group[LABELS]
            if arr.shape != (self.n_rows,) or arr.chunks[0] != self.chunk_rows:
                raise ConfigurationMismatchError(
                    f"the labels at {self.url} have shape {arr.shape} and chunks {arr.chunks}, "
                    f"not ({self.n_rows},) in chunks of {self.chunk_rows}; start with a fresh "
                    "output location")
            self._audit_labels()
            return self
        group.create_array(LABELS, shape=(self.n_rows,), chunks=(self.chunk_rows,), dtype="int32",
                           fill_value=-1, overwrite=True, dimension_names=("sample",),
                           attributes={"complete": False, "run_id": self.run_id}, **checksummed())
        group.create_array(LABELS_WRITTEN, shape=(self.n_chunks,), chunks=(1,), dtype="uint64",
                           fill_value=0, overwrite=True, dimension_names=("output_chunk",),
                           attributes={"run_id": self.run_id}, **checksummed())
        _open.cache_clear()
        return self

    def _audit_labels(self) -> list[int]:
        base = self.url.rstrip("/")
        arr = zarr.open_array(f"{base}/{LABELS}", mode="r")
        marks_arr = zarr.open_array(f"{base}/{LABELS_WRITTEN}", mode="r+")
        marks = read_markers(marks_arr, self.n_chunks)
        written = {(int(i),) for i in np.flatnonzero(marks)}
        bad = {c[0] for c, _ in missing_chunks(arr) if c in written}
        candidates = [(c, k) for c, k in _chunk_list(arr) if c in written and c[0] not in bad]
        check = digest_check(arr.attrs.get("run_id"), marks)
        bad |= {c[0] for c, _, _ in damaged_chunks(arr, candidates, check)}
        for i in sorted(bad):
            marks_arr[i] = 0
        return sorted(bad)

    def pending(self, bounds: np.ndarray) -> list[int]:
        marks = zarr.open_array(f"{self.url.rstrip('/')}/{LABELS_WRITTEN}", mode="r")[:]
        todo = set(super().pending(bounds))
        for i in range(len(bounds) - 1):
            a, b = int(bounds[i]), int(bounds[i + 1])
            if not marks[a // self.chunk_rows: -(-b // self.chunk_rows)].all():
                todo.add(i)
        return sorted(todo)

    def write(self, X, cmap, executor: Executor, block_rows: int | None = None) -> int:
        """Write the coordinates and labels of the unwritten row chunks of ``X``."""
        bounds = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(np.int64)
        if np.any(bounds[1:-1] % self.chunk_rows):
            raise ValueError("task boundaries must be multiples of the output chunk rows")
        blocks = X.to_delayed().ravel()
        c_key = shared(cmap)
        parts = {i: dask.delayed(_write_both, pure=False)(
            blocks[i], c_key, self.url, int(bounds[i]), int(bounds[i + 1]), self.chunk_rows,
            self.run_id, self.options or None) for i in self.pending(bounds)}
        done = executor.run("write-back (embedding and labels)", parts)
        return int(sum(done.values()))

    def mark_complete(self) -> None:
        super().mark_complete()
        zarr.open_array(f"{self.url.rstrip('/')}/{LABELS}", mode="r+").attrs["complete"] = True
