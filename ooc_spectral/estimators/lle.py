"""Locally linear embedding in memory, with the out-of-sample extension of eq. 16.

Bengio et al. (2003), eq. 16, the mu -> infinity limit of eq. 17: a new row is
the barycentric combination ``y_k(x) = sum_i y_k(x_i) w(x, x_i)`` of its k
nearest training rows' coordinates, and a training row gets its own
coordinates back (``w(x_j, x_i) = delta_ij``). Importable from
:mod:`ooc_spectral.manifold`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy.linalg import LinAlgError, eigh, solve
from scipy.sparse import csr_matrix, identity
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import eigsh
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.neighbors import NearestNeighbors

from ._manifold import (
    DENSE_EIGEN_MAX_ROWS,
    Fitted,
    check_in_memory_params,
    check_sizes,
    fix_signs,
    read_in_memory,
)
from .._params import store_params
from ._sklearn import FeatureNamesMixin
from .._validation import check_float
from ..core.config import resolve_seed
from ..exceptions import InvalidParameterError

__all__ = ["LocallyLinearEmbedding"]


def _barycenter_weights(X: np.ndarray, Y: np.ndarray, ind: np.ndarray, reg: float) -> np.ndarray:
    """Weights (summing to 1) reconstructing each row of X from its neighbours ``Y[ind]``.

    The regularized local Gram system of Roweis & Saul, as scikit-learn solves it:
    ``(C + reg trace(C) I) w = 1`` (``reg`` alone when the trace is 0), then normalized.
    Raises :class:`InvalidParameterError` where ``reg=0`` leaves a system singular.
    """
    n, k = ind.shape
    W = np.empty((n, k))
    ones = np.ones(k)
    for i in range(n):
        Z = Y[ind[i]] - X[i]
        C = Z @ Z.T
        tr = np.trace(C)
        C.flat[::k + 1] += reg * tr if tr > 0 else reg
        try:
            w = solve(C, ones, assume_a="pos")
        except LinAlgError:
            raise InvalidParameterError(
                f"LocallyLinearEmbedding: with reg={reg:g} the local Gram matrix of row {i} and "
                f"its {k} neighbours is singular (they span at most {min(k - 1, X.shape[1])} "
                "directions around it); use reg > 0 (the default is 1e-3)") from None
        W[i] = w / w.sum()
    return W


def _components(ind: np.ndarray) -> int:
    """How many connected components the k-nearest-neighbour graph ``ind`` (n x k) has."""
    n, k = ind.shape
    graph = csr_matrix((np.ones(n * k), ind.ravel(), np.arange(0, n * k + 1, k)), shape=(n, n))
    return connected_components(graph, directed=False)[0]


def _check_connected(name: str, ind: np.ndarray, k: int, nbrs) -> None:
    """Warn of a neighbour graph of several components, naming the n_neighbors that joins it.

    On such a graph the bottom eigenvectors of M are constant on each component: the
    embedding tells the components apart and may collapse a component to a point.
    scikit-learn's LocallyLinearEmbedding returns that embedding silently; as Isomap
    does for its geodesics, the fit goes on with a ``UserWarning``, which names the
    smallest ``n_neighbors`` whose graph is connected."""
    n_comp = _components(ind)
    if n_comp == 1:
        return
    n = ind.shape[0]
    lo, hi = k, k
    while hi < n - 1:  # double, then bisect, the smallest k whose graph is connected
        hi = min(2 * hi, n - 1)
        if _components(nbrs.kneighbors(return_distance=False, n_neighbors=hi)) == 1:
            break
        lo = hi
    else:
        hi = None
    if hi is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if _components(nbrs.kneighbors(return_distance=False, n_neighbors=mid)) == 1:
                hi = mid
            else:
                lo = mid
    advice = (f"use n_neighbors >= {hi}, which connects it" if hi is not None else
              "no n_neighbors connects it")
    warnings.warn(
        f"{name}: the {k}-nearest-neighbour graph of the rows has {n_comp} connected "
        "components, and LLE's coordinates then tell the components apart (a component may "
        f"collapse to a point); {advice}, or embed each component separately",
        UserWarning, stacklevel=4)


@dataclass(frozen=True, eq=False)
class _LLEMap:
    nbrs: NearestNeighbors
    X_fit: np.ndarray
    n_neighbors: int
    reg: float
    embedding: np.ndarray

    @property
    def n_components(self) -> int:
        return int(self.embedding.shape[1])

    def embed(self, X: np.ndarray) -> np.ndarray:
        dist, ind = self.nbrs.kneighbors(X, n_neighbors=self.n_neighbors)
        W = _barycenter_weights(X, self.X_fit, ind, self.reg)
        on_training = dist[:, 0] == 0.0  # x = x_j: w(x, x_i) = delta_ij (eq. 16)
        W[on_training] = 0.0
        W[on_training, 0] = 1.0
        return np.einsum("ik,ikp->ip", W, self.embedding[ind])


class LocallyLinearEmbedding(Fitted, FeatureNamesMixin, TransformerMixin, BaseEstimator):
    """Locally linear embedding in memory, with the extension of eq. 16.

    Standard LLE (Roweis & Saul): barycentric weights W of each training row on
    its k nearest neighbours, then the eigenvectors of ``M = (I - W)'(I - W)``
    with the smallest eigenvalues, the constant one skipped (unit-norm, the
    scale of scikit-learn's ``LocallyLinearEmbedding``). A new row is the same
    barycentric combination of its neighbours' coordinates
    (``y_k(x) = sum_i y_k(x_i) w(x, x_i)``, eq. 16, the mu -> infinity limit of
    the Nyström formula for the kernel of eq. 17), and a training row gets its own
    coordinates back (``w(x_j, x_i) = delta_ij``).

    **In memory**: the k-NN graph and the sparse n x n matrix M (dense with
    ``eigen_solver="dense"``); at most ``max_samples`` rows.

    Parameters
    ----------
    n_components : int, default=2
    n_neighbors : int, default=5
    reg : float, default=1e-3
        Regularization of the local Gram systems (relative to their trace).
    eigen_solver : {"auto", "dense", "arpack"}, default="auto"
        "auto": dense up to 3000 rows, ARPACK (shift-invert about 0) above.
    tol : float, default=1e-6
        ARPACK's tolerance.
    max_samples : int, default=20000
    chunk_rows, random_state : int, default=None
        As for :class:`~ooc_spectral.manifold.Isomap`: rows per task of ``transform``,
        seed of ARPACK's start vector.

    Attributes
    ----------
    embedding_ : ndarray of shape (n_samples, n_components)
    eigenvalues_ : ndarray of shape (n_components,)
        The eigenvalues of M for the kept eigenvectors (the smallest non-trivial).
    n_features_in_ : int
    feature_names_in_ : ndarray of str, shape (n_features,)
        The column names of a DataFrame X (only then); ``transform`` refuses rows whose
        names differ or come in another order.
    """

    def __init__(self, n_components=2, *, n_neighbors=5, reg=1e-3, eigen_solver="auto",
                 tol=1e-6, max_samples=20000, chunk_rows=None, random_state=None):
        store_params(self, locals())

    def _fit(self, X) -> None:
        """Barycentric weights of the rows of X (read into memory), then the bottom of M."""
        name, p, k = check_sizes(self)
        reg = check_float(name, "reg", self.reg, low=0.0)
        solver, max_samples = check_in_memory_params(self)
        tol = check_float(name, "tol", self.tol, low=0.0)
        Xf = read_in_memory(name, X, max_samples,
                             "the k-NN graph and the n x n matrix M (dense for eigen_solver="
                             "'dense')")
        n = Xf.shape[0]
        if k >= n:
            raise InvalidParameterError(
                f"{name}: n_neighbors={k} must be below the number of training rows ({n})")
        if p + 1 >= n:
            raise InvalidParameterError(
                f"{name}: n_components={p} must be below n_samples - 1 = {n - 1}")
        seed = resolve_seed(self.random_state)
        nbrs = NearestNeighbors(n_neighbors=k + 1).fit(Xf)
        ind = nbrs.kneighbors(Xf, return_distance=False)[:, 1:]
        _check_connected(name, ind, k, nbrs)
        W = _barycenter_weights(Xf, Xf, ind, reg)
        Wm = csr_matrix((W.ravel(), ind.ravel(), np.arange(0, n * k + 1, k)), shape=(n, n))
        IW = identity(n, format="csr") - Wm
        M = (IW.T @ IW).tocsr()
        if solver == "auto":
            solver = "dense" if n <= DENSE_EIGEN_MAX_ROWS else "arpack"
        if solver == "dense":
            vals, V = eigh(M.toarray(), subset_by_index=[0, p])
        else:
            v0 = np.random.default_rng(seed).uniform(-1.0, 1.0, n)
            try:
                vals, V = eigsh(M, k=p + 1, sigma=0.0, tol=tol, v0=v0)
            except RuntimeError as exc:
                raise InvalidParameterError(
                    f"{name}: ARPACK failed on the LLE matrix ({exc}); use eigen_solver='dense' "
                    "or a larger reg") from None
            order = np.argsort(vals)
            vals, V = vals[order], V[:, order]
        self.eigenvalues_ = vals[1:]
        self.embedding_ = fix_signs(V[:, 1:])
        self.n_features_in_ = Xf.shape[1]
        self.random_state_ = seed
        self._map = _LLEMap(nbrs, Xf, k, reg, self.embedding_)

    def _row_bytes(self, emap) -> int:
        k = self.n_neighbors
        return 8 * (k * (self.n_features_in_ + k + self.n_components) + 4)
