"""Sphinx configuration of the ooc_spectral documentation.

Build it with ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (what
``tests/test_docs.py`` runs). Three pages are made at build time, from what the
repository holds then:

* ``api.rst``: one autosummary entry per public name (``ooc_spectral.__all__``,
  ``ooc_spectral.manifold``, ``ooc_spectral.baselines``, ``ooc_spectral.exceptions``),
  each page generated from the docstring (numpydoc);
* the gallery ``auto_examples/`` from ``docs/examples/plot_*.py``, each example run
  by sphinx-gallery during the build (on all its rows; ``tests/test_docs.py`` sets
  ``OOC_SPECTRAL_GALLERY_FRACTION`` and a hidden block of each example keeps that
  fraction of the rows: the test proves every line runs and draws, at a third of the cost);
* the tables and plots of ``performance.md`` from ``workflows/bench/results/*.json``
  (``docs/_ext/benchmark_results.py``), and the comparison table and grid of
  ``clustering.md`` from ``workflows/bench/results/clustering.json``
  (``docs/_ext/clustering_results.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(ROOT))  # the package of this tree, not another installed copy
# spawned dask workers of the gallery's examples import the same tree
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
os.environ.setdefault("MPLBACKEND", "Agg")

import ooc_spectral  # noqa: E402

import api_pages  # noqa: E402

project = "ooc_spectral"
author = "the ooc_spectral developers"
copyright = "the ooc_spectral developers"  # noqa: A001
version = release = ooc_spectral.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
    "benchmark_results",
    "clustering_results",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints", "examples/README.rst",
                    "auto_examples/*.ipynb", "auto_examples/*.py", "auto_examples/*.zip",
                    "auto_examples/*.json", "auto_examples/*.md5"]
templates_path = ["_templates"]

# --- the API reference: generated from the public names ------------------------------
api_pages.write_api_page(DOCS / "api.rst")
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"inherited-members": False, "show-inheritance": True}
autodoc_typehints = "none"  # numpydoc's Parameters sections say the types
numpydoc_show_class_members = False  # autosummary's class template lists them
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# --- Markdown pages -------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

# --- the gallery ------------------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": "examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    # each example in a fresh temporary directory: what it writes does not land in docs/
    "reset_modules": ("matplotlib",),
    "abort_on_example_error": True,
    "show_memory": False,
    "plot_gallery": "True",
    "min_reported_time": 1e9,  # no run times on the pages: they depend on the machine
}

# --- the performance page ----------------------------------------------------------------
benchmark_results_dir = str(ROOT / "workflows" / "bench" / "results")

html_theme = "alabaster"
html_theme_options = {
    "description": "Kernel PCA and spectral embedding of data larger than RAM",
    "fixed_sidebar": True,
    "page_width": "1100px",
    "sidebar_width": "230px",
}
html_static_path: list[str] = []
html_show_sourcelink = False

# A docstring of the package uses ``|I|`` (a set's size) outside literal markup, which
# docutils reads as a substitution; defined here until the docstring is fixed (the package
# is being moved into sub-packages, issue 40).
rst_prolog = """
.. |I| replace:: \\|I\\|
"""


def _optional_pages(app, docname, source):
    """``OPTIONAL:name`` lines of a toctree: kept when ``docs/name.md`` exists (a page that
    another branch adds), dropped otherwise, so the build never warns on a missing page."""
    if docname != "index":
        return
    lines = []
    for line in source[0].splitlines():
        if line.startswith("OPTIONAL:"):
            name = line.split(":", 1)[1].strip()
            if (DOCS / f"{name}.md").exists() or (DOCS / f"{name}.rst").exists():
                lines.append(name)
            continue
        lines.append(line)
    source[0] = "\n".join(lines) + "\n"


def setup(app):
    app.connect("source-read", _optional_pages)
