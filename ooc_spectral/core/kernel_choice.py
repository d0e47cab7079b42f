"""A kernel by name: building it, choosing its gamma, and saving it as data.

:func:`make_kernel` builds a kernel of :mod:`ooc_spectral.core.kernels` from its name
and parameters; :func:`resolve_gamma` takes a given ``gamma`` or the median heuristic
on a seeded sample of the rows; :func:`kernel_to_attrs` and :func:`kernel_from_attrs`
turn a kernel into JSON-able attributes (plus named arrays) and back, for saved
models, never pickle.
"""

from __future__ import annotations

import logging
from typing import Mapping

import numpy as np
from scipy.spatial.distance import cdist

from ..exceptions import InvalidParameterError
from .kernels import (CallableKernel, CosineKernel, Kernel, LaplacianKernel, LinearKernel,
                      PolynomialKernel, RBFKernel, SubsetNormalizedKernel, _f64, _sq_norms)
from .planning import SAMPLE_PURPOSE, plan_sample

log = logging.getLogger("ooc_spectral")

__all__ = ["KERNELS", "NO_GAMMA", "GAMMA_SAMPLE_SIZE", "make_kernel", "median_heuristic_gamma",
           "resolve_gamma", "kernel_to_attrs", "kernel_from_attrs"]

#: Rows in the seeded sample used by the ``gamma=None`` heuristic.
GAMMA_SAMPLE_SIZE = 1000

KERNELS = ("rbf", "laplacian", "linear", "polynomial", "cosine")
#: Kernels without a gamma (the ``gamma=None`` heuristic leaves them alone).
NO_GAMMA = ("linear", "cosine")


def make_kernel(name, *, gamma: float | None = None, degree: int = 3, coef0: float = 1.0,
                kernel_params=None) -> Kernel:
    """Build a base kernel by name (or from a callable); ``gamma`` must already be resolved.

    ``kernel_params`` are the keyword arguments of a callable kernel.
    """
    if callable(name):
        return CallableKernel(name, tuple(sorted(dict(kernel_params or {}).items())))
    if name == "cosine":
        return CosineKernel()
    if name == "rbf":
        return RBFKernel(float(gamma))
    if name == "laplacian":
        return LaplacianKernel(float(gamma))
    if name == "linear":
        return LinearKernel()
    if name == "polynomial":
        return PolynomialKernel(float(gamma), int(degree), float(coef0))
    raise InvalidParameterError(
        f"kernel={name!r} is not a known kernel; expected one of {', '.join(KERNELS)}"
    )


def median_heuristic_gamma(kernel: str, sample: np.ndarray) -> float | None:
    """The ``gamma=None`` heuristic, on a seeded sample of rows.

    - ``rbf``: ``1 / median ||x - y||^2`` over distinct pairs of the sample, so a
      typical pair has ``k = exp(-1)``;
    - ``laplacian``: ``1 / median ||x - y||_1``;
    - ``polynomial``: ``1 / median ||x||^2`` so that ``gamma x.y`` is of order one;
    - ``linear``: no gamma (returns None).

    A sample whose pairwise distances are all zero falls back to ``gamma = 1``.
    """
    if callable(kernel) or kernel in NO_GAMMA:
        return None
    X = _f64(sample)
    if kernel == "polynomial":
        med = float(np.median(_sq_norms(X)))
    else:
        metric = "sqeuclidean" if kernel == "rbf" else "cityblock"
        d = cdist(X, X, metric=metric)
        iu = np.triu_indices(X.shape[0], k=1)
        med = float(np.median(d[iu])) if iu[0].size else 0.0
    if not np.isfinite(med) or med <= 0.0:
        return 1.0
    return 1.0 / med


def resolve_gamma(kernel: str, gamma: float | None, source, seed: int) -> float | None:
    """``gamma`` as given, or :func:`median_heuristic_gamma` on the seeded sample of
    :data:`GAMMA_SAMPLE_SIZE` rows of ``source`` (a
    :class:`~ooc_spectral.io.source.DataSource`); None for the linear kernel."""
    if callable(kernel) or kernel in NO_GAMMA:
        return None
    if gamma is None:
        rows = plan_sample(source.n_rows, GAMMA_SAMPLE_SIZE, seed, SAMPLE_PURPOSE["gamma"])
        gamma = median_heuristic_gamma(kernel, source.read_index(rows))
        log.info("gamma=None: median heuristic on %d rows gives gamma=%.6g", len(rows), gamma)
    return float(gamma)


def kernel_to_attrs(kernel: Kernel) -> tuple[dict, dict[str, np.ndarray]]:
    """JSON attributes and named arrays describing ``kernel`` (for persistence).

    Raises :class:`~ooc_spectral.exceptions.ModelNotSavableError` for a
    :class:`CallableKernel`: code cannot be saved as data without pickle.
    """
    if isinstance(kernel, CallableKernel):
        from ..exceptions import ModelNotSavableError

        raise ModelNotSavableError(
            f"the model's kernel is the Python callable {kernel.params['function']!r}, which "
            "cannot be saved without pickle (a saved model is zarr arrays and JSON, never "
            "code); nothing was written. Keep the fitted estimator in memory, refit after "
            "loading, or write the kernel as a built-in one (kernel='rbf', 'laplacian', "
            "'linear', 'polynomial' or 'cosine')")
    if isinstance(kernel, SubsetNormalizedKernel):
        base_attrs, _ = kernel_to_attrs(kernel.base)
        return {"name": kernel.name, "base": base_attrs}, {"kernel_subset": kernel.subset}
    return {"name": kernel.name, **kernel.params}, {}


def kernel_from_attrs(attrs: Mapping, arrays: Mapping[str, np.ndarray]) -> Kernel:
    """Inverse of :func:`kernel_to_attrs`."""
    name = attrs["name"]
    if name == SubsetNormalizedKernel.name:
        base = kernel_from_attrs(attrs["base"], arrays)
        return SubsetNormalizedKernel(base, np.asarray(arrays["kernel_subset"], dtype=np.float64))
    params = {k: v for k, v in attrs.items() if k != "name"}
    return make_kernel(name, **params)
