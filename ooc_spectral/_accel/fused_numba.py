"""The compiled loops of :mod:`ooc_spectral._accel.fused` (imported by it on first use, never
directly: importing this module imports numba and compiles or loads the loops).

Each loop is compiled once per process for C-contiguous float64 arrays (explicit
signatures), cached on disk by numba (``cache=True``), and releases the GIL
(``nogil=True``) so that the task threads of one process run them side by side.
``fastmath`` allows only reassociation (the row sums are vectorized, summed in
another order than NumPy's: the same to rounding) and fused multiply-adds.
"""

from __future__ import annotations

import numba
import numpy as np

_FLAGS = {"fastmath": {"reassoc", "contract"}, "cache": True, "nogil": True,
          "boundscheck": False, "error_model": "numpy"}


@numba.njit("void(float64[:, ::1], float64[::1], float64[::1], float64[::1], float64[::1])",
            **_FLAGS)
def centre_rows_w(Z, mean, w, sq, zw):  # pragma: no cover - compiled
    c, m = Z.shape
    for t in range(c):
        s = 0.0
        p = 0.0
        for j in range(m):
            v = Z[t, j]
            s += v * v
            p += v * w[j]
            Z[t, j] = v - mean[j]
        sq[t] = s
        zw[t] = p


@numba.njit("void(float64[:, ::1], float64[::1], float64[::1], float64[::1], float64[::1], "
            "float64[::1], float64[::1])", **_FLAGS)
def centre_rows_wc(Z, mean, w, cw, sq, zw, cz):  # pragma: no cover - compiled
    c, m = Z.shape
    for t in range(c):
        s = 0.0
        p = 0.0
        a = 0.0
        for j in range(m):
            v = Z[t, j]
            s += v * v
            p += v * w[j]
            a += abs(v) * cw[j]
            Z[t, j] = v - mean[j]
        sq[t] = s
        zw[t] = p
        cz[t] = a


@numba.njit("void(float64[:, ::1], float64[::1], float64[::1], float64[::1], float64[::1])",
            **_FLAGS)
def centre_rows_c(Z, mean, cw, sq, cz):  # pragma: no cover - compiled
    c, m = Z.shape
    for t in range(c):
        s = 0.0
        a = 0.0
        for j in range(m):
            v = Z[t, j]
            s += v * v
            a += abs(v) * cw[j]
            Z[t, j] = v - mean[j]
        sq[t] = s
        cz[t] = a


@numba.njit("void(float64[:, ::1], float64[::1], float64[::1])", **_FLAGS)
def centre_rows(Z, mean, sq):  # pragma: no cover - compiled
    c, m = Z.shape
    for t in range(c):
        s = 0.0
        for j in range(m):
            v = Z[t, j]
            s += v * v
            Z[t, j] = v - mean[j]
        sq[t] = s


@numba.njit("void(float64[:, ::1], float64[::1])", **_FLAGS)
def clip_unit_col_sums(S, col_sums):  # pragma: no cover - compiled
    r, m = S.shape
    for t in range(r):
        for j in range(m):
            v = S[t, j]
            if v > 1.0:
                v = 1.0
            S[t, j] = v
            col_sums[j] += v


@numba.njit(["void(float64[:, ::1], float64[::1, :], float64[:, ::1])",
             "void(float64[:, ::1], float64[:, ::1], float64[:, ::1])"],  # one column: C and F
            **_FLAGS)
def clip_unit_dot(S, G, out):  # pragma: no cover - compiled
    # four columns of G at a time (one pass over the row for four sums), then two, then one,
    # rather than one pass per column (docs/measurements.md, "numba's one-pass loops")
    r, m = S.shape
    p = G.shape[1]
    for t in range(r):
        q = 0
        while q + 3 < p:
            a0 = 0.0
            a1 = 0.0
            a2 = 0.0
            a3 = 0.0
            for j in range(m):
                v = min(S[t, j], 1.0)
                a0 += v * G[j, q]
                a1 += v * G[j, q + 1]
                a2 += v * G[j, q + 2]
                a3 += v * G[j, q + 3]
            out[t, q] = a0
            out[t, q + 1] = a1
            out[t, q + 2] = a2
            out[t, q + 3] = a3
            q += 4
        while q + 1 < p:
            a0 = 0.0
            a1 = 0.0
            for j in range(m):
                v = min(S[t, j], 1.0)
                a0 += v * G[j, q]
                a1 += v * G[j, q + 1]
            out[t, q] = a0
            out[t, q + 1] = a1
            q += 2
        if q < p:
            a0 = 0.0
            for j in range(m):
                a0 += min(S[t, j], 1.0) * G[j, q]
            out[t, q] = a0


# exact comparisons and sums only: no fastmath, so that the selection and the distances
# are NumPy's bit for bit
@numba.njit("void(float64[:, ::1], float64[::1], int64, float64, int64[:, ::1], float64[:, ::1])",
            cache=True, nogil=True, boundscheck=False)
def nearest_reach(D, x2, K, ratio2, J, V):  # pragma: no cover - compiled
    c, m = D.shape
    reach = J.shape[1]
    q = m // reach
    vs = np.empty(reach)  # the row's places, in the core's first-level cache
    js = np.empty(reach, dtype=np.int64)
    for t in range(c):
        row = D[t]
        # the largest of the minima of `reach` disjoint blocks of columns bounds the
        # reach-th smallest entry: only the entries up to it are placed, and once every
        # place is filled, only those below the last place
        tau = -np.inf
        for b in range(reach):
            low = row[b * q]
            for j in range(b * q + 1, (b + 1) * q):
                v = row[j]
                low = v if v < low else low
            tau = low if low > tau else tau
        filled = 0
        for j in range(m):  # columns ascending: a tie keeps the lower column first
            v = row[j]
            if v > tau:
                continue
            if filled == reach:
                if not v < vs[reach - 1]:
                    continue
                p = reach - 1
            else:
                p = filled
                filled += 1
            while p > 0 and vs[p - 1] > v:
                vs[p] = vs[p - 1]
                js[p] = js[p - 1]
                p -= 1
            vs[p] = v
            js[p] = j
            if filled == reach:
                tau = vs[reach - 1]
        xt = x2[t]
        near = ratio2 * max(vs[K - 1] + xt, 0.0) - xt
        for p in range(reach):
            if p >= K and vs[p] > near:
                vs[p] = np.inf
                js[p] = 0
            else:
                vs[p] = max(vs[p] + xt, 0.0)
        for p in range(1, reach):  # by distance, then by number
            v = vs[p]
            j = js[p]
            i = p
            while i > 0 and (vs[i - 1] > v or (vs[i - 1] == v and js[i - 1] > j)):
                vs[i] = vs[i - 1]
                js[i] = js[i - 1]
                i -= 1
            vs[i] = v
            js[i] = j
        for p in range(reach):
            V[t, p] = vs[p]
            J[t, p] = js[p]
