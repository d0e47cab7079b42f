"""The evaluation measures against known answers.

- alignment recovers an affine map exactly; the error and its 95% CI follow
  their formulas;
- the section 5 protocol: disjoint seeded splits, a reference equal to the
  exact unit eigenvectors of D2 U D3, and a greedy dictionary at tiny tol
  scoring exactly as the full Gram matrix;
- kernel reconstruction error: zero at full rank, and the best rank-p error
  computed densely at rank p;
- clustering, threshold and SVM scores on cases whose answer is known.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import write_zarr
from threadpoolctl import threadpool_limits

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.baselines import ExactKernelEmbedding
from ooc_spectral.experiments.evaluation import (
    Z95,
    ErrorEstimate,
    Protocol,
    align,
    clustering_ari,
    generalization_error,
    kernel_reconstruction_error,
    paired_difference,
    reference_embedding,
    split_indices,
    svm_accuracy,
    threshold_accuracy,
)
from ooc_spectral.exceptions import InvalidInputError, InvalidParameterError
from ooc_spectral.core.kernels import RBFKernel


@pytest.fixture(autouse=True, scope="module")
def one_blas_thread():
    """Small dense problems: one BLAS thread is fastest and immune to oversubscription."""
    with threadpool_limits(limits=1):
        yield


def test_align_recovers_an_affine_map_exactly():
    rng = np.random.default_rng(0)
    R = rng.normal(size=(200, 3))
    A = rng.normal(size=(3, 3))
    E = R @ A + np.array([1.0, -2.0, 0.5])  # any invertible affine image of R
    aligned, B = align(E, R)
    np.testing.assert_allclose(aligned, R, atol=1e-12)
    np.testing.assert_allclose(B[:3], np.linalg.inv(A), atol=1e-10)
    assert generalization_error(E, R).mean < 1e-25


def test_generalization_error_is_the_mean_squared_residual_with_its_ci():
    rng = np.random.default_rng(1)
    R = rng.normal(size=(400, 2))
    noise = rng.normal(scale=0.1, size=(400, 2))
    E = 2.0 * R + noise
    err = generalization_error(E, R)
    # by hand: regress R on [E, 1], average the squared residuals over coordinates
    A = np.column_stack([E, np.ones(400)])
    resid = R - A @ np.linalg.lstsq(A, R, rcond=None)[0]
    per_point = np.mean(resid**2, axis=1)
    assert err.mean == pytest.approx(per_point.mean(), rel=1e-12)
    assert err.ci95 == pytest.approx(Z95 * per_point.std(ddof=1) / np.sqrt(400), rel=1e-12)
    assert err.n == 400 and err.low < err.mean < err.high


def test_error_estimate_of_known_values():
    e = ErrorEstimate.of([1.0, 2.0, 3.0, 4.0])
    assert e.mean == 2.5
    assert e.ci95 == pytest.approx(1.959963984540054 * np.std([1, 2, 3, 4], ddof=1) / 2)
    assert str(e) == "2.5 ± 1.3"


def test_align_refuses_mismatched_shapes():
    with pytest.raises(InvalidInputError, match="same rows"):
        align(np.zeros((5, 2)), np.zeros((4, 2)))


def test_split_indices_are_disjoint_seeded_and_sized():
    a = split_indices(100, (30, 40, 20), random_state=3)
    b = split_indices(100, (30, 40, 20), random_state=3)
    assert [len(p) for p in a] == [30, 40, 20]
    assert len(set(np.concatenate(a).tolist())) == 90
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], split_indices(100, (30, 40, 20), random_state=4)[0])
    with pytest.raises(InvalidParameterError, match="only 100 exist"):
        split_indices(100, (60, 40, 20))


#: Wide enough that a dictionary at tol 1e-8 holds well under the 400 training rows.
GAMMA = 0.01


@pytest.fixture(scope="module")
def protocol(swiss_roll):
    X, _ = swiss_roll
    return Protocol(X[:1200], n_train=400, n_test=400, n_extra=400, n_components=2,
                    normalization="additive", gamma=GAMMA, random_state=0)


def test_protocol_reference_is_the_exact_unit_eigenvectors_of_d2_and_d3(protocol, swiss_roll):
    X = swiss_roll[0][:1200]
    _, i2, i3 = protocol.indices
    K = RBFKernel(GAMMA)(np.concatenate([X[i2], X[i3]]))
    n = len(K)
    H = np.eye(n) - 1.0 / n
    vals, vecs = np.linalg.eigh(H @ K @ H)
    top = vecs[:, ::-1][:, :2]
    R = protocol.reference
    assert R.shape == (400, 2)
    # the same unit eigenvectors, restricted to D2 (up to sign)
    s = np.sign(np.sum(R * top[:400], axis=0))
    np.testing.assert_allclose(R * s, top[:400], atol=1e-10)
    np.testing.assert_allclose(protocol.reference_eigenvalues, vals[::-1][:2], rtol=1e-10)


def test_protocol_greedy_at_tiny_tol_scores_as_the_full_gram(protocol):
    full = protocol.evaluate(ExactKernelEmbedding(2, gamma=GAMMA))
    greedy = protocol.evaluate(GreedySpectralEmbedding(2, gamma=GAMMA, tol=0.0, random_state=0))
    assert greedy.error.mean == pytest.approx(full.error.mean, rel=1e-8)
    # tol=0 keeps every direction: more than half of the 400 rows enter the dictionary, so
    # the fit takes the exact path (the full Gram matrix): every row is a dictionary point
    assert greedy.info["m"] == 400 and full.n_train == 400
    # a model trained on 30 rows generalizes worse than one trained on all of D1
    small = protocol.evaluate(ExactKernelEmbedding(2, gamma=GAMMA), 30)
    assert small.error.low > full.error.high
    assert small.fit_seconds >= 0 and small.fit_cpu_seconds >= 0
    # paired over the same test points: the difference is the difference of the means
    diff = paired_difference(small, full)
    assert diff.mean == pytest.approx(small.error.mean - full.error.mean, rel=1e-12)
    assert diff.low > 0 and diff.n == 400
    assert diff.ci95 == pytest.approx(
        Z95 * np.std(small.per_point - full.per_point, ddof=1) / 20, rel=1e-12)
    same = paired_difference(full, full)
    assert same.mean == 0.0 and same.ci95 == 0.0


def test_protocol_accepts_a_precomputed_reference(protocol, swiss_roll):
    again = Protocol(swiss_roll[0][:1200], n_train=400, n_test=400, n_extra=400, n_components=2,
                     normalization="additive", gamma=GAMMA, random_state=0,
                     reference=(protocol.reference, protocol.reference_eigenvalues))
    est = ExactKernelEmbedding(2, gamma=GAMMA)
    assert again.evaluate(est).error == protocol.evaluate(est).error
    with pytest.raises(InvalidInputError, match="expected \\(400, 2\\)"):
        Protocol(swiss_roll[0][:1200], n_train=400, n_test=400, n_extra=400, n_components=2,
                 normalization="additive", gamma=GAMMA, reference=(np.zeros((10, 2)), None))


def test_reference_embedding_divisive_has_unit_norm_over_all_rows(swiss_roll):
    X = swiss_roll[0][:300]
    R, vals = reference_embedding(X, 300, n_components=2, normalization="divisive", gamma=0.05)
    np.testing.assert_allclose(np.linalg.norm(R, axis=0), 1.0, rtol=1e-12)
    assert np.all(vals < 1.0)


@pytest.mark.parametrize("normalization", ["additive", "divisive"])
def test_kernel_reconstruction_error_known_answers(tmp_path, normalization):
    X = np.random.default_rng(5).random((150, 2))
    gamma = 3.0
    # full rank (a narrow kernel keeps every eigenvalue well above rounding): the
    # embedding reproduces the normalized kernel exactly
    p = 149  # divisive: with the trivial one, all 150 eigenpairs; additive: rank n - 1
    full = ExactKernelEmbedding(p, gamma=300.0, normalization=normalization).fit(X)
    z = write_zarr(tmp_path / "x.zarr", X, 40)  # the row sums are computed out of core
    res = kernel_reconstruction_error(z, full.embedding_, full.eigenvalues_, gamma=300.0,
                                      normalization=normalization, n_pairs=2000)
    assert res["relative_frobenius"] < 1e-8 and res["n_pairs"] == 2000
    # rank 2: the error of the best rank-2 approximation on the same sampled entries
    low = ExactKernelEmbedding(2, gamma=gamma, normalization=normalization).fit(X)
    res2 = kernel_reconstruction_error(X, low.embedding_, low.eigenvalues_, gamma=gamma,
                                       normalization=normalization, n_pairs=2000, random_state=0)
    K = RBFKernel(gamma)(X)
    if normalization == "additive":
        H = np.eye(150) - 1.0 / 150
        N = H @ K @ H
        keep = slice(0, 2)
    else:
        d = K.sum(axis=1)
        N = K / np.sqrt(np.outer(d, d))
        keep = slice(0, 3)  # the trivial eigenvector is added back exactly
    vals, vecs = np.linalg.eigh(N)
    vals, vecs = vals[::-1][keep], vecs[:, ::-1][:, keep]
    approx = (vecs * vals) @ vecs.T
    rng = np.random.default_rng(np.random.SeedSequence([0, 0x4EC0]))
    i, j = rng.integers(150, size=2000), rng.integers(150, size=2000)
    want = np.sqrt(np.sum((N[i, j] - approx[i, j]) ** 2) / np.sum(N[i, j] ** 2))
    assert res2["relative_frobenius"] == pytest.approx(want, rel=1e-8)
    assert res2["relative_frobenius"] > 1e-3


def test_clustering_ari_and_threshold_accuracy_known_cases():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 50)
    E = np.array([[0, 0], [10, 0], [0, 10]])[y] + rng.normal(0, 0.1, (150, 2))
    assert clustering_ari(E, y) == 1.0
    assert clustering_ari(E[:, :1], y, n_clusters=2) < 1.0
    assert threshold_accuracy([0, 1, 2, 3], [0, 0, 1, 1]) == 1.0
    assert threshold_accuracy([3, 2, 1, 0], [0, 0, 1, 1]) == 1.0  # either orientation
    assert threshold_accuracy([0, 1, 2, 3], [0, 1, 0, 1]) == 0.75
    with pytest.raises(InvalidInputError, match="two classes"):
        threshold_accuracy([0, 1, 2], [0, 1, 2])


def test_svm_accuracy_on_separable_and_on_uninformative_features():
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 100)
    F = np.column_stack([y * 5.0 + rng.normal(0, 0.3, 200), -y * 5.0 + rng.normal(0, 0.3, 200)])
    F *= 1e-3  # eigenvector-sized features: the standardization matters
    res = svm_accuracy(F[::2], y[::2], F[1::2], y[1::2], cv=5, C_grid=(1.0, 10.0, 100.0))
    assert res == {**res, "accuracy": 1.0, "n_correct": 100, "n_test": 100}
    noise = rng.normal(size=(200, 2))
    chance = svm_accuracy(noise[::2], y[::2], noise[1::2], y[1::2], cv=5)
    assert chance["accuracy"] < 0.7
