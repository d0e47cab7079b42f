"""``ooc-spectral fit IN --out OUT --affinity representatives --n-clusters K``: the batch job.

Spectral clustering on the rows' nearest representatives
(:mod:`ooc_spectral.core.representatives`) as a resumable job in an OUTDIR, the way
:func:`~ooc_spectral.batch.jobs.run_fit_job` runs the embedding: the lock, the
configuration check (a rerun of the same command resumes; another configuration is
refused unless ``--overwrite``), the input's fingerprint (an input changed since the
run began starts it over; changed during the run, it is not marked complete), the
bipartite pass's segment partials in the checkpoint, the write-back's per-chunk
markers, ``report.json``, and the completion marker last.

OUTDIR then holds ``embedding`` (n x p, unit rows), ``labels`` (n, int32) beside it,
``representatives_model`` (the representatives and their scales, the map's
coefficients, the eigenvalues and the k-means centres, as checksummed arrays;
``n_neighbors`` and the reach in its description, which carries the digest of the arrays
and of itself) and ``report.json`` (with the clusters made, their sizes, the eigengaps of
``--n-clusters auto`` and the degenerate-partition warning, if any).
Every member has its digest in the manifest (:mod:`ooc_spectral.batch.outdir`): ``verify``
and the rerun of the same command check them, and the rerun repairs what is damaged.

Every stage is a function of the input and the seed, so a resumed run recomputes the
representatives, the solve and the k-means (seconds) and reuses the saved partials of
the pass and the chunks already written.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import zarr

from ..io.checkpoint import RunDirectory
from ..io.integrity import InputWatch
from ..io.manifest import REPRESENTATIVES_KEY, read_sealed_group, write_sealed_group
from ..io.safety import output_apart_from_model, output_outside_input
from ..io.source import open_source
from ..pipeline.cluster_output import ClusterOutput
from ..core.degenerate import partition_message
from ..pipeline.representatives import (fit_representatives, resolve_n_representatives,
                                         task_rows, warn_if_degenerate)
from ..runtime.cluster import compute_engine
from ..runtime.monitor import MemorySampler, ProgressLog
from .jobs import FitJob, _check_workers_see_input, input_identity
from .outdir import (CLUSTER_MODEL, EMBEDDING, LABELS, begin, complete, marked_if_stopped,
                     provenance, recheck)

__all__ = ["run_representatives_job", "MODEL"]

log = logging.getLogger("ooc_spectral")

#: The group of OUTDIR holding the fitted map.
MODEL = "representatives_model"


def _save_model(url: str, fit) -> None:
    """``representatives_model``: the map's arrays and its description, sealed (every array
    of the map, and every field of its description, under one digest)."""
    tmap = fit.cmap.tmap
    write_sealed_group(zarr.open_group(url, mode="a"), MODEL, REPRESENTATIVES_KEY, {
        "representatives": tmap.representatives.points,
        "scales": tmap.representatives.scales, "coefficients": tmap.coefficients,
        "eigenvalues": tmap.eigenvalues, "centers": fit.cmap.centers},
        {"affinity": "representatives", "n_neighbors": int(tmap.representatives.n_neighbors),
         "reach": int(tmap.representatives.reach)})


def _cluster_sizes(url: str, k: int) -> np.ndarray:
    """Rows per cluster, read one chunk of the labels at a time (memory flat in n)."""
    arr = zarr.open_array(url, mode="r")
    step = int(arr.chunks[0])
    counts = np.zeros(k, dtype=np.int64)
    for a in range(0, arr.shape[0], step):
        counts += np.bincount(np.asarray(arr[a:a + step]), minlength=k)[:k]
    return counts


def run_representatives_job(job: FitJob, *, n_clusters, n_representatives="auto",
                            n_neighbors: int = 5, n_components: int | None = None,
                            n_init: int = 10) -> dict:
    """Run or resume the clustering into ``job.outdir``; returns the report.
    ``n_clusters`` is an int or ``"auto"``; the defaults are
    :class:`~ooc_spectral.GreedySpectralClustering`'s.

    ``job.params`` supplies ``random_state`` (the seed; the command line's default is 0)
    and ``chunk_rows`` (rows per task; default :data:`~ooc_spectral.pipeline.representatives.TASK_ROWS`
    in whole storage chunks).
    """
    seed = int(job.params.get("random_state") or 0)
    p = int(n_components) if n_components else None  # None: k
    k = n_clusters if n_clusters == "auto" else int(n_clusters)
    output_outside_input(job.outdir, job.input)
    source = open_source(job.input)
    watch = InputWatch(source.fingerprint, job.input)
    fingerprint = watch.fingerprint
    estimator = {"affinity": "representatives", "graph": "local scales s_t s_j, reach 4K",
                 "n_clusters": k, "n_components": p,
                 "n_representatives": resolve_n_representatives(n_representatives, k),
                 "n_neighbors": int(n_neighbors), "n_init": int(n_init), "random_state": seed,
                 "chunk_rows": job.params.get("chunk_rows")}
    resolved = {"estimator": estimator, "input": input_identity(source)}
    rundir = RunDirectory(job.outdir)
    rundir.check_before_writing(job.overwrite)  # a foreign directory: nothing is created
    with rundir:
        rundir.acquire(description=f"fit {job.input} (representatives)")
        extra = {**job.attrs, "input_fingerprint": fingerprint}
        resuming = begin(rundir, resolved, extra, overwrite=job.overwrite)
        if resuming and rundir.status() == "complete":
            report = recheck(rundir)  # verify's check; the repair prepared when damaged
            if report is not None:
                return report
        if resuming:
            log.info("resuming the run in %s", job.outdir)
        t0 = time.perf_counter()
        with marked_if_stopped(rundir, watch):
            with MemorySampler() as sampler, \
                    compute_engine(job.cluster, source.n_rows * source.n_features * source.itemsize) \
                    as engine:
                executor = engine.executor(ProgressLog().parts)
                _check_workers_see_input(executor, source)
                store = rundir.checkpoint(job.checkpoint_every)
                fit = fit_representatives(
                    source, n_clusters=k, n_components=p,
                    n_representatives=n_representatives, n_neighbors=n_neighbors, seed=seed,
                    n_init=n_init, executor=executor,
                    chunk_rows=job.params.get("chunk_rows"), store=store)
                times = dict(fit.times)
                t = time.perf_counter()
                out = ClusterOutput(rundir.url, source.n_rows, fit.cmap.n_components,
                                    source.storage_chunk_rows).prepare(resume=resuming)
                X = source.to_dask(out.task_rows(task_rows(source, job.params.get("chunk_rows"))))
                written = out.write(X, fit.cmap, executor)
                watch.check()
                out.mark_complete()
                times["write-back"] = time.perf_counter() - t
                _save_model(rundir.url, fit)
                where = engine.report()
            counts = _cluster_sizes(rundir.join("labels"), fit.n_clusters)
            degenerate = partition_message(counts)
            if degenerate is not None:
                warn_if_degenerate("ooc-spectral fit", counts, n_neighbors, fit.n_clusters)
            report = {
                "status": "complete", "affinity": "representatives",
                "input": resolved["input"], "input_fingerprint": fingerprint,
                "outdir": rundir.url, "n_samples": source.n_rows,
                "n_features": source.n_features, "n_clusters": fit.n_clusters,
                "n_clusters_requested": k,
                "eigengaps": (None if fit.eigengaps is None
                              else [float(v) for v in fit.eigengaps]),
                "laplacian_eigenvalues": [float(v) for v in fit.laplacian_eigenvalues],
                "degenerate_partition": degenerate,
                "n_components": fit.cmap.n_components,
                "n_representatives": fit.cmap.tmap.representatives.size,
                "n_neighbors": fit.cmap.tmap.representatives.n_neighbors,
                "eigenvalues": [float(v) for v in fit.cmap.tmap.eigenvalues],
                "cluster_sizes": [int(c) for c in counts],
                "kmeans_inertia": fit.inertia,
                "rows_written": written,
                "stages": {name: {"seconds": round(sec, 4)} for name, sec in times.items()},
                "wall_seconds": round(time.perf_counter() - t0, 4),
                "peak_memory_bytes": sampler.peak, **where,
                "resumed": bool(resuming), "config": resolved,
                **provenance(resolved),
            }
            return complete(rundir, report, {**EMBEDDING, **LABELS, **CLUSTER_MODEL})


def load_cluster_map(outdir: str):
    """``(ClusterMap, digest)`` of the ``representatives_model`` a fit wrote in ``outdir``,
    or None when ``outdir`` holds none. Every chunk and both digests are checked:
    :class:`~ooc_spectral.exceptions.DamagedDataError` naming the fit to rerun otherwise."""
    from ..core.representatives import ClusterMap, Representatives, TransferCutMap
    from ..io.integrity import arrays_digest
    from ..io.storage import join

    url = join(str(outdir), MODEL)
    try:
        zarr.open_group(url, mode="r")
    except Exception:
        return None
    arrays, meta = read_sealed_group(
        url, REPRESENTATIVES_KEY, "the representatives fit's map",
        f"rerun the fit that wrote {outdir} (the same command repairs it)")
    reps = Representatives(arrays["representatives"], int(meta["n_neighbors"]),
                           arrays.get("scales"), meta.get("reach"))
    tmap = TransferCutMap(reps, arrays["coefficients"], arrays["eigenvalues"])
    return ClusterMap(tmap, arrays["centers"]), arrays_digest(arrays)


def run_representatives_transform(model: str, cmap, digest: str, input, out: str, cluster,
                                  overwrite: bool = False) -> dict:
    """``ooc-spectral transform FIT_OUTDIR IN --out OUT`` for a representatives fit: the
    coordinates and labels of new rows (``predict``), written and resumable as the fit's."""
    from ..exceptions import InvalidInputError
    from ..io.storage import absolute

    output_apart_from_model(out, model)
    output_outside_input(out, input)
    source = open_source(input)
    d = cmap.tmap.representatives.n_features
    if source.n_features != d:
        raise InvalidInputError(f"{input} has {source.n_features} features, but the model was "
                                f"fitted with {d}; pass rows with the training columns")
    resolved = {"model": absolute(model), "input": input_identity(source)}
    watch = InputWatch(source.fingerprint, input)
    fingerprint = watch.fingerprint
    rundir = RunDirectory(out)
    rundir.check_before_writing(overwrite)  # a foreign directory: nothing is created
    with rundir:
        rundir.acquire(description=f"transform {input} (representatives)")
        extra = {"input_fingerprint": fingerprint, "model_sha256": digest}
        resuming = begin(rundir, resolved, extra, overwrite=overwrite)
        if resuming and rundir.status() == "complete":
            report = recheck(rundir)  # verify's check; the repair prepared when damaged
            if report is not None:
                return report
        t0 = time.perf_counter()
        with marked_if_stopped(rundir, watch):
            with compute_engine(cluster, source.n_rows * source.n_features * source.itemsize) \
                    as engine:
                executor = engine.executor(ProgressLog().parts)
                output = ClusterOutput(rundir.url, source.n_rows, cmap.n_components,
                                       source.storage_chunk_rows).prepare(resume=resuming)
                X = source.to_dask(output.task_rows(task_rows(source)))
                output.write(X, cmap, executor)
                watch.check()
                output.mark_complete()
            report = {"status": "complete", "affinity": "representatives",
                      "model": resolved["model"], "input": resolved["input"],
                      "input_fingerprint": fingerprint, "n_samples": source.n_rows,
                      "n_components": cmap.n_components,
                      "cluster_sizes": [int(c) for c in _cluster_sizes(
                          rundir.join("labels"), len(cmap.centers))],
                      "wall_seconds": round(time.perf_counter() - t0, 4),
                      **provenance(resolved)}
            return complete(rundir, report, {**EMBEDDING, **LABELS})
