"""Saying when a spectral result is degenerate (:class:`DegeneratePartitionWarning`).

A spectral clustering or a Laplacian embedding can be right arithmetic and still say
nothing about the data: at a bandwidth far too narrow for the data (the median
heuristic on standardised digits or breast cancer) the graph falls apart into a few
outlying rows and the rest. Its leading eigenvectors then sit on those rows, and
k-means gives one cluster holding almost every row and the others a handful. Three
readings, each cheap, detect it:

* **a partition with one cluster and a handful** (:func:`partition_message`): the rows
  outside the largest cluster are at most :func:`handful` of ``n``;
* **coordinates carried by a handful of rows** (:func:`localized_coordinates`): the
  participation number ``(sum_i v_i^2)^2 / sum_i v_i^4`` of a coordinate ``v`` (how many
  rows it is spread over: ``n`` for a constant vector, 1 for a vector on one row; about
  ``s`` for the indicator of a group of ``s`` rows against the rest) is at most a
  handful;
* **a graph in pieces** (:func:`unit_eigenvalues`): each piece of the graph is one
  eigenvalue equal to 1 of ``D^-1/2 W D^-1/2``; with several, the leading coordinates
  only say which piece a row is in.

The messages name what to change; :func:`warn` issues them once
(:func:`~ooc_spectral.exceptions.warn_once`: a log line under the command line, a
Python warning otherwise).
"""

from __future__ import annotations

import numpy as np

from ..exceptions import DegeneratePartitionWarning, warn_once

__all__ = ["DEGENERATE_FRACTION", "DEGENERATE_MIN_ROWS", "UNIT_EIGENVALUE_TOL", "handful",
           "partition_message", "localized_coordinates", "unit_eigenvalues",
           "embedding_message", "warn", "check_divisive_embedding"]

#: "A handful" of ``n`` rows: at most this fraction of them ...
DEGENERATE_FRACTION = 0.01
#: ... or this many, whichever is larger.
DEGENERATE_MIN_ROWS = 3
#: ... and only where the largest cluster holds at least this share of the rows ("almost
#: every row": on a few rows, 3 of 6 is a handful by the count and not by the share).
ALMOST_EVERY = 0.9
#: An eigenvalue of ``D^-1/2 W D^-1/2`` within this of 1 counts a piece of the graph.
UNIT_EIGENVALUE_TOL = 1e-6


def handful(n: int) -> float:
    """The most rows that count as a handful of ``n``."""
    return max(DEGENERATE_FRACTION * int(n), DEGENERATE_MIN_ROWS)


def partition_message(sizes) -> str | None:
    """What is degenerate about a partition with these cluster ``sizes``, or None: one
    cluster holds all but a handful of the rows, with at least 2 clusters."""
    sizes = np.asarray(sizes, dtype=np.float64)
    n = float(sizes.sum())
    if sizes.size < 2 or n <= 0:
        return None
    rest = n - float(sizes.max())
    if rest > handful(n) or sizes.max() < ALMOST_EVERY * n:  # 3 of 6 rows is no handful
        return None
    shown = ", ".join(f"{v:.0f}" for v in np.sort(sizes)[::-1][:8])
    more = ", ..." if sizes.size > 8 else ""
    others = ("the other holds" if sizes.size == 2
              else f"the other {sizes.size - 1} hold together")
    return (f"one cluster holds {sizes.max():.0f} of the {n:.0f} rows and {others} "
            f"{rest:.0f} (sizes {shown}{more})")


def localized_coordinates(V, n_rows: int | None = None) -> list[tuple[int, float]]:
    """``[(j, participation), ...]`` for the columns ``j`` of ``V`` (coordinates of rows,
    ``(rows, p)``) spread over at most a handful of ``n_rows`` (default ``len(V)``) rows.
    Columns of zeros are skipped."""
    V = np.asarray(V, dtype=np.float64)
    if V.ndim != 2 or V.shape[0] == 0:
        return []
    s2 = np.einsum("ij,ij->j", V, V)
    V2 = V * V
    s4 = np.einsum("ij,ij->j", V2, V2)
    limit = handful(V.shape[0] if n_rows is None else n_rows)
    out = []
    for j in range(V.shape[1]):
        if s4[j] > 0:
            part = float(s2[j] * s2[j] / s4[j])
            if part <= limit:
                out.append((j, part))
    return out


def unit_eigenvalues(eigenvalues, tol: float = UNIT_EIGENVALUE_TOL) -> int:
    """How many of ``eigenvalues`` (of ``D^-1/2 W D^-1/2``, at most 1) equal 1 within
    ``tol``: the pieces the graph falls into, when the trivial one is among them."""
    ev = np.asarray(eigenvalues, dtype=np.float64)
    return int(np.sum(ev >= 1.0 - tol))


def embedding_message(eigenvalues, V, *, drop_first: bool, n_rows: int | None = None,
                      rows_of: str = "rows") -> str | None:
    """What is degenerate about a divisive embedding, or None.

    ``eigenvalues`` are the embedding's (the trivial 1 first unless ``drop_first``);
    ``V`` its coordinates at some rows (``rows_of`` names them in the message).
    """
    found = []
    pieces = unit_eigenvalues(eigenvalues) + (1 if drop_first else 0)
    if pieces >= 2:
        found.append(f"the graph falls into at least {pieces} pieces ({pieces - 1} "
                     "leading eigenvalues besides the trivial one equal 1), and the "
                     "coordinates only say which piece a row is in")
    local = [(j, p) for j, p in localized_coordinates(V, n_rows)
             if drop_first or j > 0]  # the trivial coordinate is spread over every row
    if local:
        what = ", ".join(str(j) for j, _ in local)
        parts = ", ".join(f"{p:.1f}" for _, p in local)
        found.append(f"embedding column{'s' * (len(local) > 1)} {what} "
                     f"{'are' if len(local) > 1 else 'is'} carried by about {parts} of the "
                     f"{len(V) if n_rows is None else n_rows} {rows_of}: the graph nearly "
                     "falls apart into outlying rows, and the coordinates locate them")
    return "; ".join(found) or None


def warn(owner: str, what: str, advice: str) -> None:
    """One :class:`DegeneratePartitionWarning`: ``owner: what. advice``."""
    warn_once(f"{owner}: {what}. {advice}", DegeneratePartitionWarning, stacklevel=3)


def _gamma_advice(gamma_, gamma_given) -> str:
    if gamma_ is None:
        return "a kernel that decays more slowly"
    how = "" if gamma_given is not None else ", the median heuristic's"
    return (f"a smaller gamma (a wider kernel: gamma_ is {gamma_:.3g} here{how}), "
            f"e.g. gamma={gamma_ / 10:.3g}")


def check_divisive_embedding(est, owner: str = "the divisive embedding") -> None:
    """Warn when a fitted divisive embedding (``GreedySpectralEmbedding(normalization=
    "divisive")``, as ``LaplacianEigenmaps`` and ``GreedySpectralClustering`` fit it) is
    degenerate (:func:`embedding_message`): read on the rows of a numpy ``embedding_``,
    else on the dictionary's rows (outlying rows enter the dictionary, so coordinates
    that sit on them sit on its rows too)."""
    E = getattr(est, "embedding_", None)
    if isinstance(E, np.ndarray):
        V, n, rows_of = E, E.shape[0], "rows"
    else:
        points = est.dictionary_
        V = est.spectral_map_.embed(np.asarray(points, dtype=np.float64))
        n, rows_of = V.shape[0], "dictionary rows"
    what = embedding_message(est.eigenvalues_, V, drop_first=bool(est.drop_first), n_rows=n,
                             rows_of=rows_of)
    if what is not None:
        warn(owner, what, "Use " + _gamma_advice(getattr(est, "gamma_", None),
                                                 getattr(est, "gamma", None)))
