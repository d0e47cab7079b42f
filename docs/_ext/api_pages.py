"""The API reference's page, written from the package's public names at build time.

Every name a user can import is listed here, so a name added to an ``__all__`` gets its
page without editing the docs (``tests/test_docs.py`` checks that every one has a page):

* ``ooc_spectral.__all__``: the estimators and the exceptions re-exported at the top
  level (documented under ``ooc_spectral.``);
* ``ooc_spectral.manifold.__all__``, ``ooc_spectral.baselines.__all__``;
* ``ooc_spectral.exceptions.__all__`` less those already documented at the top level.

Dunder names (``__version__``) are not given a page.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

#: (module, title, intro) of each section, in page order
SECTIONS = [
    ("ooc_spectral", "Estimators", "The two estimators of the top-level package."),
    ("ooc_spectral.manifold", "Manifold learning",
     "Laplacian eigenmaps, diffusion maps, metric MDS, Isomap and LLE, each with the "
     "Nyström formula for new rows (out of core where the user guide says so)."),
    ("ooc_spectral.baselines", "Baselines",
     "The methods the papers compare the greedy dictionary with (exact kernel method, "
     "Nyström variants, Gaussian projection) and their helpers."),
    ("ooc_spectral", "Exceptions and warnings",
     "Every exception is an :class:`~ooc_spectral.OocSpectralError`; the command line exits "
     "with code 2 on a :class:`~ooc_spectral.UsageError` and 1 on the others."),
    ("ooc_spectral.exceptions", "More exceptions",
     "Raised by the batch machinery and the numerical checks; importable from "
     "``ooc_spectral.exceptions``."),
]


def _public(module: str) -> list[str]:
    mod = importlib.import_module(module)
    return [n for n in mod.__all__ if not (n.startswith("__") and n.endswith("__"))]


def public_names() -> dict[str, list[str]]:
    """``{section title: [qualified names]}``, every public name exactly once."""
    import ooc_spectral

    top = _public("ooc_spectral")
    estimators = [n for n in top if inspect.isclass(getattr(ooc_spectral, n))
                  and not issubclass(getattr(ooc_spectral, n), (BaseException, Warning))]
    errors = [n for n in top if n not in estimators]
    more = [n for n in _public("ooc_spectral.exceptions") if n not in top]
    return {
        "Estimators": [f"ooc_spectral.{n}" for n in estimators],
        "Manifold learning": [f"ooc_spectral.manifold.{n}" for n in _public("ooc_spectral.manifold")],
        "Baselines": [f"ooc_spectral.baselines.{n}" for n in _public("ooc_spectral.baselines")],
        "Exceptions and warnings": [f"ooc_spectral.{n}" for n in errors],
        "More exceptions": [f"ooc_spectral.exceptions.{n}" for n in more],
    }


def _template(qualname: str) -> str:
    module, _, name = qualname.rpartition(".")
    obj = getattr(importlib.import_module(module), name)
    if inspect.isclass(obj):
        if issubclass(obj, (BaseException, Warning)):
            return "exception.rst"
        return "class.rst"
    if callable(obj):
        return "function.rst"
    return "data.rst"


def write_api_page(path: Path) -> None:
    lines = [
        ".. This page is written by docs/_ext/api_pages.py at every build: do not edit.",
        "",
        "API reference",
        "=============",
        "",
        "Every public name of the package, each page generated from its docstring. The "
        "command line is described in :doc:`user_guide/command_line`.",
        "",
    ]
    intros = {title: intro for _, title, intro in SECTIONS}
    for title, names in public_names().items():
        if not names:
            continue
        lines += [title, "-" * len(title), "", intros[title], ""]
        by_template: dict[str, list[str]] = {}
        for q in names:
            by_template.setdefault(_template(q), []).append(q)
        for template, qs in by_template.items():
            lines += [".. autosummary::", "   :toctree: generated/", f"   :template: {template}",
                      "", *(f"   {q}" for q in qs), ""]
    text = "\n".join(lines)
    if not path.exists() or path.read_text() != text:  # keep the mtime: no needless rebuild
        path.write_text(text)
