"""The smallest entries of each row of a distance block, at the speed of a few passes.

:class:`~ooc_spectral.core.representatives.Representatives` finds each row's nearest
representatives from one product per block (squared distances up to a per-row
constant); these select the few smallest entries of each row without a selection in
every row (``np.argpartition``): a threshold known to hold them, the entries under it
gathered and sorted in a padded row of their own.
"""

from __future__ import annotations

import numpy as np

__all__ = ["smallest_under", "smallest_k"]


def smallest_under(D: np.ndarray, tau: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(columns, values)``, both ``(c, k)``: the ``k`` smallest entries of each row of
    ``D`` (``(c, m)``) among those at most ``tau`` (``(c,)``), by value then column; where
    a row has fewer, the rest are column 0 with value ``inf``. Each row's few entries are
    sorted in a padded row of their own."""
    c, m = D.shape
    flat = np.flatnonzero(D <= tau[:, None])
    r, j = np.divmod(flat, m)
    counts = np.bincount(r, minlength=c)
    start = np.zeros(c, dtype=np.int64)
    np.cumsum(counts[:-1], out=start[1:])
    pos = np.arange(flat.size) - start[r]
    width = max(int(counts.max(initial=0)), k)
    V = np.full((c, width), np.inf)
    V[r, pos] = D.ravel()[flat]
    J = np.zeros((c, width), dtype=np.int64)
    J[r, pos] = j  # ascending within a row: a stable sort by value breaks ties by column
    order = np.argsort(V, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(J, order, axis=1), np.take_along_axis(V, order, axis=1)


def smallest_k(D: np.ndarray, K: int, values: bool = False):
    """The columns of the ``K`` smallest entries of each row of ``D`` (``(c, m)``,
    ``K < m``), ties to the lower column: ``(c, K)``, each row by value then column
    (and their values, ``(columns, values)``, with ``values=True``).

    The ``K``-th smallest entry of a row is at most ``tau``, the largest of the minima of
    ``K`` disjoint blocks of its columns (they are ``K`` entries of the row), so only
    the entries up to ``tau`` (about ``2 K`` a row) are sorted
    (:func:`smallest_under`): two contiguous passes over ``D`` instead of a selection in
    every row (``np.argpartition``, twice as slow at ``m = 1000``, ``K = 5``)."""
    c, m = D.shape
    q = m // K
    tau = D[:, :q * K].reshape(c, K, q).min(axis=2).max(axis=1)
    found = smallest_under(D, tau, K)
    return found if values else found[0]
