"""The exact kernel embedding: the full Gram matrix in memory, the oracle."""

from __future__ import annotations

import math
import time

import dask.array as da

from .._params import store_params
from ..exceptions import InvalidInputError
from ..core.kernels import Kernel
from ..core.planning import parse_bytes
from ..io.source import DataSource
from ._common import NystromModel, _dense_fit, _KernelEmbeddingBase, _task_rows

__all__ = ["ExactKernelEmbedding"]


class ExactKernelEmbedding(_KernelEmbeddingBase):
    """Kernel PCA or spectral embedding on the full Gram matrix, in memory: the oracle.

    Forms the ``n x n`` Gram matrix, normalizes it (centring or
    ``D^-1/2 K D^-1/2``) and takes its top eigenpairs. ``O(n^2)`` memory and
    ``O(n^3)`` time: for the small ``n`` against which the approximations are
    checked. Refuses (before reading the data) an ``n`` whose Gram matrix and
    eigensolver workspace exceed ``memory_budget``.

    Parameters
    ----------
    n_components : int, default=2
        Number of embedding coordinates.
    kernel : {"rbf", "laplacian", "linear", "polynomial", "poly"}, default="rbf"
    gamma : float, default=None
        Kernel coefficient; None: the median heuristic of
        :class:`~ooc_spectral.GreedySpectralEmbedding` on the same seeded sample.
    degree : int, default=3
    coef0 : float, default=1.0
    normalization : {"additive", "divisive"}, default="additive"
    drop_first : bool, default=True
        Divisive only: drop the trivial first eigenvector.
    memory_budget : int or str, default="2GiB"
        Largest memory the Gram matrix and its eigen-decomposition may take,
        estimated as ``16 n^2`` bytes: the float64 Gram matrix, normalized and
        decomposed in place, and as much again for the kernel computation's
        temporaries and LAPACK's workspace.
    chunk_rows : int, default=None
        Rows per task of ``transform`` on dask or zarr input.
    random_state : int, default=None
        Seed of the ``gamma=None`` sample.

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
        numpy for numpy input, a dask array otherwise.
    eigenvalues_ : ndarray of shape (n_components,)
    gamma_ : float or None
    model_ : NystromModel
        The training rows and coefficients ``transform`` applies.
    n_features_in_, n_samples_fit_ : int
    timings_ : dict
        ``{"read": s, "gram_and_eigensolve": s}``.

    Raises
    ------
    InvalidInputError
        From ``fit``, when ``n`` is beyond ``memory_budget``; the message names
        the budget and the out-of-core estimators to use instead.
    """

    def __init__(self, n_components=2, *, kernel="rbf", gamma=None, degree=3, coef0=1.0,
                 normalization="additive", drop_first=True, memory_budget="2GiB",
                 chunk_rows=None, random_state=None):
        store_params(self, locals())

    @staticmethod
    def required_memory(n_samples: int) -> int:
        """Bytes the exact method is budgeted for ``n_samples`` rows (``16 n^2``)."""
        return 16 * int(n_samples) ** 2

    def _check_params(self) -> None:
        self._check_common()
        parse_bytes(self.memory_budget)

    def _check_n_rows(self, n: int) -> None:
        budget = parse_bytes(self.memory_budget)
        need = self.required_memory(n)
        if need > budget:
            n_max = math.isqrt(budget // 16)
            raise InvalidInputError(
                f"ExactKernelEmbedding needs about {need / 2**30:.2f} GiB for the {n} x {n} Gram "
                f"matrix of X, above memory_budget={self.memory_budget!r} (at most {n_max} rows); "
                "use GreedySpectralEmbedding, NystromEmbedding or GaussianProjectionEmbedding "
                "(out of core), fit on a subset, or raise memory_budget"
            )

    def _fit(self, source: DataSource, kernel: Kernel, seed: int) -> None:
        """Read every row, decompose the normalized Gram matrix."""
        t0 = time.perf_counter()
        Xm = source.read_rows(0, source.n_rows)
        t1 = time.perf_counter()
        coef, offset, vals, emb = _dense_fit(kernel(Xm), self.normalization, self.n_components,
                                             self.drop_first)
        t2 = time.perf_counter()
        self.model_ = NystromModel(kernel, Xm, kernel.aux(Xm), self.normalization, coef, offset)
        self.eigenvalues_ = vals
        self.timings_ = {"read": t1 - t0, "gram_and_eigensolve": t2 - t1}
        if source.kind == "numpy":
            self.embedding_ = emb
        else:
            self.embedding_ = da.from_array(emb, chunks=(_task_rows(source, self.chunk_rows),
                                                         emb.shape[1]))
