"""ooc_spectral: greedy spectral embedding of datasets larger than RAM.

Kernel PCA and spectral clustering / Laplacian eigenmaps from a small greedy
dictionary (Ouimet & Bengio, 2005), out of core on dask arrays read from zarr.

The modules follow the data flow:

``source``      the input matrix (numpy, dask, zarr, or a zarr path)
``kernels``     kernel blocks in float64
``planning``    visiting order, task sizes, samples (pure arithmetic)
``scan``        pass 1: the sequential dictionary scan (Algorithms 1 and 2)
``prefix_scan`` pass 1 as an object, and the prefix scan's completion after pass 2
``statistics``  pass 2's typed statistics, each with its ``combine``
``accumulate``  pass 2: parallel map and ordered tree reduction
``eigensolve``  the m x m eigenproblem
``model``       the fitted model: the frozen dictionary and the spectral map
``writeback``   pass 3: ``map_rows`` (a fitted map over every row), written to zarr
``pipeline``    the stages strung together, with checkpoints
``estimator``   the scikit-learn-style estimator
``persistence`` models as zarr groups with JSON attributes

Around them: ``clustering`` (spectral clustering), ``manifold`` (Laplacian
eigenmaps, diffusion maps, MDS, Isomap, LLE), ``baselines`` (exact, Nyström,
Gaussian projection), ``evaluation`` and ``experiments`` (the papers' protocols),
``datasets`` and ``loaders`` (data), and the batch layer (``checkpoint``,
``jobs``, ``cli``, ``workflow``).
"""

from . import exceptions
from .exceptions import (
    ConfigurationMismatchError,
    DictionaryError,
    DictionarySizeError,
    DictionaryWarning,
    InterruptedRun,
    InvalidInputError,
    InvalidParameterError,
    ModelNotSavableError,
    LockedError,
    NonFiniteInputError,
    OocSpectralError,
    OutputNotWritableError,
    StoreNotFoundError,
    StoreReadError,
    StorageBackendError,
    SchedulerError,
    UsageError,
    WorkerMemoryError,
    WorkersLostError,
    WorkflowError,
)

from ._version import __version__

__all__ = [
    "GreedySpectralEmbedding",
    "GreedySpectralClustering",
    *exceptions.PUBLIC,
    "__version__",
]


#: The estimators, imported on first use (``ooc_spectral.GreedySpectralEmbedding``):
#: they bring scikit-learn and dask.array, which the command line's other commands
#: and the worker processes need not import.
_LAZY = {"GreedySpectralEmbedding": ".estimators.embedding",
         "GreedySpectralClustering": ".estimators.clustering"}


def __getattr__(name):
    if name == "NotFittedError":  # defined on first use (see ooc_spectral.exceptions)
        return exceptions.NotFittedError
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

