"""Evaluations and paper reproductions, run by ``ooc-spectral evaluate NAME``.

Each module of this package defines ``EXPERIMENTS``, a dict from a name to a
function ``run(out: pathlib.Path, **params) -> dict``: it writes its tables
(markdown) and figures (PNG) under ``out`` and returns a JSON-able summary.
Modules are found by name, so adding an experiment means adding a module; the
parameters come from ``--param key=value`` (or the step's ``params`` table in
a workflow file) and are checked by the experiment itself. ``evaluation`` holds the
papers' protocol that they share (splits, alignment by regression, confidence
intervals); modules whose name starts with ``_`` are helpers, not experiments.

Layer 7: may import the estimators, the baselines and every layer below them.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Callable

from ..exceptions import InvalidParameterError

__all__ = ["available", "run_experiment"]


def available() -> dict[str, Callable]:
    """Every registered experiment, by name."""
    found: dict[str, Callable] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.update(getattr(module, "EXPERIMENTS", {}))
    return found


def run_experiment(name: str, out, **params) -> dict:
    """Run the experiment ``name`` with ``params``, writing under ``out``."""
    registry = available()
    if name not in registry:
        raise InvalidParameterError(
            f"unknown experiment {name!r}; expected one of: {', '.join(sorted(registry)) or '(none)'}"
        )
    func = registry[name]
    sig = inspect.signature(func)
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    unknown = [k for k in params if k not in sig.parameters and not accepts_any]
    if unknown:
        known = [k for k in sig.parameters if k != "out"]
        raise InvalidParameterError(
            f"experiment {name!r} has no parameter {unknown[0]!r}; its parameters: {', '.join(known)}"
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return func(out, **params)
