"""Planning: pure chunk, order and memory arithmetic, no I/O and no dask.

Two plans are made before any data is read:

- the **visiting order** of the sequential dictionary scan (pass 1): a seeded
  shuffle of fixed windows of :data:`VISIT_WINDOW_ROWS` rows, each window read
  once and its rows permuted inside it. The order depends only on the seed and
  the number of rows, never on the storage chunking, so rechunking the input
  cannot change the dictionary;
- the **tasks** of the parallel passes (2 and 3), :func:`plan_tasks`: whole
  storage chunks when there are enough of them, row ranges of a storage chunk
  when there are fewer than two per thread (a task may read part of a chunk),
  and inside every task the **sub-blocks** (:func:`plan_block_rows`) that keep
  its kernel block within the memory budget whatever the dictionary size.

Both are plain values, recorded in checkpoints and reports.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

from ..exceptions import InvalidParameterError

__all__ = [
    "VISIT_WINDOW_ROWS",
    "SCAN_BLOCK_ROWS",
    "SCAN_ONE_BLAS_THREAD_BELOW",
    "CLIENT_ONE_BLAS_THREAD_BELOW",
    "small_blas",
    "SCAN_SPLIT_ROWS",
    "SCAN_READ_CACHE_BYTES",
    "scan_block_rows",
    "chunks_of_rows",
    "MAX_SEGMENTS",
    "DEFAULT_TASK_MEMORY",
    "VisitOrder",
    "plan_task_rows",
    "plan_tasks",
    "plan_block_rows",
    "solve_block_rows",
    "TaskPlan",
    "balanced_tail",
    "tasks_tag",
    "row_chunks",
    "equal_rows",
    "makespan_loss",
    "BALANCE_TOLERANCE",
    "TARGET_TASK_ROWS",
    "MIN_TASK_ROWS",
    "MIN_BLOCK_ROWS",
    "segments",
    "parse_bytes",
    "plan_sample",
    "SAMPLE_RUNS",
]

#: A seeded sample is made of this many runs of contiguous rows (<= this many chunk reads).
SAMPLE_RUNS = 64

#: Rows per window of the scan's visiting order (the unit that is read at once).
VISIT_WINDOW_ROWS = 1 << 16
#: Largest number of rows per block of the blocked scan (one kernel block and one
#: solve each); see :func:`scan_block_rows`.
SCAN_BLOCK_ROWS = 8192
#: Points entering one block of the scan before the rest of the block is taken in
#: panels of SCAN_PANEL_ROWS rows: points added in a panel update the panel's later
#: rows one at a time (matrix-vector), the next panel starts from one triangular
#: solve against the whole dictionary (matrix-matrix).
SCAN_PANEL_POINTS = 64
SCAN_PANEL_ROWS = 256
#: Below this dictionary size the scan runs BLAS on one thread, and shares each
#: block's kernel rows and triangular solve between its own threads instead
#: (:func:`ooc_spectral.core.scan.blocked.block_coordinates`): the products and solves of one
#: block (c x m against an m x m factor) are too small for OpenBLAS to share well,
#: its second thread mostly spins; above it BLAS's own threads pay
#: (docs/measurements.md, "The scan's BLAS threads").
SCAN_ONE_BLAS_THREAD_BELOW = 3000
#: Below this dictionary size the client's O(m^3) stages (the rounding constants, the
#: eigensolve and the interval) run BLAS on one thread too (:func:`small_blas`). On
#: cores shared with other work OpenBLAS's threads spin waiting for each other (the
#: m = 453 eigensolve of a command-line fit took 2.6 s on two threads, 0.04 s on one);
#: on quiet cores two threads pay from about 1,200 points (docs/measurements.md, "The
#: client's BLAS threads").
CLIENT_ONE_BLAS_THREAD_BELOW = 1500
#: Decoded storage chunks the scan keeps for a later window of its visiting order,
#: bytes in the source's dtype (:class:`ooc_spectral.pipeline.scan.WindowReader`): enough
#: that most chunks shared by windows are decoded once (docs/measurements.md, "The
#: scan's read cache").
SCAN_READ_CACHE_BYTES = 128 * 2**20
#: Blocks of the scan with at least this many rows get their coordinates against the
#: dictionary on every core while BLAS runs on one thread
#: (:func:`ooc_spectral.core.scan.blocked.block_coordinates`).
SCAN_SPLIT_ROWS = 1024
#: Memory for one block's c x m coordinates in the scan.
SCAN_BLOCK_MEMORY = 128 * 2**20
#: A parallel pass is reduced in at most this many checkpointable partials (segments).
MAX_SEGMENTS = 32
#: Default memory budget of one task of passes 2 and 3 (its input block, the
#: kernel block of one sub-block and its projection, the m x m partial and the factor).
DEFAULT_TASK_MEMORY = 256 * 2**20
#: Rows per task the parallel passes aim at (whole storage chunks up to this many rows).
TARGET_TASK_ROWS = 1 << 18
#: Fewest rows per task when a small input is split so that every thread has work.
MIN_TASK_ROWS = 4096
#: The reduction passes re-split their last tasks when equal tasks would leave the
#: busiest thread this much (a fraction of the ideal) after the others
#: (:func:`balanced_tail`).
BALANCE_TOLERANCE = 0.01
#: Fewest rows per sub-block (below this the kernel block's gemm loses its rate).
MIN_BLOCK_ROWS = 256
#: Largest kernel block of a sub-block, bytes: half the 32 MiB L3 cache of this
#: project's 2-core machines, so that two tasks' blocks stay in it
#: (``workflows/bench/cli_floors.py``).
CACHE_BLOCK_BYTES = 16 * 2**20
#: Largest kernel block of a sub-block of pass 2 when its rows are solved in C order
#: (:func:`~ooc_spectral._accel.blas.fast_solve_order`, Intel MKL): a block of a few MiB
#: is computed, solved and centred within the core's cache (see
#: :func:`solve_block_rows`).
ROW_BLOCK_BYTES = 4 * 2**20


def chunks_of_rows(chunk_starts: np.ndarray, a: int, b: int) -> range:
    """The storage chunks (``chunk_starts``: their first rows, then n) that rows
    ``[a, b)`` overlap."""
    first = int(np.searchsorted(chunk_starts, a, side="right")) - 1
    return range(first, int(np.searchsorted(chunk_starts, b - 1, side="right")))


@dataclass(frozen=True)
class VisitOrder:
    """The seeded visiting order of the scan.

    Window ``w`` covers rows ``[w * window, min((w + 1) * window, n_rows))``.
    The scan visits windows in the order :attr:`windows` and, inside window
    ``w``, rows in the order :meth:`rows_in_window`.
    """

    n_rows: int
    seed: int
    window: int = VISIT_WINDOW_ROWS

    @property
    def n_windows(self) -> int:
        return -(-self.n_rows // self.window)

    @property
    def windows(self) -> np.ndarray:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 0x0C0FFEE, self.n_rows]))
        return rng.permutation(self.n_windows)

    def window_bounds(self, w: int) -> tuple[int, int]:
        a = int(w) * self.window
        return a, min(a + self.window, self.n_rows)

    def rows_in_window(self, w: int) -> np.ndarray:
        """Permutation of ``range(window length)`` for window ``w``."""
        a, b = self.window_bounds(w)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, 0x5CA9, int(w)]))
        return rng.permutation(b - a)

    def chunk_visits(self, chunk_starts: np.ndarray, start_window: int = 0) -> dict[int, list[int]]:
        """For each storage chunk (``chunk_starts``: their first rows), the positions
        in :attr:`windows` from ``start_window`` on of the windows that overlap it,
        ascending: when a decoded chunk is needed again, if ever."""
        starts = np.asarray(chunk_starts, dtype=np.int64)
        visits: dict[int, list[int]] = {}
        for k, w in enumerate(self.windows[start_window:], start=start_window):
            for j in chunks_of_rows(starts, *self.window_bounds(w)):
                visits.setdefault(j, []).append(k)
        return visits

    def sort_keys(self, rows: np.ndarray) -> np.ndarray:
        """Keys that sort row numbers as the visiting order does (for a few rows)."""
        rows = np.asarray(rows, dtype=np.int64)
        rank = np.empty(self.n_windows, dtype=np.int64)
        rank[self.windows] = np.arange(self.n_windows)
        win = rows // self.window
        out = np.empty(rows.shape, dtype=np.int64)
        for w in np.unique(win):
            sel = win == w
            inverse = np.argsort(self.rows_in_window(int(w)))
            out[sel] = rank[w] * self.window + inverse[rows[sel] - w * self.window]
        return out

    def global_order(self) -> np.ndarray:
        """All row numbers in visiting order (O(n) memory: for tests and small n)."""
        parts = []
        for w in self.windows:
            a, _ = self.window_bounds(w)
            parts.append(a + self.rows_in_window(w))
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def scan_block_rows(dictionary_size: int) -> int:
    """Rows per block of the scan for a dictionary of ``dictionary_size`` points.

    Large blocks keep the triangular solve at the BLAS-3 rate (the factor is read
    once per block, not once per row); the c x m coordinates stay within
    :data:`SCAN_BLOCK_MEMORY`. The blocked scan selects the same dictionary
    whatever the block size.
    """
    return int(max(512, min(SCAN_BLOCK_ROWS, SCAN_BLOCK_MEMORY // (8 * max(int(dictionary_size), 1)))))


def parse_bytes(value) -> int:
    """``"256MiB"``, ``"2 GB"``, ``1e9`` or an int, as a number of bytes."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and np.isfinite(value):
        return int(value)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kKmMgGtT]?i?[bB]?)\s*", str(value))
    if not m:
        raise InvalidParameterError(
            f"cannot read {value!r} as a size in bytes; write it like '512MiB' or '2GB'"
        )
    number = float(m.group(1))
    unit = m.group(2).lower().rstrip("b")
    base = 1024 if unit.endswith("i") else 1000
    power = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}[unit.rstrip("i")]
    return int(number * base**power)


def whole_chunks(rows: int, storage_rows: int, n_rows: int, *, up: bool = True) -> int:
    """``rows`` rounded to a multiple of ``storage_rows`` (up, or down with ``up=False``),
    at least one storage chunk and at most ``n_rows``: tasks read whole storage chunks.

    >>> whole_chunks(1000, 256, 10_000), whole_chunks(1000, 256, 10_000, up=False)
    (1024, 768)
    >>> whole_chunks(10, 256, 100)
    100
    """
    storage_rows = max(1, min(int(storage_rows), int(n_rows)))
    rows = int(rows)
    rows = -(-rows // storage_rows) * storage_rows if up else (rows // storage_rows) * storage_rows
    return int(min(max(storage_rows, rows), max(int(n_rows), 1)))


def plan_task_rows(
    n_rows: int,
    n_features: int,
    storage_rows: int,
    dictionary_size: int,
    *,
    memory: int = DEFAULT_TASK_MEMORY,
    requested: int | None = None,
    itemsize: int = 8,
) -> int:
    """Rows per task of the parallel passes.

    A task holds its input block (``itemsize`` bytes per value) and its float64
    copy, the kernel block and its projection (``c x m`` each, plus one
    temporary), and the ``m x m`` partial sum and the dictionary factor. The
    result is a multiple of ``storage_rows`` (so every task reads whole storage
    chunks and writes whole output chunks), at least one storage chunk, and at
    most the whole matrix.

    Parameters
    ----------
    requested : int, optional
        A user's choice; rounded up to a multiple of ``storage_rows``.
    """
    if requested is not None:
        return whole_chunks(requested, storage_rows, n_rows)
    m = int(dictionary_size)
    fixed = 3 * 8 * m * m
    per_row = itemsize * n_features + 8 * n_features + 3 * 8 * m + 64
    available = max(int(memory) - fixed, int(memory) // 4)
    return whole_chunks(max(1, available // per_row), storage_rows, n_rows, up=False)


@dataclass(frozen=True)
class TaskPlan:
    """The tasks of the parallel passes.

    Attributes
    ----------
    rows : int
        Rows per task (the last task may be shorter).
    n_tasks : int
    output_chunk_rows : int
        Rows per chunk of the embedding written by pass 3: the storage chunk
        when tasks span whole storage chunks, else the task rows (every output
        chunk is written by exactly one task).
    note : str or None
        Why a requested ``chunk_rows`` was not used as given (printed), or None.
    tail : tuple of int
        The passes that only reduce (pass 2 and its kind) replace the tasks after the
        first whole ones (a multiple of the threads) by one task of these many rows
        per thread, run once the whole ones are done, so that every thread finishes
        at about the same time (:func:`balanced_tail`); empty when the equal tasks
        are balanced already. Pass 3 keeps the equal tasks: each of its tasks writes
        whole output chunks.
    """

    rows: int
    n_tasks: int
    output_chunk_rows: int
    note: str | None = None
    tail: tuple[int, ...] = ()

    def reduce_chunks(self, n_rows: int) -> tuple[int, ...]:
        """Rows of each task of the reduction passes, in row order (sums to ``n_rows``)."""
        return row_chunks(int(n_rows) - sum(self.tail), self.rows) + self.tail


def row_chunks(n_rows: int, rows: int) -> tuple[int, ...]:
    """Equal tasks of ``rows`` rows over ``n_rows`` rows, the last one shorter.

    >>> row_chunks(10, 4), row_chunks(8, 4), row_chunks(0, 4)
    ((4, 4, 2), (4, 4), ())
    """
    n_rows, rows = int(n_rows), max(int(rows), 1)
    last = n_rows % rows
    return (rows,) * (n_rows // rows) + ((last,) if last else ())


def equal_rows(chunks) -> int | None:
    """The task rows of a layout of equal tasks (the last one possibly shorter,
    :func:`row_chunks`), or None for any other layout.

    >>> equal_rows((4, 4, 2)), equal_rows((4, 2, 2)), equal_rows((3,))
    (4, None, 3)
    """
    sizes = tuple(int(c) for c in chunks)
    if not sizes:
        return None
    return sizes[0] if sizes == row_chunks(sum(sizes), sizes[0]) else None


def makespan_loss(n_rows: int, rows: int, threads: int) -> float:
    """How much longer than ``n_rows / threads`` rows the busiest of ``threads`` threads
    works when tasks of ``rows`` rows (the last one shorter) go to whichever thread is
    free: a fraction of that ideal.

    The full tasks go round the threads; the short one goes to a thread with one full
    task fewer if there is one, else adds to a full load.

    >>> round(makespan_loss(2_000_000, 262_144, 2), 3)   # 7 full tasks and 0.63 of one
    0.049
    >>> makespan_loss(4 * 262_144, 262_144, 2)
    0.0
    """
    n_rows, rows, threads = int(n_rows), max(int(rows), 1), max(int(threads), 1)
    if n_rows <= 0:
        return 0.0
    full, short = divmod(n_rows, rows)
    if full % threads:
        busiest = -(-full // threads) * rows
    else:
        busiest = (full // threads) * rows + short
    return busiest * threads / n_rows - 1.0


def balanced_tail(n_rows: int, rows: int, threads: int,
                  tolerance: float = BALANCE_TOLERANCE) -> tuple[int, ...]:
    """The last tasks of a reduction pass re-split so that ``threads`` threads finish
    together: rows of each, or ``()`` when tasks of ``rows`` rows are within
    ``tolerance`` of balanced (:func:`makespan_loss`).

    The first tasks stay whole (a multiple of ``threads`` of them, ``rows`` rows
    each: whole storage chunks when ``rows`` is a multiple of the storage chunk);
    the rows after them, fewer than ``threads`` tasks' worth, become ``threads``
    tasks of equal rows (within one). Only the storage chunks these cross are read
    by two tasks (at most ``threads - 1`` more chunk reads). No task is made shorter
    than :data:`MIN_TASK_ROWS` rows. The threads finish together only if the
    re-split tasks start after the whole ones (a scheduler left to itself may give
    two of them to one thread): :func:`~ooc_spectral.pipeline.accumulate.accumulate` runs
    them after the others (its ``tail``). See docs/measurements.md, "Pass 2's re-split
    tail", for the unbalanced case it fixes.

    >>> balanced_tail(2_000_000, 262_144, 2)
    (213568, 213568)
    >>> balanced_tail(10 * 262_144, 262_144, 2)
    ()
    """
    n_rows, rows, threads = int(n_rows), max(int(rows), 1), max(int(threads), 1)
    if makespan_loss(n_rows, rows, threads) <= tolerance:
        return ()
    bulk = threads * ((n_rows // rows) // threads)
    rest = n_rows - bulk * rows  # (full tasks mod threads) * rows + the short one's rows
    count = threads
    if rest // count < min(MIN_TASK_ROWS, rows):  # tasks too small to pay for themselves
        return ()
    bounds = [rest * i // count for i in range(count + 1)]
    return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))


def tasks_tag(chunks) -> str:
    """A short name of a pass's tasks (their rows, in order) for its checkpoint partials:
    ``r<rows>`` for equal tasks (the last one shorter), with a digest of every size
    appended otherwise, so that partials of other tasks are never taken for them.

    >>> tasks_tag((4, 4, 3)), tasks_tag((4, 3, 3))
    ('r4', 'r4-f4923f83')
    """
    sizes = [int(c) for c in chunks]
    head = f"r{sizes[0] if sizes else 0}"
    if not sizes or equal_rows(sizes) is not None:
        return head
    return head + "-" + hashlib.sha256(",".join(map(str, sizes)).encode()).hexdigest()[:8]


def plan_tasks(n_rows: int, n_features: int, storage_rows: int, *, threads: int = 1,
               memory: int = DEFAULT_TASK_MEMORY, requested: int | None = None,
               itemsize: int = 8) -> TaskPlan:
    """The tasks of passes 2 and 3 for ``threads`` task slots (all workers' threads).

    Without ``requested``: whole storage chunks, as many per task as make about
    :data:`TARGET_TASK_ROWS` rows while the input block (stored and float64
    copy) takes at most half of ``memory``; a storage chunk larger than that is
    split into row ranges. Then, if that gives fewer than two tasks per thread,
    the rows are split further (tasks read a row range of a storage chunk) into
    ``2 * threads`` tasks, none below :data:`MIN_TASK_ROWS` rows.

    A ``requested`` row count is used as given (tasks then read row ranges of
    the storage chunks); only more rows than the input has is capped, with a
    ``note`` saying so. Kernel blocks are bounded separately, by the sub-blocks
    of :func:`plan_block_rows`, so the task rows do not depend on the
    dictionary size.
    """
    n_rows = max(int(n_rows), 1)
    storage_rows = max(1, min(int(storage_rows), n_rows))
    threads = max(int(threads), 1)
    note = None
    if requested is not None:
        rows = int(requested)
        if rows > n_rows:
            note = (f"chunk_rows={rows} is more than the {n_rows} rows of the input: one task "
                    f"of {n_rows} rows")
            rows = n_rows
        in_bytes = (int(itemsize) + 8) * int(n_features) * rows
        if in_bytes > memory // 2:
            note = ((note + "; ") if note else "") + (
                f"chunk_rows={rows} holds {in_bytes / 2**20:.0f} MiB of input per task, more "
                f"than half the task budget of {memory / 2**20:.0f} MiB (kept as asked)")
    else:
        per_row = (int(itemsize) + 8) * max(int(n_features), 1)
        cap = max(MIN_BLOCK_ROWS, (int(memory) // 2) // per_row)
        if storage_rows <= cap:
            rows = storage_rows * max(1, min(TARGET_TASK_ROWS, cap) // storage_rows)
        else:  # a storage chunk larger than the budget: equal row ranges of it
            rows = -(-storage_rows // -(-storage_rows // cap))
        if -(-n_rows // rows) < 2 * threads:
            rows = min(rows, max(MIN_TASK_ROWS, -(-n_rows // (2 * threads))))
            if rows >= storage_rows:  # still whole storage chunks
                rows = storage_rows * (rows // storage_rows)
        rows = min(rows, n_rows)
    # interior task boundaries must fall on output chunk boundaries
    out_rows = storage_rows if (rows % storage_rows == 0 or rows >= n_rows) else rows
    tail = () if requested is not None else balanced_tail(n_rows, rows, threads)
    return TaskPlan(rows=int(rows), n_tasks=int(-(-n_rows // rows)),
                    output_chunk_rows=int(min(out_rows, n_rows)), note=note, tail=tail)


def plan_block_rows(task_rows: int, n_features: int, dictionary_size: int, *,
                    memory: int = DEFAULT_TASK_MEMORY, itemsize: int = 8,
                    cache: int | None = None) -> int:
    """Rows per sub-block of a task, so that the task stays within ``memory``.

    A task holds its input block (stored values and a float64 copy of one
    sub-block), the ``m x m`` factor, partial and folded map (three of them),
    and per sub-block row a kernel row, its projection and one temporary
    (``3 x 8 x m`` bytes). The sub-blocks of a task are processed one after the
    other and their partials combined in row order (pass 2) or written into the
    task's output (pass 3): the result does not depend on the sub-block size
    beyond rounding. When the ``m x m`` matrices and the input alone exceed
    ``memory`` (m above about 3000 at 256 MiB), a task needs them plus one
    sub-block of :data:`MIN_BLOCK_ROWS` rows. Within the budget, a sub-block's
    kernel block is also at most ``cache`` bytes (``c x m`` float64; default
    :data:`CACHE_BLOCK_BYTES`).
    """
    m = max(int(dictionary_size), 1)
    task_rows = max(int(task_rows), 1)
    fixed = 3 * 8 * m * m + int(itemsize) * int(n_features) * task_rows
    per_row = 3 * 8 * m + 8 * int(n_features) + 64
    # (when the m x m matrices alone fill the budget, a task needs them plus one
    # sub-block of MIN_BLOCK_ROWS rows: the budget cannot go below that)
    budget = max(MIN_BLOCK_ROWS, (int(memory) - fixed) // per_row)
    # and a kernel block of at most CACHE_BLOCK_BYTES, so that the passes over it
    # after the triangular solve (residuals, mean, centring) run from the cache
    cache = CACHE_BLOCK_BYTES if cache is None else int(cache)
    return int(min(task_rows, budget, max(MIN_BLOCK_ROWS, cache // (8 * m))))


def solve_block_rows(block_rows: int, dictionary_size: int, order: str) -> int:
    """Rows per sub-block of pass 2 for a kernel block in ``order`` (``"C"`` or ``"F"``).

    ``block_rows`` (:func:`plan_block_rows`) in the F order; in the C order at most
    :data:`ROW_BLOCK_BYTES` of kernel block (and at least :data:`MIN_BLOCK_ROWS`
    rows), whose rows MKL solves in one ``dtrsm``. Each sub-block has a fixed cost
    whatever its size (the factor and the m x m accumulator are read and written once
    per call), and blocks of a few MiB pay it rarely while staying in the cache
    (docs/measurements.md, "Sub-blocks in the C order").
    """
    rows = max(1, int(block_rows))
    if order != "C":
        return rows
    return min(rows, max(MIN_BLOCK_ROWS, ROW_BLOCK_BYTES // (8 * max(int(dictionary_size), 1))))


def segments(n_tasks: int, max_segments: int = MAX_SEGMENTS) -> list[range]:
    """Consecutive groups of task indices, each reduced into one partial.

    At most ``max_segments`` groups of equal size (the last may be shorter): the
    unit of progress and of checkpointing of a pass, whose stored partials
    (``m x m`` each) then stay bounded whatever n.
    """
    per = max(1, -(-n_tasks // max_segments))
    return [range(a, min(a + per, n_tasks)) for a in range(0, n_tasks, per)]


#: ``purpose`` tags of the seeded samples of the fit, so that each use draws its own rows.
SAMPLE_PURPOSE = {"gamma": 1, "degree_subset": 2, "dictionary_size": 3, "advice": 4}


def plan_sample(n_rows: int, size: int, seed: int, purpose: int = 0) -> np.ndarray:
    """Sorted row numbers of a seeded sample of ``min(size, n_rows)`` rows.

    The sample is :data:`SAMPLE_RUNS` runs of contiguous rows at seeded random
    places, so reading it costs at most that many storage-chunk reads however
    large the data. ``purpose`` separates the samples drawn for different
    uses (gamma heuristic, subset degrees, Algorithm 2) from one seed.
    """
    n_rows, size = int(n_rows), int(size)
    if size >= n_rows:
        return np.arange(n_rows, dtype=np.int64)
    run = -(-size // SAMPLE_RUNS)
    n_runs = n_rows // run
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5A3F, purpose, n_rows]))
    picked = np.sort(rng.choice(n_runs, size=-(-size // run), replace=False))
    rows = (picked[:, None] * run + np.arange(run)[None, :]).ravel()[:size]
    return rows.astype(np.int64)


def small_blas(size: int, below: int = CLIENT_ONE_BLAS_THREAD_BELOW):
    """Context manager: BLAS on one thread in this process while ``size`` (a dictionary's
    points) is below ``below``, unchanged from there on."""
    if size < below:
        from .._accel.threads import one_blas_thread

        return one_blas_thread()
    from contextlib import nullcontext

    return nullcontext()
