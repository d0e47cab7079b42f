"""JSON that strict parsers read (RFC 8259): a value that is not finite is ``null``.

Python's :mod:`json` writes ``Infinity`` and ``NaN``, which JavaScript's ``JSON.parse``
refuses and ``jq`` turns into the largest float, so a bound that is not finite would
read as a number. ``report.json`` and the command line's ``--json`` line go through
:func:`dumps`. NumPy arrays and scalars are written as lists and numbers; anything
else JSON does not know, as its ``str``.
"""

from __future__ import annotations

import json
import math

__all__ = ["dumps"]


def dumps(value, indent: int | None = None) -> str:
    """``value`` as strict JSON, every float that is not finite written as ``null``."""
    plain = json.loads(json.dumps(value, default=_plain))
    return json.dumps(_finite_or_null(plain), indent=indent, allow_nan=False)


def _plain(value):
    if hasattr(value, "tolist"):  # numpy arrays and scalars, without importing numpy
        return value.tolist()
    return str(value)


def _finite_or_null(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_null(v) for v in value]
    return value
