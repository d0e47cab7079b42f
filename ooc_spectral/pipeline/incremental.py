"""Incremental kernel PCA: ``partial_fit`` over batches of rows (issue 16).

The dictionary only grows, and pass 2's statistics are sums over rows, so a new
batch costs a scan of its rows against the current dictionary, its own pass 2,
and, when the dictionary grew, an extension of the earlier batches' statistics:

- an earlier batch that can be read again (a zarr array, a path, a dask array)
  gets the *cross* pass of the prefix scan: its rows' coordinates on the points
  added since (:func:`~ooc_spectral.core.pass2.chunk_cross_moments`). The result
  is then exactly kernel PCA of every row seen, projected on the final dictionary;
- an earlier numpy batch is not kept: its rows are carried by their projections
  on the span they were seen with, whose coordinates on the points added since
  are zero. Each such row is then off by its residual at the time (at most
  ``tol``) in a direction that need not be orthogonal to the grown span, so the
  one-sided interval of Weyl no longer applies; singular values move by at most
  ``||R||_2 <= sqrt(S)`` with ``S`` the sum of those residuals, so every exact
  eigenvalue lies in ``[(sqrt(lambda_i) - sqrt(S))^2, (sqrt(lambda_i) + sqrt(S))^2]``
  and :attr:`IncrementalFit.eigenvalue_error_bound` reports the half-width
  ``2 sqrt(lambda_1 S) + S``.

Only the additive normalization (kernel PCA) is incremental: the divisive one
weights each row by its degree, which changes for every earlier row when a
batch arrives, so it needs every row again.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from .accumulate import accumulate, extension_pass
from ..core.config import FitConfig
from ..core.eigensolve import eigenvalue_error_bound, solve_additive
from ..exceptions import InvalidInputError, InvalidParameterError
from ..runtime.execution import Executor
from ..core.kernels import Kernel
from ..core.model import Dictionary, SpectralMap
from ..core.planning import VISIT_WINDOW_ROWS, VisitOrder, plan_task_rows
from .scan import scan_source
from ..core.scan.state import DictionaryState
from ..io.source import DataSource
from ..core.statistics import Moments

__all__ = ["IncrementalFit", "Batch"]


@dataclass
class Batch:
    """One batch seen by ``partial_fit``: its moments on the dictionary of ``size`` points."""

    first_row: int
    n_rows: int
    moments: Moments
    size: int
    source: DataSource | None  # None: a numpy batch, carried by its projections
    stale: bool = False  # carried across a growth of the dictionary


@dataclass
class IncrementalFit:
    """The state of an incremental fit: dictionary, batches, and the map they give.

    Parameters
    ----------
    config : FitConfig
        Additive normalization, ``tol`` given (``dictionary_size`` is not incremental).
    kernel : Kernel
        Resolved on the first batch (gamma included) and kept.
    n_features : int
    """

    config: FitConfig
    kernel: Kernel
    n_features: int
    executor: Executor = field(default_factory=Executor)
    batches: list[Batch] = field(default_factory=list)
    state: DictionaryState | None = None
    dictionary: Dictionary | None = None
    spectral_map: SpectralMap | None = None
    stats: Moments | None = None
    #: Eigenvectors (in dictionary coordinates) whose signs the first solve keeps,
    #: when the fit continues one made elsewhere (:mod:`ooc_spectral.batch.append`).
    reference_components: np.ndarray | None = None

    def __post_init__(self):
        c = self.config
        if c.normalization != "additive":
            raise InvalidParameterError(
                "partial_fit supports normalization='additive' only: the divisive "
                "normalization weights every row by its degree, which each new batch changes; "
                "use fit on all the rows")
        if c.dictionary_size is not None or c.tol is None:
            raise InvalidParameterError(
                "partial_fit needs tol (the dictionary grows with the data); dictionary_size "
                "fixes the dictionary on a sample of one fit: use fit")
        self.state = DictionaryState(self.kernel, self.n_features, c.affine)

    @property
    def n_samples(self) -> int:
        return sum(b.n_rows for b in self.batches)

    # ------------------------------------------------------------------ #
    def add(self, source: DataSource, *, keep: bool) -> SpectralMap:
        """Scan, accumulate and re-solve with one more batch.

        ``keep``: the batch can be read again later (it is kept by reference).
        The three steps are also public, for callers that time them
        (:mod:`ooc_spectral.batch.append`).
        """
        first = self.scan_batch(source)
        self.accumulate_batch(source, first, keep=keep)
        return self.solve()

    def scan_batch(self, source: DataSource) -> int:
        """Pass 1 on a new batch: add its rows beyond ``tol``; returns its first row number."""
        if source.n_features != self.n_features:
            raise InvalidInputError(
                f"X has {source.n_features} features, but the first batch had "
                f"{self.n_features}; every batch must have the same columns")
        first = self.n_samples
        self._scan(source, first, len(self.batches))
        return first

    def accumulate_batch(self, source: DataSource, first: int, *, keep: bool) -> Dictionary:
        """Pass 2 on the new batch, after extending the earlier batches to a grown dictionary."""
        dictionary = self.state.freeze(self.config.solver)
        for b in self.batches:
            if b.size < dictionary.size:
                self._extend(b, dictionary)
        moments = self._moments(source, dictionary)
        self.batches.append(Batch(first, source.n_rows, moments, dictionary.size,
                                  source if keep else None))
        self.dictionary = dictionary
        return dictionary

    def solve(self) -> SpectralMap:
        """The eigensolve on the sum of every batch's moments (signs kept from the last map)."""
        total = self.batches[0].moments
        for b in self.batches[1:]:
            total = total.combine(b.moments)
        self.stats = total
        self.spectral_map = self._keep_signs(
            solve_additive(self.dictionary, total, self.config.n_components))
        return self.spectral_map

    def _keep_signs(self, smap: SpectralMap) -> SpectralMap:
        """Flip each component to agree with the previous map's (stable across updates).

        The coordinates of the old dictionary are the leading ones of the new, so
        the previous eigenvectors, padded with zeros, are comparable directly.
        """
        prev = self.spectral_map
        W_old = prev.components if prev is not None else self.reference_components
        if W_old is None:
            return smap
        W = smap.components
        k = min(W_old.shape[1], W.shape[1])
        dots = np.einsum("ij,ij->j", W[: W_old.shape[0], :k], W_old[:, :k])
        signs = np.ones(W.shape[1])
        signs[:k] = np.where(dots < 0, -1.0, 1.0)
        if np.all(signs > 0):
            return smap
        return SpectralMap(smap.dictionary, smap.mode, smap.center, W * signs, smap.eigenvalues,
                           smap.n_samples)

    def _scan(self, source: DataSource, first: int, batch: int) -> None:
        c = self.config
        seed = int(np.random.SeedSequence([int(c.random_state), 0x16, batch]).generate_state(1)[0])
        order = VisitOrder(source.n_rows, seed, window=VISIT_WINDOW_ROWS)
        before = self.state.size
        scan_source(source, order, self.state, tol=float(c.tol), max_size=c.max_dictionary_size)
        self.state._indices[before:self.state.size] += first  # row numbers over all batches

    def _task_rows(self, source: DataSource, size: int) -> int:
        return plan_task_rows(source.n_rows, source.n_features, source.storage_chunk_rows, size,
                              requested=self.config.chunk_rows, itemsize=source.itemsize)

    def _moments(self, source: DataSource, dictionary: Dictionary) -> Moments:
        X = source.task_view(self._task_rows(source, dictionary.size))
        return accumulate(X, dictionary, "moments", executor=self.executor,
                          chunk_starts=source.chunk_starts)

    def _extend(self, b: Batch, dictionary: Dictionary) -> None:
        """Bring one earlier batch's moments to the grown dictionary."""
        if b.size == dictionary.size:
            return
        if b.source is not None:
            X = b.source.task_view(self._task_rows(b.source, dictionary.size))
            b.moments, _ = extension_pass(X, dictionary, b.moments, b.size,
                                          executor=self.executor, chunk_starts=b.source.chunk_starts)
        else:  # carried: zero coordinates on the new points
            new = dictionary.size - b.size
            mo = b.moments
            m2 = np.zeros((dictionary.size, dictionary.size))
            m2[: b.size, : b.size] = mo.m2
            b.moments = dataclasses.replace(mo, mean=np.concatenate([mo.mean, np.zeros(new)]), m2=m2)
            b.stale = True
        b.size = dictionary.size

    # ------------------------------------------------------------------ #
    @property
    def eigenvalue_error_bound(self) -> float:
        """Half-width of the interval around each eigenvalue that holds the exact one.

        Without carried stale rows, Weyl's one-sided width (see
        :func:`~ooc_spectral.core.eigensolve.eigenvalue_error_bound`); with them, the
        singular-value bound of the module docstring.
        """
        one_sided = eigenvalue_error_bound(self.stats.sums, self.dictionary.size)
        if not any(b.stale for b in self.batches):
            return one_sided
        lam1 = float(self.spectral_map.eigenvalues[0])
        return 2.0 * math.sqrt(max(lam1, 0.0) * one_sided) + one_sided

    @property
    def max_residual(self) -> tuple[float, int]:
        """The largest residual of any row, on the span it is represented with, and its row."""
        worst = max(self.batches, key=lambda b: b.moments.certificate.max_delta)
        cert = worst.moments.certificate
        return float(max(cert.max_delta, 0.0)), int(cert.argmax + worst.first_row)
