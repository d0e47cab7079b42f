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
