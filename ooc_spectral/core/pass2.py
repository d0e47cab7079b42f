"""Pass 2, one chunk at a time: pure NumPy over ``(block, small state) -> statistic``.

Each task of pass 2 reduces its rows to a small statistic: for the additive
normalization the moments of their coordinates on the dictionary
(``z = L^-1 k(D, x)``), for the divisive one sums over their projections (``Y``,
c x m, see :meth:`~ooc_spectral.core.model.Dictionary.project`). Each chunk function
returns one typed statistic of :mod:`ooc_spectral.core.statistics` (``Moments`` for the
additive normalization, ``CrossMoments`` after the prefix scan grew the dictionary,
``KernelSums``, ``Gram`` and ``Degrees`` for the divisive one, ``PreimageSums`` for
``fit_inverse_transform``); ``a.combine(b)`` merges two, ``a`` before ``b`` in row
order. :data:`STAT_KINDS` names them for the pass
(:func:`~ooc_spectral.pipeline.accumulate.accumulate`).

Nothing n x m is ever held: a task holds one c x m block. With ``block_rows``
(:func:`~ooc_spectral.core.planning.plan_block_rows`) a task walks its rows in
sub-blocks of that many rows and folds their partials in row order (with the
same ``combine``; pass 2's moments into one m x m accumulator, the same sums),
so its kernel block stays within the memory budget whatever the dictionary
size and the storage chunks.

The statistics of a dictionary grown after pass 2 (the prefix scan) are brought up
to date by :func:`extend_moments` (from the solved co-moments) or
:func:`extend_moments_kernel` (from kernel-space co-moments, where the grown factor is
well conditioned).
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import numpy as np

from .._accel.blas import add_gram_lower, fast_solve_order, symmetric_from_lower
from .._accel.fused import centre_rows, centre_rows_weighted, loops_for
from .._validation import check_finite
from ..exceptions import DictionaryError
from .model import PIVOT_FLOOR, Dictionary
from .planning import solve_block_rows
from .preimage import chunk_preimage
from .rounding import U
from .statistics import (BeyondTol, Certificate, CrossMoments, Degrees, Gram, KernelSums, Moments,
                         RowSums, Statistic, _combine_optional, _pooled)

__all__ = [
    "block_entries",
    "chunk_moments",
    "chunk_cross_moments",
    "chunk_ksums",
    "chunk_gram",
    "chunk_degrees",
    "chunk_kernel_cross",
    "in_sub_blocks",
    "combine",
    "STAT_KINDS",
    "check_degrees",
    "extend_moments",
    "extend_moments_kernel",
    "kernel_cross_is_accurate",
]


# --------------------------------------------------------------------------- #
# chunk functions: pure NumPy over (block, small state) -> small statistic
# --------------------------------------------------------------------------- #
def in_sub_blocks(func):
    """Let a chunk function take ``block_rows``: its rows in sub-blocks of that many.

    The sub-blocks' partials are folded in row order as they come (one partial
    held at a time), with ``combine``, the reduction's own update.
    """

    @functools.wraps(func)
    def wrapper(block, dictionary, offset, *args, block_rows=None, **kwargs):
        n = len(block)
        if block_rows is None or n <= int(block_rows):
            return func(block, dictionary, offset, *args, **kwargs)
        step = int(block_rows)
        out = None
        for a in range(0, n, step):
            part = func(block[a:a + step], dictionary, int(offset) + a, *args, **kwargs)
            out = part if out is None else out.combine(part)
        return out

    return wrapper


def _project(block, dictionary: Dictionary, offset: int, chunk_starts):
    """The rows (checked finite), their orthogonal coordinates ``y = z`` (c x m) and each
    row's residual: its computed ``delta``, or where the dictionary carries its rounding
    constants, the larger of that and its certified residual (as
    :func:`_centred_coordinates`)."""
    X = np.ascontiguousarray(block, dtype=np.float64)
    check_finite(X, offset, chunk_starts=chunk_starts)
    Y, delta = dictionary.project(X, orthogonal=True)
    rounding = dictionary.rounding
    if rounding is None:
        return X, Y, delta
    kernel = dictionary.kernel
    x_aux = kernel.aux(X)
    kx = kernel.diag(X, x_aux)
    sq = Dictionary.row_norms(Y)
    cheap = (rounding.cheap_coefficients(Y) if np.all(np.isfinite(rounding.inverse_sums))
             else None)
    bounds, _, _, _ = rounding.certify(dictionary, X, x_aux, kx, sq, kx - sq, cheap,
                                       lambda rows: Y[rows])
    return X, Y, np.maximum(delta, bounds)


def _beyond(delta, offset, X, tol_check) -> BeyondTol | None:
    """The rows beyond ``tol_check`` (the prefix scan's check pass), or None."""
    return None if tol_check is None else BeyondTol.of(delta, offset, X, tol_check)


_SCRATCH = threading.local()


def _kernel_scratch(m: int, c: int, order: str = "F") -> np.ndarray:
    """An m x c (``order="F"``) or c x m (``"C"``) C-ordered float64 block reused by
    this thread's sub-blocks.

    A block allocated afresh for each sub-block is mapped and faulted in by the
    allocator, and freed back at its end: under ``MALLOC_TRIM_THRESHOLD_=65536``
    (which distributed sets in the workers it starts; the embedded cluster no longer
    does, see :data:`~ooc_spectral.runtime.cluster.WORKER_MALLOC_TRIM_THRESHOLD`) every such
    block is a fresh ``mmap`` (docs/measurements.md, "Workers' allocator thresholds").
    The coordinates that live in this buffer never leave the chunk function (it
    returns new, small statistics).
    """
    buf = getattr(_SCRATCH, "kernel", None)
    if buf is None or buf.size < m * c:
        buf = _SCRATCH.kernel = np.empty(m * c)
    return buf[: m * c].reshape((m, c) if order == "F" else (c, m))


def _centred_coordinates(block, dictionary: Dictionary, offset: int, chunk_starts,
                         order: str = "F"):
    """The rows as float64 (checked finite), their coordinates ``z = L^-1 k(D, x)``
    centred in place, the mean that was subtracted, each row's residual and the
    :class:`~ooc_spectral.core.statistics.RowSums` (of the uncentred coordinates).

    The residual of a row is its computed ``delta`` (eq. 8) or, where the dictionary
    carries its rounding constants (:class:`~ooc_spectral.core.rounding.FactorRounding`),
    the larger of that and its certified residual (an upper bound of the exact squared
    distance to the span, :meth:`~ooc_spectral.core.rounding.FactorRounding.certify`);
    for a row in the span (computed or certified below the pivot floor: no affine part)
    the certified one.

    The coordinates (c x m, Fortran- or C-ordered as ``order`` says, see
    :func:`~ooc_spectral._accel.blas.fast_solve_order`) are a view of this thread's
    scratch block (:func:`_kernel_scratch`): valid until the thread's next call.
    In the C order their mean is ``L^-1 kbar``, from the kernel block's column sums
    added piece by piece in the cache (the same mean to rounding, ``eps cond(L)``,
    without a pass over the block; in the F order, :func:`_column_means`)."""
    X = np.ascontiguousarray(block, dtype=np.float64)
    check_finite(X, offset, chunk_starts=chunk_starts)
    c, m = X.shape[0], dictionary.size
    rounding = dictionary.rounding
    x_aux = dictionary.kernel.aux(X)
    weights = None if rounding is None else rounding.inverse_sums
    if weights is not None and not np.all(np.isfinite(weights)):
        weights = None
    cheap = None
    if order != "C" or c == 0:
        K, kx = dictionary.kernel_block(X, x_aux, out=_kernel_scratch(m, c, order), order=order)
        Z = dictionary.solve(K, overwrite=True)
        sq = Dictionary.row_norms(Z)
        dhat = kx - sq
        delta, _ = dictionary.residuals(Z, kx, dhat)
        if rounding is not None:
            if weights is not None:
                cheap = rounding.cheap_coefficients(Z)
            bounds, xi, E, sharp = rounding.certify(dictionary, X, x_aux, kx, sq, dhat, cheap,
                                                    lambda rows: Z[rows])
        mean = _column_means(Z)
        Z -= mean
    else:  # the mean L^-1 kbar from the kernel's column sums, added up in the cache, and
        # solved as one more row of the block (the m x m factor is read once for both)
        ksum = np.empty(m)
        S = _kernel_scratch(m, c + 1, order)
        _, kx = dictionary.kernel_block(X, x_aux, out=S[:c], order=order, col_sums=ksum)
        np.divide(ksum, c, out=S[c])
        S = dictionary.solve(S, overwrite=True)
        Z, mean = S[:c], S[c].copy()  # the mean outlives this thread's scratch block
        w = dictionary.w if dictionary.affine else None
        if weights is None:
            sq, zw = centre_rows(Z, mean, w)
        else:
            sq, zw, cheap = centre_rows_weighted(Z, mean, w, weights)
        dhat = kx - sq
        delta, _ = dictionary.residuals(None, kx, dhat, zw)
        if rounding is not None:  # the sharp rows' coordinates: centred, moved back
            shift = 4 * U * (1.0 + float(np.max(np.abs(mean)))) if c else 0.0
            bounds, xi, E, sharp = rounding.certify(dictionary, X, x_aux, kx, sq, dhat, cheap,
                                                    lambda rows: Z[rows] + mean, shift)
    if rounding is None:
        return X, Z, mean, delta, RowSums.of(None, kx, dhat)
    # a row in the span (below the pivot floor) has no affine part: its computed delta is
    # the noise of dhat, and its certified bound says more (linear PCA: every row)
    floor = PIVOT_FLOOR * np.maximum(np.abs(kx), np.finfo(np.float64).tiny)
    residual = np.where((dhat <= floor) | (bounds <= floor), bounds, np.maximum(delta, bounds))
    return X, Z, mean, residual, RowSums.bounded(kx, bounds, sq, xi, E, sharp)


def _column_means(Z: np.ndarray) -> np.ndarray:
    """The mean of the rows of Z (c x m): one matrix-vector product, ``1' Z / c``.

    BLAS reads the block once at the memory's rate, where ``Z.mean(axis=0)`` on a
    C-ordered block adds it up row by row (docs/measurements.md, "Column means by
    one product"). Both sum the c values of a column in one pass
    (NumPy's pairwise summation applies along a contiguous axis only), so the
    rounding is of the same order, c eps at worst."""
    c = Z.shape[0]
    if c == 0:
        return np.full(Z.shape[1], np.nan)
    return np.matmul(np.ones(c), Z) / c


class _MomentsFold:
    """A task's :class:`~ooc_spectral.core.statistics.Moments`, its sub-blocks folded in row
    order into one m x m accumulator.

    Each sub-block's centred product ``Z' Z`` is added in place
    (:func:`~ooc_spectral._accel.blas.add_gram_lower`); the pairwise update of Chan, Golub
    & LeVeque that :meth:`Moments.combine` applies at each merge
    (``+ f diff diff'``, ``f = na nb / n``) is kept as the vector ``sqrt(f) diff``
    and added once, as one product, by :meth:`result`. The same sums as folding
    one ``Moments`` per sub-block with ``combine``, without two m x m temporaries
    and an outer product per sub-block (docs/measurements.md, "Pass 2's fold into one
    accumulator").
    """

    def __init__(self, m: int):
        self.gram = np.zeros((m, m), order="F")
        self.updates: list[np.ndarray] = []
        self.n, self.mean = 0, None
        self.sums = self.certificate = self.beyond = None

    def add(self, Z, mean, sums: RowSums, certificate: Certificate, beyond) -> None:
        """One sub-block: its centred coordinates Z (c x m), their mean and partials."""
        add_gram_lower(self.gram, Z)
        c = Z.shape[0]
        if self.n == 0:
            self.n, self.mean = c, mean
            self.sums, self.certificate, self.beyond = sums, certificate, beyond
            return
        self.n, self.mean, diff, f = _pooled(self.n, c, self.mean, mean)
        self.updates.append(diff * np.sqrt(f))
        self.sums = self.sums.combine(sums)
        self.certificate = self.certificate.combine(certificate)
        self.beyond = _combine_optional(self.beyond, beyond)

    def result(self) -> Moments:
        trace = float(np.trace(self.gram))  # the rows' squared centred norms, read off the products
        m2 = symmetric_from_lower(self.gram)
        if self.updates:
            U = np.array(self.updates)
            m2 += U.T @ U
            trace += float(np.einsum("ij,ij->", U, U))  # the updates' share: sum f |diff|^2
        return Moments(self.n, self.mean, m2, trace, self.sums, self.certificate, self.beyond)


def chunk_moments(block, dictionary: Dictionary, offset: int, chunk_starts=None,
                  tol_check=None, block_rows=None) -> Moments:
    """``n``, mean and centred sum of squares of the coordinates ``z = L^-1 k(D, x)``.

    The coordinates are the orthogonal projection of each row on the span of the
    dictionary, in the orthonormal basis the Cholesky factor defines: every
    chunk solves for them anyway (for the certificate), and their moments are
    what the eigensolve needs, with no further map. (Mapping kernel-space
    moments by ``L^-1 C_K L^-T`` once instead squares the condition number of
    L and gives spurious eigenvalues at small tol; see the module docstring of
    :mod:`ooc_spectral.core.eigensolve`.) Besides the certificate (``max delta``),
    the partial carries the row sums for the eigensolve's checks. With
    ``block_rows`` the rows are taken in sub-blocks of that many, folded in row
    order (:class:`_MomentsFold`).
    """
    n = len(block)
    order = fast_solve_order()
    step = solve_block_rows(n if block_rows is None else min(n, int(block_rows)),
                            dictionary.size, order)
    fold = _MomentsFold(dictionary.size)
    for a in range(0, max(n, 1), step):
        at = int(offset) + a
        X, Z, mean, delta, sums = _centred_coordinates(block[a:a + step], dictionary, at,
                                                       chunk_starts, order)
        fold.add(Z, mean, sums, Certificate.of(delta, at), _beyond(delta, at, X, tol_check))
    return fold.result()


@in_sub_blocks
def chunk_cross_moments(block, dictionary: Dictionary, offset: int, old_size: int,
                        chunk_starts=None) -> CrossMoments:
    """Co-moments of the coordinates on the points added after the first ``old_size``.

    The dictionary grew (the prefix scan): the leading ``old_size`` coordinates
    of a row are unchanged (the factor only gains rows), so the ``moments`` of
    pass 2 are extended by the co-moments of the old coordinates with the new
    ones and among the new ones. The new coordinates need the row's old ones
    (``z_new = L_nn^-1 (k_new - B z_old)``), so this pass solves as pass 2 does,
    and skips its m x m product. Also the certificate with the grown dictionary.
    """
    _, Z, mean, delta, sums = _centred_coordinates(block, dictionary, offset, chunk_starts)
    old, new = Z[:, :old_size], Z[:, old_size:]
    nn = new.T @ new
    return CrossMoments(Z.shape[0], mean[:old_size], mean[old_size:], old.T @ new, nn,
                        float(np.trace(nn)), sums, Certificate.of(delta, offset))


@in_sub_blocks
def chunk_kernel_cross(block, dictionary: Dictionary, offset: int, old_size: int,
                       chunk_starts=None) -> CrossMoments:
    """Co-moments of the kernel rows on the old points with those on the new ones.

    The fast extension (:func:`extend_moments_kernel`): a kernel block and one
    product per chunk, no solve. Only used where the grown factor is well enough
    conditioned (:func:`kernel_cross_is_accurate`).
    """
    X = np.ascontiguousarray(block, dtype=np.float64)
    check_finite(X, offset, chunk_starts=chunk_starts)
    K, _ = dictionary.kernel_block(X)
    mean = K.mean(axis=0)
    K -= mean
    old, new = K[:, :old_size], K[:, old_size:]
    nn = new.T @ new
    return CrossMoments(K.shape[0], mean[:old_size], mean[old_size:], old.T @ new, nn,
                        float(np.trace(nn)))


@in_sub_blocks
def chunk_ksums(block, dictionary: Dictionary, offset: int, chunk_starts=None) -> KernelSums:
    """``n`` and ``sum k`` of one chunk: a kernel block, no projection.

    The divisive normalization's first pass: ``sum z = L^-1 sum k`` is solved once
    in the client, so this pass costs O(c m d) per chunk.
    """
    X = np.ascontiguousarray(block, dtype=np.float64)
    check_finite(X, offset, chunk_starts=chunk_starts)
    K, _ = dictionary.kernel_block(X)
    return KernelSums(K.shape[0], K.sum(axis=0))


@in_sub_blocks
def chunk_gram(block, dictionary: Dictionary, offset: int, chunk_starts=None,
               tol_check=None) -> Gram:
    """``n`` and ``S = sum y y'`` of one chunk (divisive with subset degrees)."""
    X, Y, delta = _project(block, dictionary, offset, chunk_starts)
    return Gram(Y.shape[0], Y.T @ Y, Certificate.of(delta, offset),
                _beyond(delta, offset, X, tol_check))


@in_sub_blocks
def chunk_degrees(block, dictionary: Dictionary, offset: int, total: np.ndarray,
                  chunk_starts=None, tol_check=None) -> Degrees:
    """``S = sum y y' / d``, the smallest degree ``d = y . total`` and the certificate."""
    X, Y, delta = _project(block, dictionary, offset, chunk_starts)
    d = Y @ total
    i = int(np.argmin(d))
    if d[i] > 0:
        Y /= np.sqrt(d)[:, None]
    return Degrees(Y.shape[0], Y.T @ Y, float(d[i]), int(offset + i),
                   Certificate.of(delta, offset), _beyond(delta, offset, X, tol_check))


# --------------------------------------------------------------------------- #
# combine: two partials into one, deterministic
# --------------------------------------------------------------------------- #
def combine(a: Statistic, b: Statistic) -> Statistic:
    """Combine two partials of the same kind (``a`` before ``b`` in row order)."""
    if type(a) is not type(b):
        raise TypeError(f"cannot combine a {a.kind!r} statistic with a {b.kind!r} one")
    return a.combine(b)


def _combine_many(parts: list) -> Statistic:
    out = parts[0]
    for p in parts[1:]:
        out = out.combine(p)
    return out


class _InOrder:
    """The left fold of :func:`_combine_many` over partials numbered 0, 1, ..., fed in
    any order: each partial is combined as soon as all before it are, so only the
    folded prefix and the early arrivals are held (on a cluster the segments finish
    about in order). A pass's 32 segment partials at m = 1000 are 8 MB each; held
    until the end, they were a quarter GiB in the client."""

    def __init__(self):
        self.folded, self.next, self.early = None, 0, {}

    def add(self, i: int, part: Statistic) -> None:
        self.early[i] = part
        while self.next in self.early:
            p = self.early.pop(self.next)
            self.folded = p if self.folded is None else self.folded.combine(p)
            self.next += 1

    def result(self, count: int) -> Statistic:
        if self.next != count or self.early:
            raise RuntimeError(f"{self.next} of {count} partials folded")  # a bug, not input
        return self.folded


def block_entries(rows: int, dictionary) -> int:
    """The entries of a task's block of ``rows`` rows (rows x the dictionary's points),
    what decides the accelerators (:func:`~ooc_spectral._accel.fused.loops_for`). The
    preimage kind passes its problem, whose dictionary is the spectral map's."""
    m = getattr(dictionary, "size", None) or dictionary.spectral_map.dictionary.size
    return int(rows) * int(m)


def _sized(func):
    """``func`` on a task's block, with the compiled loops only where the block is large
    enough to pay for loading them (:func:`~ooc_spectral._accel.fused.loops_for`)."""

    @functools.wraps(func)
    def wrapper(block, dictionary, offset, *args, **kwargs):
        with loops_for(block_entries(len(block), dictionary)):
            return func(block, dictionary, offset, *args, **kwargs)

    return wrapper


STAT_KINDS = {kind: _sized(f) for kind, f in {
    "moments": chunk_moments, "ksums": chunk_ksums, "gram": chunk_gram,
    "degrees": chunk_degrees, "cross": chunk_cross_moments,
    "kernel_cross": chunk_kernel_cross, "preimage": in_sub_blocks(chunk_preimage)}.items()}


# --------------------------------------------------------------------------- #
# a grown dictionary: the moments extended
# --------------------------------------------------------------------------- #
def extend_moments(moments: Moments, cross: CrossMoments) -> Moments:
    """Coordinate moments on a dictionary grown after ``moments`` were taken.

    ``moments`` are over the coordinates on the first points; ``cross`` (the
    ``cross`` pass) holds the co-moments with the coordinates on the points added
    since and among them, and the certificate and row sums with the grown
    dictionary. The result is what a ``moments`` pass with the whole dictionary
    gives, up to rounding.
    """
    if moments.n != cross.n:
        raise ValueError("the moments and the cross moments are not over the same rows")
    m2 = np.block([[moments.m2, cross.cross], [cross.cross.T, cross.new]])
    return dataclasses.replace(moments, mean=np.concatenate([moments.mean, cross.mean_new]),
                               m2=m2, sq=moments.sq + cross.sq_new, sums=cross.sums,
                               certificate=cross.certificate)


#: Largest ``eps * cond_1(L)^2`` for which the kernel-space extension is used: its
#: rounding grows with the square of the factor's condition number (the solved
#: extension's with the condition number), so below this its relative error in the
#: moments stays under about 1e-9; a smaller tol takes the solved pass
#: (docs/measurements.md, "Numerical thresholds").
KERNEL_CROSS_LIMIT = 1e-9


def kernel_cross_is_accurate(dictionary: Dictionary) -> bool:
    """Whether the grown factor is conditioned well enough for the fast extension."""
    from scipy.linalg.lapack import dtrcon

    rcond, _ = dtrcon(dictionary.L, norm="1", uplo="L", diag="N")
    return bool(rcond > 0 and np.finfo(np.float64).eps / rcond**2 <= KERNEL_CROSS_LIMIT)


def extend_moments_kernel(moments: Moments, kcross: CrossMoments, dictionary: Dictionary,
                          old_size: int) -> Moments:
    """:func:`extend_moments` from the kernel-space co-moments of :func:`chunk_kernel_cross`.

    With ``L' = [[L, 0], [B, L_nn]]`` the coordinates on the new points are
    ``z_new = L_nn^-1 (k_new - B z_old)``, so, with ``C_zk = L^-1 cov(k_old, k_new)``:
    ``cov(z_old, z_new) = (C_zk - C_old B') L_nn^-T`` and
    ``cov(z_new) = L_nn^-1 (cov(k_new) - B C_zk - C_zk' B' + B C_old B') L_nn^-T``.
    The certificate and the residual sum stay those of the old dictionary: upper
    bounds, since adding points only shrinks a residual.
    """
    from scipy.linalg import solve_triangular

    if moments.n != kcross.n:
        raise ValueError("the moments and the cross moments are not over the same rows")
    L = dictionary.L
    L_old, B, L_nn = L[:old_size, :old_size], L[old_size:, :old_size], L[old_size:, old_size:]
    C_old = moments.m2
    C_zk = solve_triangular(L_old, kcross.cross, lower=True, check_finite=False)
    cross = solve_triangular(L_nn, (C_zk - C_old @ B.T).T, lower=True, check_finite=False).T
    BC = B @ C_zk
    inner = kcross.new - BC - BC.T + B @ C_old @ B.T
    A = solve_triangular(L_nn, inner, lower=True, check_finite=False)
    new = solve_triangular(L_nn, A.T, lower=True, check_finite=False)
    new = 0.5 * (new + new.T)
    zbar_old = moments.mean
    mean_new = solve_triangular(L_nn, kcross.mean_new - B @ zbar_old, lower=True,
                                check_finite=False)
    m2 = np.block([[C_old, cross], [cross.T, new]])
    return dataclasses.replace(moments, mean=np.concatenate([zbar_old, mean_new]), m2=m2,
                               sq=moments.sq + float(np.trace(new)))


def check_degrees(stats: Degrees, negative_values: str | None = None) -> None:
    """Raise if an approximate degree is not positive (divisive normalization).

    ``negative_values``: why the kernel itself can be negative (``FitConfig.negative_values``);
    then the exact degrees can be negative too, and a lower tol would not help.
    """
    if stats.min_degree <= 0 and negative_values is not None:
        raise DictionaryError(
            f"the approximate degree of row {stats.argmin} is {stats.min_degree:.3g} "
            f"(not positive), so D^-1/2 K D^-1/2 is undefined: {negative_values}, so a "
            "row's degree (the sum of its kernel row) can be negative whatever tol. The "
            "divisive normalization needs a kernel with values >= 0 on the data: use "
            "kernel='rbf' or 'laplacian', or normalization='additive' (kernel PCA)"
        )
    if stats.min_degree <= 0:
        raise DictionaryError(
            f"the approximate degree of row {stats.argmin} is {stats.min_degree:.3g} "
            "(not positive), so D^-1/2 K D^-1/2 is undefined; a loose tol makes the "
            "approximate Gram matrix lose positivity: lower tol (e.g. by 10x), or use "
            "degree_estimate='subset'"
        )
