"""Spectral clustering out of core: :class:`GreedySpectralClustering`.

Two graphs, both solved through a small eigenproblem and both out of core:

* ``affinity="representatives"`` (the default): the bipartite graph of the rows and
  ``m`` representatives, each row joined to its ``K`` nearest ones with a bandwidth
  local on both sides (:mod:`ooc_spectral.core.representatives`; the passes in
  :mod:`ooc_spectral.pipeline.representatives`, the estimator's branch in
  :mod:`ooc_spectral.estimators._representatives`). The sparse, self-tuning kind of
  graph that clusters real data at its defaults (docs/clustering.md: digits, iris, wine,
  breast cancer, noisy moons and circles, blobs of unequal density, 2 * 10^5 x 784
  mixtures, against scikit-learn's k-means and nearest-neighbour spectral clustering).
* ``affinity="kernel"``: the algorithm of Ng, Jordan & Weiss (2002), as Bengio et al.
  (2003, section 2.2) write it, on the greedy spectral embedding:

  1. the divisive embedding: the ``n_components`` (default ``n_clusters``)
     leading unit eigenvectors of ``D^-1/2 K D^-1/2``, the first one (eigenvalue
     1, proportional to ``sqrt(d)``) *kept*, from
     :class:`~ooc_spectral.GreedySpectralEmbedding` with
     ``normalization="divisive", drop_first=False``;
  2. every row of the embedding scaled to unit length;
  3. k-means on those rows, out of core: k-means++ with ``n_init`` restarts on a
     seeded in-memory sample of ``kmeans_sample_size`` rows gives the initial
     centres, then Lloyd iterations over the whole embedding, each one a
     parallel pass that reduces per-chunk ``(sums, counts, inertia)`` of the
     rows assigned to each centre (``k x (p + 2)`` numbers per chunk), combined
     in chunk order so the result does not depend on which worker finished
     first.

  A dense rbf graph at one bandwidth is the wrong graph for most real data: at the
  median heuristic's gamma it falls apart into outlying rows (standardised digits and
  breast cancer: one cluster of nearly every row), which a
  :class:`~ooc_spectral.exceptions.DegeneratePartitionWarning` then says.

Nothing of size n is held in memory for dask, zarr or path input: ``labels_``
is then a lazy dask array (one task per row chunk), and for the kernel affinity each
Lloyd iteration recomputes the embedding of each chunk from X unless ``fit`` was
given ``output=`` (the embedding is then written to zarr once and read back).
For numpy input every result is numpy.

``predict`` maps new rows as the training rows were (for the kernel affinity the
Nyström formula of the embedding, Bengio et al. 2003, eq. 11), scales them to unit
length and returns the nearest centre; on training rows it gives back ``labels_``.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin

from .._params import EMBEDDING_PARAMS, params_of, store_params
from ._sklearn import FeatureNamesInMixin, SparseInputMixin
from .._validation import check_fitted, check_float, check_int, check_n_features
from ..core.config import resolve_seed
from .embedding import GreedySpectralEmbedding
from ..core import degenerate
from ..exceptions import InvalidInputError, InvalidParameterError
from . import _representatives
from ..runtime.execution import Executor
from ..core.planning import plan_sample
from ..io.source import _is_dask_array, open_source

__all__ = ["GreedySpectralClustering", "unit_rows"]

#: ``purpose`` tag of the k-means initialisation sample (see :func:`plan_sample`).
KMEANS_SAMPLE_PURPOSE = 0x4B
#: The graphs the clustering can be made on: each row's nearest representatives
#: (``estimators/_representatives.py``, the default), or the kernel of the greedy
#: dictionary's embedding.
AFFINITIES = ("representatives", "kernel")
#: Rows per block when the embedding is a numpy array.
NUMPY_BLOCK_ROWS = 65536


def unit_rows(E: np.ndarray) -> np.ndarray:
    """``E`` with every row scaled to unit Euclidean length (zero rows stay zero)."""
    E = np.asarray(E, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", E, E))
    norms[norms == 0.0] = 1.0
    return E / norms[:, None]


def _sq_distances(U: np.ndarray, centers: np.ndarray) -> np.ndarray:
    d2 = np.einsum("ij,ij->i", U, U)[:, None] + np.einsum("ij,ij->i", centers, centers)[None, :]
    d2 -= 2.0 * (U @ centers.T)
    np.maximum(d2, 0.0, out=d2)
    return d2


def _block_labels(E: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Nearest centre of each unit-scaled row of the embedding block ``E``."""
    return np.argmin(_sq_distances(unit_rows(E), centers), axis=1).astype(np.int64)


def _block_stats(E: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """``k x (p + 2)``: per centre, the sum of the rows assigned, their count, their inertia."""
    U = unit_rows(E)
    k, p = centers.shape
    d2 = _sq_distances(U, centers)
    lab = np.argmin(d2, axis=1)
    out = np.empty((k, p + 2))
    for j in range(p):
        out[:, j] = np.bincount(lab, weights=U[:, j], minlength=k)
    out[:, p] = np.bincount(lab, minlength=k)
    out[:, p + 1] = np.bincount(lab, weights=d2[np.arange(lab.size), lab], minlength=k)
    return out


def _stats(E, centers: np.ndarray) -> np.ndarray:
    """One Lloyd pass over the embedding: the reduced :func:`_block_stats`, in chunk order."""
    k, p = centers.shape
    if _is_dask_array(E):
        nb = len(E.chunks[0])
        parts = E.map_blocks(_block_stats, centers, chunks=((k,) * nb, (p + 2,)),
                             dtype=np.float64, meta=np.empty((0, p + 2)),
                             name="ooc-spectral-kmeans-stats")
        (values,) = Executor().values("k-means pass", parts)
        return np.asarray(values).reshape(nb, k, p + 2).sum(axis=0)
    total = np.zeros((k, p + 2))
    for a in range(0, E.shape[0], NUMPY_BLOCK_ROWS):
        total += _block_stats(E[a:a + NUMPY_BLOCK_ROWS], centers)
    return total


def _labels(E, centers: np.ndarray):
    if _is_dask_array(E):
        return E.map_blocks(_block_labels, centers, drop_axis=1, dtype=np.int64,
                            meta=np.empty((0,), dtype=np.int64), name="ooc-spectral-kmeans-labels")
    return np.concatenate([_block_labels(E[a:a + NUMPY_BLOCK_ROWS], centers)
                           for a in range(0, E.shape[0], NUMPY_BLOCK_ROWS)])


class GreedySpectralClustering(SparseInputMixin, FeatureNamesInMixin, ClusterMixin, BaseEstimator):
    """Spectral clustering out of core, right at its defaults.

    ``GreedySpectralClustering(n_clusters=k).fit(X)`` clusters on the bipartite graph of
    the rows and ``n_representatives`` representatives (k-means centres of a seeded
    uniform sample), each row joined to its ``n_neighbors`` nearest ones with a Gaussian
    weight whose bandwidth is local on both sides of the edge; the graph's spectral
    embedding comes exactly from an ``m x m`` eigenproblem (the transfer cut), its rows at
    unit length are clustered by k-means, and every row goes to its nearest centre. Two
    passes over the data (the graph's sums, the labels), memory flat in ``n``; numpy,
    dask, zarr arrays and paths/URLs alike. See :mod:`ooc_spectral.core.representatives`
    for the mathematics and docs/clustering.md for the comparison with scikit-learn.

    **The bipartite graph.** ``B`` (``n x m``) has ``b_tj = exp(-|x_t - r_j|^2 /
    (2 s_t s_j))`` for the ``K`` representatives ``r_j`` nearest to row ``x_t``, 0
    elsewhere: ``s_t`` is the row's mean distance to them and ``s_j`` the
    representative's scale, the mean ``s_t`` of the sample rows nearest to it
    (Zelnik-Manor & Perona's local scaling, on both sides of the edge). Then
    ``W = [[0, B], [B', 0]]``, ``D_X = diag(B 1)``, ``D_Y = diag(B' 1)``.

    **The eigenproblem.** The normalized embedding ``(D - W) f = lambda D f``, with
    ``f = (u, v)``, splits into ``u = D_X^-1 B v / (1 - lambda)`` and
    ``B' u = (1 - lambda) D_Y v``; so ``B' D_X^-1 B v = (1 - lambda)^2 D_Y v``, an
    ``m x m`` problem (Li et al.'s transfer cut). Its leading eigenvectors ``w`` of
    ``D_Y^-1/2 B' D_X^-1 B D_Y^-1/2`` (eigenvalues ``mu = (1 - lambda)^2``) give every
    row's coordinates ``u_t = (b_t / d_t) D_Y^-1/2 W diag(mu)^-1/2``: these *are* the row
    part of the ``(n + m)``-node eigenvectors (``D_X^1/2 u`` is a left singular vector of
    ``D_X^-1/2 B D_Y^-1/2``), not an approximation of them. One pass sums
    ``B' D_X^-1 B`` and ``B' 1`` chunk by chunk; ``B`` is never stored.

    **Clustering and predict.** The ``n_components`` leading coordinates (default
    ``n_clusters``, the constant one among them, as Ng, Jordan & Weiss take them), rows
    at unit length. A representative's coordinates are the weighted mean of its rows'
    (divided by ``mu``), so k-means (k-means++, ``n_init`` restarts) on the
    representatives' unit coordinates weighted by their degrees places the centres, and
    every row goes to its nearest centre, its coordinates averaged over its neighbourhood
    (its ``K`` nearest representatives and their near ties: within 1.25 times the
    ``K``-th distance, up to ``4 K``). ``predict`` applies the same function of the row
    alone (its neighbourhood, its weights, the fixed map and centres), so on training rows
    it gives ``labels_``. ``n_clusters="auto"`` takes ``k`` from the
    largest gap between consecutive Laplacian eigenvalues ``1 - sqrt(mu)``
    (:mod:`ooc_spectral.core.eigengap`).

    With ``affinity="kernel"`` the graph is instead the kernel of the greedy dictionary's
    divisive embedding (:class:`~ooc_spectral.GreedySpectralEmbedding`, unit eigenvectors
    of ``D^-1/2 K D^-1/2``, the first one kept), rows at unit length, then k-means over
    the chunks of the embedding: k-means++ on a seeded sample for the initial centres,
    Lloyd iterations as parallel passes with an ordered reduction.

    A partition in which one cluster holds almost every row and the others a handful
    (at most 1% of the rows together) raises a
    :class:`~ooc_spectral.exceptions.DegeneratePartitionWarning` naming what to change.

    Parameters
    ----------
    n_clusters : int or "auto", default=2
        Number of clusters k. 1 puts every row in one cluster, as
        ``KMeans(n_clusters=1)`` does (the embedding is still computed). ``"auto"``
        (``affinity="representatives"``): the k in 2..30 after which the eigengap of
        the bipartite graph's Laplacian is largest (``n_clusters_``, ``eigengaps_``).
    affinity : {"representatives", "kernel"}, default="representatives"
        The graph: the rows' nearest representatives (``n_representatives``,
        ``n_neighbors``), or the kernel of the greedy dictionary's embedding (the
        parameters ``kernel`` to ``sample_size`` below).
    n_representatives : int or "auto", default="auto"
        ``m`` for ``affinity="representatives"`` (at most half the rows are used).
        ``"auto"``: 100 per cluster, at most 1000 (1000 for ``n_clusters="auto"``): the
        graph needs representatives enough to trace each cluster, and each one more
        costs every pass over the rows.
    n_neighbors : int, default=5
        ``K``, the representatives each row is joined to (``affinity="representatives"``).
        A graph that falls into more separate pieces than ``n_clusters`` (always with
        ``K = 1``: one piece per representative) is refused: it does not say which
        pieces belong together.
    n_components : int, default=None
        Embedding coordinates p, the first one (constant for the representatives,
        ``sqrt(d)`` for the kernel) included; None: ``n_clusters`` (Ng, Jordan & Weiss).
    kernel, gamma, degree, coef0, tol, dictionary_size, selection, max_dictionary_size, \
affine, degree_estimate, degree_subset_size, sample_size
        Parameters of the embedding of ``affinity="kernel"``; see
        :class:`~ooc_spectral.GreedySpectralEmbedding`. The kernel must have positive
        values (rbf or laplacian) for the degrees to be positive; ``gamma`` sets the
        scale at which clusters separate.
    chunk_rows : int, default=None
        Rows per task of the passes (both affinities).
    n_init : int, default=10
        k-means++ restarts; the best (lowest inertia) gives the centres
        (representatives), or the initial centres of the full iterations (kernel).
    max_iter : int, default=100
        Most Lloyd iterations (passes) over the whole embedding (kernel).
    kmeans_tol : float, default=1e-6
        Stop when the sum of squared moves of the centres in one iteration is at
        most this (kernel; the rows are on the unit sphere, so this is an absolute scale).
    kmeans_sample_size : int, default=100000
        Rows of the seeded sample for the k-means++ initialisation (kernel).
    random_state : int, RandomState or Generator, default=None
        Seed of the representatives' sample and k-means (or of the embedding's visiting
        order and samples, and k-means).

    Attributes
    ----------
    labels_ : ndarray or dask array of shape (n_samples,)
        Cluster of each training row; numpy for numpy input, a lazy dask array
        otherwise.
    n_clusters_ : int
        The number of clusters made (``n_clusters``, or the one ``"auto"`` chose).
    eigengaps_ : ndarray of shape (30,) or None
        ``n_clusters="auto"`` only: ``eigengaps_[k - 1]`` is the gap between the k-th and
        (k+1)-th smallest Laplacian eigenvalues ``1 - sqrt(mu)``; ``n_clusters_`` is the
        k >= 2 of the largest.
    cluster_centers_ : ndarray of shape (n_clusters, n_components)
        Centres in the unit-row embedding space, one per cluster made (``n_clusters_``
        rows).
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
        The unit-row embedding that was clustered.
    eigenvalues_ : ndarray of shape (n_components,)
        ``mu`` of the transfer cut (representatives; the first is 1), or the
        eigenvalues of ``D^-1/2 K D^-1/2`` (kernel; the first is 1).
    representatives_ : ndarray of shape (m, n_features)
        The representatives (``affinity="representatives"`` only).
    representative_scales_ : ndarray of shape (m,)
        Their scales ``s_j`` (``affinity="representatives"`` only).
    cluster_map_ : ClusterMap or None
        Rows to unit coordinates and clusters (``affinity="representatives"`` only).
    stage_times_ : dict
        Seconds per stage (``affinity="representatives"`` only).
    embedding_estimator_ : GreedySpectralEmbedding or None
        The fitted embedding (its ``transform`` is what ``predict`` applies); None for
        the representatives affinity.
    inertia_ : float
        Sum of squared distances to their centre: of the representatives' unit
        coordinates weighted by their degrees (representatives), of the unit rows
        (kernel).
    n_iter_ : int
        Lloyd iterations: of the best k-means run (representatives), over the whole
        embedding (kernel).
    n_features_in_ : int
    feature_names_in_ : ndarray of str, shape (n_features,)
        The column names of a DataFrame X (only then); ``predict`` refuses rows whose
        names differ or come in another order.
    random_state_ : int
        The seed used.

    References
    ----------
    A. Y. Ng, M. I. Jordan and Y. Weiss, *On spectral clustering: analysis and
    an algorithm*, NIPS 2002.
    L. Zelnik-Manor and P. Perona, *Self-Tuning Spectral Clustering*, NIPS 2004.
    X. Chen and D. Cai, *Large Scale Spectral Clustering with Landmark-Based
    Representation*, AAAI 2011.
    Z. Li, X.-M. Wu and S.-F. Chang, *Segmentation Using Superpixels: A Bipartite Graph
    Partitioning Approach*, CVPR 2012.
    D. Huang et al., *Ultra-Scalable Spectral Clustering and Ensemble Clustering*,
    IEEE TKDE 32(6), 2020.
    U. von Luxburg, *A Tutorial on Spectral Clustering*, Statistics and Computing
    17(4), 2007 (the eigengap heuristic).
    Y. Bengio et al., *Out-of-Sample Extensions for LLE, Isomap, MDS,
    Eigenmaps, and Spectral Clustering*, NIPS 2003 (section 2.2, eq. 11).
    M. Ouimet and Y. Bengio, *Greedy Spectral Embedding*, AISTATS 2005.

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from sklearn.metrics import adjusted_rand_score
    >>> from ooc_spectral.clustering import GreedySpectralClustering
    >>> X, y = load_digits(return_X_y=True)
    >>> sc = GreedySpectralClustering(10, random_state=0).fit(X)
    >>> bool(adjusted_rand_score(y, sc.labels_) > 0.75)  # KMeans: 0.66
    True
    >>> bool((sc.predict(X) == sc.labels_).all())
    True
    >>> from ooc_spectral.datasets import generate
    >>> X, labels = generate("blobs", 3000, n_clusters=4, cluster_std=0.5, seed=0)
    >>> GreedySpectralClustering("auto", random_state=0).fit(X).n_clusters_
    4
    """

    def __init__(self, n_clusters=2, *, affinity="representatives", n_representatives="auto",
                 n_neighbors=5, n_components=None, kernel="rbf", gamma=None, degree=3,
                 coef0=1.0, tol=1e-3, dictionary_size=None, selection="greedy",
                 max_dictionary_size=5000, affine=True, degree_estimate="exact",
                 degree_subset_size=1000, sample_size=20000, chunk_rows=None, n_init=10,
                 max_iter=100, kmeans_tol=1e-6, kmeans_sample_size=100000, random_state=None):
        store_params(self, locals())

    # ------------------------------------------------------------------ #
    def _check_params(self) -> tuple[int | str, int | None]:
        name = type(self).__name__
        if self.affinity not in AFFINITIES:
            raise InvalidParameterError(
                f"{name}: affinity={self.affinity!r}; expected one of {', '.join(AFFINITIES)}")
        if isinstance(self.n_clusters, str) and self.n_clusters == "auto":
            if self.affinity != "representatives":
                raise InvalidParameterError(
                    f"{name}: n_clusters='auto' reads the eigengap of the representatives' "
                    f"eigenproblem, not affinity={self.affinity!r}'s; use "
                    "affinity='representatives' (the default) or an integer n_clusters")
            k = "auto"
        else:
            k = check_int(name, "n_clusters", self.n_clusters, low=1)
        p = check_int(name, "n_components", self.n_components, low=1, none=True)
        check_int(name, "n_init", self.n_init, low=1)
        check_int(name, "max_iter", self.max_iter, low=0)
        check_float(name, "kmeans_tol", self.kmeans_tol, low=0.0)
        check_int(name, "kmeans_sample_size", self.kmeans_sample_size,
                  low=2 if k == "auto" else k)
        return k, p

    def _embedding_estimator(self, n_components: int, seed: int) -> GreedySpectralEmbedding:
        est = GreedySpectralEmbedding(
            n_components=n_components, **params_of(self, EMBEDDING_PARAMS),
            normalization="divisive", degree_estimate=self.degree_estimate,
            degree_subset_size=self.degree_subset_size, drop_first=False, random_state=seed)
        if self.n_components is None:  # its errors name the parameter the user set
            est._parameter_names = {"n_components": "n_clusters"}
        return est

    def fit(self, X, y=None, *, output=None):
        """Embed X, then cluster the unit-length rows of the embedding with k-means.

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str
            The n x d data or the path/URL of a zarr array (as for
            :meth:`GreedySpectralEmbedding.fit`).
        y : ignored
        output : str or os.PathLike, optional
            Zarr group where the embedding is written once (array ``embedding``);
            the k-means passes then read it instead of recomputing it from X.

        Returns
        -------
        self
        """
        k, p = self._check_params()
        self._check_feature_names(X, reset=True)
        seed = resolve_seed(self.random_state)
        if self.affinity == "representatives":
            _representatives.fit(self, X, k, p, seed)
            return self
        p = k if p is None else p
        self.cluster_map_ = None
        # the rows without their column names: this estimator checks those (predict)
        est = self._embedding_estimator(p, seed).fit(open_source(X), output=output)
        n = est.n_samples_fit_
        if n < k:
            raise InvalidInputError(
                f"{type(self).__name__}: X has {n} rows, fewer than n_clusters={k}; "
                "lower n_clusters or pass more rows")
        E = est.embedding_
        if _is_dask_array(E) and len(E.chunks[1]) > 1:
            E = E.rechunk({1: -1})
        centers = self._initial_centers(E, k, seed)
        stats = _stats(E, centers)
        n_iter = 0
        while n_iter < self.max_iter:
            counts = stats[:, p]
            new = centers.copy()
            filled = counts > 0  # an empty cluster keeps its centre
            new[filled] = stats[filled, :p] / counts[filled, None]
            shift = float(np.sum((new - centers) ** 2))
            centers = new
            n_iter += 1
            stats = _stats(E, centers)
            if shift <= self.kmeans_tol:
                break
        self.embedding_estimator_ = est
        self.cluster_centers_ = centers
        self.embedding_ = (E.map_blocks(unit_rows, dtype=np.float64) if _is_dask_array(E)
                           else unit_rows(E))
        self.labels_ = _labels(E, centers)
        self.inertia_ = float(stats[:, p + 1].sum())
        self.n_iter_ = n_iter
        self.n_clusters_, self.eigengaps_ = k, None
        self.eigenvalues_ = est.eigenvalues_.copy()
        self._warn_if_degenerate(stats[:, p], est)
        self.n_features_in_ = est.n_features_in_
        self.random_state_ = seed
        return self

    def _warn_if_degenerate(self, sizes, est) -> None:
        """The :class:`~ooc_spectral.exceptions.DegeneratePartitionWarning` of the kernel
        affinity: one cluster and a handful, the graph's unit eigenvalues said."""
        what = degenerate.partition_message(sizes)
        if what is None:
            return
        pieces = degenerate.unit_eigenvalues(est.eigenvalues_)
        graph = (f"the kernel graph at gamma_={est.gamma_:.3g}"
                 + (" (the median heuristic)" if self.gamma is None else "")
                 + (f" falls into pieces ({pieces} leading eigenvalues equal 1)" if pieces > 1
                    else " nearly falls apart") + " around a few outlying rows")
        degenerate.warn(type(self).__name__, f"the partition is degenerate: {what}; {graph}", (
            "Use affinity='representatives' (the default: a graph local to every row), or "
            f"a smaller gamma (a wider kernel), e.g. gamma={est.gamma_ / 10:.3g}"))

    def _initial_centers(self, E, k: int, seed: int) -> np.ndarray:
        """k-means++ with ``n_init`` restarts on a seeded sample of the unit rows."""
        from sklearn.cluster import KMeans

        rows = plan_sample(E.shape[0], self.kmeans_sample_size, seed, KMEANS_SAMPLE_PURPOSE)
        sample = E[rows]
        if _is_dask_array(sample):
            (sample,) = Executor().values("k-means sample", sample)
        U = unit_rows(sample)
        km = KMeans(n_clusters=k, init="k-means++", n_init=self.n_init, random_state=seed).fit(U)
        return np.ascontiguousarray(km.cluster_centers_, dtype=np.float64)

    # ------------------------------------------------------------------ #
    def _check_fitted(self):
        return check_fitted(self, "cluster_centers_")

    def predict(self, X):
        """Cluster of new rows: Nyström embedding, unit length, nearest centre.

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str
            New rows, with the ``n_features_in_`` columns of the training data.

        Returns
        -------
        ndarray or dask array of shape (n_rows,)
            numpy for numpy input, a lazy dask array otherwise. On training rows
            this gives back ``labels_``.
        """
        self._check_fitted()
        self._check_feature_names(X, reset=False)
        if getattr(self, "cluster_map_", None) is not None:
            return _representatives.predict(self, X)
        est = self.embedding_estimator_
        source = open_source(X)
        check_n_features(type(self).__name__, source.n_features, est.n_features_in_)
        E = est.transform(source)
        if _is_dask_array(E) and len(E.chunks[1]) > 1:
            E = E.rechunk({1: -1})
        return _labels(E, self.cluster_centers_)
