"""The pieces of the bipartite graph of the rows and their representatives, and the
transfer cut's eigensolve by pieces.

Two representatives are in one piece when a row joins both (``cross > 0`` in
:class:`~ooc_spectral.core.representatives.BipartiteSums`). The matrix
``S = D_Y^-1/2 E D_Y^-1/2`` of the transfer cut is block diagonal over the pieces, so its
eigenpairs are those of the blocks: on data in well separated clusters the solve is a few
small ones instead of one of size ``m``.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = ["graph_pieces", "pieces_of", "leading_by_pieces"]


def graph_pieces(sums) -> int:
    """How many separate pieces the bipartite graph of the rows and the representatives
    they chose falls into: two representatives are in one piece when a row joins both
    (``cross > 0``), rows are in their representatives' piece.

    Each piece gives the eigenvalue ``mu = 1`` once; with more pieces than clusters the
    leading eigenvectors span the pieces' indicators in an arbitrary basis, and nothing
    in the graph says which pieces belong together.
    """
    return pieces_of(sums)[0]


def pieces_of(sums) -> tuple[int, np.ndarray]:
    """``(count, label)`` of :func:`graph_pieces`, the labels over the representatives
    joined to rows (``degrees > 0``) in their order: what :func:`leading_by_pieces` takes,
    so that the pieces are found once a fit."""
    used = sums.degrees > 0
    return _pieces(sums.cross[np.ix_(used, used)])


def _pieces(cross: np.ndarray) -> tuple[int, np.ndarray]:
    """``(count, label)`` of the connected pieces of the representatives joined by
    ``cross > 0`` (labels numbered in the order of their first member)."""
    import scipy.sparse
    from scipy.sparse.csgraph import connected_components

    # as a sparse matrix: csgraph's own conversion of a dense one goes through masked
    # arrays, several times slower at m = 1000
    n, label = connected_components(scipy.sparse.csr_matrix(cross > 0), directed=False)
    return int(n), label


def leading_by_pieces(S: np.ndarray, p: int,
                      pieces: tuple[int, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The ``p`` largest eigenvalues of the symmetric ``S`` (``r x r``), descending, and
    their eigenvectors ``(r, p)``. ``S`` is block diagonal over its graph's pieces
    (:func:`_pieces`), so its eigenpairs are those of the pieces' blocks, zero outside
    their piece: one small solve a piece (10 pieces of 100: a hundredth of the work of
    the whole ``r x r`` solve) and, for a repeated eigenvalue 1, the pieces' own
    eigenvectors rather than an arbitrary basis of their span. Equal eigenvalues are
    ordered by piece, then by the order within the piece's solve. ``pieces``: ``S``'s
    pieces where the caller has them (:func:`pieces_of`), else found here."""
    r = S.shape[0]
    count, label = _pieces(S) if pieces is None else pieces
    if count == 1:
        mu, W = scipy.linalg.eigh(S, subset_by_index=[r - p, r - 1])
        return mu[::-1].copy(), W[:, ::-1]
    values, owner, vectors = [], [], []
    for c in range(count):
        idx = np.flatnonzero(label == c)
        q = min(p, idx.size)
        mu_c, W_c = scipy.linalg.eigh(S[np.ix_(idx, idx)], subset_by_index=[idx.size - q,
                                                                           idx.size - 1])
        values.append(mu_c[::-1])
        owner.append(np.full(q, c))
        vectors.extend((idx, W_c[:, q - 1 - i]) for i in range(q))
    values, owner = np.concatenate(values), np.concatenate(owner)
    order = np.lexsort((np.arange(values.size), owner, -values))[:p]
    W = np.zeros((r, p))
    for col, i in enumerate(order):
        idx, w = vectors[i]
        W[idx, col] = w
    return values[order].copy(), W
