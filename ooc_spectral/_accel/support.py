"""What the compiled and BLAS helpers share: loading an optional library once, reading a
dask config flag, and the array layouts compiled code takes as they are.

Imports nothing of the package.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["once", "config_flag", "contiguous_float64"]


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


def config_flag(key: str, default: bool) -> bool:
    """The dask config ``key`` as a bool: the strings ``""``, ``0``, ``false``, ``no`` and
    ``off`` (any case, as an environment variable gives them) are False, other strings
    True, anything else by its truth value."""
    import dask

    value = dask.config.get(key, default)
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off")
    return bool(value)
