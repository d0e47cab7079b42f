"""``ooc-spectral import``: stream a table (Parquet, CSV, .npy, HDF5) into a zarr array.

The rows are read in batches (pyarrow's ``ParquetFile.iter_batches``, pandas'
``read_csv(chunksize=...)``, a memory map of the .npy file, h5py slices of an HDF5
dataset) and written batch by batch to the array ``data`` of a zarr v3 group
(dimension names ``sample`` and ``feature``, so ``xarray.open_zarr`` opens it),
so memory stays flat in the number of rows: one batch at a time.

Columns: names for Parquet and CSV (default: every numeric column), indices for
.npy, HDF5 and a CSV without a header line (default: all). A CSV's first line is
its header unless every one of its cells is a number (then it is data, with a
warning; ``header`` decides explicitly). Values are stored in ``dtype`` (float64 by
default); a column that does not convert to numbers is refused with its name. The
group's attribute ``ooc_spectral_import`` records the source and the columns,
with ``complete: false`` until the last batch is written: an interrupted import
is refused as input (:class:`~ooc_spectral.exceptions.IncompleteInputError`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import uuid
from typing import Iterator, Sequence

import numpy as np

from .dataset_store import create_group
from ..exceptions import InvalidInputError, InvalidParameterError
from .layout import DATA_ARRAY_NAME, IMPORT_KEY, table_format
from .source import check_real_dtype

log = logging.getLogger("ooc_spectral")

__all__ = ["import_table"]

#: Rows per batch read and written (a multiple of the chunk rows).
DEFAULT_CHUNK_ROWS = 65536


def _numeric(block: np.ndarray, names: Sequence, dtype) -> np.ndarray:
    if isinstance(block, np.ndarray) and block.dtype.kind == "c":
        check_real_dtype(block.dtype, "the input")  # never cast away an imaginary part
    try:
        return np.ascontiguousarray(block, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"the columns {list(names)} do not all convert to numbers ({exc}); choose numeric "
            "columns with --columns") from exc


# --------------------------------------------------------------------------- #
# readers: (column names, number of rows or None, iterator of 2-D batches)
# --------------------------------------------------------------------------- #
def _need(module: str, extra: str = "tables"):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        from ..exceptions import StorageBackendError

        raise StorageBackendError(
            f"reading this format needs {module.split('.')[0]}: pip install "
            f"'ooc_spectral[{extra}]'") from None


def _table_columns(path, columns, names: list, numeric: list) -> list:
    """The named columns checked against the table's ``names``, or (``columns`` None)
    its ``numeric`` ones."""
    if columns is None:
        columns = numeric
        if not columns:
            raise InvalidInputError(f"{path} has no numeric column; choose columns with --columns")
    missing = [c for c in columns if c not in names]
    if missing:
        raise InvalidInputError(f"{path} has no column {missing[0]!r}; its columns are "
                                f"{', '.join(map(str, names))}")
    return columns


def _parquet(path, columns, batch_rows):
    pa = _need("pyarrow")
    pq = _need("pyarrow.parquet")

    pf = pq.ParquetFile(path, pre_buffer=False)  # pre-buffering reads the whole file
    schema = pf.schema_arrow
    numeric = [f.name for f in schema if pa.types.is_integer(f.type)
               or pa.types.is_floating(f.type) or pa.types.is_boolean(f.type)]
    columns = _table_columns(path, columns, schema.names, numeric)

    def batches():
        for batch in pf.iter_batches(batch_size=batch_rows, columns=list(columns)):
            if batch.num_rows:
                cols = [batch.column(c).to_numpy(zero_copy_only=False) for c in columns]
                yield np.column_stack(cols)

    return list(columns), int(pf.metadata.num_rows), batches()


def _csv(path, columns, batch_rows, header):
    pd = _need("pandas")

    sep = "\t" if os.fspath(path).lower().endswith(".tsv") else ","
    # exact decimal round trip: pandas 3's default; older pandas needs asking for it
    exact = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}
    with _csv_errors(path, pd):
        if header is None:
            header = _first_line_is_a_header(path, sep, pd)
        head = pd.read_csv(path, sep=sep, nrows=256, header=0 if header else None, **exact)
    numeric = [c for c in head.columns if pd.api.types.is_numeric_dtype(head[c])]
    if columns is not None and not header:  # no names: the columns are numbered
        columns = _indices(columns, len(head.columns), path)
    if columns is None:
        _mostly_numeric_is_an_error(path, head, numeric, pd)
    columns = _table_columns(path, columns, list(head.columns), numeric)

    def batches():
        # every column read (no usecols): pandas then refuses a line of extra fields, which
        # usecols would silently cut to the columns chosen
        with _csv_errors(path, pd):
            for frame in pd.read_csv(path, sep=sep, chunksize=batch_rows,
                                     header=0 if header else None, **exact):
                yield frame[list(columns)].to_numpy()

    return list(columns), None, batches()


def _first_line_is_a_header(path, sep, pd) -> bool:
    """Whether the CSV's first line names the columns: it does unless every one of its
    cells is a number. A headerless export of numbers lost its first row to the header
    silently (an outside audit); numeric column names need ``header=True``."""
    first = pd.read_csv(path, sep=sep, header=None, nrows=1, dtype=str, keep_default_na=False)
    if first.empty:
        return True
    cells = first.iloc[0]
    if pd.to_numeric(cells.str.strip(), errors="coerce").notna().all():
        log.warning("%s: the first line (%s) is all numbers, so it is read as data and the "
                    "columns are numbered from 0; pass --header if it names the columns "
                    "(--no-header silences this)", path, ", ".join(cells))
        return False
    return True


@contextlib.contextmanager
def _csv_errors(path, pd):
    """A malformed CSV (a row of more fields than the header, an empty or binary file)
    as an input error naming the file, the line and the fix, not a library exception
    (exit 1, "transient", before: an outside audit)."""
    try:
        yield
    except pd.errors.EmptyDataError as exc:
        raise InvalidInputError(f"{path} is empty (no header and no rows); expected a table "
                                "of numbers: check that the export finished") from exc
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}); expected a CSV table: "
            "check the file (is it compressed, or another format? pass --format)") from exc
    except pd.errors.ParserError as exc:
        m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(exc))
        where = (f"line {m[2]} has {m[3]} fields where the first line has {m[1]}" if m
                 else f"the file does not parse as a table ({_one_line(exc)})")
        raise InvalidInputError(
            f"{path}: {where}; expected the same number of fields on every line: fix that "
            "line (an extra separator, or a separator inside an unquoted value), or export "
            "the table again") from exc


def _one_line(exc) -> str:
    return " ".join(str(exc).split())


def _mostly_numeric_is_an_error(path, head, numeric: list, pd) -> None:
    """With no ``--columns``, the numeric columns are imported and text ones skipped. A
    column of numbers with one bad value among its first rows (``1.2x``) is not a text
    column: skipping it silently dropped a feature (an outside audit), so it is an
    error naming the value; true text columns are named in the log."""
    skipped = []
    for c in head.columns:
        if c in numeric:
            continue
        values = head[c].dropna()
        parsed = pd.to_numeric(values, errors="coerce")
        if len(values) and parsed.notna().mean() >= 0.5:
            row = int(parsed.index[parsed.isna()][0])
            raise InvalidInputError(
                f"{path}: column {c!r} holds numbers, but row {row} holds {values[row]!r}, "
                "which is not one; fix that value, or choose the columns to import with "
                "--columns (leaving this one out)")
        skipped.append(str(c))
    if skipped:
        log.warning("%s: skipping the non-numeric column(s) %s (choose columns with --columns)",
                    path, ", ".join(skipped))


def _indices(columns, d: int, path) -> list[int]:
    if columns is None:
        return list(range(d))
    try:
        idx = [int(c) for c in columns]
    except (TypeError, ValueError):
        raise InvalidParameterError(
            f"{path} is an array without column names: give columns as indices "
            f"(e.g. --columns 0,2), not {list(columns)}") from None
    bad = [i for i in idx if not -d <= i < d]
    if bad:
        raise InvalidParameterError(f"column {bad[0]} is out of range for {path} ({d} columns)")
    return [i % d for i in idx]


def _array_batches(arr, idx, n, batch_rows) -> Iterator[np.ndarray]:
    for a in range(0, n, batch_rows):
        block = np.asarray(arr[a:min(a + batch_rows, n)])
        yield block[:, idx]


def _npy_header(path) -> tuple[tuple, np.dtype]:
    """The shape and dtype in a .npy file's header, read without loading the array."""
    from numpy.lib import format as npy_format

    try:
        with open(path, "rb") as f:
            version = npy_format.read_magic(f)
            read = (npy_format.read_array_header_1_0 if version == (1, 0)
                    else npy_format.read_array_header_2_0)
            shape, _, dtype = read(f)
    except (ValueError, EOFError) as exc:
        raise InvalidInputError(
            f"{path} is not a readable .npy file ({_one_line(exc)}); expected an array saved "
            "with numpy.save: check the file, or pass --format for another format") from exc
    return shape, dtype


def _npy(path, columns, batch_rows):
    shape, dtype = _npy_header(path)
    if len(shape) != 2:
        raise InvalidInputError(f"{path} holds a {len(shape)}-D array of shape {shape}; "
                                "expected 2-D (rows, columns)")
    check_real_dtype(dtype, path)  # before loading: an object array is never unpickled
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:  # e.g. a truncated file: shorter than its header says
        raise InvalidInputError(f"{path} cannot be read as its header describes "
                                f"({_one_line(exc)}); the file is damaged or truncated: save "
                                "it again") from exc
    idx = _indices(columns, arr.shape[1], path)
    return idx, int(arr.shape[0]), _array_batches(arr, idx, arr.shape[0], batch_rows)


def _hdf5(path, columns, batch_rows, dataset):
    h5py = _need("h5py")

    f = h5py.File(path, "r")
    if dataset is None:
        found = []
        f.visititems(lambda name, obj: found.append(name)
                     if isinstance(obj, h5py.Dataset) and obj.ndim == 2 else None)
        if len(found) != 1:
            f.close()
            raise InvalidParameterError(
                f"{path} holds {len(found)} 2-D datasets ({', '.join(found) or 'none'}); name one "
                "with --dataset")
        dataset = found[0]
    if dataset not in f or not isinstance(f[dataset], h5py.Dataset):
        f.close()
        raise InvalidInputError(f"{path} has no dataset {dataset!r}")
    arr = f[dataset]
    if arr.ndim != 2:
        f.close()
        raise InvalidInputError(f"the dataset {dataset!r} of {path} is {arr.ndim}-D; expected 2-D")
    try:
        check_real_dtype(arr.dtype, f"{path} (dataset {dataset!r})")
    except InvalidInputError:
        f.close()
        raise
    idx = _indices(columns, arr.shape[1], path)

    def batches():
        try:
            yield from _array_batches(arr, idx, arr.shape[0], batch_rows)
        finally:
            f.close()

    return idx, int(arr.shape[0]), batches()


def import_table(source: str | os.PathLike, out: str | os.PathLike, *,
                 columns: Sequence | None = None, format: str | None = None,
                 dataset: str | None = None, chunk_rows: int | None = None,
                 dtype="float64", overwrite: bool = False, header: bool | None = None) -> dict:
    """Stream the table ``source`` into the zarr group ``out`` (array ``data``).

    Parameters
    ----------
    source : path
        A Parquet, CSV (or TSV), .npy or HDF5 file.
    out : path or URL
        The zarr group to create.
    columns : sequence, optional
        Column names (Parquet, CSV) or indices (.npy, HDF5); default: every
        numeric column.
    format : {"parquet", "csv", "npy", "hdf5"}, optional
        Default: from the file's suffix.
    dataset : str, optional
        HDF5: the 2-D dataset (default: the only one).
    chunk_rows : int, optional
        Rows per zarr chunk (default 65536); batches are this many rows.
    dtype : {"float64", "float32"}
    overwrite : bool
        Replace an existing store at ``out``.
    header : bool, optional
        CSV: whether the first line names the columns. Default: it does unless every
        one of its cells is a number (then it is data, the columns are numbered from
        0, and a warning says so).

    Returns
    -------
    dict
        ``{"out", "n", "columns", "format"}``.
    """
    from .integrity import InputWatch, checksummed, file_fingerprint
    from .manifest import DigestingArrays, seal_description

    src = os.fspath(source)
    if not os.path.isfile(src):
        raise InvalidInputError(f"no file at {src!r}; check the path")
    watch = InputWatch(lambda: file_fingerprint(src), src)  # checked before complete: true
    fmt = format or table_format(src)
    if fmt not in ("parquet", "csv", "npy", "hdf5"):
        raise InvalidParameterError(
            f"cannot tell the format of {src!r} from its name; pass --format parquet, csv, npy "
            "or hdf5")
    dt = np.dtype(dtype)
    if dt.name not in ("float32", "float64"):
        raise InvalidParameterError(f"dtype={dtype!r}: expected float32 or float64")
    rows = int(chunk_rows or DEFAULT_CHUNK_ROWS)
    if rows < 1:
        raise InvalidParameterError(f"chunk_rows={rows} must be at least 1")
    if columns is not None and len(columns) == 0:
        raise InvalidParameterError("columns is empty; name at least one column")
    with watch.guard():
        if fmt == "parquet":
            names, n, batches = _parquet(src, columns, rows)
        elif fmt == "csv":
            names, n, batches = _csv(src, columns, rows, header)
        elif fmt == "npy":
            names, n, batches = _npy(src, columns, rows)
        else:
            names, n, batches = _hdf5(src, columns, rows, dataset)
    d = len(names)
    loc = os.fspath(out)
    meta = {"source": os.path.abspath(src), "format": fmt,
            "columns": [str(c) if fmt in ("parquet", "csv") else int(c) for c in names],
            "dtype": dt.name, "chunk_rows": rows}
    meta["source_fingerprint"] = watch.fingerprint
    if not overwrite:
        done, overwrite = _take_up(loc, meta)
        if done is not None:
            return done
    group = create_group(loc, overwrite, {IMPORT_KEY: {**meta, "complete": False}})
    arrays = DigestingArrays({DATA_ARRAY_NAME: group.create_array(
        DATA_ARRAY_NAME, shape=(n or 0, d), chunks=(rows, d), dtype=dt,
        dimension_names=("sample", "feature"),
        **checksummed())}, uuid.uuid4().hex)  # every chunk stored: an absent one is damage
    with watch.guard():  # a table rewritten under the reader: exit 1, not its torn rows
        written = _store_rows(arrays[DATA_ARRAY_NAME], batches, names, dt, n, src, loc)
    watch.check()  # every row stored is of the file as it was when the import began
    group.attrs[IMPORT_KEY] = seal_description({**meta, "n": written, "complete": True,
                                                "members": arrays.entries()})
    return {"out": loc, "n": written, "columns": meta["columns"], "format": fmt}


def _store_rows(arr, batches, names, dt, n: int | None, src: str, loc: str) -> int:
    """Write ``batches`` into ``arr`` row after row; the number of rows written. A row that
    is not finite, or a count other than the announced ``n``, is an :class:`InvalidInputError`."""
    written, d = 0, arr.shape[1]
    for block in batches:
        block = _numeric(block, names, dt)
        if not np.isfinite(block).all():
            local = int(np.flatnonzero(~np.isfinite(block).all(axis=1))[0])
            raise InvalidInputError(
                f"row {written + local} of {src} has a missing or non-finite value; the "
                "embedding needs finite numbers: fill or drop those rows first (the output "
                f"at {loc} is marked incomplete)")
        end = written + block.shape[0]
        if n is None and end > arr.shape[0]:  # CSV: the row count is known at the end
            arr.resize((end, d))
        arr[written:end] = block
        written = end
    if n is not None and written != n:
        raise InvalidInputError(f"{src} announced {n} rows but {written} were read")
    if n is None and arr.shape[0] != written:
        arr.resize((written, d))
    if written == 0:
        raise InvalidInputError(f"{src} has no rows")
    return written


def _take_up(loc: str, meta: dict) -> tuple[dict | None, bool]:
    """What the same import finds at ``loc``: ``(result, False)`` when it holds the complete,
    intact import of this file as it is now (nothing to do); ``(None, True)`` when it holds
    this import unfinished, damaged since, or of the file before it changed (written
    again); ``(None, False)`` otherwise (a new output, or one that is not this import:
    :func:`~ooc_spectral.io.dataset_store.create_group` refuses it)."""
    import zarr

    from .dataset_store import intact_dataset
    from .manifest import description_damaged

    try:
        found = dict(zarr.open_group(loc, mode="r").attrs.get(IMPORT_KEY) or {})
    except Exception:
        return None, False
    if description_damaged(found):
        log.warning("the description of the import in %s was edited since it was written: "
                    "importing again", loc)
        return None, True
    if {k: found.get(k) for k in meta if k != "source_fingerprint"} != \
            {k: v for k, v in meta.items() if k != "source_fingerprint"}:
        return None, False
    if not found.get("complete"):
        log.warning("%s holds this import unfinished: importing again", loc)
        return None, True
    if found.get("source_fingerprint") != meta["source_fingerprint"]:
        log.warning("%s changed since it was imported into %s: importing it again",
                    meta["source"], loc)
        return None, True
    if not intact_dataset(loc, IMPORT_KEY):
        return None, True
    log.info("%s already holds the complete import of %s (checked as verify does: intact)",
             loc, meta["source"])
    return {"out": loc, "n": int(found["n"]), "columns": meta["columns"],
            "format": meta["format"]}, False
