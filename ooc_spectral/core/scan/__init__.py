"""Pass 1 on rows in memory: the dictionary selection, one block of rows at a time.

``state`` (the growing dictionary: points, Cholesky factor, ``w``, ``beta``),
``blocked`` (the greedy scan of Algorithm 1, blocked: one kernel block and one
triangular solve per block of rows), ``local_certificate`` (bounds that let the scan
skip rows within tol), ``search`` (Algorithm 2: a dictionary of a requested size),
``rpcholesky`` (randomly pivoted Cholesky on a sample). Reading the rows from a
source window by window is the pipeline's (:mod:`ooc_spectral.pipeline.scan`).

May import: the rest of :mod:`ooc_spectral.core` and the layers below it.
"""
