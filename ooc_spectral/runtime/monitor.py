"""Watching a run: peak memory of the process tree, and progress lines.

:class:`MemorySampler` samples, in a background thread, the resident set size
of this process and of all its descendants (the workers of an embedded
``LocalCluster`` are children of their nannies, which are children of this
process) and keeps the peak, overall and since the last :meth:`take_peak`.

:class:`ProgressLog` turns the pipeline's progress callbacks into log lines on
the ``ooc_spectral`` logger, at most one every ``interval`` seconds per pass.
"""

from __future__ import annotations

import logging
import threading
import time

import psutil

from .execution import PartProgress
from ..core.scan.state import ScanProgress

__all__ = ["MemorySampler", "ProgressLog", "tree_rss"]

log = logging.getLogger("ooc_spectral")


def tree_rss(pid: int | None = None) -> int:
    """Resident set size in bytes of a process and all its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class MemorySampler:
    """Peak RSS of a process tree, sampled every ``interval`` seconds.

    Use as a context manager; :attr:`peak` is the overall peak and
    :meth:`take_peak` the peak since its previous call.

    Each sample reads the RSS of the processes of the tree as last listed; the
    tree is listed again every ``list_every`` seconds (and at :meth:`take_peak`).
    Listing it reads ``/proc/*/stat`` of every process on the machine: done at
    every sample it took a noticeable share of a core from the passes' workers
    (docs/measurements.md, "The memory sampler's listing").
    """

    def __init__(self, pid: int | None = None, interval: float = 0.05, list_every: float = 1.0):
        self.pid = pid
        self.interval = interval
        self.list_every = list_every
        self.peak = 0
        self._window_peak = 0
        self._procs: list = []
        self._listed = -float("inf")
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="ooc-memory-sampler", daemon=True)

    def _tree_rss(self, relist: bool = False) -> int:
        now = time.monotonic()
        if relist or now - self._listed >= self.list_every:
            try:
                root = psutil.Process(self.pid)
                self._procs = [root] + root.children(recursive=True)
            except psutil.Error:
                self._procs = []
            self._listed = now
        total = 0
        for p in self._procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _sample(self, relist: bool = False) -> None:
        rss = self._tree_rss(relist)
        with self._lock:
            self.peak = max(self.peak, rss)
            self._window_peak = max(self._window_peak, rss)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def take_peak(self) -> int:
        self._sample(relist=True)
        with self._lock:
            peak, self._window_peak = self._window_peak, 0
        return peak

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


class ProgressLog:
    """Progress callbacks for :class:`~ooc_spectral.pipeline.fit.FitRun` and the executor."""

    def __init__(self, interval: float = 2.0):
        self.interval = interval
        self._last: dict[str, float] = {}

    def _due(self, key: str, final: bool) -> bool:
        now = time.monotonic()
        if final or now - self._last.get(key, 0.0) >= self.interval:
            self._last[key] = now
            return True
        return False

    def scan(self, p: ScanProgress) -> None:
        if self._due("scan", p.windows_done == p.n_windows):
            log.info("scan: window %d/%d (%.1f%%), %d rows, %.0f rows/s, dictionary %d",
                     p.windows_done, p.n_windows, 100.0 * p.rows_done / max(p.n_rows, 1),
                     p.rows_done, p.rows_per_second, p.dictionary_size)

    def parts(self, p: PartProgress) -> None:
        if self._due(p.label, p.done == p.total):
            log.info("%s: %d/%d parts (%.1f%%) in %.1f s", p.label, p.done, p.total,
                     100.0 * p.done / max(p.total, 1), p.elapsed)
