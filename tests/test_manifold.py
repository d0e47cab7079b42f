"""The spectral family of ooc_spectral.manifold against scikit-learn and dense computations.

Tolerances (relative to the largest coordinate unless said otherwise):

- Isomap vs scikit-learn's Isomap (same graph, dense eigensolver): 1e-9 for the
  training embedding and for ``transform`` of new rows (measured ~1e-15).
- LLE vs scikit-learn's LocallyLinearEmbedding (dense eigensolver): 1e-6
  (measured ~2e-8: the two eigensolvers differ in rounding on eigenvalues of
  order 1e-10 to 1e-7).
- Laplacian eigenmaps and diffusion map (greedy dictionary, tol=1e-8) vs the
  dense generalized eigenproblem: 1e-7 on training rows (measured ~4e-11); vs the
  dense Nyström formula on new rows: 1e-6 (measured 1.2e-7; the ``tol``
  certificate covers training rows only, and these new rows are up to 1.3e-2 from
  the dictionary's span).
- Metric MDS (Euclidean, out of core) vs PCA: 1e-9.
- ``transform`` on training rows gives back the training embedding: 1e-10
  absolute (exact up to rounding).
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from scipy.linalg import eigh
from sklearn import manifold as skm
from sklearn.base import clone
from sklearn.decomposition import PCA

from ooc_spectral.datasets import generate
from ooc_spectral.exceptions import InvalidInputError, InvalidParameterError, NotFittedError
from ooc_spectral.core.kernels import RBFKernel
from ooc_spectral.manifold import (
    DiffusionMap,
    Isomap,
    LandmarkIsomap,
    LaplacianEigenmaps,
    LocallyLinearEmbedding,
    MetricMDS,
)

from conftest import write_zarr



GAMMA = 0.05


def rel(A, B):
    return float(np.max(np.abs(np.asarray(A) - np.asarray(B))) / np.max(np.abs(B)))


def signs(A, B):
    """Column signs that turn A towards B."""
    return np.sign(np.sum(np.asarray(A) * np.asarray(B), axis=0))


@pytest.fixture(scope="module")
def roll():
    X, _ = generate("swiss-roll", 1000, seed=0)
    return X[:800], X[800:]


# --------------------------------------------------------------------------- #
# Isomap and LLE, in memory, against scikit-learn
# --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def isomaps(roll):
    Xtr, _ = roll
    ours = Isomap(2, n_neighbors=10, eigen_solver="dense").fit(Xtr)
    ref = skm.Isomap(n_neighbors=10, n_components=2, eigen_solver="dense", path_method="D").fit(Xtr)
    return ours, ref


def test_isomap_matches_sklearn(roll, isomaps):
    Xtr, Xte = roll
    ours, ref = isomaps
    s = signs(ours.embedding_, ref.embedding_)
    assert rel(ours.embedding_ * s, ref.embedding_) < 1e-9
    assert rel(ours.transform(Xte) * s, ref.transform(Xte)) < 1e-9
    np.testing.assert_allclose(ours.transform(Xtr), ours.embedding_, rtol=0, atol=1e-10)
    np.testing.assert_allclose(ours.dist_matrix_, ref.dist_matrix_, rtol=1e-12)


def test_lle_matches_sklearn(roll):
    Xtr, Xte = roll
    ours = LocallyLinearEmbedding(2, n_neighbors=10, eigen_solver="dense").fit(Xtr)
    ref = skm.LocallyLinearEmbedding(n_neighbors=10, n_components=2, eigen_solver="dense",
                                     random_state=0).fit(Xtr)
    s = signs(ours.embedding_, ref.embedding_)
    assert rel(ours.embedding_ * s, ref.embedding_) < 1e-6
    assert rel(ours.transform(Xte) * s, ref.transform(Xte)) < 1e-6
    # eq. 16 with w(x_j, x_i) = delta_ij: a training row gets its own coordinates exactly
    # (scikit-learn's transform re-solves the weights and is off by ~0.2% here)
    np.testing.assert_allclose(ours.transform(Xtr), ours.embedding_, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(ours.embedding_, axis=0), 1.0, atol=1e-10)


def test_lle_arpack_agrees_with_dense(roll):
    Xtr, _ = roll
    dense = LocallyLinearEmbedding(2, n_neighbors=10, eigen_solver="dense").fit(Xtr)
    arpack = LocallyLinearEmbedding(2, n_neighbors=10, eigen_solver="arpack", tol=1e-12,
                                    random_state=0).fit(Xtr)
    assert rel(arpack.embedding_ * signs(arpack.embedding_, dense.embedding_), dense.embedding_) < 1e-5


# --------------------------------------------------------------------------- #
# metric MDS
# --------------------------------------------------------------------------- #
def test_euclidean_mds_is_out_of_core_and_equals_pca(tmp_path, roll):
    Xtr, Xte = roll
    mds = MetricMDS(2, random_state=0).fit(Xtr)
    pca = PCA(2).fit(Xtr)
    assert mds.out_of_core_ and mds.embedding_estimator_.dictionary_.shape[0] <= Xtr.shape[1] + 1
    s = signs(mds.embedding_, pca.transform(Xtr))
    assert rel(mds.embedding_ * s, pca.transform(Xtr)) < 1e-9
    assert rel(mds.transform(Xte) * s, pca.transform(Xte)) < 1e-9
    np.testing.assert_allclose(mds.eigenvalues_, pca.explained_variance_ * (len(Xtr) - 1), rtol=1e-9)
    np.testing.assert_allclose(mds.transform(Xtr), mds.embedding_, rtol=0, atol=1e-10)
    # as many components as the data has dimensions (d + 1 dictionary rows)
    full = MetricMDS(3, random_state=0).fit(Xtr)
    P3 = PCA(3).fit(Xtr).transform(Xtr)
    assert rel(full.embedding_ * signs(full.embedding_, P3), P3) < 1e-9
    lazy = MetricMDS(2, random_state=0).fit(write_zarr(tmp_path / "x.zarr", Xtr, 128))
    assert isinstance(lazy.embedding_, da.Array)
    np.testing.assert_allclose(lazy.embedding_.compute(), mds.embedding_, rtol=0, atol=1e-10)


def test_dense_mds_eq14(roll):
    Xtr, Xte = roll
    # minkowski (p=2) takes the in-memory path of eq. 14 but is the Euclidean distance
    dense = MetricMDS(2, metric="minkowski").fit(Xtr)
    pca = PCA(2).fit(Xtr)
    assert not dense.out_of_core_
    s = signs(dense.embedding_, pca.transform(Xtr))
    assert rel(dense.embedding_ * s, pca.transform(Xtr)) < 1e-9
    assert rel(dense.transform(Xte) * s, pca.transform(Xte)) < 1e-9
    city = MetricMDS(2, metric="cityblock").fit(Xtr)
    np.testing.assert_allclose(city.transform(Xtr), city.embedding_, rtol=0, atol=1e-9)
    # the training rows' coordinates are the classical scaling of the L1 distances
    from scipy.spatial.distance import cdist

    S = cdist(Xtr, Xtr, "cityblock") ** 2
    J = np.eye(len(Xtr)) - 1.0 / len(Xtr)
    vals, vecs = np.linalg.eigh(-0.5 * J @ S @ J)
    E = vecs[:, ::-1][:, :2] * np.sqrt(vals[::-1][:2])
    assert rel(city.embedding_ * signs(city.embedding_, E), E) < 1e-9


# --------------------------------------------------------------------------- #
# Laplacian eigenmaps and diffusion maps, out of core, against the dense problem
# --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def dense_laplacian(roll):
    Xtr, Xte = roll
    X = Xtr[:600]
    K = RBFKernel(GAMMA)(X)
    d = K.sum(axis=1)
    # eq. 4 of Bengio et al.: (D - K) f = mu D f, with f'Df = 1 (scipy's normalization)
    mu, F = eigh(np.diag(d) - K, np.diag(d))
    p = 3
    F, mu = F[:, 1:p + 1], mu[1:p + 1]
    lam = 1.0 - mu
    # dense Nyström of the normalized kernel for new rows (eq. 11), then D^-1/2
    Kx = RBFKernel(GAMMA)(Xte, X)
    dx = Kx.sum(axis=1)
    V = F * np.sqrt(d)[:, None]  # unit eigenvectors of D^-1/2 K D^-1/2
    Vx = (Kx / np.sqrt(np.outer(dx, d))) @ V / lam
    Fx = Vx / np.sqrt(dx)[:, None]
    return X, Xte, F, Fx, lam, float(d.sum())


def test_laplacian_eigenmaps_match_dense(dense_laplacian):
    X, Xte, F, Fx, lam, vol = dense_laplacian
    # 5e-7: the smallest tol of the 1-2-5 grid float64 certifies on these rows
    le = LaplacianEigenmaps(3, gamma=GAMMA, tol=5e-7, random_state=0).fit(X)
    s = signs(le.embedding_, F)
    assert rel(le.embedding_ * s, F) < 1e-7
    assert rel(le.transform(Xte) * s, Fx) < 1e-6
    np.testing.assert_allclose(le.eigenvalues_, lam, rtol=1e-9)
    assert le.volume_ == pytest.approx(vol, rel=1e-9)
    np.testing.assert_allclose(le.transform(X), le.embedding_, rtol=0, atol=1e-12)


@pytest.mark.parametrize("t", [0.0, 1.0, 2.5])
def test_diffusion_map_matches_dense(dense_laplacian, t):
    X, Xte, F, Fx, lam, vol = dense_laplacian
    dm = DiffusionMap(3, diffusion_time=t, gamma=GAMMA, tol=5e-7, random_state=0).fit(X)
    ref = np.sqrt(vol) * lam**t * F
    s = signs(dm.embedding_, ref)
    assert rel(dm.embedding_ * s, ref) < 1e-7
    assert rel(dm.transform(Xte) * s, np.sqrt(vol) * lam**t * Fx) < 1e-6
    np.testing.assert_allclose(dm.transform(X), dm.embedding_, rtol=0, atol=1e-10)


def test_divisive_coordinates_lazy_for_zarr(tmp_path, roll):
    Xtr, Xte = roll
    ref = DiffusionMap(2, gamma=GAMMA, tol=1e-4, random_state=3).fit(Xtr)
    arr = write_zarr(tmp_path / "x.zarr", Xtr, 100)
    lazy = clone(ref).fit(arr)
    assert isinstance(lazy.embedding_, da.Array)
    np.testing.assert_allclose(lazy.embedding_.compute(), ref.embedding_, rtol=0, atol=1e-10)
    out = lazy.transform(da.from_array(Xte, chunks=50))
    assert isinstance(out, da.Array)
    np.testing.assert_allclose(out.compute(), ref.transform(Xte), rtol=0, atol=1e-10)


# --------------------------------------------------------------------------- #
# landmark Isomap with the greedy dictionary as landmarks
# --------------------------------------------------------------------------- #
def test_landmark_isomap(tmp_path, roll, isomaps):
    Xtr, Xte = roll
    full, _ = isomaps
    # gamma 0.02: 203 landmarks, below sqrt(80 n) = 253 where the dictionary would give way to
    # the exact problem (pipeline/exact.exact_limit) and every row would be a landmark
    lm = LandmarkIsomap(2, n_neighbors=10, gamma=0.02, tol=1e-3, random_state=0).fit(Xtr)
    m = lm.landmarks_.shape[0]
    assert 2 < m < len(Xtr)
    np.testing.assert_array_equal(Xtr[lm.landmark_indices_], lm.landmarks_)
    # eq. 15 on a landmark gives its classical-scaling coordinates sqrt(lambda) v
    np.testing.assert_allclose(lm.transform(lm.landmarks_), lm.landmark_embedding_, rtol=0,
                               atol=1e-9 * np.abs(lm.landmark_embedding_).max())
    np.testing.assert_allclose(lm.transform(Xtr), lm.embedding_, rtol=0, atol=1e-10)
    # close to full Isomap (same neighbourhood graph) after an affine alignment
    A = np.column_stack([lm.embedding_, np.ones(len(Xtr))])
    coef, *_ = np.linalg.lstsq(A, full.embedding_, rcond=None)
    err = np.sqrt(np.mean((A @ coef - full.embedding_) ** 2) / np.mean(full.embedding_**2))
    assert err < 0.02
    # out of core: zarr input, a graph on a sample of the rows, lazy embedding
    arr = write_zarr(tmp_path / "x.zarr", Xtr, 100)
    lazy = LandmarkIsomap(2, n_neighbors=10, graph_size=500, gamma=0.02, random_state=0).fit(arr)
    assert isinstance(lazy.embedding_, da.Array) and lazy.graph_indices_.size < len(Xtr)
    assert np.isin(lazy.landmark_indices_, lazy.graph_indices_).all()
    np.testing.assert_allclose(lazy.transform(Xte), lazy.transform(da.from_array(Xte)).compute(),
                               rtol=0, atol=1e-10)


# --------------------------------------------------------------------------- #
# conventions and errors
# --------------------------------------------------------------------------- #
ALL = [LaplacianEigenmaps, DiffusionMap, MetricMDS, Isomap, LandmarkIsomap, LocallyLinearEmbedding]


@pytest.mark.parametrize("cls", ALL)
def test_sklearn_conventions(cls, roll):
    est = cls(2)
    params = est.get_params()
    assert clone(est).get_params() == params  # __init__ only stores
    with pytest.raises(NotFittedError, match="not fitted yet"):
        est.transform(roll[1])
    X = roll[0][:300]
    E = est.fit_transform(X)
    assert E.shape == (300, 2) and np.isfinite(E).all()
    assert est.get_params() == params  # fit does not change the parameters


@pytest.mark.parametrize("cls", ALL)
def test_bad_n_components_is_named_in_fit(cls, roll):
    with pytest.raises(InvalidParameterError, match="n_components"):
        cls(0).fit(roll[0][:100])


def test_in_memory_methods_refuse_large_inputs_naming_alternatives(roll):
    with pytest.raises(InvalidInputError, match="max_samples=100.*LandmarkIsomap"):
        Isomap(2, max_samples=100).fit(roll[0])


def test_disconnected_graph_is_joined_as_sklearn_does():
    # issue 15: scikit-learn joins the components by their closest pairs, with a warning
    X = np.vstack([np.random.default_rng(0).normal(size=(50, 2)),
                   np.random.default_rng(1).normal(size=(50, 2)) + 100.0])
    with pytest.warns(UserWarning, match="2 connected components.*Increase n_neighbors"):
        ours = Isomap(2, n_neighbors=5).fit_transform(X)
    with pytest.warns(UserWarning, match="connected components"):
        ref = skm.Isomap(n_components=2, n_neighbors=5).fit_transform(X)
    np.testing.assert_allclose(np.abs(ours), np.abs(ref), rtol=1e-9, atol=1e-9 * np.abs(ref).max())


def test_iris_disconnected_graph_equals_sklearn():
    from sklearn.datasets import load_iris

    X = load_iris().data
    with pytest.warns(UserWarning, match="connected components"):
        ours = Isomap(2, n_neighbors=5).fit_transform(X)
    with pytest.warns(UserWarning, match="connected components"):
        ref = skm.Isomap(n_components=2, n_neighbors=5).fit_transform(X)
    np.testing.assert_allclose(np.abs(ours), np.abs(ref), rtol=1e-9, atol=1e-9 * np.abs(ref).max())


def test_landmark_isomap_joins_disconnected_graph():
    X = np.vstack([np.random.default_rng(0).normal(size=(60, 2)),
                   np.random.default_rng(1).normal(size=(60, 2)) + 100.0])
    with pytest.warns(UserWarning, match="2 connected components"):
        E = LandmarkIsomap(2, n_neighbors=5, gamma=0.5, random_state=0).fit_transform(X)
    assert np.isfinite(E).all()
    # the two clusters, 100 apart, are separated along the first coordinate
    first = E[:, 0]
    assert (np.sign(first[:60]) == np.sign(first[0])).all()
    assert (np.sign(first[60:]) == -np.sign(first[0])).all()


def test_transform_checks_features(isomaps):
    ours, _ = isomaps
    with pytest.raises(InvalidInputError, match="2 features, but Isomap was fitted with 3"):
        ours.transform(np.zeros((4, 2)))


def test_components_of_rounding_noise_are_refused_and_the_advice_equals_sklearn():
    """Rows on a line span one direction: a second component of Isomap, LandmarkIsomap or
    a non-Euclidean MetricMDS has an eigenvalue of rounding (about 1e-15 of the first),
    which the out-of-sample map scaled by 1/sqrt(lambda) into coordinates of 1e5 that
    transform(X) did not reproduce (found by an outside audit). Each now refuses, naming
    the count of directions; following it equals scikit-learn's one component."""
    rng = np.random.default_rng(1)
    t = np.sort(rng.uniform(-3, 3, 600))
    X = np.c_[t, 2 * t, -t] + [5.0, 1.0, 2.0]
    for est in (Isomap(n_components=2, n_neighbors=8),
                LandmarkIsomap(n_components=2, n_neighbors=8, gamma=1.0, random_state=0),
                MetricMDS(n_components=2, metric="cityblock")):
        for offset in (0.0, 1e6):  # far from the origin, the distances' rounding grows too
            with pytest.raises(InvalidParameterError,
                               match="rounding level.*lower n_components to 1"):
                clone(est).fit(X + offset)
    ours = Isomap(n_components=1, n_neighbors=8).fit(X)
    theirs = skm.Isomap(n_components=1, n_neighbors=8).fit(X)
    E, F = ours.embedding_, theirs.embedding_
    assert rel(E * signs(E, F), F) < 1e-9
    assert rel(ours.transform(X), E) < 1e-9
    line = MetricMDS(n_components=1, metric="cityblock").fit(X)
    # cityblock distances along the line are 4|t_i - t_j|: the coordinate is 4 t, centred
    ref = 4 * (t - t.mean())[:, None]
    assert rel(line.embedding_ * signs(line.embedding_, ref), ref) < 1e-9


def test_lle_on_a_disconnected_graph_warns_naming_an_n_neighbors_that_connects_it():
    """Two swiss rolls 200 apart: the 5-NN graph has two components, and LLE returned,
    with no warning, coordinates that only told the rolls apart, one roll collapsed to a
    point (an outside audit; scikit-learn's LLE is as silent). It now warns, as Isomap
    does, naming the smallest n_neighbors that connects the graph; with it, no warning."""
    import re
    import warnings

    from scipy.sparse.csgraph import connected_components
    from sklearn.neighbors import kneighbors_graph

    X, _ = generate("swiss-roll", 150, seed=0)
    X = np.asarray(X, dtype=np.float64)
    X2 = np.r_[X, X + [200.0, 0.0, 0.0]]
    with pytest.warns(UserWarning, match=r"2 connected components.*n_neighbors >= (\d+)") as rec:
        LocallyLinearEmbedding(n_components=2, n_neighbors=5).fit(X2)
    k = int(re.search(r"n_neighbors >= (\d+)", str(rec[0].message)).group(1))
    assert connected_components(kneighbors_graph(X2, k), directed=False)[0] == 1
    assert connected_components(kneighbors_graph(X2, k - 1), directed=False)[0] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LocallyLinearEmbedding(n_components=2, n_neighbors=k, eigen_solver="dense").fit(X2)


def test_parameters_that_break_the_arithmetic_are_named_not_raised_by_numpy(roll):
    """LLE with reg=0 (allowed) on rows with more neighbours than features raised SciPy's
    'singular matrix'; MetricMDS(metric='cosine') with a row of zeros raised 'array must not
    contain infs or NaNs', and its transform returned NaN (an outside audit)."""
    X = np.asarray(roll[0][:300], dtype=np.float64)
    with pytest.raises(InvalidParameterError, match="reg=0.*use reg > 0"):
        LocallyLinearEmbedding(n_neighbors=5, reg=0.0).fit(X)
    Z = np.r_[X, np.zeros((1, X.shape[1]))]
    with pytest.raises(InvalidInputError, match="metric='cosine'.*row of zeros"):
        MetricMDS(metric="cosine").fit(Z)
    mds = MetricMDS(metric="cosine").fit(X)
    with pytest.raises(InvalidInputError, match="metric='cosine'.*row of zeros"):
        mds.transform(Z[-2:])
