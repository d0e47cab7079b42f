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

OUTDIR must be a local path (the lock and the report are plain files).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import socket
from pathlib import Path

import numpy as np
import zarr

from .exceptions import ConfigurationMismatchError, LockedError, OutputNotWritableError
from .scan import DictionaryState

__all__ = ["RunDirectory", "RunCheckpoint", "config_hash", "RUN_KEY"]

RUN_KEY = "ooc_spectral_run"
LOCK_NAME = ".lock"
REPORT_NAME = "report.json"


def config_hash(config: dict) -> str:
    """SHA-256 of the canonical JSON of a resolved configuration."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunCheckpoint:
    """Checkpoint of one run, in ``OUTDIR/checkpoint`` (implements the pipeline's protocol).

    Parameters
    ----------
    group : zarr.Group
        The checkpoint group.
    every : int
        Windows of the scan between two saves of its state.
    """

    def __init__(self, group, every: int = 4):
        self.group = group
        self.every = max(1, int(every))
        self.loaded_partials = 0

    # -- scan -------------------------------------------------------------- #
    def load_scan(self) -> dict | None:
        meta = self.group.attrs.get("scan")
        if not meta:
            return None
        slot = self.group[meta["slot"]]
        out = {k: np.asarray(slot[k][...]) for k in ("points", "indices", "L", "w")}
        out.update(windows_done=int(meta["windows_done"]), tol=float(meta["tol"]),
                   prefix_done=bool(meta.get("prefix_done", False)))
        return out

    def save_scan(self, state: DictionaryState, windows_done: int, tol: float, *,
                  prefix_done: bool = False) -> None:
        meta = self.group.attrs.get("scan") or {}
        slot_name = "scan_b" if meta.get("slot") == "scan_a" else "scan_a"
        slot = self.group.require_group(slot_name)
        for name, value in (("points", state.points), ("indices", state.indices),
                            ("L", state.L), ("w", state.w)):
            value = np.ascontiguousarray(value)
            arr = slot.create_array(name, shape=value.shape, dtype=value.dtype,
                                    chunks=tuple(max(1, s) for s in value.shape) or (1,),
                                    overwrite=True)
            arr[...] = value
        # the pointer is written last, atomically
        self.group.attrs["scan"] = {"slot": slot_name, "windows_done": int(windows_done),
                                    "tol": float(tol), "size": int(state.size),
                                    "prefix_done": bool(prefix_done), "time": _now()}

    # -- pass-2 partials --------------------------------------------------- #
    def _partial_name(self, stage: str, segment: int) -> str:
        return f"{stage}_{segment:06d}"

    def load_partial(self, stage: str, segment: int) -> dict | None:
        parts = self.group.require_group("partials")
        name = self._partial_name(stage, segment)
        if name not in parts:
            return None
        g = parts[name]
        meta = g.attrs.get("partial")
        if not meta:  # written partly when the run stopped
            return None
        out = dict(meta["scalars"])
        for key in g.array_keys():
            out[key] = np.asarray(g[key][...])
        self.loaded_partials += 1
        return out

    def save_partial(self, stage: str, segment: int, partial: dict) -> None:
        parts = self.group.require_group("partials")
        g = parts.require_group(self._partial_name(stage, segment))
        scalars = {}
        for key, value in partial.items():
            if isinstance(value, np.ndarray):
                arr = g.create_array(key, shape=value.shape, dtype=value.dtype,
                                     chunks=value.shape or (1,), overwrite=True)
                arr[...] = value
            else:
                scalars[key] = value.item() if isinstance(value, np.generic) else value
        g.attrs["partial"] = {"scalars": scalars}


class RunDirectory:
    """An OUTDIR: lock, configuration check, status, checkpoint, report.

    Parameters
    ----------
    path : str or Path
        Local path of the output group.
    """

    def __init__(self, path):
        self.path = Path(os.fspath(path))
        self._locked = False

    # -- lock -------------------------------------------------------------- #
    @property
    def lock_path(self) -> Path:
        return self.path / LOCK_NAME

    def acquire(self, description: str = "") -> None:
        """Take the lock, or raise :class:`LockedError` naming the live holder.

        A lock left by a dead process on this host (a killed run) is stale and
        is taken over.
        """
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputNotWritableError(
                f"cannot create the output directory {str(self.path)!r}: {exc}; choose a "
                "writable location"
            ) from exc
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": _now(),
              "command": description}
        for _ in range(2):
            try:
                fd = os.open(self.lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self.lock_holder()
                if holder is not None and self._stale(holder):
                    self.lock_path.unlink(missing_ok=True)
                    continue
                who = (f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')}"
                       if holder else "an unknown process")
                raise LockedError(
                    f"{self.path} is locked by another run ({who}); wait for it to finish, or "
                    f"if it is dead on another host, remove {self.lock_path}"
                ) from None
            except OSError as exc:
                raise OutputNotWritableError(
                    f"cannot write in {str(self.path)!r}: {exc}; choose a writable location"
                ) from exc
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self._locked = True
            return
        raise LockedError(f"could not take the lock {self.lock_path}")  # pragma: no cover

    def lock_holder(self) -> dict | None:
        try:
            return json.loads(self.lock_path.read_text())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _stale(holder: dict) -> bool:
        return holder.get("host") == socket.gethostname() and not _pid_alive(int(holder.get("pid", -1)))

    def release(self) -> None:
        if self._locked:
            self.lock_path.unlink(missing_ok=True)
            self._locked = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    # -- state ------------------------------------------------------------- #
    def group(self, mode: str = "a"):
        return zarr.open_group(str(self.path), mode=mode)

    def run_attrs(self) -> dict | None:
        """The ``ooc_spectral_run`` attributes, or None if OUTDIR holds no run."""
        if not (self.path / "zarr.json").exists():
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
        :class:`OutputNotWritableError` when OUTDIR holds something else.
        """
        digest = config_hash(config)
        existing = self.run_attrs()
        has_content = any(p.name != LOCK_NAME for p in self.path.iterdir()) if self.path.exists() else False
        if overwrite and has_content:
            self._clear()
            existing = None
        elif existing is None and has_content:
            raise OutputNotWritableError(
                f"{self.path} exists and is not an ooc-spectral output directory; choose another "
                "--out, or pass --overwrite to replace its contents"
            )
        if existing is not None:
            if existing.get("config_hash") != digest:
                new, old = _flatten(config), _flatten(existing.get("config", {}))
                changed = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}"
                           for k in sorted(set(new) | set(old)) if new.get(k) != old.get(k)]
                raise ConfigurationMismatchError(
                    f"{self.path} holds a run with a different configuration (differs in: "
                    f"{', '.join(changed) or 'unknown'}); use another --out, or pass --overwrite "
                    "to discard it"
                )
            return True
        group = zarr.open_group(str(self.path), mode="a")
        group.require_group("checkpoint")
        group.attrs[RUN_KEY] = {"config": config, "config_hash": digest, "status": "running",
                                "started": _now(), **(extra or {})}
        return False

    def _clear(self) -> None:
        import shutil

        for p in self.path.iterdir():
            if p.name == LOCK_NAME:
                continue
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()

    def checkpoint(self, every: int) -> RunCheckpoint:
        return RunCheckpoint(self.group()["checkpoint"], every=every)

    def write_report(self, report: dict) -> None:
        tmp = self.path / (REPORT_NAME + ".partial")
        tmp.write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
        os.replace(tmp, self.path / REPORT_NAME)

    def read_report(self) -> dict | None:
        try:
            return json.loads((self.path / REPORT_NAME).read_text())
        except (OSError, ValueError):
            return None

    def mark(self, status: str, **fields) -> None:
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


def _json_default(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
