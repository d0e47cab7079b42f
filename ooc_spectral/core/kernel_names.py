"""The built-in kernels' names, without importing NumPy or SciPy.

The command line builds its ``--kernel`` choices from :data:`KERNELS` before any
numerical module is imported (``ooc-spectral --help`` and argument errors answer
at once, issue 38); :mod:`ooc_spectral.core.kernel_choice` builds the kernels.
"""

from __future__ import annotations

__all__ = ["KERNELS", "KERNEL_ALIASES", "NO_GAMMA", "canonical_kernel"]

KERNELS = ("rbf", "laplacian", "linear", "polynomial", "cosine")
#: Other names of the kernels: scikit-learn's ``KernelPCA`` and ``pairwise_kernels`` call
#: the polynomial kernel ``"poly"`` (same formula, same ``gamma``, ``degree``, ``coef0``).
KERNEL_ALIASES = {"poly": "polynomial"}
#: Kernels without a gamma (the ``gamma=None`` heuristic leaves them alone).
NO_GAMMA = ("linear", "cosine")


def canonical_kernel(name):
    """The kernel's own name for ``name`` (``"poly"`` is ``"polynomial"``); anything else,
    a callable included, as it is."""
    return KERNEL_ALIASES.get(name, name) if isinstance(name, str) else name
