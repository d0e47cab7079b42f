"""Audits of stores: an output re-read chunk by chunk, an input checked from where a task runs.

An OUTDIR or a data set is checked against the manifest its writer recorded
(:func:`~ooc_spectral.io.manifest.audit`); :func:`verify_group` re-reads every chunk of
every array of any other group (a saved model) and lists the missing and damaged ones
and the model arrays whose values no longer match their digest.
:func:`check_readable_here` opens an input where it runs (a dask worker, before the
passes) and checks that its first chunk exists there. Both are built from the
checksums, digests and listings of :mod:`ooc_spectral.io.integrity`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from ..exceptions import MissingChunkError
from .integrity import (_chunk_region, arrays_digest, chunk_keys, damaged_chunks, digest_check,
                        missing_chunks, seal_holds)
from .persistence import ATTRS_KEY, MODEL_KEY, READABLE_FORMATS

__all__ = ["verify_group", "check_readable_here", "unreadable_models"]


def _arrays(group, prefix: str = ""):
    import warnings

    with warnings.catch_warnings():  # report.json, .lock: not zarr nodes, and not ours to check
        warnings.simplefilter("ignore")
        members = sorted(group.members(), key=lambda kv: kv[0])
    for name, node in members:
        if isinstance(node, zarr.Group):
            yield from _arrays(node, f"{prefix}{name}/")
        else:
            yield f"{prefix}{name}", node


def verify_group(path, *, count_only: bool = False) -> dict[str, Any]:
    """Re-read every chunk of every array under the zarr group at ``path``.

    Returns ``{"arrays": n, "chunks": n, "missing": [...], "damaged": [...],
    "digest_mismatch": [...]}``; each entry names the array and chunk key. A chunk
    without an object is "missing" (not also "damaged", though zarr reads it back as fill
    values). ``count_only``: count the arrays and chunks, read nothing (an output its
    manifest was checked against).
    """
    group = zarr.open_group(os.fspath(path), mode="r")
    report: dict[str, Any] = {"arrays": 0, "chunks": 0, "missing": [], "damaged": [],
                              "digest_mismatch": []}
    if count_only:
        for _, arr in _arrays(group):
            report["arrays"] += 1
            report["chunks"] += len(chunk_keys(arr))
        return report
    checks = {}  # an OUTDIR's outputs: each chunk against the digest in its written-marker
    for name in ("embedding", "labels"):
        try:
            marks, arr = group[f"{name}_written"], group[name]
            checks[name] = digest_check(arr.attrs.get("run_id"), marks[:])
        except Exception:  # no such output, or its markers are damaged (listed below)
            pass
    for name, arr in _arrays(group):
        report["arrays"] += 1
        keys = chunk_keys(arr)
        report["chunks"] += len(keys)
        absent = missing_chunks(arr)
        for _, key in absent:  # missing, not also "damaged" (read back as fill values)
            report["missing"].append(f"{name}: chunk {key}")
        present = [ck for ck in keys if ck not in set(absent)]
        for _, key, err in damaged_chunks(arr, present, checks.get(name)):
            report["damaged"].append(f"{name}: chunk {key} ({err})")
    # the model's digests: of its description, and of its values
    for gname, g, meta in _models(group):
        where = gname or "."
        if meta.get("format") != 2 and not seal_holds(meta, key=ATTRS_KEY):
            report["digest_mismatch"].append(f"{where}: the model's description (zarr.json)")
        try:
            values = {k: np.asarray(g[k][...]) for k in g.array_keys()}
        except Exception:
            continue  # already listed as damaged
        if arrays_digest(values) != meta.get("arrays_sha256"):
            report["digest_mismatch"].append(f"{where}: the model's arrays")
        else:  # the digest proves the values: an absent chunk held the fill value (a model
            # saved before every chunk was stored, io.integrity.checksummed)
            prefix = f"{gname}/" if gname else ""
            names = {f"{prefix}{k}: " for k in g.array_keys()}
            report["missing"] = [m for m in report["missing"]
                                 if not any(m.startswith(n) for n in names)]
    return report


def _models(group):
    """``(name, group, description)`` of each model at ``group`` (itself, or its ``model``
    member: a saved model, or a fit's OUTDIR)."""
    for gname in ("", "model"):
        try:
            g = group[gname] if gname else group
        except KeyError:
            continue
        meta = g.attrs.get(MODEL_KEY) if isinstance(g, zarr.Group) else None
        if isinstance(meta, dict):
            yield gname, g, meta


def unreadable_models(path) -> list[str]:
    """The models under the zarr group at ``path`` (itself, or its ``model`` member) in a
    format this version cannot read: intact perhaps, but ``transform`` and ``load`` refuse
    them. One line for each, naming the format and what to do."""
    out = []
    for gname, _, meta in _models(zarr.open_group(os.fspath(path), mode="r")):
        if meta.get("format") not in READABLE_FORMATS:
            out.append(f"{gname or '.'}: the model has format {meta.get('format')!r}; this "
                       f"version reads formats {', '.join(map(str, READABLE_FORMATS))}, so "
                       "transform and load refuse it: use the version that wrote it, or refit")
    return out


# --------------------------------------------------------------------------- #
# checks a batch job makes
# --------------------------------------------------------------------------- #
def check_readable_here(url: str, storage_options=None) -> str:
    """Open the input at ``url`` and check that its first chunk exists, where this runs.

    Meant to run on a dask worker before the passes: a worker that cannot see
    the input (another working directory, another mount, no credentials for
    the bucket) would otherwise read every chunk as fill values or fail late.
    Raises :class:`StoreNotFoundError` or :class:`MissingChunkError` naming the
    path as this process sees it. ``storage_options`` (a
    :class:`~ooc_spectral.io.storage.StorageOptions`) are the command's options
    for a URL.
    """
    import socket

    from zarr.core.sync import sync

    from ..exceptions import StoreNotFoundError
    from .source import open_zarr_array
    from .storage import is_url

    where = f"on {socket.gethostname()} (pid {os.getpid()}, working directory {os.getcwd()})"
    need = ("workers must reach the store with the client's settings (the backend's "
            "variables, e.g. AWS_*, on the workers, or --storage-options)" if is_url(url)
            else "workers must see the input at the same path as the client")
    options = storage_options.to_dict() if storage_options else None
    try:
        arr = open_zarr_array(url, storage_options=options)
    except StoreNotFoundError as exc:
        raise StoreNotFoundError(f"{exc} [{where}]; {need}") from None
    coords, key = chunk_keys(arr)[0]
    if not sync(arr.store.exists(key)):
        from .integrity import absent_chunks_are_fill

        if absent_chunks_are_fill(arr, url) is not None:  # fill values by intent
            return where
        raise MissingChunkError(
            f"chunk {key!r} of the input {url} does not exist {where}; {need}"
        )
    arr[_chunk_region(arr, coords)]
    return where


# --------------------------------------------------------------------------- #
# completeness of an OUTDIR
# --------------------------------------------------------------------------- #
def garbled_metadata(path) -> list[str]:
    """Every ``zarr.json`` under the local directory ``path`` that is not valid JSON."""
    import json

    from .storage import is_url

    text = os.fspath(path)
    if is_url(text) and not text.startswith("file://"):
        return []
    out = []
    for dirpath, _, files in os.walk(text.removeprefix("file://")):
        if "zarr.json" in files:
            p = os.path.join(dirpath, "zarr.json")
            try:
                with open(p, "rb") as f:
                    json.loads(f.read())
            except (OSError, ValueError):
                out.append(p)
    return sorted(out)


def incomplete_message(path, lines: list[str], attrs: dict | None) -> str:
    """What an audit found (its ``lines``), and the command that repairs it."""
    return (f"{os.fspath(path)} is marked complete but {len(lines)} of its members or chunks "
            f"are missing, damaged or another run's ({'; '.join(lines[:5])}); "
            f"run {rerun_command(path, attrs)}: it repairs them from the saved run state")


#: The members of a fit OUTDIR a transform reads (the map it applies) and the report.
APPLIED_MEMBERS = frozenset({"report.json", "model", "representatives_model"})


def require_group(path, role: str) -> None:
    """Refuse a local ``path`` that is a regular file or a zarr array where ``role`` (an
    OUTDIR, a data set or a model) is expected: a usage error, which no rerun mends
    (:class:`~ooc_spectral.exceptions.StoreNotFoundError`, exit 2), not the damage or the
    failed run (exit 1) that reading it as a group would report. URLs pass: their reader
    names what it finds."""
    from ..exceptions import StoreNotFoundError
    from .storage import is_url

    text = os.fspath(path)
    if is_url(text) and not text.startswith("file://"):
        return
    local = Path(text.removeprefix("file://"))
    if local.is_file():
        raise StoreNotFoundError(f"{text!r} is a file, not a directory: {role} is a zarr "
                                 "group (a directory); check the path")
    try:
        node = json.loads((local / "zarr.json").read_text()).get("node_type")
    except (OSError, ValueError, AttributeError):
        return  # no zarr.json, or a garbled one: the group's reader names it
    if node == "array":
        raise StoreNotFoundError(
            f"{text!r} is a zarr array, not a group: {role} is the group that holds its "
            f"arrays; give {os.fspath(local.parent)!r} (or the OUTDIR it belongs to)")


def check_fit_output(path, only=APPLIED_MEMBERS) -> None:
    """Refuse the fit OUTDIR at ``path`` as a model to apply unless its run finished and
    the members a transform reads (``model`` or ``representatives_model``, and the run's
    report) are intact and this run's: ``verify``'s check of them
    (:func:`~ooc_spectral.io.manifest.audit`), every chunk re-read. ``only``: the members
    to check instead (``plot``: ``embedding`` and the report). Raises
    :class:`~ooc_spectral.exceptions.OutputIncompleteError` naming the fit command that
    completes or repairs it; a saved model (no run's OUTDIR) passes."""
    from ..exceptions import DamagedFileError, OutputIncompleteError
    from .manifest import audit

    require_group(path, "a model (a fit OUTDIR or a saved model)")
    try:
        findings, attrs = audit(path, deep=False, only=only)
    except DamagedFileError:  # a garbled zarr.json: the model's reader names it, and the fix
        return
    if attrs is None:
        return
    if attrs.get("status") != "complete":
        run = "transform" if "model" in (attrs.get("config") or {}) else "fit"
        raise OutputIncompleteError(
            f"{os.fspath(path)} should hold a finished fit, but its status is "
            f"{attrs.get('status')!r}: the {run} did not finish (interrupted, failed or still "
            f"running): rerun the same {run} command, {rerun_command(path, attrs)} (it "
            "resumes; if it is still running, wait for it), then run this command again")
    if findings:
        raise OutputIncompleteError(incomplete_message(path, [str(f) for f in findings], attrs))


def input_repair(path) -> tuple[str | None, str | None]:
    """For an input data set at ``path`` (written by make-data or import): what happened to
    it if its writer did not finish (else None), and the command that writes it again (None
    for a group that is no data set of ours)."""
    from .layout import rewrite_input, unfinished_input

    try:
        attrs = dict(zarr.open_group(os.fspath(path), mode="r").attrs)
    except Exception:  # nothing there, or no group: verify_group says so
        return None, None
    return unfinished_input(attrs), rewrite_input(attrs)


def rerun_command(path, attrs: dict | None) -> str:
    """The command that repairs the OUTDIR at ``path`` (from its run attributes), its paths
    quoted for a POSIX shell."""
    from shlex import quote

    workflow = (attrs or {}).get("workflow") or {}
    if workflow.get("file"):  # written by a workflow's step: the workflow repairs it
        return (f"ooc-spectral run {quote(str(workflow['file']))} (the workflow that wrote it, "
                f"with the same options; its step {workflow.get('step')!r} resumes)")
    config = (attrs or {}).get("config") or {}
    url = (config.get("input") or {}).get("url") or "INPUT"
    if "model" in config:
        return (f"ooc-spectral transform {quote(str(config['model']))} {quote(url)} --out "
                f"{quote(os.fspath(path))} "
                "(the same command as before)")
    return (f"ooc-spectral fit {quote(url)} --out {quote(os.fspath(path))} with the same "
            "options as before")
