"""Pass 2 as a dask graph: the parallel map over row chunks and the ordered tree reduction.

Each task applies one chunk function of :mod:`ooc_spectral.core.pass2` to its rows
(a small typed statistic of :mod:`ooc_spectral.core.statistics`); the tree reduction
combines them in a fixed order (chunk, combine, aggregate, as in
``dask.array.reductions``), so the result does not depend on which worker finished
first.

The tasks are grouped in at most :data:`~ooc_spectral.core.planning.MAX_SEGMENTS`
segments of consecutive chunks; each segment is reduced into one partial, which
a checkpoint can store (:class:`PartialStore`), and the partials are folded in
segment order. With ``block_rows`` (:func:`~ooc_spectral.core.planning.plan_block_rows`)
each task walks its rows in sub-blocks, so its kernel block stays within the memory
budget whatever the dictionary size and the storage chunks.
"""

from __future__ import annotations

from typing import Protocol

import dask
import numpy as np

from .._accel.blas import libraries_tag
from ..core.model import Dictionary
from ..core.pass2 import (STAT_KINDS, _combine_many, _InOrder, block_entries, extend_moments,
                          extend_moments_kernel, kernel_cross_is_accurate)
from ..core.planning import MAX_SEGMENTS, segments
from ..core.statistics import STATS_FORMAT, Moments, Statistic, from_flat
from ..runtime.execution import Executor, shared

__all__ = ["tree_reduce", "accumulate", "PartialStore", "extension_pass", "SPLIT_EVERY"]

#: Split factor of the tree reduction.
SPLIT_EVERY = 8


def tree_reduce(parts: list, split_every: int = SPLIT_EVERY, combine_many=_combine_many):
    """Ordered tree reduction of delayed partials (fan-in ``split_every``).

    ``combine_many(list of partials) -> partial`` merges one node's children
    (default: pass-2 statistics, ``combine`` left to right). The tree's shape
    depends only on ``len(parts)``, so the result does not depend on scheduling.
    """
    while len(parts) > 1:
        parts = [dask.delayed(combine_many, pure=True)(parts[i : i + split_every])
                 for i in range(0, len(parts), split_every)]
    return parts[0]


# --------------------------------------------------------------------------- #
# the pass
# --------------------------------------------------------------------------- #
class PartialStore(Protocol):
    """Where finished segment partials are kept across a restart (a checkpoint)."""

    def load_partial(self, stage: str, segment: int) -> dict | None: ...

    def save_partial(self, stage: str, segment: int, partial: dict) -> None: ...

    # (partials are stored flat: Statistic.to_flat / statistics.from_flat)


def accumulate(X, dictionary: Dictionary, kind: str, *, executor: Executor,
               chunk_starts=None, total: np.ndarray | None = None,
               store: PartialStore | None = None, stage: str | None = None,
               max_segments: int = MAX_SEGMENTS, tol_check: float | None = None,
               old_size: int | None = None, block_rows: int | None = None,
               tail: int = 0) -> Statistic:
    """Run one parallel pass over the row chunks of the dask array ``X``.

    Parameters
    ----------
    X : dask.array.Array of shape (n, d)
        Row chunks spanning all columns.
    dictionary : Dictionary
    kind : str
        A key of :data:`STAT_KINDS`.
    executor : Executor
    chunk_starts : ndarray, optional
        Storage chunk boundaries, to name the chunk of a non-finite row.
    total : ndarray of shape (m,), optional
        ``sum y``, required for ``kind="degrees"``.
    store, stage : optional
        Segment partials found in ``store`` under ``stage`` are not recomputed;
        new ones are saved there as they finish.
    tol_check : float, optional
        Also collect the rows whose residual exceeds it (numbers and values,
        in row order, at most ``VIOLATOR_CAP + 1``): the prefix scan's check.
    old_size : int, optional
        For ``kind="cross"``: the dictionary size the ``moments`` were made with.
    block_rows : int, optional
        Each task walks its rows in sub-blocks of this many rows (memory bound).
    tail : int, optional
        The last ``tail`` row chunks are a re-split tail, one task per thread
        (:attr:`~ooc_spectral.core.planning.TaskPlan.tail`): they form the last segment and
        start once every other task is done, so that no thread takes two of them
        while another still has whole tasks to do (the order a scheduler picks
        otherwise does not follow the rows).

    Returns
    -------
    Statistic
        The combined statistic (:mod:`ooc_spectral.core.statistics`).
    """
    func = STAT_KINDS[kind]
    blocks = X.to_delayed().ravel()
    offsets = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]]).astype(np.int64)
    d_key = shared(dictionary)
    starts_key = shared(chunk_starts) if chunk_starts is not None else None
    extra = ((shared(total),) if kind == "degrees"
             else (int(old_size),) if kind in ("cross", "kernel_cross") else ())
    bulk = len(blocks) - int(tail)
    segs = segments(bulk, max_segments) + ([range(bulk, len(blocks))] if tail else [])
    # partials of other libraries agree to rounding only: a pass resumed under another BLAS
    # or without numba's loops recomputes them rather than mix the two (named by the
    # libraries of the first task's block)
    first = int(X.chunks[0][0]) if len(X.chunks[0]) else 0
    stage = f"{stage or kind}-{STATS_FORMAT}-{libraries_tag(block_entries(first, dictionary))}"

    fold = _InOrder()
    todo = {}
    for s, seg in enumerate(segs):
        found = store.load_partial(stage, s) if store is not None else None
        if found is not None:
            fold.add(s, from_flat(found))
            continue
        check = {} if tol_check is None else {"tol_check": float(tol_check)}
        if block_rows is not None:
            check["block_rows"] = int(block_rows)
        tasks = [dask.delayed(func, pure=True)(blocks[i], d_key, int(offsets[i]), *extra,
                                               chunk_starts=starts_key, **check)
                 for i in seg]
        todo[s] = tree_reduce(tasks)

    def keep(s, partial):
        if store is not None:
            store.save_partial(stage, s, partial.to_flat())
        fold.add(s, partial)

    label = f"pass 2 ({kind})"
    first = {s: t for s, t in todo.items() if segs[s].start < bulk}
    executor.run(label, first, on_result=keep, keep=False)
    if len(first) < len(todo):  # the tail, once the threads are free
        executor.run(f"{label}, last {tail} tasks", {s: t for s, t in todo.items() if s not in first},
                     on_result=keep, keep=False)
    return fold.result(len(segs))


def extension_pass(X, dictionary: Dictionary, moments: Moments, old_size: int, *,
                   executor: Executor, chunk_starts=None, store: PartialStore | None = None,
                   stage: str | None = None, block_rows: int | None = None,
                   tail: int = 0) -> tuple[Moments, bool]:
    """Bring ``moments`` (on the first ``old_size`` points) to the grown ``dictionary``.

    One pass over X: the fast kernel-space one when the grown factor is well
    conditioned (:func:`kernel_cross_is_accurate`), else the solved one.
    Returns the extended moments and whether their certificate (``max_delta``,
    ``sum_dhat``) was measured with the grown dictionary (the solved pass) or is
    the old one, an upper bound (the fast pass). ``tail``: as for :func:`accumulate`.
    """
    fast = kernel_cross_is_accurate(dictionary)
    kind = "kernel_cross" if fast else "cross"
    part = accumulate(X, dictionary, kind, old_size=old_size, executor=executor,
                      chunk_starts=chunk_starts, store=store, block_rows=block_rows,
                      stage=None if stage is None else f"{kind}-{stage}", tail=tail)
    if fast:
        return extend_moments_kernel(moments, part, dictionary, old_size), False
    return extend_moments(moments, part), True
