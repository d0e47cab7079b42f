"""Error advice computed from the situation and checked (issue 38, item 5).

The two cases of the issue: ``n_components`` beyond the dictionary at the median
heuristic's gamma (the advice named the heuristic the fit had used), and a gamma so
large that every row enters the dictionary (the advice halved gamma, and said "after
scanning 0 of n rows"). Following each advice must work, or lead to another, more
specific message.
"""

import warnings

import numpy as np
import pytest

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.exceptions import DictionaryError, DictionarySizeError


def _roll(n=4000, seed=0):
    rng = np.random.default_rng(seed)
    t = 1.5 * np.pi * (1 + 2 * rng.random(n))
    return np.c_[t * np.cos(t), 21 * rng.random(n), t * np.sin(t)]


def test_too_many_components_where_the_exact_problem_is_at_hand_are_solved_exactly():
    """n_components beyond the dictionary at tol, on rows whose n x n problem fits: the
    exact problem is solved (and said so), equal to KernelPCA's."""
    from sklearn.decomposition import KernelPCA

    from ooc_spectral.exceptions import DictionaryWarning

    X = _roll(1200)
    with pytest.warns(DictionaryWarning, match=r"n_components=120 needs more directions than "
                                               r"the \d+ points the dictionary holds"):
        est = GreedySpectralEmbedding(n_components=120, random_state=0).fit(X)
    assert est.max_residual_ == 0.0 and est.dictionary_.shape[0] == len(X)
    ref = KernelPCA(120, kernel="rbf", gamma=est.gamma_, eigen_solver="dense").fit(X)
    np.testing.assert_allclose(est.eigenvalues_, ref.eigenvalues_, rtol=1e-8,
                               atol=1e-10 * ref.eigenvalues_[0])


def test_too_many_components_at_the_heuristic_gamma():
    """Where the exact problem is not at hand (more rows than max_dictionary_size), one
    advice, checked: dictionary_size = n_components + 1, which Algorithm 2 reaches on a
    seeded sample with a resolved factor; following it works."""
    X = _roll(1200)
    with pytest.raises(DictionaryError) as info:
        GreedySpectralEmbedding(n_components=120, random_state=0, max_dictionary_size=1199).fit(X)
    text = str(info.value)
    assert "gamma=None picks the median heuristic" not in text  # what the fit used
    assert "larger gamma" not in text and "smaller tol" not in text  # one advice
    assert "lower n_components" not in text
    assert "ask for dictionary_size=121" in text and "on a seeded sample of 1200 rows" in text
    # following it works
    est = GreedySpectralEmbedding(n_components=120, dictionary_size=121, random_state=0,
                                  max_dictionary_size=1199).fit(X)
    assert est.eigenvalues_.shape == (120,) and len(est.dictionary_indices_) == 121


def test_an_advice_that_would_fail_is_not_given():
    """Where Algorithm 2 cannot reach the size with a factor float64 resolves (500
    components of 3-D rows), the one advice is fewer components, the dictionary's own."""
    X = np.random.default_rng(0).normal(size=(3000, 3))
    with pytest.raises(DictionaryError) as info:
        GreedySpectralEmbedding(n_components=500, random_state=0, max_dictionary_size=2999,
                                tol=1e-2).fit(X)
    text = str(info.value)
    assert "dictionary_size=" not in text
    m = int(__import__("re").search(r"lower n_components to at most (\d+)", text).group(1))
    est = GreedySpectralEmbedding(n_components=m, random_state=0, max_dictionary_size=2999,
                                  tol=1e-2).fit(X)
    assert est.eigenvalues_.shape == (m,)


def test_clustering_errors_name_n_clusters():
    """GreedySpectralClustering passes n_clusters on as n_components: its errors name the
    parameter the user set, and n_clusters beyond the rows is refused before any work."""
    from ooc_spectral import GreedySpectralClustering

    from ooc_spectral.exceptions import InvalidInputError

    X = _roll(300)
    with pytest.raises(DictionaryError, match=r"n_clusters=5000 exceeds what the 300 rows of X "
                                              r"hold.*lower n_clusters to at most 300") as info:
        GreedySpectralClustering(n_clusters=5000, affinity="kernel", random_state=0).fit(X)
    assert "n_components" not in str(info.value)
    # the default (the representatives graph) refuses it before any work, in the same terms
    with pytest.raises(InvalidInputError, match=r"300 rows, fewer than n_clusters=5000; "
                                                r"lower n_clusters") as info:
        GreedySpectralClustering(n_clusters=5000, random_state=0).fit(X)
    assert "n_components" not in str(info.value)


def test_too_many_components_for_the_rows():
    X = _roll(100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DictionaryError) as info:
            GreedySpectralEmbedding(n_components=150, gamma=1e-4, random_state=0).fit(X)
    assert "exceeds what the 100 rows of X hold" in str(info.value)
    assert "lower n_components to at most 99" in str(info.value)  # centring takes one


def test_a_huge_gamma_names_the_heuristic_checked():
    X = _roll()
    with pytest.raises(DictionarySizeError) as info:
        GreedySpectralEmbedding(gamma=1e6, max_dictionary_size=300, random_state=0).fit(X)
    text = str(info.value)
    assert "after scanning 0 of" not in text
    assert "after scanning at least 301 of 4000 rows" in text
    assert "gamma=5e+05" not in text
    m = __import__("re").search(r"try gamma=([0-9.e+-]+): a greedy scan of a seeded sample "
                                r"of 2000 rows at that gamma and tol=0.001 keeps (\d+) points",
                                text)
    assert m, text
    suggested, kept = float(m.group(1)), int(m.group(2))
    assert kept < 300
    # following it works, with both forms named
    for gamma in (suggested, None):
        est = GreedySpectralEmbedding(gamma=gamma, max_dictionary_size=300,
                                      random_state=0).fit(X)
        assert len(est.dictionary_indices_) < 300


def test_rows_of_a_few_distinct_values_are_named_not_blamed_on_gamma():
    """Three distinct rows, each 100 times, and n_components=4: the error said the rbf
    kernel at gamma=10 was 'nearly constant' (its value between the rows is exp(-1000))
    and advised a larger gamma, a smaller tol or dictionary_size=5, each of which fails
    again (an outside audit). It now names the groups of equal rows, and its one advice,
    fewer components (two: centred, three groups span two directions), fits."""
    X = np.repeat(np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]]), 100, axis=0)
    with pytest.raises(DictionaryError) as info:
        GreedySpectralEmbedding(4, gamma=10.0, random_state=0).fit(X)
    msg = str(info.value)
    assert "3 groups of equal or nearly equal rows" in msg
    assert "larger gamma" not in msg and "dictionary_size=" not in msg
    assert "lower n_components to at most 2" in msg  # three centred groups span two
    for kw in (dict(gamma=1000.0), dict(gamma=10.0, tol=1e-9)):  # what it used to advise
        with pytest.raises(DictionaryError, match="groups of equal"):
            GreedySpectralEmbedding(4, random_state=0, **kw).fit(X)
    est = GreedySpectralEmbedding(2, gamma=10.0, random_state=0).fit(X)
    assert est.dictionary_.shape[0] == 3 and est.max_residual_ <= 1e-3


def test_a_dictionary_heading_for_every_row_gets_one_checked_way_out(monkeypatch):
    """Where the exact problem is not at hand (patched here: no memory for it) a dictionary
    heading for every row stops early; its advice was "try tol x 10, or gamma / 2", never
    checked. Now one advice, the first larger tol or smaller gamma with which a greedy scan of
    a seeded sample keeps a small dictionary, and following it works. 70 tight clusters in
    50-D: within a cluster a row's residual (about 5e-3) is above tol=1e-3, below 1e-2."""
    import re

    from ooc_spectral.pipeline import exact

    monkeypatch.setattr(exact, "exact_max_rows", lambda memory=None: 100)
    rng = np.random.default_rng(0)
    X = np.repeat(rng.normal(size=(70, 50)), 10, axis=0) + 0.008 * rng.normal(size=(700, 50))
    params = dict(n_components=2, gamma=0.5, max_dictionary_size=699, random_state=0)
    with pytest.raises(DictionarySizeError) as info:
        GreedySpectralEmbedding(tol=1e-3, **params).fit(X)
    text = str(info.value)
    assert "stopped early" in text and info.value.__cause__ is None
    assert "try gamma=" not in text and text.count("try tol=") == 1, text  # one advice
    m = re.search(r"try tol=([0-9.e+-]+) \(a greedy scan of a seeded sample of 700 rows at "
                  r"tol=\1 keeps (\d+) points, without the early stop\)", text)
    assert m, text
    advised, kept = float(m.group(1)), int(m.group(2))
    assert advised == pytest.approx(1e-2) and kept < 350
    est = GreedySpectralEmbedding(tol=advised, **params).fit(X)
    assert len(est.dictionary_indices_) == kept and est.max_residual_ <= advised
