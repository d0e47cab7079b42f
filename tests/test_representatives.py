"""The representatives affinity (issue 39): the numerical core, the estimator, its inputs."""
import numpy as np
import pytest

from ooc_spectral.core import representatives as R
from ooc_spectral.core.representative_selection import select_representatives


def _blobs(n=300, seed=0):
    from sklearn.datasets import make_blobs
    X, _ = make_blobs(n, centers=3, random_state=seed)
    return X


def test_transfer_cut_equals_the_dense_bipartite_embedding():
    X = _blobs()
    reps = R.Representatives(select_representatives(X, 40, seed=0), 4)
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
    reps = R.Representatives(select_representatives(X, 60, seed=1), 5)
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
    C = select_representatives(X, 30, seed=3)
    assert C.shape == (10, 1)
    np.testing.assert_array_equal(np.sort(C[:, 0]), np.arange(10.0))
    Y = _blobs(400)
    np.testing.assert_array_equal(select_representatives(Y, 50, 7), select_representatives(Y, 50, 7))



@pytest.mark.parametrize("shift", [0.0, 1e6])
def test_the_compiled_seeding_draws_the_rows_numpys_draws(shift):
    """k-means++ compiled (numba, on large fits) and by NumPy's calls: the same seeds from
    the same generator, on rows far from the origin too (moved by their mean first, as
    select_representatives moves them); with fewer distinct rows than seeds, every
    distinct row is drawn before any repeat."""
    import dask

    pytest.importorskip("numba")
    from ooc_spectral.core.representative_selection import kmeans_plusplus

    S = _blobs(1500) + shift
    S = S - S.mean(axis=0)
    got = kmeans_plusplus(S, 300, np.random.default_rng(4))
    with dask.config.set({"ooc-spectral.numba": False}):
        ref = kmeans_plusplus(S, 300, np.random.default_rng(4))
    np.testing.assert_array_equal(got, ref)
    D = np.repeat(np.arange(6.0)[:, None], 3, axis=1).repeat(4, axis=0)  # 6 rows, 4 copies
    D = D - D.mean(axis=0)
    seeds = kmeans_plusplus(D, 10, np.random.default_rng(0))
    assert len(np.unique(seeds[:6], axis=0)) == 6 and len(np.unique(seeds, axis=0)) == 6


@pytest.mark.parametrize("d", [2, 10])  # the k-d tree's assignment, and the blocked products
def test_lloyd_stops_at_the_first_iteration_that_gains_under_rtol(d):
    """``lloyd(..., rtol)`` is the plain iteration stopped after the update of the first
    assignment whose quantization error is within ``rtol`` of the previous one's."""
    from scipy.spatial import cKDTree

    from ooc_spectral.core.representative_selection import kmeans_plusplus, lloyd

    rng = np.random.default_rng(0)
    S = rng.normal(size=(1000, d))
    C0 = kmeans_plusplus(S[:200], 40, np.random.default_rng(1))
    plain = [C0]  # C_i: i iterations
    for _ in range(9):
        plain.append(lloyd(S, plain[-1], 1))
    error = [float(np.sum(cKDTree(C).query(S)[0] ** 2)) for C in plain]
    t = next(i for i in range(1, 9) if error[i - 1] - error[i] <= 0.01 * error[i])
    assert t + 1 < 10  # the rule stops early here
    np.testing.assert_array_equal(lloyd(S, C0, 10, rtol=0.01), plain[t + 1])
    np.testing.assert_array_equal(lloyd(S, C0, 3, rtol=0.0), plain[3])

# --------------------------------------------------------------------------- #
# the estimator: GreedySpectralClustering(affinity="representatives")
# --------------------------------------------------------------------------- #
from sklearn import datasets as skd  # noqa: E402
from sklearn.cluster import KMeans  # noqa: E402
from sklearn.metrics import adjusted_rand_score  # noqa: E402

from ooc_spectral.clustering import GreedySpectralClustering  # noqa: E402
from ooc_spectral.exceptions import InvalidParameterError, NonFiniteInputError  # noqa: E402

from conftest import write_zarr  # noqa: E402


def _reps(k, **kw):
    return GreedySpectralClustering(k, affinity="representatives", random_state=0, **kw)


@pytest.fixture(scope="module")
def digits():
    return skd.load_digits(return_X_y=True)


def test_digits_beats_sklearn_nearest_neighbours(digits):
    # scikit-learn's SpectralClustering(affinity="nearest_neighbors") reaches 0.756
    X, y = digits
    sc = _reps(10).fit(X)
    assert adjusted_rand_score(y, sc.labels_) >= 0.75  # measured: 0.766 (the least of 9 seeds)
    assert sc.embedding_.shape == (1797, 10)
    np.testing.assert_allclose(np.linalg.norm(sc.embedding_, axis=1), 1.0)
    np.testing.assert_array_equal(sc.predict(X), sc.labels_)
    assert sc.representatives_.shape == (899, 64)  # m capped at n / 2


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_digits_other_seeds(digits, seed):
    X, y = digits
    sc = GreedySpectralClustering(10, affinity="representatives", random_state=seed).fit(X)
    assert adjusted_rand_score(y, sc.labels_) >= 0.80  # measured: 0.837, 0.815, 0.844


@pytest.mark.parametrize("name, data", [
    ("circles", lambda: skd.make_circles(2000, factor=0.3, noise=0.05, random_state=0)),
    ("circles-close", lambda: skd.make_circles(2000, factor=0.5, noise=0.05, random_state=0)),
    ("moons", lambda: skd.make_moons(2000, noise=0.05, random_state=0)),
])
def test_nonconvex_clusters_exactly(name, data):
    X, y = data()
    sc = _reps(2).fit(X)
    assert adjusted_rand_score(y, sc.labels_) == 1.0
    np.testing.assert_array_equal(sc.predict(X), sc.labels_)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_graph_in_k_pieces_keeps_k_coordinates(seed):
    """halo-ball: the graph is in two pieces; a third coordinate (constant and two others)
    split the halo for seeds 1 and 2 (ARI 0.12, 0.16) when the default was k + 1."""
    from ooc_spectral.datasets import generate

    X, lab = generate("halo-ball", 20000, seed=0)
    sc = GreedySpectralClustering(2, affinity="representatives", random_state=seed).fit(X)
    assert sc.embedding_.shape[1] == 2 and np.allclose(sc.eigenvalues_, 1.0)
    assert adjusted_rand_score(lab["label"], sc.labels_) == 1.0


def test_unequal_density_blobs_at_least_kmeans():
    X, y = skd.make_blobs(3000, cluster_std=[1.0, 2.5, 0.5], random_state=170)
    km = adjusted_rand_score(y, KMeans(3, n_init=10, random_state=0).fit_predict(X))
    ours = adjusted_rand_score(y, _reps(3).fit(X).labels_)
    assert ours >= km  # measured: 0.92 against 0.81


def _same_partition(a, b):
    return adjusted_rand_score(np.asarray(a), np.asarray(b)) == 1.0


def _same_embedding(E, F):
    """Equal up to a rotation: well-separated clusters repeat the eigenvalue 1, whose
    eigenvectors rounding may turn within their space; the rows' inner products stay."""
    np.testing.assert_allclose(E[:300] @ E[:300].T, F[:300] @ F[:300].T, atol=1e-7)


@pytest.fixture(scope="module")
def blobs8():
    X, y = skd.make_blobs(6000, centers=6, n_features=10, cluster_std=2.0, random_state=3)
    return X, y


def test_numpy_dask_and_zarr_give_the_same_labels(blobs8, tmp_path):
    import dask.array as da

    X, y = blobs8
    ref = _reps(6, n_representatives=200).fit(X)
    assert isinstance(ref.labels_, np.ndarray)
    z = write_zarr(tmp_path / "x.zarr", X, 512)
    for inp in (da.from_array(X, chunks=(1000, 10)), z, str(tmp_path / "x.zarr")):
        sc = _reps(6, n_representatives=200).fit(inp)
        labels = np.asarray(sc.labels_.compute())
        assert _same_partition(labels, ref.labels_)
        np.testing.assert_array_equal(np.asarray(sc.predict(inp).compute()), labels)
        _same_embedding(np.asarray(sc.embedding_.compute()), ref.embedding_)
    assert adjusted_rand_score(y, ref.labels_) > 0.9


def test_local_cluster_gives_the_same_labels(blobs8, tmp_path, client):
    X, _ = blobs8
    ref = _reps(6, n_representatives=200).fit(X)
    write_zarr(tmp_path / "x.zarr", X, 512)
    sc = _reps(6, n_representatives=200).fit(str(tmp_path / "x.zarr"))
    assert _same_partition(sc.labels_.compute(), ref.labels_)


def test_bipartite_pass_graph_is_a_tree_of_small_partials(blobs8):
    """Per chunk the task returns m x m numbers, never n x m; chunks combine in order."""
    import dask.array as da
    from ooc_spectral.pipeline.representatives import bipartite_pass
    from ooc_spectral.runtime.execution import Executor

    X, _ = blobs8
    reps = R.Representatives(select_representatives(X, 100, seed=0), 5)
    whole = R.chunk_bipartite(X, reps)
    sums = bipartite_pass(da.from_array(X, chunks=(700, 10)), reps, executor=Executor(local=True),
                          max_segments=3)
    assert sums.n == len(X) and sums.cross.shape == (100, 100)
    np.testing.assert_allclose(sums.cross, whole.cross, rtol=1e-10, atol=1e-13)


def test_checkpointed_segments_are_not_recomputed(blobs8):
    import dask.array as da
    from ooc_spectral.pipeline.representatives import bipartite_pass
    from ooc_spectral.runtime.execution import Executor

    X, _ = blobs8
    reps = R.Representatives(select_representatives(X, 50, seed=0), 5)

    class Store(dict):
        def load_partial(self, stage, s):
            return self.get((stage, s))

        def save_partial(self, stage, s, flat):
            self[(stage, s)] = flat

    store = Store()
    Xd = da.from_array(X, chunks=(500, 10))
    first = bipartite_pass(Xd, reps, executor=Executor(local=True), store=store, max_segments=4)
    assert len(store) == 4
    bad = Xd.map_blocks(lambda b: b * np.nan)  # would fail if any chunk were read again
    again = bipartite_pass(bad, reps, executor=Executor(local=True), store=store, max_segments=4)
    np.testing.assert_array_equal(again.cross, first.cross)


def test_parameters_are_checked():
    X = np.random.default_rng(0).standard_normal((50, 3))
    with pytest.raises(InvalidParameterError):
        GreedySpectralClustering(2, affinity="nearest").fit(X)
    with pytest.raises(InvalidParameterError):
        _reps(2, n_neighbors=0).fit(X)
    X[7, 1] = np.nan
    with pytest.raises(NonFiniteInputError, match="7"):
        _reps(2).fit(X)


# --------------------------------------------------------------------------- #
# the command line: ooc-spectral fit IN --out OUT --affinity representatives
# --------------------------------------------------------------------------- #
def _fit_cli(inp, out, *extra):
    from ooc_spectral.batch.cli import main

    return main(["fit", str(inp), "--out", str(out), "--affinity", "representatives",
                 "--n-clusters", "6", "--n-representatives", "200", "--engine", "threads",
                 "--quiet", *extra])


def test_cli_writes_labels_beside_the_embedding_and_resumes(blobs8, tmp_path, monkeypatch,
                                                            capsys):
    import json
    import zarr
    from ooc_spectral.pipeline import cluster_output, representatives as prep

    X, y = blobs8
    write_zarr(tmp_path / "in.zarr", X, 500)
    ref = _reps(6, n_representatives=200).fit(X)

    real_write = cluster_output._write_both

    def write_early(block, cmap, url, start, *a, **kw):  # the run stops with half written
        return 0 if start >= 3000 else real_write(block, cmap, url, start, *a, **kw)

    def stop(self):
        raise OSError("disk went away")

    monkeypatch.setattr(cluster_output, "_write_both", write_early)
    monkeypatch.setattr(cluster_output.ClusterOutput, "mark_complete", stop)
    assert _fit_cli(tmp_path / "in.zarr", tmp_path / "out", "--chunk-rows", "1000") == 1
    marks = zarr.open_array(str(tmp_path / "out" / "labels_written"))[:]
    assert 0 < np.count_nonzero(marks) < len(marks)

    # the rerun reuses the pass's saved partials (the pass is not run again) and the
    # chunks already written
    monkeypatch.setattr(cluster_output, "_write_both", real_write)
    monkeypatch.undo()
    monkeypatch.setattr(prep, "chunk_bipartite", lambda *a, **k: 1 / 0)
    assert json.loads((tmp_path / "out" / "zarr.json").read_text())["attributes"]["ooc_spectral_run"][
        "status"] == "failed"
    assert _fit_cli(tmp_path / "in.zarr", tmp_path / "out", "--chunk-rows", "1000") == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["status"] == "complete" and report["resumed"]
    assert report["rows_written"] < len(X)
    labels = zarr.open_array(str(tmp_path / "out" / "labels"))[:]
    E = zarr.open_array(str(tmp_path / "out" / "embedding"))[:]
    assert E.shape == ref.embedding_.shape and labels.dtype == np.int32
    assert _same_partition(labels, ref.labels_)
    _same_embedding(E, ref.embedding_)
    # transform with the fit's OUTDIR: predict, written the same way
    from ooc_spectral.batch.cli import main

    write_zarr(tmp_path / "new.zarr", X[:2500], 500)
    assert main(["transform", str(tmp_path / "out"), str(tmp_path / "new.zarr"), "--out",
                 str(tmp_path / "pred"), "--engine", "threads", "--quiet"]) == 0
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "pred" / "labels"))[:],
                                  labels[:2500])
    # a third run finds the complete result, warning of nothing it was not given (the
    # command line's own default --output-dtype was named as ignored); verify calls the
    # OUTDIR intact (it asked for model/, which this job does not write: exit 2 forever,
    # found by an audit); another configuration is refused
    capsys.readouterr()
    assert _fit_cli(tmp_path / "in.zarr", tmp_path / "out", "--chunk-rows", "1000") == 0
    assert "does not use" not in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "out"), "--quiet"]) == 0
    # two label chunks swapped: each decodes, neither matches its marker's digest; the
    # rerun writes them again
    c0, c1 = (tmp_path / "out" / "labels" / "c" / str(i) for i in (0, 1))
    b0, b1 = c0.read_bytes(), c1.read_bytes()
    c0.write_bytes(b1)
    c1.write_bytes(b0)
    assert main(["verify", str(tmp_path / "out"), "--quiet"]) == 1
    assert _fit_cli(tmp_path / "in.zarr", tmp_path / "out", "--chunk-rows", "1000") == 0
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "out" / "labels"))[:], labels)
    assert main(["verify", str(tmp_path / "out"), "--quiet"]) == 0
    assert _fit_cli(tmp_path / "in.zarr", tmp_path / "out", "--chunk-rows", "1000",
                    "--n-neighbors", "4") == 2


def test_cli_refuses_n_clusters_without_representatives(tmp_path, blobs8):
    from ooc_spectral.batch.cli import main

    write_zarr(tmp_path / "in.zarr", blobs8[0][:100], 50)
    assert main(["fit", str(tmp_path / "in.zarr"), "--out", str(tmp_path / "o"),
                 "--n-clusters", "3", "--quiet"]) == 2
    assert main(["fit", str(tmp_path / "in.zarr"), "--out", str(tmp_path / "o"),
                 "--affinity", "representatives", "--quiet"]) == 2


def _separated_blobs(centres, n, seed=20):
    rng = np.random.default_rng(seed)
    X = np.vstack([rng.normal(size=(n, 3)) + c for c in centres])
    return X, np.repeat(np.arange(len(centres)), n)


def test_a_graph_in_more_pieces_than_clusters_is_refused_with_advice_that_works():
    """Each piece of the graph is an eigenvalue 1; with more pieces than clusters the
    embedding kept an arbitrary few of their indicators (n_neighbors=1 on four blobs: 1,097
    of 1,200 rows at 0, ARI 0.006, exit 0). It is refused, and the advice works."""
    from ooc_spectral.exceptions import InvalidInputError

    X, y = _separated_blobs([(0, 0, 0), (5, 0, 0), (0, 5, 0), (0, 0, 5)], 300)
    kw = dict(affinity="representatives", n_representatives=50, random_state=0)
    with pytest.raises(InvalidInputError, match=r"50 separate pieces.*n_neighbors=5 \(the default\)"):
        GreedySpectralClustering(4, n_neighbors=1, **kw).fit(X)
    est = GreedySpectralClustering(4, n_neighbors=5, **kw).fit(X)
    assert adjusted_rand_score(y, est.labels_) > 0.9
    assert np.linalg.norm(np.asarray(est.embedding_), axis=1).min() > 0.5
    # five groups no row links, four clusters asked: the advice names the five
    X5, y5 = _separated_blobs([(0, 0, 0), (50, 0, 0), (0, 50, 0), (0, 0, 50), (50, 50, 50)], 200)
    with pytest.raises(InvalidInputError, match=r"5 separate pieces.*ask for n_clusters=5"):
        GreedySpectralClustering(4, **kw).fit(X5)
    est = GreedySpectralClustering(5, **kw).fit(X5)
    assert adjusted_rand_score(y5, est.labels_) == 1.0
    # one cluster asked: nothing arbitrary, every row in it (it used to be refused too)
    one = GreedySpectralClustering(1, **kw).fit(X5)
    assert np.all(one.labels_ == 0) and np.all(one.predict(X5[:50]) == 0)


def test_the_command_line_refuses_a_graph_in_more_pieces_with_exit_2_and_no_complete_output(
        tmp_path, capsys):
    """The refusal above, through ``ooc-spectral fit``: exit 2, the same message on stderr,
    and an OUTDIR that does not look complete (no report, status failed)."""
    import json

    from ooc_spectral.batch.cli import main

    X, _ = _separated_blobs([(0, 0, 0), (5, 0, 0), (0, 5, 0), (0, 0, 5)], 300)
    write_zarr(tmp_path / "in.zarr", X, 400)
    args = ["fit", str(tmp_path / "in.zarr"), "--out", str(tmp_path / "out"), "--affinity",
            "representatives", "--n-clusters", "4", "--n-representatives", "50", "--seed", "0",
            "--engine", "threads", "--quiet"]
    capsys.readouterr()
    assert main(args + ["--n-neighbors", "1"]) == 2
    err = capsys.readouterr().err
    assert "50 separate pieces" in err and "n_neighbors=5 (the default)" in err
    run = json.loads((tmp_path / "out" / "zarr.json").read_text())["attributes"]["ooc_spectral_run"]
    assert run["status"] == "failed" and "separate pieces" in run["error"]
    assert not (tmp_path / "out" / "report.json").exists()
    # the advice, followed on the same OUTDIR, is another configuration: --overwrite
    assert main(args + ["--n-neighbors", "5", "--overwrite"]) == 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("m, K, reach", [(1000, 5, 20), (77, 5, 20), (40, 3, 6), (12, 5, 5)])
def test_the_compiled_search_is_numpys_bit_for_bit(m, K, reach):
    """numba's one-pass selection (reach nearest, near-tie mask, order) against NumPy's
    threshold searches, with ties (rounded rows and representatives) and m not a multiple
    of reach."""
    pytest.importorskip("numba")
    import dask

    from ooc_spectral._accel.fused import numba_loops

    assert numba_loops() is not None  # the compiled loop is what is compared

    rng = np.random.default_rng(m)
    P = rng.standard_normal((m, 20))
    P[: m // 2] = np.round(P[: m // 2])
    X = 2.0 * rng.standard_normal((1500, 20))
    X[:300] = np.round(X[:300])  # ties
    X[300:800] = P[rng.integers(m, size=500)] + 0.05 * rng.standard_normal((500, 20))  # no near ties
    reps = R.Representatives(P, K, reach=reach)
    with dask.config.set({"ooc-spectral.numba": False}):
        ref = reps._search(X, K, reps.reach)
    got = reps._search(X, K, reps.reach)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])
    if reach > K:  # both cases of the near-tie mask occur
        far = np.isinf(ref[1][:, K:])
        assert far.any() and (~far).any()
    # the K nearest by brute force (rows without exact ties)
    full = ((X[300:, None, :] - P[None, :, :]) ** 2).sum(-1)
    np.testing.assert_array_equal(got[0][300:, :K], np.argsort(full, axis=1)[:, :K])


def test_n_representatives_auto_is_a_hundred_per_cluster():
    from ooc_spectral.batch.cli import build_parser
    from ooc_spectral.clustering import GreedySpectralClustering
    from ooc_spectral.pipeline.representatives import resolve_n_representatives

    assert [resolve_n_representatives("auto", k) for k in (1, 2, 7, 10, 30)] == \
        [100, 200, 700, 1000, 1000]
    assert resolve_n_representatives("auto", "auto") == 1000
    assert resolve_n_representatives(37, 2) == 37
    X = _blobs(1000)
    est = GreedySpectralClustering(3, random_state=0).fit(X)
    assert est.n_representatives == "auto" and len(est.representatives_) == 300
    assert len(GreedySpectralClustering(3, n_representatives=50, random_state=0)
               .fit(X).representatives_) == 50
    with pytest.raises(ValueError, match="n_representatives"):
        GreedySpectralClustering(3, n_representatives="many").fit(X)
    parse = build_parser().parse_args
    assert parse(["fit", "in.zarr", "--out", "o", "--n-clusters", "3"]).n_representatives == "auto"
    assert parse(["fit", "in.zarr", "--out", "o", "--n-representatives", "50"]).n_representatives == 50


@pytest.mark.parametrize("d", [2, 4])
def test_the_trees_staged_query_finds_every_near_tie(d):
    """The k-d tree asks first for about K 1.25^d neighbours, then again for all reach
    where the last is still a near tie: the same neighbourhoods as one query for reach."""
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(d)
    P = rng.standard_normal((150, d))
    X = np.concatenate([2.0 * rng.standard_normal((3000, d)),  # spread: many near ties
                        P[rng.integers(150, size=1000)] + 1e-3 * rng.standard_normal((1000, d))])
    reps = R.Representatives(P, 5, reach=20)
    index, d2 = reps._search(X, 5, 20)
    dist, ref = cKDTree(P - P.mean(axis=0)).query(X - P.mean(axis=0), k=20)
    near = np.ones_like(dist, dtype=bool)
    near[:, 5:] = dist[:, 5:] <= 1.25 * dist[:, 4:5]
    assert 0 < near[:, 5:].sum(axis=1).max() and near[:, -1].any() and not near[:, -1].all()
    np.testing.assert_array_equal(np.isfinite(d2), near)
    np.testing.assert_array_equal(index[near], ref[near])
    np.testing.assert_allclose(d2[near], dist[near] ** 2, rtol=1e-12)


def test_the_solve_by_pieces_equals_the_whole_solve():
    """S block diagonal over three pieces (one of a single representative): the solve by
    pieces gives the whole solve's eigenvalues and the same invariant subspace, and on
    blobs far apart the fit's coordinates are those of the whole solve up to the basis
    of the repeated eigenvalue 1."""
    import scipy.linalg

    from ooc_spectral.core.graph_pieces import leading_by_pieces

    rng = np.random.default_rng(3)
    blocks = []
    for size in (7, 1, 12):
        B = rng.random((size, size))
        blocks.append(0.5 * (B + B.T) / size)
    perm = rng.permutation(20)  # the pieces interleaved, as representatives are
    S = scipy.linalg.block_diag(*blocks)[np.ix_(perm, perm)]
    for p in (1, 4, 9):
        mu, W = leading_by_pieces(S, p)
        full, V = scipy.linalg.eigh(S)
        np.testing.assert_allclose(mu, full[::-1][:p], rtol=0, atol=1e-13)
        np.testing.assert_allclose(W.T @ W, np.eye(p), atol=1e-13)
        np.testing.assert_allclose(S @ W, W * mu, atol=1e-13)
        if p < 20 and full[::-1][p - 1] - full[::-1][p] > 1e-6:  # a gap: one subspace
            Vp = V[:, ::-1][:, :p]
            np.testing.assert_allclose(W @ W.T, Vp @ Vp.T, atol=1e-12)
        piece = np.repeat([0, 1, 2], [7, 1, 12])[perm]
        for j in range(p):  # each vector lives on one piece
            assert np.unique(piece[np.flatnonzero(W[:, j])]).size == 1


@pytest.mark.parametrize("K", [5, 12])
def test_the_compiled_pair_sums_are_numpys_bincount_bit_for_bit(K):
    """B' D_X^-1 B and the degrees by the compiled loop equal NumPy's bincount over the
    flattened pairs exactly (the same sums in the same order), on a real graph whose
    rows share representatives."""
    import dask

    pytest.importorskip("numba")
    X = _blobs(2000, seed=4)
    reps = R.Representatives(select_representatives(X, 60, seed=0), K)
    index, b = reps.weights(X)
    compiled = R.bipartite_sums(index, b, reps.size)
    with dask.config.set({"ooc-spectral.numba": False}):
        plain = R.bipartite_sums(index, b, reps.size)
    assert np.count_nonzero(plain.cross) > 2 * reps.size  # rows do share representatives
    assert np.array_equal(compiled.cross, plain.cross)
    assert np.array_equal(compiled.degrees, plain.degrees)
    dense = np.zeros((len(X), reps.size))
    np.put_along_axis(dense, index, b, axis=1)
    np.testing.assert_allclose(compiled.cross, dense.T @ (dense / dense.sum(1, keepdims=True)),
                               rtol=1e-12, atol=1e-15)


def test_rows_far_from_every_representative_take_the_limit_of_their_weights():
    """A row thousands of the graph's scales away (a missing-value code, a unit error):
    every weight exp(-d^2 / (2 s_t s_j)) underflows. It used to embed as 0 / 0 = NaN and
    take label 0 in predict, and to crash the fit with "infs or NaNs" on finite input.
    Now its weights are their limit (the nearest in d^2 / s_j weighs 1), a FarRowsWarning
    says how many rows, and the other rows' weights are unchanged bit for bit."""
    import warnings

    from sklearn.datasets import make_blobs

    from ooc_spectral import FarRowsWarning, GreedySpectralClustering

    X, y = make_blobs(3000, n_features=2, centers=[[-10, 0], [0, 0], [10, 0]], cluster_std=1.0,
                      random_state=0)
    est = GreedySpectralClustering(3, random_state=0).fit(X)
    right = np.bincount(est.labels_[y == 2]).argmax()
    far = np.array([[1e4, 0.0], [1e4, 3.0], [1e6, -2.0]])  # beyond the blob at x = +10
    with pytest.warns(FarRowsWarning, match="3 of 3 rows are so far"):
        E = est.cluster_map_.embed(far)
        labels = est.predict(far)
    assert np.all(np.isfinite(E)) and np.all(labels == right)
    reps = est.cluster_map_.tmap.representatives
    with warnings.catch_warnings():
        warnings.simplefilter("error", FarRowsWarning)  # ordinary rows: no warning
        index, b = reps.neighbourhood(X)
    index2, d2 = reps._search(X, reps.n_neighbors, reps.reach)
    s = np.sqrt(d2[:, :reps.n_neighbors]).mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.exp(-np.fmax(d2 / (reps.scales[index2] * (2.0 * s[:, None])), 0.0))
    assert np.array_equal(index, index2) and np.array_equal(b, expected)

    sentinel = X.copy()
    sentinel[[5, 50, 500], 1] = -9999.0  # missing-value codes among the training rows
    with pytest.warns(FarRowsWarning, match="3 of 3000 rows"):
        sums = R.chunk_bipartite(sentinel, reps)
    assert np.all(np.isfinite(sums.cross)) and np.all(np.isfinite(sums.degrees))
    tmap = R.solve_transfer_cut(sums, reps, 3)  # used to raise: infs or NaNs
    assert np.all(np.isfinite(tmap.coefficients)) and tmap.eigenvalues[0] == pytest.approx(1.0)


@pytest.mark.parametrize("scale", [1e-200, 1e160])
def test_rows_whose_squared_distances_leave_float64_are_refused_naming_the_fix(scale):
    """Squared distances that overflow (an IndexError from the k-d tree's infinite
    distances) or underflow (every row on its representatives: "32 pieces, ask for
    n_clusters=32") used to come out as a traceback or a wrong refusal."""
    from ooc_spectral import GreedySpectralClustering
    from ooc_spectral.exceptions import InvalidInputError

    X = _blobs()
    with pytest.raises(InvalidInputError, match="squared distances (overflow|underflow).*rescale"):
        GreedySpectralClustering(3, random_state=0).fit(X * scale)


@pytest.mark.parametrize("scale", [1e-140, 1e140])
def test_rows_at_extreme_but_representable_scales_cluster_as_at_unit_scale(scale):
    from sklearn.metrics import adjusted_rand_score

    from ooc_spectral import GreedySpectralClustering

    X = _blobs()
    unit = GreedySpectralClustering(3, random_state=0).fit(X).labels_
    scaled = GreedySpectralClustering(3, random_state=0).fit(X * scale).labels_
    assert adjusted_rand_score(unit, scaled) == 1.0


def test_the_far_row_and_spread_thresholds_are_pinned():
    """The limit applies past an exponent of 700 (weights below e^-700 ~ 1e-304), not
    before; the spread refused is above 1e150 (times sqrt(features)) or below 1e-150."""
    import warnings

    from ooc_spectral.exceptions import FarRowsWarning, InvalidInputError
    from ooc_spectral.pipeline.representatives import check_spread

    near = np.array([[699.0, 699.5, np.inf]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FarRowsWarning)
        R._far_rows_at_their_limit(near, 2)
    assert near.tolist() == [[699.0, 699.5, np.inf]]  # unchanged below the threshold
    far = np.array([[701.0, 701.5, np.inf]])
    with pytest.warns(FarRowsWarning, match="1 of 1 rows"):
        R._far_rows_at_their_limit(far, 2)
    assert far.tolist() == [[0.0, 0.5, np.inf]]
    one = np.array([[0.0], [1.0]])  # spread 0.5 around the mean, one feature
    check_spread(one * 1.9e150)  # spread 0.95e150
    check_spread(one * 2.1e-150)  # spread 1.05e-150
    for scale in (2.1e150, 1.9e-150):
        with pytest.raises(InvalidInputError, match="rescale"):
            check_spread(one * scale)


def test_the_command_line_transform_of_far_rows_is_finite_complete_and_verified(blobs8, tmp_path):
    """A nightly transform whose rows include missing-value codes (-9999): it used to
    write NaN coordinates and label 0 with exit 0 (and an all-NaN chunk zarr does not
    store). Now: exit 0, every coordinate finite, the far rows labelled as predict labels
    them, the warning on stderr, and verify finds the OUTDIR intact."""
    import subprocess
    import sys

    import zarr

    from ooc_spectral.batch.cli import main

    X, _ = blobs8
    write_zarr(tmp_path / "in.zarr", X, 1000)
    assert _fit_cli(tmp_path / "in.zarr", tmp_path / "out") == 0
    new = X[:2000].copy()
    new[[10, 500, 1500], 3] = -9999.0
    write_zarr(tmp_path / "new.zarr", new, 500)
    run = subprocess.run([sys.executable, "-m", "ooc_spectral", "transform", str(tmp_path / "out"),
                          str(tmp_path / "new.zarr"), "--out", str(tmp_path / "pred"),
                          "--engine", "threads"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    import re
    assert re.search(r"FarRowsWarning: 3 of \d+ rows are so far from every representative",
                     run.stderr)
    E = zarr.open_array(str(tmp_path / "pred" / "embedding"))[:]
    labels = zarr.open_array(str(tmp_path / "pred" / "labels"))[:]
    assert np.all(np.isfinite(E))
    assert main(["verify", str(tmp_path / "pred"), "--quiet"]) == 0
    ref = _reps(6, n_representatives=200).fit(X)
    with pytest.warns(Warning):
        expected = ref.predict(new[[10, 500, 1500]])
    assert labels[[10, 500, 1500]].tolist() == expected.tolist()


def _spectrum_matrix(values, seed):
    """``V diag(values) V'`` for a seeded orthogonal ``V``: a dense, connected symmetric matrix
    of known spectrum."""
    r = len(values)
    V = np.linalg.qr(np.random.default_rng(seed).standard_normal((r, r)))[0]
    S = (V * np.asarray(values)) @ V.T
    return 0.5 * (S + S.T), V


def test_the_lanczos_solve_equals_the_dense_solve():
    """A connected S of order 400 (at least LANCZOS_MIN_SIZE): the certified Lanczos solve
    of the leading eigenpairs above a gap gives the dense solve's eigenvalues to 1e-14 and
    its invariant subspaces to 1e-12,
    descending, orthonormal, and is what leading_by_pieces returns."""
    import scipy.linalg

    from ooc_spectral.core import graph_pieces as gp

    rng = np.random.default_rng(5)
    values = np.concatenate([[1.0], np.sort(rng.uniform(0.5, 0.95, 12))[::-1],
                             rng.uniform(0.0, 0.45, 387)])
    S, _ = _spectrum_matrix(values, 6)
    assert S.shape[0] >= gp.LANCZOS_MIN_SIZE
    full, V = scipy.linalg.eigh(S)
    full, V = full[::-1], V[:, ::-1]
    for p in (1, 5, 10, 13):
        found = gp._leading_lanczos(S, p)
        assert found is not None  # certified
        mu, W = found
        np.testing.assert_allclose(mu, full[:p], rtol=0, atol=1e-14)
        np.testing.assert_allclose(W.T @ W, np.eye(p), atol=1e-13)
        np.testing.assert_allclose(W @ W.T, V[:, :p] @ V[:, :p].T, atol=1e-12)
        mu2, W2 = gp.leading_by_pieces(S, p, (1, np.zeros(400, dtype=np.int64)))
        np.testing.assert_array_equal(mu2, mu)
        np.testing.assert_array_equal(W2, W)


def test_the_lanczos_certificate_refuses_a_missed_or_tied_eigenvalue():
    """The certificate holds for the p leading eigenpairs and fails where one above the
    p-th is missing (pairs 2..p+1 given), where the p-th is within LANCZOS_GAP of the next
    (then the dense solve answers), and for pairs that are not eigenpairs."""
    import scipy.linalg

    from ooc_spectral.core import graph_pieces as gp

    values = np.concatenate([[1.0, 0.9, 0.8, 0.7], np.linspace(0.5, 0.0, 296)])
    S, V = _spectrum_matrix(values, 7)
    assert gp._certified(S, values[:3], V[:, :3])
    assert not gp._certified(S, values[1:4], V[:, 1:4])  # the top one missed
    # a value off by more than the residual bound, spread so thin over the vector's 300
    # entries that no entry of the residual reaches the bound: the norm catches it
    off = values[:3].copy()
    off[2] += 0.9e-10 / np.max(np.abs(V[:, 2]))  # the residual bound, 1e-10
    assert np.max(np.abs(S @ V[:, :3] - V[:, :3] * off)) < 1e-10
    assert abs(off[2] - values[2]) > 1e-10
    assert not gp._certified(S, off, V[:, :3])
    assert not gp._certified(S, values[:3], np.linalg.qr(V[:, :3] + 1e-6 * V[:, 3:6])[0])
    tied = values.copy()
    tied[3] = tied[2] - 1e-11  # the 3rd and 4th closer than the certificate's gap
    S, V = _spectrum_matrix(tied, 8)
    assert not gp._certified(S, tied[:3], V[:, :3])
    assert gp._leading_lanczos(S, 3) is None
    mu, W = gp.leading_by_pieces(S, 3, (1, np.zeros(300, dtype=np.int64)))
    ref, U = scipy.linalg.eigh(S, subset_by_index=[297, 299])
    np.testing.assert_array_equal(mu, ref[::-1])
    np.testing.assert_array_equal(W, U[:, ::-1])


@pytest.mark.parametrize("shift", [0.0, 1e6])
def test_a_fit_by_lanczos_gives_the_dense_solves_labels(shift, monkeypatch):
    """Overlapping 20-D blobs (one connected graph of 300 representatives), also far from
    the origin: the fit with the Lanczos solve has the dense solve's representatives and
    labels exactly, its eigenvalues to 1e-14 and its embedding to 1e-9."""
    from ooc_spectral.core import graph_pieces as gp

    X, _ = skd.make_blobs(6000, n_features=20, centers=4, cluster_std=6.0, random_state=2)
    X = X + shift
    dense = _reps(4, n_representatives=300).fit(X)  # 6000 rows: below LANCZOS_MIN_ROWS
    monkeypatch.setattr(R, "LANCZOS_MIN_ROWS", 6000)
    fast = _reps(4, n_representatives=300).fit(X)
    monkeypatch.setattr(gp, "LANCZOS_MIN_SIZE", 10**9)  # the dense solve again
    again = _reps(4, n_representatives=300).fit(X)
    np.testing.assert_array_equal(again.embedding_, dense.embedding_)
    assert fast.representatives_.shape == (300, 20)
    np.testing.assert_array_equal(fast.representatives_, dense.representatives_)
    np.testing.assert_array_equal(fast.labels_, dense.labels_)
    np.testing.assert_allclose(fast.eigenvalues_, dense.eigenvalues_, rtol=0, atol=1e-14)
    np.testing.assert_allclose(fast.embedding_, dense.embedding_, rtol=0, atol=1e-9)
    assert not np.array_equal(fast.embedding_, dense.embedding_)  # two solves, not one


def test_lanczos_gives_up_early_on_a_crowded_spectrum():
    """A spectrum crowded below 1 (as digits' graph has): Lanczos does not converge within
    LANCZOS_MAX_RESTARTS restarts, and the dense solve answers, bit for bit eigh's."""
    import scipy.linalg

    from ooc_spectral.core import graph_pieces as gp

    values = np.concatenate([[1.0], 1.0 - np.geomspace(1e-3, 0.3, 399)])
    S, _ = _spectrum_matrix(values, 9)
    assert gp._leading_lanczos(S, 10) is None
    mu, W = gp.leading_by_pieces(S, 10, (1, np.zeros(400, dtype=np.int64)))
    ref, U = scipy.linalg.eigh(S, subset_by_index=[390, 399])
    np.testing.assert_array_equal(mu, ref[::-1])
    np.testing.assert_array_equal(W, U[:, ::-1])


def test_the_lanczos_thresholds_at_their_edges():
    """The thresholds pinned with literals: Lanczos from order 256 (255: the dense solve),
    a p-th eigenvalue certified 1.2e-8 above the next and refused 0.8e-8 above it (the
    gap, 1e-8), and tried in fits of 50,000 rows (49,999: not)."""
    from ooc_spectral.core import graph_pieces as gp

    for r, tried in ((255, False), (256, True)):
        values = np.concatenate([[1.0, 0.9, 0.8], np.linspace(0.5, 0.0, r - 3)])
        S, _ = _spectrum_matrix(values, 10)
        assert (gp._leading_lanczos(S, 3) is not None) == tried, r
    for gap, certified in ((1.2e-8, True), (0.8e-8, False)):
        values = np.concatenate([[1.0, 0.9, 0.8, 0.8 - gap], np.linspace(0.5, 0.0, 296)])
        S, V = _spectrum_matrix(values, 11)
        assert gp._certified(S, values[:3], V[:, :3]) == certified, gap

    seen = []
    real = R.leading_by_pieces

    def recording(S, p, pieces=None, lanczos=True):
        seen.append(lanczos)
        return real(S, p, pieces, lanczos=lanczos)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(R, "leading_by_pieces", recording)
        X, _ = skd.make_blobs(50_000, n_features=2, centers=3, cluster_std=2.0, random_state=0)
        _reps(3, n_representatives=30).fit(X[:49_999])
        _reps(3, n_representatives=30).fit(X)
    assert seen == [False, True]
