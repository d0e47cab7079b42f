"""Layer 2, the numerical core: pure NumPy and SciPy on in-memory blocks.

What every stage computes, with no dask, zarr or file system in sight:
``planning`` (visiting order, tasks, sub-blocks, samples: arithmetic), ``kernels``
and ``kernel_choice`` (kernel blocks in float64; a kernel by name), ``config`` (the
fit's parameters, declared once), ``scan/`` (pass 1 on rows in memory: the growing
dictionary, the blocked scan, local certificates, Algorithm 2, RP-Cholesky),
``statistics`` and ``pass2`` (pass 2's typed statistics and its per-chunk functions,
``(block, small state) -> statistic``), ``eigensolve`` (the m x m solve), ``checks``
(the run-time checks between stages), ``model`` (the frozen ``Dictionary`` and the
``SpectralMap`` that pass 3 and ``transform`` apply), ``preimage`` (the map of
``inverse_transform``).

May import: :mod:`ooc_spectral.exceptions`, the base helpers (``_validation``,
``_params``) and :mod:`ooc_spectral._accel`.
"""
