"""Pass 1: the greedy dictionary scan (Algorithms 1 and 2 of the main paper).

The scan visits the rows in the seeded order of
:class:`~ooc_spectral.planning.VisitOrder` and adds a row to the dictionary
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

**Local certificates** (:mod:`ooc_spectral.local_certificate`) bound a row's residual
from a few nearby dictionary points; :func:`scan_rows` drops the rows whose bound is
below tol before the full solve: the same dictionary, less work.

The result of the pass is a frozen :class:`~ooc_spectral.model.Dictionary`, whose
:meth:`~ooc_spectral.model.Dictionary.project` gives the coordinates ``y_t = z_t + (alpha_t/beta) w``
used by passes 2 and 3 (``A M A' = Y Y'`` exactly).
"""

from __future__ import annotations

import bisect
import math
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.linalg import solve_triangular

from ._blas import one_blas_thread, solve_lower_transposed
from .exceptions import DictionaryError, DictionarySizeError, raise_if_interrupted
from .kernels import Kernel, RBFKernel, LaplacianKernel, SubsetNormalizedKernel, PolynomialKernel
# still importable from here, where they lived before they had their own module
from .local_certificate import (CERTIFY_THREADS, LOCAL_GROWTH, LOCAL_MIN_SIZE,  # noqa: F401
                                LOCAL_SIZE, LocalCertificate, certify_rows,
                                local_certificate_size, scan_pool, uncertified_rows)
# the frozen result of the pass lives with the fitted model; importable from here too
from .model import PIVOT_FLOOR, Dictionary  # noqa: F401
from .planning import (SCAN_ONE_BLAS_THREAD_BELOW, SCAN_PANEL_POINTS, SCAN_PANEL_ROWS,
                       SCAN_READ_CACHE_BYTES, SCAN_SPLIT_ROWS, VisitOrder, chunks_of_rows,
                       scan_block_rows)
from .source import check_finite

__all__ = [
    "PIVOT_FLOOR",
    "Dictionary",
    "DictionaryState",
    "ScanProgress",
    "scan_block",
    "scan_source",
    "scan_rows",
    "pointwise_scan",
    "search_dictionary",
]

# --------------------------------------------------------------------------- #
# The mutable state of the scan
# --------------------------------------------------------------------------- #
class DictionaryState:
    """The growing dictionary: points, row numbers, Cholesky factor, ``w`` and ``beta``.

    Storage grows by doubling; views ``[:size]`` are the live part.
    """

    def __init__(self, kernel: Kernel, n_features: int, affine: bool, capacity: int = 64):
        self.kernel = kernel
        self.affine = bool(affine)
        self.n_features = int(n_features)
        self.size = 0
        self.beta = 0.0
        self._points = np.empty((capacity, n_features))
        self._indices = np.empty(capacity, dtype=np.int64)
        self._L = np.zeros((capacity, capacity))
        self._w = np.empty(capacity)
        self._aux: np.ndarray | None = None
        self._local: LocalCertificate | None = None

    # -- views ------------------------------------------------------------ #
    @property
    def points(self) -> np.ndarray:
        return self._points[: self.size]

    @property
    def indices(self) -> np.ndarray:
        return self._indices[: self.size]

    @property
    def L(self) -> np.ndarray:
        return self._L[: self.size, : self.size]

    @property
    def w(self) -> np.ndarray:
        return self._w[: self.size]

    @property
    def aux(self) -> np.ndarray | None:
        return None if self._aux is None else self._aux[: self.size]

    def local_certificate(self) -> LocalCertificate | None:
        """The :class:`LocalCertificate` for the current size (built when the size
        crosses a point of :func:`local_certificate_size`'s grid), or None."""
        g = local_certificate_size(self.size)
        if g == 0:
            return None
        if self._local is None or self._local.size != g:
            self._local = LocalCertificate.build(self.kernel, self._points[:g], None if self._aux is None
                                                 else self._aux[:g], self.affine)
        return self._local

    # -- growth ----------------------------------------------------------- #
    def _reserve(self, needed: int) -> None:
        cap = self._points.shape[0]
        if needed <= cap:
            return
        new = max(needed, 2 * cap)
        m = self.size
        pts = np.empty((new, self.n_features))
        pts[:m] = self._points[:m]
        idx = np.empty(new, dtype=np.int64)
        idx[:m] = self._indices[:m]
        L = np.zeros((new, new))
        L[:m, :m] = self._L[:m, :m]
        w = np.empty(new)
        w[:m] = self._w[:m]
        self._points, self._indices, self._L, self._w = pts, idx, L, w
        if self._aux is not None:
            aux = np.empty((new,) + self._aux.shape[1:])
            aux[:m] = self._aux[:m]
            self._aux = aux

    def append(self, x, row: int, x_aux, z: np.ndarray, dhat: float, alpha: float) -> float:
        """Add one point; ``z`` are its coordinates against the current dictionary.

        Returns the entry appended to ``w`` (``alpha / sqrt(dhat)``).
        """
        m = self.size
        self._reserve(m + 1)
        pivot = math.sqrt(dhat)
        self._L[m, :m] = z
        self._L[m, m] = pivot
        w_new = alpha / pivot
        self._w[m] = w_new
        self.beta += w_new * w_new
        self._points[m] = x
        self._indices[m] = row
        if x_aux is not None:
            if self._aux is None:
                self._aux = np.empty((self._points.shape[0],) + np.shape(x_aux))
            self._aux[m] = x_aux
        self.size = m + 1
        return w_new

    def copy(self) -> "DictionaryState":
        new = DictionaryState(self.kernel, self.n_features, self.affine, capacity=max(self.size, 64))
        new._reserve(self.size)
        m = self.size
        new._points[:m] = self.points
        new._indices[:m] = self.indices
        new._L[:m, :m] = self.L
        new._w[:m] = self.w
        if self._aux is not None:
            new._aux = np.empty((new._points.shape[0],) + self._aux.shape[1:])
            new._aux[:m] = self._aux[:m]
        new.beta = self.beta
        new.size = m
        new._local = self._local  # immutable, and built from points the copy shares
        return new

    def freeze(self, solver: str = "trsm") -> Dictionary:
        """The finished dictionary as an immutable :class:`Dictionary`."""
        aux = None if self._aux is None else self.aux.copy()
        return Dictionary(
            kernel=self.kernel,
            points=self.points.copy(),
            indices=self.indices.copy(),
            aux=aux,
            L=np.tril(self.L).copy(),
            w=self.w.copy(),
            beta=float(self.beta),
            affine=self.affine,
            solver=solver,
        )

    @classmethod
    def from_arrays(cls, kernel: Kernel, affine: bool, points, indices, L, w) -> "DictionaryState":
        """Rebuild a state (for a checkpoint resume). ``beta`` is ``w . w``."""
        points = np.asarray(points, dtype=np.float64)
        m, d = points.shape
        st = cls(kernel, d, affine, capacity=max(64, m))
        st._points[:m] = points
        st._indices[:m] = np.asarray(indices, dtype=np.int64)
        st._L[:m, :m] = np.asarray(L, dtype=np.float64)
        st._w[:m] = np.asarray(w, dtype=np.float64)
        # beta accumulated in the same order as during the scan, so it is bit-identical
        beta = 0.0
        for v in st._w[:m]:
            beta += float(v) * float(v)
        st.beta = beta
        if m and kernel.has_aux:
            aux = kernel.aux(points)
            st._aux = np.empty((st._points.shape[0],) + aux.shape[1:])
            st._aux[:m] = aux
        st.size = m
        return st


# --------------------------------------------------------------------------- #
# The blocked scan of one block
# --------------------------------------------------------------------------- #
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
    of at least :data:`~ooc_spectral.planning.SCAN_SPLIT_ROWS` rows is cut in one
    part per thread while BLAS runs on one thread (a dictionary below
    :data:`~ooc_spectral.planning.SCAN_ONE_BLAS_THREAD_BELOW` points, see
    :func:`_scan_blas_threads`): the kernel products, exponentials and the
    GIL-free triangular solve (:func:`~ooc_spectral._blas.solve_lower_transposed`)
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
               limit: int | None = None) -> bool:
    """Scan one block of rows in order, adding those with ``delta > tol``.

    The block's coordinates against the dictionary are one triangular solve
    (BLAS-3); each point added within the block updates the block's later rows
    (matrix-vector). Once :data:`~ooc_spectral.planning.SCAN_PANEL_POINTS` points
    have entered, the rest of the block goes in panels of
    :data:`~ooc_spectral.planning.SCAN_PANEL_ROWS` rows, each starting from one
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
                                    None if panels else SCAN_PANEL_POINTS)
        if stopped:
            return True
        panels = panels or a + done < b  # it stopped at SCAN_PANEL_POINTS points
        a += done
    return False


def _scan_panel(state: DictionaryState, X: np.ndarray, rows: np.ndarray, tol: float,
                limit: int | None, max_added: int | None) -> tuple[bool, int]:
    """Scan ``X`` in order until its end or until ``max_added`` points entered.

    Returns ``(stopped at limit, rows scanned)``. Without ``max_added`` (a panel of
    at most ``SCAN_PANEL_ROWS`` rows), the new points' kernel columns come from the
    panel's Gram matrix.
    """
    kernel = state.kernel
    c = X.shape[0]
    if c == 0:
        return False, 0
    x_aux = kernel.aux(X)
    kx = kernel.diag(X, x_aux)
    floor = PIVOT_FLOOR * np.maximum(np.abs(kx), np.finfo(np.float64).tiny)
    m0 = state.size
    # Coordinates against the dictionary at the start of the block (the solve's own
    # output, c x m0, no copy) and against the points added within the block (Zn).
    if m0:
        Z0, dhat, alpha = block_coordinates(state, X, x_aux, kx)
    else:
        Z0 = np.empty((c, 0))
        dhat = kx.copy()
        alpha = np.ones(c)
    Zn = np.empty((c, min(c, 32)))
    G = None

    pos = 0
    while pos < c:
        delta = _residuals(state, dhat[pos:], alpha[pos:])
        hits = np.flatnonzero((delta > tol) & (dhat[pos:] > floor[pos:]))
        if hits.size == 0:
            break
        i = pos + int(hits[0])
        if limit is not None and state.size >= limit:
            return True, i
        m = state.size
        j = m - m0  # points added in this block so far
        zi = np.concatenate([Z0[i], Zn[i, :j]])
        w_new = state.append(X[i], int(rows[i]), None if x_aux is None else x_aux[i],
                             zi, float(dhat[i]), float(alpha[i]))
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
        pos = i + 1
        if max_added is not None and j + 1 >= max_added:
            return False, pos
    return False, c


# --------------------------------------------------------------------------- #
# Driving the scan over a data source
# --------------------------------------------------------------------------- #
@dataclass
class ScanProgress:
    """What the scan reports after each window (for progress bars and checkpoints)."""

    windows_done: int
    n_windows: int
    rows_done: int
    n_rows: int
    dictionary_size: int
    elapsed: float

    @property
    def rows_per_second(self) -> float:
        return self.rows_done / self.elapsed if self.elapsed > 0 else float("nan")


def size_hint(kernel: Kernel, tol: float) -> str:
    """What to change when a dictionary outgrows ``max_dictionary_size`` (for the message)."""
    base = kernel.base if isinstance(kernel, SubsetNormalizedKernel) else kernel
    hint = f"increase tol (try tol={max(tol, 1e-12) * 10:.3g})"
    if isinstance(base, (RBFKernel, LaplacianKernel, PolynomialKernel)):
        hint += f", or use a smoother kernel with a smaller gamma (try gamma={base.gamma / 2:.3g})"
    return hint


def _size_error(state: DictionaryState, limit: int, rows_done: int, n_rows: int, tol: float) -> DictionarySizeError:
    return DictionarySizeError(
        f"the dictionary grew past max_dictionary_size={limit} after scanning {rows_done} of "
        f"{n_rows} rows with tol={tol:.3g}; {size_hint(state.kernel, tol)}, or raise "
        "max_dictionary_size"
    )


def _scan_blas_threads(size: int):
    """One BLAS thread while the dictionary is below :data:`~ooc_spectral.planning.
    SCAN_ONE_BLAS_THREAD_BELOW` points, every thread from there on."""
    if size < SCAN_ONE_BLAS_THREAD_BELOW:
        return one_blas_thread()
    return nullcontext()


def scan_rows(state: DictionaryState, X: np.ndarray, rows: np.ndarray, tol: float, *,
              limit: int | None = None, block_rows: int | None = None) -> bool:
    """Blocked scan of in-memory rows (already in visiting order).

    Once the dictionary has a :class:`LocalCertificate`, each block of rows is
    first bounded, and only the rows the bound cannot rule out are scanned (by
    :func:`scan_block`, in their order). Certifying against the dictionary as it
    was before the block's additions is valid: adding points only lowers a
    residual. The uncertified rows of consecutive blocks are gathered so that one
    full solve handles many of them (the m x m factor is read once per solve).
    Each block runs BLAS on one thread while the dictionary is small
    (:func:`_scan_blas_threads`); the selection does not depend on it.

    Returns True if it stopped at ``limit`` (see :func:`scan_block`).
    """
    n = X.shape[0]
    a = 0
    while a < n:
        with _scan_blas_threads(state.size):
            stopped, a = _scan_next(state, X, rows, tol, a, limit, block_rows)
        if stopped:
            return True
    return False


def _scan_next(state: DictionaryState, X: np.ndarray, rows: np.ndarray, tol: float, a: int,
               limit: int | None, block_rows: int | None) -> tuple[bool, int]:
    """One block of :func:`scan_rows` from row ``a``: ``(stopped at limit, next row)``."""
    n = X.shape[0]
    size = block_rows or scan_block_rows(state.size)
    keep = uncertified_rows(state, X[a : a + size], tol)
    if keep is None:  # no certificate yet: scan the block as it is
        b = min(a + size, n)
        return scan_block(state, X[a:b], rows[a:b], tol, limit), b
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
    return bool(idx.size) and scan_block(state, X[idx], rows[idx], tol, limit), b


class WindowReader:
    """The scan's windows, read so that storage chunks shared by windows are decoded once.

    A window of the visiting order (:data:`~ooc_spectral.planning.VISIT_WINDOW_ROWS`
    rows) is often part of a larger storage chunk (zarr chunks of 131,072 or
    262,144 rows), and the windows are visited in a seeded random order: reading
    each window from the store decoded its whole chunk once per window (the 10^6
    x 64 image patches in 131,072-row chunks: 0.96 s of reads for a 1.6 s scan).
    The visiting order is known in advance
    (:meth:`~ooc_spectral.planning.VisitOrder.chunk_visits`), so a decoded chunk
    is kept while a later window needs it, within
    :data:`~ooc_spectral.planning.SCAN_READ_CACHE_BYTES`; when the budget is
    full, the chunk needed farthest ahead is the one not kept (Belady's rule).
    The rows and their order are those of ``source.read_rows``: only how often a
    chunk is decoded changes. Used by one thread at a time.
    """

    def __init__(self, source, order: VisitOrder, start_window: int = 0,
                 budget: int = SCAN_READ_CACHE_BYTES):
        self.source, self.order, self.budget = source, order, int(budget)
        self.windows = order.windows
        self.starts = np.asarray(source.chunk_starts, dtype=np.int64)
        self.keeps = source.kind != "numpy"  # reading numpy rows decodes nothing
        self.visits = order.chunk_visits(self.starts, start_window) if self.keeps else {}
        self.chunks: dict[int, np.ndarray] = {}
        self.decoded = 0  # chunks read from the source (for tests and benchmarks)

    def _next_visit(self, j: int, k: int) -> float:
        """The first position from ``k`` on whose window needs chunk ``j`` (inf: none)."""
        v = self.visits.get(j, [])
        i = bisect.bisect_left(v, k)
        return v[i] if i < len(v) else math.inf

    def _chunk(self, j: int, k: int) -> np.ndarray:
        """Storage chunk ``j`` for the window at position ``k``, kept if a later one needs it."""
        chunk = self.chunks.pop(j, None)
        if chunk is None:
            chunk = self.source.read_raw(int(self.starts[j]), int(self.starts[j + 1]))
            self.decoded += 1
        kept = {i: self._next_visit(i, k) for i in self.chunks}  # maybe this window's next
        kept[j] = self._next_visit(j, k + 1)
        while kept and (sum(self.chunks[i].nbytes for i in kept if i != j)
                        + (chunk.nbytes if j in kept else 0)) > self.budget:
            del kept[max(kept, key=kept.get)]  # needed farthest ahead (or never)
        self.chunks = {i: self.chunks[i] for i in kept if i != j and kept[i] < math.inf}
        if j in kept and kept[j] < math.inf:
            self.chunks[j] = chunk
        return chunk

    def read(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The window at position ``k`` of the visiting order: its rows in visiting
        order as float64 (checked finite) and their row numbers."""
        w = self.windows[k]
        a, b = self.order.window_bounds(w)
        if not self.keeps:
            raw = self.source.read_raw(a, b)
        else:
            parts = []
            for j in chunks_of_rows(self.starts, a, b):
                c0 = int(self.starts[j])
                parts.append(self._chunk(j, k)[max(a, c0) - c0: min(b, int(self.starts[j + 1])) - c0])
            raw = parts[0] if len(parts) == 1 else np.concatenate(parts)
        check_finite(raw, a, self.source)
        perm = self.order.rows_in_window(w)
        return np.ascontiguousarray(raw[perm], dtype=np.float64), a + perm


def scan_source(
    source,
    order: VisitOrder,
    state: DictionaryState,
    *,
    tol: float,
    max_size: int,
    start_window: int = 0,
    block_rows: int | None = None,
    on_window: Callable[[DictionaryState, ScanProgress], None] | None = None,
    patience: int | None = None,
) -> int:
    """Algorithm 1, steps 1-16, over a :class:`~ooc_spectral.source.DataSource`.

    Reads the windows of ``order`` from ``start_window`` on (the next window is
    read in a background thread while the current one is scanned), permutes each
    window's rows, and scans them in blocks. ``on_window`` is called after each
    window with the state and a :class:`ScanProgress` (checkpoints hook in there).

    With ``patience=k`` the scan stops early, after ``k`` consecutive windows
    that each added at most ``size // 1000`` points (the *prefix scan*; the rows
    left must then be checked by a parallel pass, see
    :func:`~ooc_spectral.pipeline.FitRun.build_dictionary`).

    Returns
    -------
    int
        The number of windows of ``order`` scanned so far (``order.n_windows``
        unless the prefix scan stopped early).

    Raises
    ------
    DictionarySizeError
        The dictionary would grow past ``max_size``.
    NonFiniteInputError
        A row holds NaN or infinity.
    """
    windows = order.windows
    n_windows = len(windows)
    t0 = time.perf_counter()
    rows_done = int(sum(order.window_bounds(w)[1] - order.window_bounds(w)[0]
                        for w in windows[:start_window]))
    read = WindowReader(source, order, start_window).read

    stable = 0
    done = start_window
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ooc-scan-read") as pool:
        nxt = pool.submit(read, start_window) if start_window < n_windows else None
        for k in range(start_window, n_windows):
            raise_if_interrupted()
            Xw, rw = nxt.result()
            nxt = pool.submit(read, k + 1) if k + 1 < n_windows else None
            before = state.size
            if scan_rows(state, Xw, rw, tol, limit=max_size, block_rows=block_rows):
                raise _size_error(state, max_size, rows_done, order.n_rows, tol)
            rows_done += Xw.shape[0]
            done = k + 1
            if on_window is not None:
                on_window(state, ScanProgress(k + 1, n_windows, rows_done, order.n_rows,
                                              state.size, time.perf_counter() - t0))
            stable = stable + 1 if state.size - before <= state.size // 1000 else 0
            if patience is not None and stable >= patience and done < n_windows:
                if nxt is not None:
                    nxt.cancel()
                break
    return done


def pointwise_scan(kernel: Kernel, X: np.ndarray, rows: np.ndarray, tol: float, *,
                   affine: bool = True, state: DictionaryState | None = None) -> DictionaryState:
    """The plain point-by-point scan (the paper's Algorithm 1 loop, one row at a time).

    The reference the blocked scan must agree with; O(m^2) Python-level work per
    row, so for tests and benchmarks only. Continues ``state`` if given.
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
        if delta > tol and dhat > PIVOT_FLOOR * max(abs(kxx), np.finfo(np.float64).tiny):
            state.append(X[t], int(rows[t]), None if x_aux is None else x_aux[0], z, dhat, alpha)
    return state


# --------------------------------------------------------------------------- #
# Algorithm 2: a dictionary of a requested size
# --------------------------------------------------------------------------- #
def search_dictionary(kernel: Kernel, X: np.ndarray, rows: np.ndarray, size: int, *,
                      affine: bool = True, iterations: int = 40,
                      block_rows: int | None = None) -> tuple[DictionaryState, float]:
    """The paper's Algorithm 2 on in-memory rows (in visiting order).

    Searches the tolerance while keeping small dictionaries and only adding
    points: ``eps_minus`` always gives at most ``size`` points and its dictionary
    is the base of the next trial; ``eps_plus`` gives too many. The search is
    geometric once both ends are positive (the paper bisects arithmetically; on
    a tolerance spanning decades the geometric step reaches the same bracket in
    fewer trials). It ends with a scan at ``eps_plus`` stopped at ``size``
    points (step 25), so it returns exactly ``size`` points.

    Returns
    -------
    state : DictionaryState
        Exactly ``size`` points.
    tol : float
        A tolerance every row of ``X`` meets with that dictionary: the trial's
        tolerance when a trial hits ``size`` exactly, else ``eps_minus`` (the
        step-25 scan stops at ``size`` points, before the end of the rows, but
        its dictionary contains the ``eps_minus`` one).

    Raises
    ------
    DictionaryError
        The rows hold fewer than ``size`` points that are not in the span of the
        others.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    rows = np.asarray(rows)
    empty = DictionaryState(kernel, X.shape[1], affine)

    def trial(base: DictionaryState, eps: float) -> tuple[DictionaryState, bool]:
        st = base.copy()
        over = scan_rows(st, X, rows, eps, limit=size, block_rows=block_rows)
        return st, over

    diag = kernel.diag(X[: min(len(X), 4096)])
    eps_minus = 2.0 * float(np.max(np.abs(diag))) + 1.0
    eps_plus = 0.0
    # steps 4-13: find an eps_minus that gives a small enough dictionary
    while True:
        st, over = trial(empty, eps_minus)
        if not over and st.size == size:
            return st, eps_minus
        if not over:
            base = st
            break
        eps_plus, eps_minus = eps_minus, eps_minus * 10.0
    # steps 14-24: search, keeping the smaller dictionary as the base
    for _ in range(iterations):
        eps = math.sqrt(eps_plus * eps_minus) if eps_plus > 0 else eps_minus / 10.0
        st, over = trial(base, eps)
        if not over and st.size == size:
            return st, eps
        if over:
            eps_plus = eps
        else:
            eps_minus, base = eps, st
    if eps_plus == 0.0:
        raise DictionaryError(
            f"dictionary_size={size} cannot be reached: even with tol={eps_minus:.1e} only "
            f"{base.size} of the {len(X)} sampled rows are outside the span of the others; "
            f"ask for dictionary_size <= {base.size}"
        )
    # step 25: from the base, scan with eps_plus, stopping when the size is reached.
    # The base held every row within eps_minus and the result contains the base,
    # so eps_minus is the tolerance the result guarantees on these rows.
    st = base.copy()
    eps = eps_plus
    for _ in range(60):
        if scan_rows(st, X, rows, eps, limit=size, block_rows=block_rows) or st.size == size:
            return st, eps_minus
        eps /= 10.0  # the last step is not monotone in rare cases: keep adding
    raise DictionaryError(
        f"dictionary_size={size} cannot be reached: only {st.size} of the {len(X)} sampled "
        f"rows are outside the span of the others; ask for dictionary_size <= {st.size}"
    )
