"""Isomap and landmark Isomap, with the out-of-sample extension of Bengio et al. (2003).

Both embed by classical scaling of squared geodesic distances on a
k-nearest-neighbour graph (eq. 14 with the geodesic distance, = eq. 15,
Corollary 1); a new row reaches the graph through its k nearest graph nodes,
``D~(x, x_i) = min_j (||x - x_j|| + D~(x_j, x_i))``.

- :class:`Isomap`: in memory, the n x n geodesic matrix of the training rows.
- :class:`LandmarkIsomap`: out of core, the greedy dictionary as landmarks and
  the graph on a seeded sample of ``graph_size`` rows.

Both are importable from :mod:`ooc_spectral.manifold`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse.csgraph import shortest_path
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.neighbors import NearestNeighbors

from ._manifold import (
    Fitted,
    check_connected,
    check_in_memory_params,
    check_sizes,
    double_centre,
    read_in_memory,
    top_positive,
)
from .._params import store_params
from ._sklearn import FeatureNamesMixin
from .._validation import check_int
from ..core.config import resolve_seed
from .embedding import GreedySpectralEmbedding
from ..exceptions import DictionaryError, InvalidParameterError
from ..core.planning import plan_sample
from ..io.source import open_source

__all__ = ["Isomap", "LandmarkIsomap", "GRAPH_SAMPLE_PURPOSE"]

#: ``purpose`` tag of the graph sample of :class:`LandmarkIsomap` (see ``plan_sample``).
GRAPH_SAMPLE_PURPOSE = 0x15


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


class Isomap(Fitted, FeatureNamesMixin, TransformerMixin, BaseEstimator):
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
    feature_names_in_ : ndarray of str, shape (n_features,)
        The column names of a DataFrame X (only then); ``transform`` refuses rows whose
        names differ or come in another order.
    """

    def __init__(self, n_components=2, *, n_neighbors=5, eigen_solver="auto", max_samples=20000,
                 chunk_rows=None, random_state=None):
        store_params(self, locals())

    def _fit(self, X) -> None:
        """Geodesics on the k-NN graph of X (read into memory), then classical scaling."""
        name, p, k = check_sizes(self)
        _, max_samples = check_in_memory_params(self)
        Xf = read_in_memory(name, X, max_samples, "the n x n geodesic distance matrix")
        n = Xf.shape[0]
        if k >= n:
            raise InvalidParameterError(
                f"{name}: n_neighbors={k} must be below the number of training rows ({n})")
        seed = resolve_seed(self.random_state)
        nbrs = NearestNeighbors(n_neighbors=k).fit(Xf)
        graph = nbrs.kneighbors_graph(None, n_neighbors=k, mode="distance")
        graph = check_connected(name, graph, k, "the training rows", Xf)
        geo = shortest_path(graph, method="D", directed=False)
        S = geo * geo
        B, col, _ = double_centre(S)
        del S
        vals, V = top_positive(name, B, p, self.eigen_solver, seed)
        self.dist_matrix_ = geo
        self.eigenvalues_ = vals
        self.embedding_ = V * np.sqrt(vals)
        self.n_features_in_ = Xf.shape[1]
        self.random_state_ = seed
        self._map = _IsomapMap(nbrs, k, geo, col, V / np.sqrt(vals))

    def _row_bytes(self, emap) -> int:
        n = emap.geo.shape[1]
        return 8 * (3 * n + 2 * self.n_neighbors)


# --------------------------------------------------------------------------- #
# landmark Isomap, out of core, the greedy dictionary as landmarks
# --------------------------------------------------------------------------- #
class LandmarkIsomap(Fitted, FeatureNamesMixin, TransformerMixin, BaseEstimator):
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
    n_neighbors : int, default=5
        As :class:`Isomap` and scikit-learn's ``Isomap``.
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
    feature_names_in_ : ndarray of str, shape (n_features,)
        The column names of a DataFrame X (only then); ``transform`` refuses rows whose
        names differ or come in another order.
    """

    def __init__(self, n_components=2, *, n_neighbors=5, graph_size=20000, kernel="rbf",
                 gamma=None, tol=1e-3, dictionary_size=None, max_dictionary_size=5000,
                 sample_size=20000, chunk_rows=None, random_state=None):
        store_params(self, locals())

    def _fit(self, X) -> None:
        """Select the landmarks, build the graph, embed every row of X."""
        name, p, k = check_sizes(self)
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
        graph = check_connected(name, graph, k, f"the {nodes.size} graph rows", G)
        geo = shortest_path(graph, method="D", directed=False, indices=lm_nodes)  # m x nodes
        D_L = geo[:, lm_nodes]
        D_L = 0.5 * (D_L + D_L.T)
        B, col, _ = double_centre(D_L * D_L)
        vals, V = top_positive(name, B, p, "dense", seed)
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
        # the map itself, not transform: embedding_ stays an array under set_output
        self.embedding_ = self._apply(self._map, source)

    def _row_bytes(self, emap) -> int:
        m = emap.geo.shape[1]
        return 8 * (3 * m + 2 * self.n_neighbors + self.n_features_in_)

