"""Groups written to with few requests on object storage: a group on a store rooted at it.

zarr checks, for every array it creates, that no group above it up to the store's root is
an array and writes the metadata of any that is missing (``save_metadata(ensure_parents=
True)``): on S3 a HEAD and a GET for each level, for every array. A checkpoint part sits four
levels below an OUTDIR's root (``checkpoint/partials/<part>/<array>``): about ten requests per
array before its own two. :func:`rooted` gives the same group on a store whose root is the
group itself, so that an array created in it has one parent to check, the group, which
exists; :func:`new_group` creates a child group that way. The files written are the same.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["rooted", "new_group"]


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


def rooted(group):
    """``group`` on a store rooted at it (no request: its metadata is the one in hand)."""
    import zarr
    from zarr.core.group import AsyncGroup
    from zarr.storage import StorePath

    store = _store_at(group)
    if store is None or store is group.store:
        return group
    return zarr.Group(AsyncGroup(metadata=group.metadata, store_path=StorePath(store, "")))


def new_group(group, name: str):
    """A new, empty group ``name`` in ``group`` (which must not hold ``name``), on a store
    rooted at it: what ``group.require_group(name)`` creates, in about two requests."""
    import zarr

    store = _store_at(group, name)
    if store is None:
        return group.require_group(name)
    return zarr.create_group(store=store, zarr_format=3)
