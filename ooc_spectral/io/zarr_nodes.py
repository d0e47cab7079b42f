"""Groups and arrays written with few requests on object storage: each on a store rooted at it.

zarr checks, for every array or group it creates, that no group above it up to the store's
root is an array and writes the metadata of any that is missing (``save_metadata(
ensure_parents=True)``): on S3 a HEAD and a GET for each level, for every array. A
checkpoint part sits four levels below an OUTDIR's root (``checkpoint/partials/<part>/
<array>``): about ten requests per array before its own two. :func:`new_group` and
:func:`new_array` create a child of a group that exists on a store rooted at the child
itself: no parent to check or write. The objects written are the same.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["new_group", "new_array"]


def _store_at(group, name: str = ""):
    """A store of the same kind as ``group``'s, rooted at ``group/name``; None for a store
    that cannot be rooted elsewhere (an in-memory store: nothing to save there)."""
    from zarr.storage import FsspecStore, LocalStore

    store = group.store
    rel = "/".join(p for p in (group.path, name) if p)
    if not rel:
        return store
    if isinstance(store, FsspecStore):
        return FsspecStore(store.fs, read_only=store.read_only,
                           path=f"{store.path.rstrip('/')}/{rel}",
                           allowed_exceptions=store.allowed_exceptions)
    if isinstance(store, LocalStore):
        return LocalStore(Path(store.root) / rel, read_only=store.read_only)
    return None


def new_group(group, name: str):
    """A new, empty group ``name`` in ``group`` (which must not hold ``name``), on a store
    rooted at it: what ``group.require_group(name)`` creates, in about two requests."""
    import zarr

    store = _store_at(group, name)
    if store is None:
        return group.require_group(name)
    return zarr.create_group(store=store, zarr_format=3)


def new_array(group, name: str, value, **kwargs):
    """Create the array ``name`` in ``group`` holding ``value`` (one chunk unless ``chunks``
    is given; ``kwargs`` as for ``create_array``) on a store rooted at the array: no parent
    checked or written, ``group`` being there already. Returns the array."""
    import numpy as np
    import zarr

    value = np.asarray(value)
    kwargs.setdefault("chunks", value.shape or (1,))
    store = _store_at(group, name)
    if store is None:
        arr = group.create_array(name, shape=value.shape, dtype=value.dtype, **kwargs)
    else:
        arr = zarr.create_array(store, shape=value.shape, dtype=value.dtype, zarr_format=3,
                                **kwargs)
    arr[...] = value
    return arr
