"""ooc_spectral: greedy spectral embedding of datasets larger than RAM.

Kernel PCA and spectral clustering / Laplacian eigenmaps from a small greedy
dictionary (Ouimet & Bengio, 2005), out of core on dask arrays read from zarr.

The sub-packages are layers; a module imports only from its own layer or below
(``docs/architecture.md`` draws them, ``tests/test_architecture.py`` checks it):

``_accel``       compiled and BLAS helpers (OpenBLAS through ctypes, Intel MKL, numba)
``core``         the numerics on blocks in memory: kernels, planning, pass 1's scan,
                 pass 2's chunk statistics, the eigensolve, the fitted model
``io``           storage and integrity: sources, URLs, checkpoints, saved models, data sets
``runtime``      where the passes run: executors, the embedded cluster, monitoring
``pipeline``     the fit's stages over a source as dask graphs (passes 1, 2 and 3, FitRun)
``estimators``   GreedySpectralEmbedding, GreedySpectralClustering, the manifold family
``baselines``    the papers' baselines (exact, Nyström, Gaussian projection)
``experiments``  the papers' protocols and reproductions
``batch``        the batch job and the ``ooc-spectral`` command line

Public paths: this package's names, :mod:`ooc_spectral.manifold`,
:mod:`ooc_spectral.clustering`, :mod:`ooc_spectral.baselines`,
:mod:`ooc_spectral.datasets`, :mod:`ooc_spectral.exceptions`.
"""

from . import exceptions
from .exceptions import (
    ConfigurationMismatchError,
    DegeneratePartitionWarning,
    DictionaryError,
    DictionarySizeError,
    DictionaryWarning,
    FarRowsWarning,
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

