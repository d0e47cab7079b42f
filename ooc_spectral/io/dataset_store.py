"""The zarr layout of a data set written by :func:`~ooc_spectral.datasets.make_data`.

The group holds ``data`` (n x dim), one 1-D array per label, and the attribute
:data:`DATASET_KEY` (:func:`dataset_meta`, with ``complete``). Here: creating
the group (:func:`create_group`, also used by ``ooc-spectral import``) and its
arrays, the free-space check before writing, the attribute, and
:func:`open_dataset`.
Every public name is importable from :mod:`ooc_spectral.datasets`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from typing import Any

import numpy as np
import zarr
import zarr.errors

from .dataset_specs import GENERATION_BLOCK_ROWS, DatasetPlan, blob_centers
from ..exceptions import InvalidInputError, OutputNotWritableError, StoreNotFoundError
from .layout import DATA_ARRAY_NAME, DATASET_KEY

__all__ = ["FORMAT_VERSION", "create_arrays", "create_group", "check_free_space", "dataset_meta",
           "existing_meta", "intact_dataset", "is_local", "open_dataset", "stored_bytes"]

#: Version of the layout written by :func:`~ooc_spectral.datasets.make_data`.
FORMAT_VERSION = 1


def is_local(loc: str) -> bool:
    """Whether ``loc`` is a local path (no URL scheme, or ``file://``)."""
    return "://" not in loc or loc.startswith("file://")


def stored_bytes(plan: DatasetPlan, dt: np.dtype) -> int:
    """Bytes of the arrays ``make_data`` writes (uncompressed: random values barely compress)."""
    return plan.n * plan.dim * dt.itemsize + sum(plan.n * lab.dtype.itemsize
                                                 for lab in plan.spec.labels)


def check_free_space(loc: str, plan: DatasetPlan, dt: np.dtype) -> None:
    """Refuse a data set larger than the free space of its file system (before writing)."""
    if not is_local(loc):
        return
    path = os.path.abspath(loc.removeprefix("file://"))
    existing = 0  # an older store at ``path`` is replaced: its space comes back
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                existing += os.lstat(os.path.join(dirpath, f)).st_size
    probe = path
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return
    need = stored_bytes(plan, dt)
    if need > free + existing:
        raise OutputNotWritableError(
            f"make-data {plan.spec.name} with n = {plan.n} x dim = {plan.dim} ({dt.name}) needs "
            f"{need / 2**30:.3g} GiB, but the file system of {loc!r} has {free / 2**30:.3g} GiB "
            "free; choose a smaller --n or --dim, or another location"
        )


def create_group(loc: str, overwrite: bool, attributes: dict | None = None):
    """A new zarr v3 group at ``loc``, created with ``attributes`` (the writer's marker) in
    one write; an existing store is replaced only with ``overwrite``, and only when it is
    an input group this tool wrote (its attributes carry ``ooc_spectral_dataset`` or
    ``ooc_spectral_import``): a file, a foreign directory or a user's own zarr group is
    never deleted (:func:`~ooc_spectral.io.safety.check_replaceable`).
    """
    from .layout import IMPORT_KEY
    from .safety import check_replaceable, remove_members_marker_last

    if is_local(loc):
        path = loc.removeprefix("file://")
        if os.path.exists(path) and not os.path.isdir(path):
            raise OutputNotWritableError(
                f"{loc!r} is an existing file, not a directory; choose another output path"
            )
        if not overwrite and os.path.isdir(path) and os.listdir(path):
            raise OutputNotWritableError(
                f"data already exist at {loc!r} (a non-empty directory); nothing was written "
                "there; pass overwrite=True (--overwrite) to replace a data set this tool wrote, "
                "or choose another output path")
    if overwrite:
        check_replaceable(loc, (DATASET_KEY, IMPORT_KEY), "an input data set")
        # the marker-holding zarr.json last: a kill midway leaves a marked data set
        remove_members_marker_last(loc)
    try:
        return zarr.create_group(loc, overwrite=overwrite, zarr_format=3,
                                 attributes=attributes or {})
    except (FileExistsError, zarr.errors.ContainsGroupError,
            zarr.errors.ContainsArrayError) as exc:
        raise OutputNotWritableError(
            f"data already exist at {loc!r}; pass overwrite=True (--overwrite) to replace "
            "them, or choose another output path"
        ) from exc
    except OSError as exc:
        raise OutputNotWritableError(f"cannot create a zarr group at {loc!r}: {exc}") from exc


def create_arrays(group, plan: DatasetPlan, chunk_rows: int, dt: np.dtype) -> dict[str, Any]:
    """``{name: zarr.Array}``: ``data`` and one 1-D array per label, ``chunk_rows`` per chunk."""
    # zarr v3 dimension names, so that xarray.open_zarr opens the group
    arrays = {DATA_ARRAY_NAME: group.create_array(
        DATA_ARRAY_NAME, shape=(plan.n, plan.dim), chunks=(chunk_rows, plan.dim), dtype=dt,
        dimension_names=("sample", "feature"),
        config={"write_empty_chunks": True})}  # every chunk: an absent one is damage
    for lab in plan.spec.labels:
        arrays[lab.name] = group.create_array(lab.name, shape=(plan.n,), chunks=(chunk_rows,),
                                              dtype=lab.dtype, dimension_names=("sample",),
                                              config={"write_empty_chunks": True})
    return arrays


def dataset_meta(plan: DatasetPlan, chunk_rows: int, dt: np.dtype) -> dict[str, Any]:
    """The ``ooc_spectral_dataset`` attribute of a store (without ``complete``)."""
    meta = {
        "format": FORMAT_VERSION,
        "name": plan.spec.name,
        "n": plan.n,
        "dim": plan.dim,
        "intrinsic_dim": plan.k,
        "noise": plan.noise,
        "seed": plan.seed,
        "params": plan.params,
        "chunk_rows": chunk_rows,
        "dtype": dt.name,
        "generation_block_rows": GENERATION_BLOCK_ROWS,
        "labels": plan.spec.label_kinds,
        "description": plan.spec.description,
    }
    if plan.spec.name == "blobs":
        meta["centers"] = blob_centers(plan.seed, plan.params["n_clusters"],
                                       plan.params["n_features"],
                                       plan.params["center_box"]).tolist()
    # through JSON, as the store holds it (tuples become lists, ...)
    return json.loads(json.dumps(meta))


def existing_meta(loc: str) -> dict[str, Any] | None:
    """The :data:`DATASET_KEY` attribute of the group at ``loc``, or None (none there)."""
    try:
        group = zarr.open_group(loc, mode="r")
    except Exception:
        return None
    meta = group.attrs.get(DATASET_KEY)
    return meta if isinstance(meta, dict) else None


def intact_dataset(loc: str, key: str) -> bool:
    """Whether the complete data set at ``loc`` still holds what its writer wrote (every
    chunk against the digests recorded under ``key``: ``verify``'s check); the log says
    what is not, and the caller writes it again."""
    import logging

    from .manifest import audit_dataset

    findings = audit_dataset(loc, key)
    if findings:
        logging.getLogger("ooc_spectral").warning(
            "%s was complete, but %d of its chunks or arrays are missing or damaged (%s); "
            "writing it again", loc, len(findings), "; ".join(map(str, findings[:5])))
    return not findings


def open_dataset(path: str | os.PathLike) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Open a data set written by :func:`~ooc_spectral.datasets.make_data`.

    Parameters
    ----------
    path : str or path-like
        Location of the zarr group.

    Returns
    -------
    data : zarr.Array
        The ``(n, dim)`` data array.
    labels : dict of str to zarr.Array
        The 1-D arrays beside it (``t``, ``u``, ``v`` or ``label``).
    attrs : dict
        The ``ooc_spectral_dataset`` attribute (name, n, dim, noise, seed, params, ...).

    Raises
    ------
    StoreNotFoundError
        Nothing at ``path``.
    InvalidInputError
        The store is not a data set written by
        :func:`~ooc_spectral.datasets.make_data`, or its writing did not finish
        (``complete`` is false).
    """
    loc = os.fspath(path)
    try:
        group = zarr.open_group(loc, mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError,
            zarr.errors.NodeNotFoundError) as exc:
        raise StoreNotFoundError(
            f"no data set at {loc!r}; check the path, or create one with "
            "`ooc-spectral make-data NAME --n N --out PATH`"
        ) from exc
    except zarr.errors.ContainsArrayError as exc:
        raise InvalidInputError(
            f"{loc!r} is a zarr array, not a data set group written by make-data; open it "
            "with zarr.open_array, or create a data set with `ooc-spectral make-data`"
        ) from exc
    attrs = group.attrs.get(DATASET_KEY)
    if not isinstance(attrs, dict):
        raise InvalidInputError(
            f"the zarr group at {loc!r} is not a data set written by make-data (no "
            f"{DATASET_KEY!r} attribute); create one with `ooc-spectral make-data`"
        )
    if not attrs.get("complete", False):
        raise InvalidInputError(
            f"the data set at {loc!r} is incomplete: make-data was interrupted before the "
            "last block was written; run make-data again with overwrite=True (--overwrite)"
        )
    data = group[DATA_ARRAY_NAME]
    labels = {key: group[key] for key in attrs.get("labels", {})}
    return data, labels, dict(attrs)
