"""What the compiled and BLAS helpers share: loading an optional library once, reading a
dask config flag, and the array layouts compiled code takes as they are.

Imports nothing of the package.
"""

from __future__ import annotations

import contextvars
import threading
from contextlib import contextmanager

import numpy as np

__all__ = ["once", "config_flag", "contiguous_float64", "accel_for", "accel_allowed",
           "cpu_vendor", "intel_cpu", "ACCEL_MIN_ENTRIES", "ACCEL_MIN_ROWS"]

#: Fewest entries of a task's block (its rows x the dictionary's points) for which the
#: optional accelerators are used: numba's compiled loops and Intel MKL. Loading them
#: costs a process a fixed fraction of a second each (numba and LLVM from the disk cache;
#: libmkl_rt and its kernels) and they save well under 1 ns an entry, so they pay on
#: blocks of millions of entries, as a large fit's tasks are (262,144 rows x m), never on
#: a small fit's (2,000-4,096 rows x tens of points) (docs/measurements.md, "Start-up and
#: resident costs"). Below it, NumPy and its BLAS: the same values to rounding (issue 38).
ACCEL_MIN_ENTRIES = 2**23
#: Fewest rows of a fit for which the client's own work (the scan, the solve) may load
#: the accelerators (the estimator and the command line's fit set :func:`accel_for`).
ACCEL_MIN_ROWS = 2**17

#: The entries of the block the current task works on (:func:`accel_for`); None: not
#: said, the accelerators are used wherever available (functions called directly).
_block_entries: contextvars.ContextVar = contextvars.ContextVar("ooc_spectral_block_entries",
                                                                default=None)


#: The dask config flags :func:`config_flag` read within the current block
#: (:func:`accel_for`), by key: read once per block, not at each of its thousands of
#: BLAS and loop calls (``dask.config.get`` cost pass 3 about 5% of its CPU time at
#: m = 800; issue 54). None outside a block: read at every call.
_block_flags: contextvars.ContextVar = contextvars.ContextVar("ooc_spectral_block_flags",
                                                              default=None)


@contextmanager
def accel_for(entries: int | None):
    """Within this block, numba's loops and MKL are used only where the work's block has
    at least :data:`ACCEL_MIN_ENTRIES` entries (``entries``: rows x dictionary points;
    None: not said). Per thread (a context variable): tasks side by side decide each for
    itself, and a task does not inherit its client's setting. The dask config flags
    (:func:`config_flag`) are read once within the block: a change made inside it takes
    effect at the next block (the next task or pass)."""
    token = _block_entries.set(None if entries is None else int(entries))
    flags = _block_flags.set({})
    try:
        yield
    finally:
        _block_flags.reset(flags)
        _block_entries.reset(token)


def accel_allowed() -> bool:
    """Whether the current block is large enough for the accelerators (:func:`accel_for`)."""
    entries = _block_entries.get()
    return entries is None or entries >= ACCEL_MIN_ENTRIES


class once:
    """A zero-argument ``loader`` run at most once per process, under a lock, its result
    (None included) kept: the optional libraries the passes load (MKL, numba's loops).

    Call it for the value; :meth:`peek` says whether it has run, without running it.
    """

    def __init__(self, loader):
        self.loader = loader
        self._lock = threading.Lock()
        self._value: list = []  # [the result] once run

    def __call__(self):
        if not self._value:
            with self._lock:
                if not self._value:
                    self._value.append(self.loader())
        return self._value[0]

    def peek(self) -> tuple[bool, object]:
        """``(True, result)`` once the loader has run, else ``(False, None)``."""
        return (True, self._value[0]) if self._value else (False, None)


def _read_cpu_vendor() -> str:
    """The processor's vendor as the system names it: ``vendor_id`` of ``/proc/cpuinfo``
    (Linux: ``GenuineIntel``, ``AuthenticAMD``, ...), else ``platform.processor()``
    (Windows names the vendor there too); "" where neither says."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


#: :func:`_read_cpu_vendor` once per process
cpu_vendor = once(_read_cpu_vendor)


def intel_cpu() -> bool:
    """Whether this machine's processor is Intel's (:func:`cpu_vendor` names
    ``GenuineIntel``)."""
    return "GenuineIntel" in cpu_vendor()


def contiguous_float64(*arrays, orders: str = "C", writeable: bool = False) -> bool:
    """True if every array is float64 and contiguous in its order of ``orders`` (``"C"``
    or ``"F"`` per array, the last one repeated), and writeable if asked: what compiled
    code and the BLAS calls through ``ctypes`` take as they are."""
    for i, a in enumerate(arrays):
        order = orders[min(i, len(orders) - 1)]
        contiguous = a.flags.c_contiguous if order == "C" else a.flags.f_contiguous
        if a.dtype != np.float64 or not contiguous or (writeable and not a.flags.writeable):
            return False
    return True


def config_flag(key: str, default, auto=None) -> bool:
    """The dask config ``key`` as a bool: the strings ``""``, ``0``, ``false``, ``no`` and
    ``off`` (any case, as an environment variable gives them) are False, ``auto`` is
    ``auto()`` where that is given (the machine decides), other strings True, anything
    else by its truth value. Inside :func:`accel_for` read once per block."""
    cache = _block_flags.get()
    if cache is not None and (key, default) in cache:
        return cache[key, default]
    import dask

    value = dask.config.get(key, default)
    if isinstance(value, str):
        word = value.strip().lower()
        value = auto() if word == "auto" and auto is not None else word not in (
            "", "0", "false", "no", "off")
    value = bool(value)
    if cache is not None:
        cache[key, default] = value
    return value
