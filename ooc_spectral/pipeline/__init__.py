"""Layer 5, the fit's stages over a data source, as dask graphs with checkpoints.

``scan`` (pass 1: the windows read in the seeded order, the greedy scan driven, the
prefix scan completed), ``rpcholesky`` (pass 1 by RP-Cholesky and its completion),
``accumulate`` (pass 2: parallel map and ordered tree reduction, checkpointed per
segment), ``writeback`` (pass 3: ``map_rows`` and the resumable ``EmbeddingOutput``),
``fit`` (``FitRun``: the stages in order, timed, resumable), ``incremental``
(``partial_fit``: batches scanned, extended and re-solved).

May import: :mod:`ooc_spectral.runtime`, :mod:`ooc_spectral.io`,
:mod:`ooc_spectral.core` and the layers below.
"""
