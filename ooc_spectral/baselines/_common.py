"""What the baselines share: task rows, kernel resolution, the Nystrom model, kernel products.

:class:`NystromModel` is the fitted map of :class:`~ooc_spectral.baselines.ExactKernelEmbedding`
and :class:`~ooc_spectral.baselines.NystromEmbedding`; :func:`_dense_fit` the
eigen-decomposition of a normalized dense Gram matrix both use;
:func:`kernel_matmul` the out-of-core product ``k(Xa, Xb) @ V`` of
:class:`~ooc_spectral.baselines.GaussianProjectionEmbedding` (and of
:mod:`ooc_spectral.experiments.evaluation`); :class:`_KernelEmbeddingBase` the parameter
checks, the ``fit`` skeleton and the ``transform`` of all three.
"""

from __future__ import annotations

from dataclasses import dataclass

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

from ..estimators._sklearn import FeatureNamesMixin
from .._validation import (check_bool, check_choice, check_fitted, check_float, check_int,
                           check_n_features)
from ..core.config import resolve_seed
from ..core.eigensolve import top_eigenpairs
from ..exceptions import InvalidInputError, InvalidParameterError
from ..runtime.execution import Executor
from ..core.kernel_choice import KERNEL_ALIASES, KERNELS, canonical_kernel, make_kernel, resolve_gamma
from ..core.kernels import Kernel, first_nonpositive
from ..core.planning import whole_chunks
from .._validation import check_finite
from ..io.source import DataSource, open_source
from ..pipeline.writeback import map_rows

NORMALIZATIONS = ("additive", "divisive")

#: Rows of the sub-blocks a task of :func:`kernel_matmul` works on (bounds its memory).
SUB_BLOCK_ROWS = 2048
#: Default rows per dask task of the baselines' passes (rounded to storage chunks).
DEFAULT_TASK_ROWS = 8192
#: Rows per window of the seeded per-row random numbers (independent of chunking).
RANDOM_WINDOW_ROWS = 4096


# --------------------------------------------------------------------------- #
# data in row blocks
# --------------------------------------------------------------------------- #
def _f64(X) -> np.ndarray:
    return np.ascontiguousarray(X, dtype=np.float64)


def _task_rows(source: DataSource, requested: int | None) -> int:
    """Rows per task: a multiple of the storage chunk, near ``requested``."""
    want = DEFAULT_TASK_ROWS if requested is None else int(requested)
    return whole_chunks(want, source.storage_chunk_rows, source.n_rows)


def _block_start(block_info) -> int:
    """The global row number of a ``map_blocks`` block's first row (0 without ``block_info``)."""
    return block_info[0]["array-location"][0][0] if block_info else 0


def _finite_block(block, chunk_starts=None, block_info=None):
    """``block`` unchanged, after :func:`check_finite` (global row numbers)."""
    check_finite(block, _block_start(block_info), chunk_starts=chunk_starts)
    return block


def _checked_dask(source: DataSource, chunk_rows: int | None) -> da.Array:
    """``source`` as a dask array of task rows whose blocks are checked finite when computed.

    A NaN row would otherwise come out as a NaN embedding, silently.
    """
    X = source.to_dask(_task_rows(source, chunk_rows))
    return X.map_blocks(_finite_block, chunk_starts=source.chunk_starts, dtype=X.dtype)


def _numpy_for_numpy(source: DataSource, out: da.Array):
    """``out`` computed (through the :class:`~ooc_spectral.runtime.execution.Executor`) when
    ``source`` is numpy input, else the lazy dask array."""
    return Executor().values("transform", out)[0] if source.kind == "numpy" else out


def _resolve_kernel(est, source: DataSource, seed: int) -> tuple[Kernel, float | None]:
    """The base kernel; ``gamma=None`` is the core's median heuristic on the same sample."""
    gamma = resolve_gamma(canonical_kernel(est.kernel), est.gamma, source, seed)
    return make_kernel(est.kernel, gamma=gamma, degree=est.degree, coef0=est.coef0), gamma


def _row_random(seed: int, tag: int, start: int, stop: int, columns: int | None,
                kind: str = "normal") -> np.ndarray:
    """Seeded random numbers for rows ``[start, stop)``, independent of the chunking.

    Rows are generated in fixed windows of :data:`RANDOM_WINDOW_ROWS`, window
    ``w`` from ``SeedSequence([seed, tag, w])``, so row ``t`` gets the same
    values whatever block it is read in.
    """
    shape_tail = () if columns is None else (columns,)
    parts = []
    win = RANDOM_WINDOW_ROWS
    last = (stop - 1) // win if stop > start else start // win - 1
    for w in range(start // win, last + 1):
        rng = np.random.default_rng(np.random.SeedSequence([seed, tag, w]))
        block = (rng.standard_normal((win, *shape_tail)) if kind == "normal"
                 else rng.random((win, *shape_tail)))
        a = max(start, w * win) - w * win
        b = min(stop, (w + 1) * win) - w * win
        parts.append(block[a:b])
    if not parts:
        return np.empty((0, *shape_tail))
    return np.concatenate(parts)


@dataclass(frozen=True, eq=False)
class NystromModel:
    """The map from rows of X to embedding coordinates, by the Nystrom formula.

    For ``points`` ``x_1..x_m`` (the training rows, or the landmarks):

    - additive: ``f(x) = k(x, P) @ coef - offset``, with ``coef = U / sqrt(lambda)``
      (``U`` unit eigenvectors of the centred Gram matrix of the points) and
      ``offset = mu @ coef``, ``mu_i = mean_j k(x_j, x_i)``;
    - divisive: ``f(x) = scale * (k(x, P) @ coef) / sqrt(d(x))`` with
      ``d(x) = sum_i k(x, x_i)`` and ``coef = D^-1/2 V / lambda``.

    On the points themselves this gives back ``U sqrt(lambda)`` (additive) and
    ``scale * V`` (divisive).
    """

    kernel: Kernel
    points: np.ndarray
    aux: np.ndarray | None
    mode: str
    coef: np.ndarray
    offset: np.ndarray | None
    scale: float = 1.0

    @property
    def n_components(self) -> int:
        return int(self.coef.shape[1])

    def embed(self, X: np.ndarray) -> np.ndarray:
        X = _f64(X)
        out = np.empty((X.shape[0], self.n_components))
        for a in range(0, X.shape[0], SUB_BLOCK_ROWS):
            xa = X[a:a + SUB_BLOCK_ROWS]
            K = self.kernel.pairwise(xa, self.points, self.kernel.aux(xa), self.aux)
            if self.mode == "additive":
                out[a:a + len(xa)] = K @ self.coef - self.offset
            else:
                d = K.sum(axis=1)
                if (i := first_nonpositive(d)) is not None:
                    raise InvalidInputError(
                        f"row {a + i} of this block has kernel degree {d[i]:.3g} (not positive) "
                        "against the training points, so the divisive normalization is "
                        "undefined there; use a kernel with positive values (rbf, laplacian)"
                    )
                out[a:a + len(xa)] = (K @ self.coef) * (self.scale / np.sqrt(d))[:, None]
        return out


def _embed_source(model: NystromModel, source: DataSource, chunk_rows: int | None):
    """``model`` applied to every row of ``source``: numpy for numpy input, else lazy dask."""
    out = map_rows(source.to_dask(_task_rows(source, chunk_rows)), model,
                   chunk_starts=source.chunk_starts, name="ooc-spectral-nystrom-embed")
    return _numpy_for_numpy(source, out)


def _positive_or_raise(vals: np.ndarray, what: str, n_components: int) -> None:
    if np.any(vals <= 0) or not np.all(np.isfinite(vals)):
        raise InvalidParameterError(
            f"the {what} has only {int(np.sum(vals > 0))} positive eigenvalues among the "
            f"{n_components} requested; lower n_components, or change gamma"
        )


def _dense_fit(K: np.ndarray, normalization: str, n_components: int, drop_first: bool):
    """Eigen-decomposition of a dense Gram matrix, normalized in place (``K`` is overwritten).

    Returns ``(coef, offset, eigenvalues, train_embedding)`` for
    :class:`NystromModel` (``scale = 1``).
    """
    K = np.asarray(K, dtype=np.float64)
    if normalization == "additive":
        mu = K.mean(axis=1)
        K -= mu[:, None]
        K -= mu[None, :]
        K += mu.mean()
        vals, U = top_eigenpairs(K, n_components, overwrite=True)
        _positive_or_raise(vals, "centred Gram matrix", n_components)
        coef = U / np.sqrt(vals)
        return coef, mu @ coef, vals, U * np.sqrt(vals)
    d = K.sum(axis=1)
    if np.any(d <= 0):
        raise InvalidInputError(
            f"{int(np.sum(d <= 0))} rows have a non-positive kernel degree, so the divisive "
            "normalization is undefined; use a kernel with positive values (rbf, laplacian)"
        )
    s = 1.0 / np.sqrt(d)
    K *= s[:, None]
    K *= s[None, :]
    k = n_components + int(drop_first)
    vals, V = top_eigenpairs(K, k, overwrite=True)
    if drop_first:
        vals, V = vals[1:], V[:, 1:]
    _positive_or_raise(vals, "normalized kernel matrix D^-1/2 K D^-1/2", n_components)
    return V * (s[:, None] / vals), None, vals, V


# --------------------------------------------------------------------------- #
# kernel products out of core
# --------------------------------------------------------------------------- #
def _kv_block(Xi, Xj, Vj, kernel: Kernel):
    """``k(Xi, Xj) @ Vj`` in sub-blocks of :data:`SUB_BLOCK_ROWS` (memory bounded)."""
    Xi, Xj, Vj = _f64(Xi), _f64(Xj), _f64(Vj)
    out = np.zeros((Xi.shape[0], Vj.shape[1]))
    sub = SUB_BLOCK_ROWS
    aux_j = [kernel.aux(Xj[b:b + sub]) for b in range(0, Xj.shape[0], sub)]
    for a in range(0, Xi.shape[0], sub):
        xa = Xi[a:a + sub]
        ax = kernel.aux(xa)
        acc = out[a:a + sub]
        for q, b in enumerate(range(0, Xj.shape[0], sub)):
            acc += kernel.pairwise(xa, Xj[b:b + sub], ax, aux_j[q]) @ Vj[b:b + sub]
    return out[:, None, :]


def kernel_matmul(kernel: Kernel, Xa: da.Array, Xb: da.Array, V: da.Array, *,
                  split_every: int = 8) -> da.Array:
    """``k(Xa, Xb) @ V`` out of core, never forming the kernel matrix.

    One task per pair of row blocks ``(i, j)`` computes ``k(Xa_i, Xb_j) @ V_j``
    (in sub-blocks of :data:`SUB_BLOCK_ROWS` rows, so a task holds at most a
    ``2048 x 2048`` kernel block whatever the chunking); the partial products are
    summed over ``j`` in a fixed-order tree. Each block of the data is read once
    per product.

    Parameters
    ----------
    kernel : Kernel
    Xa : dask array of shape (na, d)
        One column chunk.
    Xb : dask array of shape (nb, d)
        One column chunk.
    V : dask array of shape (nb, l)
        Row chunks aligned with ``Xb``'s, one column chunk.

    Returns
    -------
    dask array of shape (na, l), row chunks of ``Xa``.
    """
    Xa = Xa.rechunk({1: -1})
    Xb = Xb.rechunk({1: -1})
    V = V.rechunk({0: Xb.chunks[0], 1: -1})
    inter = da.blockwise(_kv_block, "ijk", Xa, "ia", Xb, "ja", V, "jk", kernel, None,
                         adjust_chunks={"j": 1}, concatenate=True, dtype=np.float64,
                         meta=np.empty((0, 0, 0)), name="ooc-spectral-kernel-matmul")
    return inter.sum(axis=1, split_every=split_every)


# --------------------------------------------------------------------------- #
# the base class
# --------------------------------------------------------------------------- #
class _KernelEmbeddingBase(FeatureNamesMixin, TransformerMixin, BaseEstimator):
    """Shared checks, kernel resolution, ``fit`` skeleton and ``transform`` of the baselines.

    ``fit`` checks the parameters (:meth:`_check_params`, before X is read), opens
    X, checks the parameters that depend on its row count (:meth:`_check_n_rows`),
    resolves the seed and the kernel, and hands them to the subclass's
    :meth:`_fit`, which sets every fitted attribute but ``gamma_``,
    ``n_features_in_``, ``n_samples_fit_`` and ``random_state_``.
    """

    def fit(self, X, y=None):
        """Fit on X and compute the training embedding ``embedding_``.

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str
            The n x d data (or the path of a zarr array).
        y : ignored

        Returns
        -------
        self
        """
        self._check_params()
        self._check_feature_names(X, reset=True)
        source = self._open(X)
        self._check_n_rows(source.n_rows)
        seed = resolve_seed(self.random_state)
        kernel, gamma = _resolve_kernel(self, source, seed)
        self._fit(source, kernel, seed)
        self.gamma_ = gamma
        self.n_features_in_ = source.n_features
        self.n_samples_fit_ = source.n_rows
        self.random_state_ = seed
        return self

    def _check_params(self) -> None:
        """Parameter checks that need no data (run before X is read)."""
        self._check_common()

    def _check_n_rows(self, n: int) -> None:
        """Parameter checks against the ``n`` rows of X (run once X is open)."""

    def _fit(self, source: DataSource, kernel: Kernel, seed: int) -> None:
        """The estimator's own fit on the open ``source`` with the resolved ``kernel``."""
        raise NotImplementedError

    def _check_common(self) -> None:
        check_int(type(self).__name__, "n_components", self.n_components, low=1)
        check_choice(type(self).__name__, "kernel", self.kernel, KERNELS + tuple(KERNEL_ALIASES))
        check_float(type(self).__name__, "gamma", self.gamma, low=0.0, low_open=True, none=True)
        check_int(type(self).__name__, "degree", self.degree, low=1)
        check_float(type(self).__name__, "coef0", self.coef0)
        check_choice(type(self).__name__, "normalization", self.normalization, NORMALIZATIONS)
        check_bool(type(self).__name__, "drop_first", self.drop_first)
        check_int(type(self).__name__, "chunk_rows", self.chunk_rows, low=1, none=True)
        if self.random_state is not None and not isinstance(
                self.random_state, (np.random.RandomState, np.random.Generator)):
            check_int(type(self).__name__, "random_state", self.random_state, low=0)

    def _open(self, X) -> DataSource:
        source = open_source(X)
        if source.n_rows < 2:
            raise InvalidInputError(
                f"X has {source.n_rows} row; at least 2 samples are needed to fit an embedding"
            )
        return source

    def _check_fitted(self):
        return check_fitted(self, "model_")

    def _open_new(self, X) -> DataSource:
        source = open_source(X)
        check_n_features(type(self).__name__, source.n_features, self.n_features_in_)
        return source

    def fit_transform(self, X, y=None):
        """Fit and return ``embedding_``."""
        return self.fit(X, y).embedding_

    def transform(self, X):
        """Out-of-sample embedding of new rows by the Nystrom formula of ``model_``
        (against every training row for the exact embedding and Gaussian projection,
        the landmarks for Nystrom).

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str

        Returns
        -------
        ndarray or dask array of shape (n_rows, n_components)
            numpy for numpy input; on training rows, the training embedding.
        """
        model = self._check_fitted()
        self._check_feature_names(X, reset=False)
        return self._embed(model, self._open_new(X))

    def _embed(self, model, source: DataSource):
        """``model`` applied to every row of ``source``."""
        return _embed_source(model, source, self.chunk_rows)


