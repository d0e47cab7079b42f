"""Pass 1 by blocked randomly pivoted Cholesky (``selection="rpcholesky"``).

Randomly pivoted Cholesky (Chen, Epperly, Tropp & Webber, 2023) picks each
pivot with probability proportional to the current *residual diagonal*: the
squared feature-space distance of each row to the span of the dictionary. It is
robust both to the outliers that greedy pivoting chases and to the non-uniform
density that uniform sampling misses.

**Blocks with rejection** (the accelerated variant of Epperly, Tropp & Webber,
2024). Each block draws ``RPC_BLOCK`` candidates i.i.d. from the residuals at the
block's start, then walks them in order and accepts candidate ``j`` with
probability ``r_now(j) / r_start(j)``, ``r_now`` being its residual against the
dictionary grown by the candidates accepted before it. The accepted pivots are
therefore distributed exactly as in the one-pivot-at-a-time algorithm, while the
work is BLAS-3: one ``s x a`` kernel block, one product with the factor and one
triangular solve per block of ``a`` accepted pivots.

**The residual** is the one the certificate measures, ``delta_t`` of eq. 8 (with
the affine constraint when ``affine=True``). A row is never a candidate when its
unconstrained residual is below :data:`~ooc_spectral.core.model.PIVOT_FLOOR` ``k(x, x)``
(already in the linear span: its pivot would make L singular). With ``tol`` the
weights are the residuals *beyond* tol (rows within tol need no attention: they
meet the contract and adding points only lowers their residual) and blocks are
added until no row of the sample is beyond tol; with ``dictionary_size`` the
weights are all the residuals and the walk stops at m.

**Design: a seeded sample, the whole data certified by pass 2.** The residual
diagonal is kept for the rows of the seeded sample of ``sample_size`` rows
(the sample Algorithm 2 and the random dictionary use; every row when
``n <= sample_size``), updated per block with the sample's coordinates ``F``
(``sample_size x m``, the only large array). The alternative -- one pass over
all n rows per block of pivots -- costs ``O(n m^2)`` per block and
``m / RPC_BLOCK`` passes, against ``O(s m^2)`` in all here; it would sample from
every row, but the sample only decides *which* points enter. What is
*guaranteed* is checked on every row: with ``tol``, pass 2 finds the rows
beyond tol (as for the prefix scan), :func:`complete_dictionary` runs the same
algorithm on them (at most ``sample_size`` at a time) until they are within tol
and repeats the check if it had to leave some out, so the certificate
``max delta <= tol`` holds on the whole data; with ``dictionary_size``, pass 2
reports the whole data's largest residual, as for the other selections.

**The result is the greedy scan's state**: each accepted pivot is appended to a
:class:`~ooc_spectral.core.scan.state.DictionaryState` with its coordinates against the
dictionary before it (``z``), its unconstrained residual and ``alpha``, exactly
as the scan appends a row, so ``L``, ``w``, ``beta``, the points and their row
numbers mean the same and passes 2 and 3, ``transform``, persistence and the
certificate are unchanged.

**Determinism.** The sample's rows and values depend only on the seed and n; the
candidates of block ``k`` come from ``SeedSequence([seed, RPC_TAG, round, k])``;
everything else is computed in this process in a fixed order. The dictionary is
therefore the same whatever the storage chunking, the task size and the
number of workers. A run with a checkpoint saves, after every block that
accepted pivots, the new columns of ``F`` and the sample's residuals (as a pass-2
style partial) and then the dictionary (the scan's slot, written last): a
killed run resumes after the last saved block with bit-identical state, hence
the same dictionary.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
from scipy.linalg import solve_triangular

from ...exceptions import DictionaryError, DictionarySizeError, NonFiniteInputError
from ..model import PIVOT_FLOOR
from .state import DictionaryState, size_hint

__all__ = ["RPC_BLOCK", "RPC_TAG", "SampleResiduals", "rpcholesky_rows"]

log = logging.getLogger("ooc_spectral")

#: Candidates drawn per block.
RPC_BLOCK = 64
#: Tag of the seeds of the candidate draws (``SeedSequence([seed, RPC_TAG, round, block])``).
RPC_TAG = 0x52504348
#: Seconds between two progress lines of the selection.
PROGRESS_SECONDS = 10.0
#: Rows per kernel block when coordinates are computed from scratch.
_ROWS = 4096


class SampleResiduals:
    """In-memory rows with their coordinates ``F`` and residuals against a dictionary.

    Parameters
    ----------
    state : DictionaryState
        The dictionary (shared, grown in place by :meth:`block`).
    X : ndarray of shape (s, d)
    rows : ndarray of shape (s,)
        Their row numbers in the data set.
    capacity : int
        Columns of ``F`` reserved (grown by doubling).
    F, dhat, alpha : ndarray, optional
        Resumed values (``F`` with ``state.size`` columns); computed from the
        dictionary when not given.
    """

    def __init__(self, state: DictionaryState, X: np.ndarray, rows: np.ndarray, *,
                 capacity: int | None = None, F=None, dhat=None, alpha=None):
        kernel = state.kernel
        self.state = state
        self.X = np.ascontiguousarray(X, dtype=np.float64)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.x_aux = kernel.aux(self.X)
        self.kx = kernel.diag(self.X, self.x_aux)
        self.floor = PIVOT_FLOOR * np.maximum(np.abs(self.kx), np.finfo(np.float64).tiny)
        s, m = self.X.shape[0], state.size
        cap = max(m + 1, int(capacity) if capacity else m + RPC_BLOCK)
        self._F = np.zeros((s, cap))
        if F is not None:
            self._F[:, :m] = F
            self.dhat = np.array(dhat, dtype=np.float64)
            self.alpha = np.array(alpha, dtype=np.float64)
        elif m:
            D = state.freeze()
            self.dhat = np.empty(s)
            self.alpha = np.empty(s)
            for a in range(0, s, _ROWS):
                b = min(a + _ROWS, s)
                Z, kx = D.coordinates(self.X[a:b], None if self.x_aux is None else self.x_aux[a:b])
                self._F[a:b, :m] = Z
                self.dhat[a:b] = kx - np.einsum("ij,ij->i", Z, Z)
                self.alpha[a:b] = 1.0 - Z @ D.w
        else:
            self.dhat = self.kx.copy()
            self.alpha = np.ones(s)

    @property
    def F(self) -> np.ndarray:
        return self._F[:, : self.state.size]

    def _aux(self, idx):
        return None if self.x_aux is None else self.x_aux[idx]

    def delta(self) -> np.ndarray:
        """``delta_t`` (eq. 8) of every row; ``k(x, x)`` while the dictionary is empty."""
        st = self.state
        if st.size == 0:
            return self.kx.copy()
        if not st.affine:
            return self.dhat.copy()
        return self.dhat + self.alpha * self.alpha / st.beta

    def weights(self, tol: float | None) -> np.ndarray:
        """Sampling weights: the residuals (beyond ``tol`` if given) of rows off the span."""
        d = self.delta()
        ok = self.dhat > self.floor
        if tol is not None:
            ok &= d > tol
        return np.where(ok, np.maximum(d, 0.0), 0.0)

    def _one_weight(self, dh: float, al: float, floor: float, tol: float | None) -> float:
        st = self.state
        if dh <= floor:
            return 0.0
        if st.size == 0:
            d = dh
        elif st.affine:
            d = dh + al * al / st.beta
        else:
            d = dh
        if tol is not None and d <= tol:
            return 0.0
        return max(d, 0.0)

    def _reserve(self, cols: int, m: int) -> None:
        """At least ``cols`` columns of F, its first ``m`` kept."""
        if cols > self._F.shape[1]:
            F = np.zeros((self._F.shape[0], max(cols, 2 * self._F.shape[1])))
            F[:, :m] = self._F[:, :m]
            self._F = F

    def block(self, rng: np.random.Generator, tol: float | None, limit: int | None,
              size: int = RPC_BLOCK) -> tuple[int, np.ndarray | None]:
        """One block: draw ``size`` candidates, accept by rejection, update F and residuals.

        Returns ``(accepted, new_columns)``; ``accepted`` is -1 when no row has a
        positive weight (the selection is over), ``new_columns`` the ``s x a``
        columns appended to ``F`` (None if none).
        """
        st, kernel = self.state, self.state.kernel
        w = self.weights(tol)
        cum = np.cumsum(w)
        total = float(cum[-1]) if cum.size else 0.0
        if not total > 0.0:
            return -1, None
        draws = rng.random(size)
        coins = rng.random(size)
        C = np.minimum(np.searchsorted(cum, draws * total, side="right"), len(w) - 1)
        ws = w[C]
        m0 = st.size
        Fc = self._F[C, :m0]
        H = kernel.pairwise(self.X[C], self.X[C], self._aux(C), self._aux(C))
        if m0:
            H -= Fc @ Fc.T
        dh = self.dhat[C].copy()
        al = self.alpha[C].copy()
        hcols: list[np.ndarray] = []
        accepted: list[int] = []
        taken: set[int] = set()
        wnew: list[float] = []
        for j in range(size):
            if limit is not None and st.size >= limit:
                break
            r = self._one_weight(float(dh[j]), float(al[j]), float(self.floor[C[j]]), tol)
            if r <= 0.0 or int(C[j]) in taken or not coins[j] * ws[j] < r:
                continue
            i = int(C[j])
            z = np.concatenate([Fc[j], [h[j] for h in hcols]])
            pivot = math.sqrt(float(dh[j]))
            w_new = st.append(self.X[i], int(self.rows[i]), None if self.x_aux is None else self.x_aux[i],
                              z, float(dh[j]), float(al[j]))
            h = H[:, j] / pivot
            H -= np.outer(h, h)
            dh -= h * h
            al -= w_new * h
            hcols.append(h)
            accepted.append(j)
            taken.add(i)
            wnew.append(w_new)
        a = len(accepted)
        if a == 0:
            return 0, None
        # the block's factor: R[k] = [h_0[j_k], ..., h_{k-1}[j_k], pivot_k] (the rows
        # appended to L beyond the old dictionary's columns)
        P = C[accepted]
        R = np.zeros((a, a))
        for k, j in enumerate(accepted):
            R[k, :k] = [hcols[i][j] for i in range(k)]
            R[k, k] = st.L[m0 + k, m0 + k]
        G = kernel.pairwise(self.X, self.X[P], self.x_aux, self._aux(P))
        if m0:
            G -= self._F[:, :m0] @ self._F[P, :m0].T
        Fnew = solve_triangular(R, G.T, lower=True, overwrite_b=True, check_finite=False).T
        Fnew[P] = R  # the pivots' own rows, exactly as appended to L
        self._reserve(m0 + a, m0)
        self._F[:, m0 : m0 + a] = Fnew
        self.dhat -= np.einsum("ij,ij->i", Fnew, Fnew)
        self.alpha -= Fnew @ np.asarray(wnew)
        self.dhat[P] = 0.0
        self.alpha[P] = 0.0
        return a, np.ascontiguousarray(Fnew)


def _rng(seed: int, round_key: int, block: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(seed), RPC_TAG, int(round_key), int(block)]))


def rpcholesky_rows(state: DictionaryState, X: np.ndarray, rows: np.ndarray, *, seed: int,
                    tol: float | None = None, size: int | None = None, limit: int | None = None,
                    round_key: int = 0, block_size: int = RPC_BLOCK, checkpoint=None,
                    stage: str = "rpcholesky") -> tuple[SampleResiduals, int]:
    """Blocked RP-Cholesky on in-memory rows, growing ``state`` in place (or, when
    resuming from ``checkpoint``, the state it saved: use ``residuals.state``).

    Parameters
    ----------
    state : DictionaryState
    X, rows : the rows and their row numbers (sorted by row number for determinism).
    seed : int
    tol : float, optional
        Stop once no row is beyond ``tol`` (weights: the residuals beyond tol).
    size : int, optional
        Stop at ``size`` points (weights: all residuals).
    limit : int, optional
        With ``tol``: raise :class:`DictionarySizeError` rather than grow past it.
    round_key : int
        Separates the candidate draws of different calls on the same seed.
    checkpoint : Checkpoint, optional
        Saves each block (see the module docstring) and resumes from it.

    Returns
    -------
    residuals : SampleResiduals
        The rows' final coordinates and residuals.
    blocks : int
        Blocks drawn.
    """
    if (tol is None) == (size is None):
        raise ValueError("give exactly one of tol and size")
    start, res = 0, None
    saved = checkpoint.load_scan() if checkpoint is not None else None
    if saved is not None and int(saved["windows_done"]) > 0 and not saved.get("prefix_done"):
        res, start = _resume(state, X, rows, saved, checkpoint, stage)
    if res is None:
        res = SampleResiduals(state, X, rows, capacity=size)
    state = res.state
    k = start
    shown = time.monotonic()
    while True:
        if size is not None and state.size >= size:
            break
        if tol is not None and limit is not None and state.size >= limit:
            if np.any(res.weights(tol) > 0):
                raise _size_error(state, limit, tol)
            break
        cap = None if size is None else size
        if tol is not None and limit is not None:
            cap = limit
        a, cols = res.block(_rng(seed, round_key, k), tol, cap, block_size)
        if a < 0:
            break
        k += 1
        if time.monotonic() - shown > PROGRESS_SECONDS:
            shown = time.monotonic()
            log.info("selection=rpcholesky: block %d, dictionary %d points", k, state.size)
        if a > 0 and checkpoint is not None:
            checkpoint.save_partial(stage, k - 1, {"F": cols, "dhat": res.dhat, "alpha": res.alpha,
                                                   "size": int(state.size)})
            checkpoint.save_scan(state, k, float(tol) if tol is not None else 0.0)
    if size is not None and state.size < size:
        raise DictionaryError(
            f"dictionary_size={size} cannot be reached: only {state.size} of the {len(rows)} "
            f"sampled rows are outside the span of the others; ask for dictionary_size <= "
            f"{state.size}")
    return res, k


def _resume(state: DictionaryState, X, rows, saved: dict, checkpoint, stage: str):
    """The residuals and the block count saved by an interrupted run (None if unusable)."""
    blocks = int(saved["windows_done"])
    cols, last = [], None
    for j in range(blocks):
        part = checkpoint.load_partial(stage, j)
        if part is not None:
            cols.append(np.asarray(part["F"]))
            last = part
    restored = DictionaryState.from_arrays(state.kernel, state.affine, saved["points"],
                                           saved["indices"], saved["L"], saved["w"])
    width = sum(c.shape[1] for c in cols)
    if last is None or width != restored.size or int(last["size"]) != restored.size:
        log.warning("rpcholesky: the checkpoint's blocks do not match its dictionary; starting over")
        return None, 0
    F = np.concatenate(cols, axis=1)
    log.info("rpcholesky: resuming after block %d with %d dictionary points", blocks, restored.size)
    return SampleResiduals(restored, X, rows, F=F, dhat=last["dhat"], alpha=last["alpha"]), blocks


def _size_error(state: DictionaryState, limit: int, tol: float) -> DictionarySizeError:
    return DictionarySizeError(
        f"selection='rpcholesky' needs more than max_dictionary_size={limit} points to bring "
        f"every sampled row within tol={tol:.3g}; {size_hint(state.kernel, tol)}, or raise "
        "max_dictionary_size")


def _check_finite(X: np.ndarray, rows: np.ndarray) -> None:
    if np.isfinite(X).all():
        return
    bad = ~np.isfinite(X)
    i = int(np.flatnonzero(bad.any(axis=1))[0])
    col = int(np.flatnonzero(bad[i])[0])
    kind = "NaN" if np.isnan(X[i, col]) else "infinity"
    raise NonFiniteInputError(
        f"X contains {kind} at row {int(rows[i])}, column {col}; remove or impute non-finite "
        f"values before fitting", row=int(rows[i]))
