"""The console script's entry point, ``ooc-spectral = "ooc_spectral.cli:main"``.

A stable path for installed scripts (and for the ``[project.scripts]`` entry of every
installation made before the command line moved): the command line itself is
:mod:`ooc_spectral.batch.cli`. Imported by the console script (``sys.argv[0]`` is it), a
signal is noted from here on rather than fatal, so that even a SIGTERM while the modules
load is exit 1 (``main`` says nothing was done).
"""

import os
import sys

if os.path.basename(sys.argv[0] if sys.argv else "") == "ooc-spectral":
    from .exceptions import note_signals_while_starting

    note_signals_while_starting()

from .batch.cli import main  # noqa: E402

__all__ = ["main"]
