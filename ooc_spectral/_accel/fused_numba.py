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


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _place(vs, js, p, v, j):  # pragma: no cover - compiled
    """``(v, j)`` into place ``p`` or before it, the places ``< p`` sorted by value then
    number (an insertion sort's step; the places it passes move up one)."""
    while p > 0 and (vs[p - 1] > v or (vs[p - 1] == v and js[p - 1] > j)):
        vs[p] = vs[p - 1]
        js[p] = js[p - 1]
        p -= 1
    vs[p] = v
    js[p] = j


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _finish_row(vs, js, K, ratio2, xt, J, V):  # pragma: no cover - compiled
    """A row's ``reach`` smallest values ``v`` (sorted by value, then column): those past
    the ``K``-th above the ``near`` bound of the ``K``-th dropped (``inf``, column 0), the
    rest ``max(v + xt, 0)``, sorted by that value then column, into ``J`` and ``V``."""
    reach = vs.shape[0]
    near = ratio2 * max(vs[K - 1] + xt, 0.0) - xt
    for p in range(reach):
        if p >= K and vs[p] > near:
            vs[p] = np.inf
            js[p] = 0
        else:
            vs[p] = max(vs[p] + xt, 0.0)
    for p in range(1, reach):  # by distance, then by number
        _place(vs, js, p, vs[p], js[p])
    for p in range(reach):
        V[p] = vs[p]
        J[p] = js[p]


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
        _finish_row(vs, js, K, ratio2, x2[t], J[t], V[t])




@numba.njit(inline="always", nogil=True, boundscheck=False)
def _visit_group(y, a, b, A, r2, perm, acc, vs, js, filled):  # pragma: no cover - compiled
    """The entries ``v = |r|^2 - 2 y.r`` of the representatives ``a:b`` (in the groups'
    order) placed among the row's ``reach`` smallest; returns the places filled."""
    d = y.shape[0]
    reach = vs.shape[0]
    j = a
    while j + 3 < b:  # four entries at a time, each in k order
        s0 = r2[j]
        s1 = r2[j + 1]
        s2 = r2[j + 2]
        s3 = r2[j + 3]
        for k in range(d):
            yk = y[k]
            s0 += yk * A[j, k]
            s1 += yk * A[j + 1, k]
            s2 += yk * A[j + 2, k]
            s3 += yk * A[j + 3, k]
        acc[j] = s0
        acc[j + 1] = s1
        acc[j + 2] = s2
        acc[j + 3] = s3
        j += 4
    while j < b:
        s0 = r2[j]
        for k in range(d):
            s0 += y[k] * A[j, k]
        acc[j] = s0
        j += 1
    for j in range(a, b):
        v = acc[j]
        o = perm[j]
        if filled == reach:
            if v > vs[reach - 1] or (v == vs[reach - 1] and o > js[reach - 1]):
                continue
            p = reach - 1
        else:
            p = filled
            filled += 1
        _place(vs, js, p, v, o)
    return filled


# the distances by one fixed sequence of products and sums per entry (no fastmath: no
# reassociation, no fused multiply-adds), so that they do not depend on which groups a
# row visits: pruned = unpruned, bit for bit
@numba.njit("int64(float64[:, ::1], float64[::1], float64[:, ::1], float64[::1], int64[::1], "
            "int64[::1], float64[:, ::1], float64[::1], int64, float64, float64, boolean, "
            "int64[:, ::1], float64[:, ::1])",
            cache=True, nogil=True, boundscheck=False, error_model="numpy")
def grouped_reach(Y, x2, A, r2, perm, starts, centres_t, radii, K, ratio2, rmax, prune,
                  J, V):  # pragma: no cover - compiled
    c, d = Y.shape
    G = centres_t.shape[1]
    reach = J.shape[1]
    acc = np.empty(A.shape[0])
    lb = np.empty(G)
    vs = np.empty(reach)
    js = np.empty(reach, dtype=np.int64)
    visited = 0
    for t in range(c):
        y = Y[t]
        xt = x2[t]
        for g in range(G):  # |y - c_g|^2, feature by feature over all groups at once
            lb[g] = 0.0
        for k in range(d):
            yk = y[k]
            ck = centres_t[k]
            for g in range(G):
                z = yk - ck[g]
                lb[g] += z * z
        first = 0  # the group of the smallest bound, visited first
        for g in range(G):  # a lower bound of |y - r|^2 over the group's members
            low = np.sqrt(lb[g]) - radii[g]
            low = low * low if low > 0.0 else 0.0
            lb[g] = low
            if low < lb[first]:
                first = g
        scale = np.sqrt(xt) + rmax
        margin = 1e-9 * scale * scale  # far above the rounding of v and of the bounds
        visited += starts[first + 1] - starts[first]
        filled = _visit_group(y, starts[first], starts[first + 1], A, r2, perm, acc, vs, js, 0)
        for g in range(G):  # then the others within the bound, in their order
            if g == first:
                continue
            if prune and filled >= K:
                # a row's kept representatives are within the near bound of its K-th (which
                # only falls as more are seen), and among its `reach` nearest
                bound = ratio2 * max(vs[K - 1] + xt, 0.0) - xt
                if filled == reach and vs[reach - 1] < bound:
                    bound = vs[reach - 1]
                if lb[g] - xt > bound + margin:
                    continue  # every member beyond the bound
            visited += starts[g + 1] - starts[g]
            filled = _visit_group(y, starts[g], starts[g + 1], A, r2, perm, acc, vs, js, filled)
        for p in range(filled, reach):  # never kept: beyond the bound, dropped below
            vs[p] = np.inf
            js[p] = 0
        _finish_row(vs, js, K, ratio2, xt, J[t], V[t])
    return visited


# each sum in NumPy's bincount order (rows, then a, then c): no fastmath
@numba.njit("void(int64[:, ::1], float64[:, ::1], float64[:, ::1], float64[:, ::1], float64[::1])",
            cache=True, nogil=True, boundscheck=False)
def pair_sums(index, scaled, b, cross, degrees):  # pragma: no cover - compiled
    c, K = index.shape
    for t in range(c):
        for a in range(K):
            i = index[t, a]
            w = scaled[t, a]
            for q in range(K):
                cross[i, index[t, q]] += w * b[t, q]
    for t in range(c):
        for a in range(K):
            degrees[index[t, a]] += b[t, a]


# the squared distances by differences (the rows moved by their mean), each a sum in
# feature order; the cumulative sum in row order, as NumPy's: no fastmath
@numba.njit("void(float64[:, ::1], int64, float64[::1], int64[::1])",
            cache=True, nogil=True, boundscheck=False)
def kmeans_plusplus(ST, first, draws, chosen):  # pragma: no cover - compiled
    d, n = ST.shape
    m = chosen.shape[0]
    closest = np.zeros(n)
    dist = np.empty(n)
    cum = np.empty(n)
    taken = np.zeros(n, dtype=np.bool_)
    j = first
    for i in range(m):
        if i > 0:  # the next centre: drawn with probability proportional to `closest`
            total = 0.0
            for t in range(n):
                total += closest[t]
                cum[t] = total
            u = draws[i - 1]
            if total > 0.0:
                x = u * total
                lo = 0
                hi = n  # the first place whose cumulative sum exceeds x
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if cum[mid] > x:
                        hi = mid
                    else:
                        lo = mid + 1
                j = min(lo, n - 1)
                while closest[j] == 0.0:  # rounding at the top of the cumulative sum
                    j -= 1
            else:  # every row sits on a centre: one of the rows not taken yet
                r = min(int(u * (n - i)), n - i - 1)
                j = 0
                while taken[j] or r > 0:
                    if not taken[j]:
                        r -= 1
                    j += 1
        chosen[i] = j
        taken[j] = True
        for t in range(n):
            dist[t] = 0.0
        for k in range(d):
            c = ST[k, j]
            row = ST[k]
            for t in range(n):
                z = row[t] - c
                dist[t] += z * z
        if i == 0:
            for t in range(n):
                closest[t] = dist[t]
        else:
            for t in range(n):
                if dist[t] < closest[t]:
                    closest[t] = dist[t]
        closest[j] = 0.0
