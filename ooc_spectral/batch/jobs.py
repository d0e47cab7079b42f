"""Batch jobs: what ``ooc-spectral fit`` and ``transform`` do, without the parsing.

A job owns an output directory (see :mod:`ooc_spectral.io.checkpoint`): it takes
the lock, checks that the directory holds nothing or a run of the same
configuration, runs (or resumes) the pipeline on a dask cluster, saves the
model, writes ``report.json`` and, last, marks the run complete. A job that
fails leaves the directory marked ``failed``; the same command resumes it.

The command line and the workflow runner call these functions; no algorithm
code lives here either, only orchestration.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field

from .._accel.blas import fast_solve_order, pass_libraries
from ..io.checkpoint import RunDirectory
from ..io.integrity import InputWatch
from ..runtime.cluster import ClusterOptions, compute_engine
from ..core.config import FitConfig
from ..runtime.execution import Executor
from ..runtime.monitor import MemorySampler, ProgressLog
from ..io.persistence import model_of_fit, read_model, write_model
from ..io.safety import output_apart_from_model, output_outside_input
from ..exceptions import DictionaryError
from ..pipeline.advice import with_advice
from ..pipeline.fit import FitRun
from ..core.pass2 import block_entries
from ..core.planning import plan_block_rows, plan_tasks, solve_block_rows
from ..io.source import DataSource, open_source
from ..pipeline.writeback import EmbeddingOutput, client_accel
from .outdir import (EMBEDDING, MODEL, begin, complete, marked_if_stopped,
                     prune_damaged_checkpoint, provenance, recheck)

__all__ = ["FitJob", "TransformJob", "run_fit_job", "run_transform_job", "input_identity"]

log = logging.getLogger("ooc_spectral")


def input_identity(source: DataSource) -> dict:
    """What identifies the input in a run's configuration (a URL as given, never its
    storage options: credentials are not part of the identity, nor written anywhere)."""
    from ..io.storage import absolute

    url = source.url
    if url is not None:
        url = absolute(url)
    return {"url": url, "shape": list(source.shape), "dtype": str(source.dtype),
            "chunk_rows": int(source.storage_chunk_rows)}


def _check_workers_see_input(executor: Executor, source: DataSource) -> None:
    """Fail fast (exit 2) when a worker cannot open the input or its first chunk.

    Runs through the executor, so a cluster with no worker fails after its
    no-worker timeout instead of waiting forever.
    """
    if not executor.distributed or source.kind != "zarr" or source.url is None:
        return
    import dask

    from ..io.verify import check_readable_here
    from ..io.storage import StorageOptions, options_for

    # a URL: the worker opens it with the command's storage options (never shown in logs)
    options = StorageOptions(options_for(source.url))
    executor.run("preflight", {0: dask.delayed(check_readable_here, pure=False)(
        source.url, options)})


@dataclass
class FitJob:
    """Everything ``ooc-spectral fit`` was asked to do."""

    input: str
    outdir: str
    params: dict
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    checkpoint_every: int = 4
    overwrite: bool = False
    performance_report: str | None = None
    attrs: dict = field(default_factory=dict)


@contextlib.contextmanager
def _performance_report(path: str | None):
    if not path:
        yield
        return
    from distributed import performance_report

    with performance_report(filename=path):
        yield


def run_fit_job(job: FitJob) -> dict:
    """Run or resume a fit into ``job.outdir``; returns the report."""
    config = FitConfig.from_params(job.params)
    if isinstance(job.input, (str, os.PathLike)):
        output_outside_input(job.outdir, job.input)
    source = open_source(job.input)
    watch = InputWatch(source.fingerprint, job.input)  # a missing chunk: an error, never zeros
    fingerprint = watch.fingerprint
    resolved = {"estimator": config.to_json(), "input": input_identity(source)}
    rundir = RunDirectory(job.outdir)
    rundir.check_before_writing(job.overwrite)  # a foreign directory: nothing is created
    with rundir:
        rundir.acquire(description=f"fit {job.input}")
        extra = {**job.attrs, "input_fingerprint": fingerprint}
        overwrite = job.overwrite
        if not overwrite:  # rows appended to the input of a finished fit: update it
            from .append import plan_append

            rundir.check_before_writing()  # again under the lock
            attrs = rundir.run_attrs()
            if attrs:  # a garbled checkpoint part would fail every rerun the same way
                prune_damaged_checkpoint(rundir, full=False)
            plan, why = plan_append(attrs, resolved, source, config,
                                    rundir.checkpoint(job.checkpoint_every) if attrs else None,
                                    fingerprint)
            if plan is not None:  # the checkpoint as verify sees it, then the update
                prune_damaged_checkpoint(rundir, full=True)
                return _run_update_job(job, rundir, plan, source, config, resolved, watch)
            if why:
                log.warning("the run in %s cannot be updated with the rows of %s (%s): fitting "
                            "every row again", job.outdir, job.input, why)
                overwrite = True
        resuming = begin(rundir, resolved, extra, overwrite=overwrite)
        if resuming:
            prune_damaged_checkpoint(rundir, full=False)
        if resuming and rundir.status() == "complete":
            report = recheck(rundir)  # verify's check; the repair prepared when damaged
            if report is not None:
                return report
            if (rundir.run_attrs() or {}).get("last_update"):
                # the result of an update with appended rows: the checkpoint holds the
                # first fit's scan and sums (of fewer rows), which cannot repair it
                log.warning("%s came from an update with appended rows, which the saved run "
                            "state cannot repair: fitting every row again", job.outdir)
                resuming = begin(rundir, resolved, extra, overwrite=True)
        if resuming:
            log.info("resuming the run in %s", job.outdir)
        t0 = time.perf_counter()
        progress = ProgressLog()
        with marked_if_stopped(rundir, watch):
            with MemorySampler() as sampler, \
                    compute_engine(job.cluster, source.n_rows * source.n_features * source.itemsize,
                                   needs_cluster=bool(job.performance_report)) as engine, \
                    _performance_report(job.performance_report):
                executor = engine.executor(progress.parts)
                run = FitRun(config, source, executor=executor,
                             checkpoint=rundir.checkpoint(job.checkpoint_every), resume=resuming,
                             memory_probe=sampler.take_peak, on_scan=progress.scan)
                _check_workers_see_input(executor, source)
                try:
                    with client_accel(source.n_rows):
                        result = run.run(output=rundir.url)
                except DictionaryError as err:
                    advised = with_advice(err, config, source)
                    if advised is err:
                        raise
                    raise advised from err
                watch.check()  # the input read by every pass is the one fingerprinted
                with run.stage("model"):
                    rundir.remove_member("model")  # ours: a damaged one is replaced too
                    write_model(model_of_fit(result, config), rundir.join("model"))
                    base_rows = _keep_update_base(rundir, job, config, source, result)
                where = engine.report()
            report = {
                "status": "complete",
                "input": resolved["input"],
                "input_fingerprint": fingerprint,
                "outdir": rundir.url,
                "n_samples": result.n_samples,
                "n_features": result.n_features,
                "n_components": config.n_components,
                "kernel": config.kernel,
                "gamma": result.gamma,
                "tol": result.tol,
                "dictionary_size": result.dictionary.size,
                "max_residual": result.max_residual,
                "max_residual_row": result.max_residual_row,
                "eigenvalue_error_bound": result.eigenvalue_error_bound,
                # every exact eigenvalue's interval, [lower, upper] per component
                "eigenvalue_interval": (None if result.eigenvalue_interval is None else
                                        [[float(a), float(b)] for a, b in result.eigenvalue_interval]),
                # the certificate's rounding terms (docs/user_guide/certificate.md)
                "rounding": result.rounding,
                "eigenvalues": [float(v) for v in result.spectral_map.eigenvalues],
                "normalization": config.normalization,
                "degree_estimate": config.degree_estimate if config.normalization == "divisive" else None,
                "task_rows": result.task_rows,
                "tasks": result.tasks,
                # pass 2's tasks: pass 3's, the last ones re-split to balance the threads
                # (none on the exact path)
                "pass2_tasks": None if result.exact else (result.reduce_tasks or result.tasks),
                "block_rows": result.block_rows,
                "output_dtype": config.output_dtype,
                "stages": {name: {"seconds": round(sec, 4),
                                  "peak_memory_bytes": run.peak_memory.get(name)}
                           for name, sec in run.timings.items()},
                "wall_seconds": round(time.perf_counter() - t0, 4),
                "peak_memory_bytes": sampler.peak,
                **where,
                "resumed_stages": result.resumed,
                "config": resolved,
                **pass2_libraries(result),
                **provenance(resolved),
            }
            return complete(rundir, report, {**EMBEDDING, **MODEL}, update_base=base_rows)


def pass2_libraries(result) -> dict:
    """The report's ``blas``, ``compiled_loops`` and ``pass2_block_rows``: what a task of
    pass 2 of ``task_rows`` rows runs on, in this process's installation and config (an
    external cluster's workers decide by their own). The accelerators (Intel MKL, numba's
    loops) serve only blocks of at least
    :data:`~ooc_spectral._accel.support.ACCEL_MIN_ENTRIES` entries (rows x m), so a small
    fit's tasks run on OpenBLAS and NumPy whatever is installed, and its sub-blocks keep
    the planned size (the F order). Without pass 2 (the exact path): the process's view."""
    from .._accel.support import accel_for

    m = int(result.dictionary.size)
    entries = None if result.exact or not result.task_rows else block_entries(result.task_rows,
                                                                              result.dictionary)
    with accel_for(entries):
        order = fast_solve_order()
    # blas, and compiled_loops: pass 2's elementwise loops (ooc_spectral._accel.fused); its
    # sub-blocks as that BLAS solves them (the C order on MKL)
    return {**pass_libraries(entries), "pass2_block_rows": None if result.block_rows is None
            else solve_block_rows(result.block_rows, m, order)}


def _keep_update_base(rundir: RunDirectory, job: FitJob, config: FitConfig, source: DataSource,
                      result) -> int | None:
    """Save what an update with appended rows starts from; its row count, or None."""
    from .append import append_anchor, save_base, update_supported

    anchor = append_anchor(source)
    if anchor is None or result.exact or result.scan_state is None or result.stats is None \
            or not update_supported(config)[0]:
        return None
    save_base(rundir.checkpoint(job.checkpoint_every), source.n_rows, result.scan_state,
              result.stats, result.spectral_map.components, result.gamma, anchor)
    return source.n_rows


def _run_update_job(job: FitJob, rundir: RunDirectory, plan, source: DataSource,
                    config: FitConfig, resolved: dict, watch: InputWatch) -> dict:
    """Update the finished fit in OUTDIR with the rows appended to its input (issue 16)."""
    from .append import run_update

    log.info("the input %s has %d rows appended after the %d fitted in %s: updating the fit",
             job.input, source.n_rows - plan.rows_before, plan.rows_before, job.outdir)
    t0 = time.perf_counter()
    timings: dict = {}

    @contextlib.contextmanager
    def stage(name):
        t = time.perf_counter()
        try:
            yield
        finally:
            timings[name] = round(timings.get(name, 0.0) + time.perf_counter() - t, 4)

    fingerprint = watch.fingerprint
    with marked_if_stopped(rundir, watch):
        with MemorySampler() as sampler, \
                compute_engine(job.cluster, source.n_rows * source.n_features * source.itemsize,
                               needs_cluster=bool(job.performance_report)) as engine, \
                _performance_report(job.performance_report):
            what, update = run_update(
                plan, outdir=rundir.url, rundir=rundir, source=source,
                config=config, resolved=resolved, fingerprint=fingerprint,
                executor=engine.executor(ProgressLog().parts),
                checkpoint=rundir.checkpoint(job.checkpoint_every), stage=stage, watch=watch)
            where = engine.report()
        model = read_model(rundir.join("model"))
        stages = {**what.timings, **timings}
        report = {
            "status": "complete",
            "input": resolved["input"],
            "input_fingerprint": fingerprint,
            "outdir": rundir.url,
            "n_samples": source.n_rows,
            "n_features": source.n_features,
            "n_components": config.n_components,
            "kernel": config.kernel,
            "gamma": model.fitted["gamma_"],
            "tol": config.tol,
            "dictionary_size": int(model.spectral_map.dictionary.size),
            "max_residual": update["max_residual"],
            "max_residual_row": update["max_residual_row"],
            "eigenvalue_error_bound": update["eigenvalue_error_bound"],
            "eigenvalues": [float(v) for v in model.spectral_map.eigenvalues],
            "normalization": config.normalization,
            "update": {
                "rows_before": what.rows_before, "rows_added": what.rows_added,
                "dictionary_before": what.dictionary_before,
                "dictionary_points_added": what.dictionary_after - what.dictionary_before,
                "eigenvalue_order_changed": what.order_changed,
                "signs": "kept consistent with the previous model",
                "resumed": plan.phase == "write",
            },
            "stages": {name: {"seconds": sec} for name, sec in stages.items()},
            "wall_seconds": round(time.perf_counter() - t0, 4),
            "peak_memory_bytes": sampler.peak,
            **where,
            "resumed_stages": ["pass3"] if plan.phase == "write" else [],
            "config": resolved,
            **provenance(resolved),
        }
        return complete(rundir, report, {**EMBEDDING, **MODEL}, update=None,
                        update_base=source.n_rows,
                         last_update={k: report["update"][k]
                                      for k in ("rows_before", "rows_added")})


@dataclass
class TransformJob:
    """Everything ``ooc-spectral transform`` was asked to do."""

    model: str
    input: str
    out: str
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    overwrite: bool = False
    chunk_rows: int | None = None
    attrs: dict = field(default_factory=dict)  # recorded with the run (the workflow step)


def run_transform_job(job: TransformJob) -> dict:
    """Out-of-sample embedding of ``job.input`` with a saved model, into ``job.out``."""
    output_apart_from_model(job.out, job.model)  # before anything is read or written
    # the digest read with the arrays it covers (a refit between two reads cannot pair
    # the new digest with the old model's rows)
    model = read_model(job.model)
    model_digest, n_features_in = model.digest, int(model.fitted["n_features_in_"])
    if isinstance(job.input, (str, os.PathLike)):
        output_outside_input(job.out, job.input)
    smap = model.spectral_map
    source = open_source(job.input)
    if source.n_features != n_features_in:
        from ..exceptions import InvalidInputError

        raise InvalidInputError(
            f"{job.input} has {source.n_features} features, but the model was fitted with "
            f"{n_features_in}; pass rows with the training columns"
        )
    from ..io.storage import absolute

    resolved = {"model": absolute(job.model), "input": input_identity(source)}
    watch = InputWatch(source.fingerprint, job.input)
    fingerprint = watch.fingerprint
    rundir = RunDirectory(job.out)
    rundir.check_before_writing(job.overwrite)  # a foreign directory: nothing is created
    with rundir:
        rundir.acquire(description=f"transform {job.input}")
        extra = {"input_fingerprint": fingerprint, "model_sha256": model_digest, **job.attrs}
        resuming = begin(rundir, resolved, extra, overwrite=job.overwrite)
        if resuming and rundir.status() == "complete":
            report = recheck(rundir)  # verify's check; the repair prepared when damaged
            if report is not None:
                return report
        t0 = time.perf_counter()
        with marked_if_stopped(rundir, watch):
            progress = ProgressLog()
            with compute_engine(job.cluster, source.n_rows * source.n_features * source.itemsize
                                ) as engine:
                executor = engine.executor(progress.parts)
                plan = plan_tasks(source.n_rows, source.n_features, source.storage_chunk_rows,
                                  threads=executor.threads, memory=executor.task_memory,
                                  requested=job.chunk_rows, itemsize=source.itemsize)
                if plan.note:
                    log.warning("--chunk-rows: %s", plan.note)
                out = EmbeddingOutput(job.out, source.n_rows, smap.n_components,
                                      plan.output_chunk_rows,
                                      dtype=model.params.get("output_dtype")
                                      ).prepare(resume=resuming)
                block = plan_block_rows(plan.rows, source.n_features, smap.dictionary.size,
                                        memory=executor.task_memory, itemsize=source.itemsize,
                                        cache=executor.cache_block)
                out.write(source.task_view(out.task_rows(plan.rows)), smap, executor,
                          block_rows=block)
            watch.check()  # every row embedded is of the input fingerprinted
            out.mark_complete()
            report = {"status": "complete", "model": resolved["model"], "input": resolved["input"],
                      "input_fingerprint": fingerprint,
                      "n_samples": source.n_rows, "n_components": smap.n_components,
                      "wall_seconds": round(time.perf_counter() - t0, 4),
                      **provenance(resolved)}
            return complete(rundir, report, EMBEDDING)
