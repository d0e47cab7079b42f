"""The representatives: k-means++ and Lloyd on a seeded sample of the rows.

U-SPEC's hybrid selection (Huang et al. 2020): k-means on a uniform sample of about ten
times ``m`` rows gives ``m`` centres that follow the rows' density, and k-means++'s
seeding (each next centre drawn with probability proportional to the squared distance
to the nearest so far) first reaches every region the sample holds, small clusters and
outlying rows included. The sample's rows are moved by their mean first, so that the
distances by expansion do not cancel for data far from the origin; the result is a
function of the sample, ``m`` and the seed only.

Two rules keep the selection's cost well under a pass over the data:

* the seeding runs on a seeded uniform part of :data:`SEEDING_FACTOR` ``* m`` rows of
  the sample. Each of its ``m`` steps is a pass over the rows it draws from, so its cost
  is ``m`` times their number; three rows a centre still hold every region of the
  sample in proportion to its rows (a cluster of a fraction ``f`` of the rows: about
  ``3 m f`` of them, 300 f per cluster at the default 100 representatives a cluster),
  and Lloyd's iterations on the whole sample then place the centres;
* Lloyd stops once an iteration lowers the sample's quantization error (the sum of
  squared distances of its rows to their nearest centre) by less than
  :data:`LLOYD_RTOL` of it. The representatives only need to follow the rows'
  density; the error's last percent moves them by a fraction of their spacing, which
  the graph's local scales absorb, while each iteration costs as much as the seeding.

The distances are those of :mod:`ooc_spectral.core.representatives`: one product per
cache-sized block of rows (a k-d tree up to
:data:`~ooc_spectral.core.representatives.KDTREE_MAX_FEATURES` features), the blocks
split between the cores. Where the centres fall into well separated groups (the pruned
search's shapes, :func:`~ooc_spectral.core.nearest.pruning_groups`, and a trial on the
first :data:`LLOYD_TRIAL_ROWS` rows computes at most a
:data:`~ooc_spectral.core.nearest.GROUPED_MAX_SHARE` of the distances), Lloyd's nearest
centres come from the pruned search instead
(:func:`~ooc_spectral._accel.fused.grouped_reach`, the groups of the first centres kept
as they move, :func:`~ooc_spectral.core.nearest.regroup`): the same nearest centres,
their distances to rounding.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

from .._accel.fused import grouped_reach, kmeans_plusplus as compiled_seeding
from .nearest import GROUPED_MAX_FEATURES, GROUPED_MAX_SHARE, GROUPED_MIN_POINTS, group_points, regroup

from .representatives import (DISTANCE_BLOCK_BYTES, KDTREE_MAX_FEATURES, Representatives,
                              _scaled_with_norms, _sq_norms, _with_ones, in_threads)

__all__ = ["kmeans_plusplus", "lloyd", "select_representatives", "representative_scales",
           "SEEDING_FACTOR", "LLOYD_RTOL"]

#: k-means++ seeds ``m`` centres from this many times ``m`` rows of the sample.
SEEDING_FACTOR = 3
#: Lloyd stops when an iteration lowers the quantization error by less than this share.
LLOYD_RTOL = 0.01
#: Lloyd's nearest centres come from the pruned search where it computes at most
#: :data:`~ooc_spectral.core.nearest.GROUPED_MAX_SHARE` of the distances of this many
#: rows (well separated clusters), else from blocked products.
LLOYD_TRIAL_ROWS = 256
#: :func:`representative_scales` searches the sample in parts of this many of the
#: search's blocks (:meth:`Representatives.block_rows`), split between the cores: each
#: row's nearest representatives are the same whatever the parts.
SCALES_BLOCKS = 2


def kmeans_plusplus(S: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` rows of ``S`` (``m <= len(S)``) chosen by k-means++ seeding (Arthur &
    Vassilvitskii 2007): each next centre drawn with probability proportional to the
    squared distance to the nearest centre so far. Rows already at distance 0 of a
    centre are drawn only once every other row is.

    Where numba's loops are at hand (large fits), one compiled loop with the GIL
    released (:func:`~ooc_spectral._accel.fused.kmeans_plusplus`, the same draws: the
    same seeds up to rounding) replaces the ``m`` steps of NumPy's calls, whose Python
    overhead was most of the seeding's time."""
    n = S.shape[0]
    first = int(rng.integers(n))
    found = compiled_seeding(S, m, first, rng)  # compiled on large fits: the same to rounding
    if found is not None:
        return S[found].copy()
    s2 = _sq_norms(S)
    chosen = np.empty(m, dtype=np.int64)
    chosen[0] = first
    closest = np.maximum(s2 - 2.0 * (S @ S[chosen[0]]) + s2[chosen[0]], 0.0)
    closest[chosen[0]] = 0.0
    taken = np.zeros(n, dtype=bool)
    taken[chosen[0]] = True
    for i in range(1, m):
        cum = np.cumsum(closest)
        if cum[-1] > 0.0:
            j = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
            j = min(j, n - 1)
            while closest[j] == 0.0:  # rounding at the top of the cumulative sum
                j -= 1
        else:  # every row sits on a centre: the rest are rows not taken yet
            j = int(rng.choice(np.flatnonzero(~taken)))
        chosen[i] = j
        taken[j] = True
        d = np.maximum(s2 - 2.0 * (S @ S[j]) + s2[j], 0.0)
        np.minimum(closest, d, out=closest)
        closest[j] = 0.0
    return S[chosen].copy()


def lloyd(S: np.ndarray, C: np.ndarray, max_iter: int, rtol: float = 0.0) -> np.ndarray:
    """At most ``max_iter`` Lloyd iterations of the centres ``C`` on the rows ``S``;
    stops when no row changes centre, or when an assignment lowers the quantization
    error ``sum_t min_j |s_t - c_j|^2`` by at most ``rtol`` times its value (after that
    iteration's update). A centre left without rows keeps its place."""
    import scipy.sparse as sp

    C = np.array(C, dtype=np.float64, copy=True)
    m, n = C.shape[0], S.shape[0]
    A = _with_ones(S) if S.shape[1] > KDTREE_MAX_FEATURES else None
    s2 = _sq_norms(S) if A is not None else None
    label = None
    error = None
    ones = np.ones(n)
    cols = np.arange(n)

    def nearest(a, step, B):
        D = A[a:a + step] @ B
        j = np.argmin(D, axis=1)
        return j, float(np.sum(np.take_along_axis(D, j[:, None], axis=1)[:, 0] + s2[a:a + step]))

    groups = _lloyd_groups(S, C) if A is not None else None
    for _ in range(max_iter):
        found = None
        if groups is not None:  # the pruned search, where the first iteration showed it prunes
            found = _grouped_nearest(S, s2, regroup(groups, C), m)
            groups = groups if found is not None and found[2] else None
        if found is not None:
            new, now = found[0], found[1]
        elif A is None:
            d, new = cKDTree(C).query(S, k=1)  # at most 10 m rows: one thread
            now = float(np.dot(d, d))
        else:
            B = _scaled_with_norms(C).T  # argmin |c|^2 - 2 s.c, in cache-sized blocks
            step = max(64, DISTANCE_BLOCK_BYTES // (8 * m))
            parts = in_threads(lambda a: nearest(a, step, B), range(0, n, step))
            new = np.concatenate([p[0] for p in parts])
            now = float(sum(p[1] for p in parts))
        if label is not None and np.array_equal(new, label):
            break
        label = new
        counts = np.bincount(label, minlength=m)
        if A is None:  # a few columns: one count per column (the same sums, in row order)
            sums = np.stack([np.bincount(label, weights=S[:, j], minlength=m)
                             for j in range(S.shape[1])], axis=1)
        else:
            sums = sp.csr_matrix((ones, (label, cols)), shape=(m, n)) @ S
        filled = counts > 0
        C[filled] = sums[filled] / counts[filled, None]
        if error is not None and error - now <= rtol * max(now, 0.0):
            break
        error = now
    return C


def _lloyd_groups(S: np.ndarray, C: np.ndarray):
    """The grouping of Lloyd's first centres for the pruned nearest-centre search
    (:func:`~ooc_spectral._accel.fused.grouped_reach`), where its shape is one the pruned
    search serves and it prunes on the first :data:`LLOYD_TRIAL_ROWS` rows of ``S``;
    else None. A function of ``S`` and ``C``; only the speed depends on it."""
    m, d = C.shape
    if not (d <= GROUPED_MAX_FEATURES and m >= GROUPED_MIN_POINTS):
        return None
    groups = group_points(C)
    trial = _grouped_nearest(S[:LLOYD_TRIAL_ROWS], _sq_norms(S[:LLOYD_TRIAL_ROWS]), groups, m)
    return groups if trial is not None and trial[2] else None


def _grouped_nearest(S, s2, groups, m):
    """``(label, error, prunes)``: each row's nearest centre by the pruned search (in parts
    on every core: a function of each row alone), the sum of the squared distances, and
    whether the search computed at most :data:`~ooc_spectral.core.nearest.GROUPED_MAX_SHARE`
    of all the distances; None without numba's loops."""
    n = S.shape[0]
    step = max(64, DISTANCE_BLOCK_BYTES // (8 * m))
    parts = in_threads(lambda a: grouped_reach(S[a:a + step], s2[a:a + step], groups, 1, 1, 1.0),
                       range(0, n, step))
    if not parts or parts[0] is None:
        return None
    label = np.concatenate([p[0][:, 0] for p in parts])
    error = float(sum(np.sum(p[1][:, 0]) for p in parts))
    return label, error, sum(p[2] for p in parts) <= GROUPED_MAX_SHARE * n * m


def select_representatives(sample: np.ndarray, m: int, seed: int, *,
                           max_iter: int = 10) -> np.ndarray:
    """``m`` representatives of the rows ``sample``: k-means++ seeding on
    :data:`SEEDING_FACTOR` ``* m`` of its rows (a seeded uniform part), then at most
    ``max_iter`` Lloyd iterations on all of them, stopped by :data:`LLOYD_RTOL` (U-SPEC's
    hybrid selection: k-means on a random sample of about ten times ``m`` rows). Duplicate centres are dropped, so fewer
    than ``m`` come back when the sample has fewer than ``m`` distinct rows.

    The arithmetic runs on the sample moved by its mean (distances by their
    expansion do not cancel for data far from the origin) and is a function of the
    sample, ``m`` and ``seed`` only.
    """
    S = np.asarray(sample, dtype=np.float64)
    mean = S.mean(axis=0)
    S = np.ascontiguousarray(S - mean)
    m = min(int(m), S.shape[0])
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x52455053]))
    seeding = S
    if S.shape[0] > SEEDING_FACTOR * m:
        part = rng.choice(S.shape[0], size=SEEDING_FACTOR * m, replace=False)
        seeding = S[np.sort(part)]
    C = lloyd(S, kmeans_plusplus(seeding, m, rng), max_iter, LLOYD_RTOL)
    _, first = np.unique(C, axis=0, return_index=True)
    C = C[np.sort(first)]
    return C + mean


def representative_scales(points: np.ndarray, n_neighbors: int,
                          sample: np.ndarray) -> np.ndarray:
    """``s_j`` of each representative: the mean, over the rows of ``sample`` whose nearest
    representative is ``j``, of their mean distance ``s_t`` to their ``n_neighbors``
    nearest representatives (the local scale of the region ``j`` stands for: small in a
    dense cluster, large in a sparse one). A representative no sample row is nearest to,
    or whose rows all sit on representatives, takes the median ``s_t`` of the sample."""
    reps = Representatives(points, min(int(n_neighbors), len(points)))
    S = np.asarray(sample, dtype=np.float64)
    step = SCALES_BLOCKS * reps.block_rows()  # whole blocks of the search, on every core
    parts = in_threads(lambda a: reps.nearest(S[a:a + step]), range(0, max(len(S), 1), step))
    index = np.concatenate([p[0] for p in parts])
    d2 = np.concatenate([p[1] for p in parts])
    s = np.sqrt(d2).mean(axis=1)
    m = reps.size
    count = np.bincount(index[:, 0], minlength=m)
    total = np.bincount(index[:, 0], weights=s, minlength=m)
    positive = s[s > 0]
    fallback = float(np.median(positive)) if positive.size else 1.0
    scales = np.full(m, fallback)
    mean = np.divide(total, count, out=np.zeros(m), where=count > 0)
    scales[mean > 0] = mean[mean > 0]
    return scales
