"""Pass 1 as an object: the greedy scan over a source, and the prefix scan's completion.

Algorithm 1 visits the rows in a seeded order, window by window
(:func:`~ooc_spectral.scan.scan_source`). With ``scan="prefix"`` it stops once
the dictionary stopped growing for ``prefix_patience`` windows; pass 2 then
checks every row anyway (it computes the residuals for the certificate) and
returns the rows beyond ``tol`` (:class:`~ooc_spectral.statistics.BeyondTol`).
Scanning those rows, in visiting order, against the growing dictionary selects
exactly the points the full scan would have: a row within ``tol`` stays within
it as the span grows.

:class:`GreedyScan` owns what that needs between pass 1 and the completion: the
growing dictionary (``state``), the visiting order and how many windows were
scanned, the tol, the checkpoint it saves to. The pipeline keeps one object
instead of loose attributes; RP-Cholesky's completion
(:class:`~ooc_spectral.rpcholesky.RPCholeskySelection`) has the same interface
(:class:`Selection`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from .scan import DictionaryState, ScanProgress, _size_error, scan_rows, scan_source
from .source import DataSource
from .statistics import VIOLATOR_CAP, BeyondTol, Certificate

__all__ = ["Rescan", "Selection", "GreedyScan"]

log = logging.getLogger("ooc_spectral")


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
        Called with a :class:`~ooc_spectral.scan.ScanProgress` after each window.
    """

    def __init__(self, source: DataSource, order, state: DictionaryState, tol: float, *,
                 windows_done: int = 0, limit: int, max_dictionary_size: int,
                 checkpoint=None, on_scan: Callable[[ScanProgress], None] | None = None):
        self.source, self.order, self.state, self.tol = source, order, state, float(tol)
        self.windows_done = int(windows_done)
        self.limit, self.max_dictionary_size = limit, max_dictionary_size
        self.checkpoint, self.on_scan = checkpoint, on_scan

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
                           start_window=start, on_window=on_window, patience=patience)

    def complete_from(self, beyond: BeyondTol, tol: float) -> Rescan:
        """Scan the rows pass 2 found beyond ``tol``, in visiting order.

        Afterwards every row is within ``tol``. If pass 2 found more than
        ``VIOLATOR_CAP`` such rows, the sequential scan goes on over the rest of
        the data instead. The certificate of the result bounds every row's residual
        with the final dictionary: the largest of the pass-2 residuals within
        ``tol`` (they can only have shrunk) and of the scanned rows' final residuals.
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
        if len(rows) and not rescanned_all:
            _, delta = state.freeze().project(Xv)
            i = int(np.argmax(delta))
            if delta[i] > cert.max_delta:
                cert = Certificate(float(delta[i]), int(rows[i]))
        return Rescan(state.size > before, rescanned_all, cert)
