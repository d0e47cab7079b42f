"""The subcommands of ``ooc-spectral``, each a function of its parsed arguments.

``cmd_make_data``, ``cmd_import``, ``cmd_fit``, ``cmd_transform``, ``cmd_plot``,
``cmd_evaluate``, ``cmd_inspect`` and ``cmd_verify`` check what argparse cannot and
hand the work to :mod:`ooc_spectral.batch.jobs`, :mod:`ooc_spectral.io.datasets`,
:mod:`ooc_spectral.io.importing`, :mod:`ooc_spectral.batch.plotting` and the others;
:func:`run_command` runs one of them with its URLs checked first and its storage
options in effect (the command line, :mod:`ooc_spectral.batch.cli`, and a workflow's
steps, :mod:`ooc_spectral.batch.workflow`, both run commands through it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..core.config import parameter_fields
from ..exceptions import UsageError

__all__ = ["CommandError", "run_command", "estimator_params", "LOCATION_ARGS"]


class CommandError(UsageError):
    """A usage error found after parsing (exit code 2)."""


def estimator_params(args: argparse.Namespace) -> dict:
    return {f.name: getattr(args, f.name) for f in parameter_fields() if f.metadata["cli"]}


def _cluster_options(args):
    from ..runtime.cluster import ClusterOptions
    from ..runtime.memory import check_memory_limit

    for name in ("workers", "threads_per_worker"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CommandError(f"--{name.replace('_', '-')}={value} must be at least 1")
    check_memory_limit(args.memory_limit)  # exit 2 before any work
    from ..runtime.cluster import check_scheduler_scheme

    check_scheduler_scheme(args.scheduler)  # udp://...: exit 2 before anything is created
    return ClusterOptions(scheduler=args.scheduler, workers=args.workers,
                          threads_per_worker=args.threads_per_worker,
                          memory_limit=args.memory_limit, quiet=bool(args.quiet),
                          engine=args.engine)


# --------------------------------------------------------------------------- #
# subcommands
# --------------------------------------------------------------------------- #
def cmd_make_data(args) -> dict:
    from ..io.datasets import make_data

    if args.n < 1:
        raise CommandError(f"--n {args.n} must be at least 1")
    params = _key_values(args.param)
    path = make_data(args.name, args.n, args.out, dim=args.dim, noise=args.noise, seed=args.seed,
                     chunk_rows=args.chunk_rows, dtype=args.dtype, overwrite=args.overwrite,
                     reuse=True, **params)
    return {"status": "complete", "out": str(path), "n": args.n, "name": args.name}


def cmd_import(args) -> dict:
    from ..io.importing import import_table

    columns = None
    if args.columns:
        columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    result = import_table(args.input, args.out, columns=columns, format=args.format,
                          dataset=args.dataset, chunk_rows=args.chunk_rows, dtype=args.dtype,
                          overwrite=args.overwrite, header=args.header)
    return {"status": "complete", **result}


def cmd_fit(args) -> dict:
    from .jobs import FitJob, run_fit_job

    if args.checkpoint_every < 1:
        raise CommandError(f"--checkpoint-every {args.checkpoint_every} must be at least 1")
    if args.performance_report:
        try:
            import bokeh  # noqa: F401  (dask's performance report is drawn with bokeh)
        except ImportError:
            raise CommandError("--performance-report needs bokeh: pip install "
                               "'ooc_spectral[report]'") from None
    job = FitJob(input=args.input, outdir=args.out, params=estimator_params(args),
                 cluster=_cluster_options(args), checkpoint_every=args.checkpoint_every,
                 overwrite=args.overwrite, performance_report=args.performance_report,
                 attrs=getattr(args, "workflow_attrs", None) or {})
    affinity = getattr(args, "affinity", None)
    clustering = getattr(args, "n_clusters", None) is not None
    if affinity == "representatives" or (affinity is None and clustering):
        return _fit_representatives(args, job)
    if clustering:
        raise CommandError("--n-clusters clusters on --affinity representatives (the default); "
                           "--affinity kernel writes the embedding only: leave --affinity out")
    report = run_fit_job(job)
    return {k: report.get(k) for k in ("status", "outdir", "n_samples", "dictionary_size",
                                       "max_residual", "gamma", "wall_seconds", "resumed_stages",
                                       "config_hash", "update")}


def _fit_representatives(args, job) -> dict:
    from ..core.config import FitConfig
    from .representatives_job import run_representatives_job

    if args.n_clusters is None or (args.n_clusters != "auto" and args.n_clusters < 1):
        raise CommandError("--affinity representatives needs --n-clusters K, K at least 1 "
                           "(as GreedySpectralClustering), or --n-clusters auto")
    for flag, value in (("--n-representatives", args.n_representatives),
                        ("--n-neighbors", args.n_neighbors)):
        if value != "auto" and value < 1:
            raise CommandError(f"{flag} {value} must be at least 1")
    fields = FitConfig.__dataclass_fields__
    ignored = [f"--{k.replace('_', '-')}" for k, v in job.params.items()
               if k not in ("n_components", "random_state", "chunk_rows") and k in fields
               and v != fields[k].default
               and not (k == "output_dtype" and v == "float64")]  # the command line's default
    if ignored:
        import logging

        logging.getLogger("ooc_spectral").warning(
            "--affinity representatives does not use %s (options of the kernel embedding)",
            ", ".join(ignored))
    default_p = fields["n_components"].default
    p = None if args.n_components == default_p else args.n_components  # not given: K
    report = run_representatives_job(job, n_clusters=args.n_clusters,
                                     n_representatives=args.n_representatives,
                                     n_neighbors=args.n_neighbors, n_components=p)
    return {k: report.get(k) for k in ("status", "outdir", "n_samples", "n_clusters",
                                       "n_representatives", "cluster_sizes",
                                       "degenerate_partition", "wall_seconds", "config_hash")}


def cmd_transform(args) -> dict:
    from ..io.verify import check_fit_output
    from .jobs import TransformJob, run_transform_job
    from .representatives_job import load_cluster_map, run_representatives_transform

    check_fit_output(args.model)  # a fit OUTDIR: finished, every member its own (as verify)
    found = load_cluster_map(args.model)
    if found is not None:  # the OUTDIR of fit --affinity representatives: predict
        report = run_representatives_transform(args.model, *found, args.input, args.out,
                                               _cluster_options(args), args.overwrite)
        return {"status": report.get("status"), "out": args.out,
                "n_samples": report.get("n_samples"), "cluster_sizes": report.get("cluster_sizes")}
    report = run_transform_job(TransformJob(model=args.model, input=args.input, out=args.out,
                                            cluster=_cluster_options(args),
                                            overwrite=args.overwrite, chunk_rows=args.chunk_rows,
                                            attrs=getattr(args, "workflow_attrs", None) or {}))
    return {"status": report.get("status"), "out": args.out, "n_samples": report.get("n_samples")}


def cmd_plot(args) -> dict:
    from .plotting import plot_embedding

    try:
        dims = tuple(int(v) for v in args.dims.split(","))
    except ValueError:
        raise CommandError(f"--dims {args.dims!r} must be two integers like 0,1") from None
    if len(dims) != 2:
        raise CommandError(f"--dims {args.dims!r} must be two integers like 0,1")
    info = plot_embedding(args.outdir, args.out, color_by=args.color_by, dims=dims,
                          density=args.density, title=args.title)
    return {"status": "complete", "out": args.out, **info}


def cmd_evaluate(args) -> dict:
    from ..experiments import available, run_experiment

    if args.list:
        for name, func in sorted(available().items()):
            doc = (func.__doc__ or "").strip().splitlines()
            print(f"{name}: {doc[0] if doc else ''}")
        return {"experiments": sorted(available())}
    if not args.experiment or not args.out:
        raise CommandError("evaluate needs an experiment name and --out (or --list)")
    params = _key_values(args.param)
    if "cache_dir" in params:  # a path written to: only the checked option may name it
        raise CommandError(
            "cache_dir is a path the experiment writes to: give it as --cache-dir (in a "
            "workflow file, the step's cache_dir key, resolved and checked like out), not "
            "as a --param")
    if args.cache_dir:
        params["cache_dir"] = args.cache_dir  # an experiment without a cache refuses it
    return {"status": "complete", "experiment": args.experiment, "out": args.out,
            **(run_experiment(args.experiment, args.out, **params) or {})}


def cmd_inspect(args) -> dict:
    from .inspection import inspect_path

    text, info = inspect_path(args.path)
    if not args.json:
        print(text)
    return info


def cmd_verify(args) -> dict:
    """Exit 0 when intact; 1 for any damage found (a chunk missing or damaged, a member
    missing, damaged or another run's, a garbled zarr.json, a run or a data set that did
    not finish), whatever the remedy; 2 only when nothing can be checked (no zarr group).

    An OUTDIR and a data set are checked against the manifest their writer recorded
    (every member's digest, every chunk re-read: :func:`~ooc_spectral.io.manifest.audit`);
    any other group (a saved model) chunk by chunk, with its own digests."""
    from ..exceptions import DamagedFileError, OutputDamagedError, StoreNotFoundError
    from ..io.manifest import MISSING, audit, audit_dataset, has_manifest
    from ..io.verify import (garbled_metadata, incomplete_message, input_repair,
                             require_group, rerun_command, unreadable_models, verify_group)

    require_group(args.outdir, "what verify checks (an OUTDIR, a data set or a saved model)")
    out = sys.stderr if args.json else sys.stdout
    garbled = garbled_metadata(args.outdir)
    try:
        findings, attrs = audit(args.outdir)
    except DamagedFileError as exc:  # OUTDIR's own zarr.json: damage found, as any other
        raise OutputDamagedError(str(exc)) from None
    except Exception:
        if not garbled:
            raise
        findings, attrs = [], _run_attrs_only(args.outdir)  # named below
    unfinished, rewrite = (None, None) if attrs is not None else input_repair(args.outdir)
    if unfinished:  # a data set whose writer did not finish: its fit's refusal says the same
        raise OutputDamagedError(f"{args.outdir}: the data set is marked incomplete "
                                 f"(complete: false): {unfinished}")
    repair = rewrite or f"run {rerun_command(args.outdir, attrs)}"
    if garbled:
        raise OutputDamagedError(
            f"{args.outdir}: {len(garbled)} zarr.json file(s) are not valid JSON ("
            f"{', '.join(garbled[:5])}); "
            + (f"{repair}: it writes them again" if attrs or rewrite
               else "restore them from a copy, or write the data again"))
    if attrs is not None and attrs.get("status") != "complete":
        raise OutputDamagedError(
            f"{args.outdir}: the run there is {attrs.get('status')!r}, not complete (it did not "
            f"finish, or is still running); run {rerun_command(args.outdir, attrs)}: it resumes "
            "(if a run holds the lock, wait for it to finish)")
    checked = attrs is not None  # against a manifest (a complete run always has one)
    if attrs is None and rewrite is not None:  # a data set: against its writer's digests
        from ..io.layout import DATASET_KEY, IMPORT_KEY

        findings, checked = [], has_manifest(args.outdir, (DATASET_KEY, IMPORT_KEY))
        for key in (DATASET_KEY, IMPORT_KEY):
            findings += audit_dataset(args.outdir, key)
    if findings:
        for f in findings:
            print(str(f), file=out)
        missing = sum(f.state == MISSING for f in findings)
        if attrs is not None:
            raise OutputDamagedError(incomplete_message(args.outdir, [str(f) for f in findings],
                                                        attrs))
        raise OutputDamagedError(
            f"{args.outdir}: {missing} missing and {len(findings) - missing} damaged chunk(s) "
            f"or member(s) ({'; '.join(str(f) for f in findings[:3])}); {repair} to repair it")
    try:
        report = verify_group(args.outdir, count_only=checked)  # else every chunk decoded
    except FileNotFoundError as exc:  # zarr's GroupNotFoundError included
        raise StoreNotFoundError(f"no zarr group at {args.outdir!r}; check the path") from exc
    bad = report["missing"] + report["damaged"] + report["digest_mismatch"]
    for line in bad:
        print(line, file=out)
    if bad:
        raise OutputDamagedError(
            f"{args.outdir}: {len(report['missing'])} missing and {len(report['damaged'])} "
            f"damaged chunk(s), {len(report['digest_mismatch'])} digest mismatch(es) in "
            f"{report['arrays']} arrays; {repair} to repair it")
    if not args.json:
        print(f"{args.outdir}: {report['chunks']} chunks of {report['arrays']} arrays intact"
              + (" (every member matches the digests its writer recorded)" if checked else ""))
    unusable = unreadable_models(args.outdir)
    for line in unusable:  # intact, but not for this version: said, not hidden behind exit 0
        print(f"{args.outdir}/{line}", file=sys.stderr)
    return {"status": "intact", **report, **({"unreadable_models": unusable} if unusable else {})}


def _run_attrs_only(path) -> dict | None:
    """The run attributes of the OUTDIR at ``path`` (None if none, or unreadable)."""
    from ..io.checkpoint import RunDirectory

    try:
        return RunDirectory(path).run_attrs()
    except Exception:
        return None


def _key_values(items) -> dict:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise CommandError(f"--param {item!r} must look like key=value")
        k, v = item.split("=", 1)
        try:
            out[k.replace("-", "_")] = json.loads(v)
        except ValueError:
            out[k.replace("-", "_")] = v
    return out


#: The arguments of a subcommand that name a place (a local path or a URL).
LOCATION_ARGS = ("input", "out", "outdir", "model", "path")


def _storage_options(args) -> dict:
    """``--storage-options`` as a dict (JSON, or ``@FILE`` holding JSON)."""
    from ..io.storage import parse_storage_options

    text = getattr(args, "storage_options", None)
    if isinstance(text, str) and text.startswith("@"):
        try:
            with open(text[1:]) as f:
                text = f.read()
        except OSError as exc:
            raise CommandError(f"--storage-options {text}: cannot read the file: {exc}") from None
    return parse_storage_options(text)


def run_command(args) -> dict:
    """Run one parsed subcommand: its URLs checked first (an unknown scheme or a missing
    backend is exit 2, before anything is created), with its storage options in effect."""
    from ..io.storage import check_location, protocol, storage_options_scope

    locations = [getattr(args, name, None) for name in LOCATION_ARGS]
    locations = [loc for loc in locations if isinstance(loc, (str, os.PathLike))]
    local_only = {cmd_plot: ("out",), cmd_evaluate: ("out",)}.get(args.func, ())
    for name in LOCATION_ARGS:
        value = getattr(args, name, None)
        if isinstance(value, (str, os.PathLike)):
            what = {"out": "--out", "outdir": "OUTDIR"}.get(name, name)
            if name in local_only:
                from ..io.checkpoint import local_output_path

                local_output_path(value)  # a PNG or tables: a local file, never s3:/...
            else:
                check_location(value, what)
            if name == "out" and protocol(value) == "memory":
                raise CommandError(
                    f"--out {value}: a memory:// store lives only as long as this command's "
                    "process, so the result would be gone when it reports success; write to a "
                    "local path or an object store (s3://bucket/key)")
    with storage_options_scope(_storage_options(args), locations):
        return args.func(args)
