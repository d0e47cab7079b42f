"""The scan's growing dictionary: points, row numbers, Cholesky factor, ``w`` and ``beta``.

:class:`DictionaryState` is what pass 1 grows in place (the greedy scan of
:mod:`ooc_spectral.core.scan.blocked`, Algorithm 2, RP-Cholesky) and what a
checkpoint saves; adding a point appends the row ``[z_t', sqrt(dhat_t)]`` to the
factor L of ``M = L L'`` and ``alpha_t / sqrt(dhat_t)`` to ``w``. Its frozen form
is :class:`~ooc_spectral.core.model.Dictionary`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...exceptions import DictionarySizeError
from ..kernels import Kernel, LaplacianKernel, PolynomialKernel, RBFKernel, SubsetNormalizedKernel
from ..model import Dictionary
from ..explicit_features import explicit_factor, explicit_features
from ..extended import ExtendedGram
from .certify import ScanRounding
from .local_certificate import LocalCertificate, local_certificate_size

__all__ = ["DictionaryState", "ScanProgress", "size_hint", "REFINE_THETA", "REFINE_MAX_POINTS"]

#: A float64 factor whose measured backward error exceeds this (of the unit diagonal of
#: the kernels decided in double-double) is replaced by the double-double one, rounded
#: (:meth:`DictionaryState.refine_factor`); a scan whose pivots float64 resolved stays
#: far below (about 1e-15).
REFINE_THETA = 1e-12
#: ... on dictionaries of at most this many points.
REFINE_MAX_POINTS = 3000


class DictionaryState:
    """The growing dictionary: points, row numbers, Cholesky factor, ``w`` and ``beta``.

    Storage grows by doubling; views ``[:size]`` are the live part. With
    ``rounding=False`` (a scan that certifies nothing: the probe of
    :func:`~ooc_spectral.pipeline.scan.probe_exact`) the rounding bound's constants are
    not kept.
    """

    def __init__(self, kernel: Kernel, n_features: int, affine: bool, capacity: int = 64,
                 rounding: bool = True):
        self.kernel = kernel
        self.keeps_rounding = bool(rounding)
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
        #: the rounding bound's constants as the dictionary grows (the scan's membership
        #: test, :mod:`ooc_spectral.core.scan.certify`)
        self.rounding = ScanRounding(kernel)
        #: the rounding bound of the last point's own residual when it entered
        self.last_rounding = 0.0

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
        if self.keeps_rounding:
            self.last_rounding = self.rounding.appended(self.L, self._points[m], x_aux,
                                                        self.points, self.aux)
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
        new.keeps_rounding = self.keeps_rounding
        new._local = self._local  # immutable, and built from points the copy shares
        new.rounding = self.rounding.copy()
        return new

    def refine_factor(self) -> bool:
        """Where the scan may decide rows in double-double (``rounding.extended_allowed``)
        and its float64 factor's measured backward error exceeds :data:`REFINE_THETA`
        (pivots that entered with a rounding float64 did not resolve), replace L by the
        double-double factor of the same points rounded to float64
        (:class:`~ooc_spectral.core.extended.ExtendedGram`), and ``w`` and ``beta`` by
        theirs: the passes then work with a factor whose backward error is the rounding of
        its entries. A kernel with explicit features (the linear kernel, the degree-1
        polynomial kernel) always takes the factor of its features instead
        (:func:`~ooc_spectral.core.explicit_features.explicit_factor`): its pivots are
        norms, not the cancellation ``k(x, x) - |z|^2``. A function of the points alone,
        so a resumed scan gets the same factor. The double-double factor at most
        :data:`REFINE_MAX_POINTS` points (it costs ``m^3`` elementwise operations).
        Returns whether it did."""
        from scipy.linalg import solve_triangular

        rnd, m = self.rounding, self.size
        L = explicit_factor(self.kernel, self.points) if (
            m and explicit_features(self.kernel) is not None) else None
        if L is None:
            if not (rnd.can_extend() and 0 < m <= REFINE_MAX_POINTS
                    and max(rnd.theta_o, rnd.theta_n) > REFINE_THETA):
                return False
            if rnd.extended is None:
                rnd.extended = ExtendedGram(self.kernel)
            L = rnd.extended.grow(self.points).factor(m)
        w = solve_triangular(L, np.ones(m), lower=True, check_finite=False)
        self._L[:m, :m] = L
        self._w[:m] = w
        beta = 0.0
        for v in w:  # in order, as from_arrays sums it
            beta += float(v) * float(v)
        self.beta = beta
        allowed, gram = rnd.extended_allowed, rnd.extended
        self.rounding = ScanRounding.rebuild(self.kernel, self.L, self.points, self.aux)
        self.rounding.extended_allowed, self.rounding.extended = allowed, gram
        return True

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
        st.rounding = ScanRounding.rebuild(kernel, st.L, st.points, st.aux)
        return st


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
