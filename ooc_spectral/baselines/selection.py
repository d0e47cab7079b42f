"""Landmark selection for :class:`~ooc_spectral.baselines.NystromEmbedding`.

``diagonal``, ``largest-diagonal`` and ``volume`` need the kernel *after*
normalization. Its exact diagonal costs ``O(n^2)``, so, as the paper does for
the divisive normalization before the scan, the row means are estimated on a
seeded subset ``S`` of ``degree_subset_size`` rows (exact when ``S`` holds every
row): additive, the centred kernel
``k(x, y) - mu(x) - mu(y) + mu_S`` with ``mu(x) = mean_{s in S} k(x, s)``;
divisive, ``k(x, y) / sqrt(mu(x) mu(y))``. Both are positive semi-definite
(:func:`selection_kernel`).

``diagonal`` samples rows in proportion to that diagonal in one pass
(Efraimidis-Spirakis keys, :func:`efraimidis_spirakis_keys`),
``largest-diagonal`` takes the largest entries (:func:`diagonal_scan`), and
``volume`` samples ``P(I) ~ det(G_I)`` by Belabbas & Wolfe's Metropolis chain
(:func:`metropolis_volume_sample`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import dask
import numpy as np
from scipy.linalg import LinAlgError, cho_factor, cho_solve

from ..pipeline.accumulate import tree_reduce
from ..exceptions import DictionaryError, InvalidParameterError
from ..runtime.execution import Executor
from ..core.kernels import Kernel, SubsetNormalizedKernel, subset_means
from .._validation import check_finite
from ..io.source import DataSource
from ._common import _f64, _row_random, _task_rows

__all__ = ["SubsetCenteredKernel", "selection_kernel", "metropolis_volume_sample",
           "efraimidis_spirakis_keys", "diagonal_scan"]

#: ``purpose`` tags of the baselines' seeded samples (the core uses 1-3).
_PURPOSE = {"selection_subset": 11, "volume_candidates": 12}
#: Accepted swaps of the Metropolis chain between two recomputations of the inverse.
_REFRESH_EVERY = 64


# --------------------------------------------------------------------------- #
# normalized kernels for landmark selection
# --------------------------------------------------------------------------- #
@dataclass(frozen=True, eq=False)
class SubsetCenteredKernel(Kernel):
    """The additively normalized (centred) kernel, centring estimated on a subset.

    ``k_c(x, y) = k(x, y) - mu(x) - mu(y) + mu_S`` with
    ``mu(x) = mean_{s in S} k(x, s)`` and ``mu_S = mean_{s, s' in S} k(s, s')``:
    the Gram kernel of ``phi(x) - mean_S phi``, so positive semi-definite. With
    ``S`` the whole data it is the exact centred kernel ``H K H``.
    ``aux(X)`` packs (base aux, mu) in a 2-column array.
    """

    base: Kernel
    subset: np.ndarray
    name = "subset-centred"
    has_aux = True

    def __post_init__(self):
        object.__setattr__(self, "subset_mean", float(self.means(self.subset).mean()))

    def means(self, X, base_aux=None) -> np.ndarray:
        """``mu(x)`` for the rows of X."""
        return subset_means(self.base, self.subset, X, base_aux)

    def aux(self, X):
        X = _f64(X)
        base_aux = self.base.aux(X)
        col0 = np.zeros(X.shape[0]) if base_aux is None else base_aux
        return np.column_stack([col0, self.means(X, base_aux)])

    def _split(self, X, aux):
        if aux is None:
            aux = self.aux(X)
        return (aux[:, 0] if self.base.has_aux else None), aux[:, 1]

    def pairwise(self, X, Y, x_aux=None, y_aux=None):
        X, Y = _f64(X), _f64(Y)
        xb, xm = self._split(X, x_aux)
        yb, ym = self._split(Y, y_aux)
        K = self.base.pairwise(X, Y, xb, yb)
        K -= xm[:, None]
        K -= ym[None, :]
        K += self.subset_mean
        return K

    def diag(self, X, x_aux=None):
        X = _f64(X)
        xb, xm = self._split(X, x_aux)
        return self.base.diag(X, xb) - 2.0 * xm + self.subset_mean

    @property
    def params(self):
        return {"base": self.base.name, **self.base.params, "subset_size": int(self.subset.shape[0])}


def selection_kernel(base: Kernel, normalization: str, subset: np.ndarray) -> Kernel:
    """The normalized kernel landmark selection works with (row means on ``subset``)."""
    if normalization == "additive":
        return SubsetCenteredKernel(base, np.asarray(subset, dtype=np.float64))
    return SubsetNormalizedKernel(base, np.asarray(subset, dtype=np.float64))


# --------------------------------------------------------------------------- #
# Belabbas & Wolfe's Metropolis chain for P(I) ~ det(G_I)
# --------------------------------------------------------------------------- #
def metropolis_volume_sample(gram, n: int, k: int, n_steps: int, *, random_state=None,
                             init=None, thin: int | None = None):
    """Sample a k-subset ``I`` of ``range(n)`` with ``P(I) ~ det(G_I)``.

    The Metropolis chain of Belabbas & Wolfe (2007, slides 30-31): propose to
    swap a uniformly chosen member ``s`` of ``I`` with a uniformly chosen
    ``j`` outside it, accept with probability ``min(1, det(G_I') / det(G_I))``.
    The proposal is symmetric, so ``det(G_I)`` (normalized) is the equilibrium
    distribution. The ratio is computed in ``O(k^2)`` from the inverse
    ``H = G_I^-1`` as a ratio of two Schur complements over ``J = I \\ {s}``:
    ``det(G_I') / det(G_I) = H_ss (g_jj - b' P b)`` with ``b = G_{J, j}`` and
    ``P = G_J^-1 = H_JJ - H_Js H_sJ / H_ss``; an accepted swap updates ``H`` in
    ``O(k^2)``, and ``H`` is recomputed from a Cholesky factor every
    :data:`_REFRESH_EVERY` accepted swaps.

    Parameters
    ----------
    gram : callable
        ``gram(a, b)`` returns the block ``G[a][:, b]`` for integer index arrays.
    n : int
        Number of candidates.
    k : int
        Size of the subset, ``1 <= k < n``.
    n_steps : int
        Iterations of the chain (Belabbas & Wolfe: about ``50 k``).
    random_state : int, Generator or None
        Seed of the initial subset, the proposals and the acceptances.
    init : array of int, optional
        Initial subset (default: uniformly random; if its Gram block is
        singular, a greedy pivoted-Cholesky start).
    thin : int, optional
        Also return the state after every ``thin``-th step.

    Returns
    -------
    subset : ndarray of shape (k,)
        The final state, sorted.
    info : dict
        ``accepted`` (number of accepted swaps), ``acceptance_rate``, and with
        ``thin`` the array ``trace`` of shape ``(n_steps // thin, k)`` (each state
        sorted).

    Raises
    ------
    DictionaryError
        No k candidates have a non-singular Gram block.
    """
    n, k, n_steps = int(n), int(k), int(n_steps)
    if not 1 <= k < n:
        raise InvalidParameterError(f"volume sampling needs 1 <= k < n, got k={k}, n={n}")
    rng = random_state if isinstance(random_state, np.random.Generator) else \
        np.random.default_rng(random_state)

    def inverse(I):
        G = np.asarray(gram(I, I), dtype=np.float64)
        c = cho_factor(G, lower=True, check_finite=False)
        return cho_solve(c, np.eye(len(I)), check_finite=False)

    I = (np.sort(rng.choice(n, size=k, replace=False)) if init is None
         else np.asarray(init, dtype=np.int64).copy())
    try:
        H = inverse(I)
        if not np.all(np.isfinite(H)):
            raise LinAlgError("not finite")
    except LinAlgError:
        I = _pivoted_start(gram, n, k)
        H = inverse(I)
    inside = np.zeros(n, dtype=bool)
    inside[I] = True
    accepted = since_refresh = 0
    trace = [] if thin else None
    for step in range(n_steps):
        s = int(rng.integers(k))
        j = int(rng.integers(n - k))
        # the j-th index outside I, in increasing order
        j = int(np.flatnonzero(~inside)[j]) if k > 0 else j
        u = rng.random()
        b = np.asarray(gram(I, np.array([j])), dtype=np.float64)[:, 0]
        gjj = float(np.asarray(gram(np.array([j]), np.array([j])))[0, 0])
        b[s] = 0.0
        z = H @ b
        hss = H[s, s]
        schur = gjj - (b @ z - z[s] * z[s] / hss)  # g_jj - b' G_J^-1 b
        ratio = hss * schur
        if ratio > 0 and u < ratio:
            # H -> G_J^-1 (row and column s vanish), then border it with j at position s
            hs = H[:, s].copy()
            H -= np.outer(hs, hs) / hss
            w = H @ b  # G_J^-1 b, zero at s
            H += np.outer(w, w) / schur
            H[s, :] = -w / schur
            H[:, s] = -w / schur
            H[s, s] = 1.0 / schur
            inside[I[s]] = False
            inside[j] = True
            I[s] = j
            accepted += 1
            since_refresh += 1
            if since_refresh >= _REFRESH_EVERY:
                try:
                    H = inverse(I)
                except LinAlgError:
                    pass
                since_refresh = 0
        if thin and (step + 1) % thin == 0:
            trace.append(np.sort(I))
    info = {"accepted": accepted, "acceptance_rate": accepted / max(n_steps, 1)}
    if thin:
        info["trace"] = np.array(trace, dtype=np.int64).reshape(-1, k)
    return np.sort(I), info


def _pivoted_start(gram, n: int, k: int) -> np.ndarray:
    """k indices by greedy pivoted Cholesky (largest residual diagonal first)."""
    diag = np.array([float(np.asarray(gram(np.array([i]), np.array([i])))[0, 0]) for i in range(n)])
    resid = diag.copy()
    picked: list[int] = []
    R = np.zeros((0, n))
    for _ in range(k):
        i = int(np.argmax(resid))
        if resid[i] <= 1e-12 * max(diag.max(), 1e-300):
            raise DictionaryError(
                f"volume sampling needs {k} candidates with a non-singular Gram block, but the "
                f"kernel matrix of the candidates has numerical rank {len(picked)}; lower "
                "n_landmarks, raise gamma, or use another selection"
            )
        col = np.asarray(gram(np.arange(n), np.array([i])), dtype=np.float64)[:, 0]
        row = (col - R[:, i] @ R) / math.sqrt(resid[i])
        R = np.vstack([R, row])
        resid = np.maximum(resid - row * row, 0.0)
        resid[picked + [i]] = -np.inf
        picked.append(i)
    return np.sort(np.array(picked, dtype=np.int64))


# --------------------------------------------------------------------------- #
# diagonal and largest-diagonal: the m best rows, in one pass
# --------------------------------------------------------------------------- #
def _keep_top(keys: np.ndarray, rows: np.ndarray, values: np.ndarray, m: int):
    """The ``m`` largest keys (ties: lower row first), with their rows and values."""
    order = np.lexsort((rows, -keys))[:m]
    return keys[order], rows[order], values[order]


def efraimidis_spirakis_keys(weights, uniforms) -> np.ndarray:
    """Keys whose ``m`` largest give a weighted sample of ``m`` items without replacement.

    Efraimidis & Spirakis (2006): with ``u_i ~ U(0, 1)`` independent, the items
    of the ``m`` largest ``log(u_i) / w_i`` (the order of ``u_i^(1/w_i)``) are
    distributed as ``m`` successive draws without replacement, each with
    probability proportional to its weight among those left. Items with
    ``w_i <= 0`` get ``-inf`` (never drawn before a positive one).
    """
    w = np.asarray(weights, dtype=np.float64)
    u = np.asarray(uniforms, dtype=np.float64)
    keys = np.full(np.broadcast_shapes(w.shape, u.shape), -np.inf)
    w, u = np.broadcast_to(w, keys.shape), np.broadcast_to(u, keys.shape)
    positive = w > 0
    with np.errstate(divide="ignore"):
        keys[positive] = np.log(u[positive]) / w[positive]
    return keys


def _diag_block(block, kernel: Kernel, mode: str, m: int, seed: int, start: int):
    """The ``m`` best rows of one block for ``diagonal`` / ``largest-diagonal``."""
    X = _f64(block)
    check_finite(X, start)
    diag = kernel.diag(X, kernel.aux(X))
    rows = np.arange(start, start + X.shape[0], dtype=np.int64)
    if mode == "largest-diagonal":
        keys = diag.copy()
    else:  # Efraimidis & Spirakis: the m largest log(u) / w sample without replacement ~ w
        u = _row_random(seed, 0xD1A6, start, start + X.shape[0], None, kind="uniform")
        keys = efraimidis_spirakis_keys(diag, u)
    return _keep_top(keys, rows, diag, m)


def _merge_top(parts, m: int):
    """Merge the per-block bests into the ``m`` best overall."""
    keys = np.concatenate([p[0] for p in parts])
    rows = np.concatenate([p[1] for p in parts])
    vals = np.concatenate([p[2] for p in parts])
    return _keep_top(keys, rows, vals, m)


def diagonal_scan(source: DataSource, kernel: Kernel, mode: str, m: int, seed: int,
                  chunk_rows: int | None):
    """The ``m`` best rows for ``mode`` ``"diagonal"`` or ``"largest-diagonal"``, in one pass.

    Each block of rows keeps its ``m`` best (:func:`_diag_block`); the bests are
    merged in a fixed-order tree, so the result does not depend on the
    scheduling.

    Returns
    -------
    keys, rows, values : ndarray of shape (m,)
        The keys (best first; ``-inf`` for rows that cannot be drawn), the row
        numbers and the normalized-kernel diagonal of each row.
    """
    X = source.to_dask(_task_rows(source, chunk_rows))
    starts = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]])
    shared_kernel = dask.delayed(kernel, pure=True)
    parts = [dask.delayed(_diag_block, pure=True)(b, shared_kernel, mode, m, seed, int(a))
             for b, a in zip(X.to_delayed().ravel(), starts)]
    return Executor().values("diagonal", tree_reduce(parts, 8, functools.partial(_merge_top, m=m)))[0]
