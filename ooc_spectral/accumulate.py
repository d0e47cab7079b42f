"""Pass 2: the parallel map over row chunks and the ordered tree reduction.

Each task projects its rows on the dictionary (``Y``, c x m, see
:meth:`~ooc_spectral.scan.Dictionary.project`: the affine projection for the
additive normalization, the orthogonal one for the divisive, which needs the
uncentred kernel) and returns a small dict; the
tree reduction combines those dicts in a fixed order (chunk, combine,
aggregate, as in ``dask.array.reductions``), so the result does not depend on
which worker finished first.

Four kinds of statistics:

``moments`` (additive normalization)
    ``n``, the mean ``ybar`` and the centred sum of squares
    ``C = sum (y - ybar)(y - ybar)'``, combined with the pairwise update of
    Chan, Golub & LeVeque (the rows of Y share a large common part: raw sums
    would cancel badly), plus the certificate ``max delta``;
``sums`` (divisive normalization, first pass)
    ``n``, ``sum y`` and ``max delta``;
``gram`` (divisive normalization with subset degrees)
    ``n``, ``S = sum y y'`` and ``max delta``;
``degrees`` (divisive normalization with exact degrees, Proposition 2)
    with ``s = sum y`` known: ``d_t = y_t . s`` (the row sums of ``Y Y'``),
    ``S = sum y y' / d_t`` and the smallest degree.

The tasks are grouped in segments of :data:`~ooc_spectral.planning.SEGMENT_TASKS`
consecutive chunks; each segment is reduced into one partial, which a
checkpoint can store, and the partials are folded in segment order.
Nothing n x m is ever held: a task holds one c x m block.
"""

from __future__ import annotations

from typing import Protocol

import dask
import numpy as np

from .exceptions import DictionaryError
from .execution import Executor, shared
from .planning import SEGMENT_TASKS, segments
from .scan import Dictionary
from .source import check_finite

__all__ = [
    "chunk_moments",
    "chunk_sums",
    "chunk_gram",
    "chunk_degrees",
    "combine",
    "tree_reduce",
    "accumulate",
    "PartialStore",
    "STAT_KINDS",
    "check_degrees",
]

#: Split factor of the tree reduction.
SPLIT_EVERY = 8


# --------------------------------------------------------------------------- #
# chunk functions: pure NumPy over (block, small state) -> small dict
# --------------------------------------------------------------------------- #
def _project(block, dictionary: Dictionary, offset: int, chunk_starts, orthogonal=True):
    X = np.ascontiguousarray(block, dtype=np.float64)
    check_finite(X, offset, chunk_starts=chunk_starts)
    return dictionary.project(X, orthogonal=orthogonal)


def _certificate(delta: np.ndarray, offset: int) -> dict:
    i = int(np.argmax(delta))
    return {"max_delta": float(delta[i]), "argmax": int(offset + i)}


def chunk_moments(block, dictionary: Dictionary, offset: int, chunk_starts=None) -> dict:
    """``n``, mean and centred sum of squares of the projections of one chunk."""
    Y, delta = _project(block, dictionary, offset, chunk_starts, orthogonal=False)
    n = Y.shape[0]
    mean = Y.mean(axis=0)
    Y -= mean
    m2 = Y.T @ Y
    return {"kind": "moments", "n": n, "mean": mean, "m2": m2, **_certificate(delta, offset)}


def chunk_sums(block, dictionary: Dictionary, offset: int, chunk_starts=None) -> dict:
    """``n`` and ``sum y`` of one chunk (divisive, before the degrees are known)."""
    Y, delta = _project(block, dictionary, offset, chunk_starts)
    return {"kind": "sums", "n": Y.shape[0], "sum": Y.sum(axis=0), **_certificate(delta, offset)}


def chunk_gram(block, dictionary: Dictionary, offset: int, chunk_starts=None) -> dict:
    """``n`` and ``S = sum y y'`` of one chunk (divisive with subset degrees)."""
    Y, delta = _project(block, dictionary, offset, chunk_starts)
    return {"kind": "gram", "n": Y.shape[0], "S": Y.T @ Y, **_certificate(delta, offset)}


def chunk_degrees(block, dictionary: Dictionary, offset: int, total: np.ndarray,
                  chunk_starts=None) -> dict:
    """``S = sum y y' / d`` and the smallest degree ``d = y . total`` of one chunk."""
    Y, _ = _project(block, dictionary, offset, chunk_starts)
    d = Y @ total
    i = int(np.argmin(d))
    if d[i] > 0:
        Y /= np.sqrt(d)[:, None]
    S = Y.T @ Y
    return {"kind": "degrees", "n": Y.shape[0], "S": S, "min_degree": float(d[i]),
            "argmin": int(offset + i)}


# --------------------------------------------------------------------------- #
# combine: two partials into one, deterministic
# --------------------------------------------------------------------------- #
def _combine_certificate(a: dict, b: dict) -> dict:
    # ties go to the earlier row, so the answer does not depend on the tree
    if b["max_delta"] > a["max_delta"] or (b["max_delta"] == a["max_delta"] and b["argmax"] < a["argmax"]):
        return {"max_delta": b["max_delta"], "argmax": b["argmax"]}
    return {"max_delta": a["max_delta"], "argmax": a["argmax"]}


def combine(a: dict, b: dict) -> dict:
    """Combine two partials of the same kind (``a`` before ``b`` in row order)."""
    kind = a["kind"]
    if kind == "moments":
        na, nb = a["n"], b["n"]
        n = na + nb
        delta = b["mean"] - a["mean"]
        mean = a["mean"] + delta * (nb / n)
        m2 = a["m2"] + b["m2"]
        m2 += np.multiply.outer(delta, delta) * (na * nb / n)
        return {"kind": kind, "n": n, "mean": mean, "m2": m2, **_combine_certificate(a, b)}
    if kind == "sums":
        return {"kind": kind, "n": a["n"] + b["n"], "sum": a["sum"] + b["sum"],
                **_combine_certificate(a, b)}
    if kind == "gram":
        return {"kind": kind, "n": a["n"] + b["n"], "S": a["S"] + b["S"],
                **_combine_certificate(a, b)}
    if kind == "degrees":
        if b["min_degree"] < a["min_degree"] or (b["min_degree"] == a["min_degree"] and b["argmin"] < a["argmin"]):
            low = {"min_degree": b["min_degree"], "argmin": b["argmin"]}
        else:
            low = {"min_degree": a["min_degree"], "argmin": a["argmin"]}
        return {"kind": kind, "n": a["n"] + b["n"], "S": a["S"] + b["S"], **low}
    raise ValueError(f"unknown partial kind {kind!r}")


def _combine_many(parts: list) -> dict:
    out = parts[0]
    for p in parts[1:]:
        out = combine(out, p)
    return out


def tree_reduce(parts: list, split_every: int = SPLIT_EVERY):
    """Ordered tree reduction of delayed partials (fan-in ``split_every``)."""
    while len(parts) > 1:
        parts = [dask.delayed(_combine_many, pure=True)(parts[i : i + split_every])
                 for i in range(0, len(parts), split_every)]
    return parts[0]


# --------------------------------------------------------------------------- #
# the pass
# --------------------------------------------------------------------------- #
class PartialStore(Protocol):
    """Where finished segment partials are kept across a restart (a checkpoint)."""

    def load_partial(self, stage: str, segment: int) -> dict | None: ...

    def save_partial(self, stage: str, segment: int, partial: dict) -> None: ...


STAT_KINDS = {"moments": chunk_moments, "sums": chunk_sums, "gram": chunk_gram,
              "degrees": chunk_degrees}


def accumulate(X, dictionary: Dictionary, kind: str, *, executor: Executor,
               chunk_starts=None, total: np.ndarray | None = None,
               store: PartialStore | None = None, stage: str | None = None,
               per_segment: int = SEGMENT_TASKS) -> dict:
    """Run one parallel pass over the row chunks of the dask array ``X``.

    Parameters
    ----------
    X : dask.array.Array of shape (n, d)
        Row chunks spanning all columns.
    dictionary : Dictionary
    kind : {"moments", "sums", "degrees"}
    executor : Executor
    chunk_starts : ndarray, optional
        Storage chunk boundaries, to name the chunk of a non-finite row.
    total : ndarray of shape (m,), optional
        ``sum y``, required for ``kind="degrees"``.
    store, stage : optional
        Segment partials found in ``store`` under ``stage`` are not recomputed;
        new ones are saved there as they finish.

    Returns
    -------
    dict
        The combined statistics.
    """
    func = STAT_KINDS[kind]
    blocks = X.to_delayed().ravel()
    offsets = np.concatenate([[0], np.cumsum(X.chunks[0])[:-1]]).astype(np.int64)
    d_key = shared(dictionary)
    starts_key = shared(chunk_starts) if chunk_starts is not None else None
    extra = (shared(total),) if kind == "degrees" else ()
    segs = segments(len(blocks), per_segment)
    stage = stage or kind

    partials: dict[int, dict] = {}
    todo = {}
    for s, seg in enumerate(segs):
        found = store.load_partial(stage, s) if store is not None else None
        if found is not None:
            partials[s] = found
            continue
        tasks = [dask.delayed(func, pure=True)(blocks[i], d_key, int(offsets[i]), *extra,
                                               chunk_starts=starts_key)
                 for i in seg]
        todo[s] = tree_reduce(tasks)

    def keep(s, partial):
        if store is not None:
            store.save_partial(stage, s, partial)

    partials.update(executor.run(f"pass 2 ({kind})", todo, on_result=keep))
    return _combine_many([partials[s] for s in range(len(segs))])


def check_degrees(stats: dict) -> None:
    """Raise if an approximate degree is not positive (divisive normalization)."""
    if stats["min_degree"] <= 0:
        raise DictionaryError(
            f"the approximate degree of row {stats['argmin']} is {stats['min_degree']:.3g} "
            "(not positive), so D^-1/2 K D^-1/2 is undefined; a loose tol makes the "
            "approximate Gram matrix lose positivity: lower tol (e.g. by 10x), or use "
            "degree_estimate='subset'"
        )
