"""Synthetic data sets of the papers: :func:`generate` in memory, :func:`make_data` streamed
to zarr, :func:`open_dataset` to read one back.

The public path of :mod:`ooc_spectral.io.datasets`, where the data sets, their
formulas and the streaming writer are; every name of its ``__all__`` is here.
"""

from .io.datasets import (DATASET_KEY, DATASETS, GENERATION_BLOCK_ROWS, Block, DatasetSpec,
                          LabelSpec, blob_centers, default_chunk_rows, generate, halo_geometry,
                          make_data, open_dataset)

__all__ = ["DATASETS", "DATASET_KEY", "GENERATION_BLOCK_ROWS", "Block", "DatasetSpec", "LabelSpec",
           "blob_centers", "default_chunk_rows", "generate", "halo_geometry", "make_data",
           "open_dataset"]
