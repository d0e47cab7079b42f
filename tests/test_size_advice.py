"""A greedy dictionary past ``max_dictionary_size`` gets one advice, checked (issue 53:
refusals with one advice, computed from the situation and checked, naming the parameter the
user set). The scan's own hint ("try tol x 10, or gamma / 2") was never checked; now the
first larger tol or smaller gamma with which a greedy scan of a seeded sample keeps the
dictionary below the cap is named with what that scan kept, and following it works. Small
data: the refusal with its check and the advised fit together take about 2 s.
"""

from __future__ import annotations

import re
import warnings

import pytest
from sklearn.datasets import make_swiss_roll

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.exceptions import DictionarySizeError


def test_the_size_hint_is_checked_and_following_it_works():
    """400 rows of the swiss roll at gamma=0.005: tol=1e-3 takes 65 points, past a cap of
    50; tol=1e-2 keeps 45. The sample is every row here, so the figure quoted is the fit's."""
    X = make_swiss_roll(400, random_state=0)[0]
    params = dict(n_components=2, gamma=0.005, max_dictionary_size=50, random_state=0)
    with pytest.raises(DictionarySizeError) as info:
        GreedySpectralEmbedding(tol=1e-3, **params).fit(X)
    text = str(info.value)
    assert "max_dictionary_size=50" in text and "stopped early" not in text
    assert text.count("try ") == 1, text  # one advice, not "tol x 10, or gamma / 2"
    m = re.search(r"use a larger tol: try tol=([0-9.e+-]+) \(a greedy scan of a seeded sample "
                  r"of 400 rows at tol=\1 keeps (\d+) points\), or raise max_dictionary_size",
                  text)
    assert m, text
    advised, kept = float(m.group(1)), int(m.group(2))
    assert advised == pytest.approx(1e-2) and kept < 50
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = GreedySpectralEmbedding(tol=advised, **params).fit(X)
    assert len(est.dictionary_indices_) == kept and est.max_residual_ <= advised
