"""Resumable runs: the output directory, its lock, its checkpoint and its marker.

An output directory (OUTDIR) of ``ooc-spectral fit`` is one zarr group::

    OUTDIR/
      zarr.json             attributes: ooc_spectral_run = {config, config_hash, status, ...}
      .lock                 JSON {pid, host, started, ...} while a run holds it
      embedding/            n x p float64, chunks aligned with the input rows
      embedding_written/    one marker per embedding chunk
      checkpoint/           scan state (two slots), finished pass-2 segment partials
      model/                the saved model (GreedySpectralEmbedding.load reads it)
      report.json           the run's report

The run's ``status`` attribute is ``"running"`` from the start and becomes
``"complete"`` only after the model and ``report.json`` are written: the
completion marker is written last, so a half-written OUTDIR is never taken for
a finished one.

The scan state is written to one of two slots (``scan_a``, ``scan_b``) and the
checkpoint group's attributes point to the slot last written completely; zarr's
local store replaces every key atomically, so a run killed at any moment
(SIGKILL included) leaves either the old or the new pointer, each naming a
complete slot.

OUTDIR may also be a URL (``s3://bucket/run``, ``gs://...``; see
:mod:`ooc_spectral.io.storage`): the same layout as objects. The lock is then an
object created with a conditional write and kept alive by a lease
(:class:`~ooc_spectral.io.storage.ObjectLock`); ``report.json`` and every
attribute write are single PUTs, which object stores apply atomically, so the
order of writes above (the completion marker last) holds there too.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import logging
import os
import socket
from pathlib import Path

import numpy as np
import zarr

from ..exceptions import ConfigurationMismatchError, LockedError, OutputNotWritableError
from . import strict_json
from .integrity import checksummed, seal_holds, sealed
from .zarr_nodes import new_array, new_group
from .safety import bare_group_meta as _bare_group_meta
from .safety import classify_outdir, open_nofollow, remove_members_marker_last, write_file_atomic
from .safety import unfinished_beginning as _unfinished_beginning
from ..core.scan.state import DictionaryState

__all__ = ["RunDirectory", "RunCheckpoint", "config_hash", "record_edited", "RUN_KEY"]

log = logging.getLogger("ooc_spectral")

RUN_KEY = "ooc_spectral_run"
LOCK_NAME = ".lock"
REPORT_NAME = "report.json"


def config_hash(config: dict) -> str:
    """SHA-256 of the canonical JSON of a resolved configuration."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def record_edited(attrs: dict) -> bool:
    """True when a run's recorded configuration no longer matches its own digest."""
    return config_hash(attrs.get("config") or {}) != attrs.get("config_hash")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def local_output_path(path) -> Path:
    """``path`` as a local directory (``file://`` removed).

    A URL is refused with :class:`~ooc_spectral.exceptions.StorageBackendError`
    (never turned into a local directory named ``s3:/bucket/...``): callers that
    accept URLs use :func:`ooc_spectral.io.storage.check_location` instead.
    """
    from .storage import check_location, is_url

    text = check_location(path, "output")
    if is_url(text):
        from ..exceptions import StorageBackendError

        raise StorageBackendError(f"output {text!r} is a URL where a local directory is needed")
    return Path(text[len("file://"):] if text.startswith("file://") else text)


class RunCheckpoint:
    """Checkpoint of one run, in ``OUTDIR/checkpoint`` (implements the pipeline's protocol).

    Parameters
    ----------
    group : zarr.Group
        The checkpoint group.
    every : int
        Windows of the scan between two saves of its state.
    run : str, optional
        The run's id, sealed into each part: another run's part is discarded as damaged.
    """

    def __init__(self, group, every: int = 4, run: str | None = None):
        self.group, self.run, self.every = group, run, max(1, int(every))
        self.loaded_partials, self.discarded_partials, self._parts = 0, 0, None

    # -- scan -------------------------------------------------------------- #
    def load_scan(self) -> dict | None:
        """The last scan state saved, or None to start the scan over.

        A slot that is missing, unreadable or does not match the digest saved
        with it (a deleted or garbled chunk) is discarded with a log line: the
        scan starts over instead of failing on every rerun.
        """
        meta = self.group.attrs.get("scan")
        if not meta:
            return None
        try:
            slot = self.group[meta["slot"]]
            out = {k: np.asarray(slot[k][...]) for k in ("points", "indices", "L", "w")}
            if not seal_holds(meta, out):
                raise ValueError("the arrays and fields do not match the digest saved with them")
            self._check_run(meta)
        except Exception as exc:  # a deleted, truncated or garbled part
            log.warning("the checkpoint's scan state (%s) is damaged (%s: %s); discarding it "
                        "and scanning again", meta.get("slot"), type(exc).__name__,
                        " ".join(str(exc).split())[:200])
            return None
        out.update(windows_done=int(meta["windows_done"]), tol=float(meta["tol"]),
                   prefix_done=bool(meta.get("prefix_done", False)))
        return out

    def save_scan(self, state: DictionaryState, windows_done: int, tol: float, *,
                  prefix_done: bool = False) -> None:
        meta = self.group.attrs.get("scan") or {}
        slot_name = "scan_b" if meta.get("slot") == "scan_a" else "scan_a"
        slot = self.group.require_group(slot_name)
        values = {name: np.ascontiguousarray(value) for name, value in (
            ("points", state.points), ("indices", state.indices), ("L", state.L),
            ("w", state.w))}
        for name, value in values.items():  # on a store rooted at it: no parent checked
            new_array(slot, name, value, chunks=tuple(max(1, s) for s in value.shape) or (1,),
                      overwrite=True, **checksummed())
        # the pointer is written last, atomically
        fields = {"slot": slot_name, "windows_done": int(windows_done), "tol": float(tol),
                  "size": int(state.size), "prefix_done": bool(prefix_done), "time": _now(),
                  "run": self.run}
        self.group.attrs["scan"] = sealed(fields, values)

    def _check_run(self, meta: dict) -> None:
        if self.run is not None and meta.get("run") != self.run:
            raise ValueError(f"it is another run's ({meta.get('run')!r}, not {self.run!r})")

    # -- pass-2 partials --------------------------------------------------- #
    def _partial_name(self, stage: str, segment: int) -> str:
        return f"{stage}_{segment:06d}"

    def _partials(self):  # made once, not opened again (a request or two) for every part
        self._parts = self.group.require_group("partials") if self._parts is None else self._parts
        return self._parts

    def load_partial(self, stage: str, segment: int) -> dict | None:
        """A finished segment's partial sums, or None to compute them (again).

        A part that is missing, unreadable or does not match the digest saved
        with it is discarded with a log line and recomputed.
        """
        name = self._partial_name(stage, segment)
        try:
            parts = self._partials()
            if name not in parts:
                return None
            g = parts[name]
            meta = g.attrs.get("partial")
            if not meta:  # written partly when the run stopped
                return None
            arrays = {key: np.asarray(g[key][...]) for key in g.array_keys()}
            missing = set(meta.get("arrays", arrays)) - set(arrays)
            if missing:
                raise KeyError(f"arrays {sorted(missing)} are missing")
            if not seal_holds(meta, arrays):  # the scalars too: they become the certificate
                raise ValueError("the arrays and scalars do not match the digest saved with them")
            if meta.get("part", name) != name:  # another segment's part moved here
                raise ValueError(f"it holds the part {meta.get('part')!r}")
            self._check_run(meta)
        except Exception as exc:  # a deleted, truncated or garbled part
            log.warning("checkpoint part %s is damaged (%s: %s); discarding it and computing "
                        "that segment again", name, type(exc).__name__,
                        " ".join(str(exc).split())[:200])
            self.discarded_partials += 1
            return None
        out = dict(meta["scalars"])
        out.update(arrays)
        self.loaded_partials += 1
        return out

    def save_partial(self, stage: str, segment: int, partial: dict) -> None:
        parts, name = self._partials(), self._partial_name(stage, segment)
        if name in parts:  # a damaged part being replaced: start from an empty group
            del parts[name]
        g = new_group(parts, name)  # on a store rooted at it: zarr checks no parent per array
        scalars, arrays = {}, {}
        for key, value in partial.items():
            if isinstance(value, np.ndarray):
                arrays[key] = value
                new_array(g, key, value, overwrite=True, **checksummed())
            else:
                scalars[key] = value.item() if isinstance(value, np.generic) else value
        fields = {"scalars": scalars, "arrays": sorted(arrays), "part": name, "run": self.run}
        g.attrs["partial"] = sealed(fields, arrays)


class RunDirectory:
    """An OUTDIR: lock, configuration check, status, checkpoint, report.

    Parameters
    ----------
    path : str or Path
        Local path or URL (``s3://bucket/run``) of the output group.
    """

    def __init__(self, path):
        from .storage import check_location, filesystem, is_url

        text = check_location(path, "output")  # an unknown scheme or missing backend: exit 2
        self.remote = is_url(text)
        if self.remote:
            self.path = text.rstrip("/")  # a URL: str, joined with "/"
            self.fs, self._fspath = filesystem(self.path)
        else:
            self.path = local_output_path(text)
        self._locked, self._lock_fd, self._object_lock = False, None, None

    @property
    def url(self) -> str:
        """Where OUTDIR is: an absolute local path, or the URL."""
        return self.path if self.remote else str(self.path.resolve())

    def join(self, *names: str) -> str:
        """The location of a member of OUTDIR (a local path or a URL)."""
        from .storage import join

        return join(self.url, *names)

    def _key(self, name: str) -> str:
        return f"{self._fspath.rstrip('/')}/{name}"

    # -- lock -------------------------------------------------------------- #
    @property
    def lock_path(self) -> Path:
        return self.path / LOCK_NAME

    def acquire(self, description: str = "") -> None:
        """Take the lock, or raise :class:`LockedError` naming the live holder.

        The lock is an advisory ``flock`` on ``OUTDIR/.lock`` held by this
        process for the whole run: the kernel releases it when the process
        ends, however it ends (SIGKILL included), so a lock is never stale and
        neither PID reuse nor another host name or container can keep a dead
        run's lock alive, and two processes can never both hold it (the
        kernel's lock is the only arbiter; the file's JSON content only names
        the holder in messages). On NFS this relies on the server's lock
        manager, which releases a crashed client's locks when its lease expires.

        On object storage the lock is :class:`~ooc_spectral.io.storage.ObjectLock`
        (a conditional create, a lease renewed while the run lives).
        """
        if self.remote:
            from .storage import ObjectLock

            lock = ObjectLock(self.join(LOCK_NAME), self.fs, self._key(LOCK_NAME))
            lock.acquire(description)
            self._object_lock = lock
            self._locked = True
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputNotWritableError(
                f"cannot create the output directory {str(self.path)!r}: {exc}; choose a "
                "writable location"
            ) from exc
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now(),
              "command": description}
        for _ in range(100):
            try:
                fd = open_nofollow(self.lock_path, os.O_RDWR | os.O_CREAT)
            except OutputNotWritableError:
                raise
            except OSError as exc:
                raise OutputNotWritableError(
                    f"cannot write in {str(self.path)!r}: {exc}; choose a writable location"
                ) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = self.lock_holder()
                who = (f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')}"
                       if holder else "a process that is starting")
                raise LockedError(
                    f"{self.path} is locked by another run ({who}); wait for it to finish"
                ) from None
            except OSError as exc:
                os.close(fd)
                raise OutputNotWritableError(
                    f"cannot lock {str(self.lock_path)!r}: {exc}; the file system must support "
                    "flock (local disks and NFS do); choose another location"
                ) from exc
            # the holder that released removed the file we opened: lock the new one
            try:
                same = os.fstat(fd).st_ino == os.stat(self.lock_path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self._lock_fd = fd
            self._locked = True
            try:  # the holder's name, for other runs' messages (informational only)
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(me).encode(), 0)
            except OSError as exc:  # a full disk: the lock holds all the same
                log.warning("could not write the lock holder's name in %s: %s", self.lock_path, exc)
            return
        raise LockedError(f"could not take the lock {self.lock_path}")  # pragma: no cover

    def lock_holder(self) -> dict | None:
        """The holder's JSON (pid, host, started, command), or None if unreadable."""
        if self.remote:
            from .storage import ObjectLock

            lock = self._object_lock or ObjectLock(self.join(LOCK_NAME), self.fs,
                                                   self._key(LOCK_NAME))
            return lock.holder()
        try:
            fd = os.open(self.lock_path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                holder = json.loads(os.read(fd, 1 << 16) or b"null")
            finally:
                os.close(fd)
        except (OSError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None

    def is_locked(self) -> bool:
        """True when a live process holds the lock (tested without taking it)."""
        if self._locked:
            return True
        if self.remote:
            from .storage import ObjectLock

            holder = self.lock_holder()
            return holder is not None and ObjectLock.stale_reason(holder) is None
        try:
            fd = os.open(self.lock_path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
        return False

    def check_lock(self) -> None:
        """Raise :class:`LockedError` when this run lost its lock (an expired lease)."""
        if self._object_lock is not None:
            self._object_lock.check()

    def release(self) -> None:
        if self._locked and self.remote:
            self._object_lock.release()
            self._object_lock = None
            self._locked = False
        if self._locked:
            # unlink while still holding the lock, so a waiter never locks a removed file
            # without noticing (acquire compares the inode it locked with the path's)
            self.lock_path.unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None
            self._locked = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def check_before_writing(self, overwrite: bool = False) -> None:
        """Refuse (before anything is created, the lock included) an OUTDIR that is not
        this tool's: a foreign directory or file is left exactly as it was.

        A local OUTDIR holding this tool's members with a garbled or attribute-less
        ``zarr.json`` is :class:`~ooc_spectral.exceptions.DamagedFileError` naming the
        file (it held the run's configuration; nothing can tell which run it was).
        """
        if self.remote:
            return
        if self.path.is_symlink() and not self.path.exists():
            raise OutputNotWritableError(
                f"{self.path} is a symbolic link to {os.readlink(self.path)!r}, which does not "
                "exist; nothing was written: create that directory first (the link is then "
                "followed), or pass the real path as --out")
        kind = classify_outdir(self.path, RUN_KEY)
        if kind == "foreign":
            raise OutputNotWritableError(
                f"{self.path} exists and is not an ooc-spectral output directory; "
                + ("--overwrite only replaces an ooc-spectral output, and nothing was deleted; "
                   if overwrite else "nothing was written there; ")
                + "choose another --out (or empty this directory yourself)")
        if kind == "damaged":
            from ..exceptions import DamagedFileError

            raise DamagedFileError(
                f"{self.path / 'zarr.json'} is garbled (it held the run's configuration and "
                "status): this OUTDIR cannot be resumed or verified; restore "
                f"that file, or delete the directory (rm -r {self.path}) and run the fit again")

    # -- state ------------------------------------------------------------- #
    def group(self, mode: str = "a"):  # an OUTDIR is zarr v3: no probe of v2's three files
        return zarr.open_group(self.url, mode=mode, zarr_format=3)

    def _exists(self, name: str) -> bool:
        if self.remote:
            self.fs.invalidate_cache(self._fspath)
            return bool(self.fs.exists(self._key(name)))
        return (self.path / name).exists()

    def _entries(self) -> list[str]:
        """Names of what OUTDIR holds, the lock excepted."""
        if self.remote:
            self.fs.invalidate_cache(self._fspath)
            try:
                found = self.fs.ls(self._fspath, detail=False)
            except FileNotFoundError:
                return []
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in found]
            return [n for n in names if n and n != LOCK_NAME]
        if not self.path.exists():
            return []
        return [p.name for p in self.path.iterdir() if p.name != LOCK_NAME]

    def run_attrs(self) -> dict | None:
        """The ``ooc_spectral_run`` attributes, or None if OUTDIR holds no run."""
        if not self._exists("zarr.json"):
            return None
        try:
            return self.group("r").attrs.get(RUN_KEY)
        except Exception:
            return None

    def status(self) -> str | None:
        attrs = self.run_attrs()
        return None if attrs is None else attrs.get("status")

    def begin(self, config: dict, *, overwrite: bool, extra: dict | None = None) -> bool:
        """Start or resume a run with ``config``; returns True when resuming.

        Raises :class:`ConfigurationMismatchError` when OUTDIR holds a run with a
        different configuration (unless ``overwrite``), and
        :class:`OutputNotWritableError` when OUTDIR holds anything that is not an
        ooc-spectral run: ``overwrite`` only ever deletes an ooc-spectral output.

        The run's attributes are written in one atomic write of ``zarr.json``
        (zarr's local store writes a temporary file and renames it), so a run
        killed while beginning leaves either nothing of its own or a complete
        beginning. What older versions or a full disk could leave (a group with
        no attributes, an empty ``checkpoint`` group, a torn ``zarr.json``,
        zarr's ``*.partial`` temporaries) is recognised and started over.
        """
        digest = config_hash(config)
        self.check_before_writing(overwrite)
        existing = self.run_attrs()
        names = self._entries()
        if existing is None and names:
            unfinished = (self._unfinished_remote(names) if self.remote else
                          _unfinished_beginning(self.path, [self.path / n for n in names]))
            if not unfinished:
                raise OutputNotWritableError(
                    f"{self.path} exists and is not an ooc-spectral output directory; "
                    + ("--overwrite only replaces an ooc-spectral output, and nothing was deleted; "
                       if overwrite else "")
                    + "choose another --out (or empty this directory yourself)"
                )
            self._clear()
        elif existing is not None and overwrite:
            self._clear()
            existing = None
        if existing is not None:
            if existing.get("config_hash") != digest:
                new, old = _flatten(config), _flatten(existing.get("config", {}))
                changed = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}"
                           for k in sorted(set(new) | set(old)) if new.get(k) != old.get(k)]
                raise ConfigurationMismatchError(
                    f"{self.path} holds a run with a different configuration ("
                    + ("its recorded configuration was edited after the run, so what differs "
                       "cannot be told" if record_edited(existing) else
                       f"differs in: {', '.join(changed) or 'unknown'}")
                    + "); use another --out, or pass --overwrite to discard it")
            if record_edited(existing):  # only the record changed: this command's restores it
                log.warning("%s: the run's record was edited; restored", self.path)
                self.group().attrs[RUN_KEY] = {**existing, "config": config}
            return True
        zarr.create_group(self.url, zarr_format=3, attributes={
            RUN_KEY: {"config": config, "config_hash": digest, "status": "running",
                      "run_id": os.urandom(16).hex(), "started": _now(), **(extra or {})}})
        return False

    def _unfinished_remote(self, names: list[str]) -> bool:
        """Object-store twin of :func:`_unfinished_beginning` (a group without attributes,
        an empty ``checkpoint`` group)."""
        for name in names:
            if name == "zarr.json":
                if not _bare_group_meta(lambda: self.fs.cat_file(self._key(name))):
                    return False
                continue
            if name == "checkpoint":
                inner = self.fs.ls(self._key(name), detail=False)
                if all(p.rstrip("/").endswith("/zarr.json") for p in inner):
                    continue
            return False
        return True

    def _clear(self) -> None:
        """Delete the old run, its ``zarr.json`` (the run's marker) last: a kill midway
        leaves a run that the same ``--overwrite`` command replaces again."""
        remove_members_marker_last(self.path, keep={LOCK_NAME})

    def remove_member(self, name: str) -> None:
        """Delete OUTDIR's member ``name`` (this run's own, under its lock), if present."""
        import shutil

        if self.remote:
            if self._exists(name):
                self.fs.rm(self._key(name), recursive=True)
            return
        p = self.path / name
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)

    def checkpoint(self, every: int) -> RunCheckpoint:
        return RunCheckpoint(self.group().require_group("checkpoint"), every=every,
                             run=(self.run_attrs() or {}).get("run_id"))

    def write_report(self, report: dict) -> bytes:
        """Write ``report.json`` whole (one PUT, or a temporary renamed); returns its bytes."""
        self.check_lock()  # a run that lost its lock never reports
        blob = (strict_json.dumps(report, indent=2) + "\n").encode()  # null, never Infinity
        if self.remote:  # one PUT: the object appears whole or not at all
            self.fs.pipe_file(self._key(REPORT_NAME), blob)
            return blob
        write_file_atomic(self.path / REPORT_NAME, blob)
        return blob

    def read_report(self) -> dict | None:
        if self.remote:
            try:
                self.fs.invalidate_cache(self._key(REPORT_NAME))
                return json.loads(self.fs.cat_file(self._key(REPORT_NAME)))
            except (OSError, ValueError):
                return None
        try:
            return json.loads((self.path / REPORT_NAME).read_text())
        except (OSError, ValueError):
            return None

    def mark(self, status: str, **fields) -> None:
        if status == "complete":
            self.check_lock()
        group = self.group()
        attrs = dict(group.attrs[RUN_KEY])
        attrs.update(status=status, **fields)
        group.attrs[RUN_KEY] = attrs


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
