"""Checks shared by every layer: parameters, fitted state, and the rows read.

scikit-learn convention: ``__init__`` only stores parameters, ``fit`` checks
them with these helpers, which raise
:class:`~ooc_spectral.exceptions.InvalidParameterError` with a message naming
the estimator (``owner``, left out when None), the parameter, the value found
and what is expected. :class:`~ooc_spectral.core.config.FitConfig` applies them to
its declared fields. :func:`check_finite` is the one check on values: every pass
applies it to the rows it reads, and the error names the row and its storage chunk.

Base layer: imports only :mod:`ooc_spectral.exceptions`.
"""

from __future__ import annotations

import numbers

import numpy as np

from . import exceptions
from .exceptions import InvalidInputError, InvalidParameterError, NonFiniteInputError

__all__ = ["check_int", "check_float", "check_choice", "check_bool", "check_str", "check_fitted",
           "check_n_features", "check_finite"]


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
    """``value`` if it is one of ``choices``.

    A value that cannot be compared with them (an array: ``kernel=np.array([])``) is
    refused with the same message, naming its type, instead of NumPy's "truth value
    of an array is ambiguous"."""
    scalar = isinstance(value, (str, numbers.Number, type(None)))
    if not (scalar and value in choices):
        if not scalar:
            raise _fail(owner, f"{name}={value!r} has type {type(value).__name__}: expected "
                               f"one of {', '.join(repr(c) for c in choices)}")
        raise _fail(owner, f"{name}={value!r} is not valid: expected one of "
                           f"{', '.join(repr(c) for c in choices)}")
    return value


def check_bool(owner: str | None, name: str, value) -> bool:
    """``value`` if it is a bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise _fail(owner, f"{name}={value!r} has type {type(value).__name__}: expected True or False")
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


def check_finite(block: np.ndarray, row_offset: int, source=None,
                 chunk_starts: np.ndarray | None = None) -> None:
    """Raise :class:`NonFiniteInputError` naming the first NaN/inf row of ``block``.

    ``row_offset`` is the global row number of ``block[0]``; the storage chunk that
    holds it is named from ``chunk_starts`` (the first rows of the chunks, then n), or
    from those of ``source`` (a :class:`~ooc_spectral.io.source.DataSource`).
    """
    if np.isfinite(block).all():
        return
    bad = ~np.isfinite(block)
    local = int(np.flatnonzero(bad.any(axis=1))[0])
    col = int(np.flatnonzero(bad[local])[0])
    row = row_offset + local
    value = block[local, col]
    starts = source.chunk_starts if source is not None else chunk_starts
    if starts is not None:
        c = int(np.searchsorted(starts, row, side="right") - 1)
        where = f"row {row}, column {col} (chunk {c} of {len(starts) - 1}, rows {int(starts[c])}-{int(starts[c + 1]) - 1})"
    else:
        c = None
        where = f"row {row}, column {col}"
    kind = "NaN" if np.isnan(value) else "infinity"
    raise NonFiniteInputError(
        f"X contains {kind} at {where}; remove or impute the non-finite values and pass the rows again",
        row=row,
        chunk=c,
    )
