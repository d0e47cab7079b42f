"""Pass 3: the embedding of every row, lazily or written to zarr.

:func:`map_rows` is the lazy dask array ``(n, p)`` (one task per row
chunk of X: a kernel block, the projection and one product).

:class:`EmbeddingOutput` is the output group when one is given: an array
``embedding`` (n x p, float64, or float32 with ``output_dtype``) whose chunks
are aligned with the tasks' rows,
and an array ``embedding_written`` of per-chunk markers. Every output chunk is
written by exactly one task (zarr 3 has no write locks), and its marker is set
after the chunk, so a rerun writes only the chunks not yet marked. The array's
attribute ``complete`` is set last; until then the output does not look
finished.

Every chunk carries a CRC-32C checksum (:func:`ooc_spectral.io.integrity.checksummed`).
Before a rerun trusts chunks marked written, :meth:`EmbeddingOutput.audit`
checks that each exists and decodes, and clears the marker of those that do
not, so they are written again.

Workers cache open array handles; the cache is keyed by the output's
``run_id`` (a random id made when the arrays are created), so a long-lived
worker never writes through a handle of an older array at the same path.
"""

from __future__ import annotations

import errno
import functools
import uuid

from typing import TYPE_CHECKING

import dask
import numpy as np

from .._accel.fused import loops_for
from .._accel.support import ACCEL_MIN_ROWS, accel_for
from .._validation import check_finite
from ..core.model import SpectralMap
from ..exceptions import ConfigurationMismatchError, OutputNotWritableError
from ..io.integrity import (UNDIGESTED, checksummed, chunk_digest, damaged_chunks, digest_check,
                            missing_chunks, storing_every_chunk)
from ..io.row_blocks import RowBlocks
from ..runtime.execution import Executor, compute, shared

if TYPE_CHECKING:
    import dask.array as da

__all__ = ["map_rows", "client_accel", "EmbeddingOutput", "EMBEDDING", "WRITTEN", "write_marked"]

EMBEDDING = "embedding"
WRITTEN = "embedding_written"


#: dtypes the embedding can be written in (``output_dtype``).
OUTPUT_DTYPES = ("float64", "float32")


def _embed_block(block, smap, offset: int = 0, chunk_starts=None,
                 block_rows: int | None = None, dtype="float64") -> np.ndarray:
    """``smap.embed`` of ``block``, its rows checked finite (errors name the global row
    ``offset + i`` and, given ``chunk_starts``, the storage chunk), computed in float64
    sub-blocks of ``block_rows`` rows (the memory bound) and stored in ``dtype``."""
    n = len(block)
    m = getattr(getattr(smap, "dictionary", None), "size", None)
    with loops_for(None if m is None else n * int(m)):
        return _embed_sub_blocks(block, smap, offset, chunk_starts, block_rows, dtype)


def client_accel(n_rows: int):
    """The client's own work of a fit of ``n_rows`` rows (the scan, the solve): numba's
    loops and MKL only from :data:`~ooc_spectral._accel.support.ACCEL_MIN_ROWS` rows
    (:func:`~ooc_spectral._accel.support.accel_for`); the tasks decide by their blocks."""
    return accel_for(None if n_rows >= ACCEL_MIN_ROWS else 0)


def _embed_sub_blocks(block, smap, offset, chunk_starts, block_rows, dtype) -> np.ndarray:
    n = len(block)
    step = max(1, n if block_rows is None else int(block_rows))
    out = None
    for a in range(0, max(n, 1), step):
        X = np.ascontiguousarray(block[a:a + step], dtype=np.float64)
        check_finite(X, offset + a, chunk_starts=chunk_starts)
        E = smap.embed(X)
        if step >= n and E.dtype == np.dtype(dtype):
            return E
        if out is None:
            out = np.empty((n, E.shape[1]), dtype=dtype)
        out[a:a + len(E)] = E
    return out


def _embed_located(block, smap, chunk_starts=None, block_rows=None, dtype="float64",
                   block_info=None):
    offset = block_info[0]["array-location"][0][0] if block_info else 0
    return _embed_block(block, smap, offset, chunk_starts, block_rows, dtype)


def map_rows(X: da.Array | RowBlocks, fitted, chunk_starts=None, *, block_rows: int | None = None,
             dtype="float64", name: str = "ooc-spectral-embed") -> da.Array | np.ndarray:
    """A fitted map applied to every row of ``X``: the lazy dask array ``(n, p)``, or,
    for in-memory rows (a :class:`~ooc_spectral.io.source.RowBlocks`), its values.

    The one place where a fitted model meets the rows of a source: the write-back
    of pass 3, every estimator's ``transform`` and the baselines' embeddings.
    ``fitted`` is anything with ``embed(X) -> (len(X), p)`` and ``n_components``
    (a :class:`~ooc_spectral.core.model.SpectralMap`, a Nystrom model, a manifold map);
    it is one key of the graph, shipped once to each worker.

    Rows are checked finite on the way; ``chunk_starts`` (storage chunk
    boundaries) lets the error name the chunk. Each task works in sub-blocks
    of ``block_rows`` rows; the values are computed in float64 and stored in
    ``dtype`` (float64 or float32). Chunks follow ``X``'s rows.
    """
    p = fitted.n_components
    dtype = np.dtype(dtype)
    starts = None if chunk_starts is None else shared(np.asarray(chunk_starts))
    if isinstance(X, RowBlocks):
        if X.in_memory:
            return _map_in_memory(X, shared(fitted), starts, block_rows, dtype, p)
        X = X.as_dask()  # rows in a store: the result stays lazy
    import dask.array as da

    # The keys must name this input and this map: with one fixed name, two embeddings
    # computed together, or one computed while another's results are held on a
    # cluster (persisted, or futures alive), share keys and one gets the other's values.
    name = f"{name}-" + dask.base.tokenize(X, fitted, chunk_starts, str(dtype), block_rows)
    return da.map_blocks(_embed_located, X, shared(fitted), starts, block_rows, str(dtype),
                         dtype=dtype, meta=np.empty((0, p), dtype=dtype),
                         chunks=(X.chunks[0], (p,)), name=name)


def _map_in_memory(X: RowBlocks, fitted_key, starts_key, block_rows, dtype: np.dtype,
                   p: int) -> np.ndarray:
    """:func:`map_rows` of in-memory rows, computed: the same tasks, one per row chunk."""
    bounds = X.bounds
    tasks = [dask.delayed(_embed_block, pure=True)(block, fitted_key, int(bounds[i]), starts_key,
                                                   block_rows, str(dtype))
             for i, block in enumerate(X.to_delayed().ravel())]
    out = np.empty((X.shape[0], p), dtype=dtype)
    for i, part in enumerate(compute(*tasks)):
        out[bounds[i]:bounds[i + 1]] = part
    return out


@functools.lru_cache(maxsize=32)
def _open(url: str, name: str, run_id: str | None = None, options=None):
    """An open array, cached per process (worker) by location *and* run id.

    ``options`` (a :class:`~ooc_spectral.io.storage.StorageOptions`) are the
    command's storage options of a URL output.
    """
    import zarr

    extra = {"storage_options": options.to_dict()} if options else {}
    # every chunk written stored, even one of fill values (an embedding chunk all NaN, a
    # labels chunk all -1): a chunk left out reads as never written
    arr = storing_every_chunk(zarr.open_array(f"{url.rstrip('/')}/{name}", mode="r+", **extra))
    found = arr.attrs.get("run_id")
    if run_id is not None and found != run_id:
        _open.cache_clear()
        raise ConfigurationMismatchError(
            f"the array {url}/{name} belongs to run {found!r}, not to this run {run_id!r}: "
            "another run replaced the output while this one was writing"
        )
    return arr


def _write_block(block, smap: SpectralMap, url: str, start: int, stop: int,
                 chunk_rows: int, run_id: str | None = None, options=None,
                 block_rows: int | None = None, dtype="float64") -> int:
    out = _embed_block(block, smap, start, None, block_rows, dtype)
    write_marked(url, EMBEDDING, WRITTEN, out, start, stop, chunk_rows, run_id, options)
    return stop - start


def write_marked(url: str, name: str, marks_name: str, values: np.ndarray, start: int,
                 stop: int, chunk_rows: int, run_id: str | None, options=None) -> None:
    """Write rows ``start:stop`` of the output array ``name``, then mark their whole chunks
    written in ``marks_name`` (:func:`mark_written`, keyed by the array's own run id)."""
    arr = _open(url, name, run_id, options)
    values = np.asarray(values, dtype=arr.dtype)
    arr[start:stop] = values
    mark_written(_open(url, marks_name, run_id, options), values, start, stop, chunk_rows,
                 arr.attrs.get("run_id"))


def mark_written(marks, values: np.ndarray, start: int, stop: int, chunk_rows: int,
                 run_id: str | None) -> None:
    """Mark the whole output chunks of rows ``start:stop`` (``values``) written, each with
    its :func:`~ooc_spectral.io.integrity.chunk_digest` (markers of OUTDIRs written
    before markers were 64-bit: 1)."""
    first, last = start // chunk_rows, -(-stop // chunk_rows)
    if marks.dtype != np.uint64:
        marks[first:last] = UNDIGESTED
        return
    marks[first:last] = np.array(
        [chunk_digest(run_id, c, values[max(c * chunk_rows, start) - start:
                                        min((c + 1) * chunk_rows, stop) - start])
         for c in range(first, last)], dtype=np.uint64)


def _unfinished_api_output(group) -> bool:
    """True for what a ``fit(output=...)`` that died leaves: an embedding never marked
    complete, outside any ``ooc-spectral fit`` OUTDIR. Starting it over loses nothing."""
    from ..io.checkpoint import RUN_KEY

    if RUN_KEY in group.attrs or EMBEDDING not in group:
        return False
    try:
        return group[EMBEDDING].attrs.get("complete") is False
    except Exception:
        return False


def _absolute(url) -> str:
    from ..io.storage import absolute, check_location

    return absolute(check_location(url, "output"))


class EmbeddingOutput:
    """The zarr group receiving the embedding.

    Parameters
    ----------
    url : str
        Path or URL of the group (created if needed).
    n_rows, n_components : int
    chunk_rows : int
        Rows per output chunk (:attr:`~ooc_spectral.core.planning.TaskPlan.output_chunk_rows`).
        A resumed output keeps the chunks it was created with.
    dtype : {"float64", "float32"}
        dtype of the stored embedding (computed in float64 either way).
    """

    def __init__(self, url: str, n_rows: int, n_components: int, chunk_rows: int,
                 dtype="float64"):
        self.url = _absolute(url)  # workers may run in another working directory
        from ..io.storage import StorageOptions, options_for

        #: the command's storage options of a URL, sent with the write tasks (never shown)
        self.options = StorageOptions(options_for(self.url))
        self.run_id: str | None = None
        self.n_rows = int(n_rows)
        self.n_components = int(n_components)
        self.chunk_rows = int(max(1, min(chunk_rows, n_rows)))
        self.dtype = np.dtype(dtype)
        if self.dtype.name not in OUTPUT_DTYPES:
            raise ValueError(f"output dtype {self.dtype} is not one of {OUTPUT_DTYPES}")

    @property
    def n_chunks(self) -> int:
        return -(-self.n_rows // self.chunk_rows)

    @classmethod
    def open_existing(cls, url) -> "EmbeddingOutput":
        """The output already written at ``url`` (for audits)."""
        import zarr

        arr = zarr.open_array(f"{_absolute(url).rstrip('/')}/{EMBEDDING}", mode="r")
        out = cls(url, arr.shape[0], arr.shape[1], arr.chunks[0], arr.dtype)
        out.run_id = arr.attrs.get("run_id")
        return out

    def prepare(self, *, resume: bool = False) -> "EmbeddingOutput":
        """Create the arrays (or, with ``resume``, check and audit the existing ones).

        Raises :class:`OutputNotWritableError` before any work when the
        location cannot be written, or when (without ``resume``) it already
        holds an embedding: a fit never overwrites another run's output, as
        ``save()`` never overwrites a model.
        """
        import zarr
        import zarr.errors

        try:
            group = zarr.open_group(self.url, mode="a")
            if resume and EMBEDDING in group and WRITTEN in group:
                arr = group[EMBEDDING]
                if arr.shape != (self.n_rows, self.n_components) or arr.dtype != self.dtype:
                    raise ConfigurationMismatchError(
                        f"the embedding at {self.url} has shape {arr.shape} and dtype "
                        f"{arr.dtype}, not ({self.n_rows}, {self.n_components}) in "
                        f"{self.dtype}; start with a fresh output location"
                    )
                # another number of threads plans other tasks: the chunks written stay
                # valid, and pass 3's tasks follow them
                self.chunk_rows = int(arr.chunks[0])
                self.run_id = arr.attrs.get("run_id")
                self.audit()
                return self
            if not resume and (EMBEDDING in group or WRITTEN in group) and not \
                    _unfinished_api_output(group):
                raise OutputNotWritableError(
                    f"{self.url} already holds an embedding (of another fit, maybe another "
                    "configuration); nothing was overwritten: choose another output location, "
                    "or delete it first"
                )
            self.run_id = uuid.uuid4().hex
            group.create_array(
                EMBEDDING, shape=(self.n_rows, self.n_components),
                chunks=(self.chunk_rows, self.n_components), dtype=self.dtype.name,
                fill_value=np.nan, overwrite=True, dimension_names=("sample", "component"),
                attributes={"complete": False, "run_id": self.run_id}, **checksummed(),
            )
            group.create_array(  # 0: not written; else the chunk's digest (mark_written)
                WRITTEN, shape=(self.n_chunks,), chunks=(1,), dtype="uint64",
                fill_value=0, overwrite=True, dimension_names=("output_chunk",), attributes={"run_id": self.run_id},
                **checksummed(),
            )
        except (ConfigurationMismatchError, OutputNotWritableError):
            raise
        except (OSError, zarr.errors.BaseZarrError) as exc:
            if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
                raise  # a full disk is transient (exit 1): free space and rerun to resume
            raise OutputNotWritableError(
                f"cannot write the output at {self.url!r}: {type(exc).__name__}: {exc}; "
                "choose a writable location that is not an existing file or array"
            ) from exc
        _open.cache_clear()
        return self

    def audit(self) -> list[str]:
        """Chunks marked written that are missing or fail their checksum; unmarks them.

        Returns one line per such chunk. Reads every written chunk once (n x p
        values): cheap next to the passes, and a rerun never trusts a chunk
        damaged since it was written.
        """
        import zarr

        base = self.url.rstrip("/")
        emb = zarr.open_array(f"{base}/{EMBEDDING}", mode="r")
        marks_arr = zarr.open_array(f"{base}/{WRITTEN}", mode="r+")
        marks = read_markers(marks_arr, self.n_chunks)
        written = {(int(i), 0) for i in np.flatnonzero(marks)}
        problems: dict[int, str] = {}
        for coords, key in missing_chunks(emb):
            if coords in written:
                problems[coords[0]] = f"embedding chunk {key} is missing"
        candidates = [(c, k) for c, k in _chunk_list(emb) if c in written and c[0] not in problems]
        check = digest_check(emb.attrs.get("run_id"), marks)
        for coords, key, err in damaged_chunks(emb, candidates, check):
            problems[coords[0]] = f"embedding chunk {key} is damaged ({err})"
        for i in sorted(problems):
            marks_arr[i] = 0
        if problems:
            import logging

            logging.getLogger("ooc_spectral").warning(
                "%d embedding chunk(s) of %s marked written are missing or damaged; they will "
                "be written again: %s", len(problems), self.url,
                "; ".join(problems[i] for i in sorted(problems)[:5]))
        return [problems[i] for i in sorted(problems)]

    def pending(self, bounds: np.ndarray) -> list[int]:
        """Indices of the tasks (rows ``bounds[i]:bounds[i+1]``) not fully written."""
        import zarr

        marks = zarr.open_array(f"{self.url.rstrip('/')}/{WRITTEN}", mode="r")[:]
        out = []
        for i in range(len(bounds) - 1):
            a, b = int(bounds[i]), int(bounds[i + 1])
            if not marks[a // self.chunk_rows : -(-b // self.chunk_rows)].all():
                out.append(i)
        return out

    def task_rows(self, rows: int) -> int:
        """Rows per pass-3 task near ``rows``, a multiple of the output chunk rows."""
        return int(self.chunk_rows * max(1, int(rows) // self.chunk_rows))

    def write(self, X: da.Array, smap: SpectralMap, executor: Executor,
              block_rows: int | None = None) -> int:
        """Write the embedding of the unwritten row chunks of ``X``; returns rows written.

        Each task works in sub-blocks of ``block_rows`` rows."""
        bounds = np.concatenate([[0], np.cumsum(X.chunks[0])]).astype(np.int64)
        if np.any(bounds[1:-1] % self.chunk_rows):
            raise ValueError("task boundaries must be multiples of the output chunk rows")
        todo = self.pending(bounds)
        blocks = X.to_delayed().ravel()
        s_key = shared(smap)
        parts = {
            i: dask.delayed(_write_block, pure=False)(
                blocks[i], s_key, self.url, int(bounds[i]), int(bounds[i + 1]), self.chunk_rows,
                self.run_id, self.options or None, block_rows, self.dtype.name)
            for i in todo
        }
        done = executor.run("pass 3 (write-back)", parts)
        return int(sum(done.values()))

    def mark_complete(self) -> None:
        import zarr

        arr = zarr.open_array(f"{self.url.rstrip('/')}/{EMBEDDING}", mode="r+")
        arr.attrs["complete"] = True

    def as_dask(self) -> da.Array:
        import dask.array as da
        import zarr

        arr = zarr.open_array(f"{self.url.rstrip('/')}/{EMBEDDING}", mode="r")
        return da.from_zarr(arr)


def _chunk_list(arr):
    from ..io.integrity import chunk_keys

    return chunk_keys(arr)


def read_markers(marks_arr, n_chunks: int) -> np.ndarray:
    """The per-chunk written markers; all reset to 0 (and rewritten so) where the markers
    themselves are damaged: a rerun then trusts no chunk."""
    try:
        return marks_arr[:]
    except Exception:
        marks = np.zeros(n_chunks, dtype=marks_arr.dtype)
        marks_arr[:] = marks
        return marks
