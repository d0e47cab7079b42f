"""Rows appended to the input of a finished fit: the nightly update (issue 16).

A nightly job often sees yesterday's input with today's rows appended (the zarr
array resized, the new rows written after the old ones). Refitting reads every
row three times; an update scans only the new rows, extends the old rows'
statistics to the points the dictionary gained (the cross pass of
:mod:`ooc_spectral.pipeline.incremental`), runs pass 2 on the new rows, solves, and
writes the embedding of every row again (the map changed). The result equals
kernel PCA of every row projected on the final dictionary, as a fit does.

What makes it safe
    *Appended*, not *changed*: a finished fit records an **anchor** of its input
    (:func:`append_anchor`): the metadata without the row count, the listing
    (size and modification time or ETag) of every chunk that lies wholly within
    its rows, and a SHA-256 of the values of its last, partial, chunk. An input
    is taken for an append (:func:`appended_rows`) only when it has more rows and
    all three still agree; anything else is a new input.

    *Resumable*: the fit leaves its **base** (dictionary state and pass-2
    moments, with the eigenvectors, whose signs the update keeps) in the
    checkpoint. The update records ``update = {phase: "solve", ...}`` in the
    run's attributes before any work. Phase "solve" is redone from the base
    when killed; it ends by saving the new model and the new base and setting
    phase "write"; pass 3 then resumes chunk by chunk like any write-back. The
    base pointer moves to the new rows only with ``status = complete``.

Only kernel PCA by ``tol`` with the greedy scan is updated
(:func:`update_supported`): the divisive normalization weights every row by its
degree, which new rows change, and ``dictionary_size`` fixes the dictionary on a
sample of one fit; those refit from scratch, and the log says why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from ..io.checkpoint import RunCheckpoint, _now, config_hash, record_edited
from ..core.config import FitConfig
from ..io.integrity import _listing, chunk_keys
from ..io.source import DataSource, open_source
from ..core.statistics import Certificate, Moments, from_flat

__all__ = ["append_anchor", "appended_rows", "update_supported", "AppendPlan", "plan_append",
           "save_base", "load_base", "UpdateResult", "run_update"]

log = logging.getLogger("ooc_spectral")

#: Checkpoint part names of the base an update starts from (segment = its row count).
BASE_STATE, BASE_MOMENTS = "base-state", "base-moments"


# --------------------------------------------------------------------------- #
# is the input an append?
# --------------------------------------------------------------------------- #
def _metadata_without_rows(arr) -> str:
    meta = arr.metadata.to_dict()
    meta.pop("shape", None)
    meta.pop("attributes", None)  # attributes are not data
    return hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest()


def _prefix_digests(arr, n_rows: int, chunk_rows: int, listing: dict) -> tuple[str, str | None]:
    """(listing digest of the chunks wholly inside ``n_rows``, digest of the last partial chunk)."""
    full = n_rows // chunk_rows
    h = hashlib.sha256()
    for coords, key in chunk_keys(arr):
        if coords[0] < full:
            size, stamp = listing.get(key, (None, None))
            h.update(f"{key}|{size}|{stamp}\n".encode())
    tail = None
    if n_rows % chunk_rows:
        values = np.ascontiguousarray(arr[full * chunk_rows: n_rows])
        tail = hashlib.sha256(values.tobytes()).hexdigest()
    return h.hexdigest(), tail


def append_anchor(source: DataSource) -> dict | None:
    """What identifies the rows of a zarr input as a prefix of a longer one (None otherwise)."""
    if source.kind != "zarr":
        return None
    arr = source._zarr
    listing = _listing(arr)
    full, tail = _prefix_digests(arr, source.n_rows, source.storage_chunk_rows, listing)
    return {"n_rows": int(source.n_rows), "chunk_rows": int(source.storage_chunk_rows),
            "metadata": _metadata_without_rows(arr), "full_chunks_sha256": full,
            "tail_sha256": tail}


def appended_rows(anchor: dict | None, source: DataSource) -> tuple[int | None, str]:
    """``(rows before, "")`` when ``source`` is the anchored rows plus rows appended after them.

    Otherwise ``(None, reason)``, the reason in words for the log.
    """
    if not anchor:
        return None, "the finished run recorded no anchor of its input"
    if source.kind != "zarr":
        return None, "the input is not a zarr array"
    n_old = int(anchor["n_rows"])
    if source.n_rows <= n_old:
        return None, f"it has {source.n_rows} rows, not more than the {n_old} fitted"
    arr = source._zarr
    if int(source.storage_chunk_rows) != int(anchor["chunk_rows"]) or \
            _metadata_without_rows(arr) != anchor["metadata"]:
        return None, "its metadata (dtype, columns, chunks or codecs) changed"
    full, tail = _prefix_digests(arr, n_old, int(anchor["chunk_rows"]), _listing(arr))
    if full != anchor["full_chunks_sha256"]:
        return None, f"chunk objects within its first {n_old} rows were rewritten or replaced"
    if tail != anchor["tail_sha256"]:
        return None, f"values within its first {n_old} rows changed"
    return n_old, ""


def update_supported(config: FitConfig) -> tuple[bool, str]:
    """Whether a fit of ``config`` can be updated with appended rows, and why not."""
    if config.normalization != "additive":
        return False, ("the divisive normalization weights every row by its degree, which the "
                       "new rows change")
    if config.tol is None or config.dictionary_size is not None:
        return False, "dictionary_size fixes the dictionary on a sample of one fit"
    if config.dictionary_selection != "greedy":
        return False, f"dictionary_selection={config.dictionary_selection!r} is not incremental"
    if config.fit_inverse_transform:
        return False, ("fit_inverse_transform's pre-image map is a regression on every row's "
                       "embedding, and new rows move the embedding of the old ones")
    return True, ""


# --------------------------------------------------------------------------- #
# the base an update starts from, in the checkpoint
# --------------------------------------------------------------------------- #
def save_base(checkpoint: RunCheckpoint, n_rows: int, state, moments: Moments, components,
              gamma, anchor: dict) -> None:
    """Keep what the next update starts from: state (its kernel's centre included),
    moments, eigenvectors, anchor."""
    center = getattr(state.kernel, "center", None)
    checkpoint.save_partial(BASE_STATE, n_rows, {
        "points": np.asarray(state.points), "indices": np.asarray(state.indices),
        "L": np.asarray(state.L), "w": np.asarray(state.w),
        "components": np.asarray(components),
        "center": None if center is None else np.asarray(center, dtype=np.float64),
        "gamma": None if gamma is None else float(gamma), "anchor": anchor})
    checkpoint.save_partial(BASE_MOMENTS, n_rows,
                            dataclasses.replace(moments, beyond=None).to_flat())


def load_base(checkpoint: RunCheckpoint, n_rows: int) -> tuple[dict, Moments] | None:
    """``(state part, moments)`` saved for ``n_rows`` rows, or None (absent or damaged)."""
    state = checkpoint.load_partial(BASE_STATE, n_rows)
    moments = checkpoint.load_partial(BASE_MOMENTS, n_rows)
    if state is None or moments is None:
        return None
    return state, from_flat({**moments, "kind": "moments"})


# --------------------------------------------------------------------------- #
# planning: update, resume an update, or neither
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class AppendPlan:
    """An update to run: ``rows_before`` fitted rows, ``phase`` to start from."""

    rows_before: int
    phase: str  # "solve" (from the base) or "write" (resume pass 3 with the saved model)


def _same_but_rows(old: dict, new: dict) -> bool:
    """The two resolved configurations differ at most in the input's row count."""
    def strip(c):
        c = json.loads(json.dumps(c, default=str))
        c.get("input", {}).pop("shape", None)
        return c
    return (strip(old) == strip(new) and old["input"]["shape"][1:] == new["input"]["shape"][1:])


def plan_append(attrs: dict | None, resolved: dict, source: DataSource, config: FitConfig,
                checkpoint: RunCheckpoint | None, fingerprint: dict | None
                ) -> tuple[AppendPlan | None, str]:
    """What to do with an OUTDIR whose run attributes are ``attrs``: ``(plan, why not)``.

    Only OUTDIRs whose configuration equals the command's but for the input's
    row count are concerned (anything else is the caller's ordinary path:
    resume, no-op, or a configuration mismatch). Then:

    - an update stopped in its write-back, on the same input: resume it;
    - a complete run (or a stopped update) whose input is its rows plus
      appended ones, with a configuration that can be updated: an update;
    - otherwise, when the row count differs (an unfinished run whose input
      grew, fewer rows, a changed prefix, a configuration that cannot be
      updated): ``(None, why)``, and the caller refits every row, logging why.
    """
    if not attrs or attrs.get("config") is None or not _same_but_rows(attrs["config"], resolved):
        return None, ""
    if record_edited(attrs):
        return None, ""  # an edited record: no update of it (the ordinary path compares digests)
    update = attrs.get("update")
    in_progress = update is not None and attrs.get("status") != "complete"
    same_rows = attrs.get("config_hash") == config_hash(resolved)
    if in_progress and same_rows and attrs.get("input_fingerprint") == fingerprint and \
            update.get("phase") == "write":
        return AppendPlan(int(update["rows_before"]), "write"), ""
    if same_rows and not in_progress:
        return None, ""  # the ordinary path: a no-op, a resume, or a changed input
    n_fitted = int(attrs["config"]["input"]["shape"][0])
    if attrs.get("status") != "complete" and not in_progress:
        return None, (f"the run there did not finish and its input now has {source.n_rows} "
                      f"rows instead of {n_fitted}")
    base_rows = int(update["rows_before"]) if in_progress else attrs.get("update_base")
    if source.n_rows <= (base_rows if base_rows is not None else n_fitted):
        return None, f"it has {source.n_rows} rows, not more than the {n_fitted} fitted"
    ok, why = update_supported(config)
    if not ok:
        return None, why
    if base_rows is None or checkpoint is None:
        return None, "the finished run kept no base to update from (an exact or older run)"
    base = load_base(checkpoint, int(base_rows))
    if base is None:
        return None, "the base the finished run kept is missing or damaged"
    n_old, why = appended_rows(base[0].get("anchor"), source)
    if n_old is None:
        return None, why
    return AppendPlan(n_old, "solve"), ""


# --------------------------------------------------------------------------- #
# the update itself
# --------------------------------------------------------------------------- #
@dataclass
class UpdateResult:
    """What an update did, for the report."""

    rows_before: int
    rows_added: int
    dictionary_before: int
    dictionary_after: int
    order_changed: bool
    timings: dict = field(default_factory=dict)
    result: object = None  # the FitResult of the solve phase (None when resuming pass 3)


def _sub_source(source: DataSource, start: int, stop: int, task_rows: int) -> DataSource:
    """Rows ``[start, stop)`` of ``source`` as a re-readable (dask) source."""
    return open_source(source.to_dask(task_rows)[start:stop])


def _order_changed(prev_components, components) -> bool:
    """Whether a component's best match among the previous ones is another index."""
    m_old = prev_components.shape[0]
    dots = np.abs(components[:m_old].T @ prev_components)
    k = min(dots.shape)
    return bool(np.any(np.argmax(dots[:k, :k], axis=1) != np.arange(k)))


def solve_update(config: FitConfig, source: DataSource, base: tuple[dict, dict], n_old: int,
                 executor, timings: dict) -> UpdateResult:
    """Phase "solve": scan the appended rows, extend, accumulate, solve; checks included."""
    from ..pipeline.incremental import Batch, IncrementalFit
    from ..core.kernel_choice import make_kernel
    from ..core.checks import check_certificate, check_conditioning
    from ..pipeline.fit import FitResult
    from ..core.planning import plan_task_rows
    from ..core.scan.state import DictionaryState

    state_part, moments = base
    gamma = state_part.get("gamma")
    kernel = make_kernel(config.kernel, gamma=gamma, degree=config.degree, coef0=config.coef0,
                         center=state_part.get("center"))
    m_old = int(state_part["points"].shape[0])
    inc = IncrementalFit(config, kernel, source.n_features, executor=executor)
    inc.state = DictionaryState.from_arrays(kernel, config.affine, state_part["points"],
                                            state_part["indices"], state_part["L"], state_part["w"])
    rows = plan_task_rows(source.n_rows, source.n_features, source.storage_chunk_rows, m_old,
                          requested=config.chunk_rows, itemsize=source.itemsize)
    old = _sub_source(source, 0, n_old, rows)
    new = _sub_source(source, n_old, source.n_rows, rows)
    inc.batches = [Batch(0, n_old, moments, m_old, old)]
    prev = state_part["components"]
    inc.reference_components = prev

    def timed(name, fn, *args, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            timings[name] = round(timings.get(name, 0.0) + time.perf_counter() - t0, 4)

    first = timed("scan", inc.scan_batch, new)
    dictionary = timed("pass2", inc.accumulate_batch, new, first, keep=True)
    tol = float(config.tol)
    check_conditioning(dictionary, tol)
    worst, row = inc.max_residual
    check_certificate(Certificate(worst, row), tol, dictionary.size, kernel, dictionary,
                      max_kx=max(b.moments.sums.max_kx for b in inc.batches))
    smap = timed("solve", inc.solve)
    result = FitResult(
        config=config, n_samples=source.n_rows, n_features=source.n_features, kernel=kernel,
        gamma=gamma, tol=tol, dictionary=dictionary, spectral_map=smap, max_residual=worst,
        max_residual_row=row, task_rows=rows, eigenvalue_error_bound=inc.eigenvalue_error_bound,
        timings=dict(timings), stats=inc.stats, scan_state=inc.state)
    return UpdateResult(rows_before=n_old, rows_added=source.n_rows - n_old,
                        dictionary_before=m_old, dictionary_after=dictionary.size,
                        order_changed=_order_changed(prev, smap.components), timings=timings,
                        result=result)


def run_update(plan: AppendPlan, *, outdir: str, rundir, source: DataSource, config: FitConfig,
               resolved: dict, fingerprint: dict, executor, checkpoint: RunCheckpoint,
               stage, watch=None) -> tuple[UpdateResult, object]:
    """Run (or resume) an update of the finished run in ``outdir``; returns (what, smap).

    ``stage(name)`` is a context manager timing a stage (the job's); ``watch`` (an
    :class:`~ooc_spectral.io.integrity.InputWatch`) is checked after the write-back, before
    the embedding says complete. The caller holds the lock and writes the report and the
    completion marker.
    """
    from ..io.persistence import model_of_fit, read_model, write_model
    from ..core.planning import plan_task_rows
    from ..pipeline.writeback import EMBEDDING, WRITTEN, EmbeddingOutput

    attrs = rundir.run_attrs() or {}
    model_path = rundir.join("model")
    n_new = source.n_rows
    if plan.phase == "solve":
        rundir.mark("running", config=resolved, config_hash=config_hash(resolved),
                    input_fingerprint=fingerprint, error=None,
                    update={"phase": "solve", "rows_before": plan.rows_before,
                            "started": _now()})
        base = load_base(checkpoint, plan.rows_before)
        if base is None:  # lost between planning and now: a refit is the honest answer
            from ..exceptions import OutputDamagedError

            raise OutputDamagedError(
                f"the base of the update in {outdir} is missing or damaged; rerun with "
                "--overwrite to refit from scratch")
        timings: dict = {}
        what = solve_update(config, source, base, plan.rows_before, executor, timings)
        r = what.result
        with stage("model"):
            rundir.remove_member("model")  # OUTDIR's own (a damaged one too), under its lock
            write_model(model_of_fit(r, config, n_samples=n_new), model_path)
            save_base(checkpoint, n_new, r.scan_state, r.stats, r.spectral_map.components, r.gamma,
                      append_anchor(source))
        group = rundir.group()
        for name in (EMBEDDING, WRITTEN):
            if name in group:
                del group[name]
        out = EmbeddingOutput(outdir, n_new, r.spectral_map.n_components,
                              source.storage_chunk_rows,
                              dtype=config.output_dtype).prepare(resume=False)
        update = {"phase": "write", "rows_before": what.rows_before, "rows_added": what.rows_added,
                  "dictionary_before": what.dictionary_before,
                  "dictionary_after": what.dictionary_after,
                  "order_changed": what.order_changed, "stages": what.timings,
                  "max_residual": r.max_residual, "max_residual_row": r.max_residual_row,
                  "eigenvalue_error_bound": r.eigenvalue_error_bound, "started": _now()}
        rundir.mark("running", update=update)
        smap = r.spectral_map
    else:
        update = dict(attrs["update"])
        what = UpdateResult(update["rows_before"], update["rows_added"],
                            update["dictionary_before"], update["dictionary_after"],
                            update["order_changed"], dict(update.get("stages", {})))
        smap = read_model(model_path).spectral_map
        out = EmbeddingOutput(outdir, n_new, smap.n_components,
                              source.storage_chunk_rows,
                              dtype=config.output_dtype).prepare(resume=True)
    rows = plan_task_rows(n_new, source.n_features, source.storage_chunk_rows,
                          smap.dictionary.size, requested=config.chunk_rows,
                          itemsize=source.itemsize)
    with stage("pass3"):
        out.write(source.task_view(rows), smap, executor)
        if watch is not None:
            watch.check()  # every row read (twice) is of the input fingerprinted
        out.mark_complete()
    return what, update
