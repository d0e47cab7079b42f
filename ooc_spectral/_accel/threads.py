"""BLAS thread counts: one BLAS thread for a block of code, the counts in use, and the
test of whether a call releases the GIL.
"""

from __future__ import annotations

import functools
import threading
import time

from .blas import _OWN_MKL

__all__ = ["one_blas_thread", "one_thread", "blas_thread_counts", "longest_gil_stall"]


def longest_gil_stall(call) -> tuple[float, float]:
    """``(seconds of call(), longest gap between two steps of a Python thread spinning
    beside it)``: a call that releases the GIL stalls the spinner for about the
    interpreter's switch interval (5 ms), one that holds it for the whole call.
    Used by ``tests/test_blas.py`` and ``workflows/bench/gil_release.py``."""
    stop = threading.Event()
    gap = [0.0]

    def spin():
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            gap[0] = max(gap[0], now - last)
            last = now

    th = threading.Thread(target=spin)
    th.start()
    time.sleep(0.05)
    gap[0] = 0.0
    t = time.perf_counter()
    try:
        call()
    finally:
        dt = time.perf_counter() - t
        stop.set()
        th.join()
    return dt, gap[0]


@functools.lru_cache(maxsize=None)
def _controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()  # inspecting the loaded libraries: once, not per call


def one_blas_thread():
    """Context manager: BLAS on one thread in this process (a few microseconds to enter).

    For code whose BLAS calls are too small to share, or that runs beside other
    threads doing the same (the scan below a size, the certificate's threads).
    """
    return _controller().limit(limits=1, user_api="blas")


def one_thread():
    """Context manager: every thread pool threadpoolctl knows (BLAS and OpenMP) on one
    thread, as ``threadpool_limits(1)``, from the process's one inspection of its
    libraries (``threadpool_limits`` inspects them on every call: about 70 ms each time
    on a loaded machine, three times in a small fit; issue 38)."""
    return _controller().limit(limits=1)


def blas_thread_counts() -> set[int]:
    """The thread counts of the BLAS libraries loaded in this process (MKL loaded by
    :func:`mkl` excluded: sequential, each call on its own thread)."""
    import os

    from threadpoolctl import threadpool_info

    return {i["num_threads"] for i in threadpool_info()
            if i["user_api"] == "blas" and os.path.realpath(i["filepath"]) not in _OWN_MKL}
