"""Pass 1 by RP-Cholesky in the pipeline: the selection on the seeded sample, and its
completion from the rows pass 2 finds beyond tol.

The algorithm and its design (a seeded sample, the whole data certified by pass 2)
are in :mod:`ooc_spectral.core.scan.rpcholesky`; here are the hooks that
:class:`~ooc_spectral.pipeline.fit.FitRun` calls: :func:`build_dictionary` (pass 1) and
:class:`RPCholeskySelection` (the completion, which runs check passes over the data).
"""

from __future__ import annotations

import logging

import numpy as np

from ..core.kernels import Kernel
from ..core.model import Dictionary
from ..core.scan.rpcholesky import RPC_TAG, _check_finite, rpcholesky_rows
from ..core.scan.state import DictionaryState
from ..core.statistics import VIOLATOR_CAP, BeyondTol, Certificate
from .scan import Rescan

__all__ = ["build_dictionary", "RPCholeskySelection"]

log = logging.getLogger("ooc_spectral")


def build_dictionary(run, kernel: Kernel) -> tuple[Dictionary, float, bool]:
    """Pass 1 of :class:`~ooc_spectral.pipeline.fit.FitRun` for ``selection="rpcholesky"``.

    Returns the dictionary, the tolerance it meets on the sample, and whether the
    sample was the whole data with ``tol`` (then pass 2 only certifies); otherwise
    pass 2 checks every row and :func:`complete_dictionary` finishes the job.
    """
    c, src = run.config, run.source
    ckpt = run.checkpoint if run.resume else None
    saved = ckpt.load_scan() if ckpt is not None else None
    whole = src.n_rows <= c.sample_size
    if saved is not None and saved.get("prefix_done"):
        state = DictionaryState.from_arrays(kernel, c.affine, saved["points"], saved["indices"],
                                            saved["L"], saved["w"])
        run.resumed.append("scan")
        run.selection = RPCholeskySelection(run, state)
        complete = c.dictionary_size is not None or whole
        return state.freeze(c.solver), float(saved["tol"]), complete
    rows, X = run._sample("dictionary_size", c.sample_size)
    _check_finite(X, rows)
    state = DictionaryState(kernel, src.n_features, c.affine)
    if saved is not None and int(saved["windows_done"]) > 0:
        run.resumed.append("scan")
    store = run.checkpoint
    if store is not None and not run.resume:
        store = _FreshCheckpoint(store)
    if c.dictionary_size is not None:
        log.info("selection=rpcholesky: %d points from %d sampled rows", c.dictionary_size, len(rows))
        res, _ = rpcholesky_rows(state, X, rows, seed=c.random_state, size=c.dictionary_size,
                                 checkpoint=store)
        state = res.state
        tol = float(max(np.max(res.delta()), 0.0))
        complete = True
    else:
        log.info("selection=rpcholesky: tol=%.3g on %d sampled rows", c.tol, len(rows))
        res, _ = rpcholesky_rows(state, X, rows, seed=c.random_state, tol=c.tol,
                                 limit=run._scan_limit, checkpoint=store)
        state = res.state
        tol, complete = c.tol, whole
    if run.checkpoint is not None:
        run.checkpoint.save_scan(state, 0, tol, prefix_done=True)
    run.selection = RPCholeskySelection(run, state)
    log.info("selection=rpcholesky: %d points", state.size)
    return state.freeze(c.solver), tol, complete


class _FreshCheckpoint:
    """A checkpoint whose saved scan is ignored (a run that does not resume)."""

    def __init__(self, inner):
        self._inner = inner

    def load_scan(self):
        return None

    def __getattr__(self, name):
        return getattr(self._inner, name)


class RPCholeskySelection:
    """Pass 1's selection by RP-Cholesky, as the pipeline holds it
    (:class:`~ooc_spectral.pipeline.scan.Selection`): the state, and the completion
    from the rows pass 2 found beyond tol."""

    def __init__(self, run, state: DictionaryState):
        self.run, self.state = run, state

    def complete_from(self, beyond: BeyondTol, tol: float) -> Rescan:
        """RP-Cholesky on the rows beyond ``tol`` until none is left.

        The rows beyond tol (at most ``sample_size`` at a time, a seeded subset if
        more) are brought within tol by the same algorithm, the draws seeded by the
        dictionary size the round starts from. If pass 2 had to leave rows out
        (more than ``VIOLATOR_CAP``) or the subset did, another check pass runs
        over the data.
        """
        return _complete(self.run, self.state, beyond, tol)


def _complete(run, state: DictionaryState, beyond: BeyondTol, tol: float) -> Rescan:
    c = run.config
    rows, Xv = beyond.rows, beyond.X
    before = state.size
    recheck = False
    cert = beyond.within
    while len(rows):
        partial = len(rows) > VIOLATOR_CAP
        if len(rows) > c.sample_size:
            rng = np.random.default_rng(np.random.SeedSequence([c.random_state, RPC_TAG, state.size]))
            keep = np.sort(rng.choice(len(rows), c.sample_size, replace=False))
            rows, Xv = rows[keep], Xv[keep]
            partial = True
        log.info("selection=rpcholesky: %d rows beyond tol; RP-Cholesky on them", len(rows))
        res, _ = rpcholesky_rows(state, Xv, rows, seed=c.random_state, tol=tol,
                                 limit=c.max_dictionary_size, round_key=1 + state.size)
        if run.checkpoint is not None:
            run.checkpoint.save_scan(state, 0, tol, prefix_done=True)
        if not partial:  # the certificate of these rows, recomputed with the final factor
            _, d = state.freeze(c.solver).project(Xv)
            i = int(np.argmax(d))
            if d[i] > cert.max_delta:
                cert = Certificate(float(d[i]), int(rows[i]))
            break
        recheck = True
        dictionary = state.freeze(c.solver)
        X = run.reduce_view()
        check, _ = run.accumulate(dictionary, X, tol_check=tol)
        rows, Xv = check.beyond.rows, check.beyond.X
    log.info("selection=rpcholesky: %d points added for the rows beyond tol", state.size - before)
    return Rescan(state.size > before, recheck, cert)
