"""``GreedySpectralClustering(affinity="representatives")`` (the default): fit and predict.

The graph, the eigenproblem and why it is the spectral embedding of the bipartite
graph are in :mod:`ooc_spectral.core.representatives`; the passes over a source in
:mod:`ooc_spectral.pipeline.representatives`. In short:

* ``m = n_representatives`` representatives ``r_j`` (``"auto"``: 100 per cluster, at
  most 1000; k-means on a seeded uniform sample of ``10 m`` rows; ``m`` at most half
  the rows) and the ``n`` rows form a bipartite
  graph; row ``t`` is joined to its ``K = n_neighbors`` nearest representatives with
  weights ``b_tj = exp(-|x_t - r_j|^2 / (2 s_t s_j))``, ``s_t`` its mean distance to them
  and ``s_j`` the representative's scale (the mean ``s_t`` of the sample rows nearest to
  it): a bandwidth local on both sides (Zelnik-Manor & Perona).
* With ``B`` (``n x m``, ``K`` entries a row, never stored), ``D_X = diag(B 1)`` and
  ``D_Y = diag(B' 1)``, the normalized spectral embedding ``(D - W) f = lambda D f`` of
  ``W = [[0, B], [B', 0]]`` reduces exactly (the transfer cut) to the ``m x m`` problem
  ``B' D_X^-1 B v = (1 - lambda)^2 D_Y v``; a row's coordinates are
  ``u_t = (b_t / d_t) D_Y^-1/2 W diag(mu)^-1/2``, the row part of the ``(n + m)``-node
  eigenvectors.
* The ``n_components`` leading coordinates (default ``n_clusters``, the first, constant
  one among them: Ng, Jordan & Weiss), each row scaled to unit length; k-means
  (k-means++, ``n_init`` restarts) on the representatives' unit coordinates weighted by
  their degrees gives the centres, and every row goes to its nearest centre, its
  coordinates averaged over its neighbourhood (its ``K`` nearest representatives and
  with 9 features or more their near ties, within 1.25 times the ``K``-th distance, up
  to ``4 K``: in many dimensions the distances concentrate, in a few they do not).
* ``n_clusters="auto"``: ``k`` in ``2 .. 30`` after which the gap between consecutive
  Laplacian eigenvalues ``1 - sqrt(mu)`` is largest (:mod:`ooc_spectral.core.eigengap`).
* ``predict(X_new)``: a new row's neighbourhood, its weights, the same map, unit length,
  the nearest centre. The map is a function of the row alone (the
  representatives, their scales, ``C`` and the centres are fixed), so on a training row
  it gives that row's ``labels_``.
"""

from __future__ import annotations

import numpy as np

from .._validation import check_int, check_n_features
from ..exceptions import InvalidInputError
from ..io.source import open_source
from ..pipeline.representatives import embed_and_label, fit_representatives, warn_if_degenerate
from ..runtime.execution import Executor

__all__ = ["fit", "predict", "check_params"]


def check_params(est) -> None:
    name = type(est).__name__
    if not (isinstance(est.n_representatives, str) and est.n_representatives == "auto"):
        check_int(name, "n_representatives", est.n_representatives, low=2)
    check_int(name, "n_neighbors", est.n_neighbors, low=1)


def fit(est, X, k, p: int | None, seed: int) -> None:
    """Fit ``est`` (a :class:`~ooc_spectral.GreedySpectralClustering`) on ``X``; ``k`` is
    an int or ``"auto"``."""
    check_params(est)
    source = open_source(X)
    n = source.n_rows
    if n < max(2 if k == "auto" else k, 2):
        raise InvalidInputError(
            f"{type(est).__name__}: X has {n} rows, fewer than n_clusters={k}; "
            "lower n_clusters or pass more rows")
    result = fit_representatives(
        source, n_clusters=k, n_components=p, n_representatives=est.n_representatives,
        n_neighbors=est.n_neighbors, seed=seed, n_init=est.n_init, executor=Executor(),
        chunk_rows=est.chunk_rows)
    cmap = result.cmap
    est.embedding_, est.labels_ = embed_and_label(source, cmap, est.chunk_rows, result.graph)
    est.n_clusters_ = result.n_clusters
    est.eigengaps_ = result.eigengaps
    est.representatives_ = cmap.tmap.representatives.points
    est.representative_scales_ = cmap.tmap.representatives.scales
    est.cluster_map_ = cmap
    est.cluster_centers_ = cmap.centers
    est.eigenvalues_ = cmap.tmap.eigenvalues.copy()
    est.inertia_ = result.inertia
    est.n_iter_ = result.n_iter
    est.stage_times_ = dict(result.times)
    est.n_features_in_ = source.n_features
    est.random_state_ = seed
    est.embedding_estimator_ = None
    sizes = (np.bincount(est.labels_, minlength=result.n_clusters)
             if isinstance(est.labels_, np.ndarray) else result.estimated_sizes())
    warn_if_degenerate(type(est).__name__, sizes, cmap.tmap.representatives.n_neighbors,
                       result.n_clusters)


def predict(est, X):
    """Cluster of new rows: nearest representatives, weights, map, unit length, nearest
    centre (numpy for numpy input, a lazy dask array otherwise)."""
    source = open_source(X)
    check_n_features(type(est).__name__, source.n_features, est.n_features_in_)
    return embed_and_label(source, est.cluster_map_, est.chunk_rows)[1]
