"""Spectral clustering on the bipartite graph of rows and representatives (transfer cut).

The graph
---------
``m`` representatives ``r_1..r_m`` (k-means centres of a seeded sample of the rows,
:mod:`ooc_spectral.core.representative_selection`) and the ``n`` rows form a bipartite
graph: row ``t`` is joined to its ``K`` nearest representatives ``N(t)`` with the
Gaussian weights

    b_tj = exp(-|x_t - r_j|^2 / (2 s_t s_j))  for j in N(t),  0 otherwise,

a bandwidth local on both sides of the edge (Zelnik-Manor & Perona's self-tuning
scale ``s_t s_j`` in place of one ``sigma^2``): ``s_t`` is the mean distance of row
``t`` to its ``K`` nearest representatives, and ``s_j`` the scale of representative
``j``, the mean ``s_t`` of the sample rows whose nearest representative it is
(:func:`representative_scales`). A single bandwidth (U-SPEC's mean over all rows)
underflows to zero weight for outlying rows, whose part of the graph then falls off as
components of their own; a per-row one alone lets a row in a sparse region join the
representatives of a dense cluster nearby as strongly as its own (digits standardised:
ARI 0.71 with ``s_t^2``, 0.79 with ``s_t s_j``; docs/clustering.md).
``B = (b_tj)`` is ``n x m`` and sparse (``K`` entries a row); the graph's adjacency is
``W = [[0, B], [B', 0]]`` with degrees ``D_X = diag(B 1)`` (rows) and
``D_Y = diag(B' 1)`` (representatives).

The eigenproblem (transfer cut)
-------------------------------
The spectral embedding of the bipartite graph solves ``(D - W) f = lambda D f``. With
``f = (u, v)`` the two block rows read

    D_X u - B v = lambda D_X u        ->  u = D_X^-1 B v / (1 - lambda)
    D_Y v - B' u = lambda D_Y v       ->  B' u = (1 - lambda) D_Y v,

and substituting the first into the second leaves an ``m x m`` problem on ``v`` alone:

    E v = (1 - lambda)^2 D_Y v,   E = B' D_X^-1 B,

i.e. ``(D_Y - E) v = gamma D_Y v`` with ``gamma = lambda (2 - lambda)`` (Li et al. 2012's
transfer cut). Solved in the symmetric form: the leading eigenpairs ``(mu_k, w_k)`` of
``S = D_Y^-1/2 E D_Y^-1/2`` (``mu = (1 - lambda)^2`` in ``[0, 1]``, the first ``mu = 1``
with ``w`` proportional to ``sqrt(D_Y 1)``), ``v_k = D_Y^-1/2 w_k``, and every row's
coordinates

    u_t = (b_t / d_t) C,   C = D_Y^-1/2 W_p diag(mu)^-1/2   (m x p),

``b_t`` the row's weights and ``d_t`` their sum. ``(u, v)`` *is* an eigenvector of the
``(n + m)``-node problem, exactly: ``D_X^1/2 u`` is the left singular vector of
``D_X^-1/2 B D_Y^-1/2`` with singular value ``sqrt(mu)`` and unit length, so ``u`` equals
``sqrt(2)`` times the row part of the unit (``f' D f = 1``) generalized eigenvector
(``tests/test_representatives.py`` checks it against a dense ``(n + m) x (n + m)``
solve). The first coordinate is the constant 1 (the trivial eigenvector), unless ``mu_2`` is
within about 1e-9 of 1 (pieces barely linked): rounding then mixes the first two eigenvectors.

Only ``E`` (``m x m``), ``D_Y`` (``m``) and ``n`` depend on all the rows: pass 2 sums
them chunk by chunk (:func:`chunk_bipartite`, a :class:`BipartiteSums` per chunk,
combined in row order); ``B`` exists one block of rows at a time.

The clustering coordinates
--------------------------
The representatives' coordinates ``C_j`` are the graph's (k-means places the centres
among them); a row's clustering coordinates are ``(b'_t / d'_t) C`` over its
*neighbourhood* (:meth:`Representatives.neighbourhood`): its ``K`` nearest
representatives with the weights above, and besides them those within
:data:`REACH_RATIO` = 1.25 times its ``K``-th distance, up to ``REACH_FACTOR * K`` in
all, with the same weights. Where no representative is that near a tie of the
``K``-th (few dimensions, data on a manifold), these are the row's eigenvector
coordinates ``u_t`` above. In many dimensions a row's distances to the representatives
concentrate, which ``K`` of the nearly equidistant ones come first is noise, and the
average over all of them is the steadier vote (wine, breast cancer, 20-D Gaussian
blobs: docs/clustering.md). A new row gets its coordinates the same way: the map is a
function of the row alone, so on a training row it gives back that row's training
coordinates.

The nearest representatives of a block are found at the speed of a matrix product:
squared distances ``|x|^2 - 2 x.r + |r|^2`` by one product per sub-block of rows (rows
and representatives moved by the representatives' mean first, so the expansion does
not cancel for data far from the origin), then ``np.argpartition``.

References
----------
X. Chen and D. Cai, *Large Scale Spectral Clustering with Landmark-Based
Representation*, AAAI 2011.
L. Zelnik-Manor and P. Perona, *Self-Tuning Spectral Clustering*, NIPS 2004 (the local
scale ``s_i s_j``).
Z. Li, X.-M. Wu and S.-F. Chang, *Segmentation Using Superpixels: A Bipartite Graph
Partitioning Approach*, CVPR 2012 (the transfer cut).
D. Huang, C.-D. Wang, J.-S. Wu, J.-H. Lai and C.-K. Kwoh, *Ultra-Scalable Spectral
Clustering and Ensemble Clustering*, IEEE TKDE 32(6), 2020 (U-SPEC: representatives
from k-means on a random sample, K nearest representatives, the transfer cut).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import scipy.sparse
from scipy.spatial import cKDTree

from .._accel.fused import grouped_reach, nearest_reach, pair_sums
from .._accel.support import accel_for
from .._validation import check_finite
from ..exceptions import FarRowsWarning
from .nearest import (RepresentativeGroups, _scaled_with_norms, _sq_norms,  # noqa: F401
                      _with_ones, pruning_groups, smallest_k, smallest_under)
from .statistics import Statistic
from .graph_pieces import LANCZOS_MIN_ROWS, graph_pieces, leading_by_pieces, pieces_of  # noqa: F401

__all__ = [
    "BipartiteSums",
    "bipartite_sums",
    "graph_pieces",
    "in_threads",
    "ClusterMap",
    "combine_in_order",
    "nearest_center",
    "Representatives",
    "TransferCutMap",
    "chunk_bipartite",
    "smallest_k",
    "smallest_under",
    "solve_transfer_cut",
    "unit_rows",
    "FAR_EXPONENT",
]

#: Bytes of the distance block a sub-block of rows holds (rows x m float64): 1024 rows at
#: m = 1000, so that the block is still in cache for the selection's passes over it
#: (32 MiB blocks took 1.6 times as long for the products and the selection).
DISTANCE_BLOCK_BYTES = 8 * 2**20
#: Up to this many features the nearest representatives come from a k-d tree (scipy's
#: ``cKDTree``, exact), above it from blocked products and a partial sort: the tree is
#: far faster at a few features, even at 8 and slower beyond (docs/measurements.md,
#: "Nearest representatives").
KDTREE_MAX_FEATURES = 8
#: Rows per sub-block of :func:`chunk_bipartite`: its pair numbers and products are
#: ``K^2`` values a row (25 at K = 5, 400 bytes with both), 6.5 MiB at 16384 rows
#: against 100 MiB for a whole 262144-row task, beside one ``m x m`` sum per sub-block;
#: in memory, enough sub-blocks for the cores to share evenly (7 for 10^5 rows).
BIPARTITE_BLOCK_ROWS = 16384
#: A row's clustering coordinates average over its ``K`` nearest representatives and the
#: ones within this ratio of the ``K``-th distance (:meth:`Representatives.neighbourhood`),
#: at most ``REACH_FACTOR * K`` in all, where the rows have at least
#: :data:`NEAR_TIES_MIN_FEATURES` features; in fewer, over its ``K`` nearest only.
REACH_RATIO = 1.25
REACH_FACTOR = 4
#: The near ties are a remedy for distances that concentrate in many dimensions; in a
#: few, a row's ``K`` nearest stand apart from the rest, and averaging over the next
#: ones blurs the border of overlapping clusters (iris: ARI 0.637 at seeds 0-4 with the
#: ``K`` nearest, 0.625 with the near ties; two moons 0.973 against 0.964; circles and
#: unequal densities 1.0 both: workflows/bench/results/clustering.md).
NEAR_TIES_MIN_FEATURES = KDTREE_MAX_FEATURES + 1
#: Eigenvalues ``mu`` below this are treated as 0 when a coordinate divides by ``sqrt(mu)``.
TINY_EIGENVALUE = 1e-12
#: A row whose every weight ``exp(-x)`` has ``x`` above this (weights below 1e-304, near
#: the smallest normal double) takes its weights' limit (:func:`_far_rows_at_their_limit`).
FAR_EXPONENT = 700.0


def unit_rows(E: np.ndarray) -> np.ndarray:
    """``E`` with every row scaled to unit Euclidean length (zero rows stay zero)."""
    E = np.asarray(E, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", E, E))
    norms[norms == 0.0] = 1.0
    return E / norms[:, None]


def in_threads(func, items) -> list:
    """``[func(x) for x in items]`` in order, on one thread per core (NumPy's products,
    reductions and sorts release the GIL; with BLAS on one thread each, the cores
    split the blocks). The result does not depend on the number of threads. Each call
    runs in a copy of the caller's context (its
    :func:`~ooc_spectral._accel.support.accel_for` setting included)."""
    items = list(items)
    threads = min(len(items), os.cpu_count() or 1)
    if threads <= 1:
        return [func(x) for x in items]
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    caller = contextvars.copy_context()
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda x: caller.copy().run(func, x), items))


# --------------------------------------------------------------------------- #
# the nearest representatives of a block of rows, and the weights
# --------------------------------------------------------------------------- #
@dataclass(frozen=True, eq=False)
class Representatives:
    """The ``m x d`` representatives, the number ``K`` of them each row is joined to, and
    their scales ``s_j``.

    Attributes
    ----------
    points : ndarray of shape (m, d)
    n_neighbors : int
        ``K``, at most ``m``.
    scales : ndarray of shape (m,) or None
        ``s_j`` (:func:`representative_scales`), positive; None: each row's own scale on
        both sides (``b_tj = exp(-d_tj^2 / (2 s_t^2))``, the graph of models saved before
        the scales were).
    reach : int or None
        The most representatives a row's clustering coordinates average over
        (:meth:`neighbourhood`): its ``K`` nearest, then those within
        :data:`REACH_RATIO` times the ``K``-th distance, up to ``reach`` in all (at most
        ``m``). None: ``K`` (models saved before the reach was).
    """

    points: np.ndarray
    n_neighbors: int
    scales: np.ndarray | None = None
    reach: int | None = None
    _center: np.ndarray = field(init=False, repr=False)
    _augmented: np.ndarray = field(init=False, repr=False)
    _tree: cKDTree | None = field(init=False, repr=False)
    _groups: RepresentativeGroups | None = field(init=False, repr=False)

    def __post_init__(self):
        P = np.ascontiguousarray(self.points, dtype=np.float64)
        if P.ndim != 2 or not 1 <= int(self.n_neighbors) <= P.shape[0]:
            raise ValueError(f"n_neighbors={self.n_neighbors} for {P.shape[0]} representatives")
        if self.scales is not None:
            scales = np.ascontiguousarray(self.scales, dtype=np.float64)
            if scales.shape != (P.shape[0],) or not np.all(scales > 0):
                raise ValueError(f"scales of shape {scales.shape} for {P.shape[0]} "
                                 "representatives; expected one positive scale each")
            object.__setattr__(self, "scales", scales)
        center = P.mean(axis=0)
        moved = np.ascontiguousarray(P - center)
        object.__setattr__(self, "points", P)
        object.__setattr__(self, "n_neighbors", int(self.n_neighbors))
        reach = self.n_neighbors if self.reach is None else int(self.reach)
        if reach < self.n_neighbors:
            raise ValueError(f"reach={reach} below n_neighbors={self.n_neighbors}")
        object.__setattr__(self, "reach", min(reach, P.shape[0]))
        object.__setattr__(self, "_center", center)
        # [-2 r, |r|^2]' as a C-ordered (d + 1) x m block: the product's right operand
        object.__setattr__(self, "_augmented", np.ascontiguousarray(_scaled_with_norms(moved).T))
        d = P.shape[1]
        object.__setattr__(self, "_tree", cKDTree(moved) if d <= KDTREE_MAX_FEATURES else None)
        object.__setattr__(self, "_groups", None if d <= KDTREE_MAX_FEATURES else
                           pruning_groups(moved, self.n_neighbors, self.reach, REACH_RATIO))

    def __reduce__(self):  # shipped to workers without the derived arrays and tree
        return (type(self), (self.points, self.n_neighbors, self.scales, self.reach))

    @property
    def size(self) -> int:
        """``m``."""
        return self.points.shape[0]

    @property
    def n_features(self) -> int:
        return self.points.shape[1]

    def block_rows(self) -> int:
        """Rows per sub-block, so that a distance block stays within
        :data:`DISTANCE_BLOCK_BYTES`."""
        return max(64, DISTANCE_BLOCK_BYTES // (8 * self.size))

    def nearest(self, X: np.ndarray, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` (default ``K``) nearest representatives of each row of ``X``
        (float64, finite).

        Returns ``(index, d2)``, both ``(len(X), k)``: representative numbers and
        squared distances, each row sorted by distance (ties by number).
        """
        k = self.n_neighbors if k is None else int(k)
        return self._search(X, k, k)

    def _search(self, X: np.ndarray, K: int, reach: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``K`` nearest representatives of each row and, up to ``reach`` in all, the
        next ones within :data:`REACH_RATIO` times the ``K``-th distance; ``(c, reach)``
        each, sorted by distance then number, the places no representative fills with
        distance ``inf``."""
        X = np.asarray(X, dtype=np.float64)
        c, m = X.shape[0], self.size
        if self._tree is not None:
            return self._tree_search(X - self._center, K, reach)
        if self._groups is not None:  # compiled, pruned by the groups' bounds
            Y = X - self._center
            found = grouped_reach(Y, _sq_norms(Y), self._groups, K, reach, REACH_RATIO)
            if found is not None:
                return found[:2]
        index = np.empty((c, reach), dtype=np.int64)
        d2 = np.empty((c, reach))
        step = self.block_rows()
        block = np.empty((min(step, c), m))  # one distance block, reused (no page faults)
        for a in range(0, c, step):
            Xm = X[a:a + step] - self._center
            # |r|^2 - 2 x.r: the order of |x - r|^2
            D = np.matmul(_with_ones(Xm), self._augmented, out=block[:len(Xm)])
            x2 = _sq_norms(Xm)
            if K < m:
                found = nearest_reach(D, x2, K, reach, REACH_RATIO)
                if found is not None:  # compiled: in order, near ties kept, as below
                    index[a:a + step], d2[a:a + step] = found
                    continue
            if K >= m:
                j = np.broadcast_to(np.arange(m), D.shape)
                dj = np.take_along_axis(D, j, axis=1)
            elif reach == K:
                j = smallest_k(D, K)
                dj = np.take_along_axis(D, j, axis=1)
            else:  # the K nearest and their near ties: every entry within the ratio of the K-th
                j, dj = smallest_k(D, reach, values=True)  # the reach nearest, in order
                near = REACH_RATIO ** 2 * np.maximum(dj[:, K - 1] + x2, 0.0) - x2
                far = dj[:, K:] > near[:, None]  # past the K-th and not a near tie
                dj[:, K:][far] = np.inf
                j[:, K:][far] = 0
            dj = dj + x2[:, None]
            np.maximum(dj, 0.0, out=dj)
            order = np.lexsort((j, dj), axis=1)  # by distance, then by number
            index[a:a + step] = np.take_along_axis(j, order, axis=1)
            d2[a:a + step] = np.take_along_axis(dj, order, axis=1)
        return index, d2

    def _tree_search(self, Y: np.ndarray, K: int, reach: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_search` by the k-d tree (``Y``: rows moved by the representatives'
        mean). The tree's cost grows with the neighbours asked for, and in ``d``
        dimensions the ball of the near ties (:data:`REACH_RATIO` times the ``K``-th
        distance) holds about ``K REACH_RATIO^d`` representatives where they are spread
        evenly: so that many (plus one) are asked for first, and only the rows whose
        last one is still a near tie are asked again for all ``reach``. Past the near
        ties the places hold distance ``inf`` (weight 0) and representative 0."""
        c, m = Y.shape[0], self.size

        def query(rows, k):
            d, index = self._tree.query(rows, k=k)
            return (np.minimum(np.asarray(index, dtype=np.int64).reshape(len(rows), k), m - 1),
                    np.asarray(d, dtype=np.float64).reshape(len(rows), k))

        first = reach if reach == K else min(
            reach, int(np.ceil(K * REACH_RATIO ** self.n_features)) + 1)
        got, d = query(Y, first)
        index = np.zeros((c, reach), dtype=np.int64)
        dist = np.full((c, reach), np.inf)
        index[:, :first], dist[:, :first] = got, d
        if first < reach:
            again = np.flatnonzero(d[:, -1] <= REACH_RATIO * d[:, K - 1])
            if again.size:
                index[again], dist[again] = query(Y[again], reach)
        if reach > K:
            far = dist[:, K:] > REACH_RATIO * dist[:, K - 1:K]
            dist[:, K:][far] = np.inf
            index[:, K:][far] = 0
        return index, np.square(dist)

    def neighbourhood(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(index, b)``, both ``(len(X), reach)``: each row's :attr:`reach` nearest
        representatives and its weights ``b_tj = exp(-d_tj^2 / (2 s_t s_j))``, ``s_t`` the
        row's mean distance to its ``K`` nearest and ``s_j`` the representatives'
        :attr:`scales` (``s_t`` again without them); all weights 1 for a row at distance 0
        of all ``K``. Past the ``K``-th, a representative keeps its weight only within
        :data:`REACH_RATIO` times the ``K``-th distance (a near tie of the ``K``-th), else 0.

        The first ``K`` columns are the graph (:meth:`weights`); the rest are the near
        ties a row's clustering coordinates also average over: in many dimensions the
        distances of a row to the representatives concentrate, and which ``K`` of the
        nearly equidistant ones come first is noise (docs/clustering.md).
        """
        K = self.n_neighbors
        index, d2 = self._search(X, K, self.reach)  # past the K-th: near ties, else inf
        s = np.sqrt(d2[:, :K]).mean(axis=1)
        if self.scales is None:
            ratio = np.broadcast_to((2.0 * s * s)[:, None], d2.shape).copy()
        else:
            ratio = np.multiply(self.scales[index], 2.0 * s[:, None])
        with np.errstate(divide="ignore", invalid="ignore"):
            np.divide(d2, ratio, out=ratio)  # no near tie (inf): weight 0
        np.fmax(ratio, 0.0, out=ratio)  # 0 / 0 (a row on all K): weight 1
        _far_rows_at_their_limit(ratio, K)
        np.negative(ratio, out=ratio)
        return index, np.exp(ratio, out=ratio)

    def weights(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(index, b)``, both ``(len(X), K)``: the graph's edges of each row, its ``K``
        nearest representatives and their weights (the first ``K`` columns of
        :meth:`neighbourhood`)."""
        index, b = self.neighbourhood(X)
        K = self.n_neighbors
        return index[:, :K], b[:, :K]


def _far_rows_at_their_limit(exponent: np.ndarray, K: int) -> None:
    """Rows whose ``K`` weights ``exp(-exponent)`` would all fall below ``exp(-FAR_EXPONENT)``
    (about 1e-304: a row hundreds of the graph's scales away from every representative,
    as a missing-value code such as -9999 is) get their weights' limit instead: the
    exponents less the row's least, so that its nearest representative (by
    ``d^2 / (s_t s_j)``) weighs 1 and the rest keep their ratios to it. Their normalized
    weights, and so their coordinates, are what the weights tend to as the row moves
    away; without this they are 0 / 0. Changed in place; other rows keep their values
    bit for bit. A :class:`~ooc_spectral.exceptions.FarRowsWarning` says how many."""
    low = exponent[:, :K].min(axis=1)
    far = low > FAR_EXPONENT
    if not far.any():
        return
    beyond = far & ~np.isfinite(low)  # squared distances past float64: the first listed
    exponent[beyond] = np.inf
    exponent[beyond, 0] = 0.0
    far &= ~beyond
    exponent[far] -= low[far, None]
    far |= beyond
    warnings.warn(
        f"{int(far.sum())} of {len(far)} rows are so far from every representative that "
        f"their graph weights underflow (exp(-d^2 / (2 s_t s_j)) below exp(-{FAR_EXPONENT:g})): "
        "each is placed by its nearest representatives alone, the limit of its weights. "
        "Rows this far from the rest are often missing-value codes (such as -9999) or rows "
        "in other units: check them", FarRowsWarning, stacklevel=4)


# --------------------------------------------------------------------------- #
# pass 2: B' D_X^-1 B and D_Y, chunk by chunk
# --------------------------------------------------------------------------- #
@dataclass(frozen=True, eq=False)
class BipartiteSums(Statistic):
    """``n``, ``cross = B' D_X^-1 B`` (``m x m``) and ``degrees = B' 1`` (``m``) of rows."""

    kind: ClassVar[str] = "bipartite"
    n: int
    cross: np.ndarray
    degrees: np.ndarray

    def combine(self, other: "BipartiteSums", *, in_place: bool = False) -> "BipartiteSums":
        """This part's sums then ``other``'s; ``in_place``: into this part's arrays (no
        new ``m x m`` array a block; their owner reads them no more), the same sums."""
        out = (self.cross, self.degrees) if in_place else (None, None)
        return BipartiteSums(self.n + other.n, np.add(self.cross, other.cross, out=out[0]),
                             np.add(self.degrees, other.degrees, out=out[1]))


def bipartite_sums(index: np.ndarray, b: np.ndarray, m: int) -> BipartiteSums:
    """The :class:`BipartiteSums` of rows given their representatives ``index`` and weights
    ``b`` (both ``(c, K)``, from :meth:`Representatives.weights`)."""
    c, K = index.shape
    scaled = b / b.sum(axis=1, keepdims=True)  # b_t / d_t (d_t > 0: the largest weighs > e^-FAR_EXPONENT)
    found = pair_sums(index, scaled, b, m)  # compiled on large fits: the same sums, one pass
    if found is not None:
        return BipartiteSums(c, *found)
    pair = (index[:, :, None] * m + index[:, None, :]).ravel()
    value = (scaled[:, :, None] * b[:, None, :]).ravel()
    cross = np.bincount(pair, weights=value, minlength=m * m).reshape(m, m)
    degrees = np.bincount(index.ravel(), weights=b.ravel(), minlength=m)
    return BipartiteSums(c, cross, degrees)


def chunk_bipartite(block, reps: Representatives, offset: int = 0, chunk_starts=None,
                    block_rows: int | None = None) -> BipartiteSums:
    """The :class:`BipartiteSums` of one chunk of rows (checked finite; errors name the
    global row ``offset + i`` and, given ``chunk_starts``, its storage chunk), in
    sub-blocks of ``block_rows`` rows (default :data:`BIPARTITE_BLOCK_ROWS`) folded in
    row order."""
    n = len(block)
    step = max(1, int(block_rows) if block_rows else BIPARTITE_BLOCK_ROWS)
    out = None
    with accel_for(n * reps.size):  # the compiled search on large blocks only
        for a in range(0, max(n, 1), step):
            X = np.ascontiguousarray(block[a:a + step], dtype=np.float64)
            check_finite(X, int(offset) + a, chunk_starts=chunk_starts)
            part = bipartite_sums(*reps.weights(X), reps.size)
            out = part if out is None else out.combine(part)
    return out


# --------------------------------------------------------------------------- #
# the solve and the map
# --------------------------------------------------------------------------- #
@dataclass(frozen=True, eq=False)
class TransferCutMap:
    """Rows to their transfer-cut coordinates: ``u_t = (b_t / d_t) C``.

    Attributes
    ----------
    representatives : Representatives
    coefficients : ndarray of shape (m, p)
        ``C = D_Y^-1/2 W diag(mu)^-1/2``.
    eigenvalues : ndarray of shape (p,)
        ``mu``, the leading eigenvalues of ``D_Y^-1/2 B' D_X^-1 B D_Y^-1/2``, largest
        first; the bipartite graph's normalized Laplacian eigenvalues are ``1 - sqrt(mu)``.
    """

    representatives: Representatives
    coefficients: np.ndarray
    eigenvalues: np.ndarray

    @property
    def n_components(self) -> int:
        return self.coefficients.shape[1]

    def embed(self, X: np.ndarray) -> np.ndarray:
        """The coordinates ``(len(X), p)`` of the rows ``X`` (float64, finite)."""
        return self.coordinates(*self.representatives.weights(X))

    def coordinates(self, index: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The coordinates ``(c, p)`` of rows given their representatives and weights
        (``(c, K)`` each, :meth:`Representatives.weights`)."""
        c, r = b.shape
        b = b / b.sum(axis=1, keepdims=True)
        # each row's weighted sum of its representatives' coefficients, place by place:
        # one sparse product
        A = scipy.sparse.csr_matrix((b.ravel(), np.asarray(index).ravel(),
                                     np.arange(0, c * r + 1, r)), shape=(c, self.coefficients.shape[0]))
        return np.asarray(A @ self.coefficients)

    def leading(self, p: int) -> "TransferCutMap":
        """The map to the ``p`` leading coordinates only."""
        return TransferCutMap(self.representatives, self.coefficients[:, :p].copy(),
                              self.eigenvalues[:p].copy())


def solve_transfer_cut(sums: BipartiteSums, reps: Representatives, n_components: int,
                       pieces: tuple[int, np.ndarray] | None = None) -> TransferCutMap:
    """The ``n_components`` leading eigenpairs of ``S = D_Y^-1/2 E D_Y^-1/2`` (dense
    symmetric solves, one per piece of the graph,
    :func:`~ooc_spectral.core.graph_pieces.leading_by_pieces`: ARPACK misses copies of a
    repeated eigenvalue 1, which a graph in several pieces has, one per piece; a connected
    graph of many representatives by Lanczos, kept only where certified to have missed
    none) and the map they give.

    Representatives no row chose (``D_Y = 0``) are left out of ``S``; their
    coefficients are 0. Each eigenvector's sign makes its largest entry positive.
    ``pieces``: the graph's pieces where the caller has them
    (:func:`~ooc_spectral.core.graph_pieces.pieces_of`).
    """
    m = reps.size
    p = int(n_components)
    used = sums.degrees > 0
    r = int(used.sum())
    if not 1 <= p <= r:
        raise ValueError(f"n_components={p} but only {r} representatives are joined to rows")
    dinv = np.zeros(m)
    dinv[used] = 1.0 / np.sqrt(sums.degrees[used])
    d = dinv[used]
    S = sums.cross.copy() if r == m else sums.cross[np.ix_(used, used)]
    S *= d[:, None]  # in place: the values of cross * d_i * d_j
    S *= d[None, :]
    S = np.add(S, S.T)
    S *= 0.5
    mu, W = leading_by_pieces(S, p, pieces, lanczos=sums.n >= LANCZOS_MIN_ROWS)
    big = np.argmax(np.abs(W), axis=0)
    W = W * np.sign(W[big, np.arange(p)])[None, :]
    np.clip(mu, 0.0, 1.0, out=mu)
    scale = np.where(mu > TINY_EIGENVALUE, 1.0 / np.sqrt(np.maximum(mu, TINY_EIGENVALUE)), 0.0)
    C = np.zeros((m, p))
    C[used] = dinv[used][:, None] * W * scale[None, :]
    return TransferCutMap(reps, C, mu)


# --------------------------------------------------------------------------- #
# pass 3: coordinates and labels of a block of rows
# --------------------------------------------------------------------------- #
def combine_in_order(parts: list) -> BipartiteSums:
    """The partials of consecutive chunks combined left to right (a tree node)."""
    out = parts[0]
    for part in parts[1:]:
        out = out.combine(part)
    return out


@dataclass(frozen=True, eq=False)
class ClusterMap:
    """Rows to their unit-length transfer-cut coordinates (Ng, Jordan & Weiss) and,
    given the k-means ``centers`` in that space, to their cluster.

    ``embed`` has the contract of :func:`~ooc_spectral.pipeline.writeback.map_rows`
    (``embed(X) -> (len(X), p)``, ``n_components``).
    """

    tmap: TransferCutMap
    centers: np.ndarray | None = None

    @property
    def n_components(self) -> int:
        return self.tmap.n_components

    def embed(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.shape[0] == 0:
            return np.empty((0, self.n_components))
        return self.embed_weights(*self.tmap.representatives.neighbourhood(X))

    def embed_weights(self, index: np.ndarray, b: np.ndarray) -> np.ndarray:
        """:meth:`embed` of rows given their representatives and weights."""
        return unit_rows(self.tmap.coordinates(index, b))

    def labels(self, X: np.ndarray) -> np.ndarray:
        return self.labels_of(self.embed(X))

    def labels_of(self, U: np.ndarray) -> np.ndarray:
        """The cluster of rows given their coordinates ``U`` (from :meth:`embed`)."""
        return nearest_center(U, self.centers)


def nearest_center(U: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """The number of the nearest of ``centers`` for each row of ``U`` (ties: the lower)."""
    d2 = _sq_norms(centers)[None, :] - 2.0 * (U @ centers.T)
    return np.argmin(d2, axis=1).astype(np.int64)
