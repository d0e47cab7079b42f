"""Layer 8, the batch job and its front ends: what ``ooc-spectral`` runs.

``jobs`` (a fit or a transform as a resumable job in an OUTDIR, with its report),
``append`` (the update of a finished fit whose input gained rows), ``inspection``
and ``plotting`` (reading results back), ``commands`` (each subcommand as a function
of its parsed arguments), ``workflow`` (declarative TOML files whose steps are those
commands), ``cli`` (the console script: parsing, signals, exit codes).

May import: every layer below, the experiments included (``ooc-spectral evaluate``).
"""
