"""The prefix scan: same dictionary as the full scan, same guarantee, less sequential work."""

from __future__ import annotations

import numpy as np
import pytest

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.core import planning
from ooc_spectral.datasets import generate

from test_scan import residuals_against


@pytest.fixture
def small_windows(monkeypatch):
    monkeypatch.setattr(planning, "VISIT_WINDOW_ROWS", 4000)


@pytest.fixture(scope="module")
def roll():
    X, _ = generate("swiss-roll", 60_000, seed=0)
    return X


@pytest.mark.parametrize("normalization", ["additive", "divisive"])
def test_prefix_scan_selects_the_full_scans_dictionary(small_windows, roll, normalization,
                                                       monkeypatch):
    # a quarter of the rows in windows of a quarter of the size: 15 windows, as with all of
    # them (m = 584; at 30,000 rows in windows of 2,000: m = 582, 1.5x the cost)
    monkeypatch.setattr(planning, "VISIT_WINDOW_ROWS", 1000)
    roll = roll[:15_000]
    params = dict(gamma=0.05, tol=1e-4, normalization=normalization, random_state=0)
    full = GreedySpectralEmbedding(**params).fit(roll)
    pre = GreedySpectralEmbedding(**params, scan="prefix", prefix_patience=1).fit(roll)
    # the sequential part stopped early, and pass 2 found rows beyond tol
    assert "rescan" in pre.timings_
    np.testing.assert_array_equal(pre.dictionary_indices_, full.dictionary_indices_)
    np.testing.assert_allclose(pre.embedding_, full.embedding_, rtol=0, atol=1e-12)
    # the guarantee: every row within tol of the final dictionary (from scratch)
    kernel = pre.kernel_
    delta = residuals_against(kernel, pre.dictionary_, roll, True)
    assert delta.max() <= 1e-4
    if normalization == "additive":
        # the moments were extended to the new points, not recomputed: the certificate
        # is then the bound from pass 2's residuals, which only shrink as the span grows.
        # Up to rounding: the two runs compute the row attaining the maximum against
        # dictionaries of different sizes, whose kernel blocks and recursive solves group
        # the sums differently (2026-11-25, AVX-512: equal maxima 1 ulp apart, 9.4778648873
        # 22252e-05 against ...251e-05).
        assert full.max_residual_ <= pre.max_residual_ * (1 + 4 * np.finfo(float).eps)
        assert pre.max_residual_ <= 1e-4
        # the certificate bounds the exact residuals (long double, from differences) of a
        # seeded sample of rows and of the row it names
        from extended_precision import HAS_EXTENDED, true_residuals

        if HAS_EXTENDED:
            rows = np.union1d(np.random.default_rng(0).choice(len(roll), 3000, replace=False),
                              [pre.max_residual_row_])
            d = pre.spectral_map_.dictionary
            assert true_residuals(d.kernel, roll[rows], d.points).max() <= pre.max_residual_
    else:
        assert pre.max_residual_ == pytest.approx(full.max_residual_, rel=1e-9, abs=0)


def test_prefix_scan_without_late_growth_needs_one_pass(small_windows, roll, monkeypatch):
    from ooc_spectral.pipeline import fit as pipeline

    passes = []
    original, extend = pipeline.FitRun.accumulate, pipeline.extension_pass
    monkeypatch.setattr(pipeline.FitRun, "accumulate",
                        lambda self, *a, **k: passes.append("pass2") or original(self, *a, **k))
    monkeypatch.setattr(pipeline, "extension_pass",
                        lambda *a, **k: passes.append("extension") or extend(*a, **k))
    # (at tol=3e-2 the dictionary stops growing within the first windows for good; at
    # 1e-2 or with patience 2 a late row still enters, and an extension pass follows)
    est = GreedySpectralEmbedding(gamma=0.05, tol=3e-2, scan="prefix", prefix_patience=5,
                                  random_state=0).fit(roll)
    # the scan stopped early, pass 2 found no row beyond tol: one parallel pass, no extension
    assert "rescan" in est.timings_ and passes == ["pass2"]
    full = GreedySpectralEmbedding(gamma=0.05, tol=3e-2, random_state=0).fit(roll)
    np.testing.assert_array_equal(est.dictionary_indices_, full.dictionary_indices_)
    assert est.max_residual_ <= 3e-2


def test_a_prefix_scan_at_tol_zero_is_refused_before_any_work():
    """At tol 0 every row's certified residual (its rounding included) is beyond tol, so
    the prefix scan rescanned every row and its certificate became -inf, reported as
    max_residual_ = 0.0 while a row was at squared distance 0.013 (an outside audit)."""
    from ooc_spectral import InvalidParameterError

    X = np.random.default_rng(0).normal(size=(200, 3))
    with pytest.raises(InvalidParameterError, match=r"scan='prefix' with tol=0.*scan='full'"):
        GreedySpectralEmbedding(kernel="linear", tol=0, scan="prefix").fit(X)
    est = GreedySpectralEmbedding(kernel="linear", tol=0, scan="full").fit(X)
    assert est.max_residual_ > 0  # certified by its rounding bound, not reported as 0
