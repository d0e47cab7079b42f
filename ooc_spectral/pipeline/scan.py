"""Pass 1 over a data source: the windows read, the greedy scan driven, the prefix scan completed.

Algorithm 1 visits the rows in a seeded order (:class:`~ooc_spectral.core.planning.VisitOrder`),
window by window (:func:`scan_source`): :class:`WindowReader` reads each window (the
next one in a background thread while the current one is scanned) and the blocked scan
of :mod:`ooc_spectral.core.scan.blocked` takes its rows. With ``scan="prefix"`` it
stops once the dictionary stopped growing for ``prefix_patience`` windows; pass 2 then
checks every row anyway (it computes the residuals for the certificate) and
returns the rows beyond ``tol`` (:class:`~ooc_spectral.core.statistics.BeyondTol`).
Scanning those rows, in visiting order, against the growing dictionary selects
exactly the points the full scan would have: a row within ``tol`` stays within
it as the span grows.

:class:`GreedyScan` owns what that needs between pass 1 and the completion: the
growing dictionary (``state``), the visiting order and how many windows were
scanned, the tol, the checkpoint it saves to. The pipeline keeps one object
instead of loose attributes; RP-Cholesky's completion
(:class:`~ooc_spectral.pipeline.rpcholesky.RPCholeskySelection`) has the same interface
(:class:`Selection`).
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from .._validation import check_finite
from ..core.planning import SCAN_READ_CACHE_BYTES, VISIT_WINDOW_ROWS, VisitOrder, chunks_of_rows
from ..core.scan.blocked import scan_rows
from ..core.scan.state import DictionaryState, ScanProgress, _size_error
from ..core.statistics import VIOLATOR_CAP, BeyondTol, Certificate
from ..exceptions import (DictionarySizeError, InvalidInputError, NumericalBreakdownError,
                          raise_if_interrupted)
from ..io.source import DataSource
from .exact import EARLY_EXACT, EARLY_ROWS, EARLY_STOP, capped_exact

__all__ = ["WindowReader", "scan_source", "heads_for_every_row", "capped_early_stop", "Rescan",
           "Selection", "GreedyScan", "EARLY_SPLITS", "probe_exact", "PROBE_PART_ROWS",
           "PROBE_RATE_MARGIN", "PROBE_MIN_TOL"]

log = logging.getLogger("ooc_spectral")

#: The first rows of the visiting order are scanned in these parts (:func:`scan_source`),
#: at whose ends a dictionary heading for every row is recognised.
EARLY_SPLITS = EARLY_ROWS
#: :func:`probe_exact` goes on past the early parts in parts of this many rows ...
PROBE_PART_ROWS = 320
#: ... until its dictionary, growing at this many times the rate of its last part, would
#: stay below the exact path's size.
PROBE_RATE_MARGIN = 2.0
#: The probe runs only for a tol above this share of the largest ``k(x, x)``: below it
#: the reason a fit goes exact may be the tol itself (float64 certifies the Gaussian
#: kernel's residuals down to about 5e-8 at the median heuristic's gamma on some data,
#: docs/user_guide/parameters.md), which the certified scan's breakdown names.
PROBE_MIN_TOL = 1e-6


def _early_error(state: DictionaryState, early: tuple[int, int, int], n_rows: int, tol: float,
                 max_size: int) -> DictionarySizeError:
    """The scan stopped at ``early = (points, start, stop)``: the dictionary heads for every
    row."""
    from ..core.scan.state import size_hint

    err = DictionarySizeError(
        f"the dictionary took {early[0]} of the {early[2] - early[1]} rows {early[1]} to "
        f"{early[2]} of the visiting order with tol={tol:.3g}: no row is near the span of "
        f"the others, so it heads for every one of the {n_rows} rows (past "
        f"max_dictionary_size={max_size}, one point at a time), and the scan stopped early; "
        f"{size_hint(state.kernel, tol)}, or raise max_dictionary_size")
    err.early = tuple(early)
    return err


def _scan_part(state: DictionaryState, Xw, rw, a: int, b: int, tol: float, *, max_size: int,
               early: tuple[int, int, int] | None, n_rows: int, block_rows=None,
               certify: bool = True) -> None:
    """Rows ``a:b`` of the first window, stopping with the early
    :class:`DictionarySizeError` once ``early[0]`` of them entered where ``early[1:]`` is
    ``(a, b)``, or the size error past ``max_size``."""
    head = (state.size + early[0] - 1 if early is not None and early[1:] == (a, b)
            else max_size)
    if scan_rows(state, Xw[a:b], rw[a:b], tol, limit=min(head, max_size),
                 block_rows=block_rows, certify=certify):
        if head < max_size:
            raise _early_error(state, early, n_rows, tol, max_size)
        raise _size_error(state, max_size, 0, n_rows, tol)


def _scan_first_rows(state: DictionaryState, Xw, rw, tol: float, *, max_size: int,
                     early: tuple[int, int, int] | None, n_rows: int, block_rows=None,
                     stop: int | None = None) -> int:
    """The first window's first rows in the parts :data:`EARLY_SPLITS` (up to row ``stop``),
    stopping with the early :class:`DictionarySizeError` once ``early[0]`` of the rows
    ``early[1]:early[2]`` entered, or the size error past ``max_size``. Returns the row
    where the parts end."""
    a = 0
    for b in (r for r in EARLY_SPLITS if r < Xw.shape[0] and (stop is None or r <= stop)):
        _scan_part(state, Xw, rw, a, b, tol, max_size=max_size, early=early, n_rows=n_rows,
                   block_rows=block_rows)
        a = b
    return a


def probe_exact(source: DataSource, order: VisitOrder, kernel, affine: bool, tol: float,
                limit: int, early: tuple[int, int, int] = EARLY_EXACT) -> None:
    """Whether a fit whose exact problem is at hand goes to it, told before the certified
    scan by a float64 scan of the first window that certifies nothing.

    The scan of such a fit stops for the exact problem once its dictionary reaches
    ``limit`` points (:func:`~ooc_spectral.pipeline.exact.exact_limit`) or takes
    ``early[0]`` of the rows ``early[1]:early[2]``
    (:data:`~ooc_spectral.pipeline.exact.EARLY_EXACT`); everything it certified on the
    way is then thrown away, and on small data that was most of the fit (digits at the
    default gamma: 315 points certified one by one, then the exact solve). The probe
    runs the same selection on computed residuals alone, without the rounding bounds,
    the factor's measurement or double-double, and raises the
    :class:`DictionarySizeError` the scan would stop with. It gives up (returns, and the
    certified scan follows) once its dictionary, growing at :data:`PROBE_RATE_MARGIN`
    times the rate of its last part (the rows come in a random order, so the rate only
    falls in expectation), would end below ``limit``, or at the end of the first window. Either way only how fast the fit
    runs depends on the probe: the exact problem is the answer the scan reaching
    ``limit`` gives, and a fit the probe lets through runs as before. It does not run
    where tol is at most :data:`PROBE_MIN_TOL` of the largest ``k(x, x)`` of the window:
    there the certified scan may find tol below what float64 certifies, and its
    :class:`~ooc_spectral.exceptions.NumericalBreakdownError` (not the dictionary's
    size) is what the exact path's warning must name, with its advice (a larger tol).
    """
    Xw, rw = WindowReader(source, order).read(0)
    try:
        kmax = float(np.max(np.abs(kernel.diag(Xw, kernel.aux(Xw)))))
    except InvalidInputError:  # a row past float64: the scan names it
        return
    if not tol > PROBE_MIN_TOL * kmax:
        return  # where float64 may not certify tol, the scan's own stop says why
    n = source.n_rows
    state = DictionaryState(kernel, source.n_features, affine, rounding=False)
    ends = [r for r in EARLY_SPLITS if r < Xw.shape[0]]
    a = ends[-1] if ends else 0
    ends += list(range(a + PROBE_PART_ROWS, Xw.shape[0], PROBE_PART_ROWS)) + [Xw.shape[0]]
    a = 0
    try:
        for b in ends:
            before = state.size
            _scan_part(state, Xw, rw, a, b, tol, max_size=limit, early=early, n_rows=n,
                       certify=False)
            rate = (state.size - before) / max(b - a, 1)
            if state.size + PROBE_RATE_MARGIN * rate * (n - b) < limit:
                return
            a = b
    except NumericalBreakdownError:  # float64 cannot decide: the certified scan will
        return


def heads_for_every_row(source: DataSource, order: VisitOrder, kernel, affine: bool, tol: float,
                        early: tuple[int, int, int], max_size: int,
                        confirm: tuple[int, int, int] | None = None) -> DictionarySizeError | None:
    """Whether the dictionary heads for every row, told from the first ``early[2]`` rows of
    the visiting order in float64 (no double-double: the scan the exact path runs,
    :data:`~ooc_spectral.pipeline.exact.EARLY_EXACT`), before any costlier work: the
    :class:`DictionarySizeError` that scan stops with (``early[0]`` of the rows
    ``early[1]:early[2]`` entered, or ``max_size`` points), or None where it does not stop,
    or float64 cannot decide a row (then only the fit itself can tell).

    With ``confirm``, a later part of the same kind, a stop at ``early`` stands only where
    the scan, carried on, stops at ``confirm`` too, or cannot get there (float64 cannot
    decide a row, or the window ends first): a dictionary that will settle has slowed down
    by then."""
    Xw, rw = WindowReader(source, order).read(0)
    if early[2] >= Xw.shape[0]:  # the scan's parts end before the window does
        return None

    def stop_at(part):
        state = DictionaryState(kernel, source.n_features, affine)
        try:
            _scan_first_rows(state, Xw, rw, tol, max_size=max_size, early=part,
                             n_rows=source.n_rows, stop=part[2])
        except DictionarySizeError as err:
            return err
        except NumericalBreakdownError:
            return "undecided"
        return None

    first = stop_at(early)
    if not isinstance(first, DictionarySizeError):
        return None
    if confirm is None or confirm[2] >= Xw.shape[0]:
        return first
    later = stop_at(confirm)
    return first if later == "undecided" else later


def capped_early_stop(config, source: DataSource, kernel) -> DictionarySizeError | None:
    """Where only ``max_dictionary_size`` keeps the exact problem from a fit
    (:func:`~ooc_spectral.pipeline.exact.capped_exact`), whether its dictionary heads for
    every row, told before any costlier work by a float64 scan of the first 640 rows
    (:func:`heads_for_every_row`): the scan with double-double took 41-82 s to stop at tol 0
    on 1,500 rows, whose exact problem takes seconds. The stop is a refusal, so a stop at
    the exact path's rows 240 to 320 is confirmed at the rows 560 to 640
    (:data:`~ooc_spectral.pipeline.exact.EARLY_STOP`), where a dictionary that will settle
    has slowed down (a swiss roll settling at 866 of 2,000 rows still took 76 of the rows
    240 to 320, and was refused as heading for every row: an audit), unless float64 cannot
    get there (tol 0: the factor gives way first, and the later rows cannot say
    otherwise). The error to raise (its advice,
    :func:`~ooc_spectral.pipeline.advice.with_advice`: the exact path's cap), or None."""
    if not capped_exact(config, source.n_rows):
        return None
    order = VisitOrder(source.n_rows, config.random_state, window=VISIT_WINDOW_ROWS)
    return heads_for_every_row(source, order, kernel, config.affine, config.tol, EARLY_EXACT,
                               config.max_dictionary_size, confirm=EARLY_STOP)


class WindowReader:
    """The scan's windows, read so that storage chunks shared by windows are decoded once.

    A window of the visiting order (:data:`~ooc_spectral.core.planning.VISIT_WINDOW_ROWS`
    rows) is often part of a larger storage chunk (zarr chunks of 131,072 or
    262,144 rows), and the windows are visited in a seeded random order: reading
    each window from the store decoded its whole chunk once per window, most of a
    fast scan's time (docs/measurements.md, "The scan's read cache").
    The visiting order is known in advance
    (:meth:`~ooc_spectral.core.planning.VisitOrder.chunk_visits`), so a decoded chunk
    is kept while a later window needs it, within
    :data:`~ooc_spectral.core.planning.SCAN_READ_CACHE_BYTES`; when the budget is
    full, the chunk needed farthest ahead is the one not kept (Belady's rule).
    The rows and their order are those of ``source.read_rows``: only how often a
    chunk is decoded changes. Used by one thread at a time.
    """

    def __init__(self, source, order: VisitOrder, start_window: int = 0,
                 budget: int = SCAN_READ_CACHE_BYTES):
        self.source, self.order, self.budget = source, order, int(budget)
        self.windows = order.windows
        self.starts = np.asarray(source.chunk_starts, dtype=np.int64)
        self.keeps = source.kind != "numpy"  # reading numpy rows decodes nothing
        self.visits = order.chunk_visits(self.starts, start_window) if self.keeps else {}
        self.chunks: dict[int, np.ndarray] = {}
        self.decoded = 0  # chunks read from the source (for tests and benchmarks)

    def _next_visit(self, j: int, k: int) -> float:
        """The first position from ``k`` on whose window needs chunk ``j`` (inf: none)."""
        v = self.visits.get(j, [])
        i = bisect.bisect_left(v, k)
        return v[i] if i < len(v) else math.inf

    def _chunk(self, j: int, k: int) -> np.ndarray:
        """Storage chunk ``j`` for the window at position ``k``, kept if a later one needs it."""
        chunk = self.chunks.pop(j, None)
        if chunk is None:
            chunk = self.source.read_raw(int(self.starts[j]), int(self.starts[j + 1]))
            self.decoded += 1
        kept = {i: self._next_visit(i, k) for i in self.chunks}  # maybe this window's next
        kept[j] = self._next_visit(j, k + 1)
        while kept and (sum(self.chunks[i].nbytes for i in kept if i != j)
                        + (chunk.nbytes if j in kept else 0)) > self.budget:
            del kept[max(kept, key=kept.get)]  # needed farthest ahead (or never)
        self.chunks = {i: self.chunks[i] for i in kept if i != j and kept[i] < math.inf}
        if j in kept and kept[j] < math.inf:
            self.chunks[j] = chunk
        return chunk

    def read(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The window at position ``k`` of the visiting order: its rows in visiting
        order as float64 (checked finite) and their row numbers."""
        w = self.windows[k]
        a, b = self.order.window_bounds(w)
        if not self.keeps:
            raw = self.source.read_raw(a, b)
        else:
            parts = []
            for j in chunks_of_rows(self.starts, a, b):
                c0 = int(self.starts[j])
                parts.append(self._chunk(j, k)[max(a, c0) - c0: min(b, int(self.starts[j + 1])) - c0])
            raw = parts[0] if len(parts) == 1 else np.concatenate(parts)
        check_finite(raw, a, self.source)
        perm = self.order.rows_in_window(w)
        return np.ascontiguousarray(raw[perm], dtype=np.float64), a + perm


def scan_source(
    source,
    order: VisitOrder,
    state: DictionaryState,
    *,
    tol: float,
    max_size: int,
    start_window: int = 0,
    block_rows: int | None = None,
    on_window: Callable[[DictionaryState, ScanProgress], None] | None = None,
    patience: int | None = None,
    early: tuple[int, int, int] | None = None,
) -> int:
    """Algorithm 1, steps 1-16, over a :class:`~ooc_spectral.io.source.DataSource`.

    Reads the windows of ``order`` from ``start_window`` on (the next window is
    read in a background thread while the current one is scanned), permutes each
    window's rows, and scans them in blocks. ``on_window`` is called after each
    window with the state and a :class:`ScanProgress` (checkpoints hook in there).

    With ``patience=k`` the scan stops early, after ``k`` consecutive windows
    that each added at most ``size // 1000`` points (the *prefix scan*; the rows
    left must then be checked by a parallel pass, see
    :func:`~ooc_spectral.pipeline.fit.FitRun.build_dictionary`).

    The first rows of the first window are scanned in the parts :data:`EARLY_SPLITS`
    (whether or not ``early`` is given, so that the dictionary does not depend on it);
    with ``early=(points, start, stop)``, ``start:stop`` one of those parts, the scan stops
    there with a :class:`DictionarySizeError` (its ``early`` attribute that triple) once
    ``points`` of those rows qualify: a dictionary heading for every row
    (:mod:`ooc_spectral.pipeline.exact`).

    Returns
    -------
    int
        The number of windows of ``order`` scanned so far (``order.n_windows``
        unless the prefix scan stopped early).

    Raises
    ------
    DictionarySizeError
        The dictionary would grow past ``max_size``.
    NonFiniteInputError
        A row holds NaN or infinity.
    """
    windows = order.windows
    n_windows = len(windows)
    t0 = time.perf_counter()
    rows_done = int(sum(order.window_bounds(w)[1] - order.window_bounds(w)[0]
                        for w in windows[:start_window]))
    read = WindowReader(source, order, start_window).read

    stable = 0
    done = start_window
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ooc-scan-read") as pool:
        nxt = pool.submit(read, start_window) if start_window < n_windows else None
        for k in range(start_window, n_windows):
            raise_if_interrupted()
            Xw, rw = nxt.result()
            nxt = pool.submit(read, k + 1) if k + 1 < n_windows else None
            before = state.size
            a = 0
            if k == 0 and state.size == 0:  # the first rows in parts, at EARLY_SPLITS
                a = _scan_first_rows(state, Xw, rw, tol, max_size=max_size, early=early,
                                     n_rows=order.n_rows, block_rows=block_rows)
            if scan_rows(state, Xw[a:], rw[a:], tol, limit=max_size, block_rows=block_rows):
                raise _size_error(state, max_size, rows_done, order.n_rows, tol)
            rows_done += Xw.shape[0]
            done = k + 1
            if on_window is not None:
                on_window(state, ScanProgress(k + 1, n_windows, rows_done, order.n_rows,
                                              state.size, time.perf_counter() - t0))
            stable = stable + 1 if state.size - before <= state.size // 1000 else 0
            if patience is not None and stable >= patience and done < n_windows:
                if nxt is not None:
                    nxt.cancel()
                break
    return done


@dataclass(frozen=True)
class Rescan:
    """What scanning the rows pass 2 found beyond tol did (the prefix scan's end)."""

    grew: bool  #: points entered the dictionary
    rescanned_all: bool  #: too many rows beyond tol: the rest of the data was scanned instead
    certificate: Certificate  #: bounds every row's residual with the final dictionary


class Selection(Protocol):
    """A dictionary selection the pipeline holds between pass 1 and pass 2."""

    state: DictionaryState

    def complete_from(self, beyond: BeyondTol, tol: float) -> Rescan:
        """Bring the rows pass 2 found beyond ``tol`` within it."""


class GreedyScan:
    """Algorithm 1 over ``source`` in ``order``, resumable, and its prefix completion.

    Parameters
    ----------
    source : DataSource
    order : VisitOrder
        The seeded visiting order, in windows.
    state : DictionaryState
        The dictionary grown so far (empty, or restored from a checkpoint).
    tol : float
    windows_done : int
        Windows of ``order`` already scanned into ``state``.
    limit : int
        The scan's size limit (a :class:`~ooc_spectral.exceptions.DictionarySizeError`
        past it).
    max_dictionary_size : int
        The limit the completion enforces.
    checkpoint : optional
        ``save_scan(state, windows_done, tol, prefix_done=...)`` and ``every``.
    on_scan : callable, optional
        Called with a :class:`~ooc_spectral.core.scan.state.ScanProgress` after each window.
    early : (int, int, int), optional
        ``(points, start, stop)``: stop once the dictionary took that many of those rows
        (:func:`scan_source`).
    """

    def __init__(self, source: DataSource, order, state: DictionaryState, tol: float, *,
                 windows_done: int = 0, limit: int, max_dictionary_size: int,
                 checkpoint=None, on_scan: Callable[[ScanProgress], None] | None = None,
                 early: tuple[int, int, int] | None = None):
        self.source, self.order, self.state, self.tol = source, order, state, float(tol)
        self.windows_done = int(windows_done)
        self.limit, self.max_dictionary_size = limit, max_dictionary_size
        self.checkpoint, self.on_scan = checkpoint, on_scan
        self.early = early

    @property
    def complete(self) -> bool:
        """Whether every window was scanned."""
        return self.windows_done >= self.order.n_windows

    def run(self, patience: int | None = None) -> bool:
        """Scan the windows left; with ``patience``, stop once the dictionary stopped
        growing for that many windows (the prefix scan). Returns :attr:`complete`."""
        self.windows_done = self._scan_windows(self.windows_done, patience)
        if not self.complete:
            log.info("prefix scan: the dictionary stopped growing after %d of %d windows (%d "
                     "points); pass 2 checks the other rows", self.windows_done,
                     self.order.n_windows, self.state.size)
            if self.checkpoint is not None:
                self.checkpoint.save_scan(self.state, self.windows_done, self.tol, prefix_done=True)
        return self.complete

    def _scan_windows(self, start: int, patience: int | None = None) -> int:
        every = self.checkpoint.every if self.checkpoint is not None else 0

        def on_window(st: DictionaryState, progress: ScanProgress) -> None:
            if self.on_scan is not None:
                self.on_scan(progress)
            done = progress.windows_done
            if self.checkpoint is not None and (done % every == 0 or done == progress.n_windows):
                self.checkpoint.save_scan(st, done, self.tol)

        return scan_source(self.source, self.order, self.state, tol=self.tol, max_size=self.limit,
                           start_window=start, on_window=on_window, patience=patience,
                           early=self.early)

    def complete_from(self, beyond: BeyondTol, tol: float) -> Rescan:
        """Scan the rows pass 2 found beyond ``tol``, in visiting order.

        Afterwards every row is within ``tol``. If pass 2 found more than
        ``VIOLATOR_CAP`` such rows, the sequential scan goes on over the rest of
        the data instead. The certificate of the result bounds every row's residual
        with the final dictionary: the largest of the pass-2 bounds within ``tol`` (they
        can only have shrunk) and, where rows were scanned again, ``tol``, within which
        the scan certified each row it skipped (``tol > 0``: a prefix scan at tol 0 is
        refused by the parameter check).
        """
        state, order = self.state, self.order
        rows, Xv = beyond.rows, beyond.X
        before = state.size
        rescanned_all = len(rows) > VIOLATOR_CAP
        if rescanned_all:
            log.info("prefix scan: more than %d rows beyond tol; scanning the rest of the data",
                     VIOLATOR_CAP)
            self.windows_done = self._scan_windows(self.windows_done)
        elif len(rows):
            sequence = np.argsort(order.sort_keys(rows), kind="stable")
            if scan_rows(state, Xv[sequence], rows[sequence], tol, limit=self.max_dictionary_size):
                raise _size_error(state, self.max_dictionary_size, self.source.n_rows,
                                  self.source.n_rows, tol)
            log.info("prefix scan: %d rows beyond tol, %d entered the dictionary", len(rows),
                     state.size - before)
        if self.checkpoint is not None:
            self.checkpoint.save_scan(state, order.n_windows, tol)
        cert = beyond.within
        if len(rows):
            # the scan skipped each of these rows only with its residual plus its rounding
            # bound within tol: tol bounds them (their computed residuals do not; an outside
            # audit); the row named is the rescanned one of largest computed residual
            i = 0 if rescanned_all else int(np.argmax(state.freeze().project(Xv)[1]))
            cert = Certificate(max(float(cert.max_delta), float(tol)), int(rows[i]))
        return Rescan(state.size > before, rescanned_all, cert)
