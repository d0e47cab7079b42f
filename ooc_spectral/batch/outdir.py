"""The contract every command that writes an OUTDIR keeps, in one place (issue 52).

``fit``, the update with appended rows, ``transform``, and ``--affinity representatives``
fit and transform all run through these functions:

- **the input's fingerprint** is taken when the command starts and checked when its work
  is done, before anything says complete
  (:class:`~ooc_spectral.io.integrity.InputWatch`): an input changed while it was read is
  :class:`~ooc_spectral.exceptions.InputChangedError`, exit 1, and the rerun starts clean;
- :func:`begin` starts the run or takes up the one in OUTDIR: the same configuration
  resumes, unless the input or the model it reads changed since it began (then it starts
  over, and the log says why);
- :func:`recheck` is what the rerun of a **complete** OUTDIR does: it checks it as
  ``ooc-spectral verify`` does (:func:`~ooc_spectral.io.manifest.audit`: every member
  against the digests the run recorded, every chunk re-read) and returns the report when
  it is intact; otherwise it prepares the repair (chunks unmarked, members removed that
  must be written whole) and the command runs again on the saved state;
- :func:`marked_if_stopped`: a command that fails or is interrupted leaves OUTDIR marked
  ``failed`` or ``interrupted`` (never complete), and the same command resumes it;
- :func:`complete` records the manifest of the members written (digests, in
  ``report.json`` and in the run's attributes), writes ``report.json`` and its digest,
  and marks the run complete, last.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging

from ..io.checkpoint import RunDirectory, _now, config_hash, record_edited
from ..io.manifest import (MEMBERS_KEY, REPORT_DIGEST, REPRESENTATIVES_KEY, audit,
                           chunked_entry, sealed_entry)
from ..io.persistence import MODEL_KEY, package_versions

__all__ = ["begin", "recheck", "complete", "marked_if_stopped", "provenance",
           "prune_damaged_checkpoint", "EMBEDDING", "MODEL", "LABELS", "CLUSTER_MODEL"]

log = logging.getLogger("ooc_spectral")

#: The members a command names to :func:`complete` (name -> (kind, markers or key)).
EMBEDDING = {"embedding": ("chunked", "embedding_written")}
LABELS = {"labels": ("chunked", "labels_written")}
MODEL = {"model": ("sealed", MODEL_KEY)}
CLUSTER_MODEL = {"representatives_model": ("sealed", REPRESENTATIVES_KEY)}
#: Every chunked output an OUTDIR may hold, with its markers (all written by one task per
#: chunk: when one must be written whole again, all are).
CHUNKED = {**EMBEDDING, **LABELS}


def provenance(resolved: dict) -> dict:
    """The closing fields of every ``report.json``: the configuration's hash, the versions
    that ran it, and when it finished."""
    return {"config_hash": config_hash(resolved), "versions": package_versions(),
            "finished": _now()}


def _mark_stopped(rundir: RunDirectory, exc: BaseException) -> None:
    """Mark OUTDIR ``interrupted`` (SIGTERM, SIGINT) or ``failed``; never raises (a full disk).
    A run marked complete (the signal came after its last write) stays complete."""
    with contextlib.suppress(Exception):
        if rundir.status() == "complete":
            return
    if isinstance(exc, KeyboardInterrupt):
        import signal

        name = signal.Signals(getattr(exc, "signum", signal.SIGINT)).name
        with contextlib.suppress(Exception):
            rundir.mark("interrupted", error=f"interrupted by {name}", interrupted=_now())
        return
    with contextlib.suppress(Exception):
        rundir.mark("failed", error=f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def marked_if_stopped(rundir: RunDirectory, watch=None):
    """Mark OUTDIR ``interrupted`` or ``failed`` when the block raises (and re-raise).

    ``watch``: the input's :class:`~ooc_spectral.io.integrity.InputWatch`; an error met
    while the input moved (a chunk caught mid-rewrite) is reported as the input's change
    (:meth:`~ooc_spectral.io.integrity.InputWatch.explain`: exit 1, rerun), not as damage.
    """
    try:
        yield
    except BaseException as exc:
        error = exc if watch is None else watch.explain(exc)
        _mark_stopped(rundir, error)
        if error is exc:
            raise
        raise error from exc


# --------------------------------------------------------------------------- #
# beginning, or taking up the run in OUTDIR
# --------------------------------------------------------------------------- #
def begin(rundir: RunDirectory, resolved: dict, extra: dict, *, overwrite: bool) -> bool:
    """Begin the run in OUTDIR or take up the one there; True to resume (the same
    configuration, and the same input and model as when it began). The input at the same
    path with other rows or chunks (tonight's file, rewritten) is a changed input too: the
    run starts over (an update with appended rows is planned before, by the fit)."""
    from ..exceptions import ConfigurationMismatchError

    try:
        resuming = rundir.begin(resolved, overwrite=overwrite, extra=extra)
    except ConfigurationMismatchError:
        old = rundir.run_attrs() or {}
        config = old.get("config") or {}
        if record_edited(old) or \
                {**config, "input": config.get("input", {}).get("url")} != \
                {**resolved, "input": resolved["input"]["url"]}:
            raise  # another configuration (or an edited record), not only another input
        log.warning("the input %s has other rows or chunks than when the run in %s began: "
                    "starting over", resolved["input"]["url"], rundir.path)
        return rundir.begin(resolved, overwrite=True, extra=extra)
    resuming = resuming and _same_input_or_restart(rundir, resolved, extra)
    if resuming:
        _drop_mixed_outputs(rundir)
    return resuming


def _drop_mixed_outputs(rundir: RunDirectory) -> None:
    """Remove the chunked outputs (with their markers) when one of them, or its markers, is
    of another run than the others (copied in from another output): the resumed write-back
    writes them whole again, instead of refusing the markers of another run forever."""
    import zarr

    try:
        group = zarr.open_group(rundir.url, mode="r")
        ids = {group[n].attrs.get("run_id") for name, (_, markers) in CHUNKED.items()
               for n in (name, markers) if n in group}
    except Exception:  # a garbled member: the write-back's own audit names it
        return
    if len(ids) > 1:
        log.warning("the outputs in %s are of %d different runs (copied in from another "
                    "output?); writing them whole again", rundir.path, len(ids))
        for name, (_, markers) in CHUNKED.items():
            rundir.remove_member(name)
            rundir.remove_member(markers)


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


def recheck(rundir: RunDirectory) -> dict | None:
    """The rerun of a complete OUTDIR: its report when OUTDIR is intact, else None after
    preparing the repair (the caller then resumes the run on its saved state).

    The check is ``verify``'s (:func:`~ooc_spectral.io.manifest.audit`). The repair:
    checkpoint parts that are damaged are removed (computed again if needed); the chunks
    of an output that are missing or damaged are unmarked (written again by the resumed
    write-back); an output whose metadata, markers or run are not the run's is removed
    with every chunked output beside it (written whole again); a damaged or foreign
    sealed member (a model) is removed (written again); the run is marked ``running``
    with the list of what was repaired.
    """
    import zarr

    prune_damaged_checkpoint(rundir, full=True)
    findings, _ = audit(rundir.url)
    if not findings:
        log.info("%s already holds the complete result of this configuration (checked as "
                 "verify does: intact)", rundir.path)
        return rundir.read_report() or {}
    lines = [str(f) for f in findings]
    log.warning("%s was complete, but %d of its members or chunks are missing, damaged or "
                "another run's (%s); repairing it", rundir.path, len(lines), "; ".join(lines[:5]))
    names = set(CHUNKED) | {markers for _, markers in CHUNKED.values()}
    if any(f.whole and f.member in names for f in findings):
        for name, (_, markers) in CHUNKED.items():
            rundir.remove_member(name)
            rundir.remove_member(markers)
    else:
        for name, (_, markers) in CHUNKED.items():
            bad = sorted({f.chunk for f in findings if f.member == name and f.chunk is not None})
            if bad:
                marks = zarr.open_array(rundir.join(markers), mode="r+")
                for i in bad:
                    marks[i] = 0
    for f in findings:
        parts = f.member.split("/")
        if parts[0] == "checkpoint":  # a part: discarded, computed again when needed
            rundir.remove_member("/".join(parts[:3] if parts[1:2] == ["partials"] else parts[:2]))
        elif parts[0] == "zarr.json":  # the run's record: RunDirectory.begin restored it
            continue
        elif parts[0] not in names:  # a sealed member (a model), the report: written again
            rundir.remove_member(parts[0])
    rundir.mark("running", repaired=lines[:100])
    return None


# --------------------------------------------------------------------------- #
# the end
# --------------------------------------------------------------------------- #
def complete(rundir: RunDirectory, report: dict, members: dict, **marker) -> dict:
    """Record the manifest of ``members``, write ``report.json``, then mark the run
    complete, last; returns the report.

    ``members`` maps each member the command wrote to its kind (:data:`EMBEDDING`,
    :data:`MODEL`, ...). Each gets a digest (:mod:`ooc_spectral.io.manifest`), recorded in
    the report (``members``; and, as before, ``embedding_run_id`` and ``model_sha256``)
    and, with the report's own SHA-256, in the run's attributes: ``verify`` and every rerun
    check the OUTDIR against them. A chunked output with a chunk never written raises
    (it is not complete).
    """
    import zarr

    group = zarr.open_group(rundir.url, mode="r")
    manifest = {name: chunked_entry(group, name, arg) if kind == "chunked"
                else sealed_entry(group, name, arg) for name, (kind, arg) in members.items()}
    report[MEMBERS_KEY] = manifest
    if "embedding" in manifest:
        report["embedding_run_id"] = manifest["embedding"]["run_id"]
    if "model" in manifest:
        report["model_sha256"] = manifest["model"]["sha256"]
    blob = rundir.write_report(report)
    rundir.mark("complete", finished=report["finished"], **{
        MEMBERS_KEY: manifest, REPORT_DIGEST: hashlib.sha256(blob).hexdigest()}, **marker)
    return report


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
