"""Prototype (phase 1 of issue 39): spectral clustering on the bipartite graph of rows
and their K nearest representatives (transfer cut), in the shape of the out-of-core passes."""
from __future__ import annotations

import time

import numpy as np
import scipy.linalg as sl
from sklearn.cluster import KMeans, MiniBatchKMeans


def sample_rows(n, size, seed):
    rng = np.random.default_rng(seed)
    if size >= n:
        return np.arange(n)
    return np.sort(rng.choice(n, size, replace=False))


def representatives(X, m, seed, factor=10, method="kmeans", max_iter=20, n_init=1):
    rows = sample_rows(X.shape[0], factor * m, seed)
    S = np.asarray(X[rows], dtype=np.float64)
    m = min(m, S.shape[0])
    if method == "random":
        return S[np.random.default_rng(seed + 1).choice(S.shape[0], m, replace=False)]
    if method == "lloyd":
        return lloyd(S, m, max_iter, seed)
    if method == "pp":
        return lloyd(S, m, max_iter, seed, init=kpp(S, m, seed, 1))
    if method == "pp3":
        return lloyd(S, m, max_iter, seed, init=kpp(S, m, seed, 3))
    if method == "minibatch":
        km = MiniBatchKMeans(m, random_state=seed, n_init=n_init, max_iter=max_iter,
                             batch_size=4096).fit(S)
    else:
        km = KMeans(m, random_state=seed, n_init=n_init, max_iter=max_iter, init="k-means++").fit(S)
    C = km.cluster_centers_
    # drop empty centres? KMeans keeps them; fine
    return np.ascontiguousarray(C)


def kpp(S, m, seed, trials=1):
    """k-means++ seeding (greedy with `trials` candidates per centre)."""
    rng = np.random.default_rng(seed + 5)
    n = S.shape[0]
    s2 = np.einsum("ij,ij->i", S, S)
    C = np.empty((m, S.shape[1]))
    first = rng.integers(n)
    C[0] = S[first]
    closest = np.maximum(s2 - 2 * S @ S[first] + s2[first], 0)
    for i in range(1, m):
        tot = closest.sum()
        if tot <= 0:
            cand = rng.integers(n, size=trials)
        else:
            cand = np.searchsorted(np.cumsum(closest), rng.random(trials) * tot)
            cand = np.minimum(cand, n - 1)
        d = np.maximum(s2[None, :] - 2 * S[cand] @ S.T + s2[cand][:, None], 0)
        np.minimum(d, closest[None, :], out=d)
        best = int(np.argmin(d.sum(axis=1)))
        C[i] = S[cand[best]]
        closest = d[best]
    return C


def lloyd(S, m, iters, seed, init=None):
    """Lloyd iterations (stop when no assignment changes); empty centres keep their place."""
    import scipy.sparse as sp
    rng = np.random.default_rng(seed + 1)
    C = S[rng.choice(S.shape[0], m, replace=False)].copy() if init is None else init.copy()
    n = S.shape[0]
    lab = None
    for _ in range(iters):
        d2 = S @ C.T
        d2 *= -2.0
        d2 += np.einsum("ij,ij->i", C, C)[None, :]
        new = np.argmin(d2, axis=1)
        if lab is not None and np.array_equal(new, lab):
            break
        lab = new
        onehot = sp.csr_matrix((np.ones(n), (lab, np.arange(n))), shape=(m, n))
        cnt = np.bincount(lab, minlength=m)
        sums = onehot @ S
        filled = cnt > 0
        C[filled] = sums[filled] / cnt[filled, None]
    return np.ascontiguousarray(C)


def nearest(Xb, R, r2, K, block=4096):
    """Indices (c x K) and squared distances of the K nearest representatives."""
    c = Xb.shape[0]
    idx = np.empty((c, K), dtype=np.int64)
    d2o = np.empty((c, K))
    for a in range(0, c, block):
        x = Xb[a:a + block]
        d2 = x @ R.T
        d2 *= -2.0
        d2 += r2[None, :]
        d2 += np.einsum("ij,ij->i", x, x)[:, None]
        np.maximum(d2, 0.0, out=d2)
        j = np.argpartition(d2, K - 1, axis=1)[:, :K] if K < R.shape[0] else np.broadcast_to(np.arange(R.shape[0]), d2.shape).copy()
        dj = np.take_along_axis(d2, j, axis=1)
        o = np.argsort(dj, axis=1, kind="stable")
        idx[a:a + block] = np.take_along_axis(j, o, axis=1)
        d2o[a:a + block] = np.take_along_axis(dj, o, axis=1)
    return idx, d2o


def weights(d2, sigma):
    """Row-shifted Gaussian weights w' and the per-row scale s (B row = s * w')."""
    if isinstance(sigma, str) or (isinstance(sigma, tuple)):
        mode, scale = sigma if isinstance(sigma, tuple) else (sigma, 1.0)
        d = np.sqrt(d2)
        if mode == "binary":
            return np.ones_like(d2), np.ones(d2.shape[0])
        if mode == "rowmean":
            st = scale * d.mean(axis=1, keepdims=True)
        elif mode == "rowkth":
            st = scale * d[:, -1:]
        elif mode == "rowfirst":
            st = scale * np.maximum(d[:, :1], 1e-300)
        st = np.maximum(st, 1e-300)
        return np.exp(-d2 / (2.0 * st * st)), np.ones(d2.shape[0])
    d2min = d2[:, :1]
    w = np.exp(-(d2 - d2min) / (2.0 * sigma * sigma))
    s = np.exp(-d2min[:, 0] / (2.0 * sigma * sigma))
    return w, s


def chunk_stats(Xb, R, r2, K, sigma):
    m = R.shape[0]
    idx, d2 = nearest(Xb, R, r2, K)
    w, s = weights(d2, sigma)
    wsum = w.sum(axis=1)
    # E += sum_t s_t w_t w_t' / sum(w_t) ; Dy += sum_t s_t w_t
    coef = (s / wsum)
    pair = (idx[:, :, None] * m + idx[:, None, :]).ravel()
    val = (coef[:, None, None] * w[:, :, None] * w[:, None, :]).ravel()
    E = np.bincount(pair, weights=val, minlength=m * m).reshape(m, m)
    Dy = np.bincount(idx.ravel(), weights=(s[:, None] * w).ravel(), minlength=m)
    return E, Dy


def solve(E, Dy, k):
    m = E.shape[0]
    dinv = 1.0 / np.sqrt(np.where(Dy > 0, Dy, np.inf))
    S = dinv[:, None] * E * dinv[None, :]
    S = 0.5 * (S + S.T)
    if True:  # eigsh (ARPACK) misses copies of a repeated eigenvalue 1 (a graph in pieces)
        mu, V = sl.eigh(S, subset_by_index=[m - k, m - 1])
    else:
        import scipy.sparse as sp
        import scipy.sparse.linalg as sla
        v0 = np.random.default_rng(0).random(m) + 0.5
        mu, V = sla.eigsh(sp.csr_matrix(S), k=k, which="LA", v0=v0)
        o = np.argsort(mu); mu, V = mu[o], V[:, o]
    mu, V = mu[::-1], V[:, ::-1]
    mu = np.maximum(mu, 1e-300)
    Map = dinv[:, None] * V / np.sqrt(mu)[None, :]   # v / sqrt(mu)
    return mu, Map


def chunk_embed(Xb, R, r2, K, sigma, Map):
    idx, d2 = nearest(Xb, R, r2, K)
    w, _ = weights(d2, sigma)
    w /= w.sum(axis=1, keepdims=True)
    return np.einsum("ck,ckp->cp", w, Map[idx])


def unit(E):
    n = np.linalg.norm(E, axis=1, keepdims=True)
    n[n == 0] = 1
    return E / n


class RepSC:
    def __init__(self, k, m=1000, K=5, factor=10, method="pp", rep_iter=10, sigma_scale=1.0,
                 normalize=True, sigma_mode="rowmean", drop_first=False, n_comp=None, sigma_sample=20000, kmeans_sample=100000,
                 n_init=10, chunk=20000, seed=0):
        self.__dict__.update(locals()); del self.__dict__["self"]

    def fit(self, X):
        t0 = time.perf_counter(); times = {}
        X = np.asarray(X, dtype=np.float64)
        n = X.shape[0]
        R = representatives(X, min(self.m, -(-n // 2)), self.seed, self.factor, self.method, self.rep_iter)
        r2 = np.einsum("ij,ij->i", R, R)
        K = min(self.K, R.shape[0])
        times["reps"] = time.perf_counter() - t0
        if self.sigma_mode != "global":
            sigma = (self.sigma_mode, self.sigma_scale)
        else:
            rows = sample_rows(n, self.sigma_sample, self.seed + 2)
            _, d2 = nearest(X[rows], R, r2, K)
            sigma = self.sigma_scale * np.sqrt(d2).mean()
        m = R.shape[0]
        E = np.zeros((m, m)); Dy = np.zeros(m)
        for a in range(0, n, self.chunk):
            e, d = chunk_stats(X[a:a + self.chunk], R, r2, K, sigma)
            E += e; Dy += d
        times["pass2"] = time.perf_counter() - t0 - times["reps"]
        p = self.n_comp or self.k
        if isinstance(p, float):
            p = int(np.ceil(p * self.k))
        t2 = time.perf_counter()
        mu, Map = solve(E, Dy, p + (1 if self.drop_first else 0))
        times["solve"] = time.perf_counter() - t2
        if self.drop_first:
            mu, Map = mu[1:], Map[:, 1:]
        self.R, self.r2, self.sigma, self.Map, self.mu, self.Kn = R, r2, sigma, Map, mu, K
        emb = np.concatenate([chunk_embed(X[a:a + self.chunk], R, r2, K, sigma, Map)
                              for a in range(0, n, self.chunk)])
        if self.normalize:
            emb = unit(emb)
        t1 = time.perf_counter()
        times["embed"] = t1 - t2 - times["solve"]
        srows = sample_rows(n, self.kmeans_sample, self.seed + 3)
        km = KMeans(self.k, n_init=self.n_init, random_state=self.seed).fit(emb[srows])
        self.centers = km.cluster_centers_
        self.labels_ = km.predict(emb)
        times["kmeans"] = time.perf_counter() - t1
        self.embedding_ = emb
        times["total"] = time.perf_counter() - t0
        self.times = times
        return self


def dense_bipartite_check(seed=0):
    """Transfer cut embedding == row part of the dense bipartite graph's generalized eigenvectors."""
    from sklearn.datasets import make_blobs
    X, _ = make_blobs(300, centers=3, random_state=seed)
    m, K = 40, 4
    R = representatives(X, m, seed)
    r2 = np.einsum("ij,ij->i", R, R)
    _, d2 = nearest(X, R, r2, K)
    sigma = np.sqrt(d2).mean()
    E, Dy = chunk_stats(X, R, r2, K, sigma)
    k = 4
    mu, Map = solve(E, Dy, k)
    U = chunk_embed(X, R, r2, K, sigma, Map)
    # dense bipartite
    idx, d2 = nearest(X, R, r2, K)
    B = np.zeros((X.shape[0], m))
    np.put_along_axis(B, idx, np.exp(-d2 / (2 * sigma ** 2)), axis=1)
    n = X.shape[0]
    W = np.zeros((n + m, n + m)); W[:n, n:] = B; W[n:, :n] = B.T
    D = W.sum(1)
    Ln = np.eye(n + m) - W / np.sqrt(D)[:, None] / np.sqrt(D)[None, :]
    lam, F = np.linalg.eigh(Ln)
    F = F[:, :k] / np.sqrt(D)[:, None]           # generalized eigenvectors f = D^-1/2 g
    print("bipartite lambda", lam[:k], "transfer 1-sqrt(mu)", 1 - np.sqrt(mu))
    # compare per column up to sign and scale: u from Tcut vs f[:n]
    for j in range(k):
        f = F[:n, j]
        c = (f @ U[:, j]) / (U[:, j] @ U[:, j])
        print(j, "rel err", np.linalg.norm(f - c * U[:, j]) / np.linalg.norm(f))


if __name__ == "__main__":
    dense_bipartite_check()
