"""The representatives affinity over a source: its passes as dask graphs.

The numerics are in :mod:`ooc_spectral.core.representatives` (the graph, the transfer
cut, why it is the bipartite graph's spectral embedding); this module runs them over a
:class:`~ooc_spectral.io.source.DataSource`:

1. **representatives** (in the client): a seeded uniform sample of ``sample_factor * m``
   rows, gathered in one read of the storage chunks that hold them
   (:func:`read_sample`: every region of the data is sampled in proportion to its rows,
   so a small cluster stored in one place is not missed as a few runs of contiguous
   rows would miss it), k-means++ and Lloyd on it, and each representative's scale from
   the same sample (:func:`~ooc_spectral.core.representative_selection.representative_scales`);
2. **bipartite pass** (a parallel map over row chunks and the ordered tree reduction of
   :func:`~ooc_spectral.pipeline.accumulate.tree_reduce`): every chunk reduced to a
   :class:`~ooc_spectral.core.representatives.BipartiteSums` (``m x m`` and ``m``
   numbers), combined in row order, so the sums do not depend on which worker finished
   first. The graph is built once and computed once; segments of consecutive chunks can
   be kept in a checkpoint (a :class:`~ooc_spectral.pipeline.accumulate.PartialStore`),
   so a rerun recomputes only the missing ones. In-memory (numpy) rows are summed in
   the client instead, and each row's representatives and weights are kept (``K`` of
   each a row) for the labels, up to :data:`GRAPH_CACHE_BYTES`;
3. **solve** (``m x m``, in the client): ``n_clusters`` leading coordinates, or
   :data:`~ooc_spectral.core.eigengap.AUTO_MAX_CLUSTERS` + 1 of them for
   ``n_clusters="auto"``, which takes ``k`` from the largest eigengap;
4. **k-means** (in the client) on the representatives' unit coordinates, weighted by
   their degrees: a representative's coordinate row ``C_j`` is the weighted mean of its
   rows' coordinates divided by ``mu`` (``B' u = (1 - lambda) D_Y v``), so the weighted
   k-means of the ``m`` representatives stands for the k-means of the rows (the same ARI
   on every data set of docs/clustering.md) at no cost in ``n`` and no sample to read;
5. **coordinates and labels** of every row: lazy dask arrays, one task per row chunk
   (:func:`map_rows`, :func:`label_rows`), or written chunk by chunk.

Nothing ``n x m`` exists: a task holds its block of rows and, per sub-block, one
distance block within :data:`~ooc_spectral.core.representatives.DISTANCE_BLOCK_BYTES`.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

import dask
import numpy as np

from ..core import degenerate
from ..core.eigengap import AUTO_MAX_CLUSTERS, choose_n_clusters, laplacian_from_transfer_cut
from ..core.pass2 import _InOrder
from ..core.planning import MAX_SEGMENTS, segments, whole_chunks
from ..core.representatives import (BIPARTITE_BLOCK_ROWS, BipartiteSums, ClusterMap,
                                    NEAR_TIES_MIN_FEATURES, REACH_FACTOR, Representatives, TransferCutMap,
                                    bipartite_sums,
                                    chunk_bipartite, combine_in_order,
                                    in_threads, nearest_center, pieces_of,
                                    solve_transfer_cut, unit_rows)
from ..core.representative_selection import representative_scales, select_representatives
from .._accel.support import accel_for
from .._accel.threads import one_thread
from .._validation import check_finite
from ..exceptions import InvalidInputError
from ..runtime.execution import Executor, shared
from .accumulate import PartialStore, tree_reduce
from .writeback import map_rows

if TYPE_CHECKING:  # imported where used: an in-memory fit need not load dask.array
    import dask.array as da

__all__ = ["RepresentativesFit", "fit_representatives", "bipartite_pass", "label_rows",
           "choose_representatives", "embed_and_label", "check_connected", "read_sample",
           "TASK_ROWS", "GRAPH_CACHE_BYTES", "warn_if_degenerate", "resolve_n_representatives",
           "REPRESENTATIVES_PER_CLUSTER", "MAX_REPRESENTATIVES"]

#: Rows per task of the passes (rounded to whole storage chunks).
TASK_ROWS = 1 << 16
#: Seed tag of the representatives' sample (each use of a seed draws its own rows).
REPRESENTATIVES_PURPOSE = 0x52
#: The stages in the client (selection, an in-memory pass, the solve, k-means) run on
#: one BLAS/OpenMP thread (:func:`~ooc_spectral._accel.threads.one_thread`, from the
#: process's one inspection of its libraries): small products, and on a shared machine
#: more threads spin. The dense solve ran several times slower on two threads than on
#: one, 2 cores under load (docs/representatives.md).
CLIENT_THREADS = 1
#: Stage name of the bipartite pass's partials in a checkpoint (``r2``: the graph with
#: the representatives' scales).
STAGE = "bipartite-r2"
#: ``n_representatives="auto"``: this many representatives per cluster, at most
#: :data:`MAX_REPRESENTATIVES` (and at most half the rows). The graph must trace each
#: cluster's shape, which takes a number of representatives per cluster, not per row;
#: past that, more of them only cost (the passes grow as ``n m``, the selection as
#: ``m^2``, the solve as ``m^3``) and on noisy data thin the bridges less well
#: (docs/clustering.md: two moons ARI 0.98 at 200 representatives, 0.82 at 1000).
REPRESENTATIVES_PER_CLUSTER = 100
MAX_REPRESENTATIVES = 1000
#: The largest spread of the rows around their mean (times sqrt(features)) whose squared
#: distances float64 holds with room to spare, and its inverse the smallest (:func:`check_spread`).
SPREAD_LIMIT = 1e150
#: In-memory rows keep each row's neighbourhood (12 bytes per row and representative of
#: its reach) for the labels up to this size; above it the labels find them again.
GRAPH_CACHE_BYTES = 256 * 2**20
#: The in-memory pass hands its blocks to the threads this many per core at a time.
PASS_WINDOW = 4


@dataclass
class RepresentativesFit:
    """What :func:`fit_representatives` found.

    Attributes
    ----------
    cmap : ClusterMap
        The map of rows to unit coordinates and clusters.
    sums : BipartiteSums
    n_clusters : int
        The clusters made (the one chosen for ``n_clusters="auto"``).
    eigengaps : ndarray or None
        For ``n_clusters="auto"``: ``eigengaps[k - 1]`` is the gap between the ``k``-th
        and ``(k + 1)``-th smallest Laplacian eigenvalues
        (:func:`~ooc_spectral.core.eigengap.eigengaps`); None otherwise.
    laplacian_eigenvalues : ndarray
        The bipartite graph's smallest normalized-Laplacian eigenvalues ``1 - sqrt(mu)``
        that were computed.
    representative_labels : ndarray of shape (m,)
        Each representative's cluster (-1: joined to no row).
    inertia : float
        Weighted k-means inertia of the representatives' unit coordinates.
    n_iter : int
        Lloyd iterations of the best k-means run.
    times : dict
        Seconds per stage.
    graph : list or None
        In-memory input: ``(index, b)`` of every block of rows, in order, for the labels
        (None when not kept).
    """

    cmap: ClusterMap
    sums: BipartiteSums
    n_clusters: int
    eigengaps: np.ndarray | None
    laplacian_eigenvalues: np.ndarray
    representative_labels: np.ndarray
    inertia: float
    n_iter: int
    times: dict = field(default_factory=dict)
    graph: list | None = None

    def estimated_sizes(self) -> np.ndarray:
        """Rows per cluster as the graph sees them: each cluster's share of the
        representatives' degrees times ``n`` (exact when every row's weights sum alike;
        what the degenerate-partition check reads where the labels are lazy)."""
        lab = self.representative_labels
        used = lab >= 0
        w = np.bincount(lab[used], weights=self.sums.degrees[used], minlength=self.n_clusters)
        return w / max(w.sum(), 1e-300) * self.sums.n


def read_sample(source, rows: np.ndarray) -> np.ndarray:
    """The rows numbered ``rows`` (sorted ascending, unique) as float64, checked finite:
    each storage chunk that holds some is read once, from its first such row to its
    last."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        return np.empty((0, source.n_features))
    step = max(1, int(source.storage_chunk_rows))
    chunk = rows // step
    breaks = np.flatnonzero(np.diff(chunk)) + 1
    parts = []
    for a, b in zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [rows.size]])):
        lo, hi = int(rows[a]), int(rows[b - 1]) + 1
        parts.append(source.read_rows(lo, hi)[rows[a:b] - lo])
    return np.concatenate(parts)


def sample_rows(n_rows: int, size: int, seed: int, purpose: int) -> np.ndarray:
    """Sorted row numbers of a seeded uniform sample of ``min(size, n_rows)`` rows."""
    n_rows, size = int(n_rows), int(size)
    if size >= n_rows:
        return np.arange(n_rows, dtype=np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), purpose, n_rows]))
    return np.sort(rng.choice(n_rows, size=size, replace=False)).astype(np.int64)


def resolve_n_representatives(n_representatives, n_clusters) -> int:
    """``m`` asked for: ``n_representatives``, or for ``"auto"``
    :data:`REPRESENTATIVES_PER_CLUSTER` per cluster up to :data:`MAX_REPRESENTATIVES`
    (``n_clusters="auto"``: the most). Half the rows bound it in
    :func:`choose_representatives`."""
    if isinstance(n_representatives, str) and n_representatives == "auto":
        if n_clusters == "auto":
            return MAX_REPRESENTATIVES
        return min(MAX_REPRESENTATIVES, REPRESENTATIVES_PER_CLUSTER * max(int(n_clusters), 1))
    return int(n_representatives)


def choose_representatives(source, n_representatives: int, n_neighbors: int, seed: int, *,
                           sample_factor: int = 10) -> Representatives:
    """The representatives: k-means++ and Lloyd on a seeded uniform sample of
    ``sample_factor * m`` rows (``m`` at most half the rows), and their scales from the
    same sample."""
    n = source.n_rows
    m = max(1, min(int(n_representatives), -(-n // 2)))
    sample = read_sample(source, sample_rows(n, sample_factor * m, seed, REPRESENTATIVES_PURPOSE))
    check_spread(sample)
    points = select_representatives(sample, m, seed)
    K = min(int(n_neighbors), points.shape[0])
    near_ties = points.shape[1] >= NEAR_TIES_MIN_FEATURES
    return Representatives(points, K, representative_scales(points, K, sample),
                           reach=REACH_FACTOR * K if near_ties else K)


def check_spread(sample: np.ndarray) -> None:
    """Refuse rows whose squared distances leave float64: a spread around their mean
    above ``1e150`` (the squares overflow) or, not 0, below ``1e-150`` (they underflow,
    and every row looks as if it sat on its representatives)."""
    if sample.size == 0:
        return
    with np.errstate(over="ignore", invalid="ignore"):
        spread = float(np.max(np.abs(sample - sample.mean(axis=0))))
    wide = not spread * np.sqrt(sample.shape[1]) <= SPREAD_LIMIT
    if wide or 0.0 < spread < 1.0 / SPREAD_LIMIT:
        raise InvalidInputError(
            f"the rows spread {spread:.3g} around their mean: their squared distances "
            f"{'overflow' if wide else 'underflow'} float64, and the graph's weights are made "
            "of them; rescale the columns (for instance standardise them) and fit again")


def _from_flat(flat: dict) -> BipartiteSums:
    return BipartiteSums(int(flat["n"]), np.asarray(flat["cross"], dtype=np.float64),
                         np.asarray(flat["degrees"], dtype=np.float64))


def bipartite_pass(X: da.Array, reps: Representatives, *, executor: Executor,
                   chunk_starts=None, store: PartialStore | None = None,
                   max_segments: int = MAX_SEGMENTS) -> BipartiteSums:
    """``B' D_X^-1 B``, ``B' 1`` and ``n`` over the row chunks of ``X``: one graph (a map
    and an ordered tree reduction per segment), computed once."""
    blocks = X.to_delayed().ravel()
    offsets = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]]).astype(np.int64)
    r_key = shared(reps)
    starts_key = shared(np.asarray(chunk_starts)) if chunk_starts is not None else None
    segs = segments(len(blocks), max_segments)
    # the partials belong to these representatives (a resumed run on another machine may
    # round its selection differently) and to these tasks
    stage = f"{STAGE}-" + dask.base.tokenize(reps.points, reps.n_neighbors, reps.scales, reps.reach,
                                             X.chunks[0])[:16]
    fold = _InOrder()
    todo = {}
    for s, seg in enumerate(segs):
        found = store.load_partial(stage, s) if store is not None else None
        if found is not None:
            fold.add(s, _from_flat(found))
            continue
        tasks = [dask.delayed(chunk_bipartite, pure=True)(blocks[i], r_key, int(offsets[i]),
                                                          starts_key) for i in seg]
        todo[s] = tree_reduce(tasks, combine_many=combine_in_order)

    def keep(s, part):
        if store is not None:
            store.save_partial(stage, s, part.to_flat())
        fold.add(s, part)

    executor.run("representatives: bipartite sums", todo, on_result=keep, keep=False)
    return fold.result(len(segs))


def in_memory_blocks(source, step: int):
    """``(offset, rows)`` of in-memory rows in order: blocks of ``step`` rows in
    sub-blocks of :data:`BIPARTITE_BLOCK_ROWS`, float64, checked finite. The fit and
    ``predict`` read the rows the same way, so each row's representatives come from the
    same products, bit for bit."""
    for a in range(0, max(source.n_rows, 1), step):
        block = source.read_raw(a, a + step)
        for c in range(0, max(len(block), 1), BIPARTITE_BLOCK_ROWS):
            X = np.ascontiguousarray(block[c:c + BIPARTITE_BLOCK_ROWS], dtype=np.float64)
            check_finite(X, a + c, chunk_starts=source.chunk_starts)
            yield a + c, X


def in_memory_pass(source, reps: Representatives, step: int) -> tuple[BipartiteSums, list | None]:
    """The bipartite sums of in-memory rows, block by block (on every core, folded in row
    order), and each block's neighbourhood ``(index, b)``
    (:meth:`~ooc_spectral.core.representatives.Representatives.neighbourhood`) while they
    fit in :data:`GRAPH_CACHE_BYTES`. The blocks go to the threads
    :data:`PASS_WINDOW` per core at a time, and their sums are folded before the next
    ones start: the threads share the work evenly, and the memory held is a few
    ``m x m`` sums whatever ``n``."""
    keep = source.n_rows * reps.reach * 12 <= GRAPH_CACHE_BYTES
    K = reps.n_neighbors

    def one(block):
        index, b = reps.neighbourhood(block[1])
        part = bipartite_sums(index[:, :K], b[:, :K], reps.size)
        return part, ((index.astype(np.int32), b) if keep else None)

    blocks = in_memory_blocks(source, step)
    window = PASS_WINDOW * (os.cpu_count() or 1)
    total, graph = None, ([] if keep else None)
    while batch := list(itertools.islice(blocks, window)):
        for part, g in in_threads(one, batch):
            # in row order, into the first part's arrays (each part is this loop's own)
            total = part if total is None else total.combine(part, in_place=True)
            if keep:
                graph.append(g)
    return total, graph


def _label_located(block, cmap, chunk_starts=None, block_info=None):
    offset = block_info[0]["array-location"][0][0] if block_info else 0
    X = np.ascontiguousarray(block, dtype=np.float64)
    check_finite(X, offset, chunk_starts=chunk_starts)
    return cmap.labels(X)


def label_rows(X: da.Array, cmap: ClusterMap, chunk_starts=None) -> da.Array:
    """The lazy labels ``(n,)`` of every row of ``X`` (one task per row chunk)."""
    starts = None if chunk_starts is None else shared(np.asarray(chunk_starts))
    name = "ooc-spectral-rep-labels-" + dask.base.tokenize(X, cmap.centers, cmap.tmap.coefficients)
    import dask.array as da

    return da.map_blocks(_label_located, X, shared(cmap), starts, drop_axis=1, dtype=np.int64,
                         meta=np.empty((0,), dtype=np.int64), chunks=(X.chunks[0],), name=name)


def check_connected(sums: BipartiteSums, n_clusters, n_neighbors: int) -> tuple[int, np.ndarray]:
    """The pieces of the graph (:func:`~ooc_spectral.core.graph_pieces.pieces_of`:
    their count and the representatives' labels); a graph in more pieces than
    ``n_clusters`` (or than ``"auto"`` chooses among) is refused: its embedding would keep
    an arbitrary few of the pieces' indicators (the rows of the others at 0) and k-means
    would group pieces the graph does not relate, a clustering that looks plausible and
    means nothing."""
    found = pieces_of(sums)
    pieces = found[0]
    auto = n_clusters == "auto"
    k = AUTO_MAX_CLUSTERS if auto else int(n_clusters)
    if pieces <= k or k == 1:  # one cluster: every row in it, whatever the pieces
        return found
    K = int(n_neighbors)
    asked = (f"the n_clusters='auto' limit of {k}" if auto else f"n_clusters={k}")
    head = (f"the graph of the rows and their n_neighbors={K} nearest representatives falls "
            f"into {pieces} separate pieces, more than {asked}: nothing in the graph "
            "says which pieces belong together, so the clustering would be arbitrary. ")
    if K == 1:
        raise InvalidInputError(
            head + "With n_neighbors=1 each row joins one representative, which makes one "
            "piece per representative: use n_neighbors=5 (the default) or more")
    raise InvalidInputError(
        head + f"The rows form {pieces} groups that no row links: ask for "
        f"n_clusters={pieces}, or raise n_neighbors if some of those groups should merge")


def warn_if_degenerate(owner: str, sizes, n_neighbors: int, k: int) -> None:
    """The :class:`~ooc_spectral.exceptions.DegeneratePartitionWarning` of a partition
    with one cluster and a handful, with the change that helps on this graph."""
    what = degenerate.partition_message(sizes)
    if what is None:
        return
    fewer = (f"ask for fewer clusters than n_clusters={k}, or " if k > 2 else
             "check those rows (one cluster and a few outliers is what the graph sees), or ")
    degenerate.warn(owner, f"the partition is degenerate: {what}", (
        "The rows of the small clusters are far from the rest (outliers) or the graph "
        f"barely links them: {fewer}raise n_neighbors={n_neighbors} (each row then joins "
        "more representatives)"))


def task_rows(source, requested: int | None = None) -> int:
    """Rows per task: ``requested`` or :data:`TASK_ROWS`, in whole storage chunks."""
    return whole_chunks(requested or TASK_ROWS, source.storage_chunk_rows, source.n_rows)


def solve_for(sums: BipartiteSums, reps: Representatives, n_clusters, n_components: int | None,
              pieces: tuple[int, np.ndarray]) -> tuple[TransferCutMap, int, np.ndarray | None,
                                                       np.ndarray]:
    """``(map, k, gaps, laplacian)``: the solve, and ``k`` (from the eigengap for
    ``n_clusters="auto"``, at least the graph's pieces). The map keeps ``n_components``
    coordinates (default ``k``, Ng, Jordan & Weiss's)."""
    r = int((sums.degrees > 0).sum())
    auto = n_clusters == "auto"
    p = int(n_components) if n_components else None
    want = max(p or 0, AUTO_MAX_CLUSTERS + 1 if auto else int(n_clusters))
    if r < (3 if auto else want):
        raise InvalidInputError(
            f"only {r} representatives are joined to rows, too few for "
            f"{'n_clusters=auto' if auto else f'{want} coordinates'}: raise "
            "n_representatives where it is below that, or lower n_clusters / n_components "
            "(identical rows make one representative: the rows hold fewer distinct points "
            "than that)")
    tmap = solve_transfer_cut(sums, reps, min(want, r), pieces)
    lam = laplacian_from_transfer_cut(tmap.eigenvalues)
    gaps = None
    if auto:
        k, gaps = choose_n_clusters(lam, low=max(2, pieces[0]))
    else:
        k = int(n_clusters)
    return tmap.leading(p or k), k, gaps, lam


def cluster_representatives(tmap: TransferCutMap, sums: BipartiteSums, k: int, n_init: int,
                            seed: int):
    """k-means (k-means++, ``n_init`` restarts) of the representatives' unit coordinates
    ``C_j / |C_j|`` weighted by their degrees; returns the fitted ``KMeans`` and each
    representative's cluster (-1 for one joined to no row)."""
    from sklearn.cluster import KMeans

    used = sums.degrees > 0
    V = unit_rows(tmap.coefficients[used])
    km = KMeans(n_clusters=k, init="k-means++", n_init=n_init, random_state=seed)
    km.fit(V, sample_weight=sums.degrees[used])
    labels = np.full(len(used), -1, dtype=np.int64)
    labels[used] = km.labels_
    return km, labels


def fit_representatives(source, *, n_clusters, n_components: int | None,
                        n_representatives, n_neighbors: int, seed: int, n_init: int = 10,
                        executor: Executor | None = None, chunk_rows: int | None = None,
                        store: PartialStore | None = None,
                        sample_factor: int = 10) -> RepresentativesFit:
    """Stages 1-4 of the module docstring over ``source``; the rows' coordinates and
    labels are then ``embed_and_label(source, fit.cmap, graph=fit.graph)``.
    ``n_clusters`` is an int or ``"auto"``; ``n_components=None`` keeps ``k``;
    ``n_representatives`` an int or ``"auto"`` (:func:`resolve_n_representatives`)."""
    n_representatives = resolve_n_representatives(n_representatives, n_clusters)
    with accel_for(source.n_rows * int(n_representatives)):  # numba's search on large fits
        return _fit_representatives(source, n_clusters, n_components, n_representatives,
                                    n_neighbors, seed, n_init, executor, chunk_rows, store,
                                    sample_factor)


def _fit_representatives(source, n_clusters, n_components, n_representatives, n_neighbors,
                         seed, n_init, executor, chunk_rows, store, sample_factor):
    times = {}
    t0 = time.perf_counter()
    with one_thread():
        reps = choose_representatives(source, n_representatives, n_neighbors, seed,
                                      sample_factor=sample_factor)
    times["representatives"] = time.perf_counter() - t0
    t = time.perf_counter()
    graph = None
    if source.kind == "numpy":  # in memory: the same sums, without a graph
        with one_thread():
            sums, graph = in_memory_pass(source, reps, task_rows(source, chunk_rows))
    else:
        X = source.to_dask(task_rows(source, chunk_rows))
        sums = bipartite_pass(X, reps, executor=executor or Executor(),
                              chunk_starts=source.chunk_starts, store=store)
    times["bipartite pass"] = time.perf_counter() - t
    pieces = check_connected(sums, n_clusters, n_neighbors)
    t = time.perf_counter()
    with one_thread():
        tmap, k, gaps, lam = solve_for(sums, reps, n_clusters, n_components, pieces)
    times["solve"] = time.perf_counter() - t
    t = time.perf_counter()
    with one_thread():
        km, rep_labels = cluster_representatives(tmap, sums, k, n_init, seed)
    centers = np.ascontiguousarray(km.cluster_centers_, dtype=np.float64)
    times["k-means"] = time.perf_counter() - t
    return RepresentativesFit(ClusterMap(tmap, centers), sums, k, gaps, lam, rep_labels,
                              float(km.inertia_), int(km.n_iter_), times, graph)


def embed_and_label(source, cmap: ClusterMap, chunk_rows: int | None = None, graph=None):
    """``(embedding, labels)`` of every row: numpy for numpy input (from ``graph``, the
    rows' representatives and weights, where the fit kept them), lazy dask arrays
    otherwise."""
    if source.kind == "numpy":
        with one_thread():  # the blocks split between the cores, BLAS on one thread each
            return _embed_and_label_in_memory(source, cmap, chunk_rows, graph)
    X = source.to_dask(task_rows(source, chunk_rows))
    return (map_rows(X, cmap, source.chunk_starts, name="ooc-spectral-rep-embed"),
            label_rows(X, cmap, source.chunk_starts))


def _embed_and_label_in_memory(source, cmap: ClusterMap, chunk_rows, graph):
    if graph is None:
        reps = cmap.tmap.representatives
        with accel_for(source.n_rows * reps.size):
            graph = in_threads(lambda block: reps.neighbourhood(block[1]),
                               in_memory_blocks(source, task_rows(source, chunk_rows)))
    parts = in_threads(lambda g: cmap.embed_weights(*g), graph)
    E = np.concatenate(parts) if parts else np.empty((0, cmap.n_components))
    return E, nearest_center(E, cmap.centers)
