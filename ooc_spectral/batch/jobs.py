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

from .._accel.blas import blas_backend, fast_solve_order
from .._accel.fused import loops_backend
from ..io.checkpoint import RunDirectory, _now, config_hash
from ..runtime.cluster import ClusterOptions, compute_engine, dask_client
from ..core.config import FitConfig
from ..runtime.execution import Executor
from ..runtime.monitor import MemorySampler, ProgressLog
from ..io.persistence import MODEL_KEY, model_of_fit, package_versions, read_model, write_model
from ..io.safety import output_apart_from_model, output_outside_input
from ..exceptions import DictionaryError
from ..pipeline.advice import with_advice
from ..pipeline.fit import FitRun
from ..core.planning import plan_block_rows, plan_tasks, solve_block_rows
from ..io.source import DataSource, open_source
from ..pipeline.writeback import EmbeddingOutput, client_accel

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


def _mark_stopped(rundir: RunDirectory, exc: BaseException) -> None:
    """Mark OUTDIR ``interrupted`` (SIGTERM, SIGINT) or ``failed``; never raises (a full disk)."""
    if isinstance(exc, KeyboardInterrupt):
        import signal

        name = signal.Signals(getattr(exc, "signum", signal.SIGINT)).name
        with contextlib.suppress(Exception):
            rundir.mark("interrupted", error=f"interrupted by {name}", interrupted=_now())
        return
    with contextlib.suppress(Exception):
        rundir.mark("failed", error=f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def _marked_if_stopped(rundir: RunDirectory):
    """Mark OUTDIR ``interrupted`` or ``failed`` when the block raises (and re-raise)."""
    try:
        yield
    except BaseException as exc:
        _mark_stopped(rundir, exc)
        raise


def _provenance(resolved: dict) -> dict:
    """The closing fields of every ``report.json``: the configuration's hash, the versions
    that ran it, and when it finished."""
    return {"config_hash": config_hash(resolved), "versions": package_versions(),
            "finished": _now()}


def _complete(rundir: RunDirectory, report: dict, **marker) -> dict:
    """Write ``report.json``, then the ``complete`` marker, last; returns the report.

    The report names the members it describes (the embedding's run id, the model's
    ``arrays_sha256``): a member copied from another OUTDIR is self-consistent, but not
    this run's (:func:`~ooc_spectral.io.verify.missing_members`)."""
    import zarr

    group = zarr.open_group(rundir.url, mode="r")
    if "embedding" in group:
        report["embedding_run_id"] = group["embedding"].attrs.get("run_id")
    if "model" in group:
        report["model_sha256"] = (group["model"].attrs.get(MODEL_KEY) or {}).get("arrays_sha256")
    rundir.write_report(report)
    rundir.mark("complete", finished=report["finished"], **marker)
    return report


def _begin(rundir: RunDirectory, resolved: dict, extra: dict, *, overwrite: bool) -> bool:
    """Begin the run in OUTDIR or take up the one there; True to resume (the same
    configuration, and the same input and model as when it began)."""
    resuming = rundir.begin(resolved, overwrite=overwrite, extra=extra)
    return resuming and _same_input_or_restart(rundir, resolved, extra)


def _same_input_or_restart(rundir: RunDirectory, resolved: dict, extra: dict) -> bool:
    """True to resume; False after starting OUTDIR over because what the run reads changed.

    ``extra`` holds the identities of what the run reads, recorded when it began:
    ``input_fingerprint`` (compared by :func:`~ooc_spectral.io.integrity.fingerprint_changes`)
    and, for a transform, ``model_sha256`` (the saved model's digest). The input or the
    model at the same path with another content (tonight's file where yesterday's was, a
    refitted model) is never answered with the old result nor mixed with the old partial
    work: OUTDIR is started clean, and the log says why.
    """
    from ..io.integrity import fingerprint_changes

    old = rundir.run_attrs() or {}
    what, why = [], []
    fingerprint = extra.get("input_fingerprint")
    if fingerprint is not None:
        recorded = old.get("input_fingerprint")
        changes = fingerprint_changes(recorded, fingerprint) if recorded else [
            "no fingerprint was recorded"]
        if changes:
            what.append(f"the input {resolved['input']['url']}")
            why += changes
    if "model_sha256" in extra and old.get("model_sha256") != extra["model_sha256"]:
        what.append(f"the model {resolved['model']}")
        why.append("the model's arrays' digest")
    if not what:
        return True
    log.warning("%s changed since the run in %s began (%s): discarding that run and "
                "starting over", " and ".join(what), rundir.path, "; ".join(why))
    rundir.begin(resolved, overwrite=True, extra=extra)
    return False


def _input_unchanged_since(source: DataSource, fingerprint: dict | None, where) -> None:
    """Raise :class:`InputChangedError` when the input's fingerprint moved since the run
    began: a late writer changed rows between the passes (or during one), and the
    embedding would be new rows through a model fitted on the old ones."""
    from ..exceptions import InputChangedError
    from ..io.integrity import fingerprint_changes

    if fingerprint is None:
        return
    changes = fingerprint_changes(fingerprint, source.fingerprint())
    if changes:
        raise InputChangedError(
            f"the input {where} changed while this run read it ({'; '.join(changes)}), so its "
            "result would mix two inputs and is not marked complete; let the writer finish, "
            "then run the same command again: it starts clean on the input as it is then")


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
    fingerprint = source.fingerprint()  # also: a missing input chunk is an error, never zeros
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
            if plan is not None:
                return _run_update_job(job, rundir, plan, source, config, resolved, fingerprint)
            if why:
                log.warning("the run in %s cannot be updated with the rows of %s (%s): fitting "
                            "every row again", job.outdir, job.input, why)
                overwrite = True
        resuming = _begin(rundir, resolved, extra, overwrite=overwrite)
        if resuming:
            prune_damaged_checkpoint(rundir, full=rundir.status() == "complete")
        if resuming and rundir.status() == "complete":
            damage = damaged_run_outputs(rundir.url)
            if not damage:
                log.info("%s already holds the complete result of this configuration",
                         job.outdir)
                return rundir.read_report() or {}
            if (rundir.run_attrs() or {}).get("last_update"):
                # the result of an update with appended rows: the checkpoint holds the
                # first fit's scan and sums (of fewer rows), which cannot repair it
                log.warning("%s was complete, but %s; its result came from an update with "
                            "appended rows, which the saved run state cannot repair: fitting "
                            "every row again", job.outdir, "; ".join(damage[:5]))
                resuming = _begin(rundir, resolved, extra, overwrite=True)
            else:
                log.warning("%s was complete, but %s; repairing it from the saved run state",
                            job.outdir, "; ".join(damage[:5]))
                from ..io.verify import embedding_to_rewrite

                if embedding_to_rewrite(damage):
                    for name in ("embedding", "embedding_written"):  # written whole again
                        rundir.remove_member(name)
                rundir.mark("running", repaired=damage[:100])
        if resuming:
            log.info("resuming the run in %s", job.outdir)
        t0 = time.perf_counter()
        progress = ProgressLog()
        with _marked_if_stopped(rundir):
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
                _input_unchanged_since(source, fingerprint, job.input)
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
                # pass 2's sub-blocks as this process's BLAS solves them (the C order on MKL;
                # as "blas", the view of this process: an external cluster's workers decide
                # by their own installation and config)
                "pass2_block_rows": None if result.block_rows is None else solve_block_rows(
                    result.block_rows, result.dictionary.size, fast_solve_order()),
                "output_dtype": config.output_dtype,
                "stages": {name: {"seconds": round(sec, 4),
                                  "peak_memory_bytes": run.peak_memory.get(name)}
                           for name, sec in run.timings.items()},
                "wall_seconds": round(time.perf_counter() - t0, 4),
                "peak_memory_bytes": sampler.peak,
                **where,
                "resumed_stages": result.resumed,
                "config": resolved,
                "blas": blas_backend(),
                "compiled_loops": loops_backend(),  # pass 2's elementwise loops (ooc_spectral._accel.fused)
                **_provenance(resolved),
            }
            return _complete(rundir, report, update_base=base_rows)


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
                    config: FitConfig, resolved: dict, fingerprint: dict | None) -> dict:
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

    with _marked_if_stopped(rundir):
        with MemorySampler() as sampler, dask_client(job.cluster) as client, \
                _performance_report(job.performance_report):
            executor = Executor(client, on_progress=ProgressLog().parts)
            what, update = run_update(
                plan, outdir=rundir.url, rundir=rundir, source=source,
                config=config, resolved=resolved, fingerprint=fingerprint, executor=executor,
                checkpoint=rundir.checkpoint(job.checkpoint_every), stage=stage)
            workers = len(client.scheduler_info().get("workers", {}))
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
            "workers": workers,
            "scheduler": job.cluster.address or "embedded LocalCluster",
            "resumed_stages": ["pass3"] if plan.phase == "write" else [],
            "config": resolved,
            **_provenance(resolved),
        }
        return _complete(rundir, report, update=None, update_base=source.n_rows,
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
    fingerprint = source.fingerprint()
    rundir = RunDirectory(job.out)
    rundir.check_before_writing(job.overwrite)  # a foreign directory: nothing is created
    with rundir:
        rundir.acquire(description=f"transform {job.input}")
        extra = {"input_fingerprint": fingerprint, "model_sha256": model_digest}
        resuming = _begin(rundir, resolved, extra, overwrite=job.overwrite)
        if resuming and rundir.status() == "complete":
            return rundir.read_report() or {}
        t0 = time.perf_counter()
        with _marked_if_stopped(rundir):
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
            out.mark_complete()
            report = {"status": "complete", "model": resolved["model"], "input": resolved["input"],
                      "input_fingerprint": fingerprint,
                      "n_samples": source.n_rows, "n_components": smap.n_components,
                      "wall_seconds": round(time.perf_counter() - t0, 4),
                      **_provenance(resolved)}
            return _complete(rundir, report)


def damaged_run_outputs(outdir) -> list[str]:
    """What is missing or damaged in a complete OUTDIR (cheap checks): the embedding's
    chunks, the model, ``report.json`` and the other members a complete OUTDIR holds.

    Embedding chunks that are missing or fail their checksum have their
    written-marker cleared, so the resumed run writes them again from the
    saved state (pass 3 is idempotent); a missing or garbled report is written
    again by the resumed run.
    """
    from ..io.verify import missing_members

    try:
        problems = EmbeddingOutput.open_existing(outdir).audit()
    except Exception as exc:  # the array's own metadata is gone or garbled: write it all again
        problems = [f"embedding: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"]
    from ..io.storage import join

    model = join(outdir, "model")
    try:
        read_model(model)
    except Exception as exc:
        problems.append(f"model: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    seen = {p.split(":", 1)[0] for p in problems}
    problems += [line for line in missing_members(outdir)[0]
                 if line.split(":", 1)[0].split("/")[0] not in seen]
    return problems


def prune_damaged_checkpoint(rundir: RunDirectory, *, full: bool) -> list[str]:
    """Remove the checkpoint parts whose metadata is garbled (and, with ``full``, those
    with a missing or damaged chunk); returns one line per part removed.

    A removed part is what a load would discard anyway (the scan state or a segment's
    sums, computed again when needed); removing it lets ``verify`` and the rerun agree,
    where a garbled ``zarr.json`` would otherwise fail every rerun the same way.
    """
    import shutil
    from pathlib import Path

    from ..io.verify import garbled_metadata, verify_group

    if rundir.remote:
        return []
    base = rundir.path / "checkpoint"
    if not base.is_dir() or base.is_symlink():
        return []

    def part_of(rel: tuple) -> tuple:
        return rel[:2] if rel and rel[0] == "partials" else rel[:1]

    doomed = {part_of(Path(p).parent.relative_to(base).parts) for p in garbled_metadata(base)}
    if full and not doomed:
        try:
            found = verify_group(base)
            doomed |= {part_of(tuple(line.split(":", 1)[0].split("/")))
                       for line in found["missing"] + found["damaged"]}
        except Exception as exc:  # unreadable as a whole: start the checkpoint over
            log.warning("the checkpoint in %s is unreadable (%s); removing it", rundir.path, exc)
            doomed.add(())
    out = []
    for rel in sorted(doomed, key=len):
        target = base.joinpath(*rel)
        if target.exists() and not target.is_symlink():
            shutil.rmtree(target)
            out.append(f"checkpoint part {'/'.join(rel) or 'checkpoint'} is damaged; discarding "
                       "it (removed; computed again if needed)")
    if out:
        log.warning("%s", "; ".join(out))
    return out
