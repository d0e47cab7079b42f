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

from ..exceptions import InvalidInputError, InvalidParameterError
from .callable_kernel import CallableKernel
from .kernel_names import KERNEL_ALIASES, KERNELS, NO_GAMMA, canonical_kernel
from .kernels import (CosineKernel, Kernel, LaplacianKernel, LinearKernel,
                      PolynomialKernel, RBFKernel, SubsetNormalizedKernel, _f64, _sq_norms,
                      overflow_error)
from .planning import SAMPLE_PURPOSE, plan_sample

log = logging.getLogger("ooc_spectral")

__all__ = ["KERNELS", "KERNEL_ALIASES", "canonical_kernel", "NO_GAMMA", "GAMMA_SAMPLE_SIZE", "make_kernel", "median_heuristic_gamma",
           "resolve_gamma", "kernel_to_attrs", "kernel_from_attrs", "takes_center", "data_center", "resolve_kernel"]

#: Rows in the seeded sample used by the ``gamma=None`` heuristic.
GAMMA_SAMPLE_SIZE = 1000



def make_kernel(name, *, gamma: float | None = None, degree: int = 3, coef0: float = 1.0,
                kernel_params=None, center=None) -> Kernel:
    """Build a base kernel by name (or from a callable); ``gamma`` must already be resolved.

    ``kernel_params`` are the keyword arguments of a callable kernel. ``center`` (a
    vector or None) goes to the kernels that take one (rbf, linear, degree-1
    polynomial: :class:`~ooc_spectral.core.kernels._Centred`); the others ignore it.
    """
    c = None if center is None else tuple(float(v) for v in np.asarray(center, dtype=np.float64))
    name = canonical_kernel(name)
    if callable(name):
        return CallableKernel(name, tuple(sorted(dict(kernel_params or {}).items())))
    if name == "cosine":
        return CosineKernel()
    if name == "rbf":
        return RBFKernel(float(gamma), c)
    if name == "laplacian":
        return LaplacianKernel(float(gamma))
    if name == "linear":
        return LinearKernel(c)
    if name == "polynomial":
        return PolynomialKernel(float(gamma), int(degree), float(coef0),
                                c if int(degree) == 1 else None)
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
    med = _median_measure(kernel, X)
    if np.isfinite(med) and med > 0.0 and np.isfinite(1.0 / med):
        return 1.0 / med
    # zero, subnormal or overflowing: look again at unit scale (an exact power of two)
    top = float(np.abs(X).max()) if X.size else 0.0
    if not np.isfinite(top) or top == 0.0:
        return 1.0
    e = -int(np.floor(np.log2(top)))  # X * 2**e exactly (ldexp: 2**e itself may overflow)
    med_unit = _median_measure(kernel, np.ldexp(X, e))
    if not med_unit > 0.0:  # the sampled rows are all equal: any gamma
        return 1.0
    k = 2 if kernel in ("polynomial", "rbf") else 1  # squared distances, or L1
    log_med = np.log10(med_unit) - k * e * np.log10(2.0)
    if log_med > 0:  # too large: the input check names the row whose norm overflows
        return 1.0
    what = {"polynomial": "squared norm of the", "rbf": "squared distance between"}.get(
        kernel, "distance between")
    # the power of ten that brings the median to about 1, within what a float64 holds
    power = min(round(-log_med / k), 300)
    raise InvalidInputError(
        f"the data are too small in scale for float64: the median {what} sampled rows is "
        f"about 1e{round(log_med)}, and the median-heuristic gamma (its inverse) overflows "
        f"(no gamma can help at this scale); multiply the data by 1e{power}")


def _median_measure(kernel: str, X: np.ndarray) -> float:
    """The median the heuristic inverts: of squared norms (polynomial), of squared
    distances (rbf) or of L1 distances (laplacian) over distinct pairs of rows."""
    if kernel == "polynomial":
        return float(np.median(_sq_norms(X)))
    from scipy.spatial.distance import pdist

    # each distinct pair once (the upper triangle of cdist's matrix, the same values)
    d = pdist(X, metric="sqeuclidean" if kernel == "rbf" else "cityblock")
    return float(np.median(d)) if d.size else 0.0


def resolve_gamma(kernel: str, gamma: float | None, source, seed: int,
                  sample: np.ndarray | None = None) -> float | None:
    """``gamma`` as given, or :func:`median_heuristic_gamma` on the seeded sample of
    :data:`GAMMA_SAMPLE_SIZE` rows of ``source`` (a
    :class:`~ooc_spectral.io.source.DataSource`; ``sample``: those rows, already read);
    None for the linear kernel."""
    if callable(kernel) or kernel in NO_GAMMA:
        return None
    if gamma is None:
        rows = plan_sample(source.n_rows, GAMMA_SAMPLE_SIZE, seed, SAMPLE_PURPOSE["gamma"])
        if sample is None:
            sample = source.read_index(rows)
        gamma = median_heuristic_gamma(kernel, sample)
        log.info("gamma=None: median heuristic on %d rows gives gamma=%.6g", len(rows), gamma)
    return float(gamma)


def resolve_kernel(config, source) -> tuple[Kernel, float | None]:
    """The fit's base kernel: its gamma (:func:`resolve_gamma`) and, where it takes one
    (:func:`takes_center`), its centre, both from one read of the seeded sample of
    :data:`GAMMA_SAMPLE_SIZE` rows. ``config`` is a
    :class:`~ooc_spectral.core.config.FitConfig`, ``source`` a data source."""
    c = config
    centred = takes_center(c.kernel, c.normalization, c.degree)
    sample = None
    if centred or (c.gamma is None and not (callable(c.kernel) or c.kernel in NO_GAMMA)):
        rows = plan_sample(source.n_rows, GAMMA_SAMPLE_SIZE, c.random_state, SAMPLE_PURPOSE["gamma"])
        sample = source.read_index(rows)
    center = data_center(sample) if centred else None
    # the rows as the kernel will see them, moved once
    moved = sample if center is None else np.asarray(sample, dtype=np.float64) - center
    if center is not None:
        _check_moved(sample, moved, rows)
    # the heuristic sees the rows as the kernel will (a polynomial's 1 / median |x|^2 of
    # the moved rows; the distances of rbf and laplacian do not move)
    try:
        gamma = resolve_gamma(c.kernel, c.gamma, source, c.random_state, sample=moved)
    except InvalidInputError as exc:  # a sample row past float64: named by its number
        named = None if sample is None else overflow_error(np.asarray(sample, float), rows)
        if named is None:
            raise
        raise named from exc
    kernel = make_kernel(c.kernel, gamma=gamma, degree=c.degree, coef0=c.coef0,
                         kernel_params=c.kernel_params, center=center)
    return kernel, gamma


def _check_moved(sample: np.ndarray, moved: np.ndarray, rows: np.ndarray) -> None:
    """A sample row whose squared norm is past float64 moves the centre (the sample's mean)
    out of range for every row (``moved``: the sample less the centre): the error names that
    row (by its number in the data set), not the first row the kernel meets."""
    S = np.asarray(sample, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        sq = np.einsum("ij,ij->i", moved, moved)
    if np.isfinite(sq).all():
        return
    far = int(np.argmax(np.max(np.abs(S), axis=1)))
    err = overflow_error(S[far:far + 1], np.asarray(rows)[far:far + 1])
    if err is not None:
        raise err


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
        base_attrs, arrays = kernel_to_attrs(kernel.base)
        return {"name": kernel.name, "base": base_attrs}, {**arrays, "kernel_subset": kernel.subset}
    center = getattr(kernel, "center", None)
    arrays = {} if center is None else {"kernel_center": np.asarray(center, dtype=np.float64)}
    return {"name": kernel.name, **kernel.params}, arrays


def kernel_from_attrs(attrs: Mapping, arrays: Mapping[str, np.ndarray]) -> Kernel:
    """Inverse of :func:`kernel_to_attrs`."""
    name = attrs["name"]
    if name == SubsetNormalizedKernel.name:
        base = kernel_from_attrs(attrs["base"], arrays)
        return SubsetNormalizedKernel(base, np.asarray(arrays["kernel_subset"], dtype=np.float64))
    params = {k: v for k, v in attrs.items() if k != "name"}
    return make_kernel(name, **params, center=arrays.get("kernel_center"))


def takes_center(kernel, normalization: str, degree: int = 3) -> bool:
    """Whether a fit moves its rows by a centre (:class:`~ooc_spectral.core.kernels._Centred`):
    always for rbf; for kernel PCA (``normalization="additive"``, where a translation
    changes nothing) with the linear and degree-1 polynomial kernels."""
    if callable(kernel):
        return False
    if kernel == "rbf":
        return True
    return normalization == "additive" and (kernel == "linear"
                                             or (kernel == "polynomial" and int(degree) == 1))


def data_center(sample: np.ndarray) -> np.ndarray:
    """The centre a fit moves its rows by: the mean of a seeded sample of them (any point
    within the data would do; the mean keeps the moved rows short, and with them the
    rounding bounds of :mod:`ooc_spectral.core.rounding`)."""
    sample = _f64(sample)
    return sample.mean(axis=0) if sample.shape[0] else np.zeros(sample.shape[1])
