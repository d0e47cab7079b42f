"""Integrity of inputs and outputs: fingerprints, checksums, chunk audits, ``verify``.

Inputs
    :func:`input_fingerprint` describes a zarr input cheaply, without reading its
    values: a digest of its metadata and of the listing of its chunk objects
    (key, size, modification and change times and inode, or the ETag/mtime an object
    store gives: a rewrite whose modification time was restored still moves the change
    time).
    A batch job records it and compares it before it reports "already complete"
    or resumes, so a replaced input is never answered with yesterday's result or
    mixed with it. The listing also shows chunks that do not exist: zarr reads
    a missing chunk as the fill value, which for an input would be silent
    zeros, so :func:`input_fingerprint` raises :class:`MissingChunkError`
    naming the first missing chunk.

Outputs
    Every array ooc_spectral writes (embedding, model, checkpoint) carries a
    CRC-32C checksum per chunk (zarr v3's ``crc32c`` codec, :func:`checksummed`):
    a flipped bit makes the read fail instead of returning 1.6e308. Models and
    checkpoint parts also record a SHA-256 of their arrays' values
    (:func:`arrays_digest`), which catches deleted chunk files (read back as the
    fill value) as well. :func:`~ooc_spectral.io.verify.verify_group` re-reads
    every chunk of every array of an output and lists the missing and damaged ones
    (``ooc-spectral verify OUTDIR``), from these pieces.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
from pathlib import Path

import numpy as np

from ..exceptions import MissingChunkError

__all__ = ["checksummed", "arrays_digest", "input_fingerprint", "chunk_keys",
           "missing_chunks", "damaged_chunks", "fingerprint_changes", "unwritten_inner_chunks",
           "absent_chunks_are_fill", "storing_every_chunk", "COMPLETE_ATTR", "InputWatch",
           "file_fingerprint"]

#: Attribute (on an input array or its group) by which a user says the data are complete:
#: chunks that have no object are fill values by intent (zarr's ``write_empty_chunks``).
COMPLETE_ATTR = "ooc_spectral_complete"


def checksummed() -> dict:
    """Keyword arguments of ``create_array`` that give every chunk a CRC-32C checksum, and
    store every chunk written, even one equal to the fill value (zarr leaves those out by
    default, and a missing chunk must mean damage: an all-zero array of a model was)."""
    from zarr.codecs import Crc32cCodec

    return {"compressors": [Crc32cCodec()], "config": {"write_empty_chunks": True}}


def storing_every_chunk(arr):
    """``arr`` (an opened ``zarr.Array``) set to store every chunk written, even one equal
    to the fill value: :func:`checksummed`'s ``write_empty_chunks`` is a runtime setting
    that an array opened again does not keep (a worker's handle left an embedding chunk of
    NaN out, and it read as never written). Per array: zarr's global setting would reach
    every thread of the process."""
    import zarr

    if hasattr(arr, "with_config"):  # zarr >= 3.1.6
        return arr.with_config({"write_empty_chunks": True})
    a = arr._async_array  # the same array, constructed again with its own configuration
    return zarr.Array(zarr.AsyncArray(a.metadata, a.store_path,
                                      config={"write_empty_chunks": True}))


def arrays_digest(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over the names, dtypes, shapes and values of ``arrays`` (sorted by name)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        h.update(value.tobytes())
    return h.hexdigest()


def record_digest(arrays: dict[str, np.ndarray], fields: dict) -> str:
    """SHA-256 of a saved record: its arrays (:func:`arrays_digest`) and the JSON fields
    saved beside them (canonical JSON), so that a changed scalar is caught as surely as a
    changed array value."""
    import json

    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{arrays_digest(arrays)}|{blob}".encode()).hexdigest()


def sealed(fields: dict, arrays: dict | None = None, key: str = "sha256") -> dict:
    """``fields`` with their :func:`record_digest` (and that of ``arrays``) under ``key``:
    the JSON record a checkpoint part, the scan pointer or a model's description saves."""
    return fields | {key: record_digest(arrays or {}, fields)}


def seal_holds(record: dict, arrays: dict | None = None, key: str = "sha256") -> bool:
    """Whether a record saved by :func:`sealed` (with these ``arrays``) is as it was."""
    fields = {k: v for k, v in record.items() if k != key}
    return record.get(key) == record_digest(arrays or {}, fields)


# --------------------------------------------------------------------------- #
# chunk keys and store listings
# --------------------------------------------------------------------------- #
def _local_root(store) -> Path | None:
    """The directory of a local store (looking through wrapper stores), else None."""
    from zarr.storage import LocalStore

    seen = 0
    while store is not None and seen < 8:
        if isinstance(store, LocalStore):
            return Path(store.root)
        store = getattr(store, "_store", None)
        seen += 1
    return None


def _array_prefix(arr) -> str:
    path = arr.path or ""
    return f"{path}/" if path else ""


def chunk_keys(arr) -> list[tuple[tuple[int, ...], str]]:
    """Every chunk (or shard) of ``arr``: its grid coordinates and store key."""
    grid = arr.cdata_shape if getattr(arr, "shards", None) is None else tuple(
        -(-s // c) for s, c in zip(arr.shape, arr.shards))
    prefix = _array_prefix(arr)
    return [(coords, prefix + arr.metadata.encode_chunk_key(coords))
            for coords in itertools.product(*(range(g) for g in grid))]


def _walk_following_links(base: Path):
    """``(dirpath, files)`` of every directory under ``base``, symbolic links to
    directories followed, as zarr follows them when it reads (a chunk directory moved to
    another volume and linked back is read through the link, so it is listed and
    fingerprinted through it too); each directory once, so a link cycle ends."""
    seen: set[tuple[int, int]] = set()
    for dirpath, dirs, files in os.walk(base, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            dirs[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        yield dirpath, files


def _listing(arr) -> dict[str, tuple]:
    """Key -> (size, mtime or ETag) of every object under the array's prefix."""
    prefix = _array_prefix(arr)
    root = _local_root(arr.store)
    out: dict[str, tuple] = {}
    if root is not None:
        base = root / prefix if prefix else root
        for dirpath, files in _walk_following_links(base):
            for f in files:
                p = Path(dirpath) / f
                try:
                    st = p.stat()
                except OSError:
                    continue
                # the change time and the inode too: a rewrite whose modification time was
                # put back (touch -r, os.utime) still moves the change time, which no call
                # but the kernel's sets; a file replaced by another has another inode
                out[str(p.relative_to(root)).replace(os.sep, "/")] = (
                    st.st_size, f"{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}")
        return out
    fs = getattr(arr.store, "fs", None)
    if fs is not None:  # fsspec: sizes and ETag or modification time in one listing
        spath = str(getattr(arr.store, "path", "")).rstrip("/")
        full = f"{spath}/{prefix}".rstrip("/")
        if hasattr(fs, "invalidate_cache"):  # a listing cached by this process may be stale
            fs.invalidate_cache(full)
        if getattr(fs, "asynchronous", False):  # zarr's async instance: on zarr's loop
            from zarr.core.sync import sync

            found = sync(fs._find(full, detail=True))
        else:
            found = fs.find(full, detail=True)
        for key, info in found.items():
            rel = key[len(spath):].lstrip("/") if key.startswith(spath) else key
            stamp = info.get("ETag") or info.get("etag") or info.get("mtime") or \
                info.get("LastModified") or info.get("last_modified") or info.get("updated")
            out[rel] = (int(info.get("size") or 0), str(stamp))
        return out
    from zarr.core.sync import sync

    async def collect():
        keys = [k async for k in arr.store.list_prefix(prefix)]
        return {k: (await arr.store.getsize(k), None) for k in keys}

    return sync(collect())


def missing_chunks(arr, listing: dict | None = None) -> list[tuple[tuple[int, ...], str]]:
    """The chunks of ``arr`` that have no object in the store."""
    listing = _listing(arr) if listing is None else listing
    return [(c, k) for c, k in chunk_keys(arr) if k not in listing]


def _chunk_region(arr, coords) -> tuple[slice, ...]:
    shape = arr.shards if getattr(arr, "shards", None) is not None else arr.chunks
    return tuple(slice(c * s, min((c + 1) * s, n)) for c, s, n in zip(coords, shape, arr.shape))


def damaged_chunks(arr, coords_list=None, check=None) -> list[tuple[tuple[int, ...], str, str]]:
    """The chunks of ``arr`` that fail to decode (checksum, codec): (coords, key, error).

    ``check(coords, values)``, if given, sees each chunk that decodes and returns an
    error string for one whose values are wrong (None otherwise): each chunk is read once.
    """
    out = []
    for coords, key in (chunk_keys(arr) if coords_list is None else coords_list):
        try:
            values = arr[_chunk_region(arr, coords)]
        except Exception as exc:  # a checksum or codec failure inside zarr
            out.append((coords, key, f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"))
            continue
        err = check(coords, values) if check is not None else None
        if err:
            out.append((coords, key, err))
    return out


#: A written-marker without a digest: chunks of output arrays marked by writers that do
#: not digest them (and OUTDIRs written before markers carried digests).
UNDIGESTED = 1


def chunk_digest(run_id: str | None, index: int, values: np.ndarray) -> int:
    """A 64-bit digest of output chunk ``index``'s values, keyed by the run: its written
    marker (top bit set, so never 0, "not written", nor :data:`UNDIGESTED`). A chunk
    copied from another run's output, or changed since, does not match it, though it
    decodes and passes its checksum."""
    h = hashlib.blake2b(np.ascontiguousarray(values), digest_size=8,  # its buffer: no copy
                        key=f"{run_id}:{int(index)}".encode()[:64])
    return int.from_bytes(h.digest(), "little") | (1 << 63)


def digest_check(run_id: str | None, marks: np.ndarray):
    """The ``check`` of :func:`damaged_chunks` for the chunks of a 1-D-chunked output
    whose written markers are ``marks`` (chunks marked :data:`UNDIGESTED` pass)."""
    def check(coords, values):
        mark = int(marks[coords[0]])
        if mark in (0, UNDIGESTED) or chunk_digest(run_id, coords[0], values) == mark:
            return None
        return ("its values do not match the digest written with them (a chunk of another "
                "run's output, or changed since)")
    return check


# --------------------------------------------------------------------------- #
# input fingerprint
# --------------------------------------------------------------------------- #
def input_fingerprint(arr, url: str | None = None) -> dict:
    """Fingerprint of a zarr input: metadata digest plus chunk listing digest.

    Raises :class:`MissingChunkError` naming the first chunk without an object, or the
    first inner chunk a shard's index lists as never written (either would read as fill
    values), unless the data say that absent chunks are fill values by intent
    (:func:`absent_chunks_are_fill`): zarr does not write a chunk that is all fill value
    (``write_empty_chunks=False``, its default), so complete data may lack some.
    """
    listing = _listing(arr)
    missing = missing_chunks(arr, listing)
    where = url or str(arr.store_path)
    if missing or getattr(arr, "shards", None) is not None:
        unwritten = unwritten_inner_chunks(arr, listing) if not missing else []
        if (missing or unwritten) and absent_chunks_are_fill(arr, url) is None:
            how = (f"if the writer left them out because they are all fill value "
                   f"({arr.metadata.fill_value!r}; zarr's write_empty_chunks=False), mark the "
                   f"data complete: set the attribute {COMPLETE_ATTR} = true on the array or "
                   "its group (zarr.open_group(PATH).attrs[" f"{COMPLETE_ATTR!r}" "] = True); "
                   "otherwise restore or regenerate the input")
            if missing:
                coords, key = missing[0]
                rows = _chunk_region(arr, coords)[0]
                raise MissingChunkError(
                    f"chunk {key!r} (rows {rows.start}-{rows.stop - 1}) of the input {where} "
                    f"does not exist ({len(missing)} of {len(chunk_keys(arr))} chunks are "
                    f"missing); zarr would read it as fill values: {how}")
            key, start, stop = unwritten[0]
            raise MissingChunkError(
                f"shard {key!r} of the input {where} lists {len(unwritten)} inner chunk(s) as "
                f"never written (the first holds rows {start}-{stop - 1}; a writer stopped "
                f"mid-shard?); zarr would read them as fill values: {how}")
    meta = json.dumps(arr.metadata.to_dict(), sort_keys=True, default=str)
    if os.environ.get("OOC_SPECTRAL_FINGERPRINT", "").strip().lower() == "content":
        listing = _content_listing(arr, listing)  # every byte read: nothing can fool it
    h = hashlib.sha256()
    for key in sorted(listing):
        size, stamp = listing[key]
        h.update(f"{key}|{size}|{stamp}\n".encode())
    return {
        "metadata_sha256": hashlib.sha256(meta.encode()).hexdigest(),
        "listing_sha256": h.hexdigest(),
        "n_objects": len(listing),
        "bytes": int(sum(int(v[0] or 0) for v in listing.values())),
        "newest": max((int(str(v[1]).split(":")[0]) for v in listing.values()
                       if str(v[1]).split(":")[0].isdigit()), default=None),
    }


def fingerprint_changes(old: dict | None, new: dict | None) -> list[str]:
    """What differs between two fingerprints, in words (empty when they agree)."""
    if not old or not new:
        return []
    out = []
    if old.get("metadata_sha256") != new.get("metadata_sha256"):
        out.append("its metadata")
    if old.get("listing_sha256") != new.get("listing_sha256"):
        what = "its chunk objects (sizes, modification or change times, or files replaced)"
        if old.get("bytes") != new.get("bytes"):
            what += f", {old.get('bytes')} -> {new.get('bytes')} bytes"
        out.append(what)
    return out


class InputWatch:
    """The input's fingerprint, taken when a command starts and checked when it ends.

    ``take()`` returns the fingerprint (:func:`input_fingerprint` of a zarr input,
    :func:`file_fingerprint` of a table ``import`` reads; None where there is none).
    :meth:`check` raises :class:`~ooc_spectral.exceptions.InputChangedError` (exit 1)
    when it moved: a writer changed the input while the command read it, and the output
    would mix two inputs, so it is never marked complete. Every command that writes an
    OUTDIR or a data set from an input calls it last, before its completion marker.
    """

    def __init__(self, take, where):
        self.take, self.where = take, where
        self.fingerprint = take()

    def check(self) -> None:
        error = self.changed()
        if error is not None:
            raise error

    def changed(self):
        """The :class:`~ooc_spectral.exceptions.InputChangedError` to raise when the input
        moved since the start, else None."""
        from ..exceptions import InputChangedError

        if self.fingerprint is None:
            return None
        changes = fingerprint_changes(self.fingerprint, self.take())
        if not changes:
            return None
        return InputChangedError(
            f"the input {self.where} changed while this run read it ({'; '.join(changes)}), "
            "so its result would mix two inputs and is not marked complete; let the writer "
            "finish, then run the same command again: it starts clean on the input as it "
            "is then")

    def explain(self, exc: BaseException) -> BaseException:
        """The error to report for ``exc``, raised while the input was read: an input
        rewritten under a reader shows as whatever the reader met (a row cut in two, a
        chunk that does not decode or match its digest, a non-finite value), which would
        blame the data (exit 2) for what a rerun cures; when the input moved, the answer
        is :class:`~ooc_spectral.exceptions.InputChangedError` (exit 1). Interruptions
        and an input that cannot be fingerprinted again are left as they are."""
        from ..exceptions import InputChangedError

        if not isinstance(exc, Exception) or isinstance(exc, InputChangedError):
            return exc
        try:
            changed = self.changed()
        except Exception:  # the input gone or unreadable now: the original error says it
            return exc
        if changed is None:
            return exc
        changed.__cause__ = exc
        return changed

    @contextlib.contextmanager
    def guard(self):
        """Run the block that reads the input; an error in it is :meth:`explain` ed."""
        try:
            yield self
        except BaseException as exc:
            error = self.explain(exc)
            if error is exc:
                raise
            raise error from exc


def file_fingerprint(path) -> dict:
    """Fingerprint of one local file (a table ``import`` reads), in the form of
    :func:`input_fingerprint`: its size, modification and change times and inode."""
    st = os.stat(path)
    stamp = f"{os.fspath(path)}|{st.st_size}|{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
    return {"metadata_sha256": "", "listing_sha256": hashlib.sha256(stamp.encode()).hexdigest(),
            "n_objects": 1, "bytes": int(st.st_size), "newest": int(st.st_mtime_ns)}


# --------------------------------------------------------------------------- #
# absent chunks: missing pieces, or fill values by intent
# --------------------------------------------------------------------------- #
def unwritten_inner_chunks(arr, listing: dict | None = None) -> list[tuple[str, int, int]]:
    """Inner chunks inside the array's extent that a shard's index lists as never written:
    ``(shard key, first row, last row + 1)`` each. One read of each shard's index."""
    from zarr.codecs import ShardingCodec
    from zarr.core.sync import sync
    from zarr.storage import StorePath

    codec = next((c for c in arr.metadata.codecs if isinstance(c, ShardingCodec)), None)
    if codec is None:
        return []
    shards, inner, shape = tuple(arr.shards), tuple(codec.chunk_shape), tuple(arr.shape)
    per_shard = tuple(s // c for s, c in zip(shards, inner))
    out = []
    for coords, key in chunk_keys(arr):
        if listing is not None and key not in listing:
            continue  # a missing shard: reported by missing_chunks
        index = sync(codec._load_shard_index_maybe(StorePath(arr.store, key), per_shard))
        if index is None:
            continue
        written = index.get_full_chunk_map()
        for local in itertools.product(*(range(p) for p in per_shard)):
            start = [sc * sh + lc * ic for sc, sh, lc, ic in zip(coords, shards, local, inner)]
            if any(a >= n for a, n in zip(start, shape)) or written[local]:
                continue
            out.append((key, start[0], min(start[0] + inner[0], shape[0])))
    return out


def absent_chunks_are_fill(arr, url: str | None = None) -> str | None:
    """Why the absent chunks of ``arr`` are fill values by intent, or None.

    The array or its group carries :data:`COMPLETE_ATTR` = true: its writer (or the
    user) says the data are complete, so a chunk without an object is one zarr left
    out because it was all fill value (``write_empty_chunks=False``). This tool's own
    writers (``make-data``, ``import``) write every chunk, so a chunk missing from
    their data is damage, whatever their ``complete`` marker says.
    """
    found = [dict(arr.attrs)]
    if url and "/" in url.rstrip("/"):
        import zarr

        from .storage import is_url, options_for

        parent = url.rstrip("/").rsplit("/", 1)[0]
        extra = {"storage_options": options_for(parent)} if is_url(parent) else {}
        try:
            found.append(dict(zarr.open_group(parent, mode="r", **extra).attrs))
        except Exception:  # no group above the array
            pass
    for attrs in found:
        if attrs.get(COMPLETE_ATTR) is True:
            return f"its attribute {COMPLETE_ATTR} = true"
    return None


def _content_listing(arr, listing: dict) -> dict:
    """``listing`` with each object's stamp replaced by the SHA-256 of its bytes (the input
    fingerprint with ``OOC_SPECTRAL_FINGERPRINT=content``: a full read of the input)."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    out = {}
    for key, (size, _) in listing.items():  # keys relative to the store's root
        buf = sync(arr.store.get(key, default_buffer_prototype()))
        digest = hashlib.sha256(buf.to_bytes()).hexdigest() if buf is not None else None
        out[key] = (size, f"sha256:{digest}")
    return out
