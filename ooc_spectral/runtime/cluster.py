"""Where the parallel passes run: an existing dask cluster, an embedded one, or threads.

:func:`compute_engine` picks the engine of a job (:class:`Engine`):

- ``--scheduler`` (or ``$DASK_SCHEDULER_ADDRESS``): that cluster;
- ``--engine cluster``: an embedded ``LocalCluster`` (below);
- ``--engine threads``: dask's threaded scheduler in this process
  (``workers x threads_per_worker`` threads; BLAS pinned to one thread per task);
- ``--engine auto`` (the default): threads for inputs of at most
  :data:`THREADS_MAX_BYTES` stored bytes, the ``LocalCluster`` for larger ones,
  and always the cluster when a per-worker ``--memory-limit`` is given (only
  worker processes can be held to it) or dask's performance report is asked for.

:func:`dask_client` yields a ``distributed.Client``:

- connected to ``scheduler`` (or ``$DASK_SCHEDULER_ADDRESS``) when given: the
  workers must see the input store and the output directory at the same paths
  as this process, and have ooc_spectral installed;
- otherwise on an embedded ``LocalCluster`` of worker *processes*, stopped on
  exit. Worker processes pin BLAS to one thread (distributed sets
  ``OMP_NUM_THREADS=1`` and friends before it spawns them); this process, where
  the sequential scan and the eigensolve run, keeps all its BLAS threads.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass

from .memory import check_memory_limit

__all__ = ["ClusterOptions", "dask_client", "compute_engine", "choose_engine", "Engine",
           "ENGINES", "THREADS_MAX_BYTES"]

#: Engines of ``--engine``.
ENGINES = ("auto", "threads", "cluster")
#: ``--engine auto`` runs inputs of at most this many stored bytes on threads in this
#: process, larger ones on the embedded LocalCluster (dask config
#: ``ooc-spectral.threads-max-bytes``). See :func:`choose_engine` for the measurement.
THREADS_MAX_BYTES = 128 * 2**20

log = logging.getLogger("ooc_spectral")


@dataclass(frozen=True)
class ClusterOptions:
    """How to get a cluster.

    Attributes
    ----------
    scheduler : str or None
        Address of an existing scheduler; None reads ``$DASK_SCHEDULER_ADDRESS``
        and, if unset, starts an embedded ``LocalCluster``.
    workers : int or None
        Worker processes of the embedded cluster (default: the number of cores).
    threads_per_worker : int
    memory_limit : str
        Per worker, e.g. ``"4GiB"``, or ``"auto"`` (a share of the machine's RAM).
    quiet : bool
        Keep the embedded cluster's and distributed's logs (nanny warnings,
        worker tracebacks) off stderr: only ooc_spectral's own messages remain.
    engine : {"auto", "threads", "cluster"}
        Without a scheduler address: threads in this process, the embedded
        ``LocalCluster``, or by input size (:func:`choose_engine`).
    """

    scheduler: str | None = None
    workers: int | None = None
    threads_per_worker: int = 1
    memory_limit: str = "auto"
    quiet: bool = False
    engine: str = "auto"

    @property
    def address(self) -> str | None:
        return self.scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS") or None


#: How the embedded cluster starts worker processes (see :func:`embedded_worker_start`).
WORKER_START_METHOD = "forkserver"
#: The embedded cluster's workers keep glibc's own allocator thresholds: distributed
#: sets ``MALLOC_TRIM_THRESHOLD_=65536`` for every worker it starts (its
#: ``distributed.nanny.pre-spawn-environ``), which also fixes the mmap threshold at
#: 128 KiB, so that every array of a sub-block (the float64 rows, the augmented
#: rows, the m x m product, the decoded chunk) is a fresh ``mmap`` faulted in page
#: by page and unmapped at its end: the workers spend system time on page faults that
#: glibc's defaults avoid, for a somewhat higher peak RSS (docs/measurements.md,
#: "Workers' allocator thresholds"). The dask config
#: ``ooc-spectral.worker-malloc-trim-threshold`` (bytes) restores a threshold.
WORKER_MALLOC_TRIM_THRESHOLD = None
#: Modules the forkserver imports once for all the workers it forks. Not numba's loops
#: (``ooc_spectral._accel.fused_numba``): numba and LLVM add to the resident memory of
#: each process that imports them, the server's included, and every forked worker would
#: count them from its start; each worker imports them at its first pass 2 task instead,
#: the loops loaded from numba's disk cache (docs/measurements.md, "Start-up and
#: resident costs").
WORKER_PRELOAD = ("distributed", "numpy", "scipy.linalg", "dask.array", "zarr",
                  "ooc_spectral.pipeline.fit")
#: Seconds to connect to a scheduler and receive its dask handshake (dask config
#: ``ooc-spectral.connect-timeout``, env ``DASK_OOC_SPECTRAL__CONNECT_TIMEOUT``).
CONNECT_TIMEOUT = "30s"


def connect_timeout() -> float:
    import dask
    from dask.utils import parse_timedelta

    return float(parse_timedelta(dask.config.get("ooc-spectral.connect-timeout", CONNECT_TIMEOUT)))



def check_scheduler_scheme(address: str | None) -> None:
    """Raise :class:`SchedulerError` (exit 2, before anything is created) when ``address``
    names a transport dask does not have (``udp://``, ``http://``)."""
    from ..exceptions import SchedulerError

    if not address or "://" not in address:
        return
    scheme = address.split("://", 1)[0]
    try:  # the transports this installation of distributed knows (tls, inproc, ws, ...)
        from distributed.comm.registry import backends
        known = set(backends)
    except Exception:  # pragma: no cover - distributed absent: the client fails later
        return
    if scheme not in known:
        raise SchedulerError(
            f"scheduler address {address!r}: dask has no {scheme}:// transport (it knows "
            f"{', '.join(sorted(known))}); pass the scheduler's tcp://HOST:PORT")

def probe_scheduler(address: str, timeout: float | None = None) -> None:
    """Check that ``address`` answers as a dask scheduler, within ``timeout`` seconds.

    A dask server sends its handshake (a small msgpack frame with its
    ``pickle-protocol``) as soon as a connection opens. A server that sends
    nothing (an HTTP server, a silent socket), something else (an HTTP proxy's
    400) or an absurd frame length is refused with :class:`SchedulerError`
    before distributed's client would wait or allocate for it. An address that
    cannot be reached is a ``ConnectionError`` (a runtime failure). Only
    ``tcp://`` addresses are probed; other schemes rely on the client's timeout.
    """
    import socket
    import struct

    from ..exceptions import SchedulerError

    timeout = connect_timeout() if timeout is None else float(timeout)
    scheme, _, rest = address.rpartition("://")
    if scheme not in ("", "tcp"):
        check_scheduler_scheme(address)
        return
    host, _, port = rest.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise SchedulerError(f"scheduler address {address!r} is not like tcp://HOST:PORT")
    deadline = timeout
    try:
        sock = socket.create_connection((host, int(port)), timeout=deadline)
    except socket.timeout:
        raise ConnectionError(f"the dask scheduler at {address} did not accept a connection "
                              f"within {timeout:g} s; check the address, then rerun") from None
    except OSError as exc:
        raise ConnectionError(f"cannot connect to the dask scheduler at {address}: {exc}; check "
                              "that it is running, then rerun") from None
    with sock:
        try:
            head = _recv_exactly(sock, 8)
            (size,) = struct.unpack("Q", head)  # dask writes its frame header in native order
            if not 0 < size <= 2**20:
                raise ValueError(f"a first frame of {size} bytes")
            body = _recv_exactly(sock, size)
            if b"pickle-protocol" not in body:
                raise ValueError("a first frame without a dask handshake")
        except socket.timeout:
            raise SchedulerError(
                f"{address} accepted the connection but sent no dask handshake within "
                f"{timeout:g} s: it is not a dask scheduler (an HTTP server or another "
                "service?); pass the scheduler's tcp:// address"
            ) from None
        except (OSError, ValueError, EOFError) as exc:
            raise SchedulerError(
                f"{address} does not speak dask's protocol ({exc}): it is not a dask "
                "scheduler (a proxy or another service?); pass the scheduler's tcp:// address"
            ) from None


def _recv_exactly(sock, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise EOFError(f"the connection closed after {len(buf)} bytes")
        buf += part
    return buf


def _quiet_logs(quiet: bool) -> int:
    return logging.CRITICAL if quiet else logging.WARNING


@contextmanager
def dask_client(options: ClusterOptions):
    """A ``distributed.Client`` for the duration of the block (the default client)."""
    import dask
    from distributed import Client, LocalCluster

    address = options.address
    if address:
        log.info("connecting to the dask scheduler at %s", address)
        probe_scheduler(address)
        with Client(address, timeout=connect_timeout()) as client:
            yield client
        return
    check_memory_limit(options.memory_limit)
    n = options.workers or os.cpu_count() or 1
    log.info("starting an embedded LocalCluster: %d worker processes x %d threads, memory limit %s",
             n, options.threads_per_worker, options.memory_limit)
    dashboard = diagnostics_on()
    with embedded_worker_start(), dask.config.set(embedded_cluster_config()), \
            LocalCluster(n_workers=n, threads_per_worker=options.threads_per_worker,
                         processes=True, memory_limit=options.memory_limit,
                         dashboard_address=":0", scheduler_kwargs={"dashboard": dashboard},
                         silence_logs=_quiet_logs(options.quiet),
                         env=worker_environment()) as cluster, \
            Client(cluster) as client:
        if dashboard:
            log.info("dask dashboard: %s", client.dashboard_link)
        yield client


def worker_start_method() -> str:
    """How the embedded cluster starts its worker processes (dask config
    ``ooc-spectral.worker-start-method``, env ``DASK_OOC_SPECTRAL__WORKER_START_METHOD``):
    :data:`WORKER_START_METHOD` unless set to another of ``multiprocessing``'s methods."""
    import dask

    from ..exceptions import InvalidParameterError

    method = str(dask.config.get("ooc-spectral.worker-start-method", WORKER_START_METHOD))
    if method not in ("forkserver", "spawn"):
        raise InvalidParameterError(
            f"ooc-spectral.worker-start-method is {method!r}; expected 'forkserver' or 'spawn' "
            "(fork is unsafe from a process that runs threads)")
    return method


#: distributed's diagnostics that the embedded cluster turns down, unless the dask config
#: ``ooc-spectral.cluster-diagnostics`` is True (which also starts the dashboard,
#: :func:`diagnostics_on`): the workers' statistical profiler
#: (every 10 ms it walks the stacks of the task threads, under the GIL), the event
#: loops' tick (every 20 ms; a blocked loop is still reported after 3 s) and the
#: system monitor (every 0.5 s), which feed the dashboard. Without them the task
#: threads get more of the cores and pass 2 is a little faster (docs/measurements.md,
#: "The embedded cluster's diagnostics").
EMBEDDED_DIAGNOSTICS_OFF = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "500ms",
    "distributed.admin.system-monitor.interval": "2s",
}


def diagnostics_on() -> bool:
    """Whether the embedded cluster runs with distributed's diagnostics: the dask config
    ``ooc-spectral.cluster-diagnostics`` (env ``DASK_OOC_SPECTRAL__CLUSTER_DIAGNOSTICS=True``),
    False by default. Only then does its scheduler serve the dashboard (its address
    logged): the dashboard costs every run 1 to 1.6 s of CPU to start (bokeh's import and
    set-up in this process), and without the diagnostics it has little to show.
    ``--performance-report`` does not need it. The scheduler's HTTP server (health and
    metrics routes) listens on a free port either way, never on distributed's fixed 8787,
    which two runs at once would contend for."""
    from .._accel.support import config_flag

    return config_flag("ooc-spectral.cluster-diagnostics", False)


def embedded_cluster_config() -> dict:
    """The dask config the embedded cluster runs under (its nannies pass it to the
    workers): :data:`EMBEDDED_DIAGNOSTICS_OFF` unless ``ooc-spectral.cluster-diagnostics``
    is True (env ``DASK_OOC_SPECTRAL__CLUSTER_DIAGNOSTICS=True``). It is set in this
    process too while the cluster runs (its scheduler and nannies live here), and
    restored when the cluster stops; an external cluster and the threads engine are
    not touched."""
    return {} if diagnostics_on() else dict(EMBEDDED_DIAGNOSTICS_OFF)


def worker_environment() -> dict[str, str]:
    """The environment a forked worker is given: this process's, as it is now.

    A spawned worker inherits this process's environment when it starts; a forked
    one inherits the fork server's, frozen when the server started (the first
    cluster of this process). Passing the current one (dask's pre-spawn variables
    left out: the server already has them, and BLAS was loaded under them) keeps a
    variable set since then, such as object-store credentials or endpoints, from
    being silently missing on the workers of a later cluster.
    """
    import dask

    if worker_start_method() != "forkserver":
        return {}
    pre_spawn = dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {}
    return {k: v for k, v in os.environ.items() if k not in pre_spawn}


def worker_pre_spawn_environ() -> dict:
    """distributed's ``pre-spawn-environ`` for the embedded cluster's workers:
    ``MALLOC_TRIM_THRESHOLD_`` as the dask config ``ooc-spectral.worker-malloc-trim-threshold``
    says (:data:`WORKER_MALLOC_TRIM_THRESHOLD`: left unset, glibc's default), the
    other variables (one BLAS and OpenMP thread per worker...) as distributed sets them.

    With the forkserver, the server's allocator is set up when it starts (the
    first embedded cluster of the process) and every worker forked from it keeps it.
    distributed's own ``distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_``
    is not used by the embedded cluster (this key is), and a ``MALLOC_TRIM_THRESHOLD_``
    already in this process's environment (set in the shell, or written there by
    the nanny of a plain ``LocalCluster`` started earlier) still reaches the workers.
    """
    import dask
    import distributed  # noqa: F401 (its configuration defaults)
    from dask.utils import parse_bytes

    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
    trim = dask.config.get("ooc-spectral.worker-malloc-trim-threshold", WORKER_MALLOC_TRIM_THRESHOLD)
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    if trim is not None:
        env["MALLOC_TRIM_THRESHOLD_"] = int(parse_bytes(trim) if isinstance(trim, str)
                                            else trim)
    return env


@contextmanager
def embedded_worker_start():
    """Start the embedded cluster's workers by :func:`worker_start_method`.

    With ``forkserver``, one server process per client process imports distributed,
    numpy and the pass modules (:data:`WORKER_PRELOAD`) once, with dask's
    pre-spawn environment (``OMP_NUM_THREADS=1`` ...) already set by the first
    nanny, and every worker is a fork of it: a worker is ready in a fraction of a
    second and imports nothing at its first task, where a spawned one starts a
    fresh interpreter and imports it all (docs/measurements.md, "Start-up and resident
    costs"). The server lives as long as this process and is reused by later clusters.
    """
    import dask

    method = worker_start_method()
    with dask.config.set({"distributed.worker.multiprocessing-method": method,
                          "distributed.nanny.pre-spawn-environ": worker_pre_spawn_environ()}):
        if method == "forkserver":
            from distributed.utils import get_mp_context

            # distributed sets its own preload list on first use; ours replaces it
            # (a superset) before the server starts
            get_mp_context().set_forkserver_preload(list(WORKER_PRELOAD))
        yield


def _threads_max_bytes() -> int:
    import dask
    from dask.utils import parse_bytes

    value = dask.config.get("ooc-spectral.threads-max-bytes", THREADS_MAX_BYTES)
    return int(parse_bytes(value)) if isinstance(value, str) else int(value)


def choose_engine(options: ClusterOptions, input_bytes: int | None = None, *,
                  needs_cluster: bool = False) -> tuple[str, str]:
    """``("threads" | "cluster", why)`` for a job reading ``input_bytes`` stored bytes.

    A scheduler address always means that cluster. ``auto`` takes the threads
    in this process for inputs of at most :data:`THREADS_MAX_BYTES` (128 MiB),
    the embedded ``LocalCluster`` for larger ones. The cluster costs a fixed time to
    start and stop, which its stages won back only on large inputs; the threshold is
    the crossover measured by ``workflows/bench/engines.py`` and kept until a
    measurement above 320 MB decides how far to raise it (docs/measurements.md,
    "Threads or the embedded cluster"). The cluster's workers are also held to a
    memory limit. A given ``--memory-limit`` or ``needs_cluster`` (dask's performance
    report) also takes the cluster.
    """
    from ..exceptions import InvalidParameterError

    engine = options.engine or "auto"
    if engine not in ENGINES:
        raise InvalidParameterError(f"--engine {engine!r} is not one of {', '.join(ENGINES)}")
    if options.address:
        if engine == "threads":
            raise InvalidParameterError(
                "--engine threads runs in this process, but a scheduler address is given "
                f"({options.address}); drop one of them")
        return "cluster", f"the dask scheduler at {options.address}"
    if engine != "auto":
        return engine, f"--engine {engine}"
    if needs_cluster:
        return "cluster", "dask's performance report needs a distributed cluster"
    if check_memory_limit(options.memory_limit) is not None:
        return "cluster", "a per-worker --memory-limit is only enforced on worker processes"
    limit = _threads_max_bytes()
    if input_bytes is not None and int(input_bytes) <= limit:
        return "threads", (f"the input ({int(input_bytes) / 2**20:.0f} MiB) is at most "
                           f"{limit / 2**20:.0f} MiB")
    return "cluster", (f"the input is larger than {limit / 2**20:.0f} MiB"
                       if input_bytes is not None else "the input size is unknown")


@dataclass
class Engine:
    """Where a job's parallel passes run (what :func:`compute_engine` yields).

    Attributes
    ----------
    kind : {"threads", "cluster"}
    client : distributed.Client or None
        None for the threads in this process.
    threads : int
        Task slots: the workers' threads, or this process's threads.
    reason : str
        Why this engine (for the log and the report).
    description : str
    """

    kind: str
    client: object
    threads: int
    reason: str
    description: str
    memory_limit: int | None = None
    threads_per_worker: int = 1

    @property
    def workers(self) -> int:
        if self.client is None:
            return 1
        try:
            return len(self.client.scheduler_info().get("workers", {}))
        except Exception:
            return 0

    def executor(self, on_progress=None):
        """An :class:`~ooc_spectral.runtime.execution.Executor` on this engine."""
        from .execution import Executor

        if self.client is None:
            return Executor(None, on_progress=on_progress, local=True, threads=self.threads)
        return Executor(self.client, on_progress=on_progress)

    def report(self) -> dict:
        """The engine's entries of ``report.json``."""
        return {"engine": self.kind, "engine_reason": self.reason, "threads": self.threads,
                "workers": self.workers, "scheduler": self.description}


@contextmanager
def compute_engine(options: ClusterOptions, input_bytes: int | None = None, *,
                   needs_cluster: bool = False):
    """The :class:`Engine` of a job for the duration of the block (see :func:`choose_engine`)."""
    import dask

    kind, why = choose_engine(options, input_bytes, needs_cluster=needs_cluster)
    if kind == "cluster":
        with dask_client(options) as client:
            from .execution import task_threads

            desc = options.address or "embedded LocalCluster"
            yield Engine("cluster", client, task_threads(client), why, desc)
        return
    threads = (options.workers or os.cpu_count() or 1) * max(1, int(options.threads_per_worker))
    log.info("running on %d threads in this process (%s)", threads, why)
    import dask.threaded

    # the function, not its name: to resolve a name dask imports distributed to look for a
    # client (docs/measurements.md, "Start-up and resident costs")
    with dask.config.set(scheduler=dask.threaded.get, num_workers=threads):
        yield Engine("threads", None, threads, why, f"{threads} threads in this process")
