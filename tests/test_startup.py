"""What a command-line run imports: a small job's fixed cost (issue 18, item 2).

Every ``ooc-spectral`` command, and every worker process of the embedded
cluster, starts a Python interpreter; scikit-learn's import alone took most of
the package's import time. The command line's fit path and the worker's task
code do not need it: the estimators and ``NotFittedError`` (a subclass of
scikit-learn's) are imported on first use.
"""

from __future__ import annotations

import subprocess
import sys

import sklearn.exceptions

import ooc_spectral
from ooc_spectral import exceptions


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\n"
                          "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"],
                         capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_fit_command_path_does_not_import_scikit_learn():
    mods = _modules_after("import ooc_spectral.batch.cli, ooc_spectral.batch.jobs, "
                          "ooc_spectral.pipeline.accumulate, ooc_spectral.pipeline.writeback")
    assert "ooc_spectral" in mods and "dask" in mods
    assert "sklearn" not in mods


def test_not_fitted_error_is_scikit_learns_and_one_class():
    cls = ooc_spectral.NotFittedError
    assert cls is exceptions.NotFittedError is ooc_spectral.exceptions.NotFittedError
    assert issubclass(cls, sklearn.exceptions.NotFittedError)
    assert issubclass(cls, ooc_spectral.OocSpectralError)
    assert issubclass(cls, ValueError) and issubclass(cls, AttributeError)
    assert f"{cls.__module__}.{cls.__qualname__}" == "ooc_spectral.exceptions.NotFittedError"


def test_the_estimators_and_star_import_resolve():
    namespace: dict = {}
    exec("from ooc_spectral import *", namespace)
    for name in ooc_spectral.__all__:
        assert name in namespace, name
    from ooc_spectral.estimators.embedding import GreedySpectralEmbedding

    assert namespace["GreedySpectralEmbedding"] is GreedySpectralEmbedding
    assert "GreedySpectralClustering" in dir(ooc_spectral)
