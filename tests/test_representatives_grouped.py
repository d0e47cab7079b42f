"""The pruned search of the representatives (issue 51): representatives in groups, each
row skipping the groups its bound rules out, with the result of the unpruned search."""
import numpy as np
import pytest

from ooc_spectral.core import representatives as R
from ooc_spectral.core.nearest import GROUPED_MAX_SHARE, group_points

pytest.importorskip("numba")


def _clustered(n, d=20, centers=10, std=1.0, seed=0, shift=0.0):
    from sklearn.datasets import make_blobs

    X, y = make_blobs(n, n_features=d, centers=centers, cluster_std=std, random_state=seed)
    return X + shift, y


def _points(X, m, seed=0):
    rng = np.random.default_rng(seed)
    P = X[rng.choice(len(X), m, replace=False)] + 0.3 * rng.standard_normal((m, X.shape[1]))
    P[1] = P[0]  # two representatives in one place: every row ties them
    return P


@pytest.mark.parametrize("shift", [0.0, 1e4])
def test_the_pruned_search_is_the_unpruned_bit_for_bit(shift):
    """Pruned against unpruned (the same compiled distances, every group visited): equal
    bit for bit, exact ties included (a duplicated representative, rows on
    representatives); against NumPy's product and selection: the same representatives in
    the same order, the squared distances to rounding; the K nearest are the brute
    force's."""
    import dask

    from ooc_spectral._accel.fused import grouped_reach

    X, _ = _clustered(4000, shift=shift)
    P = _points(X, 600)
    X[:50] = P[np.arange(50) % 7]  # rows on representatives (the duplicated pair among them)
    reps = R.Representatives(P, 5, reach=20)
    assert reps._groups is not None  # clustered: the groups prune
    Y = X - reps._center
    x2 = np.einsum("ij,ij->i", Y, Y)
    pruned = grouped_reach(Y, x2, reps._groups, 5, 20, R.REACH_RATIO)
    full = grouped_reach(Y, x2, reps._groups, 5, 20, R.REACH_RATIO, prune=False)
    np.testing.assert_array_equal(pruned[0], full[0])
    np.testing.assert_array_equal(pruned[1], full[1])
    assert full[2] == len(X) * len(P) and pruned[2] < 0.3 * full[2]
    far = np.isinf(pruned[1][:, 5:])
    assert far.any() and (~far).any()  # the near-tie mask both keeps and drops
    assert np.all(pruned[0][:, :2][np.all(X == P[0], axis=1)] == [0, 1])  # a tie: lower first
    got = reps._search(X, 5, 20)
    np.testing.assert_array_equal(got[0], pruned[0])
    with dask.config.set({"ooc-spectral.numba": False}):
        ref = reps._search(X, 5, 20)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-9, atol=1e-12 * (1 + shift) ** 2)
    brute = ((X[50:, None, :] - P[None, :, :]) ** 2).sum(-1)  # P[0] = P[1]: a tie, lower first
    np.testing.assert_array_equal(got[0][50:, :5], np.argsort(brute, axis=1, kind="stable")[:, :5])


def test_the_groups_are_used_only_where_they_prune():
    """Overlapping clusters in 20-D (std 8): the representatives' own search would compute
    most distances, so the model keeps NumPy's product; well separated ones: the groups.
    Either way the grouping is a function of the points alone."""
    X, _ = _clustered(6000, std=8.0)
    assert R.Representatives(_points(X, 600), 5, reach=20)._groups is None
    X, _ = _clustered(6000, std=1.0)
    P = _points(X, 600)
    a, b = group_points(P - P.mean(0)), group_points(P - P.mean(0))
    np.testing.assert_array_equal(a.permutation, b.permutation)
    assert R.Representatives(P, 5, reach=20)._groups is not None
    assert 0 < GROUPED_MAX_SHARE < 1
    # every member within its group's radius
    for g in range(len(a.starts) - 1):
        members = (P - P.mean(0))[a.permutation[a.starts[g]:a.starts[g + 1]]]
        assert np.sqrt(((members - a.centres[g]) ** 2).sum(1)).max() <= a.radii[g] * (1 + 1e-12)


def test_a_model_with_groups_gives_a_row_the_same_values_in_fit_predict_and_from_zarr(tmp_path):
    """The pruned search is a function of the row alone: predict on a few rows gives their
    fitted coordinates bit for bit, and zarr input gives NumPy input's labels."""
    from conftest import write_zarr
    from sklearn.metrics import adjusted_rand_score

    from ooc_spectral.clustering import GreedySpectralClustering

    X, y = _clustered(8000, centers=6)
    ref = GreedySpectralClustering(6, n_representatives=600, random_state=0).fit(X)
    assert ref.cluster_map_.tmap.representatives._groups is not None
    assert adjusted_rand_score(y, ref.labels_) == 1.0
    np.testing.assert_array_equal(ref.cluster_map_.embed(X[5:42]), ref.embedding_[5:42])
    np.testing.assert_array_equal(ref.predict(X[5:42]), ref.labels_[5:42])
    z = write_zarr(tmp_path / "x.zarr", X, 1000)
    sc = GreedySpectralClustering(6, n_representatives=600, random_state=0).fit(z)
    labels = np.asarray(sc.labels_.compute())
    np.testing.assert_array_equal(labels, ref.labels_)
    np.testing.assert_allclose(np.asarray(sc.embedding_.compute()), ref.embedding_, atol=1e-9)


@pytest.mark.parametrize("shift", [0.0, 1e4])
def test_lloyd_by_the_pruned_search_gives_the_blocked_products_centres(monkeypatch, shift):
    """Lloyd's nearest centres from the pruned search (well separated clusters in 20-D,
    600 centres; rows far from the origin moved by their mean first, as
    select_representatives moves them) and from the blocked products: the same centres;
    on overlapping clusters the trial on the first rows keeps the products."""
    from ooc_spectral.core import representative_selection as rs

    X, _ = _clustered(4000, shift=shift)
    S = X - X.mean(axis=0)
    C0 = rs.kmeans_plusplus(S[:1800], 600, np.random.default_rng(0))
    assert rs._lloyd_groups(S, C0) is not None
    got = rs.lloyd(S, C0, 4, rs.LLOYD_RTOL)
    monkeypatch.setattr(rs, "_lloyd_groups", lambda S, C: None)
    ref = rs.lloyd(S, C0, 4, rs.LLOYD_RTOL)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    assert np.abs(got - C0).max() > 0.1  # the centres moved
    monkeypatch.undo()
    Y, _ = _clustered(4000, std=8.0)
    S = Y - Y.mean(axis=0)
    assert rs._lloyd_groups(S, rs.kmeans_plusplus(S[:1800], 600, np.random.default_rng(0))) is None
