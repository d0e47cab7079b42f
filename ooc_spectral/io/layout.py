"""Names of the zarr layouts the package reads as input, and the files it imports.

An input group (what ``ooc-spectral make-data`` and ``ooc-spectral import`` write,
and what :func:`~ooc_spectral.io.source.open_zarr_array` opens) holds its rows in
the array :data:`DATA_ARRAY_NAME`; its writer marks it with an attribute
(:data:`DATASET_KEY` or :data:`IMPORT_KEY`) holding ``complete: false`` until the
last row is written, so that a reader refuses a half-written input. The writers and
the reader take the names from here.

:data:`FORMATS` are the table files ``ooc-spectral import`` converts (a reader given
one where a zarr store is expected names the conversion).
"""

from __future__ import annotations

import os

__all__ = ["DATA_ARRAY_NAME", "DATASET_KEY", "IMPORT_KEY", "FORMATS", "table_format",
           "unfinished_input", "rewrite_input"]

#: Name of the data array inside a group written by ``make-data`` or ``import``.
DATA_ARRAY_NAME = "data"
#: Group attribute that describes a data set written by :func:`~ooc_spectral.io.datasets.make_data`.
DATASET_KEY = "ooc_spectral_dataset"
#: Attribute of an imported group: source, columns, rows, ``complete``.
IMPORT_KEY = "ooc_spectral_import"
#: What a reader says of an input group whose writer (the key of its attribute) marked it
#: ``complete: false``, and the command that writes a damaged one again.
_UNFINISHED = {IMPORT_KEY: "`ooc-spectral import` was interrupted, failed or is still writing; "
               "run the import again with --overwrite",
               DATASET_KEY: "make-data was interrupted or is still writing; wait for it, or run "
               "make-data again with --overwrite"}
_REWRITE = {IMPORT_KEY: "run the same `ooc-spectral import` command again (it checks what "
                        "is there and writes it again)",
            DATASET_KEY: "run the same `ooc-spectral make-data` command again (it checks what "
                         "is there and writes it again)"}
#: Formats by file suffix.
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "csv",
           ".csv.gz": "csv", ".npy": "npy", ".h5": "hdf5", ".hdf5": "hdf5", ".hdf": "hdf5"}


def table_format(path: str | os.PathLike) -> str | None:
    """The format of ``path`` from its suffix (None when not a known table format)."""
    name = os.fspath(path).lower()
    for suffix in sorted(FORMATS, key=len, reverse=True):
        if name.endswith(suffix):
            return FORMATS[suffix]
    return None


def unfinished_input(attrs) -> str | None:
    """What happened to the input group of attributes ``attrs`` and what to run, when its
    writer marked it ``complete: false`` (interrupted, failed or still writing); else None.
    The readers (a fit's input, ``verify``) give the same advice."""
    for key, advice in _UNFINISHED.items():
        writer = attrs.get(key)
        if isinstance(writer, dict) and writer.get("complete") is False:
            return advice
    return None


def rewrite_input(attrs) -> str | None:
    """The command that writes the input group of attributes ``attrs`` again (its
    writer's), or None for a group that no writer of ours marked."""
    return next((how for key, how in _REWRITE.items() if isinstance(attrs.get(key), dict)),
                None)
