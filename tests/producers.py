"""An input its producer rewrites or appends to, for the tests of changed inputs.

A data set written by ``make-data`` or ``import`` records a digest of every chunk and of
its description: rows changed with zarr afterwards are damage, which the fit refuses
(exit 2, naming the writer's command). The tests of an input that its producer changes
between or during runs start from such a data set and make it the producer's own zarr
group first: the same rows, without the writer's description.
"""

from __future__ import annotations

import shutil

WRITERS = ("ooc_spectral_dataset", "ooc_spectral_import")


def producers_group(path, copy_of=None):
    """Make the data set at ``path`` (a copy of ``copy_of`` when given; a local path, or a
    URL with the copy made already) a plain zarr group holding the same arrays; returns
    ``path``."""
    import zarr

    if copy_of is not None:
        shutil.copytree(copy_of, path)
    group = zarr.open_group(str(path), mode="r+")
    group.attrs.put({k: v for k, v in group.attrs.items() if k not in WRITERS})
    return path
