"""A Gaussian or Laplacian kernel nearly constant over the data (gamma 1e-8 on data of unit
scale): one dictionary point holds every row within tol, too few for ``n_components``.
Where the exact problem is at hand it is solved exactly, against the full Gram matrix's
eigenvalues; where even the exact problem resolves nothing, or it is out of reach, the fit
is refused with advice that works (issue 53, the certificate grid's extreme section)."""

import re
import warnings

import numpy as np
import pytest
from scipy.linalg import eigh
from sklearn.decomposition import KernelPCA
from sklearn.metrics.pairwise import laplacian_kernel, rbf_kernel

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.exceptions import DictionaryError, DictionaryWarning
from test_certificate import check_certified, dataset

GAMMA = 1e-8
GRAM = {"rbf": rbf_kernel, "laplacian": laplacian_kernel}


def fit(X, **params):
    params = {"n_components": 2, "gamma": GAMMA, "tol": 1e-3, "random_state": 0, **params}
    return GreedySpectralEmbedding(**params).fit(X)


@pytest.mark.parametrize("kernel, offset", [("rbf", 0.0), ("laplacian", 1e3)])
def test_a_nearly_constant_kernel_is_kernel_pca_on_the_full_gram_matrix(kernel, offset):
    X = dataset("moons") + offset
    with pytest.warns(DictionaryWarning, match=r"needs more directions than the 1 points.*"
                                               r"solved exactly on the 300 x 300 Gram matrix"):
        est = fit(X, kernel=kernel)
    assert est.spectral_map_.dictionary.L is None  # the exact path: every row a point
    assert est.spectral_map_.dictionary.size == len(X) and est.max_residual_ == 0.0
    # every exact eigenvalue (Gram matrix from differences in extended precision) inside
    check_certified(kernel, X, est, 1e-3)
    # scikit-learn's KernelPCA on its own float64 Gram matrix: within the interval, widened
    # by its own width (KernelPCA's rounding is of the same size as the interval's)
    K = GRAM[kernel](X, gamma=GAMMA)
    kpca = KernelPCA(2, kernel="precomputed", eigen_solver="dense").fit(K)
    lo, hi = est.eigenvalue_interval_.T
    assert np.all((kpca.eigenvalues_ >= 2 * lo - hi) & (kpca.eigenvalues_ <= 2 * hi - lo))
    assert kpca.eigenvalues_[1] > 10 * (hi - lo).max()  # the directions are resolved
    # the embedding: KernelPCA's up to sign, within rounding over the eigengap
    E, R = est.transform(X), kpca.transform(K)
    E = E * np.sign(np.sum(E * R, axis=0))
    gap = min(kpca.eigenvalues_[0] - kpca.eigenvalues_[1], kpca.eigenvalues_[1])
    assert np.max(np.abs(E - R)) <= 10 * (hi - lo).max() / gap * np.max(np.abs(R))


def test_the_divisive_normalization_is_the_normalized_gram_matrixs_spectrum():
    X = dataset("s-curve")
    with pytest.warns(DictionaryWarning, match="solved exactly"):
        est = fit(X, normalization="divisive")
    assert est.spectral_map_.dictionary.L is None
    K = rbf_kernel(X, gamma=GAMMA)
    d = K.sum(axis=1)
    vals, V = eigh(K / np.sqrt(np.outer(d, d)))
    ref = vals[::-1][1:3]  # the trivial first eigenvalue (1) dropped
    from ooc_spectral.pipeline.exact import divisive_allowance

    a = divisive_allowance(est.spectral_map_.dictionary.kernel, X)
    assert a < 1e-3 * ref[1]  # resolved: far above the rounding estimate
    np.testing.assert_allclose(est.eigenvalues_, ref, rtol=0, atol=2 * a)
    # the rows' coordinates: the normalized matrix's eigenvectors, up to sign
    E = est.transform(X)
    W = V[:, ::-1][:, 1:3]
    E = E * np.sign(np.sum(E * W, axis=0))
    assert np.max(np.abs(E - W)) <= 1e-4 * np.max(np.abs(W))


def _followed(message: str, X, **params):
    """The fit the advice in ``message`` names (a gamma, or max_dictionary_size)."""
    if (m := re.search(r"raise max_dictionary_size to (\d+)", message)):
        return fit(X, **{**params, "max_dictionary_size": int(m.group(1))})
    m = re.search(r"try gamma=([0-9.e+-]+)", message)
    assert m, message
    return fit(X, **{**params, "gamma": float(m.group(1))})


def test_where_even_the_exact_problem_resolves_nothing_it_is_refused_with_a_gamma_that_works():
    X = dataset("moons")
    with pytest.raises(DictionaryError, match=r"nearly constant.*even the exact problem on all "
                                              r"300 rows resolves no 2 directions") as info:
        fit(X, gamma=1e-15)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DictionaryWarning)
        est = _followed(str(info.value), X)
    assert est.gamma_ > 1e-3
    check_certified("rbf", X, est, 1e-3)


def test_only_the_cap_keeping_the_exact_problem_away_advises_it():
    X = dataset("moons")
    with pytest.raises(DictionaryError, match=r"nearly constant.*raise max_dictionary_size to "
                                              r"300 and it is solved exactly") as info:
        fit(X, max_dictionary_size=200)
    with pytest.warns(DictionaryWarning, match="solved exactly"):
        est = _followed(str(info.value), X)
    assert est.spectral_map_.dictionary.L is None and est.gamma_ == GAMMA
    check_certified("rbf", X, est, 1e-3)


def test_out_of_reach_of_the_exact_problem_it_is_refused_with_a_gamma_that_works(monkeypatch):
    from ooc_spectral.pipeline import exact

    monkeypatch.setattr(exact, "exact_max_rows", lambda memory=None: 100)  # 300 rows: too many
    X = dataset("moons")
    with pytest.raises(DictionaryError, match=r"nearly constant.*gamma=1e-08 is .* times below "
                                              r"the median heuristic's") as info:
        fit(X)
    assert "max_dictionary_size" not in str(info.value)
    est = _followed(str(info.value), X)
    assert est.spectral_map_.dictionary.L is not None  # the greedy path, certified
    assert est.max_residual_ <= 1e-3
    check_certified("rbf", X, est, 1e-3)


def test_the_command_line_solves_it_exactly_and_says_so(main_, tmp_path):
    import json

    from test_bad_input_cli import FAST, write

    X = dataset("moons")
    data = write(tmp_path / "x.zarr", X)
    proc = main_("fit", data, "--out", tmp_path / "out", "--gamma", "1e-8", "--tol", "1e-3",
                 *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "solved exactly on the 300 x 300 Gram matrix" in proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["pass2_tasks"] is None  # the exact path
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DictionaryWarning)
        est = fit(X)
    np.testing.assert_array_equal(report["eigenvalue_interval"], est.eigenvalue_interval_)


def test_the_command_line_capped_refusal_advises_the_cap(main_, tmp_path):
    from test_bad_input_cli import FAST, write

    data = write(tmp_path / "x.zarr", dataset("moons"))
    proc = main_("fit", data, "--out", tmp_path / "out", "--gamma", "1e-8", "--tol", "1e-3",
                 "--max-dictionary-size", "200", *FAST)
    assert proc.returncode == 2
    assert "raise max_dictionary_size to 300 and it is solved exactly" in proc.stderr


def test_spectral_clustering_on_the_kernel_graph_takes_the_same_exact_path():
    """``affinity="kernel"`` clusters the divisive embedding: the same fallback, against
    Ng, Jordan & Weiss on the full normalized Gram matrix (its two leading eigenvectors,
    rows scaled to unit length, k-means)."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    from ooc_spectral import GreedySpectralClustering

    X = dataset("moons")
    with pytest.warns(DictionaryWarning, match="spectral embedding is solved exactly"):
        est = GreedySpectralClustering(n_clusters=2, affinity="kernel", gamma=GAMMA, tol=1e-3,
                                       random_state=0).fit(X)
    assert est.embedding_estimator_.spectral_map_.dictionary.L is None
    K = rbf_kernel(X, gamma=GAMMA)
    d = K.sum(axis=1)
    V = eigh(K / np.sqrt(np.outer(d, d)))[1][:, ::-1][:, :2]
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    ref = KMeans(2, n_init=10, random_state=0).fit_predict(V)
    assert adjusted_rand_score(ref, est.labels_) == 1.0
