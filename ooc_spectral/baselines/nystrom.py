"""Nystrom embedding: an eigen-decomposition on landmark rows, extended to every row."""

from __future__ import annotations

import math
import time

import numpy as np

from .._params import store_params
from .._validation import check_choice, check_int
from ..exceptions import InvalidInputError, InvalidParameterError
from ..core.kernels import Kernel
from ..core.planning import plan_sample
from ..io.source import DataSource
from ._common import NystromModel, _dense_fit, _embed_source, _KernelEmbeddingBase
from .selection import (
    _PURPOSE,
    diagonal_scan,
    metropolis_volume_sample,
    selection_kernel,
)

__all__ = ["NystromEmbedding", "NYSTROM_SELECTIONS"]

NYSTROM_SELECTIONS = ("uniform", "diagonal", "largest-diagonal", "volume")


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
        store_params(self, locals())

    def _check_params(self) -> None:
        """Nothing before X is read: the checks of :meth:`_check_n_rows` come first."""

    def _check_n_rows(self, n: int) -> None:
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
        keys, rows, vals = diagonal_scan(source, kernel, sel, m, seed, self.chunk_rows)
        if sel == "diagonal" and np.sum(np.isfinite(keys)) < m:
            raise InvalidInputError(
                f"only {int(np.sum(np.isfinite(keys)))} rows have a positive normalized-kernel "
                f"diagonal; cannot sample n_landmarks={m} of them with selection='diagonal'"
            )
        order = np.argsort(rows)
        return rows[order], vals[order], None

    def _fit(self, source: DataSource, kernel: Kernel, seed: int) -> None:
        """Choose the landmarks, decompose their kernel, embed every row."""
        t0 = time.perf_counter()
        rows, scores, acc = self._select(source, kernel, seed)
        t1 = time.perf_counter()
        L = source.read_index(rows)
        coef, offset, vals, _ = _dense_fit(kernel(L), self.normalization, self.n_components,
                                           self.drop_first)
        n, m = source.n_rows, len(rows)
        if self.normalization == "additive":
            model = NystromModel(kernel, L, kernel.aux(L), "additive", coef, offset)
            eigenvalues = vals * (n / m)
        else:
            model = NystromModel(kernel, L, kernel.aux(L), "divisive", coef, None,
                                 scale=math.sqrt(m / n))
            eigenvalues = vals
        t2 = time.perf_counter()
        self.model_ = model
        self.landmark_indices_ = rows
        self.landmarks_ = L
        self.selection_scores_ = scores
        self.acceptance_rate_ = acc
        self.eigenvalues_ = eigenvalues
        self.embedding_ = _embed_source(model, source, self.chunk_rows)
        self.timings_ = {"selection": t1 - t0, "eigensolve": t2 - t1,
                         "extension": time.perf_counter() - t2}
