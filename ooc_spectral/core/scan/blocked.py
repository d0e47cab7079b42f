"""Pass 1: the greedy dictionary scan (Algorithms 1 and 2 of the main paper).

The scan visits the rows in the seeded order of
:class:`~ooc_spectral.core.planning.VisitOrder` and adds a row to the dictionary
when its squared feature-space distance ``delta`` to the (affine) span of the
dictionary exceeds ``tol`` (the paper's epsilon, eq. 5-8).

It keeps the Cholesky factor ``M = L L'`` of the dictionary's Gram matrix and
never inverts M nor uses the paper's rank-one update of ``M^-1`` (eq. 9), which loses accuracy
as soon as a pivot is small; triangular solves against L are backward stable. With ``k_t = k(D, x_t)``:

- ``z_t = L^-1 k_t``, ``w = L^-1 1``, ``beta = w.w`` (``= 1' M^-1 1``);
- ``dhat_t = k(x_t, x_t) - z_t.z_t`` (unconstrained residual);
- ``alpha_t = 1 - w.z_t`` and ``delta_t = dhat_t + alpha_t^2 / beta``
  (the paper's eq. 8, with its affine constraint); ``delta_t = dhat_t`` when
  ``affine=False``;
- adding ``x_t`` appends ``[z_t', sqrt(dhat_t)]`` to L and
  ``alpha_t / sqrt(dhat_t)`` to w.

The **blocked** scan (:func:`scan_block`) handles a block of c rows with one
kernel block and one triangular solve (BLAS-3), then walks the block in order:
each added point costs one kernel column and one matrix-vector product over the
rest of the block (O(c m)); once many points entered a block, the rest of it goes
in panels of a few hundred rows (a blocked Cholesky). It selects exactly the dictionary of the plain
point-by-point scan (:func:`pointwise_scan`) over the same order: the two only
round differently.

A row is never added when its unconstrained residual is below
``PIVOT_FLOOR * k(x, x)``: such a row (a duplicate, for instance) is already in
the linear span, and its pivot would make L singular.

**Local certificates** (:mod:`ooc_spectral.core.scan.local_certificate`) bound a row's residual
from a few nearby dictionary points; :func:`scan_rows` drops the rows whose bound is
below tol before the full solve: the same dictionary, less work.

The result of the pass is a frozen :class:`~ooc_spectral.core.model.Dictionary`, whose
:meth:`~ooc_spectral.core.model.Dictionary.project` gives the coordinates ``y_t = z_t + (alpha_t/beta) w``
used by passes 2 and 3 (``A M A' = Y Y'`` exactly).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import solve_triangular

from ..._accel.blas import solve_lower_transposed
from ..._accel.threads import one_blas_thread
from ..kernels import Kernel, overflow_error
from ..model import PIVOT_FLOOR
from ..planning import (SCAN_ONE_BLAS_THREAD_BELOW, SCAN_PANEL_POINTS, SCAN_PANEL_ROWS, SCAN_SPLIT_ROWS,
                        scan_block_rows, small_blas)
from ..rounding import diag_error
from ...exceptions import InvalidInputError, NumericalBreakdownError
from .certify import RESOLVED, decide, entered_resolved
from .local_certificate import CERTIFY_THREADS, certify_rows, scan_pool
from .state import DictionaryState

#: Rows after an uncertified one that the walk bounds again with it, against the grown
#: dictionary, in one vectorized call: a small fit whose rows each wait for the points
#: before them (every row of its first block) then costs a few calls per point entered
#: rather than a Python-level bound per row.
REBOUND_ROWS = 64
#: ... while rows are skipped; once double-double decides them (a bound costs about a
#: millisecond a row), the window halves with each point entered (each entry leaves the
#: window's later rows to be bounded again) and doubles again with each row skipped.

__all__ = ["scan_block", "scan_rows", "block_coordinates", "uncertified_rows", "pointwise_scan"]


def _residuals(state: DictionaryState, dhat, alpha):
    if not state.affine:
        return dhat
    if state.size == 0:
        return np.full_like(dhat, np.inf)
    return dhat + alpha * alpha / state.beta


def _row_coordinates(state: DictionaryState, X: np.ndarray, x_aux, kx: np.ndarray, out=None):
    """``(Z, dhat, alpha)`` of the rows of X against the dictionary: ``Z = k(X, D) L^-T``
    (c x m), ``dhat = k(x, x) - |z|^2`` and ``alpha = 1 - z.w``; written into ``out``
    (three arrays, the first C-ordered) when given, the kernel block in place."""
    if out is None:
        out = np.empty((X.shape[0], state.size)), np.empty(X.shape[0]), np.empty(X.shape[0])
    Z, dhat, alpha = out
    state.kernel.pairwise_into(Z, X, state.points, x_aux, state.aux)
    solve_lower_transposed(state.L, Z)  # in place: a row range of a C-ordered block
    np.subtract(kx, np.einsum("ij,ij->i", Z, Z), out=dhat)
    np.subtract(1.0, Z @ state.w, out=alpha)
    return out


def block_coordinates(state: DictionaryState, X: np.ndarray, x_aux, kx: np.ndarray):
    """:func:`_row_coordinates` of a block, its rows shared between the scan's threads.

    Each row's kernel row and solve are independent of the others', so a block
    of at least :data:`~ooc_spectral.core.planning.SCAN_SPLIT_ROWS` rows is cut in one
    part per thread while BLAS runs on one thread (a dictionary below
    :data:`~ooc_spectral.core.planning.SCAN_ONE_BLAS_THREAD_BELOW` points, see
    :func:`~ooc_spectral.core.planning.small_blas`): the kernel products, exponentials and the
    GIL-free triangular solve (:func:`~ooc_spectral._accel.blas.solve_lower_transposed`)
    then run on every core, where the sequential scan otherwise leaves all but
    one idle. Above that size BLAS shares each call itself. The walk through the
    block that follows stays sequential, so the selection is the scan's.
    """
    c, threads = X.shape[0], CERTIFY_THREADS
    if threads < 2 or c < SCAN_SPLIT_ROWS or state.size >= SCAN_ONE_BLAS_THREAD_BELOW:
        return _row_coordinates(state, X, x_aux, kx)
    out = np.empty((c, state.size)), np.empty(c), np.empty(c)
    step = -(-c // threads)

    def part(a: int) -> None:
        b = a + step
        _row_coordinates(state, X[a:b], None if x_aux is None else x_aux[a:b], kx[a:b],
                         tuple(o[a:b] for o in out))

    list(scan_pool().map(part, range(0, c, step)))
    return out


def scan_block(state: DictionaryState, X: np.ndarray, rows: np.ndarray, tol: float,
               limit: int | None = None, certify: bool = True) -> bool:
    """Scan one block of rows in order, adding those with ``delta > tol``.

    The block's coordinates against the dictionary are one triangular solve
    (BLAS-3); each point added within the block updates the block's later rows
    (matrix-vector). Once :data:`~ooc_spectral.core.planning.SCAN_PANEL_POINTS` points
    have entered, the rest of the block goes in panels of
    :data:`~ooc_spectral.core.planning.SCAN_PANEL_ROWS` rows, each starting from one
    solve against the whole dictionary and updated from the panel's own Gram
    matrix: a block where most rows enter (the dictionary heading for the exact
    path) then costs a blocked Cholesky, not one matrix-vector product over the
    whole block per added point, and a block where few enter costs what it did.

    Parameters
    ----------
    state : DictionaryState
        Updated in place.
    X : ndarray of shape (c, d), float64
        The rows, in visiting order.
    rows : ndarray of shape (c,)
        Their row numbers in the data set.
    tol : float
        The paper's epsilon.
    limit : int, optional
        Largest dictionary size allowed. When a row qualifies while the
        dictionary is already this large, the scan stops and returns True.

    Returns
    -------
    bool
        True if the scan stopped at ``limit``.
    """
    c, a, panels = X.shape[0], 0, False
    while a < c:
        b = min(a + SCAN_PANEL_ROWS, c) if panels else c
        stopped, done = _scan_panel(state, X[a:b], rows[a:b], tol, limit,
                                    None if panels else SCAN_PANEL_POINTS, certify)
        if stopped:
            return True
        panels = panels or a + done < b  # it stopped at SCAN_PANEL_POINTS points
        a += done
    return False


def _scan_panel(state: DictionaryState, X: np.ndarray, rows: np.ndarray, tol: float,
                limit: int | None, max_added: int | None, certify: bool = True) -> tuple[bool, int]:
    """Scan ``X`` in order until its end or until ``max_added`` points entered.

    Returns ``(stopped at limit, rows scanned)``. Without ``max_added`` (a panel of
    at most ``SCAN_PANEL_ROWS`` rows), the new points' kernel columns come from the
    panel's Gram matrix.

    A row is skipped when it is certified within tol: its ``delta`` at most tol and
    its computed residual plus the rounding bound
    (:meth:`~ooc_spectral.core.scan.certify.ScanRounding.residual_bounds`) too, or,
    numerically in the span (below the pivot floor), the latter alone. A row certified
    against the dictionary at the start of the block stays certified (adding points only
    lowers a residual); one that is not is bounded again against the grown dictionary
    when the walk reaches it. A row not certified enters, if its rounding is resolved
    (:data:`~ooc_spectral.core.scan.certify.RESOLVED`); otherwise the scan stops with
    :class:`~ooc_spectral.exceptions.NumericalBreakdownError`. With ``certify=False``
    (a selection that promises no tol: the random dictionary, Algorithm 2's last step)
    a row enters on its computed ``delta`` alone.
    """
    kernel = state.kernel
    c = X.shape[0]
    if c == 0:
        return False, 0
    x_aux = kernel.aux(X)
    kx = kernel.diag(X, x_aux)
    floor = PIVOT_FLOOR * np.maximum(np.abs(kx), np.finfo(np.float64).tiny)
    m0 = state.size
    rnd = state.rounding
    # Coordinates against the dictionary at the start of the block (the solve's own
    # output, c x m0, no copy) and against the points added within the block (Zn).
    # E: the rounding of each row's residual; upper: an upper bound of its exact residual,
    # valid as the dictionary grows (dhat + E, or a sharper one: explicit features)
    if m0:
        Z0, dhat, alpha = block_coordinates(state, X, x_aux, kx)
        E, upper, lower = (rnd.residual_bounds(state.L, Z0, dhat, _residuals(state, dhat, alpha),
                                               X, x_aux, kx, tol, state.points)
                           if certify else (np.zeros(c), np.full(c, np.inf), np.zeros(c)))
    else:
        Z0 = np.empty((c, 0))
        dhat = kx.copy()
        alpha = np.ones(c)
        E = np.broadcast_to(diag_error(kernel, X, x_aux, kx), (c,)).astype(np.float64)
        upper = dhat + E if certify else np.full(c, np.inf)
        lower = dhat - E
    certified = (upper <= tol) if certify else np.ones(c, dtype=bool)
    bounded = np.full(c, m0)  # the dictionary size each row's E was computed against
    Zn = np.empty((c, min(c, 32)))
    G = None
    reach = REBOUND_ROWS

    pos = 0
    while pos < c:
        delta = _residuals(state, dhat[pos:], alpha[pos:])
        # in the span: certified (explicit features: below dhat), or computed there and not
        # known above it (double-double)
        inspan = (upper[pos:] <= floor[pos:]) | ((dhat[pos:] <= floor[pos:])
                                                  & (lower[pos:] <= floor[pos:]))
        hits = np.flatnonzero(((delta > tol) & ~inspan) | ~certified[pos:])
        if hits.size == 0:
            break
        i = pos + int(hits[0])
        m = state.size
        j = m - m0  # points added in this block so far
        zi = np.concatenate([Z0[i], Zn[i, :j]])
        d_i = float(delta[i - pos])
        # a row computed in the span, known above it only against a smaller dictionary, is
        # bounded again too before it may enter
        stale = dhat[i] <= floor[i] and bounded[i] != m
        if stale and not state.keeps_rounding:  # no bounds to tell: computed in the span
            pos = i + 1
            continue
        if not certified[i] or stale:
            if bounded[i] != m:  # bound it again against the grown dictionary, with the
                # uncertified rows after it (one vectorized call, not one per row)
                w = i + np.flatnonzero(~certified[i:i + reach])
                if not w.size or w[0] != i:  # row i itself: certified, but stale
                    w = np.r_[i, w]
                Zw = np.concatenate([Z0[w], Zn[w, :j]], axis=1)
                E[w], up, lower[w] = rnd.residual_bounds(
                    state.L, Zw, dhat[w], None, X[w], None if x_aux is None else x_aux[w], kx[w],
                    tol, state.points)
                bounded[w] = m
                upper[w] = np.minimum(upper[w], up)
                certified[w] = upper[w] <= tol
            E_i = float(E[i])
            if not decide(d_i, float(dhat[i]), float(floor[i]), E_i, tol, int(rows[i]),
                          float(upper[i]), float(lower[i])):
                pos = i + 1
                reach = min(2 * reach, REBOUND_ROWS)
                continue
        if limit is not None and state.size >= limit:
            return True, i
        if certify and rnd.can_extend() and m and E[i] > 0.01 * RESOLVED * max(dhat[i], tol):
            # float64 may not resolve its pivot: its row of the factor from double-double
            zi, dhat[i] = rnd.extended_coordinates(state.points, X[i])
            alpha[i] = 1.0 - float(zi @ state.w)
        elif certify and m and dhat[i] <= floor[i] < lower[i]:
            # explicit features know its residual where float64 does not: the pivot from them
            dhat[i] = 0.5 * (float(upper[i]) + float(lower[i]))
        if rnd.extended is not None:
            reach = max(reach // 2, 1)
        w_new = state.append(X[i], int(rows[i]), None if x_aux is None else x_aux[i],
                             zi, float(dhat[i]), float(alpha[i]))
        if certify:  # its delta from below: its bounds against the dictionary it entered
            low = float(lower[i]) + d_i - float(dhat[i]) if bounded[i] == m else None
            _entered(state, d_i, float(dhat[i]), zi, X[i], int(rows[i]), tol, low)
        pivot = state.L[m, m]
        if i + 1 < c:
            rest = slice(i + 1, c)
            if j + 1 > Zn.shape[1]:  # grow the new coordinates by doubling
                Zn2 = np.empty((c, 2 * Zn.shape[1]))
                Zn2[:, :j] = Zn[:, :j]
                Zn = Zn2
            if max_added is None:
                if G is None:  # the panel's Gram matrix, once a point enters
                    G = kernel.pairwise(X, X, x_aux, x_aux)
                kcol = G[rest, i].copy()
            else:
                kcol = kernel.pairwise(
                    X[rest], X[i : i + 1],
                    None if x_aux is None else x_aux[rest],
                    None if x_aux is None else x_aux[i : i + 1],
                )[:, 0]
            if m0:
                kcol -= Z0[rest] @ zi[:m0]
            if j:
                kcol -= Zn[rest, :j] @ zi[m0:]
            kcol /= pivot
            Zn[rest, j] = kcol
            dhat[rest] -= kcol * kcol
            alpha[rest] -= w_new * kcol
        dhat[i] = 0.0
        certified[i] = True
        pos = i + 1
        if max_added is not None and j + 1 >= max_added:
            return False, pos
    return False, c


def scan_rows(state: DictionaryState, X: np.ndarray, rows: np.ndarray, tol: float, *,
              limit: int | None = None, block_rows: int | None = None,
              certify: bool = True) -> bool:
    """Blocked scan of in-memory rows (already in visiting order).

    Once the dictionary has a :class:`LocalCertificate`, each block of rows is
    first bounded, and only the rows the bound cannot rule out are scanned (by
    :func:`scan_block`, in their order). Certifying against the dictionary as it
    was before the block's additions is valid: adding points only lowers a
    residual. The uncertified rows of consecutive blocks are gathered so that one
    full solve handles many of them (the m x m factor is read once per solve).
    Each block runs BLAS on one thread while the dictionary is small
    (:func:`~ooc_spectral.core.planning.small_blas` below :data:`~ooc_spectral.core.planning.
    SCAN_ONE_BLAS_THREAD_BELOW`); the selection does not depend on it.

    Returns True if it stopped at ``limit`` (see :func:`scan_block`).
    """
    n = X.shape[0]
    a = 0
    if state.rounding.extended is not None:  # rows kept between bounds: this part's only
        state.rounding.extended.forget_rows()
    while a < n:
        try:
            with small_blas(state.size, SCAN_ONE_BLAS_THREAD_BELOW):
                stopped, a = _scan_next(state, X, rows, tol, a, limit, block_rows, certify)
        except InvalidInputError as exc:  # a row past float64: named by its number
            named = overflow_error(X, rows)
            if named is None:
                raise
            raise named from exc
        if stopped:
            return True
    return False


def _scan_next(state: DictionaryState, X: np.ndarray, rows: np.ndarray, tol: float, a: int,
               limit: int | None, block_rows: int | None, certify: bool = True) -> tuple[bool, int]:
    """One block of :func:`scan_rows` from row ``a``: ``(stopped at limit, next row)``."""
    n = X.shape[0]
    size = block_rows or scan_block_rows(state.size)
    keep = uncertified_rows(state, X[a : a + size], tol) if certify else None
    if keep is None:  # no certificate yet: scan the block as it is
        b = min(a + size, n)
        return scan_block(state, X[a:b], rows[a:b], tol, limit, certify), b
    pending, b = [a + keep], min(a + size, n)
    # gather uncertified rows over further rows while they are few; never more
    # than one block of them (the full scan's c x m coordinates stay in budget)
    held = keep.size
    while b < n and held < size // 8:
        e = min(b + size - held, n)
        keep = uncertified_rows(state, X[b:e], tol)
        pending.append(b + keep)
        held += keep.size
        b = e
    idx = np.concatenate(pending)
    return bool(idx.size) and scan_block(state, X[idx], rows[idx], tol, limit, certify), b


def uncertified_rows(state: DictionaryState, X: np.ndarray, tol: float) -> np.ndarray | None:
    """Positions of the rows of X that the local certificate cannot rule out.

    None when the dictionary is too small for a certificate (every row must be
    scanned). The rows are bounded :func:`certify_rows` at a time, the blocks
    shared between :data:`CERTIFY_THREADS` threads (NumPy releases the GIL; each
    thread's BLAS runs single-threaded meanwhile).
    """
    cert = state.local_certificate()
    if cert is None:
        return None
    c = X.shape[0]
    if c == 0:
        return np.empty(0, dtype=np.int64)
    parts = -(-c // certify_rows(cert.size))
    parts = -(-parts // CERTIFY_THREADS) * CERTIFY_THREADS  # the threads get equal shares
    step = max(1, -(-c // parts))

    def part(a: int) -> np.ndarray:
        return a + np.flatnonzero(~cert.certified(X[a : a + step], tol))

    starts = range(0, c, step)
    if len(starts) < 2 or CERTIFY_THREADS < 2:
        keep = [part(a) for a in starts]
    else:
        with one_blas_thread():
            keep = list(scan_pool().map(part, starts))
    return np.concatenate(keep) if keep else np.empty(0, dtype=np.int64)


def pointwise_scan(kernel: Kernel, X: np.ndarray, rows: np.ndarray, tol: float, *,
                   affine: bool = True, state: DictionaryState | None = None) -> DictionaryState:
    """The plain point-by-point scan (the paper's Algorithm 1 loop, one row at a time).

    The reference the blocked scan must agree with, the same membership test
    (:func:`_scan_panel`) row by row; O(m^2) Python-level work per row, so for tests
    and benchmarks only. Continues ``state`` if given.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    if state is None:
        state = DictionaryState(kernel, X.shape[1], affine)
    affine = state.affine
    for t in range(X.shape[0]):
        x = X[t : t + 1]
        x_aux = kernel.aux(x)
        kxx = float(kernel.diag(x, x_aux)[0])
        m = state.size
        if m:
            k = kernel.pairwise(x, state.points, x_aux, state.aux)[0]
            z = solve_triangular(state.L, k, lower=True, check_finite=False)
            dhat = kxx - float(z @ z)
            alpha = 1.0 - float(state.w @ z)
            delta = dhat + alpha * alpha / state.beta if affine else dhat
        else:
            z = np.empty(0)
            dhat, alpha = kxx, 1.0
            delta = np.inf if affine else dhat
        floor = PIVOT_FLOOR * max(abs(kxx), np.finfo(np.float64).tiny)
        E, upper, lower = state.rounding.row_bound(state.L, z, X[t], x_aux, kxx, state.points,
                                                   tol)
        if not decide(delta, dhat, floor, E, tol, int(rows[t]), upper, lower):
            continue
        state.append(X[t], int(rows[t]), None if x_aux is None else x_aux[0], z, dhat, alpha)
        _entered(state, delta, dhat, z, X[t], int(rows[t]), tol, lower + delta - dhat)
    return state


def _entered(state: DictionaryState, delta: float, dhat: float, z: np.ndarray, x: np.ndarray,
             row: int, tol: float, lower: float | None) -> None:
    """:func:`~ooc_spectral.core.scan.certify.entered_resolved` for the point just appended
    (``z`` its coordinates against the dictionary before it, ``lower`` its ``delta`` from
    below where known); where float64 leaves it unresolved, its double-double bounds
    (:mod:`~ooc_spectral.core.extended`) decide, if the fit allows them."""
    try:
        entered_resolved(delta, state.last_rounding, tol, row, lower)
    except NumericalBreakdownError:
        rnd, m = state.rounding, state.size - 1
        if not (rnd.can_extend() and m):
            raise
        low = rnd.extended_bounds(state.L[:m, :m], state.points[:m], x[None, :], z[None, :m])[1]
        entered_resolved(delta, state.last_rounding, tol, row, float(low[0]) + delta - dhat)
