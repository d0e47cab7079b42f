"""Parameter checks shared by every estimator of the package.

scikit-learn convention: ``__init__`` only stores parameters, ``fit`` checks
them with these helpers, which raise
:class:`~ooc_spectral.exceptions.InvalidParameterError` with a message naming
the estimator (``owner``, left out when None), the parameter, the value found
and what is expected. :class:`~ooc_spectral.config.FitConfig` applies them to
its declared fields.
"""

from __future__ import annotations

import numbers
import threading

import numpy as np

from . import exceptions
from .exceptions import InvalidInputError, InvalidParameterError

__all__ = ["check_int", "check_float", "check_choice", "check_bool", "check_str", "check_fitted",
           "check_n_features", "config_flag", "once", "contiguous_float64"]


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _fail(owner: str | None, message: str) -> InvalidParameterError:
    return InvalidParameterError(f"{owner}: {message}" if owner else message)


def _expected(base: str, low=None, high=None, low_open=False, none=False) -> str:
    if low is not None:
        base += f" {'>' if low_open else '>='} {low}"
    if high is not None:
        base += f" <= {high}"
    return base + (" or None" if none else "")


def check_int(owner: str | None, name: str, value, *, low: int | None = None,
              high: int | None = None, none: bool = False) -> int | None:
    """``value`` as an int within ``[low, high]`` (None allowed when ``none``)."""
    if value is None and none:
        return None
    expected = _expected("an integer", low, high, none=none)
    if not _is_int(value):
        raise _fail(owner, f"{name}={value!r} has type {type(value).__name__}: expected {expected}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise _fail(owner, f"{name}={value!r} is out of range: expected {expected}")
    return value


def check_float(owner: str | None, name: str, value, *, low: float | None = None,
                low_open: bool = False, none: bool = False) -> float | None:
    """``value`` as a finite float ``>= low`` (``> low`` when ``low_open``)."""
    if value is None and none:
        return None
    expected = _expected("a number", low, low_open=low_open, none=none)
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise _fail(owner, f"{name}={value!r} has type {type(value).__name__}: expected {expected}")
    value = float(value)
    if not np.isfinite(value):
        raise _fail(owner, f"{name}={value!r} is not finite: expected {expected}")
    if low is not None and (value < low or (low_open and value == low)):
        raise _fail(owner, f"{name}={value!r} is out of range: expected {expected}")
    return value


def check_choice(owner: str | None, name: str, value, choices) -> str:
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise _fail(owner, f"{name}={value!r} is not valid: expected one of "
                           f"{', '.join(repr(c) for c in choices)}")
    return value


def check_bool(owner: str | None, name: str, value) -> bool:
    """``value`` if it is a bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise _fail(owner, f"{name}={value!r} has type {type(value).__name__}: expected True or False")
    return bool(value)


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


def check_str(owner: str | None, name: str, value) -> str:
    """``value`` if it is a string."""
    if not isinstance(value, str):
        raise _fail(owner, f"{name}={value!r} has type {type(value).__name__}: expected a string")
    return value


def check_fitted(estimator, attribute: str, hint: str = ""):
    """``getattr(estimator, attribute)``, or :class:`NotFittedError` when it is unset.

    The message names the estimator and says to call ``fit`` (and ``hint``, if given).
    """
    value = getattr(estimator, attribute, None)
    if value is None:
        raise exceptions.NotFittedError(f"this {type(estimator).__name__} instance is not fitted yet; "
                             f"call fit(X) first{hint}")
    return value


def check_n_features(owner: str, found: int, fitted: int) -> None:
    """Raise :class:`~ooc_spectral.exceptions.InvalidInputError` unless new rows have the
    ``fitted`` number of columns (``transform`` and friends)."""
    if found != fitted:
        raise InvalidInputError(
            f"X has {found} features, but {owner} was fitted with {fitted} features; pass rows "
            "with the training columns")
