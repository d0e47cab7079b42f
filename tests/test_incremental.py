"""partial_fit: incremental kernel PCA over batches (issue 16).

The oracle is exact kernel PCA of every row seen, projected on the final
dictionary (the eigenvalues of the centred coordinates' Gram matrix, computed
in memory). Re-readable batches (zarr) must equal it; numpy batches, carried by
their projections, must stay within the reported bound of it.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from scipy.linalg import eigh, solve_triangular
from sklearn.datasets import make_swiss_roll

from ooc_spectral import GreedySpectralEmbedding, InvalidParameterError

GAMMA, TOL, P = 0.05, 1e-4, 5


@pytest.fixture(scope="module")
def batches():
    X = make_swiss_roll(3000, random_state=0)[0]
    order = np.argsort(X[:, 0])  # sorted along x: the third batch is a region not seen before
    return [X[order[:1000]], X[order[1000:2000]], X[order[2000:]]]


def oracle(est, X):
    d = est.spectral_map_.dictionary
    K, _ = d.kernel_block(X)
    Z = solve_triangular(d.L, K.T, lower=True).T
    Zc = Z - Z.mean(axis=0)
    return eigh(Zc.T @ Zc)[0][::-1][:P]


def residuals(est, X):
    d = est.spectral_map_.dictionary
    return d.residuals(*d.coordinates(X))[0]


def test_partial_fit_numpy_batches_within_the_bound(batches):
    est = GreedySpectralEmbedding(n_components=P, gamma=GAMMA, tol=TOL, random_state=0)
    sizes, previous = [], None
    for i, b in enumerate(batches):
        est.partial_fit(b)
        if previous is not None:  # each component keeps its sign across updates
            E, R = est.transform(batches[0]), previous
            assert np.all(np.sum(E * R, axis=0) > 0)
        previous = est.transform(batches[0])
        sizes.append(est.dictionary_.shape[0])
        assert est.n_samples_fit_ == 1000 * (i + 1)
        assert est.transform(b[:7]).shape == (7, P)  # transform between calls
    assert sizes[0] < sizes[1] < sizes[2]  # the new regions grew the dictionary
    X = np.vstack(batches)
    ref = oracle(est, X)
    b = est.eigenvalue_error_bound_
    assert b > 0
    assert np.all(np.abs(est.eigenvalues_ - ref) <= b)
    # the carried rows make the result differ from the oracle (they are not re-read) ...
    assert np.abs(est.eigenvalues_ - ref).max() > 1e-8 * ref[0]
    # ... but every row of the new region is within tol of the final span
    assert residuals(est, batches[2]).max() <= TOL
    assert est.max_residual_ <= TOL


def test_a_partial_fit_after_fit_carries_no_interval_of_the_fit(batches, tmp_path):
    """fit, then partial_fit: eigenvalue_interval_ (and rounding_) were the fit's, an
    interval around another spectrum that held none of the new eigenvalues, and save wrote
    it (an outside audit). partial_fit derives no interval: None, saved as None."""
    est = GreedySpectralEmbedding(n_components=P, gamma=GAMMA, tol=TOL, random_state=0)
    est.fit(batches[0])
    assert est.eigenvalue_interval_ is not None and est.rounding_ is not None
    est.partial_fit(batches[0])
    est.partial_fit(batches[2])
    assert est.eigenvalue_interval_ is None and est.rounding_ is None
    est.save(tmp_path / "m")
    assert GreedySpectralEmbedding.load(tmp_path / "m").eigenvalue_interval_ is None


def test_partial_fit_zarr_batches_equal_the_oracle(batches, tmp_path):
    arrays = []
    for i, b in enumerate(batches):
        z = zarr.create_array(str(tmp_path / f"b{i}.zarr"), shape=b.shape, chunks=(250, 3),
                              dtype="f8")
        z[:] = b
        arrays.append(z)
    est = GreedySpectralEmbedding(n_components=P, gamma=GAMMA, tol=TOL, random_state=0)
    for z in arrays:
        est.partial_fit(z)
    X = np.vstack(batches)
    np.testing.assert_allclose(est.eigenvalues_, oracle(est, X), rtol=1e-8)
    assert residuals(est, X).max() <= TOL
    # the weyl bound is the one-sided one: no row is carried
    assert est.eigenvalue_error_bound_ <= len(X) * TOL
    # fit starts from scratch
    est.fit(batches[0])
    assert est.n_samples_fit_ == 1000
    est.partial_fit(batches[0])
    assert est.n_samples_fit_ == 1000


def test_partial_fit_refuses_what_is_not_incremental(batches):
    # offered only where it works (scikit-learn's available_if)
    with pytest.raises(AttributeError, match="partial_fit"):
        GreedySpectralEmbedding(normalization="divisive", gamma=GAMMA).partial_fit(batches[0])
    with pytest.raises(InvalidParameterError, match="tol"):
        GreedySpectralEmbedding(dictionary_size=20, gamma=GAMMA).partial_fit(batches[0])
    est = GreedySpectralEmbedding(gamma=GAMMA, tol=TOL).partial_fit(batches[0])
    with pytest.raises(ValueError, match="features"):
        est.partial_fit(batches[1][:, :2])


def test_after_partial_fit_with_numpy_batches_the_bound_is_two_sided():
    """A sorted swiss roll in ten NumPy batches at tol 1e-3: an exact eigenvalue lies below
    eigenvalues_, which the one-sided reading documented for fit would deny (an outside
    audit); the documented two-sided reading of eigenvalue_error_bound_ holds, and no
    eigenvalue_interval_ claims the one-sided form."""
    from scipy.spatial.distance import cdist

    from ooc_spectral.datasets import generate

    X, labels = generate("swiss-roll", 2000, seed=0)
    t = np.asarray(next(iter(labels.values())))
    X = np.asarray(X, dtype=np.float64)[np.argsort(t)]
    est = GreedySpectralEmbedding(4, gamma=0.05, tol=1e-3, random_state=0)
    for b in np.array_split(X, 10):
        est.partial_fit(b)
    K = np.exp(-0.05 * cdist(X, X, "sqeuclidean"))
    K -= K.mean(axis=0)
    K -= K.mean(axis=1)[:, None]
    exact = np.linalg.eigvalsh((K + K.T) / 2)[::-1][:4]
    lam, b = est.eigenvalues_, est.eigenvalue_error_bound_
    assert np.any(exact < lam - 1e-9 * exact[0])  # below: the one-sided form fails here
    assert np.all(np.abs(exact - lam) <= b)  # the two-sided one holds
    assert est.eigenvalue_interval_ is None and est.rounding_ is None
    assert "two-sided" in type(est).__doc__  # and the attribute's documentation says so
