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

__all__ = ["DATA_ARRAY_NAME", "DATASET_KEY", "IMPORT_KEY", "FORMATS", "table_format"]

#: Name of the data array inside a group written by ``make-data`` or ``import``.
DATA_ARRAY_NAME = "data"
#: Group attribute that describes a data set written by :func:`~ooc_spectral.io.datasets.make_data`.
DATASET_KEY = "ooc_spectral_dataset"
#: Attribute of an imported group: source, columns, rows, ``complete``.
IMPORT_KEY = "ooc_spectral_import"
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
