"""The stability experiment (Bengio et al. 2003, section 5) and its workflow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ooc_spectral.exceptions import InvalidParameterError
from ooc_spectral.experiments import available, run_experiment
from ooc_spectral.experiments.stability import affine_align, split_sizes, substitution_equivalent



ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "workflows" / "paper" / "stability.toml"


def test_registered():
    assert "stability" in available()


def test_affine_align_recovers_an_affine_map():
    rng = np.random.default_rng(0)
    E = rng.normal(size=(40, 2))
    A, b = np.array([[2.0, -1.0], [0.5, 3.0]]), np.array([4.0, -7.0])
    coef = affine_align(E, E @ A + b)
    np.testing.assert_allclose(coef[:-1], A, atol=1e-12)
    np.testing.assert_allclose(coef[-1], b, atol=1e-12)


@pytest.mark.parametrize("n, f", [(698, 0.02), (698, 0.25), (150, 0.1)])
def test_split_sizes_substitute_the_fraction(n, f):
    m, h = split_sizes(n, f)
    assert m + 2 * h <= n and n - (m + 2 * h) <= 1
    assert h / (m + h) == pytest.approx(f, abs=1.0 / (m + h))


def test_substitution_equivalent_interpolates_from_the_origin():
    f, v = [0.02, 0.05, 0.1], [0.1, 0.4, 0.2]
    assert substitution_equivalent(f, v, 0.05) == pytest.approx(0.01)  # on (0, 0)-(0.02, 0.1)
    assert substitution_equivalent(f, v, 0.25) == pytest.approx(0.035)  # first crossing only
    assert substitution_equivalent(f, v, 0.5) is None


def test_exact_case_has_zero_variability_and_zero_error(tmp_path):
    # 2-D data embedded in 2-D by MDS: every training set gives the data up to a
    # rigid motion, so after the affine alignment both distances vanish. Any mix-up
    # of rows (F vs R, left-out row vs its reference) would show here.
    summary = run_experiment("stability", tmp_path, n=80, dataset="blobs", methods="mds",
                             fractions=[0.1, 0.3], n_loo=5, repeats=2)
    data = json.loads(Path(summary["json"]).read_text())
    assert [r["fraction"] for r in data["rows"]] == [0.1, 0.3]
    for r in data["rows"]:
        assert r["pairs"] == 10  # 2 splits x 5 left-out rows, pooled
        assert r["variability_mean"] < 1e-9 * r["embedding_rms"]
        assert r["oos_mean"] < 1e-9 * r["embedding_rms"]
    assert data["substitution_equivalent"]["mds"]["oos_error"] < 1e-9

@pytest.mark.parametrize("params, match", [
    ({"methods": "mds,pca"}, "unknown method 'pca'"),
    ({"fractions": [0.1, 1.5]}, "must be in \\(0, 1\\)"),
    ({"n_loo": 1}, "n_loo=1 is out of range"),
])
def test_bad_parameters(tmp_path, params, match):
    with pytest.raises(InvalidParameterError, match=match):
        run_experiment("stability", tmp_path, **params)


def test_workflow_runs_at_reduced_size(tmp_path, main_):
    # the command line's main in this process: the console script runs a paper workflow
    # in tests/test_reproductions.py
    out = tmp_path / "stability"
    proc = main_("run", WORKFLOW, "--set",
                 "stability.param={n = 120, fractions = [0.05, 0.25], n_loo = 3, repeats = 1}",
                 "--set", f"stability.out={out}", "--json", "--quiet")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "complete" and summary["steps"][0]["step"] == "stability"
    data = json.loads((out / "stability.json").read_text())
    # --set replaced the whole param table: the rest are the experiment's defaults
    assert data["params"]["n"] == 120 and data["params"]["n_neighbors"] == 10
    rows = data["rows"]
    assert [(r["method"], r["fraction"]) for r in rows] == [
        (m, f) for m in ("mds", "spectral", "isomap", "lle") for f in (0.05, 0.25)]
    for r in rows:
        assert r["pairs"] == 3 and r["diff_ci95"] >= 0
        assert np.isfinite([r["variability_mean"], r["oos_mean"], r["diff_mean"]]).all()
        assert r["diff_mean"] == pytest.approx(r["variability_mean"] - r["oos_mean"], abs=1e-12)
    png = (out / "stability.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) < 200_000
    table = (out / "stability.md").read_text()
    assert table.count("\n| ") == 1 + len(rows)  # header + one line per row
