"""The smallest entries of each row of a distance block, at the speed of a few passes.

:class:`~ooc_spectral.core.representatives.Representatives` finds each row's nearest
representatives from one product per block (squared distances up to a per-row
constant); these select the few smallest entries of each row without a selection in
every row (``np.argpartition``): a threshold known to hold them, the entries under it
gathered and sorted in a padded row of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._accel.fused import grouped_reach

import numpy as np

__all__ = ["smallest_under", "smallest_k", "RepresentativeGroups", "group_points", "regroup",
           "pruning_groups", "GROUPED_MIN_POINTS", "GROUPED_MAX_FEATURES", "GROUPED_MAX_SHARE"]

#: The pruned search (:class:`RepresentativeGroups`) serves representatives of more than
#: :data:`~ooc_spectral.core.representatives.KDTREE_MAX_FEATURES` and at most this many
#: features, at least :data:`GROUPED_MIN_POINTS` of them: there it takes a fraction of
#: the product and the selection over every representative (10^5 x 20 blobs, 1000
#: representatives: workflows/bench/results/clustering.md); in many more dimensions the
#: groups' bounds prune little and NumPy's product is the faster.
GROUPED_MAX_FEATURES = 32
GROUPED_MIN_POINTS = 512
#: The groups are used where the representatives themselves, searched as rows, compute
#: at most this share of all their distances: a distance costs the compiled search about
#: twice what NumPy's product and selection spend on one entry, and where the groups
#: overlap (blobs of std 8 in 20-D) the bounds skip little.
GROUPED_MAX_SHARE = 0.3
#: :func:`pruning_groups` tries the search on this many of the points (the whole
#: search of 1000 points against themselves cost a fit of 10^5 rows 0.03 s where the
#: groups do not prune).
TRIAL_POINTS = 256


def _sq_norms(A: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", A, A)


def _with_ones(X: np.ndarray) -> np.ndarray:
    """``[X, 1]``: with :func:`_scaled_with_norms`, one product gives ``|r|^2 - 2 x.r``."""
    A = np.empty((X.shape[0], X.shape[1] + 1))
    A[:, :-1] = X
    A[:, -1] = 1.0
    return A


def _scaled_with_norms(R: np.ndarray) -> np.ndarray:
    """``[-2 R, |R|^2]`` (rows ``[-2 r, |r|^2]``)."""
    A = np.empty((R.shape[0], R.shape[1] + 1))
    np.multiply(R, -2.0, out=A[:, :-1])
    A[:, -1] = _sq_norms(R)
    return A


def smallest_under(D: np.ndarray, tau: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(columns, values)``, both ``(c, k)``: the ``k`` smallest entries of each row of
    ``D`` (``(c, m)``) among those at most ``tau`` (``(c,)``), by value then column; where
    a row has fewer, the rest are column 0 with value ``inf``. Each row's few entries are
    sorted in a padded row of their own."""
    c, m = D.shape
    flat = np.flatnonzero(D <= tau[:, None])
    r, j = np.divmod(flat, m)
    counts = np.bincount(r, minlength=c)
    start = np.zeros(c, dtype=np.int64)
    np.cumsum(counts[:-1], out=start[1:])
    pos = np.arange(flat.size) - start[r]
    width = max(int(counts.max(initial=0)), k)
    V = np.full((c, width), np.inf)
    V[r, pos] = D.ravel()[flat]
    J = np.zeros((c, width), dtype=np.int64)
    J[r, pos] = j  # ascending within a row: a stable sort by value breaks ties by column
    order = np.argsort(V, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(J, order, axis=1), np.take_along_axis(V, order, axis=1)


def smallest_k(D: np.ndarray, K: int, values: bool = False):
    """The columns of the ``K`` smallest entries of each row of ``D`` (``(c, m)``,
    ``K < m``), ties to the lower column: ``(c, K)``, each row by value then column
    (and their values, ``(columns, values)``, with ``values=True``).

    The ``K``-th smallest entry of a row is at most ``tau``, the largest of the minima of
    ``K`` disjoint blocks of its columns (they are ``K`` entries of the row), so only
    the entries up to ``tau`` (about ``2 K`` a row) are sorted
    (:func:`smallest_under`): two contiguous passes over ``D`` instead of a selection in
    every row (``np.argpartition``, twice as slow at ``m = 1000``, ``K = 5``)."""
    c, m = D.shape
    q = m // K
    tau = D[:, :q * K].reshape(c, K, q).min(axis=2).max(axis=1)
    found = smallest_under(D, tau, K)
    return found if values else found[0]


@dataclass(frozen=True, eq=False)
class RepresentativeGroups:
    """The representatives in groups, for a search that skips the groups too far away.

    A row ``y`` is at least ``max(|y - c_g| - R_g, 0)`` from every member of group ``g``
    (centre ``c_g``, radius ``R_g``: the triangle inequality), so once a row holds its
    ``K`` nearest so far, a group whose bound exceeds the ``near`` bound of the ``K``-th
    holds nothing the row keeps (:func:`~ooc_spectral._accel.fused.grouped_reach`).

    Attributes
    ----------
    permutation : ndarray of shape (m,)
        The representatives' numbers, group by group (ascending within a group).
    starts : ndarray of shape (G + 1,)
        Group ``g`` is ``permutation[starts[g]:starts[g + 1]]``.
    centres : ndarray of shape (G, d)
    radii : ndarray of shape (G,)
        The largest distance of a member to its group's centre.
    scaled : ndarray of shape (m, d)
        ``-2 r`` of the representatives in the order of ``permutation``.
    norms : ndarray of shape (m,)
        ``|r|^2`` in that order.
    max_norm : float
        The largest ``|r|`` (the scale of the rounding of ``|r|^2 - 2 y.r``).
    centres_t : ndarray of shape (d, G)
        ``centres`` transposed, C-ordered: a row's distances to all the centres are
        summed feature by feature, over all the groups at once (vectorized).
    """

    permutation: np.ndarray
    starts: np.ndarray
    centres: np.ndarray
    radii: np.ndarray
    scaled: np.ndarray
    norms: np.ndarray
    max_norm: float
    centres_t: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "centres_t", np.ascontiguousarray(self.centres.T))


def group_points(P: np.ndarray, n_groups: int | None = None,
                 iterations: int = 10) -> RepresentativeGroups:
    """The :class:`RepresentativeGroups` of the points ``P`` (``(m, d)``, moved by their
    mean): ``n_groups`` (default ``round(sqrt(m))``) groups by Lloyd's iterations from
    evenly spaced points of ``P`` (a function of ``P`` alone). Only the search's speed
    depends on the groups, never its result."""
    P = np.ascontiguousarray(P, dtype=np.float64)
    m = P.shape[0]
    G = max(1, min(m, int(n_groups) if n_groups else int(round(np.sqrt(m)))))
    C = P[np.linspace(0, m - 1, G).round().astype(np.int64)].copy()
    p2 = _sq_norms(P)
    for _ in range(iterations + 1):
        label = np.argmin(_sq_norms(C)[None, :] - 2.0 * (P @ C.T), axis=1)
        counts = np.bincount(label, minlength=G)
        filled = counts > 0
        sums = np.stack([np.bincount(label, weights=P[:, k], minlength=G)
                         for k in range(P.shape[1])], axis=1)
        C[filled] = sums[filled] / counts[filled, None]
    used = np.flatnonzero(counts > 0)
    renumber = np.full(G, -1)
    renumber[used] = np.arange(used.size)
    label = renumber[label]
    order = np.argsort(label, kind="stable")
    starts = np.zeros(used.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(label, minlength=used.size), out=starts[1:])
    return _grouped(P, p2, order.astype(np.int64), starts, label, C[used])


def _grouped(P, p2, order, starts, label, C) -> RepresentativeGroups:
    """The groups of ``P`` (``label``: each point's group; ``order``, ``starts``: the
    points group by group) around the centres ``C``, with their radii."""
    radii = np.zeros(C.shape[0])
    np.maximum.at(radii, label, np.sqrt(_sq_norms(P - C[label])))
    return RepresentativeGroups(order, starts, np.ascontiguousarray(C), radii,
                                np.ascontiguousarray(-2.0 * P[order]), p2[order].copy(),
                                float(np.sqrt(p2.max(initial=0.0))))


def regroup(groups: RepresentativeGroups, P: np.ndarray) -> RepresentativeGroups:
    """``groups``' grouping of the points (the same members, by number) for the moved
    points ``P`` (``(m, d)``): each group's centre the mean of its members, its radius
    their largest distance to it. The bounds hold for any centre, so a search with these
    groups gives the result of the unpruned search, whichever grouping it keeps; Lloyd's
    iterations keep their first grouping as the centres move
    (:func:`~ooc_spectral.core.representative_selection.lloyd`)."""
    P = np.ascontiguousarray(P, dtype=np.float64)
    G = groups.starts.size - 1
    label = np.empty(P.shape[0], dtype=np.int64)
    label[groups.permutation] = np.repeat(np.arange(G), np.diff(groups.starts))
    counts = np.diff(groups.starts).astype(np.float64)
    C = np.stack([np.bincount(label, weights=P[:, k], minlength=G)
                  for k in range(P.shape[1])], axis=1) / counts[:, None]
    return _grouped(P, _sq_norms(P), groups.permutation, groups.starts, label, C)


def pruning_groups(P: np.ndarray, n_neighbors: int, reach: int,
                   ratio: float) -> RepresentativeGroups | None:
    """The :class:`RepresentativeGroups` of the points ``P`` (moved by their mean) where
    they prune: the search of :data:`TRIAL_POINTS` evenly spaced points of ``P`` (all of
    them where fewer; ``n_neighbors``, ``reach``, ``ratio``) computes at most
    :data:`GROUPED_MAX_SHARE` of its distances; else None (and None where the shape is
    outside :data:`GROUPED_MAX_FEATURES` / :data:`GROUPED_MIN_POINTS`). A function of its
    arguments alone; without numba's loops the groups are kept (and not used)."""
    m, d = P.shape
    if not (d <= GROUPED_MAX_FEATURES and m >= GROUPED_MIN_POINTS):
        return None
    groups = group_points(P)
    rows = P if m <= TRIAL_POINTS else P[np.linspace(0, m - 1, TRIAL_POINTS).round().astype(np.int64)]
    trial = grouped_reach(rows, _sq_norms(rows), groups, n_neighbors, reach, ratio)
    if trial is not None and trial[2] > GROUPED_MAX_SHARE * len(rows) * m:
        return None
    return groups
