"""Where the parallel passes run: an existing dask cluster or an embedded one.

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

__all__ = ["ClusterOptions", "dask_client"]

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
    """

    scheduler: str | None = None
    workers: int | None = None
    threads_per_worker: int = 1
    memory_limit: str = "auto"

    @property
    def address(self) -> str | None:
        return self.scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS") or None


@contextmanager
def dask_client(options: ClusterOptions):
    """A ``distributed.Client`` for the duration of the block (the default client)."""
    from distributed import Client, LocalCluster

    address = options.address
    if address:
        log.info("connecting to the dask scheduler at %s", address)
        with Client(address, timeout="30s") as client:
            yield client
        return
    n = options.workers or os.cpu_count() or 1
    log.info("starting an embedded LocalCluster: %d worker processes x %d threads, memory limit %s",
             n, options.threads_per_worker, options.memory_limit)
    with LocalCluster(n_workers=n, threads_per_worker=options.threads_per_worker,
                      processes=True, memory_limit=options.memory_limit,
                      dashboard_address=":0", silence_logs=logging.WARNING) as cluster, \
            Client(cluster) as client:
        log.debug("dask dashboard: %s", client.dashboard_link)
        yield client
