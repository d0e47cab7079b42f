"""The fitted model: what the fit leaves behind and what every later stage applies.

:class:`Dictionary` is the frozen result of pass 1 (:mod:`ooc_spectral.core.scan`): the
dictionary points, the Cholesky factor ``L`` of their Gram matrix, ``w = L^-1 1``
and ``beta = w.w``, with the projection arithmetic passes 2 and 3 use
(coordinates ``z = L^-1 k``, residuals ``delta`` of eq. 8, the affine
coordinates ``y``). :class:`SpectralMap` is the result of the eigensolve
(:mod:`ooc_spectral.core.eigensolve`): the dictionary with the eigenvectors and the
centre, whose :meth:`SpectralMap.embed` is the Nystrom formula applied by
pass 3 (:mod:`ooc_spectral.pipeline.writeback`), ``transform`` and the persisted model
(:mod:`ooc_spectral.io.persistence`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy.linalg import solve_triangular
from scipy.linalg.blas import dger

from .._accel.blas import solve_lower_rows, solve_lower_transposed
from ..exceptions import DictionaryError
from .kernels import Kernel, first_nonpositive

__all__ = ["PIVOT_FLOOR", "Dictionary", "SpectralMap"]

#: A row enters only if its unconstrained residual exceeds this times k(x, x).
PIVOT_FLOOR = 1e3 * np.finfo(np.float64).eps



@dataclass(frozen=True, eq=False)
class Dictionary:
    """The dictionary and its factor: everything passes 2, 3 and ``transform`` need.

    Attributes
    ----------
    kernel : Kernel
    points : ndarray of shape (m, d)
        The dictionary rows, in the order they were selected.
    indices : ndarray of shape (m,)
        Their row numbers in X.
    aux : ndarray or None
        ``kernel.aux(points)``, cached.
    L : ndarray of shape (m, m) or None
        Lower Cholesky factor of ``M = k(D, D)``. None for the exact path
        (:func:`~ooc_spectral.core.eigensolve.solve_exact`): the dictionary is every
        row and the coordinates are the kernel rows themselves.
    w : ndarray of shape (m,)
        ``L^-1 1``.
    beta : float
        ``w . w``.
    affine : bool
        Whether the projection carries the constraint ``sum_i a_ti = 1``.
    solver : {"trsm", "gemm"}
        How pass 3 and ``transform`` map rows (:meth:`SpectralMap.embed_with_degrees`).
    rounding : FactorRounding or None
        What pass 2 needs to bound the rounding of every row's residual
        (:class:`~ooc_spectral.core.rounding.FactorRounding`), attached once the
        dictionary is final (:func:`~ooc_spectral.core.rounding.with_rounding`); None
        for a dictionary that only maps rows (a loaded model).
    """

    kernel: Kernel
    points: np.ndarray
    indices: np.ndarray
    aux: np.ndarray | None
    L: np.ndarray
    w: np.ndarray
    beta: float
    affine: bool
    solver: str = "trsm"
    rounding: object = None

    def __post_init__(self):
        r = self.rounding
        if r is not None and getattr(r, "size", None) != self.points.shape[0]:
            raise ValueError(f"Dictionary: rounding constants of a {getattr(r, 'size', '?')}-point "
                             f"dictionary given to one of {self.points.shape[0]} points")

    @property
    def size(self) -> int:
        return int(self.points.shape[0])

    def kernel_block(self, X: np.ndarray, x_aux=None, out: np.ndarray | None = None,
                     order: str = "F", col_sums: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        """``K = k(X, D)`` (c x m) and ``k(x, x)`` for the rows of X.

        ``order="F"``: K is Fortran-ordered, the transpose of the C-ordered
        ``k(D, X)`` (m x c), one row per dictionary point, the layout OpenBLAS
        solves fastest (:meth:`solve`); ``out``, a C-ordered float64 (m x c) array,
        receives ``k(D, X)`` (a caller's reused buffer; K is then its transpose).
        ``order="C"``: K is C-ordered, one row per row of X, the layout MKL solves
        fastest (:func:`~ooc_spectral._accel.blas.fast_solve_order`); ``out`` is then a
        C-ordered float64 (c x m) array and K is ``out`` itself. The same values
        either way (the kernel is symmetric in its arguments, to rounding).
        ``col_sums`` (C order only; m values) receives the sums of K's rows,
        ``K' 1``, added piece by piece while each is in the cache.
        """
        X = np.ascontiguousarray(X, dtype=np.float64)
        if order not in ("C", "F"):
            raise ValueError(f"kernel_block: order must be 'C' or 'F', got {order!r}")
        if x_aux is None:
            x_aux = self.kernel.aux(X)
        kx = self.kernel.diag(X, x_aux)
        if order == "C":
            if out is None:
                out = np.empty((X.shape[0], self.size))
            return self.kernel.pairwise_into(out, X, self.points, x_aux, self.aux, col_sums), kx
        if col_sums is not None:
            raise ValueError("kernel_block: col_sums is given in the C order only")
        if out is None:
            KT = self.kernel.pairwise(self.points, X, self.aux, x_aux)
        else:
            KT = self.kernel.pairwise_into(out, self.points, X, self.aux, x_aux)
        return KT.T, kx

    def solve(self, K: np.ndarray, overwrite: bool = False) -> np.ndarray:
        """``Z = K L^-T`` for a kernel block K (c x m), in place if ``overwrite``.

        For a Fortran-ordered K (:meth:`kernel_block`'s), a recursive forward
        substitution on its C-ordered transpose
        (:func:`~ooc_spectral._accel.blas.solve_lower_rows`: matrix products and small
        triangular solves on contiguous rows), Z Fortran-ordered too; for a
        C-ordered K, one triangular solve
        (:func:`~ooc_spectral._accel.blas.solve_lower_transposed`). Both are backward
        stable and release the GIL, so that the threaded engine's tasks solve
        side by side. A product with an explicit ``L^-1`` does twice the flops
        and loses accuracy when L is ill conditioned.
        """
        if self.L is None:  # the exact path's kernel basis
            return K if overwrite else K.copy()
        if K.flags.f_contiguous and not K.flags.c_contiguous:
            return solve_lower_rows(self.L, K.T if overwrite else K.T.copy()).T
        return solve_lower_transposed(self.L, K if overwrite else K.copy())

    def coordinates(self, X: np.ndarray, x_aux=None) -> tuple[np.ndarray, np.ndarray]:
        """``Z = K L^-T`` (c x m) and ``k(x, x)`` for the rows of X."""
        K, kx = self.kernel_block(X, x_aux)
        return self.solve(K, overwrite=True), kx

    def residuals(self, Z: np.ndarray | None, kx: np.ndarray, dhat: np.ndarray | None = None,
                  zw: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """``delta_t`` (eq. 8) from the coordinates, and ``alpha_t`` (None if not affine).

        ``dhat``, the unconstrained residuals ``k(x, x) - |z|^2`` when the caller has
        them (:meth:`unconstrained_residuals`), and ``zw``, the products ``z_t . w``,
        each save a pass over Z (which is not read when both are given).

        A row whose unconstrained residual is below the pivot floor is in the
        span (the scan cannot add it: a finite-dimensional feature space, such
        as the linear kernel's, is then saturated): its ``delta_t`` is that
        residual, since every use of the coordinates (the orthogonal projection)
        is exact for it, though it may lie outside the affine hull.
        """
        if Z is None and (dhat is None or (self.affine and zw is None)):
            raise ValueError("Dictionary.residuals: without Z, give dhat (and zw for an affine "
                             "dictionary)")
        if dhat is None:
            dhat = self.unconstrained_residuals(Z, kx)
        if not self.affine:
            return dhat, None
        alpha = 1.0 - (Z @ self.w if zw is None else zw)
        delta = dhat + alpha * alpha / self.beta
        inspan = dhat <= PIVOT_FLOOR * np.maximum(np.abs(kx), np.finfo(np.float64).tiny)
        if inspan.any():
            delta[inspan] = np.maximum(dhat[inspan], 0.0)
        return delta, alpha

    @staticmethod
    def row_norms(Z: np.ndarray) -> np.ndarray:
        """``|z_t|^2`` of the rows of Z (either memory order)."""
        if Z.flags.f_contiguous and not Z.flags.c_contiguous:
            return np.einsum("ji,ji->i", Z.T, Z.T)
        return np.einsum("ij,ij->i", Z, Z)

    @staticmethod
    def unconstrained_residuals(Z: np.ndarray, kx: np.ndarray) -> np.ndarray:
        """``dhat_t = k(x_t, x_t) - |z_t|^2``, the squared distance to the span."""
        return kx - Dictionary.row_norms(Z)

    def project(self, X: np.ndarray, *, orthogonal: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Projection coordinates and residuals of the rows of X.

        Parameters
        ----------
        X : ndarray of shape (c, d)
        orthogonal : bool
            Return the orthogonal projection on the span (``y_t = z_t``) even
            when the dictionary is affine. The divisive normalization needs it:
            only the orthogonal projection bounds the *uncentred* kernel
            (Proposition 1: ``|K - Z Z'| <= tol`` entrywise), while the affine
            one bounds the centred kernel, which is what kernel PCA uses.

        Returns
        -------
        Y : ndarray of shape (c, m)
            ``y_t = z_t + (alpha_t / beta) w`` (affine) or ``z_t``, so that
            ``Y Y'`` is the approximate Gram matrix ``A M A'``.
        delta : ndarray of shape (c,)
            ``delta_t`` of eq. 8 with the final dictionary (the certificate;
            the scan's criterion whatever ``orthogonal`` is).
        """
        Z, kx = self.coordinates(X)
        delta, alpha = self.residuals(Z, kx)
        if self.affine and not orthogonal:  # Z += (alpha / beta) w', a rank-one update in place
            if Z.flags.f_contiguous:
                Z = dger(1.0, alpha / self.beta, self.w, a=Z, overwrite_a=True)
            else:
                Z = dger(1.0, self.w, alpha / self.beta, a=Z.T, overwrite_a=True).T
        return Z, delta


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

        With ``z = L^-1 k``, every mode is a kernel block times one small matrix:

        - additive: ``G = L^-T W``, ``c0 = -zbar W``;
        - divisive, exact degrees: ``G = L^-T [W / sqrt(Lambda), s]``; the last column
          gives the degree ``d`` and the rest is divided by ``sqrt(d)``;
        - divisive, subset degrees: ``G = L^-T W / sqrt(Lambda)``.

        Solved with BLAS on one thread wherever it is first needed (a task, or the client
        before the pre-image pass): OpenBLAS splits a solve differently on more threads,
        and a saved and loaded model must give the rows the fitted one gives, bit for bit.
        """
        from .._accel.threads import one_thread

        d = self.dictionary
        W = self.components
        p = W.shape[1]
        c0 = np.zeros(p)
        if self.mode == "additive":
            c0 = -self.center @ W
        elif self.mode == "divisive-exact":
            W = np.column_stack([W, self.center])
        if d.L is None:
            return np.ascontiguousarray(W), c0
        with one_thread():
            G = solve_triangular(d.L.T, W, lower=False, check_finite=False)
        return np.ascontiguousarray(G), c0

    def _check_degrees(self, deg: np.ndarray) -> None:
        if (i := first_nonpositive(deg)) is not None:
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
            d = self.dictionary
            G, c0 = self.folded
            E = d.kernel.pairwise_dot(X, d.points, G, None, d.aux)
            if self.mode == "divisive-exact":
                deg = E[:, -1].copy()
                self._check_degrees(deg)
                E = E[:, :-1] / np.sqrt(deg)[:, None]
            else:
                E += c0
            return E, deg
        Y, _ = self.dictionary.project(X, orthogonal=True)
        if self.mode == "additive":
            Y -= self.center
        elif self.mode == "divisive-exact":
            deg = Y @ self.center
            self._check_degrees(deg)
            Y /= np.sqrt(deg)[:, None]
        return Y @ self.components, deg
