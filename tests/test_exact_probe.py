"""The float64 probe that sends a small fit to the exact problem before the certified scan.

Where the exact problem is at hand, a scan whose dictionary reaches ``sqrt(80 n)`` points
(or takes 76 of the rows 240 to 320) stops for it, and everything it certified on the way
is thrown away. :func:`~ooc_spectral.pipeline.scan.probe_exact` runs the same selection
without the rounding bounds first: the fits it sends to the exact problem never start the
certified scan, and get the answer they got before, bit for bit; the fits it lets through
run as before, bit for bit.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.decomposition import KernelPCA

import ooc_spectral.pipeline.fit as fit_module
import ooc_spectral.pipeline.scan as scan_module
from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.exceptions import DictionarySizeError, DictionaryWarning


def _roll(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    t = 1.5 * np.pi * (1 + 2 * rng.random(n))
    return np.c_[t * np.cos(t), 21 * rng.random(n), t * np.sin(t)]


def _fit(X, params, *, probe: bool, monkeypatch, certified_scan: bool = True):
    """The fit with the probe on or off; ``certified_scan=False`` makes starting the
    certified scan an error."""
    with monkeypatch.context() as mp:
        if not probe:
            mp.setattr(fit_module, "probe_exact", lambda *a, **k: None)
        if not certified_scan:
            def refuse(self, patience=None):
                raise AssertionError("the certified scan started")
            mp.setattr(scan_module.GreedyScan, "run", refuse)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            est = GreedySpectralEmbedding(random_state=0, **params).fit(X)
    said = [str(w.message) for w in caught if issubclass(w.category, DictionaryWarning)]
    return est, said


@pytest.mark.parametrize("case, said", [
    ("digits", r"took 76 of the 80 rows 240 to 320"),
    ("roll-gamma-0.1", r"400 of the 2000 rows entered the dictionary"),
])
def test_a_fit_heading_for_the_exact_problem_goes_there_without_the_certified_scan(
        case, said, monkeypatch):
    """Digits at the default gamma (every row enters) and a 2,000-row swiss roll at gamma
    0.1 (heading for 749 points, past sqrt(80 n) = 400): the certified scan never starts,
    the warning says what the scan's own stop said, and the embedding is the one the
    certified scan's stop led to, bit for bit: the exact problem's, which is scikit-learn's
    KernelPCA on the full Gram matrix."""
    X, params = ((load_digits().data, {}) if case == "digits"
                 else (_roll(2000), {"n_components": 2, "gamma": 0.1}))
    est, msgs = _fit(X, params, probe=True, monkeypatch=monkeypatch, certified_scan=False)
    ref, ref_msgs = _fit(X, params, probe=False, monkeypatch=monkeypatch)
    assert est.max_residual_ == 0.0 and est.spectral_map_.dictionary.L is None  # exact
    assert len(msgs) == 1 and msgs == ref_msgs
    assert re.search(said, msgs[0])
    np.testing.assert_array_equal(est.embedding_, ref.embedding_)
    np.testing.assert_array_equal(est.eigenvalues_, ref.eigenvalues_)
    kpca = KernelPCA(est.embedding_.shape[1], kernel="rbf", gamma=est.gamma_,
                     eigen_solver="dense")
    E = kpca.fit_transform(X)
    np.testing.assert_allclose(est.eigenvalues_, kpca.eigenvalues_, rtol=1e-10)
    s = np.sign(np.sum(est.embedding_ * E, axis=0))
    np.testing.assert_allclose(est.embedding_ * s, E, rtol=0, atol=1e-10 * np.abs(E).max())


def test_a_fit_whose_dictionary_stays_small_is_let_through_after_a_few_hundred_rows(
        monkeypatch):
    """A 2,000-row swiss roll at gamma 0.004, tol 1e-3 (61 points): the probe gives up at
    row 320 (58 points, 2 of its last 80 rows entering: at twice that rate the dictionary
    would stay far below 400), and the fit is the certified scan's, bit for bit."""
    X = _roll(2000)
    params = {"n_components": 2, "gamma": 0.004, "tol": 1e-3}
    probed = []
    real = scan_module.scan_rows

    def counting(state, X_, rows, tol, **kw):
        if kw.get("certify", True) is False:
            probed.append(len(X_))
        return real(state, X_, rows, tol, **kw)

    with monkeypatch.context() as mp:
        mp.setattr(scan_module, "scan_rows", counting)
        est, msgs = _fit(X, params, probe=True, monkeypatch=monkeypatch)
    ref, _ = _fit(X, params, probe=False, monkeypatch=monkeypatch)
    assert sum(probed) == 320
    assert msgs == [] and est.spectral_map_.dictionary.L is not None  # the greedy fit
    assert est.spectral_map_.dictionary.size == ref.spectral_map_.dictionary.size == 61
    np.testing.assert_array_equal(est.embedding_, ref.embedding_)
    np.testing.assert_array_equal(est.eigenvalues_, ref.eigenvalues_)


@pytest.mark.parametrize("tol, said", [
    (1e-12, r"tol=1e-12 is below what float64 arithmetic certifies"),
    (0.0, r"tol=0 asks for every direction of the data"),
])
def test_below_what_float64_certifies_the_warning_still_names_the_tol(tol, said, monkeypatch):
    """A 1,000-row roll at the default gamma: at tol 1e-12 (or 0) the certified scan breaks
    down and the exact problem is solved because of the tol. The probe's uncertified
    dictionary reached sqrt(80 n) = 283 points first, and the warning blamed the size with
    the advice of a smaller gamma, which does not help (an audit); below 1e-6 of the largest
    k(x, x) the probe does not run, and the warning is the scan's own."""
    X = _roll(1000)
    est, msgs = _fit(X, {"n_components": 2, "tol": tol}, probe=True, monkeypatch=monkeypatch)
    ref, ref_msgs = _fit(X, {"n_components": 2, "tol": tol}, probe=False,
                         monkeypatch=monkeypatch)
    assert len(msgs) == 1 and msgs == ref_msgs and re.search(said, msgs[0])
    assert "smaller gamma" not in msgs[0]
    np.testing.assert_array_equal(est.embedding_, ref.embedding_)


def test_the_probe_runs_only_above_a_millionth_of_the_largest_kernel_value(monkeypatch):
    """PROBE_MIN_TOL pinned at its edge with a literal: on rows whose largest k(x, x) is 1
    (Gaussian kernel) the probe scans at tol 1.01e-6 and does not at 0.99e-6; on a kernel
    whose diagonal is 100 (linear, rows of norm 10) the edge moves to 1e-4."""
    from ooc_spectral.core.kernels import LinearKernel, RBFKernel
    from ooc_spectral.core.planning import VISIT_WINDOW_ROWS, VisitOrder
    from ooc_spectral.io.source import open_source

    calls = []
    real = scan_module.scan_rows

    def counting(state, X_, rows, tol, **kw):
        calls.append(len(X_))
        return real(state, X_, rows, tol, **kw)

    monkeypatch.setattr(scan_module, "scan_rows", counting)
    X = _roll(1000)
    source = open_source(X)
    order = VisitOrder(1000, 0, window=VISIT_WINDOW_ROWS)
    U = X / np.linalg.norm(X, axis=1, keepdims=True) * 10.0
    for kernel, rows, edge in ((RBFKernel(0.004), X, 1e-6), (LinearKernel(), U, 1e-4)):
        src = source if rows is X else open_source(rows)
        for tol, runs in ((1.01 * edge, True), (0.99 * edge, False)):
            calls.clear()
            try:
                scan_module.probe_exact(src, order, kernel, True, tol, 283)
            except DictionarySizeError:  # a stop for the exact problem is a run too
                pass
            assert bool(calls) is runs, (kernel, tol)
