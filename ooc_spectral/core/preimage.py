"""The pre-image map of ``inverse_transform``: kernel ridge regression, out of core.

scikit-learn's ``KernelPCA(fit_inverse_transform=True)`` learns the map from the
embedding back to the rows by kernel ridge regression with the model's kernel
on the *embedding* coordinates: with ``E`` the n x p training embedding,
``(k(E, E) + alpha I) B = X`` and ``x^(e) = k(e, E) B``. That needs the
n x n Gram matrix of the embedding.

Here the regression is restricted to the kernel functions centred at the
embeddings ``E_D`` of the m dictionary points (the subset-of-regressors form of
the same ridge problem): ``x^(e) = k(e, E_D) B`` with ``B`` minimizing
``sum_t |x_t - k(e_t, E_D) B|^2 + alpha tr(B' k(E_D, E_D) B)``, whose normal
equations ``(K_nD' K_nD + alpha K_DD) B = K_nD' X`` need only the m x m
statistic ``sum_t k_t k_t'`` and the m x d statistic ``sum_t k_t x_t'``
(``k_t = k(e_t, E_D)``). Both are sums over rows: one parallel pass after the
eigensolve (the embedding a row gets is known only then) accumulates them
chunk by chunk with the ordered tree reduction of pass 2
(:func:`~ooc_spectral.pipeline.accumulate.accumulate`, kind ``"preimage"``). When the
dictionary is every row (``K_nD = K``, invertible) the normal equations
reduce to scikit-learn's ``(K + alpha I) B = X``; the exact path solves that
system directly (:func:`exact_preimage`), as scikit-learn does.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import linalg

from .model import SpectralMap
from ..exceptions import NumericalBreakdownError
from .kernels import Kernel
from .._validation import check_finite
from .statistics import PreimageSums

__all__ = ["PreimageMap", "PreimageProblem", "chunk_preimage", "solve_preimage",
           "exact_preimage"]


@dataclass(frozen=True, eq=False)
class PreimageMap:
    """``x^(e) = k(e, centers) dual_coef``: what ``inverse_transform`` applies.

    Attributes
    ----------
    kernel : Kernel
        The model's kernel, applied to embedding coordinates (as scikit-learn).
    centers : ndarray of shape (c, p)
        The embeddings of the regression's centres: the dictionary points (every
        training row on the exact path). scikit-learn's ``X_transformed_fit_``.
    dual_coef : ndarray of shape (c, d)
    alpha : float
    """

    kernel: Kernel
    centers: np.ndarray
    dual_coef: np.ndarray
    alpha: float

    def apply(self, E: np.ndarray) -> np.ndarray:
        """Pre-images of the embedding rows ``E`` (float64), shape ``(len(E), d)``."""
        E = np.ascontiguousarray(E, dtype=np.float64)
        K = self.kernel.pairwise(E, self.centers, self.kernel.aux(E), self.kernel.aux(self.centers))
        return K @ self.dual_coef


@dataclass(frozen=True, eq=False)
class PreimageProblem:
    """What the ``preimage`` pass sends to each task: the map to the embedding and the centres."""

    spectral_map: SpectralMap
    kernel: Kernel
    centers: np.ndarray


def chunk_preimage(block, problem: PreimageProblem, offset: int, chunk_starts=None) -> PreimageSums:
    """``n``, ``sum k k'`` (m x m) and ``sum k x'`` (m x d) of one chunk, ``k = k(e(x), E_D)``."""
    X = np.ascontiguousarray(block, dtype=np.float64)
    check_finite(X, offset, chunk_starts=chunk_starts)
    E = problem.spectral_map.embed(X)
    kern, C = problem.kernel, problem.centers
    K = kern.pairwise(E, C, kern.aux(E), kern.aux(C))
    return PreimageSums(X.shape[0], K.T @ K, K.T @ X)


def _solve_pos(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``A^-1 B`` for a symmetric positive (semi-)definite ``A``; least squares if singular."""
    A = 0.5 * (A + A.T)
    try:
        return linalg.solve(A, B, assume_a="pos", check_finite=False)
    except (linalg.LinAlgError, ValueError):
        return linalg.lstsq(A, B, check_finite=False)[0]


def solve_preimage(stats: PreimageSums, problem: PreimageProblem, alpha: float) -> PreimageMap:
    """The map from the pass's statistics: ``(sum k k' + alpha K_DD) B = sum k x'``."""
    kern, C = problem.kernel, problem.centers
    A = np.array(stats.ktk, dtype=np.float64)
    if alpha:
        A += alpha * kern.pairwise(C, C, kern.aux(C), kern.aux(C))
    # The normal equations square the conditioning of the kernel columns and the centres'
    # Gram matrix is nearly singular for a smooth kernel, so A is ill-conditioned; its
    # Cholesky solve still minimizes the ridge objective to rounding (tested against the
    # regression solved in memory), which is what the map needs: its coefficients are not
    # reported as exact, only its predictions are used.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", linalg.LinAlgWarning)
        B = _solve_pos(A, np.asarray(stats.ktx, dtype=np.float64))
    if not np.all(np.isfinite(B)):
        raise NumericalBreakdownError(
            "the pre-image map's ridge system gave NaN or infinity: its m x m matrix is "
            "singular at this alpha; use a larger alpha (e.g. alpha=1e-3 or more)")
    return PreimageMap(kern, np.ascontiguousarray(C), B, float(alpha))


def exact_preimage(kernel: Kernel, E: np.ndarray, X: np.ndarray, alpha: float) -> PreimageMap:
    """scikit-learn's regression on every row: ``(k(E, E) + alpha I) B = X``."""
    E = np.ascontiguousarray(E, dtype=np.float64)
    aux = kernel.aux(E)
    K = kernel.pairwise(E, E, aux, aux)
    K.flat[:: K.shape[0] + 1] += alpha
    B = _solve_pos(K, np.ascontiguousarray(X, dtype=np.float64))
    if not np.all(np.isfinite(B)):
        raise NumericalBreakdownError(
            "the pre-image map's ridge system gave NaN or infinity: k(E, E) is singular at this "
            "alpha; use a larger alpha (e.g. alpha=1e-3 or more)")
    return PreimageMap(kernel, E, B, float(alpha))
