"""Local certificates: upper bounds on the scan's residual at O(q^2) per row.

Once the dictionary is large, most rows are within tol of a handful of nearby
dictionary points, and the residual against any subset of the dictionary bounds
the residual against all of it from above (the projection on a smaller span, or
affine hull, is never closer). :class:`LocalCertificate` keeps, for each
dictionary point j, the factor of its :data:`LOCAL_SIZE` nearest dictionary
points (by kernel value); a row is bounded with the neighbourhood of the
dictionary point it is closest to, at O(q^2) instead of O(m^2). Rows whose bound
is below tol can never be added (adding points only lowers a residual), so the
scan drops the rows that
:func:`~ooc_spectral.core.scan.blocked.uncertified_rows` rules out before the full solve: the dictionary is the
one the point-by-point scan selects, only the work changes.

The certificate is a function of the dictionary's size only
(:func:`local_certificate_size`), so a scan resumed from a checkpoint rebuilds
the certificate an uninterrupted scan had. The module's constants are read at
call time (tests set :data:`LOCAL_MIN_SIZE` and :data:`LOCAL_SIZE` small here).
"""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..kernels import Kernel

__all__ = [
    "LocalCertificate",
    "LOCAL_SIZE",
    "LOCAL_MIN_SIZE",
    "LOCAL_GROWTH",
    "CERTIFY_THREADS",
    "local_certificate_size",
    "certify_rows",
]

#: Dictionary points in each neighbourhood of a :class:`LocalCertificate`.
LOCAL_SIZE = 32
#: The scan uses local certificates once the dictionary holds this many points
#: (below it, the full solve costs about as little as the bound).
LOCAL_MIN_SIZE = 384
#: Local certificates are rebuilt each time the dictionary has grown by this factor.
LOCAL_GROWTH = 1.25
#: Threads that evaluate the certificate's kernel blocks (the scan is otherwise
#: sequential; these blocks are independent).
CERTIFY_THREADS = max(1, min(4, os.cpu_count() or 1))


def local_certificate_size(size: int) -> int:
    """Dictionary points covered by the local certificate of a dictionary of ``size``.

    The largest point of the grid ``ceil(LOCAL_MIN_SIZE * LOCAL_GROWTH**k)`` not
    above ``size`` (0 below :data:`LOCAL_MIN_SIZE`). A function of the size only,
    so a scan resumed from a checkpoint rebuilds the certificate an uninterrupted
    scan had, and rebuilding costs a geometric series (about 5x the last build).
    """
    if size < LOCAL_MIN_SIZE:
        return 0
    g = LOCAL_MIN_SIZE
    while math.ceil(g * LOCAL_GROWTH) <= size:
        g = math.ceil(g * LOCAL_GROWTH)
    return g


@dataclass(frozen=True, eq=False)
class LocalCertificate:
    """Upper bounds on the residual ``delta`` (eq. 8) from small neighbourhoods.

    For each of the first ``size`` dictionary points j: its ``q`` nearest
    dictionary points ``N_j`` (largest kernel values among the first ``size``),
    ``W_j = chol(k(N_j, N_j))^-1``, ``w_j = W_j 1`` and ``beta_j = w_j . w_j``.
    A row x with ``j = argmax_i k(x, d_i)`` is bounded by its residual against
    ``N_j``: ``z = W_j k(N_j, x)``, ``delta_j = k(x, x) - z.z (+ (1 - w_j.z)^2 / beta_j)``.
    The projection on a subset of the dictionary is never closer than on all of
    it, so ``delta_j >= delta``: a row with ``delta_j <= tol`` is within tol of the
    dictionary now and after any point is added.

    Per row this costs one pass over ``size`` entries of
    :meth:`~ooc_spectral.core.kernels.Kernel.pairwise_monotone` (for the Gaussian, a
    matrix product without the exponential), q kernel values and a q x q
    product, instead of the full kernel row and an m x m triangular solve.

    Attributes
    ----------
    kernel : Kernel
    points : ndarray of shape (size, d)
        The dictionary prefix the certificate covers.
    aux : ndarray or None
        ``kernel.aux(points)``.
    neighbours : ndarray of shape (size, q)
    inverse : ndarray of shape (size, q, q)
        ``W_j``; NaN for a neighbourhood whose factor failed (never certifies).
    w : ndarray of shape (size, q)
    beta : ndarray of shape (size,)
    affine : bool
    row_sums : ndarray of shape (size, q)
        Row sums of ``|W_j|``: the coefficients ``a = W_j' z`` of a row have
        ``|a|_1 <= row_sums_j . |z|``.
    frobenius : ndarray of shape (size,)
        ``||W_j||_F``.
    gram_error : ndarray of shape (size,)
        A bound on ``||W_j S_j W_j' - I||_2`` with ``S_j`` the neighbourhood's exact Gram
        matrix (its computed inverse factor's departure from orthonormalizing it).
    radius, kmax : float
        The points' largest distance from the kernel's centre and ``|k(d, d)|``.
    """

    kernel: Kernel
    points: np.ndarray
    aux: np.ndarray | None
    neighbours: np.ndarray
    inverse: np.ndarray
    w: np.ndarray
    beta: np.ndarray
    affine: bool
    row_sums: np.ndarray = None
    frobenius: np.ndarray = None
    gram_error: np.ndarray = None
    radius: float = 0.0
    kmax: float = 1.0

    @property
    def size(self) -> int:
        return int(self.points.shape[0])

    @classmethod
    def build(cls, kernel: Kernel, points: np.ndarray, aux, affine: bool,
              q: int | None = None) -> "LocalCertificate":
        """The certificate of the dictionary ``points`` (m x d), O(m^2 d + m q^3).

        ``q`` defaults to :data:`LOCAL_SIZE`.
        """
        points = np.array(points, dtype=np.float64)
        aux = None if aux is None else np.array(aux)
        m = points.shape[0]
        q = min(LOCAL_SIZE if q is None else int(q), m)
        neighbours = np.empty((m, q), dtype=np.int64)
        for a in range(0, m, 512):  # the m x m Gram matrix one row block at a time
            b = min(a + 512, m)
            G = kernel.pairwise(points[a:b], points, None if aux is None else aux[a:b], aux)
            part = (np.argpartition(-G, q - 1, axis=1)[:, :q] if q < m
                    else np.tile(np.arange(m), (b - a, 1)))
            neighbours[a:b] = np.sort(part, axis=1)
        S = np.empty((m, q, q))
        for j in range(m):
            nb = neighbours[j]
            a_j = None if aux is None else aux[nb]
            S[j] = kernel.pairwise(points[nb], points[nb], a_j, a_j)
        inverse = np.full((m, q, q), np.nan)
        try:
            inverse[:] = np.linalg.inv(np.linalg.cholesky(S))
        except np.linalg.LinAlgError:  # a neighbourhood is numerically singular: skip it alone
            for j in range(m):
                try:
                    inverse[j] = np.linalg.inv(np.linalg.cholesky(S[j]))
                except np.linalg.LinAlgError:
                    pass
        w = inverse.sum(axis=2)
        return cls(kernel=kernel, points=points, aux=aux, neighbours=neighbours, inverse=inverse,
                   w=w, beta=np.einsum("ij,ij->i", w, w), affine=bool(affine),
                   **_rounding_constants(kernel, points, aux, S, inverse))

    def upper_bounds(self, X: np.ndarray, x_aux=None, with_rounding: bool = False):
        """Upper bounds on ``delta`` for the rows of X, and ``k(x, x)``.

        Parameters
        ----------
        X : ndarray of shape (c, d)
        x_aux : optional
            ``kernel.aux(X)``.

        Returns
        -------
        bounds : ndarray of shape (c,)
            ``delta_j >= delta`` (NaN where a neighbourhood was unusable).
        kx : ndarray of shape (c,)
        rounding : ndarray of shape (c,)
            With ``with_rounding``: a bound on the rounding of each bound (:meth:`_rounding`).
        """
        kernel = self.kernel
        X = np.ascontiguousarray(X, dtype=np.float64)
        if x_aux is None:
            x_aux = kernel.aux(X)
        kx = kernel.diag(X, x_aux)
        S = kernel.pairwise_monotone(X, self.points, x_aux, self.aux,
                                     out=_scratch(X.shape[0], self.size))
        j = np.argmax(S, axis=1)
        G = kernel.monotone_to_kernel(np.take_along_axis(S, self.neighbours[j], axis=1))
        Z = np.matmul(self.inverse[j], G[:, :, None])[:, :, 0]
        sq = np.einsum("ij,ij->i", Z, Z)
        bounds = kx - sq
        if self.affine:
            alpha = 1.0 - np.einsum("ij,ij->i", self.w[j], Z)
            bounds += alpha * alpha / self.beta[j]
        if not with_rounding:
            return bounds, kx
        return bounds, kx, self._rounding(X, x_aux, kx, j, G, Z, sq)

    def _rounding(self, X, x_aux, kx, j, G, Z, sq) -> np.ndarray:
        """An upper bound of the rounding in each row's local residual ``kx - |z|^2``.

        With ``a = W_j' z`` and S the neighbourhood's exact Gram matrix, the residual
        of the coefficients a (an upper bound of the exact distance to the
        neighbourhood's span, itself above the distance to the dictionary's) is
        ``(k(x, x) - |z|^2) + 2 z'f + 2 a'e + z' (W S W' - I) z`` exactly, f the
        rounding of the product ``W g~`` and e the kernel values' (module
        :mod:`ooc_spectral.core.rounding`)."""
        from ..rounding import diag_error, entry_error, gamma

        q = self.neighbours.shape[1]
        eta = entry_error(self.kernel, X, x_aux, kx, self.radius, self.kmax)
        zn = np.sqrt(np.maximum(sq, 0.0))
        coef = np.einsum("ij,ij->i", self.row_sums[j], np.abs(Z))
        gn = np.sqrt(np.einsum("ij,ij->i", G, G))
        E = (2 * gamma(q + 1) * zn * self.frobenius[j] * gn + 2 * coef * eta
             + self.gram_error[j] * sq + gamma(q + 2) * (sq + np.abs(kx))
             + diag_error(self.kernel, X, x_aux, kx))
        return np.where(np.isnan(E), np.inf, E * (1 + 1e-15))

    def certified(self, X: np.ndarray, tol: float, x_aux=None) -> np.ndarray:
        """Rows of X certainly within ``tol`` of the dictionary (a boolean mask): the local
        bound plus its rounding (:meth:`_rounding`) at most ``tol``."""
        bounds, kx, rounding = self.upper_bounds(X, x_aux, with_rounding=True)
        return bounds + rounding <= tol


def _rounding_constants(kernel: Kernel, points, aux, S: np.ndarray, inverse: np.ndarray) -> dict:
    """:class:`LocalCertificate`'s rounding constants, O(m q^3)."""
    from ..rounding import entry_error, gamma, kernel_center

    m, q = inverse.shape[0], inverse.shape[1]
    c = kernel_center(kernel)
    P = points if c is None else points - np.asarray(c, dtype=np.float64)
    radius = float(np.sqrt(np.max(np.einsum("ij,ij->i", P, P)))) * (1 + gamma(P.shape[1] + 2)) if m else 0.0
    kd = kernel.diag(points, aux)
    kmax = float(np.max(np.abs(kd))) if m else 1.0
    eta_d = float(np.max(entry_error(kernel, points, aux, kd, radius, kmax))) if m else 0.0
    aW = np.abs(inverse)
    row_sums = aW.sum(axis=2)
    frob = np.sqrt(np.einsum("ijk,ijk->i", inverse, inverse))
    H = np.matmul(np.matmul(inverse, S), np.transpose(inverse, (0, 2, 1))) - np.eye(q)
    HH = np.matmul(np.matmul(aW, np.abs(S)), np.transpose(aW, (0, 2, 1)))
    gram_error = (np.sqrt(np.einsum("ijk,ijk->i", H, H)) + gamma(2 * q + 2)
                  * np.sqrt(np.einsum("ijk,ijk->i", HH, HH))
                  + eta_d * np.einsum("ij,ij->i", row_sums, row_sums))
    gram_error = np.where(np.isnan(gram_error), np.inf, gram_error * (1 + 1e-15))
    return {"row_sums": row_sums, "frobenius": frob, "gram_error": gram_error,
            "radius": radius, "kmax": kmax}


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_SCRATCH = threading.local()


def scan_pool() -> ThreadPoolExecutor:
    """The scan's helper threads, :data:`CERTIFY_THREADS` of them, started once per
    process (their scratch blocks persist): the certificate's blocks, and the block
    coordinates of :func:`ooc_spectral.core.scan.blocked.block_coordinates`."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(CERTIFY_THREADS, thread_name_prefix="ooc-certify")
        return _POOL


def _scratch(rows: int, cols: int) -> np.ndarray:
    """A rows x cols float64 block reused by this thread: a block allocated afresh each
    time is mapped and faulted in by the allocator, which costs as much as filling it."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < rows * cols:
        buf = _SCRATCH.buf = np.empty(rows * cols)
    return buf[: rows * cols].reshape(rows, cols)


def certify_rows(size: int) -> int:
    """Rows bounded at once by a certificate of ``size`` points: the c x size block
    stays within 16 MiB, so the allocator reuses its memory instead of mapping
    (and faulting in) new pages, and the gathered q x q factors stay small."""
    return int(max(256, min(2048, (16 * 2**20) // (8 * max(size, 1)))))
