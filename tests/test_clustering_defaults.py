"""Issue 51: spectral clustering that is right by default.

``GreedySpectralClustering(n_clusters=k)`` with nothing else set (the representatives
graph with local scales on both sides) against known labels on real and noisy data;
``n_clusters="auto"``; the :class:`DegeneratePartitionWarning` of the kernel affinity and
of the divisive embeddings; zarr input = numpy input at any chunk layout; the command
line's default (and its workflow files) equal to Python's. The figures against
scikit-learn's peers are in workflows/bench/clustering.py and docs/clustering.md.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from sklearn import datasets as skd
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score
from sklearn.preprocessing import StandardScaler

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.clustering import GreedySpectralClustering
from ooc_spectral.core import degenerate, eigengap
from ooc_spectral.core.representatives import smallest_k
from ooc_spectral.datasets import generate
from ooc_spectral.exceptions import DegeneratePartitionWarning, InvalidParameterError

from conftest import write_zarr


def _ari(y, labels):
    return adjusted_rand_score(y, np.asarray(labels))


def _no_degenerate_warning(fit):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = fit()
    assert not [w for w in caught if issubclass(w.category, DegeneratePartitionWarning)]
    return est


@pytest.fixture(scope="module")
def digits():
    return skd.load_digits(return_X_y=True)


# --------------------------------------------------------------------------- #
# the default clusters real data
# --------------------------------------------------------------------------- #
def test_the_default_is_the_representatives_graph(digits):
    """Digits, raw pixels: scikit-learn's nearest-neighbour spectral clustering reaches
    0.756, KMeans 0.664; the issue asks 0.80 of the default. Median of three seeds."""
    X, y = digits
    assert GreedySpectralClustering().affinity == "representatives"
    fits = [_no_degenerate_warning(lambda s=s: GreedySpectralClustering(10, random_state=s).fit(X))
            for s in range(3)]
    aris = [_ari(y, sc.labels_) for sc in fits]
    assert np.median(aris) >= 0.80  # measured: 0.766, 0.837, 0.815
    sc = fits[0]
    assert sc.cluster_map_ is not None and sc.n_clusters_ == 10 and sc.eigengaps_ is None
    assert sc.embedding_.shape == (1797, 10)  # n_clusters coordinates, the constant among them
    np.testing.assert_allclose(np.linalg.norm(sc.embedding_, axis=1), 1.0)
    np.testing.assert_array_equal(sc.predict(X), sc.labels_)
    assert sc.representative_scales_.shape == (899,) and np.all(sc.representative_scales_ > 0)


def test_standardised_digits_where_the_median_gamma_falls_apart(digits):
    """The kernel affinity's default gave ARI 0.000 here (one cluster of 1783 rows);
    scikit-learn's nearest-neighbour spectral clustering 0.707."""
    X, y = digits
    Xs = StandardScaler().fit_transform(X)
    sc = _no_degenerate_warning(lambda: GreedySpectralClustering(10, random_state=0).fit(Xs))
    assert _ari(y, sc.labels_) >= 0.74  # measured: 0.770
    assert np.bincount(sc.labels_).min() > 50


def test_noisy_moons_and_unequal_densities():
    """Where the previous representatives graph lost: moons with noise 0.1 (ARI 0.000 at
    10^4 rows: three coordinates split each moon) and blobs of unequal size and spread."""
    X, y = skd.make_moons(4000, noise=0.1, random_state=0)
    assert _ari(y, KMeans(2, random_state=0).fit(X).labels_) < 0.3  # measured: 0.259
    assert _ari(y, GreedySpectralClustering(2, random_state=0).fit(X).labels_) >= 0.9  # 0.977
    X, y = skd.make_blobs([4000, 800, 200], cluster_std=[1.5, 0.5, 0.3], random_state=1)
    assert _ari(y, KMeans(3, random_state=0).fit(X).labels_) < 0.5  # measured: 0.391
    assert _ari(y, GreedySpectralClustering(3, random_state=0).fit(X).labels_) == 1.0


@pytest.mark.parametrize("seed", [2, 3])
def test_a_small_cluster_stored_last_is_found(seed):
    """Rows sorted by cluster, the last 300 of 60,000 (0.5%) a cluster of their own. The
    representatives' sample is uniform over the rows: a sample of runs of contiguous rows
    (what the previous version drew) holds none of those rows for these seeds, and the
    clustering then split a large cluster instead (ARI 0.745)."""
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (30000, 5)), rng.normal(0, 1, (29700, 5)) + 10,
                   rng.normal(0, 0.3, (300, 5)) + np.array([10.0, -10, 0, 0, 0])])
    y = np.repeat([0, 1, 2], [30000, 29700, 300])
    sc = GreedySpectralClustering(3, random_state=seed).fit(X)
    assert _ari(y, sc.labels_) == 1.0


# --------------------------------------------------------------------------- #
# n_clusters="auto"
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("make, k", [
    (lambda: generate("blobs", 3000, n_clusters=4, cluster_std=0.5, seed=0), 4),
    (lambda: skd.make_blobs(5000, centers=6, cluster_std=1.0, random_state=6), 6),
    (lambda: skd.make_blobs([4000, 800, 200], cluster_std=[1.5, 0.5, 0.3], random_state=1), 3),
])
def test_auto_finds_the_number_of_clusters(make, k):
    X, y = make()
    y = y["label"] if isinstance(y, dict) else y
    sc = GreedySpectralClustering("auto", random_state=0).fit(X)
    assert sc.n_clusters_ == k
    assert sc.eigengaps_.shape == (eigengap.AUTO_MAX_CLUSTERS,)
    assert sc.n_clusters_ == 2 + int(np.argmax(sc.eigengaps_[1:]))  # the largest gap, k >= 2
    assert sc.cluster_centers_.shape == (k, k) and sc.embedding_.shape == (len(X), k)
    assert _ari(y, sc.labels_) >= 0.9  # measured: 1.000, 0.931, 1.000


def test_eigengap_is_relative_to_the_eigenvalues():
    """Three clusters joined by little weight, then a spectrum spread ever wider: the
    largest difference is high up, the largest ratio after the third eigenvalue."""
    lam = np.array([0.0, 1e-5, 2e-5, 0.006, 0.007, 0.009, 0.012, 0.016, 0.021, 0.027, 0.034])
    assert 2 + int(np.argmax(np.diff(lam)[1:])) == 10  # the plain difference
    k, gaps = eigengap.choose_n_clusters(lam)
    assert k == 3 and gaps.shape == (10,)
    eps = eigengap.GAP_FLOOR * np.median(lam[1:])
    np.testing.assert_allclose(gaps[2], np.log((0.006 + eps) / (2e-5 + eps)))
    assert eigengap.choose_n_clusters(np.zeros(5))[0] == 2  # all in pieces: no gap, the least k
    with pytest.raises(ValueError, match="at least low"):
        eigengap.choose_n_clusters([0.0, 0.1], low=2)


def test_auto_is_refused_for_the_kernel_affinity():
    X = np.random.default_rng(0).standard_normal((60, 3))
    with pytest.raises(InvalidParameterError, match="affinity='representatives'"):
        GreedySpectralClustering("auto", affinity="kernel").fit(X)
    with pytest.raises(InvalidParameterError, match="n_clusters"):
        GreedySpectralClustering("many").fit(X)


# --------------------------------------------------------------------------- #
# the degenerate-partition warning
# --------------------------------------------------------------------------- #
def test_kernel_affinity_at_the_median_gamma_warns_on_standardised_digits(digits):
    """The issue's case: the kernel affinity at the median heuristic's gamma on
    standardised digits puts 1783 of the 1797 rows in one cluster (the graph falls apart
    into outliers). tol=0.3 keeps the test to seconds (a dictionary of 212 rows instead
    of all 1797 at the default tol, 30-112 s) and gives the same partition."""
    X, y = digits
    Xs = StandardScaler().fit_transform(X)
    with pytest.warns(DegeneratePartitionWarning) as caught:
        sc = GreedySpectralClustering(10, affinity="kernel", tol=0.3, random_state=0).fit(Xs)
    assert np.sort(np.bincount(sc.labels_))[::-1][:3].tolist() == [1783, 4, 3]
    said = " ".join(str(w.message) for w in caught)
    assert "one cluster holds 1783 of the 1797 rows" in said
    assert "median heuristic" in said and "affinity='representatives'" in said
    assert "are carried by about 1.0, 1.0" in said  # the embedding's own warning


def test_the_advice_works_on_breast_cancer():
    """Breast cancer, standardised: the kernel affinity's default splits off 3 rows; the
    gamma the warning names (gamma_ / 10) gives a partition that is not degenerate, and
    the default affinity needs no advice."""
    X, y = skd.load_breast_cancer(return_X_y=True)
    Xs = StandardScaler().fit_transform(X)
    with pytest.warns(DegeneratePartitionWarning, match=r"566 of the 569 rows.*e\.g\. gamma="):
        bad = GreedySpectralClustering(2, affinity="kernel", tol=0.3, random_state=0).fit(Xs)
    gamma = bad.embedding_estimator_.gamma_ / 10
    good = _no_degenerate_warning(lambda: GreedySpectralClustering(
        2, affinity="kernel", gamma=gamma, tol=0.3, random_state=0).fit(Xs))
    assert np.bincount(good.labels_).min() > 150 and _ari(y, good.labels_) > 0.6
    ours = _no_degenerate_warning(lambda: GreedySpectralClustering(2, random_state=0).fit(Xs))
    assert _ari(y, ours.labels_) > 0.7  # measured: 0.743; KMeans 0.677


def test_divisive_embeddings_warn_at_their_default_bandwidth():
    """GreedySpectralEmbedding(normalization="divisive") and LaplacianEigenmaps at the
    median gamma on standardised breast cancer: their first coordinates sit on 1-2 rows.
    At the gamma the message names, they do not."""
    from ooc_spectral.manifold import LaplacianEigenmaps

    Xs = StandardScaler().fit_transform(skd.load_breast_cancer().data)
    with pytest.warns(DegeneratePartitionWarning, match=r"carried by about 1\.\d.* of the 569 rows"):
        est = GreedySpectralEmbedding(2, normalization="divisive", tol=0.3,
                                      random_state=0).fit(Xs)
    with pytest.warns(DegeneratePartitionWarning, match=r"e\.g\. gamma="):
        LaplacianEigenmaps(2, tol=0.3, random_state=0).fit(Xs)
    _no_degenerate_warning(lambda: LaplacianEigenmaps(2, gamma=est.gamma_ / 10, tol=0.3,
                                                      random_state=0).fit(Xs))
    # additive (kernel PCA): no graph, no warning
    _no_degenerate_warning(lambda: GreedySpectralEmbedding(2, tol=0.3, random_state=0).fit(Xs))


def test_a_graph_in_pieces_is_said():
    """Three groups far apart at a narrow kernel: two eigenvalues besides the trivial one
    equal 1, and the coordinates only say which group a row is in."""
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(size=(100, 2)) + c for c in ((0, 0), (60, 0), (0, 60))])
    with pytest.warns(DegeneratePartitionWarning, match="falls into at least 3 pieces"):
        GreedySpectralEmbedding(2, normalization="divisive", gamma=1.0, random_state=0).fit(X)


def test_degenerate_readings():
    assert degenerate.handful(100) == 3 and degenerate.handful(10_000) == 100
    msg = degenerate.partition_message([1783, 4, 3, 1, 1, 1, 1, 1, 1, 1])
    assert msg.startswith("one cluster holds 1783 of the 1797 rows and the other 9 hold together 14")
    assert degenerate.partition_message([566, 3]).endswith("the other holds 3 (sizes 566, 3)")
    assert degenerate.partition_message([980, 20]) is None  # 2% is not a handful
    assert degenerate.partition_message([1000]) is None
    assert degenerate.partition_message([3, 3]) is None  # a handful by count, not by share
    assert degenerate.partition_message([17, 3]) is None and degenerate.partition_message([27, 3])
    V = np.zeros((500, 3))
    V[:, 0] = 1 / np.sqrt(500)  # spread over every row
    V[7, 1] = 1.0  # one row
    V[:20, 2] = 1 / np.sqrt(20)  # a group of 20 rows (4%): not a handful
    assert [(j, round(p, 6)) for j, p in degenerate.localized_coordinates(V)] == [(1, 1.0)]
    assert degenerate.unit_eigenvalues([1.0, 1 - 1e-9, 0.99]) == 2


# --------------------------------------------------------------------------- #
# inputs and the command line
# --------------------------------------------------------------------------- #
def test_smallest_k_breaks_ties_by_column():
    rng = np.random.default_rng(1)
    D = rng.integers(0, 6, size=(300, 40)).astype(float)  # many ties
    got = smallest_k(D, 5)
    ref = np.argsort(D, axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(got, ref)


@pytest.fixture(scope="module")
def blobs():
    X, labels = generate("blobs", 4000, n_clusters=4, n_features=6, cluster_std=1.5, seed=4)
    return np.asarray(X, dtype=np.float64), labels["label"]


def test_zarr_input_equals_numpy_at_any_chunk_layout(blobs, tmp_path):
    X, y = blobs
    ref = GreedySpectralClustering(4, random_state=0).fit(X)
    assert _ari(y, ref.labels_) > 0.95
    for chunks in (250, 1500):
        path = tmp_path / f"x{chunks}.zarr"
        write_zarr(path, X, chunks)
        sc = GreedySpectralClustering(4, random_state=0).fit(str(path))
        np.testing.assert_array_equal(np.asarray(sc.labels_), ref.labels_)
        np.testing.assert_allclose(np.asarray(sc.embedding_), ref.embedding_, atol=1e-9)
        np.testing.assert_array_equal(sc.representatives_, ref.representatives_)


def _fit_cli(*argv):
    from ooc_spectral.batch.cli import main

    return main(["fit", *map(str, argv), "--engine", "threads", "--quiet"])


def test_the_command_line_default_is_pythons(blobs, tmp_path):
    import zarr

    X, y = blobs
    write_zarr(tmp_path / "in.zarr", X, 1000)
    assert _fit_cli(tmp_path / "in.zarr", "--out", tmp_path / "out", "--n-clusters", 4) == 0
    py = GreedySpectralClustering(4, random_state=0).fit(str(tmp_path / "in.zarr"))
    labels = zarr.open_array(str(tmp_path / "out" / "labels"))[:]
    np.testing.assert_array_equal(labels, np.asarray(py.labels_))
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["affinity"] == "representatives" and report["n_clusters"] == 4
    # n_representatives="auto": 100 per cluster (at most 1000, at most half the rows)
    assert report["n_representatives"] == 400 == len(py.representatives_)
    assert report["n_neighbors"] == 5
    assert report["degenerate_partition"] is None and report["eigengaps"] is None
    model = zarr.open_group(str(tmp_path / "out" / "representatives_model"), mode="r")
    np.testing.assert_array_equal(model["scales"][...], py.representative_scales_)
    # --affinity kernel writes the embedding only: with --n-clusters it is refused
    assert _fit_cli(tmp_path / "in.zarr", "--out", tmp_path / "k", "--n-clusters", 4,
                    "--affinity", "kernel") == 2
    assert _fit_cli(tmp_path / "in.zarr", "--out", tmp_path / "k", "--n-clusters", "some") == 2
    assert _fit_cli(tmp_path / "in.zarr", "--out", tmp_path / "k", "--n-clusters", 0) == 2
    # one cluster, as Python's GreedySpectralClustering(1) gives it: every row in it
    assert _fit_cli(tmp_path / "in.zarr", "--out", tmp_path / "one", "--n-clusters", 1) == 0
    one = zarr.open_array(str(tmp_path / "one" / "labels"))[:]
    assert one.shape == (len(X),) and not one.any()
    np.testing.assert_array_equal(one, np.asarray(
        GreedySpectralClustering(1, random_state=0).fit(str(tmp_path / "in.zarr")).labels_))


def test_the_command_line_auto_and_a_workflow_file(tmp_path):
    import zarr

    from ooc_spectral.batch.cli import main

    X, lab = generate("blobs", 3000, n_clusters=4, cluster_std=0.5, seed=0)
    write_zarr(tmp_path / "in.zarr", X, 1000)
    assert _fit_cli(tmp_path / "in.zarr", "--out", tmp_path / "out", "--n-clusters", "auto") == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["n_clusters"] == 4 and report["n_clusters_requested"] == "auto"
    py = GreedySpectralClustering("auto", random_state=0).fit(X)
    np.testing.assert_allclose(report["eigengaps"], py.eigengaps_, rtol=1e-6, atol=1e-9)
    assert len(report["cluster_sizes"]) == 4
    wf = tmp_path / "wf" / "cluster.toml"
    wf.parent.mkdir()
    wf.write_text(f'[[step]]\nrun = "fit"\ninput = "{tmp_path / "in.zarr"}"\nout = "fit"\n'
                  'n_clusters = "auto"\nengine = "threads"\n')
    assert main(["run", str(wf), "-q", "--allow", "outside-cwd"]) == 0
    labels = zarr.open_array(str(wf.parent / "fit" / "labels"))[:]
    out_labels = zarr.open_array(str(tmp_path / "out" / "labels"))[:]
    np.testing.assert_array_equal(labels, out_labels)


# --------------------------------------------------------------------------- known defects
# Found by an adversarial audit (round 4, ninth session); xfail(strict=True) while they
# stand, so that a fix shows as an XPASS and the mark is then removed.
@pytest.mark.xfail(strict=True, reason=(
    "a tight cluster of 5% of the rows far from a wide one gets 1-2 of the 200 representatives "
    "from k-means (fewer than n_neighbors=5), so its rows join the wide cluster's edge and the "
    "wide cluster is split instead, with no warning; n_representatives=500 finds it"))
def test_a_tight_small_cluster_far_from_a_wide_one_is_found():
    X, y = skd.make_blobs(n_samples=[2000, 100], centers=[[0, 0], [15, 0]],
                          cluster_std=[2.0, 0.1], random_state=0)
    best_peer = _ari(y, KMeans(2, n_init=10, random_state=0).fit_predict(X))
    assert best_peer > 0.99
    got = _ari(y, GreedySpectralClustering(2, random_state=7).fit(X).labels_)
    assert got >= best_peer - 0.02


@pytest.mark.parametrize("seed", range(4))
def test_a_clump_of_near_identical_rows_joins_its_nearest_cluster(seed):
    """What a fix of the test above must keep (an audit found a first fix breaking both):
    40 near-identical rows beside cluster A, 13 from B, join A; 10 tight rows far from
    two clusters join one of them, and the fit is not refused (giving each clump
    representatives of its own made it a separate piece: the clump labelled with B at some
    seeds, silently, and 'more pieces than n_clusters' at others)."""
    rng = np.random.default_rng(0)
    A, B = rng.normal([0, 0], 1.0, (1000, 2)), rng.normal([8, 0], 1.0, (1000, 2))
    X = np.concatenate([A, B, rng.normal([-5, 0], 0.01, (40, 2))])
    labels = _no_degenerate_warning(lambda: GreedySpectralClustering(2, random_state=seed).fit(X)).labels_
    a = np.bincount(labels[:1000]).argmax()
    assert np.all(labels[:1000] == a) and np.all(labels[1000:2000] != a)
    assert np.all(labels[2000:] == a)
    B = rng.normal([10, 0], 1.0, (1000, 2))
    X = np.concatenate([A, B, rng.normal([5, 40], 0.05, (10, 2))])
    labels = GreedySpectralClustering(2, random_state=seed).fit(X).labels_
    assert _ari(np.r_[np.zeros(1000), np.ones(1000)], labels[:2000]) == 1.0


@pytest.mark.xfail(strict=True, reason=(
    "n_clusters='auto' on scikit-learn's anisotropic blobs (3 clusters; n_clusters=3 gives "
    "ARI 0.998) chooses 13 at seed 0: the eigengap at k=3 (0.29) barely beats the gaps of "
    "the noise (up to 0.34), and nothing says the choice is weak"))
def test_auto_finds_three_anisotropic_blobs():
    X, y = skd.make_blobs(n_samples=1500, random_state=170)
    X = X @ np.array([[0.6, -0.6], [-0.4, 0.8]])
    assert _ari(y, GreedySpectralClustering(3, random_state=0).fit(X).labels_) > 0.99
    assert GreedySpectralClustering("auto", random_state=0).fit(X).n_clusters_ == 3
