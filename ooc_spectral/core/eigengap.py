"""The number of clusters from the eigengap (``n_clusters="auto"``).

A graph with ``k`` well-separated clusters has ``k`` normalized-Laplacian eigenvalues
near 0 and a jump after them: exactly ``k`` zeros when it falls into ``k`` pieces, and
by perturbation theory (the Davis-Kahan theorem; von Luxburg 2007, sections 3-4 and 8.3)
``k`` small ones followed by a gap when the clusters are joined by little weight. The
heuristic reads the ascending Laplacian eigenvalues ``lambda_1 = 0 <= lambda_2 <= ...``
and takes the ``k`` after which the gap is largest.

The gap is measured *relative to the eigenvalues' size*,

    gap_k = log((lambda_{k+1} + eps) / (lambda_k + eps)),  eps = 0.2 median(lambda_2..),

not as the difference ``lambda_{k+1} - lambda_k``: on a sparse nearest-neighbour graph
the eigenvalues inside each cluster are themselves small and spread further apart the
higher they are, so the largest difference lies near the top of any range searched (on
blobs of 3, 4, 6 and 10 clusters, 5000 rows, the difference chose 9, 4, 6 and 30; the
ratio 3, 4, 6 and 10), while ``k`` clusters joined by little weight show as a jump by a
factor. ``eps`` keeps the ratio of two rounding-level eigenvalues (a graph in pieces)
from counting as a jump (``eps = 0.1 median`` or less chose 5 of 6 blobs, and 2 on
iris and wine). Rings have small eigenvalues inside each cluster too (the modes along
the ring): on two nested circles the heuristic chooses 8, not 2
(docs/clustering.md).

Both affinities give these eigenvalues from their small eigenproblem: the
representatives' transfer cut gives ``mu = (1 - lambda)^2``
(:mod:`ooc_spectral.core.representatives`), the kernel affinity's divisive
normalization the eigenvalues ``nu = 1 - lambda`` of ``D^-1/2 K D^-1/2``.

References
----------
U. von Luxburg, *A Tutorial on Spectral Clustering*, Statistics and Computing 17(4),
2007 (section 8.3, the eigengap heuristic).
"""

from __future__ import annotations

import numpy as np

__all__ = ["AUTO_MAX_CLUSTERS", "GAP_FLOOR", "eigengaps", "choose_n_clusters", "laplacian_from_transfer_cut"]

#: ``n_clusters="auto"`` chooses among 2 .. this many clusters (the small eigenproblem is
#: solved for one more eigenvalue).
AUTO_MAX_CLUSTERS = 30
#: ``eps`` of the relative gap, as a fraction of the median eigenvalue.
GAP_FLOOR = 0.2


def laplacian_from_transfer_cut(mu: np.ndarray) -> np.ndarray:
    """The bipartite graph's normalized Laplacian eigenvalues ``1 - sqrt(mu)`` (ascending
    for ``mu`` descending), from the transfer cut's ``mu`` in ``[0, 1]``."""
    return 1.0 - np.sqrt(np.clip(np.asarray(mu, dtype=np.float64), 0.0, 1.0))


def eigengaps(laplacian: np.ndarray) -> np.ndarray:
    """``gaps[k - 1] = log((lambda_{k+1} + eps) / (lambda_k + eps))`` (1-based
    ``lambda``, ``eps`` = :data:`GAP_FLOOR` times the median of ``lambda_2, ...``): the
    relative gap after the ``k`` smallest eigenvalues, the gap for ``k`` clusters. The
    eigenvalues are sorted first; rounding below 0 is read as 0."""
    lam = np.sort(np.maximum(np.asarray(laplacian, dtype=np.float64), 0.0))
    eps = GAP_FLOOR * float(np.median(lam[1:])) if lam.size > 1 else 0.0
    if eps <= 0.0:  # every eigenvalue 0: as many pieces as eigenvalues, no gap anywhere
        return np.zeros(max(lam.size - 1, 0))
    return np.diff(np.log(lam + eps))


def choose_n_clusters(laplacian: np.ndarray, *, low: int = 2,
                      high: int | None = None) -> tuple[int, np.ndarray]:
    """``(k, gaps)``: the ``k`` in ``[low, high]`` whose gap (:func:`eigengaps`) is the
    largest (the smaller ``k`` on a tie), and the gaps.

    ``laplacian`` holds at least ``low + 1`` of the smallest eigenvalues; ``high``
    defaults to one less than their number.
    """
    gaps = eigengaps(laplacian)
    top = len(gaps) if high is None else min(int(high), len(gaps))
    low = int(low)
    if top < low:
        raise ValueError(f"{len(gaps) + 1} eigenvalues cannot choose among {low}..{top} "
                         "clusters; at least low + 1 are needed")
    k = low + int(np.argmax(gaps[low - 1:top]))
    return k, gaps
