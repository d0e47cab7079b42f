"""Loops over a block that read it once, where NumPy's calls read it two or three times.

Pass 2 spends most of a sub-block in BLAS (the kernel product, the triangular solve,
the m x m accumulation); between those calls it walks the block elementwise: the
kernel values clipped at 1 and added up by column, then the coordinates' squared
norms, their products with ``w`` and the centring. As NumPy calls, each of these is
one more pass over the block (or over its 1 MiB pieces), under the GIL between
calls. Compiled by numba, each is one pass.

Where numba is installed (the ``numba`` extra) and not turned off by the dask config
``ooc-spectral.numba`` (env ``DASK_OOC_SPECTRAL__NUMBA=False``; read at every call),
the compiled loops of :mod:`ooc_spectral._accel.fused_numba` are used: imported, and so
compiled or loaded from numba's disk cache, on first use in each process. Otherwise
NumPy gives the same values to rounding (the sums are taken in another order;
``tests/test_fused.py``).

The compiled loops take a fraction of NumPy's time on a sub-block in the cache, and a
whole chunk of pass 2 is faster with them (docs/measurements.md, "numba's one-pass
loops").
"""

from __future__ import annotations

import logging
import os

import numpy as np

from .support import (ACCEL_MIN_ENTRIES, accel_allowed, accel_for, config_flag,
                      contiguous_float64, once)

__all__ = ["numba_loops", "loops_backend", "loops_for", "LOOPS_MIN_ELEMENTS", "centre_rows", "centre_rows_weighted", "clip_unit_col_sums", "clip_unit_dot",
           "CENTRE_PIECE_ELEMENTS", "DOT_MAX_COLUMNS", "nearest_reach",
           "grouped_reach", "pair_sums", "kmeans_plusplus"]

#: Entries of a C-ordered block that the NumPy form of :func:`centre_rows` takes at a
#: time (a piece of 1 MiB, read once into the core's cache for its three uses; as the
#: kernel's pieces, :data:`~ooc_spectral.core.kernels.PIECE_ELEMENTS`).
CENTRE_PIECE_ELEMENTS = 2**17

#: Most columns of ``G`` for which :func:`clip_unit_dot` takes the compiled loop (one
#: pass over a row per column, the row in the core's first-level cache); wider ``G`` go
#: to BLAS.
DOT_MAX_COLUMNS = 8

log = logging.getLogger(__name__)


#: The compiled loops' gate (:func:`~ooc_spectral._accel.support.accel_for`), by the
#: name pass 2 and 3 use.
loops_for = accel_for
LOOPS_MIN_ELEMENTS = ACCEL_MIN_ENTRIES


def _jit_disabled() -> bool:
    """numba's ``NUMBA_DISABLE_JIT``: its loops would run as Python, thousands of times
    slower than NumPy's calls. Read from the environment, without importing numba."""
    return os.environ.get("NUMBA_DISABLE_JIT", "0").strip() not in ("", "0")


def numba_loops():
    """The compiled loops (:mod:`ooc_spectral._accel.fused_numba`), or None.

    None where numba is not installed, where the dask config ``ooc-spectral.numba`` is
    False, inside :func:`loops_for` a block smaller than :data:`LOOPS_MIN_ELEMENTS`, where ``NUMBA_DISABLE_JIT`` is set, or where the loops cannot be compiled or
    loaded in this process (for instance no writable place for numba's disk cache: a
    read-only installation without a writable ``~/.cache``). A failure is logged once,
    as a warning naming it, and NumPy's calls are used from then on.
    """
    if not config_flag("ooc-spectral.numba", True) or _jit_disabled():
        return None
    if not accel_allowed():
        return None
    return _loops()


def _import_loops():
    try:
        from . import fused_numba
    except ImportError:  # numba is not installed: the NumPy calls, silently
        return None
    except Exception as exc:  # installed but unusable here: say so, once
        log.warning("numba's compiled loops are not available (%s: %s); pass 2 uses NumPy's "
                    "calls, with the same values, more slowly. Set NUMBA_CACHE_DIR to a "
                    "writable directory if numba cannot write its cache, or "
                    "DASK_OOC_SPECTRAL__NUMBA=False to silence this", type(exc).__name__, exc)
        return None
    return fused_numba


#: :func:`_import_loops` once per process (the compiled module or None)
_loops = once(_import_loops)


def loops_backend() -> str | None:
    """``"numba <version>"`` where pass 2's loops are compiled in this installation and
    configuration, else None (the report's ``compiled_loops``: the view of this process;
    an external cluster's workers decide by their own installation).

    Read from the installed package's metadata where this process has not loaded the
    loops, so that reporting them does not import numba (its memory and import time:
    docs/measurements.md, "Start-up and resident costs").
    """
    if not config_flag("ooc-spectral.numba", True) or _jit_disabled():
        return None
    loaded, loops = _loops.peek()
    if loaded and loops is None:
        return None
    from importlib import metadata

    try:
        return f"numba {metadata.version('numba')}"
    except metadata.PackageNotFoundError:
        return None


def centre_rows(Z: np.ndarray, mean: np.ndarray, w: np.ndarray | None):
    """The squared norms and products with ``w`` of the rows of Z, then ``Z -= mean``.

    Compiled, one pass over Z; with NumPy, piece by piece (:data:`CENTRE_PIECE_ELEMENTS`),
    so that each piece is read from memory once for the three.

    Parameters
    ----------
    Z : ndarray of shape (c, m)
        The coordinates of a sub-block, C-ordered; centred in place.
    mean : ndarray of shape (m,)
    w : ndarray of shape (m,) or None

    Returns
    -------
    sq : ndarray of shape (c,)
        ``|z_t|^2`` of the rows before the centring.
    zw : ndarray of shape (c,) or None
        ``z_t . w`` of the rows before the centring; None without ``w``.
    """
    c, m = Z.shape
    sq = np.empty(c)
    zw = None if w is None else np.empty(c)
    loops = numba_loops()
    if (loops is not None and c and m and mean.shape == (m,)
            and (w is None or w.shape == (m,))
            and contiguous_float64(Z, mean, *(() if w is None else (w,)), writeable=True)):
        if w is None:
            loops.centre_rows(Z, mean, sq)
        else:
            loops.centre_rows_w(Z, mean, w, sq, zw)
        return sq, zw
    _centre_pieces(Z, mean, w, sq, zw)
    return sq, zw


def _centre_pieces(Z, mean, w, sq, zw, weights=None, cz=None) -> None:
    """NumPy's :func:`centre_rows` (and :func:`centre_rows_weighted` with ``weights``), in
    pieces of about :data:`CENTRE_PIECE_ELEMENTS` that stay in the cache."""
    step = max(1, CENTRE_PIECE_ELEMENTS // max(Z.shape[1], 1))
    for a in range(0, Z.shape[0], step):
        P = Z[a:a + step]
        np.einsum("ij,ij->i", P, P, out=sq[a:a + step])
        if zw is not None:
            np.matmul(P, w, out=zw[a:a + step])
        if cz is not None:
            with np.errstate(invalid="ignore"):
                np.matmul(np.abs(P), weights, out=cz[a:a + step])
        P -= mean


def centre_rows_weighted(Z: np.ndarray, mean: np.ndarray, w: np.ndarray | None,
                         weights: np.ndarray):
    """:func:`centre_rows`, and in the same pass ``|z_t| . weights`` of each row before the
    centring (the certificate's cheap bound on the row's projection coefficients,
    :meth:`~ooc_spectral.core.rounding.FactorRounding.cheap_coefficients`).

    Returns
    -------
    sq, zw : as :func:`centre_rows`
    cz : ndarray of shape (c,)
    """
    c, m = Z.shape
    sq, cz = np.empty(c), np.empty(c)
    zw = None if w is None else np.empty(c)
    loops = numba_loops()
    if (loops is not None and c and m and mean.shape == (m,) and weights.shape == (m,)
            and (w is None or w.shape == (m,)) and np.all(np.isfinite(weights))
            and contiguous_float64(Z, mean, weights, *(() if w is None else (w,)),
                                   writeable=True)):
        if w is None:
            loops.centre_rows_c(Z, mean, weights, sq, cz)
        else:
            loops.centre_rows_wc(Z, mean, w, weights, sq, zw, cz)
        return sq, zw, cz
    _centre_pieces(Z, mean, w, sq, zw, weights, cz)
    return sq, zw, cz


def clip_unit_col_sums(S: np.ndarray, col_sums: np.ndarray) -> np.ndarray:
    """``S = min(S, 1)`` in place and ``col_sums += S``'s column sums.

    For kernel values ``exp(s)`` with ``s <= 0`` up to rounding:
    ``min(exp(s), 1) == exp(min(s, 0))`` for any ``exp`` that is monotone with
    ``exp(0) = 1``, so clipping after the exponentials gives the same block as
    clipping the exponent before them.

    Parameters
    ----------
    S : ndarray of shape (r, m)
        Kernel values of a piece, clipped in place.
    col_sums : ndarray of shape (m,)
        The sums of S's columns are added to it, in place.

    Returns
    -------
    S : ndarray of shape (r, m)
    """
    loops = numba_loops()
    if (loops is not None and S.ndim == 2 and S.size and col_sums.shape == (S.shape[1],)
            and contiguous_float64(S, col_sums, writeable=True)):
        loops.clip_unit_col_sums(S, col_sums)
        return S
    np.minimum(S, 1.0, out=S)
    col_sums += np.ones(S.shape[0]) @ S
    return S


def clip_unit_dot(S: np.ndarray, G: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = min(S, 1) @ G``.

    Compiled for at most :data:`DOT_MAX_COLUMNS` columns (G Fortran-ordered, out
    C-ordered): one pass over each row of S for up to four columns, where NumPy clips
    the block in one pass and multiplies in another (docs/measurements.md, "numba's
    one-pass loops").

    Parameters
    ----------
    S : ndarray of shape (r, m)
        Kernel values of a piece; may be clipped in place.
    G : ndarray of shape (m, p)
    out : ndarray of shape (r, p)
        Written in place.

    Returns
    -------
    out : ndarray of shape (r, p)
    """
    loops = numba_loops()
    if (loops is not None and S.ndim == 2 and 0 < G.shape[1] <= DOT_MAX_COLUMNS and S.size
            and out.shape == (S.shape[0], G.shape[1]) and G.shape[0] == S.shape[1]
            and contiguous_float64(S, G, out, orders="CFC", writeable=True)):
        loops.clip_unit_dot(S, G, out)
        return out
    np.minimum(S, 1.0, out=S)
    return np.matmul(S, G, out=out)


def nearest_reach(D: np.ndarray, x2: np.ndarray, K: int, reach: int, ratio: float):
    """Compiled, one pass over each row of ``D``: the ``reach`` smallest entries of each
    row (by value, then column), those past the ``K``-th that exceed the ``K``-th's
    ``near`` bound (``ratio^2 max(v_K + x2, 0) - x2``) dropped (value ``inf``, column 0),
    the rest ``max(v + x2, 0)``, each row sorted by that value then column: what
    :meth:`~ooc_spectral.core.representatives.Representatives.nearest` and
    ``neighbourhood`` compute with NumPy's calls (a partial sort over a threshold), bit
    for bit.

    Returns ``(columns, values)``, both ``(c, reach)``, or None where the compiled loops
    are not at hand (NumPy's calls then).
    """
    loops = numba_loops()
    c, m = D.shape
    if (loops is None or not 1 <= K <= reach <= m or not c
            or not contiguous_float64(D, x2) or x2.shape != (c,)):
        return None
    J = np.empty((c, reach), dtype=np.int64)
    V = np.empty((c, reach))
    loops.nearest_reach(D, x2, int(K), float(ratio) ** 2, J, V)
    return J, V


def grouped_reach(Y: np.ndarray, x2: np.ndarray, groups, K: int, reach: int, ratio: float,
                  prune: bool = True):
    """Compiled: what :func:`nearest_reach` gives for the distance block of the rows ``Y``
    (moved by the representatives' mean) and the representatives of ``groups`` (a
    :class:`~ooc_spectral.core.nearest.RepresentativeGroups`), from the representatives
    near enough only: a row visits the group of the smallest lower bound of its members'
    distances first (the triangle inequality over each group's centre and radius), then
    each other group whose bound is within that of what it keeps so far (the bounds are
    not sorted: after the first group the row's bound rarely moves). Each entry is computed by
    one fixed sequence of operations, so the result equals the unpruned search
    (``prune=False``) bit for bit; it equals :func:`nearest_reach` over NumPy's product to
    rounding (the same representatives wherever no two are within rounding of each other).

    Not gated by the block's size (:func:`accel_for`): a model's search takes one form
    for every block, so that a row gets the same values in the fit and in ``predict``.

    Returns ``(columns, values, visited)``: both ``(c, reach)``, and how many distances
    were computed; or None without numba's loops.
    """
    if not config_flag("ooc-spectral.numba", True) or _jit_disabled():
        return None
    loops = _loops()
    c = Y.shape[0]
    if loops is None or not 1 <= K <= reach <= groups.permutation.size:
        return None
    J = np.empty((c, reach), dtype=np.int64)
    V = np.empty((c, reach))
    visited = loops.grouped_reach(np.ascontiguousarray(Y, dtype=np.float64),
                        np.ascontiguousarray(x2, dtype=np.float64), groups.scaled, groups.norms,
                        groups.permutation, groups.starts, groups.centres_t, groups.radii, int(K),
                        float(ratio) ** 2, groups.max_norm, bool(prune), J, V)
    return J, V, int(visited)


def pair_sums(index: np.ndarray, scaled: np.ndarray, b: np.ndarray, m: int):
    """Compiled: ``cross[i, j] = sum_t sum_{a, c: index[t, a] = i, index[t, c] = j}
    scaled[t, a] b[t, c]`` (``m x m``) and ``degrees[i] = sum b[t, a]`` over
    ``index[t, a] = i``, each sum taken row by row, then ``a``, then ``c``: the order of
    NumPy's ``bincount`` over the flattened pairs, so the same values bit for bit, in one
    pass without the ``c K^2`` pairs' arrays.

    Returns ``(cross, degrees)``, or None where the compiled loops are not at hand.
    """
    loops = numba_loops()
    if loops is None or index.ndim != 2 or index.shape != scaled.shape or b.shape != index.shape:
        return None
    cross = np.zeros((m, m))
    degrees = np.zeros(m)
    loops.pair_sums(np.ascontiguousarray(index, dtype=np.int64),
                    np.ascontiguousarray(scaled, dtype=np.float64),
                    np.ascontiguousarray(b, dtype=np.float64), cross, degrees)
    return cross, degrees


def kmeans_plusplus(S: np.ndarray, m: int, first: int, rng: np.random.Generator):
    """Compiled: the rows of k-means++'s ``m`` seeds in ``S`` (``(n, d)``, moved by its
    mean; ``m <= n``), ``first`` the first, each next drawn by the next of ``m - 1``
    uniform draws of ``rng`` with probability proportional to the squared distance to
    the nearest seed so far (by differences, summed in feature order), the cumulative
    sum in row order as :func:`numpy.cumsum`'s; once every row sits on a seed, the draw
    picks among the rows not taken. One pass over ``S`` a seed, without the Python
    calls of :func:`~ooc_spectral.core.representative_selection.kmeans_plusplus`
    (whose values it gives to rounding), the GIL released.

    Returns the ``m`` row numbers, or None (``rng`` untouched) where the compiled loops
    are not at hand.
    """
    loops = numba_loops()
    n = S.shape[0]
    if loops is None or S.ndim != 2 or not 1 <= m <= n or not 0 <= first < n:
        return None
    chosen = np.empty(int(m), dtype=np.int64)
    loops.kmeans_plusplus(np.ascontiguousarray(S.T, dtype=np.float64), int(first),
                          rng.random(int(m) - 1), chosen)
    return chosen
