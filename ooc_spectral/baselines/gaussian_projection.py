"""Gaussian projection: the randomized range finder on the n x n normalized kernel, out of core."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

import dask.array as da
import numpy as np

from .._params import store_params
from .._validation import check_int
from ..core.eigensolve import top_eigenpairs
from ..exceptions import InvalidInputError, InvalidParameterError
from ..runtime.execution import Executor
from ..core.kernels import Kernel
from ..io.source import DataSource
from ._common import (
    _block_start,
    _checked_dask,
    _KernelEmbeddingBase,
    _numpy_for_numpy,
    _positive_or_raise,
    _row_random,
    kernel_matmul,
)

__all__ = ["GaussianProjectionEmbedding"]


def _gaussian_block(block, seed: int, columns: int, block_info=None):
    start = _block_start(block_info)
    return _row_random(seed, 0x6A55, start, start + block.shape[0], columns)


class _Scratch:
    """Where the n x l intermediates live: numpy in memory, or zarr on disk.

    Every array read back from disk carries a :class:`_ScratchLease` in its graph,
    so a temporary directory lives as long as any array that reads from it (an
    estimator's lazy ``embedding_`` outlives the estimator); a block whose store
    is gone raises instead of reading zarr's fill value, zeros.
    """

    def __init__(self, in_memory: bool, executor: Executor, workdir=None):
        self.in_memory = in_memory
        self.executor = executor
        self._lease = None
        if not in_memory:
            if workdir is None:
                tmp = tempfile.TemporaryDirectory(prefix="ooc-spectral-gp-")
                self._lease = _ScratchLease(tmp.name, tmp)
            else:
                os.makedirs(os.fspath(workdir), exist_ok=True)
                self._lease = _ScratchLease(os.fspath(workdir), None)

    @property
    def path(self):
        return None if self._lease is None else self._lease.path

    def keep(self, name: str, arr: da.Array) -> da.Array:
        if self.in_memory:
            return da.from_array(self.executor.values(name, arr)[0], chunks=arr.chunks)
        url = os.path.join(self.path, f"{name}.zarr")
        self.executor.values(name, arr.to_zarr(url, overwrite=True, compute=False))
        stored = da.from_zarr(url)
        return stored.map_blocks(_read_leased, lease=self._lease, url=url, dtype=stored.dtype)


class _ScratchLease:
    """A scratch directory and, in the driver, the temporary directory that owns it.

    Pickled (to a worker) it travels as its path alone, without ownership.
    """

    def __init__(self, path: str, owner):
        self.path = path
        self._owner = owner

    def __reduce__(self):
        return _ScratchLease, (self.path, None)


def _read_leased(block: np.ndarray, *, lease: _ScratchLease, url: str) -> np.ndarray:
    if not os.path.isdir(url):
        raise FileNotFoundError(
            f"the intermediate array {url} of a GaussianProjectionEmbedding fit is gone (its "
            "scratch directory was deleted, or is not visible from this worker); refit, or "
            "pass workdir= a directory every worker can read")
    return block


class GaussianProjectionEmbedding(_KernelEmbeddingBase):
    """Randomized range finder on the n x n normalized kernel matrix, out of core.

    Homrighausen & McDonald's "Gaussian projection" (their Algorithm 2, from
    Halko, Martinsson & Tropp): with ``A`` the normalized kernel matrix (centred
    ``H K H``, or ``D^-1/2 K D^-1/2``) and ``l = n_components (+1 for the
    dropped trivial eigenvector) + oversampling`` columns,

    1. ``Y = A Omega`` with ``Omega`` an ``n x l`` Gaussian matrix;
    2. ``power_iterations`` times: ``Q = orth(Y)``, ``Y = A Q`` (Halko et al.'s
       subspace iteration, Algorithm 4.4);
    3. ``Q = orth(Y)``, ``B = Q' A Q`` (``l x l``), ``B = U_B Lambda U_B'``, ``U = Q U_B``.

    Step 3 forms ``B`` by one more product (Halko et al.'s Algorithm 5.1) rather
    than Homrighausen & McDonald's least-squares ``B Q'Omega = Q'Y``: the Ritz
    values of ``Q' A Q`` are bounded by ``A``'s spectrum, while the least-squares
    ``B`` can invent large eigenvalues when ``Q'Omega`` is ill-conditioned.

    Every product ``K V`` (``V`` an ``n x l`` matrix) is :func:`kernel_matmul`:
    row blocks against column blocks, summed, never forming ``K``. The degrees
    ``K 1`` (divisive) and row means (additive) come with the first product, as
    one more column of ``V``; the centring and ``D^-1/2`` are then applied to the
    ``n x l`` factors, so the first product uses the test matrix
    ``D^{1/2} Omega`` (divisive), still a random Gaussian matrix up to a row
    scaling. The data are streamed ``2 + power_iterations`` times (plus once for
    ``transform``); the time is ``O(n^2 (d + l))``. The ``n x l`` intermediates
    are numpy arrays for numpy input and zarr arrays in ``workdir`` otherwise.

    Parameters
    ----------
    n_components : int, default=2
    oversampling : int, default=10
        Extra columns beyond the eigenvectors wanted (the columns are at most the
        rows of X).
    power_iterations : int, default=2
        Subspace iterations (0 is Homrighausen & McDonald's plain Algorithm 2).
    kernel, gamma, degree, coef0 :
        As :class:`~ooc_spectral.GreedySpectralEmbedding`.
    normalization : {"additive", "divisive"}, default="additive"
    drop_first : bool, default=True
    chunk_rows : int, default=None
        Rows per block of the products (default 8192, rounded to storage chunks).
    workdir : str or path, default=None
        Directory for the ``n x l`` intermediates of dask or zarr input (default: a
        temporary directory removed with the estimator).
    random_state : int, default=None
        Seed of ``Omega`` (generated per fixed window of rows, so independent of
        the chunking) and of the ``gamma=None`` sample.

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
    eigenvalues_ : ndarray of shape (n_components,)
        Ritz values: eigenvalues of the centred Gram matrix (additive) or of
        ``D^-1/2 K D^-1/2`` (divisive).
    n_columns_ : int
        ``l``.
    n_passes_ : int
        Kernel products over the whole data made by ``fit``.
    gamma_ : float or None
    n_features_in_, n_samples_fit_ : int
    timings_ : dict
    """

    def __init__(self, n_components=2, *, oversampling=10, power_iterations=2, kernel="rbf",
                 gamma=None, degree=3, coef0=1.0, normalization="additive", drop_first=True,
                 chunk_rows=None, workdir=None, random_state=None):
        store_params(self, locals())

    def _columns(self, n: int | None = None) -> tuple[int, int]:
        """``(k, l)``: the eigenvectors computed (with the trivial one) and the columns,
        at most the ``n`` rows (more columns span nothing more: n columns already span
        every direction of the n x n matrix)."""
        k = self.n_components + int(self.normalization == "divisive" and self.drop_first)
        l = k + int(self.oversampling)
        return k, l if n is None else min(l, n)

    def _check_params(self) -> None:
        self._check_common()
        check_int(type(self).__name__, "oversampling", self.oversampling, low=0)
        check_int(type(self).__name__, "power_iterations", self.power_iterations, low=0)

    def _check_n_rows(self, n: int) -> None:
        k = self._columns()[0]
        if k > n:
            raise InvalidParameterError(
                f"{k} eigenvectors are asked for (n_components"
                f"{' + the dropped trivial one' if k > self.n_components else ''}) but X has "
                f"{n} rows; lower n_components")

    def _fit(self, source: DataSource, kernel: Kernel, seed: int) -> None:
        """Run the range finder and compute the training embedding."""
        n = source.n_rows
        q = int(self.power_iterations)
        divisive = self.normalization == "divisive"
        k, l = self._columns(n)
        ex = Executor()  # every compute of the fit (the active client's cluster, if any)
        scratch = _Scratch(source.kind == "numpy", ex, self.workdir)
        # every pass checks its blocks finite
        X = _checked_dask(source, self.chunk_rows)
        rows = X.chunks[0]
        timings = {}

        def product(V):
            return kernel_matmul(kernel, X, X, V)

        # pass 1: K [Omega, 1] gives the first product and the row sums
        t0 = time.perf_counter()
        omega = da.map_blocks(_gaussian_block, X, seed, l, dtype=np.float64,
                              chunks=(rows, (l,)), meta=np.empty((0, l)))
        ones = da.ones((n, 1), chunks=(rows, 1))
        first = scratch.keep("first", product(da.concatenate([omega, ones], axis=1)))
        r = first[:, l]
        if divisive:
            rmin = float(ex.values("degrees", r.min())[0])
            if rmin <= 0:
                raise InvalidInputError(
                    "a row has a non-positive kernel degree, so the divisive normalization is "
                    "undefined; use a kernel with positive values (rbf, laplacian)"
                )
            s = 1.0 / da.sqrt(r)
            # A (D^1/2 Omega) = D^-1/2 K Omega
            Y = scratch.keep("Y0", first[:, :l] * s[:, None])
        else:
            mu = r / n
            mu_bar = float(ex.values("mean", mu.mean())[0])
            Y = scratch.keep("Y0", self._center(first[:, :l], omega, mu, mu_bar, n))

        def apply_A(V):
            if divisive:
                return product(V * s[:, None]) * s[:, None]
            return self._center(product(V), V, mu, mu_bar, n)

        timings["pass1"] = time.perf_counter() - t0
        for it in range(q):
            t = time.perf_counter()
            Q = scratch.keep(f"Q{it}", da.linalg.tsqr(Y)[0])
            Y = scratch.keep(f"Y{it + 1}", apply_A(Q))
            timings[f"power{it + 1}"] = time.perf_counter() - t
        t = time.perf_counter()
        Q = scratch.keep("Q", da.linalg.tsqr(Y)[0])
        Z = apply_A(Q)
        B = ex.values("projected", Q.T @ Z)[0]
        B = 0.5 * (B + B.T)
        vals, UB = top_eigenpairs(B, k)
        U = Q @ UB
        # sign: the entry of largest magnitude of each n-vector is positive
        big = ex.values("signs", da.argmax(abs(U), axis=0))[0]
        signs = np.sign(np.asarray(ex.values("signs", U.vindex[big, np.arange(k)])[0]))
        signs[signs == 0] = 1.0
        UB = UB * signs
        U = scratch.keep("U", Q @ UB)
        timings["final"] = time.perf_counter() - t
        if divisive:
            if self.drop_first:
                vals, U = vals[1:], U[:, 1:]
            _positive_or_raise(vals, "normalized kernel matrix D^-1/2 K D^-1/2", self.n_components)
            emb = U
            coef = scratch.keep("coef", U * (s[:, None] / vals[None, :]))
            offset = None
        else:
            _positive_or_raise(vals, "centred Gram matrix", self.n_components)
            emb = U * np.sqrt(vals)[None, :]
            coef = scratch.keep("coef", U / np.sqrt(vals)[None, :])
            offset = ex.values("offset", mu[None, :] @ coef)[0][0]
        self.eigenvalues_ = vals
        self.n_columns_ = l
        self.n_passes_ = 2 + q
        self.timings_ = timings
        self.model_ = _ProjectionModel(kernel, X, coef, offset, divisive)
        self._scratch = scratch
        self.embedding_ = (ex.values("embedding", emb)[0] if source.kind == "numpy"
                           else scratch.keep("embedding", emb))

    @staticmethod
    def _center(KV, V, mu, mu_bar: float, n: int):
        """``H K H V`` from ``K V``: ``KV - mu (1'V) - 1 (mu'V) + mu_bar 1 (1'V)``."""
        colsum = V.sum(axis=0)
        mu_v = (mu[None, :] @ V)[0]
        return KV - mu[:, None] * colsum[None, :] - (mu_v - mu_bar * colsum)[None, :]

    def _embed(self, model: _ProjectionModel, source: DataSource):
        """One product ``k(X_new, X_train) @ coef`` over the training data, out of core."""
        return _numpy_for_numpy(source, model.apply(_checked_dask(source, self.chunk_rows)))


@dataclass(frozen=True, eq=False)
class _ProjectionModel:
    kernel: Kernel
    X: da.Array
    coef: da.Array
    offset: np.ndarray | None
    divisive: bool

    def apply(self, Xn: da.Array) -> da.Array:
        if self.divisive:
            ones = da.ones((self.X.shape[0], 1), chunks=(self.X.chunks[0], 1))
            P = kernel_matmul(self.kernel, Xn, self.X, da.concatenate([self.coef, ones], axis=1))
            d = P[:, -1]
            return P[:, :-1] / da.sqrt(d)[:, None]
        P = kernel_matmul(self.kernel, Xn, self.X, self.coef)
        return P - self.offset[None, :]
