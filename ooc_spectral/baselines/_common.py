"""The baselines the papers compare the greedy dictionary with.

Every estimator here has the interface of
:class:`~ooc_spectral.GreedySpectralEmbedding` (``fit`` / ``transform`` /
``embedding_`` / ``eigenvalues_``, scikit-learn parameter conventions, the same
input types through :func:`~ooc_spectral.source.open_source`) and the same two
normalizations:

``normalization="additive"`` (kernel PCA, metric MDS)
    ``embedding_`` holds kernel PCA's projections ``sqrt(lambda_k) u_k`` (the
    scale of scikit-learn's ``KernelPCA.fit_transform``) and ``eigenvalues_`` the
    eigenvalues ``lambda_k`` of the centred Gram matrix ``H K H``.
``normalization="divisive"`` (spectral clustering, Laplacian eigenmaps, diffusion maps)
    ``embedding_`` holds unit-norm eigenvectors of ``D^-1/2 K D^-1/2`` with
    ``D = diag(K 1)``, the trivial first one (eigenvalue 1) dropped by default;
    ``eigenvalues_`` their eigenvalues.

``transform`` is the Nystrom formula of Bengio et al. (2003, eqs. 8-12) for the
data-dependent kernel of each normalization; on training rows it gives back the
training embedding (exactly for :class:`ExactKernelEmbedding`). Each column's
sign is fixed as in :func:`~ooc_spectral.eigensolve.top_eigenpairs`: the entry
of largest magnitude of the eigenvector is positive.

The estimators
--------------
:class:`ExactKernelEmbedding`
    The full n x n Gram matrix in memory: the oracle. Refuses an ``n`` whose
    Gram matrix does not fit ``memory_budget``.
:class:`NystromEmbedding`
    Eigen-decomposition on ``n_landmarks`` rows only, extended to every row by the
    Nystrom formula (Williams & Seeger 2001; Homrighausen & McDonald 2011,
    Algorithm 1). Landmarks ``uniform`` (at random), ``diagonal`` (sampled in
    proportion to the diagonal of the normalized kernel), ``largest-diagonal``
    (the largest diagonal entries, Belabbas & Wolfe's deterministic rule) or
    ``volume`` (``P(I) ~ det(G_I)``, Belabbas & Wolfe's Metropolis chain). The
    extension to all rows is a dask map over row blocks (a ``c x m`` kernel block
    each); only the ``m`` landmarks are held.
:class:`GaussianProjectionEmbedding`
    The randomized range finder of Halko, Martinsson & Tropp (2011) on the n x n
    normalized kernel matrix (Homrighausen & McDonald's "Gaussian projection"),
    with every product ``K V`` computed out of core block by block as a sum over
    column blocks (:func:`kernel_matmul`), never forming ``K``.

The random dictionary of Harmeling et al. (every row projected on a random
subset) is ``GreedySpectralEmbedding(selection="random", dictionary_size=m)``.

Normalized kernels for landmark selection
-----------------------------------------
``diagonal``, ``largest-diagonal`` and ``volume`` need the kernel *after*
normalization. Its exact diagonal costs ``O(n^2)``, so, as the paper does for
the divisive normalization before the scan, the row means are estimated on a
seeded subset ``S`` of ``degree_subset_size`` rows (exact when ``S`` holds every
row): additive, the centred kernel
``k(x, y) - mu(x) - mu(y) + mu_S`` with ``mu(x) = mean_{s in S} k(x, s)``;
divisive, ``k(x, y) / sqrt(mu(x) mu(y))``. Both are positive semi-definite.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass

import dask
import dask.array as da
import numpy as np
from scipy.linalg import LinAlgError, cho_factor, cho_solve, eigh
from sklearn.base import BaseEstimator, TransformerMixin

from .._sklearn import FeatureNamesMixin
from .._validation import check_bool, check_choice, check_fitted, check_float, check_int
from ..config import resolve_seed
from ..eigensolve import top_eigenpairs
from ..exceptions import (
    DictionaryError,
    InvalidInputError,
    InvalidParameterError,
)
from ..kernels import (
    KERNELS,
    Kernel,
    SubsetNormalizedKernel,
    make_kernel,
    subset_means,
)
from ..pipeline import resolve_gamma
from ..planning import parse_bytes, plan_sample
from ..source import DataSource, check_finite, open_source

__all__ = [
    "ExactKernelEmbedding",
    "NystromEmbedding",
    "GaussianProjectionEmbedding",
    "SubsetCenteredKernel",
    "NystromModel",
    "metropolis_volume_sample",
    "efraimidis_spirakis_keys",
    "selection_kernel",
    "kernel_matmul",
    "NYSTROM_SELECTIONS",
]

log = logging.getLogger("ooc_spectral")

NYSTROM_SELECTIONS = ("uniform", "diagonal", "largest-diagonal", "volume")
NORMALIZATIONS = ("additive", "divisive")

#: Rows of the sub-blocks a task of :func:`kernel_matmul` works on (bounds its memory).
SUB_BLOCK_ROWS = 2048
#: Default rows per dask task of the baselines' passes (rounded to storage chunks).
DEFAULT_TASK_ROWS = 8192
#: Rows per window of the seeded per-row random numbers (independent of chunking).
RANDOM_WINDOW_ROWS = 4096
#: ``purpose`` tags of the baselines' seeded samples (the core uses 1-3).
_PURPOSE = {"selection_subset": 11, "volume_candidates": 12}
#: Accepted swaps of the Metropolis chain between two recomputations of the inverse.
_REFRESH_EVERY = 64


# --------------------------------------------------------------------------- #
# parameter checks
# --------------------------------------------------------------------------- #
# --------------------------------------------------------------------------- #
# shared numerical pieces
# --------------------------------------------------------------------------- #
def _f64(X) -> np.ndarray:
    return np.ascontiguousarray(X, dtype=np.float64)


def _task_rows(source: DataSource, requested: int | None) -> int:
    """Rows per task: a multiple of the storage chunk, near ``requested``."""
    storage = max(1, min(source.storage_chunk_rows, source.n_rows))
    want = DEFAULT_TASK_ROWS if requested is None else int(requested)
    rows = max(storage, -(-want // storage) * storage)
    return int(min(rows, source.n_rows))


def _resolve_kernel(est, source: DataSource, seed: int) -> tuple[Kernel, float | None]:
    """The base kernel; ``gamma=None`` is the core's median heuristic on the same sample."""
    gamma = resolve_gamma(est.kernel, est.gamma, source, seed)
    return make_kernel(est.kernel, gamma=gamma, degree=est.degree, coef0=est.coef0), gamma


def _row_random(seed: int, tag: int, start: int, stop: int, columns: int | None,
                kind: str = "normal") -> np.ndarray:
    """Seeded random numbers for rows ``[start, stop)``, independent of the chunking.

    Rows are generated in fixed windows of :data:`RANDOM_WINDOW_ROWS`, window
    ``w`` from ``SeedSequence([seed, tag, w])``, so row ``t`` gets the same
    values whatever block it is read in.
    """
    shape_tail = () if columns is None else (columns,)
    parts = []
    win = RANDOM_WINDOW_ROWS
    last = (stop - 1) // win if stop > start else start // win - 1
    for w in range(start // win, last + 1):
        rng = np.random.default_rng(np.random.SeedSequence([seed, tag, w]))
        block = (rng.standard_normal((win, *shape_tail)) if kind == "normal"
                 else rng.random((win, *shape_tail)))
        a = max(start, w * win) - w * win
        b = min(stop, (w + 1) * win) - w * win
        parts.append(block[a:b])
    if not parts:
        return np.empty((0, *shape_tail))
    return np.concatenate(parts)


@dataclass(frozen=True, eq=False)
class NystromModel:
    """The map from rows of X to embedding coordinates, by the Nystrom formula.

    For ``points`` ``x_1..x_m`` (the training rows, or the landmarks):

    - additive: ``f(x) = k(x, P) @ coef - offset``, with ``coef = U / sqrt(lambda)``
      (``U`` unit eigenvectors of the centred Gram matrix of the points) and
      ``offset = mu @ coef``, ``mu_i = mean_j k(x_j, x_i)``;
    - divisive: ``f(x) = scale * (k(x, P) @ coef) / sqrt(d(x))`` with
      ``d(x) = sum_i k(x, x_i)`` and ``coef = D^-1/2 V / lambda``.

    On the points themselves this gives back ``U sqrt(lambda)`` (additive) and
    ``scale * V`` (divisive).
    """

    kernel: Kernel
    points: np.ndarray
    aux: np.ndarray | None
    mode: str
    coef: np.ndarray
    offset: np.ndarray | None
    scale: float = 1.0

    @property
    def n_components(self) -> int:
        return int(self.coef.shape[1])

    def embed(self, X: np.ndarray) -> np.ndarray:
        X = _f64(X)
        out = np.empty((X.shape[0], self.n_components))
        for a in range(0, X.shape[0], SUB_BLOCK_ROWS):
            xa = X[a:a + SUB_BLOCK_ROWS]
            K = self.kernel.pairwise(xa, self.points, self.kernel.aux(xa), self.aux)
            if self.mode == "additive":
                out[a:a + len(xa)] = K @ self.coef - self.offset
            else:
                d = K.sum(axis=1)
                if np.any(d <= 0):
                    i = int(np.flatnonzero(d <= 0)[0])
                    raise InvalidInputError(
                        f"row {a + i} of this block has kernel degree {d[i]:.3g} (not positive) "
                        "against the training points, so the divisive normalization is "
                        "undefined there; use a kernel with positive values (rbf, laplacian)"
                    )
                out[a:a + len(xa)] = (K @ self.coef) * (self.scale / np.sqrt(d))[:, None]
        return out


def _located_embed(block, model: NystromModel, chunk_starts=None, block_info=None):
    offset = block_info[0]["array-location"][0][0] if block_info else 0
    X = _f64(block)
    check_finite(X, offset, chunk_starts=chunk_starts)
    return model.embed(X)


def _embed_source(model: NystromModel, source: DataSource, chunk_rows: int | None):
    """``model`` applied to every row of ``source``: numpy for numpy input, else lazy dask."""
    X = source.to_dask(_task_rows(source, chunk_rows))
    p = model.n_components
    starts = dask.delayed(np.asarray(source.chunk_starts), pure=True)
    out = da.map_blocks(_located_embed, X, dask.delayed(model, pure=True), starts,
                        dtype=np.float64, meta=np.empty((0, p)), chunks=(X.chunks[0], (p,)),
                        name="ooc-spectral-nystrom-embed")
    return out.compute() if source.kind == "numpy" else out


def _positive_or_raise(vals: np.ndarray, what: str, n_components: int) -> None:
    if np.any(vals <= 0) or not np.all(np.isfinite(vals)):
        raise InvalidParameterError(
            f"the {what} has only {int(np.sum(vals > 0))} positive eigenvalues among the "
            f"{n_components} requested; lower n_components, or change gamma"
        )


def _top_eigenpairs_inplace(A: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~ooc_spectral.eigensolve.top_eigenpairs` without copies of ``A`` (overwritten).

    LAPACK's ``dsyevr`` reduces ``A`` in place, so the peak memory is ``A``
    itself plus ``O(n k)``; same order and sign
    convention (the entry of largest magnitude of each eigenvector is positive).
    """
    n = A.shape[0]
    # A is symmetric: its transpose is a Fortran-ordered view LAPACK can overwrite
    # without the copy it makes of a C-ordered array
    vals, vecs = eigh(A.T, subset_by_index=[n - k, n - 1], driver="evr", overwrite_a=True,
                      check_finite=False)
    vals, vecs = vals[::-1].copy(), vecs[:, ::-1].copy()
    big = np.argmax(np.abs(vecs), axis=0)
    signs = np.sign(vecs[big, np.arange(k)])
    signs[signs == 0] = 1.0
    return vals, vecs * signs


def _dense_fit(K: np.ndarray, normalization: str, n_components: int, drop_first: bool):
    """Eigen-decomposition of a dense Gram matrix, normalized in place (``K`` is overwritten).

    Returns ``(coef, offset, eigenvalues, train_embedding)`` for
    :class:`NystromModel` (``scale = 1``).
    """
    K = np.asarray(K, dtype=np.float64)
    if normalization == "additive":
        mu = K.mean(axis=1)
        K -= mu[:, None]
        K -= mu[None, :]
        K += mu.mean()
        vals, U = _top_eigenpairs_inplace(K, n_components)
        _positive_or_raise(vals, "centred Gram matrix", n_components)
        coef = U / np.sqrt(vals)
        return coef, mu @ coef, vals, U * np.sqrt(vals)
    d = K.sum(axis=1)
    if np.any(d <= 0):
        raise InvalidInputError(
            f"{int(np.sum(d <= 0))} rows have a non-positive kernel degree, so the divisive "
            "normalization is undefined; use a kernel with positive values (rbf, laplacian)"
        )
    s = 1.0 / np.sqrt(d)
    K *= s[:, None]
    K *= s[None, :]
    k = n_components + int(drop_first)
    vals, V = _top_eigenpairs_inplace(K, k)
    if drop_first:
        vals, V = vals[1:], V[:, 1:]
    _positive_or_raise(vals, "normalized kernel matrix D^-1/2 K D^-1/2", n_components)
    return V * (s[:, None] / vals), None, vals, V


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
# the base class
# --------------------------------------------------------------------------- #
class _KernelEmbeddingBase(FeatureNamesMixin, TransformerMixin, BaseEstimator):
    """Shared checks, kernel resolution and ``transform`` of the baselines."""

    def _check_common(self) -> None:
        check_int(type(self).__name__, "n_components", self.n_components, low=1)
        check_choice(type(self).__name__, "kernel", self.kernel, KERNELS)
        check_float(type(self).__name__, "gamma", self.gamma, low=0.0, low_open=True, none=True)
        check_int(type(self).__name__, "degree", self.degree, low=1)
        check_float(type(self).__name__, "coef0", self.coef0)
        check_choice(type(self).__name__, "normalization", self.normalization, NORMALIZATIONS)
        check_bool(type(self).__name__, "drop_first", self.drop_first)
        check_int(type(self).__name__, "chunk_rows", self.chunk_rows, low=1, none=True)
        if self.random_state is not None and not isinstance(
                self.random_state, (np.random.RandomState, np.random.Generator)):
            check_int(type(self).__name__, "random_state", self.random_state, low=0)

    def _open(self, X) -> DataSource:
        source = open_source(X)
        if source.n_rows < 2:
            raise InvalidInputError(
                f"X has {source.n_rows} row; at least 2 samples are needed to fit an embedding"
            )
        return source

    def _check_fitted(self):
        return check_fitted(self, "model_")

    def _open_new(self, X) -> DataSource:
        source = open_source(X)
        if source.n_features != self.n_features_in_:
            raise InvalidInputError(
                f"X has {source.n_features} features, but {type(self).__name__} was fitted "
                f"with {self.n_features_in_} features; pass rows with the training columns"
            )
        return source

    def fit_transform(self, X, y=None):
        """Fit and return ``embedding_``."""
        return self.fit(X, y).embedding_

    def transform(self, X):
        """Out-of-sample embedding of new rows by the Nystrom formula of ``model_``
        (against every training row for the exact embedding, the landmarks for Nystrom).

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str

        Returns
        -------
        ndarray or dask array of shape (n_rows, n_components)
            numpy for numpy input; on training rows, the training embedding.
        """
        return _embed_source(self._check_fitted(), self._open_new(X), self.chunk_rows)


# --------------------------------------------------------------------------- #
# exact
# --------------------------------------------------------------------------- #
class ExactKernelEmbedding(_KernelEmbeddingBase):
    """Kernel PCA or spectral embedding on the full Gram matrix, in memory: the oracle.

    Forms the ``n x n`` Gram matrix, normalizes it (centring or
    ``D^-1/2 K D^-1/2``) and takes its top eigenpairs. ``O(n^2)`` memory and
    ``O(n^3)`` time: for the small ``n`` against which the approximations are
    checked. Refuses (before reading the data) an ``n`` whose Gram matrix and
    eigensolver workspace exceed ``memory_budget``.

    Parameters
    ----------
    n_components : int, default=2
        Number of embedding coordinates.
    kernel : {"rbf", "laplacian", "linear", "polynomial"}, default="rbf"
    gamma : float, default=None
        Kernel coefficient; None: the median heuristic of
        :class:`~ooc_spectral.GreedySpectralEmbedding` on the same seeded sample.
    degree : int, default=3
    coef0 : float, default=1.0
    normalization : {"additive", "divisive"}, default="additive"
    drop_first : bool, default=True
        Divisive only: drop the trivial first eigenvector.
    memory_budget : int or str, default="2GiB"
        Largest memory the Gram matrix and its eigen-decomposition may take,
        estimated as ``16 n^2`` bytes: the float64 Gram matrix, normalized and
        decomposed in place, and as much again for the kernel computation's
        temporaries and LAPACK's workspace.
    chunk_rows : int, default=None
        Rows per task of ``transform`` on dask or zarr input.
    random_state : int, default=None
        Seed of the ``gamma=None`` sample.

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
        numpy for numpy input, a dask array otherwise.
    eigenvalues_ : ndarray of shape (n_components,)
    gamma_ : float or None
    model_ : NystromModel
        The training rows and coefficients ``transform`` applies.
    n_features_in_, n_samples_fit_ : int
    timings_ : dict
        ``{"read": s, "gram_and_eigensolve": s}``.

    Raises
    ------
    InvalidInputError
        From ``fit``, when ``n`` is beyond ``memory_budget``; the message names
        the budget and the out-of-core estimators to use instead.
    """

    def __init__(self, n_components=2, *, kernel="rbf", gamma=None, degree=3, coef0=1.0,
                 normalization="additive", drop_first=True, memory_budget="2GiB",
                 chunk_rows=None, random_state=None):
        self.n_components = n_components
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.normalization = normalization
        self.drop_first = drop_first
        self.memory_budget = memory_budget
        self.chunk_rows = chunk_rows
        self.random_state = random_state

    @staticmethod
    def required_memory(n_samples: int) -> int:
        """Bytes the exact method is budgeted for ``n_samples`` rows (``16 n^2``)."""
        return 16 * int(n_samples) ** 2

    def fit(self, X, y=None):
        """Fit on X and compute the training embedding.

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str
            The n x d data (or the path of a zarr array).
        y : ignored

        Returns
        -------
        self
        """
        self._check_common()
        budget = parse_bytes(self.memory_budget)
        source = self._open(X)
        n = source.n_rows
        need = self.required_memory(n)
        if need > budget:
            n_max = math.isqrt(budget // 16)
            raise InvalidInputError(
                f"ExactKernelEmbedding needs about {need / 2**30:.2f} GiB for the {n} x {n} Gram "
                f"matrix of X, above memory_budget={self.memory_budget!r} (at most {n_max} rows); "
                "use GreedySpectralEmbedding, NystromEmbedding or GaussianProjectionEmbedding "
                "(out of core), fit on a subset, or raise memory_budget"
            )
        seed = resolve_seed(self.random_state)
        kernel, gamma = _resolve_kernel(self, source, seed)
        t0 = time.perf_counter()
        Xm = source.read_rows(0, n)
        t1 = time.perf_counter()
        coef, offset, vals, emb = _dense_fit(kernel(Xm), self.normalization, self.n_components,
                                             self.drop_first)
        t2 = time.perf_counter()
        self.model_ = NystromModel(kernel, Xm, kernel.aux(Xm), self.normalization, coef, offset)
        self.eigenvalues_ = vals
        self.gamma_ = gamma
        self.n_features_in_ = source.n_features
        self.n_samples_fit_ = n
        self.random_state_ = seed
        self.timings_ = {"read": t1 - t0, "gram_and_eigensolve": t2 - t1}
        if source.kind == "numpy":
            self.embedding_ = emb
        else:
            self.embedding_ = da.from_array(emb, chunks=(_task_rows(source, self.chunk_rows),
                                                         emb.shape[1]))
        return self


# --------------------------------------------------------------------------- #
# Nystrom
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


def _finite_block(block, chunk_starts=None, block_info=None):
    """``block`` unchanged, after :func:`check_finite` (global row numbers)."""
    start = block_info[0]["array-location"][0][0] if block_info else 0
    check_finite(block, start, chunk_starts=chunk_starts)
    return block


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


def _tree_reduce(items: list, combine, fan_in: int = 8):
    """Combine delayed ``items`` in a fixed-order tree of ``fan_in``-ary nodes."""
    level = list(items)
    while len(level) > 1:
        level = [dask.delayed(combine, pure=True)(level[a:a + fan_in])
                 for a in range(0, len(level), fan_in)]
    return level[0]


class NystromEmbedding(_KernelEmbeddingBase):
    """Eigen-decomposition on ``n_landmarks`` rows, extended to all rows by the Nystrom formula.

    The landmarks ``x_1..x_m`` are chosen by ``selection``; their ``m x m``
    kernel matrix is normalized *among the landmarks* (centred, or divided by
    the landmark degrees ``d_M(x) = sum_{i in M} k(x, x_i)``) and decomposed; every
    row (and any new row) is then embedded by the Nystrom formula of that
    landmark-dependent kernel (Bengio et al. 2003, eqs. 8-12; Homrighausen &
    McDonald 2011, Algorithm 1):

    - additive: ``f_k(x) = sum_i u_ik / sqrt(lambda_k) k_c(x, x_i)``, an estimate of
      kernel PCA's projection ``sqrt(lambda_k) u_k``; ``eigenvalues_`` are
      ``(n/m) lambda^(m)``;
    - divisive: ``f_k(x) = sqrt(m/n) / lambda_k sum_i k(x, x_i) v_ik /
      sqrt(d_M(x) d_M(x_i))`` (Algorithm 1's ``sqrt(m/n)`` keeps the unit-norm
      scale over the n training rows); ``eigenvalues_`` are ``lambda^(m)``.

    With every row as a landmark this is exactly :class:`ExactKernelEmbedding`.
    Only the landmarks are held in memory; the extension is a dask map over row
    blocks.

    Parameters
    ----------
    n_components : int, default=2
    n_landmarks : int, default=100
        ``m``, above ``n_components`` and at most the number of rows.
    selection : {"uniform", "diagonal", "largest-diagonal", "volume"}, default="uniform"
        ``uniform``: m rows at random without replacement. ``diagonal``: m rows
        sampled without replacement with probability proportional to the
        diagonal of the normalized kernel (Homrighausen & McDonald's "weighted
        Nystrom"; one pass over the data, Efraimidis-Spirakis keys).
        ``largest-diagonal``: the m rows with the largest such diagonal entries
        (Belabbas & Wolfe's deterministic rule; ties go to the lower row).
        ``volume``: ``P(I) ~ det(G_I)`` for the normalized kernel ``G`` by
        Belabbas & Wolfe's Metropolis chain, run over a seeded in-memory sample
        of ``sample_size`` candidate rows (all rows when n is not larger).
    kernel, gamma, degree, coef0 :
        As :class:`~ooc_spectral.GreedySpectralEmbedding`.
    normalization : {"additive", "divisive"}, default="additive"
    drop_first : bool, default=True
    degree_subset_size : int, default=1000
        Rows of the seeded subset on which the normalized kernel's row means are
        estimated for ``diagonal``, ``largest-diagonal`` and ``volume`` (exact
        when it holds every row).
    sample_size : int, default=20000
        Candidate rows of the volume chain.
    n_steps : int, default=None
        Iterations of the volume chain; None: ``50 * n_landmarks`` (Belabbas &
        Wolfe's "on the order of 50 |I|").
    chunk_rows : int, default=None
        Rows per task of the passes over the data.
    random_state : int, default=None

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
    eigenvalues_ : ndarray of shape (n_components,)
    landmark_indices_ : ndarray of shape (m,)
        Row numbers of the landmarks in X, ascending.
    landmarks_ : ndarray of shape (m, n_features)
    selection_scores_ : ndarray of shape (m,) or None
        The normalized-kernel diagonal of each landmark (``diagonal``,
        ``largest-diagonal``).
    acceptance_rate_ : float or None
        Of the volume chain.
    gamma_ : float or None
    model_ : NystromModel
    n_features_in_, n_samples_fit_ : int
    timings_ : dict
    """

    def __init__(self, n_components=2, *, n_landmarks=100, selection="uniform", kernel="rbf",
                 gamma=None, degree=3, coef0=1.0, normalization="additive", drop_first=True,
                 degree_subset_size=1000, sample_size=20000, n_steps=None, chunk_rows=None,
                 random_state=None):
        self.n_components = n_components
        self.n_landmarks = n_landmarks
        self.selection = selection
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.normalization = normalization
        self.drop_first = drop_first
        self.degree_subset_size = degree_subset_size
        self.sample_size = sample_size
        self.n_steps = n_steps
        self.chunk_rows = chunk_rows
        self.random_state = random_state

    def _check_params(self, n: int) -> None:
        self._check_common()
        m = check_int(type(self).__name__, "n_landmarks", self.n_landmarks, low=2)
        check_choice(type(self).__name__, "selection", self.selection, NYSTROM_SELECTIONS)
        check_int(type(self).__name__, "degree_subset_size", self.degree_subset_size, low=1)
        check_int(type(self).__name__, "sample_size", self.sample_size, low=2)
        check_int(type(self).__name__, "n_steps", self.n_steps, low=0, none=True)
        if self.n_components >= m:
            raise InvalidParameterError(
                f"n_components={self.n_components} is not below n_landmarks={m}; ask for at "
                f"least {self.n_components + 1} landmarks"
            )
        if m > n:
            raise InvalidParameterError(
                f"n_landmarks={m} exceeds the {n} rows of X; ask for at most {n}"
            )
        if self.selection == "volume" and m >= min(n, self.sample_size):
            raise InvalidParameterError(
                f"selection='volume' needs n_landmarks={m} below the number of candidate rows "
                f"({min(n, self.sample_size)}); lower n_landmarks or raise sample_size"
            )

    # ------------------------------------------------------------------ #
    def _select(self, source: DataSource, base: Kernel, seed: int):
        """Landmark row numbers (ascending) and their selection scores."""
        n, m = source.n_rows, int(self.n_landmarks)
        sel = self.selection
        if sel == "uniform":
            rng = np.random.default_rng(np.random.SeedSequence([seed, 0x4E59]))
            return np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64), None, None
        subset_rows = plan_sample(n, self.degree_subset_size, seed, _PURPOSE["selection_subset"])
        kernel = selection_kernel(base, self.normalization, source.read_index(subset_rows))
        if sel == "volume":
            cand = plan_sample(n, self.sample_size, seed, _PURPOSE["volume_candidates"])
            C = source.read_index(cand)
            aux = kernel.aux(C)

            def gram(a, b):
                return kernel.pairwise(C[a], C[b], aux[a], aux[b])

            steps = 50 * m if self.n_steps is None else int(self.n_steps)
            rng = np.random.default_rng(np.random.SeedSequence([seed, 0x7017]))
            idx, info = metropolis_volume_sample(gram, len(cand), m, steps, random_state=rng)
            return np.sort(cand[idx]), None, info["acceptance_rate"]
        X = source.to_dask(_task_rows(source, self.chunk_rows))
        starts = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]])
        shared_kernel = dask.delayed(kernel, pure=True)
        parts = [dask.delayed(_diag_block, pure=True)(b, shared_kernel, sel, m, seed, int(a))
                 for b, a in zip(X.to_delayed().ravel(), starts)]
        keys, rows, vals = _tree_reduce(parts, functools.partial(_merge_top, m=m)).compute()
        if sel == "diagonal" and np.sum(np.isfinite(keys)) < m:
            raise InvalidInputError(
                f"only {int(np.sum(np.isfinite(keys)))} rows have a positive normalized-kernel "
                f"diagonal; cannot sample n_landmarks={m} of them with selection='diagonal'"
            )
        order = np.argsort(rows)
        return rows[order], vals[order], None

    def fit(self, X, y=None):
        """Choose the landmarks, decompose their kernel, embed every row.

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str
        y : ignored

        Returns
        -------
        self
        """
        source = self._open(X)
        self._check_params(source.n_rows)
        seed = resolve_seed(self.random_state)
        base, gamma = _resolve_kernel(self, source, seed)
        t0 = time.perf_counter()
        rows, scores, acc = self._select(source, base, seed)
        t1 = time.perf_counter()
        L = source.read_index(rows)
        coef, offset, vals, _ = _dense_fit(base(L), self.normalization, self.n_components,
                                           self.drop_first)
        n, m = source.n_rows, len(rows)
        if self.normalization == "additive":
            model = NystromModel(base, L, base.aux(L), "additive", coef, offset)
            eigenvalues = vals * (n / m)
        else:
            model = NystromModel(base, L, base.aux(L), "divisive", coef, None,
                                 scale=math.sqrt(m / n))
            eigenvalues = vals
        t2 = time.perf_counter()
        self.model_ = model
        self.landmark_indices_ = rows
        self.landmarks_ = L
        self.selection_scores_ = scores
        self.acceptance_rate_ = acc
        self.eigenvalues_ = eigenvalues
        self.gamma_ = gamma
        self.n_features_in_ = source.n_features
        self.n_samples_fit_ = n
        self.random_state_ = seed
        self.embedding_ = _embed_source(model, source, self.chunk_rows)
        self.timings_ = {"selection": t1 - t0, "eigensolve": t2 - t1,
                         "extension": time.perf_counter() - t2}
        return self


# --------------------------------------------------------------------------- #
# Gaussian projection (randomized range finder), out of core
# --------------------------------------------------------------------------- #
def _kv_block(Xi, Xj, Vj, kernel: Kernel):
    """``k(Xi, Xj) @ Vj`` in sub-blocks of :data:`SUB_BLOCK_ROWS` (memory bounded)."""
    Xi, Xj, Vj = _f64(Xi), _f64(Xj), _f64(Vj)
    out = np.zeros((Xi.shape[0], Vj.shape[1]))
    sub = SUB_BLOCK_ROWS
    aux_j = [kernel.aux(Xj[b:b + sub]) for b in range(0, Xj.shape[0], sub)]
    for a in range(0, Xi.shape[0], sub):
        xa = Xi[a:a + sub]
        ax = kernel.aux(xa)
        acc = out[a:a + sub]
        for q, b in enumerate(range(0, Xj.shape[0], sub)):
            acc += kernel.pairwise(xa, Xj[b:b + sub], ax, aux_j[q]) @ Vj[b:b + sub]
    return out[:, None, :]


def kernel_matmul(kernel: Kernel, Xa: da.Array, Xb: da.Array, V: da.Array, *,
                  split_every: int = 8) -> da.Array:
    """``k(Xa, Xb) @ V`` out of core, never forming the kernel matrix.

    One task per pair of row blocks ``(i, j)`` computes ``k(Xa_i, Xb_j) @ V_j``
    (in sub-blocks of :data:`SUB_BLOCK_ROWS` rows, so a task holds at most a
    ``2048 x 2048`` kernel block whatever the chunking); the partial products are
    summed over ``j`` in a fixed-order tree. Each block of the data is read once
    per product.

    Parameters
    ----------
    kernel : Kernel
    Xa : dask array of shape (na, d)
        One column chunk.
    Xb : dask array of shape (nb, d)
        One column chunk.
    V : dask array of shape (nb, l)
        Row chunks aligned with ``Xb``'s, one column chunk.

    Returns
    -------
    dask array of shape (na, l), row chunks of ``Xa``.
    """
    Xa = Xa.rechunk({1: -1})
    Xb = Xb.rechunk({1: -1})
    V = V.rechunk({0: Xb.chunks[0], 1: -1})
    inter = da.blockwise(_kv_block, "ijk", Xa, "ia", Xb, "ja", V, "jk", kernel, None,
                         adjust_chunks={"j": 1}, concatenate=True, dtype=np.float64,
                         meta=np.empty((0, 0, 0)), name="ooc-spectral-kernel-matmul")
    return inter.sum(axis=1, split_every=split_every)


def _gaussian_block(block, seed: int, columns: int, block_info=None):
    start = block_info[0]["array-location"][0][0] if block_info else 0
    return _row_random(seed, 0x6A55, start, start + block.shape[0], columns)


class _Scratch:
    """Where the n x l intermediates live: numpy in memory, or zarr on disk.

    Every array read back from disk carries a :class:`_ScratchLease` in its graph,
    so a temporary directory lives as long as any array that reads from it (an
    estimator's lazy ``embedding_`` outlives the estimator); a block whose store
    is gone raises instead of reading zarr's fill value, zeros.
    """

    def __init__(self, in_memory: bool, workdir=None):
        self.in_memory = in_memory
        self._lease = None
        if not in_memory:
            if workdir is None:
                tmp = tempfile.TemporaryDirectory(prefix="ooc-spectral-gp-")
                self._lease = _ScratchLease(tmp.name, tmp)
            else:
                os.makedirs(os.fspath(workdir), exist_ok=True)
                self._lease = _ScratchLease(os.fspath(workdir), None)

    @property
    def path(self):
        return None if self._lease is None else self._lease.path

    def keep(self, name: str, arr: da.Array) -> da.Array:
        if self.in_memory:
            return da.from_array(arr.compute(), chunks=arr.chunks)
        url = os.path.join(self.path, f"{name}.zarr")
        arr.to_zarr(url, overwrite=True)
        stored = da.from_zarr(url)
        return stored.map_blocks(_read_leased, lease=self._lease, url=url, dtype=stored.dtype)


class _ScratchLease:
    """A scratch directory and, in the driver, the temporary directory that owns it.

    Pickled (to a worker) it travels as its path alone, without ownership.
    """

    def __init__(self, path: str, owner):
        self.path = path
        self._owner = owner

    def __reduce__(self):
        return _ScratchLease, (self.path, None)


def _read_leased(block: np.ndarray, *, lease: _ScratchLease, url: str) -> np.ndarray:
    if not os.path.isdir(url):
        raise FileNotFoundError(
            f"the intermediate array {url} of a GaussianProjectionEmbedding fit is gone (its "
            "scratch directory was deleted, or is not visible from this worker); refit, or "
            "pass workdir= a directory every worker can read")
    return block


class GaussianProjectionEmbedding(_KernelEmbeddingBase):
    """Randomized range finder on the n x n normalized kernel matrix, out of core.

    Homrighausen & McDonald's "Gaussian projection" (their Algorithm 2, from
    Halko, Martinsson & Tropp): with ``A`` the normalized kernel matrix (centred
    ``H K H``, or ``D^-1/2 K D^-1/2``) and ``l = n_components (+1 for the
    dropped trivial eigenvector) + oversampling`` columns,

    1. ``Y = A Omega`` with ``Omega`` an ``n x l`` Gaussian matrix;
    2. ``power_iterations`` times: ``Q = orth(Y)``, ``Y = A Q`` (Halko et al.'s
       subspace iteration, Algorithm 4.4);
    3. ``Q = orth(Y)``, ``B = Q' A Q`` (``l x l``), ``B = U_B Lambda U_B'``, ``U = Q U_B``.

    Step 3 forms ``B`` by one more product (Halko et al.'s Algorithm 5.1) rather
    than Homrighausen & McDonald's least-squares ``B Q'Omega = Q'Y``: the Ritz
    values of ``Q' A Q`` are bounded by ``A``'s spectrum, while the least-squares
    ``B`` can invent large eigenvalues when ``Q'Omega`` is ill-conditioned.

    Every product ``K V`` (``V`` an ``n x l`` matrix) is :func:`kernel_matmul`:
    row blocks against column blocks, summed, never forming ``K``. The degrees
    ``K 1`` (divisive) and row means (additive) come with the first product, as
    one more column of ``V``; the centring and ``D^-1/2`` are then applied to the
    ``n x l`` factors, so the first product uses the test matrix
    ``D^{1/2} Omega`` (divisive), still a random Gaussian matrix up to a row
    scaling. The data are streamed ``2 + power_iterations`` times (plus once for
    ``transform``); the time is ``O(n^2 (d + l))``. The ``n x l`` intermediates
    are numpy arrays for numpy input and zarr arrays in ``workdir`` otherwise.

    Parameters
    ----------
    n_components : int, default=2
    oversampling : int, default=10
        Extra columns beyond the eigenvectors wanted.
    power_iterations : int, default=2
        Subspace iterations (0 is Homrighausen & McDonald's plain Algorithm 2).
    kernel, gamma, degree, coef0 :
        As :class:`~ooc_spectral.GreedySpectralEmbedding`.
    normalization : {"additive", "divisive"}, default="additive"
    drop_first : bool, default=True
    chunk_rows : int, default=None
        Rows per block of the products (default 8192, rounded to storage chunks).
    workdir : str or path, default=None
        Directory for the ``n x l`` intermediates of dask or zarr input (default: a
        temporary directory removed with the estimator).
    random_state : int, default=None
        Seed of ``Omega`` (generated per fixed window of rows, so independent of
        the chunking) and of the ``gamma=None`` sample.

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
    eigenvalues_ : ndarray of shape (n_components,)
        Ritz values: eigenvalues of the centred Gram matrix (additive) or of
        ``D^-1/2 K D^-1/2`` (divisive).
    n_columns_ : int
        ``l``.
    n_passes_ : int
        Kernel products over the whole data made by ``fit``.
    gamma_ : float or None
    n_features_in_, n_samples_fit_ : int
    timings_ : dict
    """

    def __init__(self, n_components=2, *, oversampling=10, power_iterations=2, kernel="rbf",
                 gamma=None, degree=3, coef0=1.0, normalization="additive", drop_first=True,
                 chunk_rows=None, workdir=None, random_state=None):
        self.n_components = n_components
        self.oversampling = oversampling
        self.power_iterations = power_iterations
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.normalization = normalization
        self.drop_first = drop_first
        self.chunk_rows = chunk_rows
        self.workdir = workdir
        self.random_state = random_state

    def fit(self, X, y=None):
        """Run the range finder and compute the training embedding.

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str
        y : ignored

        Returns
        -------
        self
        """
        self._check_common()
        check_int(type(self).__name__, "oversampling", self.oversampling, low=0)
        q = check_int(type(self).__name__, "power_iterations", self.power_iterations, low=0)
        source = self._open(X)
        n = source.n_rows
        divisive = self.normalization == "divisive"
        k = self.n_components + int(divisive and self.drop_first)
        l = k + int(self.oversampling)
        if l > n:
            raise InvalidParameterError(
                f"n_components + oversampling = {l} columns exceed the {n} rows of X; lower "
                "oversampling or n_components"
            )
        seed = resolve_seed(self.random_state)
        kernel, gamma = _resolve_kernel(self, source, seed)
        scratch = _Scratch(source.kind == "numpy", self.workdir)
        X = source.to_dask(_task_rows(source, self.chunk_rows))
        # every pass checks its blocks finite (a NaN would give a NaN embedding, silently)
        X = X.map_blocks(_finite_block, chunk_starts=source.chunk_starts, dtype=X.dtype)
        rows = X.chunks[0]
        timings = {}

        def product(V):
            return kernel_matmul(kernel, X, X, V)

        # pass 1: K [Omega, 1] gives the first product and the row sums
        t0 = time.perf_counter()
        omega = da.map_blocks(_gaussian_block, X, seed, l, dtype=np.float64,
                              chunks=(rows, (l,)), meta=np.empty((0, l)))
        ones = da.ones((n, 1), chunks=(rows, 1))
        first = scratch.keep("first", product(da.concatenate([omega, ones], axis=1)))
        r = first[:, l]
        if divisive:
            rmin = float(r.min().compute())
            if rmin <= 0:
                raise InvalidInputError(
                    "a row has a non-positive kernel degree, so the divisive normalization is "
                    "undefined; use a kernel with positive values (rbf, laplacian)"
                )
            s = 1.0 / da.sqrt(r)
            # A (D^1/2 Omega) = D^-1/2 K Omega
            Y = scratch.keep("Y0", first[:, :l] * s[:, None])
        else:
            mu = r / n
            mu_bar = float(mu.mean().compute())
            Y = scratch.keep("Y0", self._center(first[:, :l], omega, mu, mu_bar, n))

        def apply_A(V):
            if divisive:
                return product(V * s[:, None]) * s[:, None]
            return self._center(product(V), V, mu, mu_bar, n)

        timings["pass1"] = time.perf_counter() - t0
        for it in range(q):
            t = time.perf_counter()
            Q = scratch.keep(f"Q{it}", da.linalg.tsqr(Y)[0])
            Y = scratch.keep(f"Y{it + 1}", apply_A(Q))
            timings[f"power{it + 1}"] = time.perf_counter() - t
        t = time.perf_counter()
        Q = scratch.keep("Q", da.linalg.tsqr(Y)[0])
        Z = apply_A(Q)
        B = (Q.T @ Z).compute()
        B = 0.5 * (B + B.T)
        vals, UB = top_eigenpairs(B, k)
        U = Q @ UB
        # sign: the entry of largest magnitude of each n-vector is positive
        big = da.argmax(abs(U), axis=0).compute()
        signs = np.sign(np.asarray(U.vindex[big, np.arange(k)].compute()))
        signs[signs == 0] = 1.0
        UB = UB * signs
        U = scratch.keep("U", Q @ UB)
        timings["final"] = time.perf_counter() - t
        if divisive:
            if self.drop_first:
                vals, U = vals[1:], U[:, 1:]
            _positive_or_raise(vals, "normalized kernel matrix D^-1/2 K D^-1/2", self.n_components)
            emb = U
            coef = scratch.keep("coef", U * (s[:, None] / vals[None, :]))
            offset = None
        else:
            _positive_or_raise(vals, "centred Gram matrix", self.n_components)
            emb = U * np.sqrt(vals)[None, :]
            coef = scratch.keep("coef", U / np.sqrt(vals)[None, :])
            offset = (mu[None, :] @ coef).compute()[0]
        self.gamma_ = gamma
        self.eigenvalues_ = vals
        self.n_columns_ = l
        self.n_passes_ = 2 + q
        self.n_features_in_ = source.n_features
        self.n_samples_fit_ = n
        self.random_state_ = seed
        self.timings_ = timings
        self.model_ = _ProjectionModel(kernel, X, coef, offset, divisive)
        self._scratch = scratch
        self.embedding_ = emb.compute() if source.kind == "numpy" else scratch.keep("embedding", emb)
        return self

    @staticmethod
    def _center(KV, V, mu, mu_bar: float, n: int):
        """``H K H V`` from ``K V``: ``KV - mu (1'V) - 1 (mu'V) + mu_bar 1 (1'V)``."""
        colsum = V.sum(axis=0)
        mu_v = (mu[None, :] @ V)[0]
        return KV - mu[:, None] * colsum[None, :] - (mu_v - mu_bar * colsum)[None, :]

    def transform(self, X):
        """Out-of-sample embedding by the Nystrom formula against every training row.

        Costs one product ``k(X_new, X_train) @ coef`` over the training data
        (out of core, :func:`kernel_matmul`).

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str

        Returns
        -------
        ndarray or dask array of shape (n_rows, n_components)
        """
        model = self._check_fitted()
        source = self._open_new(X)
        Xn = source.to_dask(_task_rows(source, self.chunk_rows))
        # every block is checked finite before it reaches the kernel (a NaN row
        # would otherwise come out as a NaN embedding, silently)
        Xn = Xn.map_blocks(_finite_block, chunk_starts=source.chunk_starts, dtype=Xn.dtype)
        out = model.apply(Xn)
        return out.compute() if source.kind == "numpy" else out


@dataclass(frozen=True, eq=False)
class _ProjectionModel:
    kernel: Kernel
    X: da.Array
    coef: da.Array
    offset: np.ndarray | None
    divisive: bool

    def apply(self, Xn: da.Array) -> da.Array:
        if self.divisive:
            ones = da.ones((self.X.shape[0], 1), chunks=(self.X.chunks[0], 1))
            P = kernel_matmul(self.kernel, Xn, self.X, da.concatenate([self.coef, ones], axis=1))
            d = P[:, -1]
            return P[:, :-1] / da.sqrt(d)[:, None]
        P = kernel_matmul(self.kernel, Xn, self.X, self.coef)
        return P - self.offset[None, :]
