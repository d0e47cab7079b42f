"""The m x m eigensolve, in the client process, and the map it yields.

From the statistics of pass 2 (see :mod:`ooc_spectral.accumulate`):

additive (kernel PCA, Proposition 2)
    ``C = sum (y - ybar)(y - ybar)'`` (mapped from the kernel rows' moments by
    :func:`projection_moments`); ``C W = W Lambda``. The training embedding
    is ``e_t = (y_t - ybar) W``: kernel PCA's projections (``sqrt(lambda_k)``
    times the unit eigenvector of the centred Gram matrix), the scale of
    scikit-learn's ``KernelPCA.fit_transform``; ``Lambda`` are the eigenvalues
    of the centred Gram matrix (scikit-learn's ``eigenvalues_``).
divisive, exact degrees (spectral clustering / Laplacian eigenmaps)
    ``d_t = y_t . s`` with ``s = sum y``; ``S = sum y y' / d``; ``S W = W Lambda``.
    The unit eigenvectors of ``D^-1/2 K D^-1/2`` are
    ``v_k = (y_t / sqrt(d_t)) w_k / sqrt(lambda_k)``; the first (eigenvalue 1,
    proportional to ``sqrt(d)``) is trivial and dropped by default.
divisive, subset degrees
    the kernel was normalized before the scan; ``S = sum y y'`` and
    ``v_k = y_t w_k / sqrt(lambda_k)``. The Gram matrix of that kernel is
    ``n D^-1/2 K D^-1/2``, so the eigenvalues reported are ``lambda / n``.

Eigenvectors come back in descending order of eigenvalue with a deterministic
sign: in each column of W the entry of largest magnitude is positive.

:class:`SpectralMap` is what pass 3 and ``transform`` apply to rows of X: the
Nyström formula of Bengio et al. (eqs. 8-12) in this basis, which on a training
row gives back its training embedding.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy.linalg import eigh, solve_triangular

from .exceptions import DictionaryError
from .scan import Dictionary

__all__ = ["SpectralMap", "top_eigenpairs", "solve_additive", "solve_divisive",
           "projection_moments",
           "check_n_components", "spent_directions"]

MODES = ("additive", "divisive-exact", "divisive-subset")


def top_eigenpairs(A: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest eigenpairs of the symmetric ``A``, descending, signs fixed."""
    A = 0.5 * (A + A.T)
    m = A.shape[0]
    vals, vecs = eigh(A, subset_by_index=[m - k, m - 1], driver="evr")
    vals, vecs = vals[::-1].copy(), vecs[:, ::-1].copy()
    big = np.argmax(np.abs(vecs), axis=0)
    signs = np.sign(vecs[big, np.arange(k)])
    signs[signs == 0] = 1.0
    return vals, vecs * signs


def spent_directions(affine: bool, mode: str, drop_first: bool) -> int:
    """Directions of the m-dimensional projection not available as components.

    Centring the affine projections loses one (they lie in an affine subspace of
    dimension m - 1); the divisive embedding drops the trivial eigenvector.
    """
    if mode == "additive":
        return 1 if affine else 0
    return 1 if drop_first else 0


def check_n_components(dictionary_size: int, n_components: int, spent: int = 1) -> None:
    """Raise :class:`DictionaryError` unless ``n_components + spent <= dictionary_size``.

    ``spent`` is :func:`spent_directions`: with the defaults (affine kernel PCA,
    or divisive with the trivial eigenvector dropped) ``n_components`` must be
    below ``m``.
    """
    m = int(dictionary_size)
    if n_components + spent > m:
        bound = "below" if spent else "at most"
        raise DictionaryError(
            f"n_components={n_components} is not {bound} the dictionary size ({m} points); "
            f"lower n_components to at most {max(m - spent, 0)}, or grow the dictionary with a "
            "smaller tol, a larger gamma, or dictionary_size > n_components"
        )


@dataclass(frozen=True, eq=False)
class SpectralMap:
    """The map from rows of X to embedding coordinates.

    Attributes
    ----------
    dictionary : Dictionary
    mode : {"additive", "divisive-exact", "divisive-subset"}
    center : ndarray of shape (m,) or None
        ``ybar`` (additive) or ``s = sum y`` (divisive, exact degrees).
    components : ndarray of shape (m, p)
        ``W`` (additive) or ``W / sqrt(Lambda)`` (divisive).
    eigenvalues : ndarray of shape (p,)
    n_samples : int
    """

    dictionary: Dictionary
    mode: str
    center: np.ndarray | None
    components: np.ndarray
    eigenvalues: np.ndarray
    n_samples: int

    @property
    def n_components(self) -> int:
        return int(self.components.shape[1])

    @functools.cached_property
    def folded(self) -> tuple[np.ndarray, np.ndarray]:
        """``(G, c0)`` such that the embedding is ``k(X, D) G + c0`` (``solver="gemm"``).

        With ``y = P L^-1 k + w/beta`` (affine; ``P = I - w w'/beta``) or
        ``y = L^-1 k``, every mode is a kernel block times one small matrix:

        - additive: ``G = L^-T P W``, ``c0 = (w/beta - ybar) W`` (``-ybar W`` if not affine);
        - divisive, exact degrees: ``G = L^-T [W / sqrt(Lambda), s]``; the last column
          gives the degree ``d`` and the rest is divided by ``sqrt(d)``;
        - divisive, subset degrees: ``G = L^-T W / sqrt(Lambda)``.
        """
        d = self.dictionary
        W = self.components
        p = W.shape[1]
        c0 = np.zeros(p)
        if self.mode == "additive":
            if d.affine:
                W = W - np.outer(d.w, d.w @ W) / d.beta
                c0 = (d.w / d.beta - self.center) @ self.components
            else:
                c0 = -self.center @ W
        elif self.mode == "divisive-exact":
            W = np.column_stack([W, self.center])
        G = solve_triangular(d.L.T, W, lower=False, check_finite=False)
        return np.ascontiguousarray(G), c0

    def _check_degrees(self, deg: np.ndarray) -> None:
        if np.any(deg <= 0):
            i = int(np.flatnonzero(deg <= 0)[0])
            raise DictionaryError(
                f"the approximate degree of row {i} of this block is {deg[i]:.3g} (not "
                "positive): the row is too far from the training data for the divisive "
                "normalization; refit with a smaller tol or degree_estimate='subset'"
            )

    def embed(self, X: np.ndarray) -> np.ndarray:
        """Embedding of the rows of X, shape ``(len(X), n_components)``."""
        return self.embed_with_degrees(X)[0]

    def embed_with_degrees(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The embedding of the rows of X and, for ``divisive-exact``, their degrees ``d(x)``.

        The degrees (``y(x) . s``, the row sums of the approximate Gram matrix)
        give Laplacian-eigenmap and diffusion-map coordinates ``v_k / sqrt(d)``.
        """
        deg = None
        if self.dictionary.solver == "gemm":
            K, _ = self.dictionary.kernel_block(X)
            G, c0 = self.folded
            E = K @ G
            if self.mode == "divisive-exact":
                deg = E[:, -1].copy()
                self._check_degrees(deg)
                E = E[:, :-1] / np.sqrt(deg)[:, None]
            else:
                E += c0
            return E, deg
        Y, _ = self.dictionary.project(X, orthogonal=self.mode != "additive")
        if self.mode == "additive":
            Y -= self.center
        elif self.mode == "divisive-exact":
            deg = Y @ self.center
            self._check_degrees(deg)
            Y /= np.sqrt(deg)[:, None]
        return Y @ self.components, deg


def projection_moments(dictionary: Dictionary, kbar: np.ndarray, CK: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and centred second moment of the projections from those of the kernel rows.

    ``y = P L^-1 k + w/beta`` (``P = I - w w'/beta``; ``y = L^-1 k`` when not
    affine), so ``ybar = P L^-1 kbar + w/beta`` and ``C = P L^-1 C_K L^-T P``:
    two triangular solves on an m x m matrix.
    """
    L = dictionary.L
    A = solve_triangular(L, CK, lower=True, check_finite=False)  # L^-1 C_K
    C = solve_triangular(L, A.T, lower=True, check_finite=False)  # L^-1 C_K L^-T
    zbar = solve_triangular(L, kbar, lower=True, check_finite=False)
    if not dictionary.affine:
        return zbar, C
    w, beta = dictionary.w, dictionary.beta
    Cw = C @ w
    C = C - np.outer(w, Cw) / beta - np.outer(Cw, w) / beta + np.outer(w, w) * (w @ Cw) / beta**2
    return zbar - w * (w @ zbar) / beta + w / beta, C


def solve_additive(dictionary: Dictionary, moments: dict, n_components: int) -> SpectralMap:
    """Kernel PCA from the kernel-space ``moments`` statistics of pass 2."""
    check_n_components(dictionary.size, n_components,
                       spent_directions(dictionary.affine, "additive", False))
    ybar, C = projection_moments(dictionary, np.asarray(moments["mean"]), moments["m2"])
    vals, W = top_eigenpairs(C, n_components)
    return SpectralMap(dictionary, "additive", ybar, W, vals, int(moments["n"]))


def solve_divisive(dictionary: Dictionary, stats: dict, n_components: int, *,
                   drop_first: bool, subset: bool, total: np.ndarray | None = None) -> SpectralMap:
    """Spectral embedding from the ``degrees`` (exact) or ``gram`` (subset) statistics."""
    k = n_components + int(drop_first)
    check_n_components(dictionary.size, n_components,
                       spent_directions(dictionary.affine, "divisive", drop_first))
    vals, W = top_eigenpairs(stats["S"], k)
    if drop_first:
        vals, W = vals[1:], W[:, 1:]
    if np.any(vals <= 0):
        raise DictionaryError(
            f"the normalized kernel has only {int(np.sum(vals > 0))} positive eigenvalues among "
            f"the {n_components} requested; lower n_components or tol"
        )
    n = int(stats["n"])
    components = W / np.sqrt(vals)
    if subset:
        return SpectralMap(dictionary, "divisive-subset", None, components, vals / n, n)
    return SpectralMap(dictionary, "divisive-exact", np.asarray(total), components, vals, n)
