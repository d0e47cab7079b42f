"""The docstring examples of every module run, and say what they claim (issue 14)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import ooc_spectral

MODULES = sorted(m.name for m in pkgutil.walk_packages(ooc_spectral.__path__, "ooc_spectral.")
                 if m.name != "ooc_spectral.__main__")  # subpackages too (baselines, experiments)


def test_the_estimators_carry_examples():
    finder = doctest.DocTestFinder()
    examples = {name for name in MODULES
                if any(t.examples for t in finder.find(importlib.import_module(name)))}
    assert {"ooc_spectral.estimators.embedding", "ooc_spectral.estimators.clustering",
            "ooc_spectral.estimators.manifold"} <= examples


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"
