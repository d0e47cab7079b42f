"""Layer 1, the compiled and BLAS helpers: pure NumPy, ctypes and numba.

``blas`` (the passes' level-3 operations on SciPy's OpenBLAS or Intel MKL),
``ctypes_blas`` (SciPy's BLAS routines called with the GIL released), ``threads``
(BLAS thread counts), ``fused`` and ``fused_numba`` (one-pass loops compiled by numba,
NumPy otherwise), ``support`` (loading an optional library once, config flags).

May import: :mod:`ooc_spectral.exceptions` and the base helpers; nothing above.
"""
