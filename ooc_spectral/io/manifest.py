"""The members of an output and the digests that prove each is the one written (issue 52).

Every command that writes an output records, when it completes, a **manifest**: one
entry per member it wrote, each with a digest, so that ``ooc-spectral verify`` and the
rerun of the same command can say of each member whether it is intact, missing, damaged
or another run's. One contract for every kind of output:

- an OUTDIR (``fit``, the update, ``transform``, ``--affinity representatives`` fit and
  transform): the manifest is in ``report.json`` (``members``) and in OUTDIR's
  ``zarr.json`` (the run's attributes, written last with ``status = complete``, beside
  ``report_sha256``, the digest of ``report.json`` itself);
- a data set (``make-data``, ``import``): in its writer's marker attribute, written last
  with ``complete = true``.

Kinds of member
    ``chunked``: an array written chunk by chunk (``embedding``, ``labels``) with a
    markers array beside it (``embedding_written``, ``labels_written``): each chunk's
    marker is its digest keyed by the run and the chunk's index
    (:func:`~ooc_spectral.io.integrity.chunk_digest`), so a chunk copied from another run,
    or from another chunk of the same array, does not match. The entry records the run
    id, shape, chunks, dtype and a SHA-256 of the markers.

    ``digested``: an array of a data set, whose per-chunk digests (keyed in the same way
    by the writer's run id) are in the entry itself.

    ``sealed``: a group of arrays whose attributes (under ``key``) carry the SHA-256 of
    the arrays' values (``arrays_sha256``) and a digest of themselves (``attrs_sha256``):
    the saved model, ``representatives_model``. The entry records ``arrays_sha256``.

:func:`audit` checks an output against its manifest and returns :class:`Finding` s:
``missing`` (an object that is not there: a chunk, a member), ``damaged`` (there, but
changed: a checksum, a digest) or ``foreign`` (whole and self-consistent, but another
run's). These detect damage and mix-ups, not an adversary, who can rewrite a digest too.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np

from .integrity import (_chunk_region, _listing, arrays_digest, checksummed, chunk_digest,
                        chunk_keys, seal_holds, sealed)

__all__ = ["Finding", "MISSING", "DAMAGED", "FOREIGN", "MEMBERS_KEY", "REPORT_DIGEST",
           "chunked_entry", "sealed_entry", "DigestingArrays", "write_sealed_group",
           "read_sealed_group", "audit", "audit_dataset", "check_members", "REPRESENTATIVES_KEY",
           "has_manifest", "seal_description", "description_damaged", "recorded_digests"]

MISSING, DAMAGED, FOREIGN = "missing", "damaged", "not this run's"
#: Where a manifest is recorded (report.json, the run's attributes, a data set's marker).
MEMBERS_KEY = "members"
#: The run attribute holding the SHA-256 of ``report.json`` as it was written.
REPORT_DIGEST = "report_sha256"
#: The attribute of a sealed group's description that digests the description itself.
ATTRS_DIGEST = "attrs_sha256"
REPORT = "report.json"
#: The groups of an OUTDIR outside its manifest, whose chunks ``verify`` also re-reads.
OTHER_GROUPS = ("checkpoint",)
#: The description attribute of ``representatives_model`` (the representatives fit's map).
REPRESENTATIVES_KEY = "ooc_spectral_representatives"


@dataclass(frozen=True)
class Finding:
    """What is wrong with one member (or one chunk of it).

    ``whole``: the member must be written whole again (its metadata is gone, it is
    another run's, its markers changed); otherwise only ``chunk`` needs writing again.
    """

    member: str
    state: str
    what: str
    chunk: int | None = None
    whole: bool = True

    def __str__(self) -> str:
        return f"{self.member}: {self.state}: {self.what}"


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


# --------------------------------------------------------------------------- #
# entries, made when the output completes
# --------------------------------------------------------------------------- #
def _markers_digest(run_id, shape, chunks, dtype, marks: np.ndarray) -> str:
    h = hashlib.sha256(f"{run_id}|{list(shape)}|{list(chunks)}|{dtype}|".encode())
    h.update(np.ascontiguousarray(marks, dtype=np.uint64).tobytes())
    return h.hexdigest()


def chunked_entry(group, name: str, markers: str) -> dict:
    """The manifest entry of the chunked output ``name`` of ``group`` (markers ``markers``).

    Raises ``RuntimeError`` when a chunk was never marked written: such an output is not
    complete, and must never be recorded as if it were.
    """
    arr, marks = group[name], np.asarray(group[markers][...])
    unwritten = np.flatnonzero(marks == 0)
    if unwritten.size:
        raise RuntimeError(f"{unwritten.size} of {marks.size} chunks of {name} were never "
                           f"written (the first: chunk {int(unwritten[0])}); the output is "
                           "not complete")
    run_id = arr.attrs.get("run_id")
    return {"kind": "chunked", "markers": markers, "run_id": run_id,
            "shape": list(arr.shape), "chunks": list(arr.chunks), "dtype": str(arr.dtype),
            "sha256": _markers_digest(run_id, arr.shape, arr.chunks, arr.dtype, marks)}


def sealed_entry(group, name: str, key: str) -> dict:
    """The manifest entry of the sealed group ``name`` (its description under ``key``)."""
    meta = group[name].attrs[key]
    return {"kind": "sealed", "key": key, "sha256": meta["arrays_sha256"]}


class DigestingArrays:
    """Arrays of a data set being written, each chunk's digest taken as it is written.

    ``arrays[name][a:b] = values`` writes and digests every chunk whose rows lie wholly
    in ``[a, b)`` (writers write whole chunks; the last may be short). :meth:`entries`
    is the data set's manifest, once every chunk is written.
    """

    def __init__(self, arrays: dict, run_id: str):
        self.run_id = run_id
        self.digests: dict[str, dict[int, int]] = {name: {} for name in arrays}
        self.arrays = {name: _Digesting(self, name, arr) for name, arr in arrays.items()}

    def __getitem__(self, name):
        return self.arrays[name]

    def items(self):
        return self.arrays.items()

    def entries(self) -> dict:
        out = {}
        for name, wrapped in self.arrays.items():
            arr = wrapped.arr
            n_chunks = -(-arr.shape[0] // arr.chunks[0]) if arr.shape[0] else 0
            got = self.digests[name]
            lost = [c for c in range(n_chunks) if c not in got]
            if lost:
                raise RuntimeError(f"chunk {lost[0]} of {name} was never digested")
            out[name] = {"kind": "digested", "run_id": self.run_id, "shape": list(arr.shape),
                         "chunks": list(arr.chunks), "dtype": str(arr.dtype),
                         "digests": [str(got[c]) for c in range(n_chunks)]}
        return out


class _Digesting:
    def __init__(self, owner: DigestingArrays, name: str, arr):
        self.owner, self.name, self.arr = owner, name, arr

    def __getattr__(self, attr):
        return getattr(self.arr, attr)

    def __setitem__(self, rows, values):
        arr = self.arr
        start, stop, _ = rows.indices(arr.shape[0])
        values = np.asarray(values, dtype=arr.dtype)
        arr[start:stop] = values
        step = arr.chunks[0]
        for c in range(-(-start // step), -(-stop // step)):
            a, b = c * step, min((c + 1) * step, arr.shape[0])
            if a >= start and b <= stop:
                self.owner.digests[self.name][c] = chunk_digest(
                    self.owner.run_id, c, values[a - start:b - start])


def write_sealed_group(group, name: str, key: str, arrays: dict, meta: dict) -> None:
    """Write the group ``name`` of ``group``: ``arrays`` (each chunk checksummed) and, last,
    ``meta`` under ``key`` with ``arrays_sha256`` and its own digest (:data:`ATTRS_DIGEST`)."""
    if name in group:
        del group[name]
    g = group.require_group(name)
    values = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    for k, v in values.items():
        arr = g.create_array(k, shape=v.shape, dtype=v.dtype, chunks=v.shape or (1,),
                             **checksummed())
        arr[...] = v
    g.attrs[key] = sealed({**meta, "arrays_sha256": arrays_digest(values)}, key=ATTRS_DIGEST)


def read_sealed_group(url: str, key: str, what: str, repair: str) -> tuple[dict, dict]:
    """``(arrays, description)`` of the sealed group at ``url``, every chunk and both
    digests checked: :class:`~ooc_spectral.exceptions.DamagedDataError` naming ``what``
    and ``repair`` otherwise."""
    import zarr

    from ..exceptions import DamagedDataError

    g = zarr.open_group(url, mode="r")
    meta = g.attrs.get(key)
    if not isinstance(meta, dict) or not seal_holds(meta, key=ATTRS_DIGEST):
        raise DamagedDataError(f"{what} at {url} is damaged: its description (zarr.json) "
                               f"{'is lost' if not isinstance(meta, dict) else 'was changed'}"
                               f"; {repair}")
    try:
        arrays = {k: np.asarray(g[k][...]) for k in g.array_keys()}
    except Exception as exc:
        raise DamagedDataError(f"{what} at {url} is damaged: {_short(exc)}; {repair}") from exc
    if arrays_digest(arrays) != meta.get("arrays_sha256"):
        raise DamagedDataError(f"{what} at {url} is damaged: its arrays do not match the "
                               f"digest saved with them (a changed or deleted chunk); {repair}")
    return arrays, {k: v for k, v in meta.items() if k not in (ATTRS_DIGEST, "arrays_sha256")}


# --------------------------------------------------------------------------- #
# checks
# --------------------------------------------------------------------------- #
def _chunk_findings(name: str, arr, check) -> list[Finding]:
    """Every chunk of ``arr``: missing (no object), else damaged when it does not decode
    or ``check(index, values)`` says so. Chunk findings need only that chunk rewritten."""
    listing = _listing(arr)
    out = []
    for coords, key in chunk_keys(arr):
        index = int(np.ravel_multi_index(coords, arr.cdata_shape)) if coords else 0
        if key not in listing:
            out.append(Finding(name, MISSING, f"chunk {key}", index, whole=False))
            continue
        try:
            values = arr[_chunk_region(arr, coords)]
        except Exception as exc:  # a checksum or codec failure
            out.append(Finding(name, DAMAGED, f"chunk {key} ({_short(exc)})", index, False))
            continue
        err = check(index, values) if check is not None else None
        if err:
            out.append(Finding(name, DAMAGED, f"chunk {key} ({err})", index, whole=False))
    return out


def _digest_check(run_id, digests, strict: bool = False):
    """``check`` of :func:`_chunk_findings`: each chunk's values against its digest. Markers
    0 (not written) and 1 (no digest) pass, unless ``strict`` (a complete output whose run
    recorded its markers: every chunk has a digest)."""
    def check(index, values):
        want = int(digests[index]) if index < len(digests) else 0
        if want in (0, 1):
            return "its written-marker holds no digest" if strict else None
        if chunk_digest(run_id, index, values) == want:
            return None
        return ("its values do not match the digest written with them: changed since, or "
                "copied from another chunk or another run's output")
    return check


def _open(group, name: str):
    try:
        return group[name], None
    except KeyError:
        return None, None
    except Exception as exc:  # a garbled zarr.json of the member
        return None, exc


def _check_chunked(group, name: str, entry: dict) -> list[Finding]:
    arr, err = _open(group, name)
    markers_name = entry.get("markers")
    if arr is None:
        state = DAMAGED if err is not None else MISSING
        return [Finding(name, state, f"its metadata (zarr.json) {'is garbled' if err else 'is gone'}")]
    if entry.get("run_id") is not None and arr.attrs.get("run_id") != entry["run_id"]:
        return [Finding(name, FOREIGN, f"run id {arr.attrs.get('run_id')!r}, the run recorded "
                        f"{entry['run_id']!r}: copied from another output?")]
    layout = [list(arr.shape), list(arr.chunks), str(arr.dtype)]
    recorded = [entry.get("shape"), entry.get("chunks"), entry.get("dtype")]
    if any(r is not None and r != f for r, f in zip(recorded, layout)):
        return [Finding(name, DAMAGED, f"its shape, chunks and dtype are {layout}, the run "
                        f"recorded {recorded}: resized or replaced since")]
    marks_arr, err = _open(group, markers_name)
    if marks_arr is None:
        return [Finding(markers_name, DAMAGED if err else MISSING,
                        f"the written-markers of {name} {'are garbled' if err else 'are gone'}")]
    if marks_arr.attrs.get("run_id", arr.attrs.get("run_id")) != arr.attrs.get("run_id"):
        return [Finding(markers_name, FOREIGN, f"run id {marks_arr.attrs.get('run_id')!r}, "
                        f"not {name}'s: copied from another output?")]
    found = [Finding(markers_name, f.state, f.what) for f in _chunk_findings(markers_name,
                                                                              marks_arr, None)]
    if found:  # no marker can be trusted: every chunk is written again
        return found
    marks = np.asarray(marks_arr[...])
    if entry.get("sha256") and _markers_digest(arr.attrs.get("run_id"), arr.shape, arr.chunks,
                                               arr.dtype, marks) != entry["sha256"]:
        # the chunks whose marker changed are found below, against the markers as they are
        found.append(Finding(markers_name, DAMAGED, "the written-markers do not match the "
                             "digest the run recorded", whole=False))
    return found + _chunk_findings(name, arr, _digest_check(
        arr.attrs.get("run_id"), list(marks), strict=bool(entry.get("sha256"))))


def _check_digested(group, name: str, entry: dict) -> list[Finding]:
    arr, err = _open(group, name)
    if arr is None:
        return [Finding(name, DAMAGED if err else MISSING,
                        f"its metadata (zarr.json) {'is garbled' if err else 'is gone'}")]
    if list(arr.shape) != list(entry.get("shape", arr.shape)) or \
            list(arr.chunks) != list(entry.get("chunks", arr.chunks)):
        return [Finding(name, DAMAGED, f"its shape or chunks ({list(arr.shape)}, "
                        f"{list(arr.chunks)}) are not those written ({entry.get('shape')}, "
                        f"{entry.get('chunks')})")]
    return _chunk_findings(name, arr, _digest_check(entry.get("run_id"), entry["digests"]))


def _check_sealed(group, name: str, entry: dict | None, key: str) -> list[Finding]:
    g, err = _open(group, name)
    if g is None:
        return [Finding(name, DAMAGED if err else MISSING,
                        f"its metadata (zarr.json) {'is garbled' if err else 'is gone'}")]
    meta = g.attrs.get(key)
    if not isinstance(meta, dict):
        return [Finding(name, DAMAGED, "its attributes lost their description")]
    if meta.get("format", 3) >= 3 and not seal_holds(meta, key=ATTRS_DIGEST):
        return [Finding(name, DAMAGED, "its description (zarr.json) does not match the digest "
                        "saved with it")]
    try:
        keys = sorted(g.array_keys())
    except Exception as exc:  # an array's zarr.json garbled
        return [Finding(name, DAMAGED, f"an array's metadata is garbled ({_short(exc)})")]
    try:
        digest = arrays_digest({k: np.asarray(g[k][...]) for k in keys})
    except Exception:  # a chunk that does not decode: named below
        digest = None
    if digest is None or digest != meta.get("arrays_sha256"):
        found = []
        for k in keys:
            found += [Finding(f"{name}/{k}", f.state, f.what) for f in
                      _chunk_findings(f"{name}/{k}", g[k], None)]
        return found or [Finding(name, DAMAGED, "its arrays do not match the digest saved "
                                 "with them")]
    # the digest proves the values (an absent chunk of a model saved before every chunk
    # was stored held the fill value)
    if entry and entry.get("sha256") and digest != entry["sha256"]:
        return [Finding(name, FOREIGN, "its arrays' digest is not the one the run recorded: "
                        "copied from another output?")]
    return []


def check_members(group, members: dict, only=None) -> list[Finding]:
    """Every member of ``members`` (a manifest) in ``group``; ``only``: the names to check."""
    out = []
    for name, entry in members.items():
        if only is not None and name not in only:
            continue
        kind = entry.get("kind")
        if kind == "chunked":
            out += _check_chunked(group, name, entry)
        elif kind == "digested":
            out += _check_digested(group, name, entry)
        elif kind == "sealed":
            out += _check_sealed(group, name, entry, entry["key"])
    return out


def _read(fs, root: str, name: str) -> bytes:
    return fs.cat_file(f"{root.rstrip('/')}/{name}")


def _legacy_members(attrs: dict, report: dict | None) -> dict:
    """The members a complete OUTDIR written before manifests holds (from its config)."""
    from .persistence import MODEL_KEY

    report = report or {}
    members = {"embedding": {"kind": "chunked", "markers": "embedding_written",
                             "run_id": report.get("embedding_run_id"),
                             "shape": ([report["n_samples"], report["n_components"]]
                                       if "n_samples" in report and "n_components" in report
                                       else None)}}
    config = attrs.get("config") or {}
    estimator = config.get("estimator")
    if isinstance(estimator, dict) and estimator.get("affinity") == "representatives":
        members["labels"] = {"kind": "chunked", "markers": "labels_written"}
        members["representatives_model"] = {"kind": "sealed", "key": REPRESENTATIVES_KEY}
    elif estimator is not None:
        members["model"] = {"kind": "sealed", "key": MODEL_KEY,
                            "sha256": report.get("model_sha256")}
    return members


def audit(path, *, deep: bool = True, only=None) -> tuple[list[Finding], dict | None]:
    """Check the OUTDIR at ``path`` against the manifest its run recorded.

    Returns ``(findings, run attributes)``; no findings for an OUTDIR whose run is not
    complete, or a group that is no run (the attributes are then None). ``deep``: also
    every chunk of the arrays outside the manifest (the checkpoint: missing, or failing to
    decode). ``only``: check only these members (``report.json`` included by name).
    Raises :class:`~ooc_spectral.exceptions.DamagedFileError` when OUTDIR's own
    ``zarr.json`` is garbled (nothing can tell which run it held).
    """
    import zarr

    from .checkpoint import RUN_KEY, record_edited
    from .safety import read_json_file
    from .storage import filesystem, join

    text = os.fspath(path)
    fs, root = filesystem(text)
    if hasattr(fs, "invalidate_cache"):
        fs.invalidate_cache(root)
    try:
        meta = read_json_file(lambda: _read(fs, root, "zarr.json"), join(text, "zarr.json"),
                              "it holds the run's configuration and status: restore it, or "
                              f"delete {text} and run the command again")
    except FileNotFoundError:
        return [], None
    attrs = (meta.get("attributes") or {}).get(RUN_KEY) if isinstance(meta, dict) else None
    if not isinstance(attrs, dict) or attrs.get("status") != "complete":
        return [], attrs
    findings, report = [], None
    if record_edited(attrs):
        findings.append(Finding("zarr.json", DAMAGED, "the run's recorded configuration was "
                                "edited: it no longer matches its digest (config_hash)"))
    try:
        blob = _read(fs, root, REPORT)
        report = json.loads(blob)
        if not isinstance(report, dict):
            raise ValueError("not an object")
        recorded = attrs.get(REPORT_DIGEST)
        if report.get("config_hash") != attrs.get("config_hash"):
            findings.append(Finding(REPORT, FOREIGN, "not the report of this run"))
            report = None
        elif recorded and hashlib.sha256(blob).hexdigest() != recorded:
            findings.append(Finding(REPORT, DAMAGED, "changed since the run wrote it"))
    except FileNotFoundError:
        findings.append(Finding(REPORT, MISSING, "the run's report"))
    except (OSError, ValueError):
        findings.append(Finding(REPORT, DAMAGED, "not valid JSON"))
        report = None
    if only is not None and REPORT not in only:
        findings = []
    members = attrs.get(MEMBERS_KEY) or _legacy_members(attrs, report)
    group = zarr.open_group(text, mode="r")
    findings += check_members(group, members, only)
    if deep:
        findings += _other_arrays(group, set(members)) + _foreign_parts(group, attrs)
    return findings, attrs


def _foreign_parts(group, attrs: dict) -> list[Finding]:
    """The checkpoint parts sealed by another run than OUTDIR's (``run_id``): copied in from
    another OUTDIR of the same configuration, they would be discarded by the resumed run."""
    run, found = attrs.get("run_id"), []
    try:
        ck = group["checkpoint"] if run is not None and "checkpoint" in group else None
        scan = ck.attrs.get("scan") if ck is not None else None
        if scan and scan.get("run") != run:
            found.append(Finding(f"checkpoint/{scan.get('slot')}", FOREIGN, "another run's"))
        for name, part in (ck["partials"].groups() if ck and "partials" in ck else ()):
            if (part.attrs.get("partial") or {}).get("run", run) != run:
                found.append(Finding(f"checkpoint/partials/{name}", FOREIGN, "another run's"))
    except Exception:  # a garbled part: the walk over the checkpoint names it
        pass
    return found


def _other_arrays(group, covered: set) -> list[Finding]:
    """Missing and undecodable chunks of the arrays outside the manifest (the checkpoint);
    a group whose metadata cannot be read is one damaged finding."""
    import zarr

    out = []

    def walk(g, prefix):
        try:
            members = sorted(g.members(), key=lambda kv: kv[0])
        except Exception as exc:  # a garbled zarr.json below: the part is damaged
            out.append(Finding(prefix.rstrip("/") or ".", DAMAGED, _short(exc)))
            return
        for name, node in members:
            full = f"{prefix}{name}"
            if isinstance(node, zarr.Group):
                walk(node, f"{full}/")
            else:
                out.extend(Finding(full, f.state, f.what)
                           for f in _chunk_findings(full, node, None))

    import warnings

    with warnings.catch_warnings():  # report.json, .lock: not zarr nodes
        warnings.simplefilter("ignore")
        for name in OTHER_GROUPS:
            g, err = _open(group, name)
            if err is not None:
                out.append(Finding(name, DAMAGED, _short(err)))
            elif g is not None and isinstance(g, zarr.Group):
                walk(g, f"{name}/")
    return out


def has_manifest(path, keys) -> bool:
    """Whether the group at ``path`` carries a writer's manifest under one of ``keys``."""
    import zarr

    try:
        attrs = zarr.open_group(os.fspath(path), mode="r").attrs
    except Exception:
        return False
    return any(isinstance((attrs.get(k) or {}).get(MEMBERS_KEY), dict) for k in keys)


def seal_description(fields: dict) -> dict:
    """A data set's complete description (its writer's attribute: parameters, seed,
    centres, source, ``complete``, the manifest) with its own digest (:data:`ATTRS_DIGEST`):
    an edited field is damage, as a changed chunk is."""
    return sealed(fields, key=ATTRS_DIGEST)


def description_damaged(meta) -> bool:
    """Whether a data set's description carries a manifest or a digest of itself but does
    not match that digest (edited since: a field changed, the manifest or the digest
    removed). A description with neither, of a writer that recorded none, is not checked."""
    return isinstance(meta, dict) and (MEMBERS_KEY in meta or ATTRS_DIGEST in meta) and \
        not seal_holds(meta, key=ATTRS_DIGEST)


def recorded_digests(meta, name: str) -> dict | None:
    """The manifest entry (``kind`` ``digested``: run id, shape, chunks, per-chunk digests)
    the writer of a complete data set recorded for its array ``name``, or None (no
    manifest). Raises ``ValueError`` saying what is wrong when the description was edited
    since (:func:`description_damaged`) or records no entry for ``name``."""
    if description_damaged(meta):
        raise ValueError("its description (the writer's attribute in zarr.json) does not "
                         "match the digest written with it: edited since")
    if not isinstance(meta, dict) or not isinstance(meta.get(MEMBERS_KEY), dict):
        return None
    entry = meta[MEMBERS_KEY].get(name)
    if not isinstance(entry, dict) or entry.get("kind") != "digested":
        raise ValueError(f"its manifest records no digests of the array {name!r}")
    return entry


def audit_dataset(path, key: str, only=None) -> list[Finding]:
    """Check a data set (``make-data``, ``import``) against the digests its writer recorded
    under ``key``, its description included (none for a data set written before digests
    were). ``path``: its location or its open group; ``only``: the arrays to check."""
    import zarr

    group = path if isinstance(path, zarr.Group) else zarr.open_group(os.fspath(path), mode="r")
    meta = group.attrs.get(key) or {}
    found = []
    if description_damaged(meta):
        found.append(Finding(f"zarr.json ({key})", DAMAGED, "the data set's description "
                             "does not match the digest written with it: edited since"))
    members = meta.get(MEMBERS_KEY) if isinstance(meta, dict) else None
    return found + (check_members(group, members, only) if isinstance(members, dict) else [])
