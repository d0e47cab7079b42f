"""The pieces of the bipartite graph of the rows and their representatives, and the
transfer cut's eigensolve by pieces.

Two representatives are in one piece when a row joins both (``cross > 0`` in
:class:`~ooc_spectral.core.representatives.BipartiteSums`). The matrix
``S = D_Y^-1/2 E D_Y^-1/2`` of the transfer cut is block diagonal over the pieces, so its
eigenpairs are those of the blocks: on data in well separated clusters the solve is a few
small ones instead of one of size ``m``.

A connected graph of many representatives is solved by Lanczos (ARPACK) for the few
leading eigenpairs, each such solve certified (:func:`_leading_lanczos`: the residual,
and a Cholesky factorization proving no other eigenvalue above the ``p``-th found);
where the certificate fails, by the dense solve.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = ["graph_pieces", "pieces_of", "leading_by_pieces", "LANCZOS_MIN_SIZE",
           "LANCZOS_MIN_ROWS"]

#: A connected ``S`` of at least this order, in a fit of at least
#: :data:`LANCZOS_MIN_ROWS` rows, is solved by Lanczos for its ``p`` leading eigenpairs
#: (``p`` at most :data:`LANCZOS_MAX_SHARE` of it), certified, within
#: :data:`LANCZOS_MAX_RESTARTS` restarts; else (or where that fails) by the dense solve.
#: On the 20-D blobs of 10^5 rows (m = 1000, p = 10) it converges in about 45 products
#: and takes half the dense solve's time with the certificate; a spectrum crowded near 1
#: (digits: 221 products) takes longer than the dense solve, so Lanczos is tried only
#: where the fit's passes dwarf a failed attempt, and gives up early.
LANCZOS_MIN_SIZE = 256
LANCZOS_MIN_ROWS = 50_000
LANCZOS_MAX_RESTARTS = 6
LANCZOS_MAX_SHARE = 0.1
#: The certificate proves every eigenvalue not found below the ``p``-th found less this
#: (a ``p``-th eigenvalue closer than it to the next is left to the dense solve), with
#: residuals at most ``LANCZOS_RESIDUAL`` in the Frobenius norm of ``S W - W diag(mu)``
#: (which bounds each ``|S w - mu w|_2``; ``S``'s entries are at most 1), and ``W'W = I`` to it.
LANCZOS_GAP = 1e-8
LANCZOS_RESIDUAL = 1e-10


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


def leading_by_pieces(S: np.ndarray, p: int, pieces: tuple[int, np.ndarray] | None = None,
                      lanczos: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The ``p`` largest eigenvalues of the symmetric ``S`` (``r x r``), descending, and
    their eigenvectors ``(r, p)``. ``S`` is block diagonal over its graph's pieces
    (:func:`_pieces`), so its eigenpairs are those of the pieces' blocks, zero outside
    their piece: one small solve a piece (10 pieces of 100: a hundredth of the work of
    the whole ``r x r`` solve) and, for a repeated eigenvalue 1, the pieces' own
    eigenvectors rather than an arbitrary basis of their span. Equal eigenvalues are
    ordered by piece, then by the order within the piece's solve. ``pieces``: ``S``'s
    pieces where the caller has them (:func:`pieces_of`), else found here. ``lanczos``:
    a connected ``S`` may be solved by :func:`_leading_lanczos` (certified)."""
    r = S.shape[0]
    count, label = _pieces(S) if pieces is None else pieces
    if count == 1:
        found = _leading_lanczos(S, p) if lanczos else None
        if found is not None:
            return found
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


def _leading_lanczos(S: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The ``p`` largest eigenpairs of the symmetric ``S`` (``r x r``, descending) by
    ARPACK's Lanczos (``eigsh``, ``tol=0``, a fixed start vector: deterministic), where
    ``r >= LANCZOS_MIN_SIZE`` and ``p <= LANCZOS_MAX_SHARE r``, else None; None too where
    ARPACK fails (within :data:`LANCZOS_MAX_RESTARTS` restarts) or the result is not
    certified. Lanczos can miss an eigenvalue (a
    repeated one, or one its start vector barely holds), so the result is kept only with
    a proof that it did not: with ``W`` the found vectors (residuals at most
    :data:`LANCZOS_RESIDUAL`) and ``sigma`` the ``p``-th found value less
    :data:`LANCZOS_GAP`, ``M = Q (sigma I - S) Q + W W'`` (``Q = I - W W'``) is positive
    definite exactly when every eigenvalue of ``S`` on the complement of ``W`` is below
    ``sigma``, and its Cholesky factorization succeeds only then (to rounding, far below
    the gap). The values equal the dense solve's to rounding (1e-15 on the bench's
    1000 x 1000 solves) and the vectors to rounding over the gaps."""
    import scipy.sparse.linalg

    r = S.shape[0]
    if r < LANCZOS_MIN_SIZE or not 1 <= p <= LANCZOS_MAX_SHARE * r:
        return None
    v0 = np.random.default_rng(0x4C414E43).uniform(-1.0, 1.0, r)
    try:
        mu, W = scipy.sparse.linalg.eigsh(S, k=p, which="LA", v0=v0, tol=0.0,
                                          maxiter=LANCZOS_MAX_RESTARTS)
    except (scipy.sparse.linalg.ArpackError, scipy.sparse.linalg.ArpackNoConvergence):
        return None
    order = np.argsort(-mu, kind="stable")
    mu, W = mu[order], np.ascontiguousarray(W[:, order])
    if not (np.all(np.isfinite(mu)) and _certified(S, mu, W)):
        return None
    return mu, W


def _certified(S: np.ndarray, mu: np.ndarray, W: np.ndarray) -> bool:
    """Whether ``(mu, W)`` (descending) are eigenpairs of ``S`` and every other eigenvalue
    is below ``mu[-1] - LANCZOS_GAP`` (:func:`_leading_lanczos`)."""
    SW = S @ W
    # norms, not the largest entry: r entries each just under the bound would let a
    # vector's residual, and so its value's error, be sqrt(r) times larger
    if np.linalg.norm(SW - W * mu) > LANCZOS_RESIDUAL:
        return False
    if np.linalg.norm(W.T @ W - np.eye(W.shape[1])) > LANCZOS_RESIDUAL:
        return False
    sigma = mu[-1] - LANCZOS_GAP
    AW = sigma * W - SW  # (sigma I - S) W
    G = W.T @ AW
    G = 0.5 * (G + G.T) + np.eye(W.shape[1])
    # Q A Q + W W' = A - W (AW)' - (AW) W' + W G W' = A + [W, AW] [W G - AW, -W]'
    M = np.negative(S)
    M.flat[::S.shape[0] + 1] += sigma
    M += np.hstack([W, AW]) @ np.hstack([W @ G - AW, -W]).T
    _, info = scipy.linalg.lapack.dpotrf(M, lower=1, overwrite_a=1, clean=0)
    return info == 0
