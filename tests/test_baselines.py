"""The baselines against known answers.

- ExactKernelEmbedding: scikit-learn's KernelPCA (additive) and the dense
  eigenvectors of D^-1/2 K D^-1/2 (divisive); refuses n beyond its budget;
- NystromEmbedding with every row as a landmark equals the exact embedding;
  largest-diagonal picks the largest diagonal entries of the normalized kernel;
- GaussianProjectionEmbedding with enough columns equals the exact embedding,
  out of core on zarr input, whatever the chunking; kernel_matmul equals K @ V;
- the Metropolis chain's visit frequencies on a 6 x 6 kernel match the
  det-proportional probabilities; Efraimidis-Spirakis keys sample in
  proportion to the weights.
"""

from __future__ import annotations

import itertools
import os

import dask.array as da
import numpy as np
import pytest
from conftest import write_zarr
from scipy import stats
from sklearn.base import clone
from sklearn.decomposition import KernelPCA
from threadpoolctl import threadpool_limits

from ooc_spectral.baselines import (
    ExactKernelEmbedding,
    GaussianProjectionEmbedding,
    NystromEmbedding,
    efraimidis_spirakis_keys,
    kernel_matmul,
    metropolis_volume_sample,
)
from ooc_spectral.exceptions import (
    InvalidInputError,
    InvalidParameterError,
    NotFittedError,
)
from ooc_spectral.core.kernels import RBFKernel


@pytest.fixture(autouse=True, scope="module")
def one_blas_thread():
    """Small dense problems: one BLAS thread is fastest and immune to oversubscription."""
    with threadpool_limits(limits=1):
        yield

GAMMA = 0.05


def fix_signs(V):
    """The package's convention: the entry of largest magnitude of each column is positive."""
    big = np.argmax(np.abs(V), axis=0)
    return V * np.sign(V[big, np.arange(V.shape[1])])


@pytest.fixture(scope="module")
def roll(swiss_roll):
    X, _ = swiss_roll
    return X[:500], X[500:700]


@pytest.fixture(scope="module")
def smooth():
    """2-D points with a fast-decaying Gaussian-kernel spectrum (numerical rank < 40)."""
    X = np.random.default_rng(3).random((600, 2))
    return X, np.random.default_rng(4).random((80, 2))


@pytest.fixture(scope="module", params=["additive", "divisive"])
def exact(request, roll):
    Xtr, _ = roll
    return request.param, ExactKernelEmbedding(3, gamma=GAMMA, normalization=request.param).fit(Xtr)


# --------------------------------------------------------------------------- #
# exact
# --------------------------------------------------------------------------- #
def test_exact_additive_is_sklearn_kernel_pca(roll):
    Xtr, Xte = roll
    est = ExactKernelEmbedding(3, gamma=GAMMA).fit(Xtr)
    kp = KernelPCA(3, kernel="rbf", gamma=GAMMA, eigen_solver="dense").fit(Xtr)
    s = np.sign(np.sum(est.embedding_ * kp.transform(Xtr), axis=0))
    np.testing.assert_allclose(est.embedding_ * s, kp.transform(Xtr), rtol=0, atol=1e-10)
    np.testing.assert_allclose(est.eigenvalues_, kp.eigenvalues_, rtol=1e-12)
    np.testing.assert_allclose(est.transform(Xte) * s, kp.transform(Xte), rtol=0, atol=1e-10)


def test_exact_divisive_is_dense_normalized_eigenvectors(roll):
    Xtr, _ = roll
    K = RBFKernel(GAMMA)(Xtr)
    d = K.sum(axis=1)
    vals, vecs = np.linalg.eigh(K / np.sqrt(np.outer(d, d)))
    vals, vecs = vals[::-1][1:4], fix_signs(vecs[:, ::-1][:, 1:4])
    est = ExactKernelEmbedding(3, gamma=GAMMA, normalization="divisive").fit(Xtr)
    np.testing.assert_allclose(est.eigenvalues_, vals, rtol=1e-12)
    np.testing.assert_allclose(est.embedding_, vecs, rtol=0, atol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(est.embedding_, axis=0), 1.0, rtol=1e-12)


def test_exact_transform_of_training_rows_is_the_embedding(exact, roll):
    _, est = exact
    np.testing.assert_allclose(est.transform(roll[0]), est.embedding_, rtol=0, atol=1e-12)


def test_exact_refuses_n_beyond_its_budget_before_reading(tmp_path):
    X = np.zeros((3000, 2))
    X[-1, 0] = np.nan  # would fail if any row were read
    with pytest.raises(InvalidInputError) as info:
        ExactKernelEmbedding(2, gamma=1.0, memory_budget="64MiB").fit(X)
    msg = str(info.value)
    assert "memory_budget='64MiB'" in msg and "3000 x 3000" in msg
    assert "at most 2048 rows" in msg  # isqrt(64 MiB / 16 bytes)
    assert "GreedySpectralEmbedding" in msg and "NystromEmbedding" in msg


# --------------------------------------------------------------------------- #
# Nystrom
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("selection", ["uniform", "diagonal", "largest-diagonal"])
def test_nystrom_with_every_row_as_landmark_is_exact(exact, roll, selection):
    norm, ex = exact
    Xtr, Xte = roll
    ny = NystromEmbedding(3, n_landmarks=len(Xtr), selection=selection, gamma=GAMMA,
                          normalization=norm, degree_subset_size=len(Xtr), random_state=1).fit(Xtr)
    np.testing.assert_array_equal(ny.landmark_indices_, np.arange(len(Xtr)))
    np.testing.assert_allclose(ny.embedding_, ex.embedding_, rtol=0, atol=1e-10)
    np.testing.assert_allclose(ny.eigenvalues_, ex.eigenvalues_, rtol=1e-11)
    np.testing.assert_allclose(ny.transform(Xte), ex.transform(Xte), rtol=0, atol=1e-10)


def test_nystrom_on_a_subset_is_the_exact_method_on_that_subset(roll):
    """Williams & Seeger: the eigenvectors of m points, extended by the Nyström formula."""
    Xtr, Xte = roll
    ny = NystromEmbedding(2, n_landmarks=60, gamma=GAMMA, random_state=5).fit(Xtr)
    sub = ExactKernelEmbedding(2, gamma=GAMMA).fit(Xtr[ny.landmark_indices_])
    np.testing.assert_allclose(ny.embedding_, sub.transform(Xtr), rtol=0, atol=1e-10)
    np.testing.assert_allclose(ny.transform(Xte), sub.transform(Xte), rtol=0, atol=1e-10)
    np.testing.assert_allclose(ny.eigenvalues_, sub.eigenvalues_ * len(Xtr) / 60, rtol=1e-12)


def normalized_diagonal(X, gamma, normalization):
    K = RBFKernel(gamma)(X)
    if normalization == "additive":
        n = len(X)
        H = np.eye(n) - 1.0 / n
        return np.diag(H @ K @ H)
    d = K.sum(axis=1)
    return np.diag(K) / d


@pytest.mark.parametrize("normalization", ["additive", "divisive"])
def test_largest_diagonal_picks_the_largest_diagonal_entries(normalization):
    # a cloud with a density gradient, so the diagonal entries are distinct
    rng = np.random.default_rng(11)
    X = np.concatenate([rng.normal(0, 1, (300, 2)), rng.normal(0, 3, (100, 2))])
    diag = normalized_diagonal(X, 0.3, normalization)
    m = 25
    want = np.sort(np.argsort(-diag)[:m])
    assert diag[np.argsort(-diag)[m - 1]] > diag[np.argsort(-diag)[m]] * (1 + 1e-9)
    ny = NystromEmbedding(2, n_landmarks=m, selection="largest-diagonal", gamma=0.3,
                          normalization=normalization, degree_subset_size=len(X),
                          chunk_rows=64, random_state=0).fit(X)
    np.testing.assert_array_equal(ny.landmark_indices_, want)
    # the scores are the diagonal (divisive: up to the factor n of mean vs sum degrees)
    scale = 1.0 if normalization == "additive" else len(X)
    np.testing.assert_allclose(ny.selection_scores_, diag[want] * scale, rtol=1e-10)


def test_efraimidis_spirakis_keys_sample_in_proportion_to_weights():
    w = np.array([1.0, 2.0, 3.0, 4.0, 0.0])
    rng = np.random.default_rng(2)
    trials = 40000
    keys = efraimidis_spirakis_keys(np.broadcast_to(w, (trials, 5)), rng.random((trials, 5)))
    first = np.argmax(keys, axis=1)
    counts = np.bincount(first, minlength=5)
    assert counts[4] == 0  # zero weight: never sampled
    p = w[:4] / w.sum()
    chi2 = np.sum((counts[:4] - trials * p) ** 2 / (trials * p))
    assert stats.chi2.sf(chi2, 3) > 1e-3


@pytest.mark.parametrize("selection", ["uniform", "diagonal", "largest-diagonal", "volume"])
def test_nystrom_selection_does_not_depend_on_chunking(tmp_path, smooth, selection):
    X, _ = smooth
    z = write_zarr(tmp_path / "x.zarr", X, 70)
    a = NystromEmbedding(3, n_landmarks=20, selection=selection, gamma=1.0, random_state=4,
                         chunk_rows=140, n_steps=300).fit(z)
    b = NystromEmbedding(3, n_landmarks=20, selection=selection, gamma=1.0, random_state=4,
                         chunk_rows=512, n_steps=300).fit(X)
    np.testing.assert_array_equal(a.landmark_indices_, b.landmark_indices_)
    assert isinstance(a.embedding_, da.Array) and isinstance(b.embedding_, np.ndarray)
    np.testing.assert_allclose(a.embedding_.compute(), b.embedding_, rtol=0, atol=1e-12)


def test_volume_sampling_prefers_spread_out_landmarks():
    """det(G_I) is small when two landmarks nearly coincide: the chain avoids such pairs."""
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 4, (12, 2))
    X = np.repeat(centres, 30, axis=0) + rng.normal(0, 0.05, (360, 2))
    cluster = np.repeat(np.arange(12), 30)
    ny = NystromEmbedding(2, n_landmarks=12, selection="volume", gamma=1.0, normalization="divisive",
                          random_state=0).fit(X)
    uni = [len(set(cluster[NystromEmbedding(2, n_landmarks=12, gamma=1.0, random_state=s)
                       .fit(X).landmark_indices_])) for s in range(5)]
    assert len(set(cluster[ny.landmark_indices_])) == 12  # one landmark per cluster
    assert max(uni) < 12
    assert 0 < ny.acceptance_rate_ < 1


# --------------------------------------------------------------------------- #
# the Metropolis chain of Belabbas & Wolfe
# --------------------------------------------------------------------------- #
def test_metropolis_chain_visits_states_in_proportion_to_their_determinant():
    P = np.array([[0, 0], [0.3, 0], [1.5, 0.2], [0.2, 1.4], [1.6, 1.7], [3.0, 0.5]])
    G = RBFKernel(0.8)(P)  # 6 x 6; the pair (0, 1) is close, so subsets holding both are rare
    n, k = 6, 3
    states = list(itertools.combinations(range(n), k))
    det = np.array([np.linalg.det(G[np.ix_(s, s)]) for s in states])
    p = det / det.sum()
    assert p.max() / p.min() > 5
    # thinning from the exact transition matrix of the chain: |lambda_2|^thin < 1e-4, so the
    # recorded states are independent draws for all practical purposes
    index = {s: i for i, s in enumerate(states)}
    T = np.zeros((len(states), len(states)))
    for s in states:
        for pos in range(k):
            for j in sorted(set(range(n)) - set(s)):
                t = tuple(sorted(set(s) - {s[pos]} | {j}))
                T[index[s], index[t]] += min(1.0, det[index[t]] / det[index[s]]) / (k * (n - k))
        T[index[s], index[s]] = 1.0 - T[index[s]].sum()
    np.testing.assert_allclose(p @ T, p, atol=1e-15)  # det-proportional is stationary
    lam2 = np.sort(np.abs(np.linalg.eigvals(T)))[-2]
    thin = int(np.ceil(np.log(1e-4) / np.log(lam2)))
    draws = 6000

    def gram(a, b):
        return G[np.ix_(np.asarray(a), np.asarray(b))]

    _, info = metropolis_volume_sample(gram, n, k, draws * thin, random_state=1, thin=thin)
    trace = info["trace"]
    assert trace.shape == (draws, k)
    counts = np.array([np.sum(np.all(trace == np.array(s), axis=1)) for s in states])
    expected = draws * p
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert stats.chi2.sf(chi2, len(states) - 1) > 1e-3
    z = (counts - expected) / np.sqrt(expected * (1 - p))
    assert np.max(np.abs(z)) < 4.0
    # and the frequencies are far from uniform: the test can tell the difference
    uniform = np.full(len(states), draws / len(states))
    assert stats.chi2.sf(np.sum((counts - uniform) ** 2 / uniform), len(states) - 1) < 1e-50


def test_metropolis_chain_starts_from_a_pivoted_subset_when_the_random_one_is_singular():
    X = np.array([[0.0], [0.0], [1.0], [2.0], [3.0]])  # rows 0 and 1 coincide
    G = RBFKernel(1.0)(X)

    def gram(a, b):
        return G[np.ix_(np.asarray(a), np.asarray(b))]

    subset, _ = metropolis_volume_sample(gram, 5, 4, 0, init=[0, 1, 2, 3])
    assert len(set(subset.tolist()) & {0, 1}) == 1


# --------------------------------------------------------------------------- #
# Gaussian projection
# --------------------------------------------------------------------------- #
def test_kernel_matmul_equals_the_dense_product(smooth):
    X, Y = smooth
    V = np.random.default_rng(0).normal(size=(len(X), 5))
    K = RBFKernel(2.0)(Y, X)
    out = kernel_matmul(RBFKernel(2.0), da.from_array(Y, chunks=(30, 2)),
                        da.from_array(X, chunks=(128, 2)), da.from_array(V, chunks=(128, 5)))
    assert out.chunks[0] == (30, 30, 20)
    np.testing.assert_allclose(out.compute(), K @ V, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("normalization", ["additive", "divisive"])
def test_gaussian_projection_with_all_columns_is_exact(roll, normalization):
    Xtr, Xte = roll
    ex = ExactKernelEmbedding(3, gamma=GAMMA, normalization=normalization).fit(Xtr)
    k = 3 + (normalization == "divisive")
    gp = GaussianProjectionEmbedding(3, oversampling=len(Xtr) - k, power_iterations=0,
                                     gamma=GAMMA, normalization=normalization, chunk_rows=128,
                                     random_state=0).fit(Xtr)
    assert gp.n_columns_ == len(Xtr)
    np.testing.assert_allclose(gp.embedding_, ex.embedding_, rtol=0, atol=1e-9)
    np.testing.assert_allclose(gp.eigenvalues_, ex.eigenvalues_, rtol=1e-10)
    np.testing.assert_allclose(gp.transform(Xte), ex.transform(Xte), rtol=0, atol=1e-9)


@pytest.mark.parametrize("normalization", ["additive", "divisive"])
def test_gaussian_projection_with_enough_columns_is_exact_out_of_core(tmp_path, smooth, normalization):
    """40 columns and 3 power iterations capture a kernel of numerical rank below 40."""
    X, Xte = smooth
    ex = ExactKernelEmbedding(3, gamma=1.0, normalization=normalization).fit(X)
    k = 3 + (normalization == "divisive")
    params = dict(oversampling=40 - k, power_iterations=3, gamma=1.0,
                  normalization=normalization, random_state=0)
    z = write_zarr(tmp_path / "x.zarr", X, 100)
    gp = GaussianProjectionEmbedding(3, chunk_rows=200, workdir=tmp_path / "work", **params).fit(z)
    assert isinstance(gp.embedding_, da.Array)
    assert (tmp_path / "work" / "U.zarr").exists()  # the n x l factors live on disk
    np.testing.assert_allclose(gp.embedding_.compute(), ex.embedding_, rtol=0, atol=1e-9)
    np.testing.assert_allclose(gp.eigenvalues_, ex.eigenvalues_, rtol=1e-9)
    np.testing.assert_allclose(gp.transform(Xte), ex.transform(Xte), rtol=0, atol=1e-9)
    # Omega is drawn per fixed window of rows: another chunking gives the same result
    other = GaussianProjectionEmbedding(3, chunk_rows=256, **params).fit(
        da.from_array(X, chunks=(128, 2)))
    np.testing.assert_allclose(other.embedding_.compute(), gp.embedding_.compute(),
                               rtol=0, atol=1e-12)
    assert gp.n_passes_ == 5


def test_gaussian_projection_lazy_embedding_outlives_the_estimator_and_fails_loudly_when_gone(
        tmp_path, smooth, client):
    """The lazy ``embedding_`` of an out-of-core fit reads from the estimator's temporary
    directory: it keeps the directory alive (the estimator's garbage collection once
    deleted it, and zarr then read its fill value: zeros), also through a cluster; a
    ``workdir`` deleted under it raises instead."""
    import gc
    import shutil

    X, _ = smooth
    z = write_zarr(tmp_path / "x.zarr", X, 100)
    params = dict(oversampling=10, power_iterations=1, gamma=1.0, random_state=0, chunk_rows=200)
    gp = GaussianProjectionEmbedding(3, **params).fit(z)
    expected = gp.embedding_.compute()
    emb, scratch = gp.embedding_, gp._scratch.path
    del gp
    gc.collect()
    assert np.abs(expected).max() > 0.01
    np.testing.assert_array_equal(client.compute(emb).result(), expected)  # through the cluster
    del emb
    gc.collect()
    assert not os.path.exists(scratch)  # and removed with the last array that reads it

    gp = GaussianProjectionEmbedding(3, workdir=tmp_path / "work", **params).fit(z)
    shutil.rmtree(tmp_path / "work")
    with pytest.raises(FileNotFoundError, match="intermediate array .* is gone"):
        gp.embedding_.compute()


def test_gaussian_projection_with_few_columns_and_no_power_iteration_is_only_approximate(roll):
    Xtr, _ = roll
    ex = ExactKernelEmbedding(3, gamma=GAMMA).fit(Xtr)
    gp = GaussianProjectionEmbedding(3, oversampling=7, power_iterations=0, gamma=GAMMA,
                                     random_state=0).fit(Xtr)
    gap = np.max(np.abs(gp.embedding_ - ex.embedding_)) / np.max(np.abs(ex.embedding_))
    assert gap > 1e-2
    # Ritz values never exceed the true eigenvalues
    assert np.all(gp.eigenvalues_ <= ex.eigenvalues_ * (1 + 1e-12))


# --------------------------------------------------------------------------- #
# estimator conventions and errors
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("cls", [ExactKernelEmbedding, NystromEmbedding, GaussianProjectionEmbedding])
def test_scikit_learn_conventions(cls, roll):
    est = cls(2, gamma=0.1, random_state=0)
    params = est.get_params()
    assert params["n_components"] == 2 and params["gamma"] == 0.1
    c = clone(est).set_params(n_components=3)
    assert c.n_components == 3 and est.n_components == 2
    with pytest.raises(NotFittedError, match="fit"):
        est.transform(roll[1])
    fitted = cls(2, gamma=GAMMA, random_state=0).fit(roll[0])
    with pytest.raises(InvalidInputError, match="3 features"):
        fitted.transform(np.zeros((4, 2)))


@pytest.mark.parametrize("est, match", [
    (NystromEmbedding(2, n_landmarks=2), "n_components=2 is not below n_landmarks=2"),
    (NystromEmbedding(2, n_landmarks=1000), "exceeds the 500 rows"),
    (NystromEmbedding(2, selection="kmeans"), "selection='kmeans'"),
    (NystromEmbedding(2, n_landmarks=10, selection="volume", sample_size=10), "candidate rows"),
    (GaussianProjectionEmbedding(2, oversampling=-1), "oversampling=-1"),
    # more columns than rows are clamped to the rows (issue 38); more eigenvectors are not
    (GaussianProjectionEmbedding(600), "X has 500 rows"),
    (ExactKernelEmbedding(2, normalization="laplacian"), "normalization='laplacian'"),
    (ExactKernelEmbedding(0), "n_components=0"),
    (ExactKernelEmbedding(2, gamma=-1.0), "gamma=-1.0"),
])
def test_invalid_parameters_are_reported(roll, est, match):
    with pytest.raises(InvalidParameterError, match=match):
        est.fit(roll[0])


def test_gaussian_projection_columns_clamped_to_the_rows(roll):
    # issue 38: n_components + oversampling beyond the rows spans every direction already
    X = roll[0][:60]
    gp = GaussianProjectionEmbedding(2, oversampling=600, power_iterations=0, gamma=1.0,
                                     random_state=0).fit(X)
    assert gp.n_columns_ == 60
    exact = ExactKernelEmbedding(2, gamma=1.0).fit(X)
    np.testing.assert_allclose(gp.eigenvalues_, exact.eigenvalues_, rtol=1e-8)
