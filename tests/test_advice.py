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


def test_too_many_components_at_the_heuristic_gamma():
    X = _roll()
    with pytest.raises(DictionaryError) as info:
        GreedySpectralEmbedding(n_components=150, random_state=0).fit(X)
    text = str(info.value)
    assert "gamma=None picks the median heuristic" not in text  # what the fit used
    assert "larger gamma than the median heuristic's (it chose this one)" in text
    assert "dictionary_size=151" in text
    # following it works
    est = GreedySpectralEmbedding(n_components=150, dictionary_size=151, random_state=0).fit(X)
    assert est.eigenvalues_.shape == (150,) and len(est.dictionary_indices_) == 151


def test_too_many_components_for_the_rows():
    X = _roll(100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DictionaryError) as info:
            GreedySpectralEmbedding(n_components=150, gamma=1e-4, random_state=0).fit(X)
    assert "X has 100 rows" in str(info.value)


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
