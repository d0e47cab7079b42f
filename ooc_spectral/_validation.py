"""Parameter checks shared by the estimators of :mod:`ooc_spectral.manifold` and
:mod:`ooc_spectral.clustering`.

scikit-learn convention: ``__init__`` only stores parameters, ``fit`` checks
them with these helpers, which raise
:class:`~ooc_spectral.exceptions.InvalidParameterError` with a message naming
the estimator, the parameter, the value found and what is expected.
"""

from __future__ import annotations

import numbers

import numpy as np

from .exceptions import InvalidParameterError

__all__ = ["check_int", "check_float", "check_choice", "check_bool"]


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_int(owner: str, name: str, value, *, low: int | None = None,
              high: int | None = None, none: bool = False) -> int | None:
    """``value`` as an int within ``[low, high]`` (None allowed when ``none``)."""
    if value is None and none:
        return None
    expected = "an integer"
    if low is not None:
        expected += f" >= {low}"
    if high is not None:
        expected += f" <= {high}"
    if none:
        expected += " or None"
    if not _is_int(value):
        raise InvalidParameterError(
            f"{owner}: {name}={value!r} has type {type(value).__name__}: expected {expected}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise InvalidParameterError(f"{owner}: {name}={value!r} is out of range: expected {expected}")
    return value


def check_float(owner: str, name: str, value, *, low: float | None = None,
                low_open: bool = False, none: bool = False) -> float | None:
    """``value`` as a finite float ``>= low`` (``> low`` when ``low_open``)."""
    if value is None and none:
        return None
    expected = "a finite number"
    if low is not None:
        expected += f" {'>' if low_open else '>='} {low}"
    if none:
        expected += " or None"
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise InvalidParameterError(
            f"{owner}: {name}={value!r} has type {type(value).__name__}: expected {expected}")
    value = float(value)
    if not np.isfinite(value) or (low is not None and (value < low or (low_open and value == low))):
        raise InvalidParameterError(f"{owner}: {name}={value!r} is out of range: expected {expected}")
    return value


def check_choice(owner: str, name: str, value, choices) -> str:
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise InvalidParameterError(
            f"{owner}: {name}={value!r} is not valid: expected one of "
            f"{', '.join(repr(c) for c in choices)}")
    return value


def check_bool(owner: str, name: str, value) -> bool:
    """``value`` if it is a bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidParameterError(
            f"{owner}: {name}={value!r} has type {type(value).__name__}: expected True or False")
    return bool(value)
