"""The input matrix: opening, validating and reading rows of X.

:func:`open_source` accepts a numpy array (or anything ``np.asarray`` takes), a
dask array, a ``zarr.Array``, or the path/URL of a zarr array or of a zarr group
holding one data array (the layout ``ooc-spectral make-data`` writes: an array
named ``data`` beside 1-D label arrays). It checks what can be checked without
reading the data (two dimensions, at least one row and one feature, a real
numeric dtype) and returns a :class:`DataSource`.

Values are checked while the passes read them: :func:`check_finite` raises
:class:`~ooc_spectral.exceptions.NonFiniteInputError` naming the first bad row
and the storage chunk that holds it.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .._validation import check_finite
from ..core.planning import row_chunks
from ..exceptions import (
    InvalidInputError,
    InvalidInputTypeError,
    IncompleteInputError,
    StoreNotFoundError,
)
from .layout import DATA_ARRAY_NAME, DATASET_KEY, IMPORT_KEY, table_format, unfinished_input
from .row_blocks import RowBlocks
from .zarr_rows import ChunkDigests, ReadRetry, ZarrRows, read_zarr_block, is_transient

if TYPE_CHECKING:
    import dask.array as da

log = logging.getLogger("ooc_spectral")

__all__ = ["DataSource", "open_source", "open_zarr_array", "array_url", "ReadRetry", "is_transient",
           "check_real_dtype"]

#: Alignment unit (rows) of tasks and output chunks for in-memory numpy input.
NUMPY_ALIGN_ROWS = 4096


@dataclass(frozen=True, eq=False)
class DataSource:
    """Read access to an n x d matrix, whatever it is stored in.

    Attributes
    ----------
    kind : {"numpy", "dask", "zarr"}
    shape : (n_rows, n_features)
    dtype : numpy dtype of the stored values
    chunk_starts : ndarray of int, shape (n_chunks + 1,)
        Row boundaries of the storage chunks (one chunk for numpy input).
    storage_chunk_rows : int
        Rows per storage chunk: the zarr chunk (or shard), the first dask chunk,
        or :data:`NUMPY_ALIGN_ROWS` for numpy input. Tasks of the parallel
        passes span whole multiples of it, and the output's chunks equal it.
    url : str or None
        Location of the zarr array, when the input is one.
    """

    kind: str
    shape: tuple[int, int]
    dtype: np.dtype
    chunk_starts: np.ndarray
    storage_chunk_rows: int
    url: str | None = None
    digests: ChunkDigests | None = field(default=None, repr=False)
    _numpy: np.ndarray | None = field(default=None, repr=False)
    _dask: da.Array | None = field(default=None, repr=False)
    _zarr: Any = field(default=None, repr=False)

    @property
    def n_rows(self) -> int:
        return self.shape[0]

    @property
    def n_features(self) -> int:
        return self.shape[1]

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def chunk_of_row(self, row: int) -> int:
        """Index of the storage chunk holding ``row``."""
        return int(np.searchsorted(self.chunk_starts, row, side="right") - 1)

    def fingerprint(self) -> dict | None:
        """Cheap fingerprint of a zarr input (metadata and chunk listing), None otherwise.

        Raises :class:`~ooc_spectral.exceptions.MissingChunkError` naming a chunk
        that has no object in the store.
        """
        if self.kind != "zarr":
            return None
        from .integrity import input_fingerprint

        return input_fingerprint(self._zarr, self.url)

    def _token(self, rows) -> str:
        from dask.base import tokenize

        return tokenize(self.url, self.shape, str(self.dtype), self.storage_chunk_rows, rows)

    def read_raw(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as stored (the source's dtype), not checked."""
        if self.kind == "numpy":
            return self._numpy[start:stop]
        if self.kind == "zarr":
            return self._reader().read(start, stop)
        return self._dask[start:stop].compute()

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as float64, checked finite."""
        block = np.ascontiguousarray(self.read_raw(start, stop), dtype=np.float64)
        check_finite(block, start, self)
        return block

    def read_index(self, rows: np.ndarray) -> np.ndarray:
        """The rows numbered ``rows`` (sorted ascending), read run by run, as float64."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return np.empty((0, self.n_features))
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        starts = np.concatenate([[0], breaks])
        stops = np.concatenate([breaks, [rows.size]])
        if self.kind == "dask" and len(starts) > 1:
            # one graph for every run (a compute per run costs milliseconds each)
            block = np.ascontiguousarray(self._dask[rows].compute(), dtype=np.float64)
            for a, b in zip(starts, stops):
                check_finite(block[a:b], int(rows[a]), self)
            return block
        if self.kind == "zarr" and len(starts) > 1:
            return self._read_by_chunk(rows, starts, stops)
        return np.concatenate([
            self.read_rows(int(rows[a]), int(rows[b - 1]) + 1) for a, b in zip(starts, stops)
        ])

    def _read_by_chunk(self, rows: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """:meth:`read_index` of a zarr array: each storage chunk that holds some of the rows
        read once (the span of them it holds), not once per run of consecutive rows (a read
        decodes the whole chunk: a seeded sample has many runs per chunk). Each run is
        checked finite as :meth:`read_rows` checks it; the other rows of a span are not."""
        block = np.empty((rows.size, self.n_features))
        chunk = np.searchsorted(self.chunk_starts, rows, side="right") - 1
        edges = np.flatnonzero(np.diff(chunk)) + 1
        for a, b in zip(np.concatenate([[0], edges]), np.concatenate([edges, [rows.size]])):
            first = int(rows[a])
            span = self.read_raw(first, int(rows[b - 1]) + 1)
            block[a:b] = span[rows[a:b] - first]
        for a, b in zip(starts, stops):
            check_finite(block[a:b], int(rows[a]), self)
        return block

    def task_view(self, task_rows: int | tuple[int, ...] | None = None) -> "RowBlocks | da.Array":
        """The rows as the parallel passes' tasks: :meth:`to_dask`, except that in-memory
        (numpy) rows and a zarr array's become a :class:`RowBlocks`, which gives the passes
        the same tasks without building (or importing) a dask array; a zarr array's keeps
        :meth:`to_dask` as its lazy view (:meth:`RowBlocks.as_dask`)."""
        if self.kind == "numpy":
            return RowBlocks(self._numpy, self._sizes(task_rows))
        if self.kind == "zarr":
            sizes = self._sizes(task_rows)
            return RowBlocks(self._reader(), sizes, lazy=functools.partial(self.to_dask, sizes))
        return self.to_dask(task_rows)

    def _reader(self) -> "ZarrRows":
        return ZarrRows(self._zarr, self.url, self.storage_chunk_rows, ReadRetry.from_env(),
                        self.digests)

    def _sizes(self, task_rows) -> tuple[int, ...]:
        n = self.n_rows
        if isinstance(task_rows, (tuple, list)):
            if sum(task_rows) != n or min(task_rows, default=1) <= 0:
                raise ValueError(f"row chunks {task_rows[:4]}... do not split {n} rows")
            return tuple(int(r) for r in task_rows)
        return row_chunks(n, self.storage_chunk_rows if task_rows is None else task_rows)

    def to_dask(self, task_rows: int | tuple[int, ...] | None = None) -> da.Array:
        """A dask view with row chunks of ``task_rows`` rows, all columns in one.

        ``task_rows`` (default: :attr:`storage_chunk_rows`) should be a multiple
        of :attr:`storage_chunk_rows`, so that every task reads whole storage
        chunks and writes whole output chunks. A tuple (or list) gives each chunk's rows (in
        row order, summing to the number of rows): the reduction passes' tasks
        (:meth:`~ooc_spectral.core.planning.TaskPlan.reduce_chunks`).
        """
        import dask.array as da

        d = self.n_features
        sizes = self._sizes(task_rows)
        if self.kind == "numpy":
            return da.from_array(self._numpy, chunks=(sizes, d), name=False)
        if self.kind == "zarr":
            # Our own reader rather than da.from_zarr: a chunk that cannot be read or
            # decoded is reported with its chunk numbers, from any worker.
            return da.map_blocks(
                read_zarr_block, self._reader(),
                chunks=(sizes, (d,)), dtype=self.dtype,
                meta=np.empty((0, d), dtype=self.dtype), name=f"read-{self._token(sizes)}")
        arr = self._dask
        if arr.chunks == (sizes, (d,)):
            return arr
        return arr.rechunk((sizes, d))


def _validate_meta(shape, dtype, what: str) -> None:
    if len(shape) != 2:
        raise InvalidInputError(
            f"expected a 2-D array (n_samples, n_features), got {len(shape)}-D {what} of "
            f"shape {tuple(shape)}; reshape it, e.g. X.reshape(-1, 1) for a single feature"
        )
    if shape[0] == 0:
        raise InvalidInputError(
            f"{what} has 0 rows (shape {tuple(shape)}); at least 2 samples are needed"
        )
    if shape[1] == 0:
        raise InvalidInputError(
            f"{what} has 0 features (shape {tuple(shape)}); at least one column is needed"
        )
    check_real_dtype(dtype, what)


def check_real_dtype(dtype, what: str) -> None:
    """Refuse a dtype that is not a real number (complex, object, text, records) before
    anything is read: a cast would drop imaginary parts silently, and an array of Python
    objects would need unpickling. ``what`` names the data (a path, "the array")."""
    dt = np.dtype(dtype)
    if dt.kind in "biuf":
        return
    if dt.kind == "c":
        fix = ("the embedding needs real numbers: convert them first, e.g. keep "
               "np.hstack([X.real, X.imag]) (real and imaginary parts as columns) or np.abs(X)")
    elif dt.kind == "O":
        fix = ("an array of Python objects is never loaded (that needs unpickling): save it "
               "again as numbers, e.g. np.save(path, X.astype(np.float64))")
    else:
        fix = "convert the data to float32 or float64 first"
    raise InvalidInputError(
        f"{what}: expected a real numeric dtype (bool, integer or float), got {dt}; {fix}")


def open_zarr_array(location: str | os.PathLike, *, mode: str = "r",
                    storage_options: dict | None = None):
    """Open a zarr array at ``location``, or the data array of a group there.

    A local path is made absolute first, so the array's location means the
    same on workers whose working directory differs from the client's. A URL
    (``s3://bucket/x.zarr``) is opened with fsspec: an unknown scheme or a
    missing backend raises :class:`~ooc_spectral.exceptions.StorageBackendError`
    naming the package to install. ``storage_options`` add to the backend's own
    configuration. A data set whose writer marked it incomplete
    (``make-data``'s ``complete: false``) is refused with
    :class:`IncompleteInputError`.
    """
    return _open_zarr(location, mode, storage_options)[0]


def _open_zarr(location, mode: str = "r", storage_options: dict | None = None):
    """:func:`open_zarr_array`, and the attributes of the group it was found in (None when
    ``location`` names the array itself)."""
    import zarr
    import zarr.errors

    from .storage import absolute, check_location, is_url

    loc = absolute(check_location(location, "input"))
    extra = {"storage_options": storage_options} if storage_options and is_url(loc) else {}
    try:
        node = zarr.open(loc, mode=mode, **extra)
    except (FileNotFoundError, KeyError, zarr.errors.NodeNotFoundError) as exc:
        _refuse_table_file(loc)
        raise StoreNotFoundError(
            f"no zarr array or group at {loc!r}; check the path, or create the data "
            "with `ooc-spectral make-data`"
        ) from exc
    if isinstance(node, zarr.Group):
        what = unfinished_input(node.attrs)
        if what is not None:
            raise IncompleteInputError(f"the data set at {loc!r} is marked incomplete "
                                       f"(complete: false): {what}")
        names = sorted(node.array_keys())
        if DATA_ARRAY_NAME in names:
            return _open_member(loc, DATA_ARRAY_NAME, mode, extra), dict(node.attrs)
        two_d = [k for k in names if node[k].ndim == 2]
        if len(two_d) == 1:
            return _open_member(loc, two_d[0], mode, extra), None
        raise InvalidInputError(
            f"the zarr group at {loc!r} holds {len(two_d)} 2-D arrays ({', '.join(two_d) or 'none'}); "
            f"expected one, or one named {DATA_ARRAY_NAME!r}; pass the array's own path "
            f"(e.g. {loc.rstrip('/')}/NAME)"
        )
    return node, _parent_attrs(loc, extra)


def _parent_attrs(loc: str, extra: dict) -> dict | None:
    """The attributes of the group holding the array ``.../data`` named by its own path (a
    data set's array opened directly is checked against its writer's digests too)."""
    import zarr

    head, _, name = loc.rstrip("/").rpartition("/")
    if name != DATA_ARRAY_NAME or not head:
        return None
    try:
        return dict(zarr.open_group(head, mode="r", **extra).attrs)
    except Exception:  # no group there (a bare array): nothing recorded
        return None


def _array_parent_attrs(arr) -> dict | None:
    """:func:`_parent_attrs` of an open zarr array, local or remote: the group above it is
    read through the array's own store (its credentials and endpoint), or, for an array
    opened at its own path, through a store one level up on the same file system."""
    import zarr

    inner, fs = str(arr.path).rstrip("/"), getattr(arr.store, "fs", None)
    if not inner and fs is None:  # a local store rooted at the array
        return _parent_attrs(array_url(arr), {})
    head, _, name = (inner or str(getattr(arr.store, "path", "")).rstrip("/")).rpartition("/")
    if name != DATA_ARRAY_NAME:
        return None
    try:
        if inner:
            return dict(zarr.open_group(store=arr.store, path=head, mode="r").attrs)
        from zarr.storage import FsspecStore

        return dict(zarr.open_group(FsspecStore(fs, path=head, read_only=True), mode="r").attrs)
    except Exception:  # no group there (a bare array): nothing recorded
        return None


def _writer_digests(arr, attrs: dict | None, loc: str) -> ChunkDigests | None:
    """The per-chunk digests the writer of the data set (``make-data``, ``import``) whose
    group attributes are ``attrs`` recorded for ``arr``, its data array; None for a data
    set without them (written by others, or before digests were recorded).
    :class:`~ooc_spectral.exceptions.DamagedDataError` (exit 2) naming the writer's
    command when the description was edited, or the array resized or rechunked since."""
    from ..exceptions import DamagedDataError
    from .layout import rewrite_input
    from .manifest import recorded_digests

    if not attrs:
        return None
    for key in (DATASET_KEY, IMPORT_KEY):
        repair = (f"{rewrite_input({key: {}})}; or, if its rows were changed or appended to on "
                  f"purpose, make it your own zarr group: delete the attribute {key!r} from "
                  "its zarr.json (it is then read without its writer's digests)")
        try:
            entry = recorded_digests(attrs.get(key), DATA_ARRAY_NAME)
        except ValueError as exc:
            raise DamagedDataError(f"the data set at {loc} is damaged: {exc}; {repair}") from None
        if entry is None:
            continue
        if [list(arr.shape), list(arr.chunks)] != [entry.get("shape"), entry.get("chunks")]:
            raise DamagedDataError(
                f"the data set at {loc} is damaged: its array {DATA_ARRAY_NAME!r} has shape "
                f"{list(arr.shape)} and chunks {list(arr.chunks)}, its writer recorded "
                f"{entry.get('shape')} and {entry.get('chunks')} (resized or replaced since); "
                f"{repair}")
        return ChunkDigests(str(entry.get("run_id")), int(arr.chunks[0]),
                            tuple(int(d) for d in entry["digests"]), repair)
    return None


def _open_member(loc: str, name: str, mode: str, extra: dict):
    """The group's array ``name`` opened from its own metadata. ``node[name]`` would take
    the group's consolidated metadata when it has some, and that may be stale: rows
    appended without consolidating again were silently left out (an outside audit)."""
    import zarr

    from .storage import join

    return zarr.open_array(join(loc, name), mode=mode, **extra)


def _refuse_table_file(loc: str) -> None:
    """Name a Parquet/CSV/.npy/HDF5 file given where a zarr store is expected, and the fix."""
    path = loc.removeprefix("file://")
    fmt = table_format(path)
    if fmt is not None and os.path.isfile(path):
        stem = os.path.splitext(path)[0].removesuffix(".csv")
        raise InvalidInputError(
            f"{loc!r} is a {fmt.upper() if fmt != 'hdf5' else 'HDF5'} file, not a zarr store; "
            f"convert it once, in flat memory: `ooc-spectral import {path} --out {stem}.zarr` "
            "(choose columns with --columns), then use the zarr store; from Python: "
            "ooc_spectral.io.importing.import_table")


def _regular_chunk_starts(n: int, rows: int) -> np.ndarray:
    starts = np.arange(0, n, rows, dtype=np.int64)
    return np.append(starts, n)


def open_source(X) -> DataSource:
    """Wrap ``X`` as a :class:`DataSource`, validating shape and dtype.

    Raises
    ------
    StoreNotFoundError
        ``X`` names a location with no zarr array or group.
    InvalidInputError
        ``X`` is not 2-D, has no rows or no features, or is not real-numeric.
    """
    if isinstance(X, DataSource):
        return X
    if isinstance(X, (str, os.PathLike)):
        arr, attrs = _open_zarr(X)
        return _from_zarr(arr, _writer_digests(arr, attrs, os.fspath(X)))
    if _is_zarr_array(X):  # a data set's array opened by the caller: its digests too
        return _from_zarr(X, _writer_digests(X, _array_parent_attrs(X), array_url(X)))
    if _is_xarray(X):
        # an xarray DataArray: its numpy or dask array (a dask-backed one stays lazy;
        # np.asarray would load it)
        X = X.data
    if _is_sparse(X):
        # densified block by block as the passes read it (the kernels need c x d blocks)
        if len(getattr(X, "shape", ())) == 2 and X.shape[0] and X.shape[1]:
            _validate_meta(X.shape, X.dtype, "the sparse matrix")
        X = _DenseRows(X)
    elif _is_dask_array(X) and _is_sparse(getattr(X, "_meta", None)):
        _validate_meta(X.shape, X.dtype, "the dask array of sparse chunks")
        X = X.map_blocks(_densify, dtype=X.dtype, meta=np.empty((0, 0), dtype=X.dtype))
    if _is_dask_array(X):
        _validate_meta(X.shape, X.dtype, "the dask array")
        if any(np.isnan(c) for c in X.chunks[0]):
            raise InvalidInputError(
                "the dask array has unknown chunk sizes; call X.compute_chunk_sizes() first"
            )
        row_chunks = np.asarray(X.chunks[0], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(row_chunks)])
        return DataSource(
            kind="dask",
            shape=(int(X.shape[0]), int(X.shape[1])),
            dtype=np.dtype(X.dtype),
            chunk_starts=starts,
            storage_chunk_rows=int(row_chunks[0]),
            _dask=X,
        )
    if isinstance(X, _DenseRows):
        n = int(X.shape[0])
        rows = min(n, NUMPY_ALIGN_ROWS)
        return DataSource(kind="numpy", shape=(n, int(X.shape[1])), dtype=X.dtype,
                          chunk_starts=_regular_chunk_starts(n, rows), storage_chunk_rows=rows,
                          _numpy=X)
    if isinstance(X, np.matrix):
        # as scikit-learn's check_array (since 1.2): np.matrix's operators and shapes
        # differ from an ndarray's, so it is refused rather than silently converted
        raise InvalidInputTypeError(
            "np.matrix is not supported; convert it to a numpy array with np.asarray(X)")
    try:
        arr = np.asarray(X)
    except Exception as exc:
        raise InvalidInputError(
            f"cannot use an object of type {type(X).__name__} as X; pass a numpy array, "
            "a dask array, a zarr array or the path of a zarr store"
        ) from exc
    if arr.dtype == object:
        # as scikit-learn does: an object array (or DataFrame of mixed types) of numbers
        # is converted to float64; anything else is named
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError) as exc:
            # a TypeError too, as scikit-learn's check_array raises there
            raise InvalidInputTypeError(
                f"X is an object array that does not convert to numbers ({exc}); pass an "
                "array of a real numeric dtype"
            ) from exc
    _validate_meta(arr.shape, arr.dtype, "the array")
    n = int(arr.shape[0])
    rows = min(n, NUMPY_ALIGN_ROWS)
    return DataSource(
        kind="numpy",
        shape=(n, int(arr.shape[1])),
        dtype=arr.dtype,
        chunk_starts=_regular_chunk_starts(n, rows),
        storage_chunk_rows=rows,
        _numpy=arr,
    )


def _loaded_instance(X, module: str, cls: str) -> bool:
    """``isinstance(X, module.cls)``, recognized without importing ``module``: there is no
    such object unless the module is loaded (importing zarr or dask.array to find out was
    most of a small fit's start-up, issue 38)."""
    mod = sys.modules.get(module)
    return mod is not None and isinstance(X, getattr(mod, cls))


def _is_zarr_array(X) -> bool:
    """A ``zarr.Array``."""
    return _loaded_instance(X, "zarr", "Array")


def _is_dask_array(X) -> bool:
    """A ``dask.array.Array``."""
    return _loaded_instance(X, "dask.array", "Array")


def _is_xarray(X) -> bool:
    """An ``xarray.DataArray`` (recognized without importing xarray)."""
    return type(X).__name__ == "DataArray" and type(X).__module__.split(".")[0] == "xarray"


def _densify(block):
    """A dense ndarray from a sparse block (scipy.sparse or pydata sparse)."""
    if hasattr(block, "toarray"):
        return block.toarray()
    if hasattr(block, "todense"):
        return np.asarray(block.todense())
    return np.asarray(block)


class _DenseRows:
    """An in-memory sparse matrix read as dense rows, one row block at a time.

    Slicing returns a dense ndarray of the rows asked for, so every pass, sample
    and the exact path see dense blocks of c x d values and the whole matrix is
    never densified at once. Values equal ``X.toarray()``'s, so results equal those
    of the dense input.
    """

    ndim = 2

    def __init__(self, X):
        import scipy.sparse

        self._csr = scipy.sparse.csr_array(X) if scipy.sparse.issparse(X) else X
        self.shape = tuple(int(v) for v in X.shape)
        self.dtype = np.dtype(X.dtype)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key, slice(None))
        rows, cols = key
        block = self._csr[rows]
        if cols != slice(None):
            block = block[:, cols]
        return _densify(block)


def _is_sparse(X) -> bool:
    """A ``scipy.sparse`` matrix/array or a ``sparse`` (pydata) array."""
    if X is None:
        return False
    import scipy.sparse

    return scipy.sparse.issparse(X) or type(X).__module__.split(".")[0] == "sparse"


def array_url(arr) -> str:
    """Location of a zarr array: a local path, or the store's URL (``s3://bucket/x.zarr/data``)."""
    store = arr.store
    fs = getattr(store, "fs", None)
    if fs is not None and hasattr(store, "path"):  # an fsspec store: protocol://path
        base = fs.unstrip_protocol(str(store.path).rstrip("/"))
        url = f"{base}/{arr.path}" if arr.path else base
    else:
        url = str(arr.store_path)
    return url[len("file://"):] if url.startswith("file://") else url


def _from_zarr(arr, digests: ChunkDigests | None = None) -> DataSource:
    url = array_url(arr)
    _validate_meta(arr.shape, arr.dtype, f"the zarr array at {url}")
    n = int(arr.shape[0])
    # Sharded arrays: the storage chunk is the shard (one object in the store), so tasks
    # are planned per shard, never per inner chunk: each read then fetches whole objects.
    shards = getattr(arr, "shards", None)
    rows = int((shards or arr.chunks)[0])
    return DataSource(
        kind="zarr",
        shape=(n, int(arr.shape[1])),
        dtype=np.dtype(arr.dtype),
        chunk_starts=_regular_chunk_starts(n, rows),
        storage_chunk_rows=rows,
        url=url,
        digests=digests,
        _zarr=arr,
    )
