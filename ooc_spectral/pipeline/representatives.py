"""The representatives affinity over a source (issue 39): its passes as dask graphs.

The numerics are in :mod:`ooc_spectral.core.representatives` (the graph, the transfer
cut, why it is the bipartite graph's spectral embedding); this module runs them over a
:class:`~ooc_spectral.io.source.DataSource`:

1. **representatives** (in the client): a seeded sample of ``sample_factor * m`` rows
   (:func:`~ooc_spectral.core.planning.plan_sample`: a few runs of contiguous rows, so a
   few storage-chunk reads however large the data), k-means++ and Lloyd on it;
2. **bipartite pass** (a parallel map over row chunks and the ordered tree reduction of
   :func:`~ooc_spectral.pipeline.accumulate.tree_reduce`): every chunk reduced to a
   :class:`~ooc_spectral.core.representatives.BipartiteSums` (``m x m`` and ``m``
   numbers), combined in row order, so the sums do not depend on which worker finished
   first. The graph is built once and computed once; segments of consecutive chunks can
   be kept in a checkpoint (a :class:`~ooc_spectral.pipeline.accumulate.PartialStore`),
   so a rerun recomputes only the missing ones;
3. **solve** (``m x m``, in the client);
4. **k-means** (in the client) on the unit coordinates of a seeded sample of
   ``kmeans_sample_size`` rows (every row when there are fewer);
5. **coordinates and labels** of every row: lazy dask arrays, one task per row chunk
   (:func:`map_rows`, :func:`label_rows`), or written chunk by chunk.

Nothing ``n x m`` exists: a task holds its block of rows and, per sub-block, one
distance block within :data:`~ooc_spectral.core.representatives.DISTANCE_BLOCK_BYTES`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import dask
import dask.array as da
import numpy as np

from ..core.pass2 import _InOrder
from ..core.planning import MAX_SEGMENTS, plan_sample, segments, whole_chunks
from ..core.representatives import (BipartiteSums, ClusterMap, Representatives, TransferCutMap,
                                    chunk_bipartite, graph_pieces,
                                    combine_in_order, embed_block, nearest_center, select_representatives,
                                    solve_transfer_cut)
from ..exceptions import InvalidInputError
from ..runtime.execution import Executor, shared
from .accumulate import PartialStore, tree_reduce
from .writeback import map_rows

__all__ = ["RepresentativesFit", "fit_representatives", "bipartite_pass", "label_rows",
           "choose_representatives", "embed_and_label", "check_connected", "TASK_ROWS"]

#: Rows per task of the passes (rounded to whole storage chunks).
TASK_ROWS = 1 << 16
#: ``purpose`` tags of :func:`plan_sample` (each use draws its own rows).
REPRESENTATIVES_PURPOSE = 0x52
KMEANS_PURPOSE = 0x4C
#: The stages in the client (selection, an in-memory pass, the solve, k-means) run on
#: one BLAS/OpenMP thread: small products, and on a shared machine more threads spin.
#: The dense solve ran several times slower on two threads than on one, 2 cores under
#: load (docs/representatives.md).
CLIENT_THREADS = 1
#: An eigenvalue ``mu`` of the transfer cut within this of 1 counts a piece of the graph.
PIECES_TOL = 1e-10
#: Stage name of the bipartite pass's partials in a checkpoint.
STAGE = "bipartite-r1"


@dataclass
class RepresentativesFit:
    """What :func:`fit_representatives` found.

    Attributes
    ----------
    cmap : ClusterMap
        The map of rows to unit coordinates and clusters.
    sums : BipartiteSums
    inertia : float
        k-means inertia on the sample.
    sample_size : int
        Rows of the k-means sample.
    n_iter : int
        Lloyd iterations of the best k-means run on the sample.
    times : dict
        Seconds per stage.
    """

    cmap: ClusterMap
    sums: BipartiteSums
    inertia: float
    sample_size: int
    n_iter: int
    times: dict = field(default_factory=dict)


def choose_representatives(source, n_representatives: int, n_neighbors: int, seed: int, *,
                           sample_factor: int = 10) -> Representatives:
    """The representatives: k-means++ and Lloyd on a seeded sample of
    ``sample_factor * m`` rows, ``m`` at most half the rows."""
    n = source.n_rows
    m = max(1, min(int(n_representatives), -(-n // 2)))
    rows = plan_sample(n, sample_factor * m, seed, REPRESENTATIVES_PURPOSE)
    points = select_representatives(source.read_index(rows), m, seed)
    return Representatives(points, min(int(n_neighbors), points.shape[0]))


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
    stage = f"{STAGE}-" + dask.base.tokenize(reps.points, reps.n_neighbors, X.chunks[0])[:16]
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


def _label_located(block, cmap, chunk_starts=None, block_info=None):
    from .._validation import check_finite

    offset = block_info[0]["array-location"][0][0] if block_info else 0
    X = np.ascontiguousarray(block, dtype=np.float64)
    check_finite(X, offset, chunk_starts=chunk_starts)
    return cmap.labels(X)


def label_rows(X: da.Array, cmap: ClusterMap, chunk_starts=None) -> da.Array:
    """The lazy labels ``(n,)`` of every row of ``X`` (one task per row chunk)."""
    starts = None if chunk_starts is None else shared(np.asarray(chunk_starts))
    name = "ooc-spectral-rep-labels-" + dask.base.tokenize(X, cmap.centers, cmap.tmap.coefficients)
    return da.map_blocks(_label_located, X, shared(cmap), starts, drop_axis=1, dtype=np.int64,
                         meta=np.empty((0,), dtype=np.int64), chunks=(X.chunks[0],), name=name)


def check_connected(sums: BipartiteSums, n_clusters: int, n_neighbors: int) -> None:
    """Refuse a graph in more pieces than ``n_clusters`` (:func:`graph_pieces`): its
    embedding would keep an arbitrary few of the pieces' indicators (the rows of the
    others at 0) and k-means would group pieces the graph does not relate, a clustering
    that looks plausible and means nothing."""
    pieces = graph_pieces(sums)
    if pieces <= int(n_clusters):
        return
    k, K = int(n_clusters), int(n_neighbors)
    head = (f"the graph of the rows and their n_neighbors={K} nearest representatives falls "
            f"into {pieces} separate pieces, more than n_clusters={k}: nothing in the graph "
            "says which pieces belong together, so the clustering would be arbitrary. ")
    if K == 1:
        raise InvalidInputError(
            head + "With n_neighbors=1 each row joins one representative, which makes one "
            "piece per representative: use n_neighbors=5 (the default) or more")
    raise InvalidInputError(
        head + f"The rows form {pieces} groups that no row links: ask for "
        f"n_clusters={pieces}, or raise n_neighbors if some of those groups should merge")


def coordinates_for(tmap: TransferCutMap, n_clusters: int) -> TransferCutMap:
    """The default coordinates for ``n_clusters`` clusters: the constant one and ``k``
    others, unless the graph is in at least ``k`` pieces (``k`` eigenvalues ``mu`` equal
    to 1 within :data:`PIECES_TOL`): then the first ``k`` coordinates, constant on each
    piece, are the pieces' indicators (Ng, Jordan & Weiss's ideal case), and a
    ``(k + 1)``-th only varies inside a piece and can split it after the rows are scaled
    to unit length (halo-ball, 2 * 10^4 rows: ARI 1.0 at p = 2 for every seed, 0.12-0.16
    at p = 3 for two seeds of three). A connected graph keeps ``k + 1`` (digits: ARI
    0.836 mean, 0.799 least over 20 seeds, against 0.827 / 0.772 at p = k; see
    docs/representatives.md)."""
    k = int(n_clusters)
    pieces = int(np.sum(1.0 - tmap.eigenvalues <= PIECES_TOL))
    if pieces < k or tmap.n_components <= k:
        return tmap
    return TransferCutMap(tmap.representatives, tmap.coefficients[:, :k].copy(),
                          tmap.eigenvalues[:k].copy())


def task_rows(source, requested: int | None = None) -> int:
    """Rows per task: ``requested`` or :data:`TASK_ROWS`, in whole storage chunks."""
    return whole_chunks(requested or TASK_ROWS, source.storage_chunk_rows, source.n_rows)


def fit_representatives(source, *, n_clusters: int, n_components: int | None,
                        n_representatives: int,
                        n_neighbors: int, seed: int, n_init: int = 10,
                        kmeans_sample_size: int = 100_000, executor: Executor | None = None,
                        chunk_rows: int | None = None, store: PartialStore | None = None,
                        sample_factor: int = 10) -> RepresentativesFit:
    """Stages 1-4 of the module docstring over ``source``; the rows' coordinates and
    labels are then ``map_rows(X, fit.cmap)`` and ``label_rows(X, fit.cmap)``.
    ``n_components=None``: :func:`coordinates_for` chooses ``k`` or ``k + 1``."""
    from sklearn.cluster import KMeans

    from threadpoolctl import threadpool_limits

    times = {}
    t0 = time.perf_counter()
    with threadpool_limits(CLIENT_THREADS):
        reps = choose_representatives(source, n_representatives, n_neighbors, seed,
                                      sample_factor=sample_factor)
    times["representatives"] = time.perf_counter() - t0
    t = time.perf_counter()
    if source.kind == "numpy":  # in memory: the same sums, without a graph
        step = task_rows(source, chunk_rows)
        with threadpool_limits(CLIENT_THREADS):
            sums = combine_in_order([chunk_bipartite(source.read_raw(a, a + step), reps, a)
                                     for a in range(0, source.n_rows, step)])
    else:
        X = source.to_dask(task_rows(source, chunk_rows))
        sums = bipartite_pass(X, reps, executor=executor or Executor(),
                              chunk_starts=source.chunk_starts, store=store)
    times["bipartite pass"] = time.perf_counter() - t
    check_connected(sums, n_clusters, n_neighbors)
    t = time.perf_counter()
    with threadpool_limits(CLIENT_THREADS):
        tmap = solve_transfer_cut(sums, reps, min(int(n_components or n_clusters + 1),
                                                  int((sums.degrees > 0).sum())))
    if n_components is None:
        tmap = coordinates_for(tmap, n_clusters)
    times["solve"] = time.perf_counter() - t
    t = time.perf_counter()
    rows = plan_sample(source.n_rows, kmeans_sample_size, seed, KMEANS_PURPOSE)
    sample = source.read_index(rows)
    with threadpool_limits(CLIENT_THREADS):
        U = ClusterMap(tmap).embed(sample)
        km = KMeans(n_clusters=n_clusters, init="k-means++", n_init=n_init,
                    random_state=seed).fit(U)
    centers = np.ascontiguousarray(km.cluster_centers_, dtype=np.float64)
    times["k-means"] = time.perf_counter() - t
    return RepresentativesFit(ClusterMap(tmap, centers), sums, float(km.inertia_), len(rows),
                              int(km.n_iter_), times)


def embed_and_label(source, cmap: ClusterMap, chunk_rows: int | None = None):
    """``(embedding, labels)`` of every row: numpy for numpy input, lazy dask arrays
    otherwise."""
    if source.kind == "numpy":
        step = TASK_ROWS
        E = np.concatenate([embed_block(source.read_raw(a, a + step), cmap.tmap, a)
                            for a in range(0, max(source.n_rows, 1), step)])
        return E, nearest_center(E, cmap.centers)
    X = source.to_dask(task_rows(source, chunk_rows))
    return (map_rows(X, cmap, source.chunk_starts, name="ooc-spectral-rep-embed"),
            label_rows(X, cmap, source.chunk_starts))
