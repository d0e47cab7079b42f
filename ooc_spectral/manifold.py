"""The spectral family of Bengio et al. (2003), each with its out-of-sample extension.

Every method here embeds training rows with the leading eigenvectors of a
data-dependent kernel and new rows with the Nyström formula of that kernel
(Bengio et al. 2003, eqs. 8-12; the kernels are eqs. 14-16).

Out of core (memory independent of n; X read block by block from numpy, dask,
zarr or a zarr path):

- :class:`LaplacianEigenmaps`, :class:`DiffusionMap`: the greedy dictionary and
  the divisive normalization of :class:`~ooc_spectral.GreedySpectralEmbedding`
  (exact degrees); O(m^2 + chunk x (d + m)) memory.
- :class:`MetricMDS` with ``metric="euclidean"``: classical scaling with
  Euclidean distances is kernel PCA with a linear kernel; the greedy dictionary
  then holds at most d + 1 rows and the result is exact.
- :class:`LandmarkIsomap`: the landmarks are the greedy dictionary; geodesics
  run on the k-NN graph of a seeded in-memory sample of ``graph_size`` rows
  (O(graph_size x (d + k + m)) memory); every row of X is embedded block by block.

In memory (the fitted model holds n x n or k-NN-graph-sized arrays):

- :class:`MetricMDS` with any other metric: the n x n distance matrix.
- :class:`Isomap`: the n x n geodesic distance matrix.
- :class:`LocallyLinearEmbedding`: the k-NN graph and the sparse n x n matrix
  ``M`` (dense with ``eigen_solver="dense"``).

The in-memory estimators refuse more than ``max_samples`` rows with a message
naming the out-of-core alternative; their ``transform`` still processes new
rows block by block (numpy result for numpy input, a lazy dask array
otherwise), so only the fitted model must fit in memory.

Out-of-sample formulas
----------------------
Laplacian eigenmaps (eq. 4, section 4.2)
    The generalized eigenvectors ``(D - K) f = mu D f`` normalized ``f'Df = 1``
    are ``f_k = D^-1/2 v_k`` with ``v_k`` the unit eigenvectors of
    ``D^-1/2 K D^-1/2`` (eigenvalue ``lambda_k = 1 - mu_k``); a new row gets
    ``v_k(x)`` by the Nyström formula of the normalized kernel (eq. 11) and its
    own degree ``d(x) = sum_i K(x, x_i)``. This is the scale of scikit-learn's
    ``SpectralEmbedding``.
Diffusion map (Coifman & Lafon; Homrighausen & McDonald, section 2.1)
    ``Psi_t(x) = (lambda_k^t psi_k(x))_k`` with ``psi_k = sqrt(vol) D^-1/2 v_k``
    the right eigenvectors of the Markov matrix ``D^-1 K`` normalized so that
    ``psi_0 = 1`` and ``sum_i (d_i / vol) psi_k(x_i)^2 = 1`` (``vol = sum_i d_i``);
    Euclidean distances between coordinates are diffusion distances at time t.
Metric MDS (eq. 14)
    Classical scaling: ``K~ = -1/2 (d^2(a,b) - E_x d^2(x,b) - E_x' d^2(a,x') + E d^2)``,
    ``e_k(x) = (1 / sqrt(lambda_k)) sum_i v_ki K~(x, x_i)``.
Isomap (eq. 14 with the geodesic distance, = eq. 15, Corollary 1)
    The geodesic distance of a new row to ``x_i`` goes through its k nearest
    training rows: ``D~(x, x_i) = min_j (||x - x_j|| + D~(x_j, x_i))``.
Landmark Isomap (eq. 15)
    ``e_k(x) = 1 / (2 sqrt(lambda_k)) sum_i v_ki (E_x'[D~^2(x', l_i)] - D~^2(x, l_i))``
    over the landmarks ``l_i``, whose classical scaling gives ``v`` and ``lambda``.
LLE (eq. 16, the mu -> infinity limit of eq. 17)
    ``y_k(x) = sum_i y_k(x_i) w(x, x_i)`` with the barycentric weights of x on its
    k nearest training rows, and ``w(x, x_i) = delta_ij`` when ``x = x_j``.

On a training row every ``transform`` gives back the training embedding.
"""

from __future__ import annotations

import warnings

from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
from scipy.linalg import eigh, solve
from scipy.sparse import csr_matrix, identity
from scipy.sparse.csgraph import connected_components, shortest_path
from scipy.sparse.linalg import eigsh
from scipy.spatial.distance import cdist
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.neighbors import NearestNeighbors

from ._sklearn import FeatureNamesMixin
from ._validation import check_choice, check_fitted, check_float, check_int
from .config import resolve_seed
from .eigensolve import top_eigenpairs
from .estimator import GreedySpectralEmbedding
from .exceptions import DictionaryError, InvalidInputError, InvalidParameterError
from .execution import shared
from .planning import plan_sample
from .source import DataSource, check_finite, open_source

__all__ = [
    "LaplacianEigenmaps",
    "DiffusionMap",
    "MetricMDS",
    "Isomap",
    "LandmarkIsomap",
    "LocallyLinearEmbedding",
]

#: Bytes one task of a blockwise ``transform`` may use for its temporaries.
TASK_MEMORY = 256 * 2**20
#: ``purpose`` tag of the graph sample of :class:`LandmarkIsomap` (see ``plan_sample``).
GRAPH_SAMPLE_PURPOSE = 0x15
#: ``eigen_solver="auto"`` uses the dense solver up to this many rows.
DENSE_EIGEN_MAX_ROWS = 3000


# --------------------------------------------------------------------------- #
# helpers: blockwise application, input in memory, eigenproblems
# --------------------------------------------------------------------------- #
def _embed_located(block, emap, block_info=None):
    offset = block_info[0]["array-location"][0][0] if block_info else 0
    X = np.ascontiguousarray(block, dtype=np.float64)
    check_finite(X, offset)
    return emap.embed(X)


def _task_rows(source: DataSource, per_row_bytes: int, requested: int | None) -> int:
    """Rows per task: a whole number of storage chunks, within :data:`TASK_MEMORY`."""
    rows = int(requested) if requested is not None else max(1, TASK_MEMORY // max(per_row_bytes, 1))
    unit = max(1, min(source.storage_chunk_rows, source.n_rows))
    rows = max(unit, -(-rows // unit) * unit)
    return int(min(rows, source.n_rows))


def _apply_rows(owner: str, emap, X, n_features: int, per_row_bytes: int,
                chunk_rows: int | None):
    """``emap.embed`` over the rows of X, block by block.

    numpy input: computed here, a numpy array. dask, zarr or a path: a lazy
    dask array with one task per block, ``emap`` a single key of the graph.
    """
    source = open_source(X)
    if source.n_features != n_features:
        raise InvalidInputError(
            f"X has {source.n_features} features, but {owner} was fitted with {n_features} "
            "features; pass rows with the training columns")
    rows = _task_rows(source, per_row_bytes, chunk_rows)
    if source.kind == "numpy":
        parts = [emap.embed(source.read_rows(a, min(a + rows, source.n_rows)))
                 for a in range(0, source.n_rows, rows)]
        return np.concatenate(parts, axis=0)
    dX = source.to_dask(rows)
    p = emap.n_components
    return da.map_blocks(_embed_located, dX, shared(emap), dtype=np.float64,
                         meta=np.empty((0, p)), chunks=(dX.chunks[0], (p,)),
                         name=f"ooc-spectral-{owner.lower()}")


def _read_in_memory(owner: str, X, max_samples: int,
                    what: str = "an n x n matrix") -> np.ndarray:
    """All rows of X as float64 (checked finite), refusing more than ``max_samples``."""
    source = open_source(X)
    n = source.n_rows
    if n > max_samples:
        raise InvalidInputError(
            f"{owner} holds {what} in memory and X has {n} rows, above "
            f"max_samples={max_samples} (one dense n x n float64 matrix would take about "
            f"{8 * n * n / 2**30:.1f} GiB); fit on a sample, raise max_samples if the memory "
            "is there, or "
            "use an out-of-core method: LandmarkIsomap, MetricMDS(metric='euclidean'), "
            "LaplacianEigenmaps or DiffusionMap")
    return source.read_rows(0, n)


def _fix_signs(V: np.ndarray) -> np.ndarray:
    """Each column with its entry of largest magnitude positive (as the core does)."""
    big = np.argmax(np.abs(V), axis=0)
    signs = np.sign(V[big, np.arange(V.shape[1])])
    signs[signs == 0] = 1.0
    return V * signs


def _top_positive(owner: str, B: np.ndarray, p: int, solver: str, seed: int):
    """The p largest eigenpairs of the symmetric B, checked positive."""
    n = B.shape[0]
    if p >= n:
        raise InvalidParameterError(
            f"{owner}: n_components={p} must be below the number of training rows ({n})")
    if solver == "auto":
        solver = "dense" if n <= DENSE_EIGEN_MAX_ROWS else "arpack"
    if solver == "dense":
        vals, V = top_eigenpairs(B, p)
    else:
        v0 = np.random.default_rng(seed).uniform(-1.0, 1.0, n)
        vals, V = eigsh(B, k=p, which="LA", v0=v0)
        order = np.argsort(vals)[::-1]
        vals, V = vals[order], _fix_signs(V[:, order])
    if np.any(vals <= 0):
        raise InvalidParameterError(
            f"{owner}: only {int(np.sum(vals > 0))} of the {p} leading eigenvalues of the "
            f"double-centred matrix are positive (they are {np.array2string(vals, precision=3)}); "
            "lower n_components")
    return vals, V


def _double_centre(S: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """``B = -1/2 J S J`` for squared distances S; returns (B, column means of S, mean of S)."""
    col = S.mean(axis=0)
    row = S.mean(axis=1)
    total = float(col.mean())
    B = S - row[:, None]
    B -= col[None, :]
    B += total
    B *= -0.5
    return B, col, total


def _check_connected(owner: str, graph, n_neighbors: int, what: str, X=None):
    """``graph``, its connected components joined as scikit-learn's Isomap does.

    A neighbour graph with several components leaves some geodesic distances
    infinite. As :class:`sklearn.manifold.Isomap` does, each pair of components is
    joined by an edge between its two closest rows (with a ``UserWarning``); ``X``
    are the graph's rows.
    """
    n_comp, labels = connected_components(graph, directed=False)
    if n_comp == 1:
        return graph
    warnings.warn(
        f"{owner}: the {n_neighbors}-nearest-neighbour graph of {what} has {n_comp} "
        "connected components; they are joined by their closest pairs of rows, as "
        "scikit-learn's Isomap does. Increase n_neighbors to avoid this.",
        UserWarning, stacklevel=3)
    from sklearn.utils.graph import _fix_connected_components

    graph = graph.tolil()
    graph = _fix_connected_components(X, graph, n_comp, labels, mode="distance",
                                      metric="euclidean")
    return graph.tocsr()


class _Fitted(FeatureNamesMixin, TransformerMixin):
    """``_check_fitted`` and ``fit_transform`` shared by the estimators (a
    ``TransformerMixin`` itself, so ``set_output`` wraps this ``fit_transform``)."""

    def fit_transform(self, X, y=None):
        """Fit and return ``embedding_`` (no second pass over X)."""
        return self.fit(X).embedding_

    def _check_fitted(self):
        return check_fitted(self, "_map")


# --------------------------------------------------------------------------- #
# Laplacian eigenmaps and diffusion maps: out of core, from the divisive embedding
# --------------------------------------------------------------------------- #
@dataclass(frozen=True, eq=False)
class _DivisiveCoordinates:
    """``scale_k v_k(x) / sqrt(d(x))`` from a ``divisive-exact`` spectral map."""

    smap: Any
    scale: np.ndarray

    @property
    def n_components(self) -> int:
        return int(self.scale.shape[0])

    def embed(self, X: np.ndarray) -> np.ndarray:
        V, d = self.smap.embed_with_degrees(X)
        V /= np.sqrt(d)[:, None]
        V *= self.scale
        return V


class _DivisiveBase(_Fitted, FeatureNamesMixin, TransformerMixin, BaseEstimator):
    """Fit of the divisive embedding and the coordinate map; subclasses set the scale."""

    def __init__(self, n_components=2, *, kernel="rbf", gamma=None, degree=3, coef0=1.0,
                 tol=1e-3, dictionary_size=None, selection="greedy", max_dictionary_size=5000,
                 affine=True, sample_size=20000, chunk_rows=None, random_state=None):
        self.n_components = n_components
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.tol = tol
        self.dictionary_size = dictionary_size
        self.selection = selection
        self.max_dictionary_size = max_dictionary_size
        self.affine = affine
        self.sample_size = sample_size
        self.chunk_rows = chunk_rows
        self.random_state = random_state

    def _scale(self, smap) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _check_extra(self) -> None:
        pass

    def fit(self, X, y=None):
        """Fit the divisive embedding of X and compute the coordinates of its rows.

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str
            The n x d data or the path/URL of a zarr array.
        y : ignored

        Returns
        -------
        self
        """
        self._check_extra()
        seed = resolve_seed(self.random_state)
        source = open_source(X)
        est = GreedySpectralEmbedding(
            n_components=self.n_components, kernel=self.kernel, gamma=self.gamma,
            degree=self.degree, coef0=self.coef0, tol=self.tol,
            dictionary_size=self.dictionary_size, selection=self.selection,
            max_dictionary_size=self.max_dictionary_size, affine=self.affine,
            normalization="divisive", degree_estimate="exact", drop_first=True,
            sample_size=self.sample_size, chunk_rows=self.chunk_rows, random_state=seed)
        # A dask view of numpy input keeps the estimator's own pass 3 lazy (and unused):
        # the coordinates below need the degrees, which that pass does not return.
        est.fit(source.to_dask() if source.kind == "numpy" else source)
        smap = est.spectral_map_
        self.embedding_estimator_ = est
        self.spectral_map_ = smap
        self.volume_ = float(smap.center @ smap.center)
        self.eigenvalues_ = smap.eigenvalues.copy()
        self._map = _DivisiveCoordinates(smap, self._scale(smap))
        self.n_features_in_ = est.n_features_in_
        self.gamma_ = est.gamma_
        self.dictionary_ = est.dictionary_
        self.max_residual_ = est.max_residual_
        self.random_state_ = seed
        # the unwrapped transform: embedding_ stays an array under set_output
        self.embedding_ = type(self).transform.__wrapped__(self, X)
        return self

    def transform(self, X):
        """Coordinates of new rows (Nyström formula of the normalized kernel, eq. 11).

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str
            Rows with the training columns.

        Returns
        -------
        ndarray or dask array of shape (n_rows, n_components)
            numpy for numpy input, a lazy dask array otherwise; on training rows,
            the training coordinates.
        """
        emap = self._check_fitted()
        m = emap.smap.dictionary.size
        return _apply_rows(type(self).__name__, emap, X, self.n_features_in_,
                           8 * (2 * self.n_features_in_ + 3 * m), self.chunk_rows)


class LaplacianEigenmaps(_DivisiveBase):
    """Laplacian eigenmaps (Belkin & Niyogi) from a greedy dictionary, out of core.

    The coordinates are the generalized eigenvectors of ``(D - K) f = mu D f``
    normalized ``f'Df = 1`` (Bengio et al. 2003, eq. 4), the trivial constant
    one dropped: ``f_k = D^-1/2 v_k`` where ``v_k`` are the unit eigenvectors of
    ``D^-1/2 K D^-1/2`` computed by :class:`~ooc_spectral.GreedySpectralEmbedding`
    (``normalization="divisive"``, exact degrees of the approximate Gram
    matrix). This is the scaling of scikit-learn's ``SpectralEmbedding``.
    Memory is independent of n (three parallel passes over X and a sequential
    scan; see the core estimator).

    Parameters
    ----------
    n_components : int, default=2
        Coordinates p (the trivial one not counted).
    kernel, gamma, degree, coef0, tol, dictionary_size, selection, max_dictionary_size, \
affine, sample_size, chunk_rows, random_state
        As for :class:`~ooc_spectral.GreedySpectralEmbedding`; ``tol`` bounds the
        entrywise error of the approximate kernel matrix (Proposition 1).

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
        ``D^-1/2 v_k`` for each training row; numpy for numpy input, a lazy dask
        array otherwise.
    eigenvalues_ : ndarray of shape (n_components,)
        ``lambda_k`` of ``D^-1/2 K D^-1/2``; the Laplacian eigenvalues are ``1 - lambda_k``.
    volume_ : float
        ``sum_i d_i``, the sum of the degrees.
    embedding_estimator_ : GreedySpectralEmbedding
    spectral_map_ : SpectralMap
    dictionary_, gamma_, max_residual_, n_features_in_, random_state_
        As for the core estimator.

    Examples
    --------
    >>> from ooc_spectral.manifold import LaplacianEigenmaps
    >>> from ooc_spectral.datasets import generate
    >>> X, _ = generate("swiss-roll", 1000, seed=0)
    >>> LaplacianEigenmaps(2, gamma=0.1, random_state=0).fit(X).embedding_.shape
    (1000, 2)
    """

    def _scale(self, smap) -> np.ndarray:
        return np.ones(smap.n_components)


class DiffusionMap(_DivisiveBase):
    """Diffusion map coordinates from a greedy dictionary, out of core.

    ``Psi_t(x) = (lambda_k^t psi_k(x))_k`` with ``psi_k = sqrt(vol) D^-1/2 v_k`` the
    right eigenvectors of the Markov matrix ``D^-1 K`` (normalized so that the
    trivial one is 1 and ``sum_i (d_i / vol) psi_k(x_i)^2 = 1``), ``lambda_k``
    their eigenvalues (those of ``D^-1/2 K D^-1/2``), t the diffusion time;
    Euclidean distances between coordinates are diffusion distances
    (Coifman & Lafon 2006; the diffusion map of Homrighausen & McDonald 2011,
    section 2.1). Out of core, as :class:`LaplacianEigenmaps`.

    Parameters
    ----------
    n_components : int, default=2
    diffusion_time : float, default=1.0
        t >= 0; 0 gives the eigenvectors ``psi_k`` themselves.
    kernel, gamma, degree, coef0, tol, dictionary_size, selection, max_dictionary_size, \
affine, sample_size, chunk_rows, random_state
        As for :class:`~ooc_spectral.GreedySpectralEmbedding`.

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
    eigenvalues_ : ndarray of shape (n_components,)
        ``lambda_k`` (the coordinates carry ``lambda_k ** diffusion_time``).
    volume_ : float
    embedding_estimator_, spectral_map_, dictionary_, gamma_, max_residual_, \
n_features_in_, random_state_
        As for :class:`LaplacianEigenmaps`.
    """

    def __init__(self, n_components=2, *, diffusion_time=1.0, kernel="rbf", gamma=None,
                 degree=3, coef0=1.0, tol=1e-3, dictionary_size=None, selection="greedy",
                 max_dictionary_size=5000, affine=True, sample_size=20000, chunk_rows=None,
                 random_state=None):
        super().__init__(n_components, kernel=kernel, gamma=gamma, degree=degree, coef0=coef0,
                         tol=tol, dictionary_size=dictionary_size, selection=selection,
                         max_dictionary_size=max_dictionary_size, affine=affine,
                         sample_size=sample_size, chunk_rows=chunk_rows,
                         random_state=random_state)
        self.diffusion_time = diffusion_time

    def _check_extra(self) -> None:
        check_float(type(self).__name__, "diffusion_time", self.diffusion_time, low=0.0)

    def _scale(self, smap) -> np.ndarray:
        vol = float(smap.center @ smap.center)
        return np.sqrt(vol) * smap.eigenvalues ** float(self.diffusion_time)


# --------------------------------------------------------------------------- #
# metric MDS
# --------------------------------------------------------------------------- #
@dataclass(frozen=True, eq=False)
class _MDSMap:
    """Eq. 14 with eq. 11: the double-centred kernel row of x against the training rows."""

    X_fit: np.ndarray
    metric: str
    col_mean: np.ndarray
    total_mean: float
    proj: np.ndarray  # V / sqrt(lambda)

    @property
    def n_components(self) -> int:
        return int(self.proj.shape[1])

    def embed(self, X: np.ndarray) -> np.ndarray:
        S = cdist(X, self.X_fit, metric=self.metric)
        S *= S
        Kt = S - S.mean(axis=1, keepdims=True)
        Kt -= self.col_mean
        Kt += self.total_mean
        Kt *= -0.5
        return Kt @ self.proj


class MetricMDS(_Fitted, FeatureNamesMixin, TransformerMixin, BaseEstimator):
    """Metric (classical) multidimensional scaling with its out-of-sample extension.

    The double-centring of squared distances (Bengio et al. 2003, eq. 2 and
    its continuous version eq. 14): ``e_ik = sqrt(lambda_k) v_ki`` from the
    leading eigenpairs of ``-1/2 J D^2 J``, and for a new row
    ``e_k(x) = (1/sqrt(lambda_k)) sum_i v_ki K~(x, x_i)``. This is classical
    (Torgerson-Gower) scaling, not the stress-minimizing SMACOF of scikit-learn's
    ``MDS``.

    ``metric="euclidean"`` runs **out of core**: with Euclidean distances the
    kernel of eq. 14 is the centred linear kernel, so the result is kernel PCA
    with a linear kernel, computed by :class:`~ooc_spectral.GreedySpectralEmbedding`
    with ``k(x, y) = gamma x.y + 1`` (polynomial of degree 1, ``affine=False``; its
    centred Gram matrix is ``gamma`` times the linear one, undone on the output):
    the greedy dictionary spans the whole feature space with at most d + 1 rows,
    every row is projected exactly, and the embedding equals the dense
    computation (and PCA). ``n_components`` can then be at most the rank of X.
    Any other ``metric`` (a name ``scipy.spatial.distance.cdist`` knows) holds the
    n x n distance matrix **in memory** (at most ``max_samples`` rows).

    Parameters
    ----------
    n_components : int, default=2
    metric : str, default="euclidean"
    tol : float, default=0.0
        Euclidean only: the dictionary scan's tolerance. 0 keeps every direction
        of the data (rows are then projected exactly).
    eigen_solver : {"auto", "dense", "arpack"}, default="auto"
        Other metrics: the eigensolver of the n x n matrix.
    max_samples : int, default=20000
        Other metrics: most training rows.
    chunk_rows : int, default=None
        Rows per task of the blockwise passes.
    random_state : int, default=None
        Seed of the scan's visiting order (euclidean) or of ARPACK.

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
    eigenvalues_ : ndarray of shape (n_components,)
        ``lambda_k`` of the double-centred matrix.
    out_of_core_ : bool
        Whether the fit ran out of core (``metric="euclidean"``).
    embedding_estimator_ : GreedySpectralEmbedding or None
        The core estimator of the Euclidean case.
    n_features_in_ : int
    """

    def __init__(self, n_components=2, *, metric="euclidean", tol=0.0, eigen_solver="auto",
                 max_samples=20000, chunk_rows=None, random_state=None):
        self.n_components = n_components
        self.metric = metric
        self.tol = tol
        self.eigen_solver = eigen_solver
        self.max_samples = max_samples
        self.chunk_rows = chunk_rows
        self.random_state = random_state

    def fit(self, X, y=None):
        """Fit on X (see the class docstring for which path runs).

        Returns
        -------
        self
        """
        name = type(self).__name__
        p = check_int(name, "n_components", self.n_components, low=1)
        check_choice(name, "eigen_solver", self.eigen_solver, ("auto", "dense", "arpack"))
        max_samples = check_int(name, "max_samples", self.max_samples, low=2)
        check_int(name, "chunk_rows", self.chunk_rows, low=1, none=True)
        if not isinstance(self.metric, str):
            raise InvalidParameterError(
                f"{name}: metric={self.metric!r} must be a metric name of "
                "scipy.spatial.distance.cdist, e.g. 'euclidean' or 'cityblock'")
        seed = resolve_seed(self.random_state)
        self.random_state_ = seed
        if self.metric == "euclidean":
            check_float(name, "tol", self.tol, low=0.0)
            source = open_source(X)
            # The centred kernel of eq. 14 for Euclidean distances is the centred linear
            # kernel; k(x, y) = gamma x.y + 1 (polynomial, degree 1) has the same centred
            # Gram matrix up to the factor gamma, and its feature space has d + 1
            # dimensions, so the dictionary can hold d + 1 rows and n_components can reach
            # d. gamma = 1 / median ||x||^2 (the core's heuristic) keeps both terms of order 1.
            est = GreedySpectralEmbedding(
                n_components=p, kernel="polynomial", degree=1, coef0=1.0, gamma=None,
                affine=False, tol=self.tol, normalization="additive",
                max_dictionary_size=max(5000, source.n_features + 2),
                chunk_rows=self.chunk_rows, random_state=seed).fit(source)
            scale = 1.0 / np.sqrt(est.gamma_)
            self.embedding_estimator_ = est
            self.out_of_core_ = True
            self.embedding_ = est.embedding_ * scale
            self.eigenvalues_ = est.eigenvalues_ / est.gamma_
            self.n_features_in_ = est.n_features_in_
            self._map = est
            self._scale = scale
            return self
        Xf = _read_in_memory(name, X, max_samples, "the n x n distance matrix")
        try:
            S = cdist(Xf[:2], Xf[:2], metric=self.metric)
        except (ValueError, TypeError) as exc:
            raise InvalidParameterError(
                f"{name}: metric={self.metric!r} is not a metric scipy.spatial.distance.cdist "
                f"knows ({exc}); use e.g. 'euclidean', 'cityblock' or 'chebyshev'") from None
        S = cdist(Xf, Xf, metric=self.metric)
        S *= S
        B, col, total = _double_centre(S)
        del S
        vals, V = _top_positive(name, B, p, self.eigen_solver, seed)
        self.embedding_estimator_ = None
        self.out_of_core_ = False
        self.eigenvalues_ = vals
        self.embedding_ = V * np.sqrt(vals)
        self.n_features_in_ = Xf.shape[1]
        self._map = _MDSMap(Xf, self.metric, col, total, V / np.sqrt(vals))
        return self

    def transform(self, X):
        """Out-of-sample embedding (eq. 14 with eq. 11).

        Returns
        -------
        ndarray or dask array of shape (n_rows, n_components)
            numpy for numpy input, a lazy dask array otherwise.
        """
        emap = self._check_fitted()
        if self.out_of_core_:
            return emap.transform(X) * self._scale
        n = emap.X_fit.shape[0]
        return _apply_rows(type(self).__name__, emap, X, self.n_features_in_, 8 * 3 * n,
                           self.chunk_rows)


# --------------------------------------------------------------------------- #
# Isomap, in memory
# --------------------------------------------------------------------------- #
def _geodesic_to(nbrs: NearestNeighbors, n_neighbors: int, X: np.ndarray,
                 geo_T: np.ndarray) -> np.ndarray:
    """``min_j (||x - g_j|| + G(g_j, .))`` over the k nearest graph nodes ``g_j`` of each row.

    ``geo_T`` is (nodes x targets): geodesic distances from each graph node to
    each target. Returns (rows x targets).
    """
    dist, ind = nbrs.kneighbors(X, n_neighbors=n_neighbors)
    out = dist[:, :1] + geo_T[ind[:, 0]]
    for j in range(1, ind.shape[1]):
        np.minimum(out, dist[:, j:j + 1] + geo_T[ind[:, j]], out=out)
    return out


@dataclass(frozen=True, eq=False)
class _IsomapMap:
    nbrs: NearestNeighbors
    n_neighbors: int
    geo: np.ndarray  # geodesic distances, nodes x targets (symmetric n x n for Isomap)
    col_mean: np.ndarray  # E_x'[D~^2(x', target_i)]
    proj: np.ndarray  # V / sqrt(lambda)

    @property
    def n_components(self) -> int:
        return int(self.proj.shape[1])

    def embed(self, X: np.ndarray) -> np.ndarray:
        G = _geodesic_to(self.nbrs, self.n_neighbors, X, self.geo)
        G *= G
        # eq. 15: 1/(2 sqrt(lambda)) sum_i v_ki (E[D~^2(., x_i)] - D~^2(x, x_i)); the
        # row-mean and total-mean terms of eq. 14 vanish against v (sum_i v_ki = 0)
        G -= self.col_mean
        G *= -0.5
        return G @ self.proj


class Isomap(_Fitted, FeatureNamesMixin, TransformerMixin, BaseEstimator):
    """Isomap in memory, with the out-of-sample extension of Bengio et al. (eq. 14-15).

    Geodesic distances on the k-nearest-neighbour graph of the training rows
    (Dijkstra), classical scaling of their squares; a new row reaches the graph
    through its k nearest training rows, ``D~(x, x_i) = min_j (||x - x_j|| +
    D~(x_j, x_i))``, and is embedded by eq. 15 (= eq. 11 with the kernel of
    eq. 14, Corollary 1). The same graph, the same extension and the same scale
    as scikit-learn's ``Isomap``; signs are fixed (the entry of largest
    magnitude of each eigenvector is positive).

    **In memory**: the n x n geodesic matrix is held (at most ``max_samples``
    rows). For larger n use :class:`LandmarkIsomap`.

    Parameters
    ----------
    n_components : int, default=2
    n_neighbors : int, default=5
    eigen_solver : {"auto", "dense", "arpack"}, default="auto"
        "auto": dense up to 3000 rows, ARPACK above.
    max_samples : int, default=20000
    chunk_rows : int, default=None
        Rows per task of ``transform``.
    random_state : int, default=None
        Seed of ARPACK's start vector.

    Attributes
    ----------
    embedding_ : ndarray of shape (n_samples, n_components)
    eigenvalues_ : ndarray of shape (n_components,)
    dist_matrix_ : ndarray of shape (n_samples, n_samples)
        Geodesic distances between training rows.
    n_features_in_ : int
    """

    def __init__(self, n_components=2, *, n_neighbors=5, eigen_solver="auto", max_samples=20000,
                 chunk_rows=None, random_state=None):
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.eigen_solver = eigen_solver
        self.max_samples = max_samples
        self.chunk_rows = chunk_rows
        self.random_state = random_state

    def fit(self, X, y=None):
        """Fit on X (read into memory).

        Returns
        -------
        self
        """
        name = type(self).__name__
        p = check_int(name, "n_components", self.n_components, low=1)
        k = check_int(name, "n_neighbors", self.n_neighbors, low=1)
        check_choice(name, "eigen_solver", self.eigen_solver, ("auto", "dense", "arpack"))
        max_samples = check_int(name, "max_samples", self.max_samples, low=2)
        check_int(name, "chunk_rows", self.chunk_rows, low=1, none=True)
        Xf = _read_in_memory(name, X, max_samples, "the n x n geodesic distance matrix")
        n = Xf.shape[0]
        if k >= n:
            raise InvalidParameterError(
                f"{name}: n_neighbors={k} must be below the number of training rows ({n})")
        seed = resolve_seed(self.random_state)
        nbrs = NearestNeighbors(n_neighbors=k).fit(Xf)
        graph = nbrs.kneighbors_graph(None, n_neighbors=k, mode="distance")
        graph = _check_connected(name, graph, k, "the training rows", Xf)
        geo = shortest_path(graph, method="D", directed=False)
        S = geo * geo
        B, col, _ = _double_centre(S)
        del S
        vals, V = _top_positive(name, B, p, self.eigen_solver, seed)
        self.dist_matrix_ = geo
        self.eigenvalues_ = vals
        self.embedding_ = V * np.sqrt(vals)
        self.n_features_in_ = Xf.shape[1]
        self.random_state_ = seed
        self._map = _IsomapMap(nbrs, k, geo, col, V / np.sqrt(vals))
        return self

    def transform(self, X):
        """Out-of-sample embedding (eq. 15), block by block.

        Returns
        -------
        ndarray or dask array of shape (n_rows, n_components)
            numpy for numpy input, a lazy dask array otherwise.
        """
        emap = self._check_fitted()
        n = emap.geo.shape[1]
        return _apply_rows(type(self).__name__, emap, X, self.n_features_in_,
                           8 * (3 * n + 2 * self.n_neighbors), self.chunk_rows)


# --------------------------------------------------------------------------- #
# landmark Isomap, out of core, the greedy dictionary as landmarks
# --------------------------------------------------------------------------- #
class LandmarkIsomap(_Fitted, FeatureNamesMixin, TransformerMixin, BaseEstimator):
    """Landmark Isomap (de Silva & Tenenbaum) with the greedy dictionary as landmarks.

    Out of core:

    1. landmarks: the greedy dictionary of X (pass 1 of
       :class:`~ooc_spectral.GreedySpectralEmbedding`, a sequential scan that
       keeps every row within ``tol`` of the landmarks' span in the feature space
       of ``kernel``: with the Gaussian kernel they cover the data at the
       kernel's width; the core estimator's fit also runs its pass 2, one
       parallel pass whose result is not used here);
    2. geodesics: the k-nearest-neighbour graph of a seeded in-memory sample of
       ``graph_size`` rows plus the landmarks, Dijkstra from every landmark;
    3. classical scaling of the m x m squared landmark geodesics;
    4. every row of X (and any new row), block by block: its geodesic distance to
       each landmark through its k nearest graph nodes, then eq. 15 of Bengio et
       al. (2003), which Corollary 1 shows is the Nyström extension of Isomap.

    Memory is O(graph_size x (d + k + m) + m^2) whatever n. With ``graph_size``
    at least n and every row a landmark this is :class:`Isomap`.

    Parameters
    ----------
    n_components : int, default=2
    n_neighbors : int, default=10
    graph_size : int, default=20000
        Rows of the seeded sample that carries the neighbourhood graph.
    kernel, gamma, tol, dictionary_size, max_dictionary_size, sample_size, chunk_rows
        The landmark scan, as for :class:`~ooc_spectral.GreedySpectralEmbedding`
        (``dictionary_size`` asks for exactly that many landmarks).
    random_state : int, default=None

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
    eigenvalues_ : ndarray of shape (n_components,)
        Of the double-centred squared landmark geodesics.
    landmarks_ : ndarray of shape (m, n_features)
    landmark_indices_ : ndarray of shape (m,)
        Their row numbers in X.
    landmark_embedding_ : ndarray of shape (m, n_components)
        ``sqrt(lambda_k) v_ki``, the landmarks' coordinates.
    landmark_geodesics_ : ndarray of shape (m, m)
    graph_indices_ : ndarray
        Row numbers in X of the graph's nodes.
    gamma_ : float or None
    n_features_in_ : int
    """

    def __init__(self, n_components=2, *, n_neighbors=10, graph_size=20000, kernel="rbf",
                 gamma=None, tol=1e-3, dictionary_size=None, max_dictionary_size=5000,
                 sample_size=20000, chunk_rows=None, random_state=None):
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.graph_size = graph_size
        self.kernel = kernel
        self.gamma = gamma
        self.tol = tol
        self.dictionary_size = dictionary_size
        self.max_dictionary_size = max_dictionary_size
        self.sample_size = sample_size
        self.chunk_rows = chunk_rows
        self.random_state = random_state

    def fit(self, X, y=None):
        """Select the landmarks, build the graph, embed every row of X.

        Returns
        -------
        self
        """
        name = type(self).__name__
        p = check_int(name, "n_components", self.n_components, low=1)
        k = check_int(name, "n_neighbors", self.n_neighbors, low=1)
        graph_size = check_int(name, "graph_size", self.graph_size, low=2)
        seed = resolve_seed(self.random_state)
        source = open_source(X)
        # The landmarks are the dictionary of the core estimator. Its pass 2 (one
        # parallel pass) is not needed here; its pass 3 stays lazy and is never run
        # (numpy input goes in as a dask view for that).
        est = GreedySpectralEmbedding(
            n_components=1, kernel=self.kernel, gamma=self.gamma, tol=self.tol,
            dictionary_size=self.dictionary_size, max_dictionary_size=self.max_dictionary_size,
            sample_size=self.sample_size, chunk_rows=self.chunk_rows, random_state=seed)
        est.fit(source.to_dask() if source.kind == "numpy" else source)
        gamma = est.gamma_
        points = np.asarray(est.dictionary_)
        m = points.shape[0]
        if m <= p:
            raise DictionaryError(
                f"{name}: the greedy dictionary has {m} landmarks, not more than "
                f"n_components={p}; lower tol, raise gamma, or ask for dictionary_size > {p}")
        lm_rows = np.asarray(est.dictionary_indices_, dtype=np.int64)
        sample = plan_sample(source.n_rows, graph_size, seed, GRAPH_SAMPLE_PURPOSE)
        nodes = np.union1d(sample, lm_rows)
        G = source.read_index(nodes)
        if k >= nodes.size:
            raise InvalidParameterError(
                f"{name}: n_neighbors={k} must be below the number of graph nodes ({nodes.size})")
        lm_nodes = np.searchsorted(nodes, lm_rows)
        nbrs = NearestNeighbors(n_neighbors=k).fit(G)
        graph = nbrs.kneighbors_graph(None, n_neighbors=k, mode="distance")
        graph = _check_connected(name, graph, k, f"the {nodes.size} graph rows", G)
        geo = shortest_path(graph, method="D", directed=False, indices=lm_nodes)  # m x nodes
        D_L = geo[:, lm_nodes]
        D_L = 0.5 * (D_L + D_L.T)
        B, col, _ = _double_centre(D_L * D_L)
        vals, V = _top_positive(name, B, p, "dense", seed)
        self.landmarks_ = points
        self.landmark_indices_ = lm_rows
        self.landmark_geodesics_ = D_L
        self.landmark_embedding_ = V * np.sqrt(vals)
        self.graph_indices_ = nodes
        self.eigenvalues_ = vals
        self.gamma_ = gamma
        self.n_features_in_ = source.n_features
        self.random_state_ = seed
        self._map = _IsomapMap(nbrs, k, np.ascontiguousarray(geo.T), col, V / np.sqrt(vals))
        # the unwrapped transform: embedding_ stays an array under set_output
        self.embedding_ = type(self).transform.__wrapped__(self, source)
        return self

    def transform(self, X):
        """Embedding of any rows by eq. 15 through the graph, block by block.

        Returns
        -------
        ndarray or dask array of shape (n_rows, n_components)
            numpy for numpy input, a lazy dask array otherwise.
        """
        emap = self._check_fitted()
        m = emap.geo.shape[1]
        return _apply_rows(type(self).__name__, emap, X, self.n_features_in_,
                           8 * (3 * m + 2 * self.n_neighbors + self.n_features_in_),
                           self.chunk_rows)


# --------------------------------------------------------------------------- #
# LLE, in memory
# --------------------------------------------------------------------------- #
def _barycenter_weights(X: np.ndarray, Y: np.ndarray, ind: np.ndarray, reg: float) -> np.ndarray:
    """Weights (summing to 1) reconstructing each row of X from its neighbours ``Y[ind]``.

    The regularized local Gram system of Roweis & Saul, as scikit-learn solves it:
    ``(C + reg trace(C) I) w = 1`` (``reg`` alone when the trace is 0), then normalized.
    """
    n, k = ind.shape
    W = np.empty((n, k))
    ones = np.ones(k)
    for i in range(n):
        Z = Y[ind[i]] - X[i]
        C = Z @ Z.T
        tr = np.trace(C)
        C.flat[::k + 1] += reg * tr if tr > 0 else reg
        w = solve(C, ones, assume_a="pos")
        W[i] = w / w.sum()
    return W


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


class LocallyLinearEmbedding(_Fitted, FeatureNamesMixin, TransformerMixin, BaseEstimator):
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
    chunk_rows : int, default=None
    random_state : int, default=None
        Seed of ARPACK's start vector.

    Attributes
    ----------
    embedding_ : ndarray of shape (n_samples, n_components)
    eigenvalues_ : ndarray of shape (n_components,)
        The eigenvalues of M for the kept eigenvectors (the smallest non-trivial).
    n_features_in_ : int
    """

    def __init__(self, n_components=2, *, n_neighbors=5, reg=1e-3, eigen_solver="auto",
                 tol=1e-6, max_samples=20000, chunk_rows=None, random_state=None):
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.reg = reg
        self.eigen_solver = eigen_solver
        self.tol = tol
        self.max_samples = max_samples
        self.chunk_rows = chunk_rows
        self.random_state = random_state

    def fit(self, X, y=None):
        """Fit on X (read into memory).

        Returns
        -------
        self
        """
        name = type(self).__name__
        p = check_int(name, "n_components", self.n_components, low=1)
        k = check_int(name, "n_neighbors", self.n_neighbors, low=1)
        reg = check_float(name, "reg", self.reg, low=0.0)
        solver = check_choice(name, "eigen_solver", self.eigen_solver, ("auto", "dense", "arpack"))
        tol = check_float(name, "tol", self.tol, low=0.0)
        max_samples = check_int(name, "max_samples", self.max_samples, low=2)
        check_int(name, "chunk_rows", self.chunk_rows, low=1, none=True)
        Xf = _read_in_memory(name, X, max_samples,
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
        self.embedding_ = _fix_signs(V[:, 1:])
        self.n_features_in_ = Xf.shape[1]
        self.random_state_ = seed
        self._map = _LLEMap(nbrs, Xf, k, reg, self.embedding_)
        return self

    def transform(self, X):
        """Out-of-sample embedding (eq. 16), block by block.

        Returns
        -------
        ndarray or dask array of shape (n_rows, n_components)
            numpy for numpy input, a lazy dask array otherwise.
        """
        emap = self._check_fitted()
        k = self.n_neighbors
        return _apply_rows(type(self).__name__, emap, X, self.n_features_in_,
                           8 * (k * (self.n_features_in_ + k + self.n_components) + 4),
                           self.chunk_rows)
