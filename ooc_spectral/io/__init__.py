"""Layer 3, storage and integrity: where data and results live, and how they are checked.

``storage`` (local paths and URLs: s3://, gs://, memory://; locks on object stores),
``layout`` (names of the input groups' arrays and markers), ``integrity``
(checksums, digests, chunk listings, input fingerprints), ``source`` (the input
matrix: numpy, dask, zarr or a path, read row range by row range), ``row_blocks``
(numpy and zarr rows as the passes' tasks, without dask.array), ``zarr_rows``
(a zarr array's rows read where a task runs, retried and checked), ``verify``
(an output re-read chunk by chunk; an input checked where a task runs),
``checkpoint`` (the OUTDIR: lock, run attributes, scan state, pass-2 partials),
``persistence`` (models as zarr arrays and JSON, never pickle), ``importing``
(tables streamed into zarr), ``dataset_specs``, ``dataset_store`` and ``datasets``
(synthetic data streamed to zarr), ``loaders`` (the papers' image files).

May import: :mod:`ooc_spectral.core` and the layers below it; not dask's schedulers
(that is :mod:`ooc_spectral.runtime`).
"""
