"""Layer 4, where the parallel passes run: executors, the embedded cluster, monitoring.

``execution`` (``Executor``: a graph of parts computed on dask's threads or a
``dask.distributed`` cluster, each part handed over as it finishes), ``memory``
(worker and task memory budgets), ``cluster`` (the engine of a job: an existing
scheduler, an embedded ``LocalCluster``, or threads), ``monitor`` (memory sampling,
progress lines).

May import: :mod:`ooc_spectral.io`, :mod:`ooc_spectral.core` and the layers below.
"""
