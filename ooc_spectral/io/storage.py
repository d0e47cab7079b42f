"""Where data lives: local paths and fsspec URLs (``s3://``, ``gs://``, ``memory://``, ...).

Every path ooc_spectral reads or writes may be a URL that fsspec understands.
This module holds what the rest of the package needs to treat both alike:

* :func:`is_url`, :func:`check_location` (an unknown scheme or a file system
  that is not installed is a :class:`~ooc_spectral.exceptions.StorageBackendError`
  naming the package to install, raised before anything is created: never a
  local directory named ``s3:/bucket/...``), :func:`join`, :func:`filesystem`;
* storage options: credentials and endpoints come from each backend's standard
  configuration (for S3 the ``AWS_*`` variables, ``AWS_ENDPOINT_URL`` included,
  and profiles); :func:`storage_options_scope` adds the options of
  ``--storage-options JSON`` (or a workflow's ``storage_options`` table) to
  fsspec's configuration for the URLs of one command. :class:`StorageOptions`
  carries them to dask workers and never shows their values (``repr``, logs);
* :class:`ObjectLock`, the lock of an OUTDIR on object storage: an object
  created with a conditional write (``If-None-Match: *``), holding the holder's
  identity and a lease that the holder renews while it runs.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import re
import socket
import sys
import threading
import time
import uuid
from typing import Any, Iterable, Iterator

from ..exceptions import LockedError, OutputNotWritableError, StorageBackendError

__all__ = ["is_url", "check_location", "join", "filesystem", "StorageOptions",
           "storage_options_scope", "options_for", "ObjectLock", "redact", "LEASE_SECONDS",
           "is_unreachable", "cancel_pending_requests", "missing_credentials"]

log = logging.getLogger("ooc_spectral")

#: Protocols that are the local disk: paths, not object storage.
LOCAL_PROTOCOLS = ("file", "local")
#: Seconds a lock object stays valid without renewal ($OOC_SPECTRAL_LEASE_SECONDS).
LEASE_SECONDS = 120.0


def is_url(location) -> bool:
    """True for ``scheme://...`` other than ``file://`` (a local path written as a URL)."""
    text = os.fspath(location)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() not in LOCAL_PROTOCOLS


def protocol(location) -> str | None:
    """The URL's scheme (lower case), or None for a local path."""
    return os.fspath(location).partition("://")[0].lower() if is_url(location) else None


def check_location(location, what: str = "path") -> str:
    """``location`` as given, after checking its scheme is known and its backend installed.

    Raises :class:`StorageBackendError` (exit code 2) naming the package to
    install (``pip install s3fs``) for a URL whose file system is missing, or
    naming the scheme when fsspec knows no such protocol. Nothing is created.
    """
    text = os.fspath(location)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not is_url(text):
        check_local_path(text, what)
        return text
    scheme = protocol(text)
    given = text.partition("://")[0]
    if given != scheme:
        raise StorageBackendError(
            f"{what} {text!r} has the scheme {given}://, and URL schemes are read in lower "
            f"case only; write {scheme}://{text.partition('://')[2]}")
    try:
        import fsspec
    except ImportError:  # pragma: no cover - a dependency of dask[array] and zarr
        raise StorageBackendError(f"{what} {text!r} is a URL, and reading URLs needs fsspec: "
                                  "pip install fsspec") from None
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as exc:
        from fsspec.registry import known_implementations

        impl = known_implementations.get(scheme, {}).get("class", "")
        package = _PACKAGES.get(scheme) or (impl.split(".")[0] if impl else "")
        extra = _EXTRAS.get(scheme)
        fix = f"pip install {package}" if package else str(exc)
        if extra:
            fix += f" (or pip install 'ooc_spectral[{extra}]')"
        raise StorageBackendError(
            f"{what} {text!r} is a {scheme}:// URL, but the file system for {scheme}:// is not "
            f"installed: {fix}"
        ) from None
    except ValueError:
        raise StorageBackendError(
            f"{what} {text!r} has the scheme {scheme}://, which fsspec does not know; use a "
            "local path or a URL such as s3://bucket/key, gs://bucket/key, memory://name"
        ) from None
    return text


#: ``scheme:/rest`` or ``scheme:rest`` without the two slashes (not a one-letter drive).
_MALFORMED_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(?!//)")


def check_local_path(text: str, what: str) -> None:
    """Refuse local paths that are almost surely a mistyped URL or an unexpanded ``~``:
    written as given they would make a local directory named ``s3:`` or ``~``, and the
    run would report success with the result somewhere nobody looks."""
    m = _MALFORMED_URL.match(text)
    if m:
        scheme, rest = m.group(1), text[m.end():].lstrip("/")
        raise StorageBackendError(
            f"{what} {text!r} looks like a {scheme.lower()}:// URL with its slashes missing, "
            f"and as a local path it would make a directory named {m.group(0).rstrip('/')!r}; "
            f"write {scheme.lower()}://{rest} (or ./{text} if you do mean a local directory)")
    if text == "~" or text.startswith("~/") or text.startswith("~" + os.sep):
        raise StorageBackendError(
            f"{what} {text!r} starts with '~', which no shell expanded (quoted, or from a "
            f"workflow file or a scheduler): it would be a directory named '~' here; write "
            f"the full path, e.g. {os.path.expanduser(text)}")


#: The package providing a scheme's file system, where its module name is not the package.
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs",
             "az": "adlfs", "adl": "adlfs"}
#: ooc_spectral's extra that installs it.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


def join(base, *names: str) -> str:
    """``base/name/...`` for a local path or a URL (no resolution of a URL)."""
    text = os.fspath(base)
    if not is_url(text):
        if text.startswith("file://"):
            text = text[len("file://"):]
        return os.path.join(text, *names)
    return "/".join([text.rstrip("/"), *(n.strip("/") for n in names)])


def absolute(location) -> str:
    """A local path made absolute (``file://`` removed); a URL unchanged."""
    text = os.fspath(location)
    if is_url(text):
        return text
    if text.startswith("file://"):
        text = text[len("file://"):]
    return os.path.abspath(text)


def filesystem(location, storage_options: dict | None = None):
    """``(fs, path)``: the fsspec file system of ``location`` and the path within it."""
    from fsspec.core import url_to_fs

    return url_to_fs(absolute(location), **(storage_options or {}))


# --------------------------------------------------------------------------- #
# storage options
# --------------------------------------------------------------------------- #
_SECRET_WORDS = ("secret", "key", "token", "password", "credential", "session", "sas", "auth")


class StorageOptions:
    """File-system options (credentials included) that never show their values.

    Hashable (it keys the workers' cache of open arrays) and picklable (it
    travels with the tasks that open an output by URL on a worker). ``repr``
    lists the option names only.
    """

    __slots__ = ("_json",)

    def __init__(self, options: dict | None = None):
        self._json = json.dumps(options or {}, sort_keys=True)

    def to_dict(self) -> dict:
        return json.loads(self._json)

    def __bool__(self) -> bool:
        return self._json != "{}"

    def __eq__(self, other) -> bool:
        return isinstance(other, StorageOptions) and other._json == self._json

    def __hash__(self) -> int:
        return hash(self._json)

    def __repr__(self) -> str:
        return f"StorageOptions(<{', '.join(sorted(self.to_dict())) or 'none'}>)"

    def __getstate__(self):
        return self._json

    def __setstate__(self, state):
        self._json = state


def redact(options: dict | None) -> dict:
    """The option names, with every value replaced by ``"***"`` (for reports and attributes)."""
    return {str(k): "***" for k in (options or {})}


def options_for(location) -> dict:
    """The options fsspec's configuration gives ``location``'s protocol now (a copy)."""
    import fsspec.config

    scheme = protocol(location)
    if scheme is None:
        return {}
    try:
        import fsspec

        cls = fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError):
        return dict(fsspec.config.conf.get(scheme, {}))
    out: dict = {}
    protos = cls.protocol if isinstance(cls.protocol, (tuple, list)) else [cls.protocol]
    for proto in protos:
        out.update(fsspec.config.conf.get(proto, {}))
    return json.loads(json.dumps(out, default=str))


def parse_storage_options(text: str | dict | None, source: str = "--storage-options") -> dict:
    """``--storage-options`` JSON (or a workflow table) as a dict, checked."""
    from ..exceptions import InvalidParameterError

    if text is None or text == "":
        return {}
    if isinstance(text, dict):
        value = text
    else:
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise InvalidParameterError(
                f"{source} is not valid JSON ({exc.msg}); pass an object such as "
                '\'{"endpoint_url": "http://127.0.0.1:9000"}\'') from None
    if not isinstance(value, dict):
        raise InvalidParameterError(
            f"{source} must be a JSON object of file-system options, not "
            f"{type(value).__name__}; for example '{{\"anon\": true}}'")
    return value


@contextlib.contextmanager
def storage_options_scope(options: dict | None, locations: Iterable) -> Iterator[None]:
    """Add ``options`` to fsspec's configuration of the protocols of ``locations``.

    They are added to each backend's own configuration (environment variables,
    profiles), for the URLs of one command, and removed afterwards; local
    paths are not affected. File systems made meanwhile keep them, and so do
    the arrays opened with them when they are sent to dask workers.
    """
    import fsspec
    import fsspec.config

    options = dict(options or {})
    protos: set[str] = set()
    for loc in locations:
        scheme = protocol(loc) if loc is not None else None
        if scheme is None:
            continue
        try:
            cls = fsspec.get_filesystem_class(scheme)
        except (ImportError, ValueError):
            continue  # check_location names it
        protos.update(cls.protocol if isinstance(cls.protocol, (tuple, list)) else [cls.protocol])
    if not options or not protos:
        yield
        return
    saved = {p: fsspec.config.conf.get(p) for p in protos}
    try:
        for p in protos:
            fsspec.config.conf[p] = {**(saved[p] or {}), **options}
        yield
    finally:
        for p, old in saved.items():
            if old is None:
                fsspec.config.conf.pop(p, None)
            else:
                fsspec.config.conf[p] = old


def is_unreachable(exc: BaseException, *, store_only: bool = False) -> bool:
    """True when ``exc`` (or what it was raised from) says the store could not be reached: a
    refused or timed-out connection, a name that does not resolve (botocore's
    ``ConnectionError`` and ``HTTPClientError``, aiohttp's, and, unless ``store_only``,
    Python's own, which a dask scheduler's failures raise too). By types, never by names."""
    kinds: list[type] = [] if store_only else [ConnectionError, TimeoutError, socket.gaierror]
    for module, names in (("botocore.exceptions", ("ConnectionError", "HTTPClientError")),
                          ("aiohttp", ("ClientConnectionError",))):
        mod = sys.modules.get(module)  # not imported: none of its exceptions was raised
        kinds += [getattr(mod, n) for n in names if isinstance(getattr(mod, n, None), type)]
    for _ in range(8):  # the exception and its explicit causes
        if exc is None:
            break
        if isinstance(exc, tuple(kinds)):
            return True
        exc = exc.__cause__
    return False


#: The exceptions (module, names) by which a backend says it found no credentials at all.
_NO_CREDENTIALS = (("botocore.exceptions", ("NoCredentialsError", "PartialCredentialsError",
                                            "ProfileNotFound", "ConfigParseError")),
                   ("google.auth.exceptions", ("DefaultCredentialsError",)))


def missing_credentials(exc: BaseException, locations=()) -> str | None:
    """The fix when ``exc`` (or what it was raised from) says the store's client found no
    credentials (botocore's ``NoCredentialsError``, a partial set, a profile that does not
    exist, an unparsable config file; Google's default credentials): configuration, which a
    rerun meets again (exit 2). None otherwise. By types: a worker's exception keeps its type."""
    kinds = tuple(getattr(sys.modules[m], n) for m, names in _NO_CREDENTIALS
                  if m in sys.modules for n in names if hasattr(sys.modules[m], n))
    e, seen = exc, 0
    while e is not None and not (kinds and isinstance(e, kinds)) and seen < 16:
        e, seen = e.__cause__ or e.__context__, seen + 1
    if e is None or not (kinds and isinstance(e, kinds)):
        return None
    urls = [str(loc) for loc in locations if loc is not None and is_url(str(loc))]
    where = (f" for {' and '.join(urls)}" if urls else "") + ": "
    tail = "; this is configuration: the same command fails the same way until it is set"
    if type(e).__module__.startswith("google"):
        return ("no Google Cloud credentials were found" + where + "set "
                "GOOGLE_APPLICATION_CREDENTIALS to a key file (or gcloud auth application-default "
                "login), or pass --storage-options '{\"token\": ...}'" + tail)
    if type(e).__name__ == "ConfigParseError":  # botocore's: names the file it read
        path = getattr(e, "kwargs", {}).get("path", "")
        return (f"the AWS configuration file {path!r} cannot be parsed" + where + "mend its "
                "[section] lines and key = value pairs, or point AWS_CONFIG_FILE and "
                "AWS_SHARED_CREDENTIALS_FILE at well-formed files" + tail)
    return ("no AWS credentials were found" + where + "set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary keys), or AWS_PROFILE "
            "naming a profile of ~/.aws/credentials, or pass --storage-options '{\"key\": ..., "
            "\"secret\": ...}' ('{\"anon\": true}' for a public bucket)" + tail)


def cancel_pending_requests(timeout: float = 5.0) -> int:
    """Cancel the requests still pending on zarr's and fsspec's event loops (when a command
    failed: zarr asks for several keys at once, and the first failure leaves the others
    running). Cancelled in their own loop, so that none is left for Python to close at exit,
    which prints a traceback per request ("Exception ignored in: <coroutine ...>").
    Returns how many were cancelled."""
    import asyncio

    async def cancel() -> int:
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(tasks)

    count = 0
    for module in ("zarr.core.sync", "fsspec.asyn"):
        loops = getattr(sys.modules.get(module), "loop", None)  # imported only if used
        loop = loops[0] if isinstance(loops, list) and loops else None
        if loop is None or loop.is_closed() or not loop.is_running():
            continue
        try:
            count += asyncio.run_coroutine_threadsafe(cancel(), loop).result(timeout)
        except Exception:  # pragma: no cover - a loop that does not answer: leave it
            log.debug("could not cancel the requests pending on %r", loop, exc_info=True)
    return count


# --------------------------------------------------------------------------- #
# the lock of an OUTDIR on object storage
# --------------------------------------------------------------------------- #
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _process_started(pid: int) -> float | None:
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:
        return None


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def lease_seconds() -> float:
    try:
        value = float(os.environ.get("OOC_SPECTRAL_LEASE_SECONDS", LEASE_SECONDS))
    except ValueError:
        return LEASE_SECONDS
    return max(1.0, value)


class ObjectLock:
    """A lock on object storage: the object ``url`` created with a conditional write.

    The object is created only if absent (``If-None-Match: *`` on S3,
    ``ifGenerationMatch=0`` on GCS); of two runs starting together exactly one
    creates it. It holds the holder's identity (pid, host, boot id, the pid's
    start time, a random holder id) and a lease: ``expires`` (Unix time),
    pushed forward by a background thread every third of the lease. A holder
    that dies stops renewing; its lock is taken over when

    * the lease has expired (``$OOC_SPECTRAL_LEASE_SECONDS``, default 120), or
    * the holder ran on this machine (same host name and boot id) and its
      process is gone (a rerun after SIGKILL does not wait for the lease).

    Taking over rewrites the object on condition that it is still the version
    read (``If-Match: ETag`` on S3), so two runs finding the same stale lock
    cannot both take it. (Other backends have no conditional overwrite in
    fsspec's API: there the version is checked just before the write, which
    leaves a window of one request.) A holder whose renewal finds another's lock has lost
    it: :meth:`check` then raises :class:`LockedError` before the run is
    marked complete.
    """

    def __init__(self, url: str, fs=None, path: str | None = None):
        self.url = url
        if fs is None:
            fs, path = filesystem(url)
        self.fs, self.path = fs, path
        self.holder_id = uuid.uuid4().hex
        self._etag: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost: str | None = None
        self.held = False

    # -- object access ------------------------------------------------------ #
    def _is_s3(self) -> bool:
        return "s3" in (self.fs.protocol if isinstance(self.fs.protocol, (tuple, list))
                        else [self.fs.protocol])

    def _put(self, data: bytes, *, create: bool = False, if_match: str | None = None) -> str | None:
        """Write the object; returns its new ETag (None when the backend gives none)."""
        kwargs: dict[str, Any] = {}
        if if_match is not None:
            if self._is_s3():
                kwargs["IfMatch"] = if_match
            else:  # no conditional overwrite in fsspec's API: check, then write
                if self._read()[1] != if_match:
                    raise FileExistsError(self.url)
        out = self.fs.pipe_file(self.path, data, mode="create" if create else "overwrite",
                                **kwargs)
        etag = out.get("ETag") if isinstance(out, dict) else None
        if etag is None:
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache(self.path)
                info = self.fs.info(self.path)
                etag = info.get("ETag") or info.get("etag") or info.get("generation") or \
                    str(info.get("mtime") or info.get("LastModified") or info.get("created"))
        return str(etag) if etag is not None else None

    def _read(self) -> tuple[dict | None, str | None]:
        """The holder's JSON and the object's ETag, or (None, None) when absent."""
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(self.path)
        try:
            info = self.fs.info(self.path)
            data = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return None, None
        etag = info.get("ETag") or info.get("etag") or info.get("generation") or \
            str(info.get("mtime") or info.get("LastModified") or info.get("created"))
        try:
            holder = json.loads(data)
        except ValueError:
            holder = {}
        return (holder if isinstance(holder, dict) else {}), str(etag)

    def _content(self, description: str) -> bytes:
        lease = lease_seconds()
        return json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(), "boot_id": _boot_id(),
            "pid_started": _process_started(os.getpid()), "holder": self.holder_id,
            "started": self._started, "command": description, "lease_seconds": lease,
            "expires": time.time() + lease, "renewed": _now(),
        }).encode()

    # -- the protocol ------------------------------------------------------- #
    @staticmethod
    def stale_reason(holder: dict) -> str | None:
        """Why ``holder``'s lock may be taken over, or None while it is alive."""
        expires = holder.get("expires")
        if not isinstance(expires, (int, float)):
            return "it names no lease expiry"
        if time.time() > float(expires):
            return f"its lease expired {time.time() - float(expires):.0f} s ago"
        if holder.get("host") == socket.gethostname() and holder.get("boot_id") == _boot_id():
            pid = holder.get("pid")
            started = _process_started(int(pid)) if isinstance(pid, int) else None
            if started is None or (holder.get("pid_started") is not None
                                   and abs(started - float(holder["pid_started"])) > 1e-3):
                return f"its process (pid {pid} on this machine) is gone"
        return None

    def acquire(self, description: str = "") -> None:
        """Take the lock, or raise :class:`LockedError` naming the live holder."""
        self._started = _now()
        for _ in range(20):
            try:
                self._etag = self._put(self._content(description), create=True)
                break
            except FileExistsError:
                pass
            except OSError as exc:
                raise OutputNotWritableError(
                    f"cannot create the lock object {self.url}: {type(exc).__name__}: {exc}; "
                    "check the bucket, the credentials and the permissions"
                ) from exc
            holder, etag = self._read()
            if holder is None:
                continue  # released meanwhile: try to create it again
            why = self.stale_reason(holder)
            if why is None:
                raise LockedError(
                    f"{self.url.rsplit('/', 1)[0]} is locked by another run "
                    f"({describe_holder(holder)}); wait for it to finish"
                )
            try:
                self._etag = self._put(self._content(description), if_match=etag)
            except (FileExistsError, OSError):
                continue  # another run took it first, or it changed: read it again
            log.warning("took over the lock %s of %s: %s", self.url, describe_holder(holder), why)
            break
        else:
            raise LockedError(f"could not take the lock {self.url}; try again")
        self.held = True
        self._description = description
        self._thread = threading.Thread(target=self._renew_loop, name="ooc-spectral-lease",
                                        daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(lease_seconds() / 3):
            try:
                self._etag = self._put(self._content(self._description), if_match=self._etag)
                continue
            except Exception as exc:  # a conflict, or the store unreachable for now
                error = exc
            try:
                holder, _ = self._read()
            except Exception as exc:
                log.warning("could not renew the lease of %s (%s); retrying", self.url, exc)
                continue
            if holder is not None and holder.get("holder") == self.holder_id:
                log.warning("could not renew the lease of %s (%s); retrying", self.url, error)
                continue
            self._lost = (f"another run took the lock {self.url} "
                          f"({describe_holder(holder) if holder else 'and released it'})")
            log.error("%s: this run no longer holds its lock", self._lost)
            return

    def check(self) -> None:
        """Raise :class:`LockedError` unless this run still holds the lock (read back from
        the store: a renewal thread that could not tell is not trusted)."""
        if self._lost is None:
            holder, _ = self._read()
            if holder is None or holder.get("holder") != self.holder_id:
                self._lost = (f"another run took the lock {self.url} "
                              f"({describe_holder(holder) if holder else 'and released it'})")
        if self._lost:
            raise LockedError(f"{self._lost} while this run was working (its lease expired: a "
                              "paused or unreachable client); rerun to resume")

    def holder(self) -> dict | None:
        return self._read()[0]

    def release(self) -> None:
        if not self.held:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.held = False
        holder, _ = self._read()
        if holder is not None and holder.get("holder") == self.holder_id:
            with contextlib.suppress(Exception):
                self.fs.rm_file(self.path)


def describe_holder(holder: dict) -> str:
    return (f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')}"
            + (f", {holder.get('command')}" if holder.get("command") else ""))
