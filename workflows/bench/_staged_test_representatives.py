"""Staged tests of the representatives' numerics (phase 1 of issue 39)."""
import importlib.util
import pathlib

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location(
    "_staged", pathlib.Path(__file__).with_name("_staged_core_representatives.py"))
R = importlib.util.module_from_spec(_spec)
import sys; sys.modules["_staged"] = R
_spec.loader.exec_module(R)


def _blobs(n=300, seed=0):
    from sklearn.datasets import make_blobs
    X, _ = make_blobs(n, centers=3, random_state=seed)
    return X


def test_transfer_cut_equals_the_dense_bipartite_embedding():
    X = _blobs()
    reps = R.Representatives(R.select_representatives(X, 40, seed=0), 4)
    sums = R.chunk_bipartite(X, reps)
    k = 5
    tmap = R.solve_transfer_cut(sums, reps, k)
    U = tmap.embed(X)
    index, b = reps.weights(X)
    n, m = X.shape[0], reps.size
    B = np.zeros((n, m))
    np.put_along_axis(B, index, b, axis=1)
    W = np.zeros((n + m, n + m))
    W[:n, n:] = B
    W[n:, :n] = B.T
    D = W.sum(axis=1)
    lam, G = np.linalg.eigh(np.eye(n + m) - W / np.sqrt(np.outer(D, D)))
    F = G[:, :k] / np.sqrt(D)[:, None]  # f' D f = 1
    np.testing.assert_allclose(lam[:k], 1 - np.sqrt(tmap.eigenvalues), atol=1e-12)
    for j in range(k):
        f = np.sqrt(2) * F[:n, j]
        f *= np.sign(f @ U[:, j])
        np.testing.assert_allclose(U[:, j], f, atol=1e-10 * np.abs(f).max())


def test_sub_blocks_and_chunks_sum_to_the_same_statistic():
    X = _blobs(1000)
    reps = R.Representatives(R.select_representatives(X, 60, seed=1), 5)
    whole = R.chunk_bipartite(X, reps)
    parts = R.chunk_bipartite(X[:333], reps, block_rows=100).combine(
        R.chunk_bipartite(X[333:], reps, 333, block_rows=70))
    assert whole.n == parts.n == 1000
    np.testing.assert_allclose(parts.cross, whole.cross, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(parts.degrees, whole.degrees, rtol=1e-12)
    np.testing.assert_allclose(whole.cross.sum(axis=1), whole.degrees, rtol=1e-12)  # E 1 = D_Y 1


@pytest.mark.parametrize("d", [3, 12])  # the k-d tree, the blocked products
def test_nearest_matches_brute_force_far_from_the_origin(d):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((500, d)) + 1e4
    P = rng.standard_normal((80, d)) + 1e4
    reps = R.Representatives(P, 6)
    index, d2 = reps.nearest(X)
    full = ((X[:, None, :] - P[None, :, :]) ** 2).sum(-1)
    ref = np.argsort(full, axis=1, kind="stable")[:, :6]
    np.testing.assert_array_equal(index, ref)
    np.testing.assert_allclose(d2, np.take_along_axis(full, ref, axis=1), rtol=1e-8)


def test_select_representatives_is_seeded_and_drops_duplicates():
    X = np.repeat(np.arange(10.0)[:, None], 5, axis=0)  # 10 distinct rows, 5 copies each
    C = R.select_representatives(X, 30, seed=3)
    assert C.shape == (10, 1)
    np.testing.assert_array_equal(np.sort(C[:, 0]), np.arange(10.0))
    Y = _blobs(400)
    np.testing.assert_array_equal(R.select_representatives(Y, 50, 7), R.select_representatives(Y, 50, 7))
