"""The console script's entry point, ``ooc-spectral = "ooc_spectral.cli:main"``.

A stable path for installed scripts (and for the ``[project.scripts]`` entry of every
installation made before the command line moved): the command line itself is
:mod:`ooc_spectral.batch.cli`.
"""

from .batch.cli import main

__all__ = ["main"]
