"""The documentation site builds with warnings as errors, with the gallery executed.

``sphinx-build -W --keep-going -b html docs OUT``, as CI runs it: every warning
(a broken cross-reference, a docstring numpydoc cannot parse, a missing page, an example
that raises) fails the build. Then: every public name has its API page, every example
of the gallery was run and drew something, and the performance page has a section for
each benchmark result file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: the fraction of each gallery example's rows the test build runs on
GALLERY_FRACTION = 0.3

pytest.importorskip("sphinx")
pytest.importorskip("numpydoc")
pytest.importorskip("sphinx_gallery")
pytest.importorskip("myst_parser")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs") / "html"
    # the gallery's examples on 30% of their rows: each still runs every line and draws;
    # a hidden block of each example takes the fraction, the published build takes all
    env = dict(os.environ, MPLBACKEND="Agg", OOC_SPECTRAL_GALLERY_FRACTION=str(GALLERY_FRACTION),
               PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")]
                                          if p))
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html",
         "-D", "sphinx_gallery_conf.run_stale_examples=True",  # run every example, every time
         str(DOCS), str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines()
                if "WARNING" in line or "ERROR" in line]
    assert proc.returncode == 0, "\n".join(warnings) or proc.stderr[-6000:]
    return out


def test_the_site_builds_with_warnings_as_errors(site):
    for page in ("index", "getting_started", "api", "performance", "results", "clustering",
                 "user_guide/parameters", "user_guide/certificate", "user_guide/batch"):
        assert (site / f"{page}.html").exists(), page


def test_every_public_name_has_an_api_page(site):
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import api_pages
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    import ooc_spectral
    import ooc_spectral.baselines
    import ooc_spectral.manifold

    documented = {q for names in api_pages.public_names().values() for q in names}
    objects = set()
    for q in documented:
        page = site / "generated" / f"{q}.html"
        assert page.exists(), f"no API page for {q}"
        module, _, name = q.rpartition(".")
        objects.add(id(getattr(sys.modules[module], name)))
    # every public name of the four namespaces is among them
    for module in (ooc_spectral, ooc_spectral.manifold, ooc_spectral.baselines,
                   ooc_spectral.exceptions):
        for name in module.__all__:
            if name.startswith("__"):
                continue
            assert id(getattr(module, name)) in objects, f"{module.__name__}.{name} has no page"
    api = (site / "api.html").read_text()
    assert "GreedySpectralEmbedding" in api and "LaplacianEigenmaps" in api


def test_every_example_of_the_gallery_ran_and_drew(site):
    examples = sorted((DOCS / "examples").glob("plot_*.py"))
    assert len(examples) >= 6
    for ex in examples:
        page = site / "auto_examples" / f"{ex.stem}.html"
        assert page.exists(), ex.name
        images = list((site / "_images").glob(f"sphx_glr_{ex.stem}_*.png"))
        assert [i for i in images if not i.name.endswith("_thumb.png")], f"{ex.name} drew nothing"
        # the test's smaller size is not on the page: the reader sees the documented one
        assert "GALLERY_FRACTION" not in page.read_text(), ex.name


def test_the_performance_page_shows_each_benchmark_result(site):
    page = (site / "performance.html").read_text()
    results = ROOT / "workflows" / "bench" / "results"
    names = {p.stem.split("-")[0] for p in results.glob("*.json")}
    for name in names:
        current = results / f"{name}.json"
        if current.exists():
            json.loads(current.read_text())
            assert f'id="bench-{name.replace("_", "-")}"' in page, name


def test_the_performance_page_survives_missing_and_odd_result_files(tmp_path):
    """The extension renders whatever is there: an empty folder, a file it has no plot
    for, a list instead of a dict, a broken file."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import benchmark_results as br
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    assert br.load_results(tmp_path) == {}
    (tmp_path / "new_bench.json").write_text(json.dumps(
        {"command": "python workflows/bench/new_bench.py", "n": 10, "rows": [{"a": 1.5, "b": "x"}]}))
    (tmp_path / "odd.json").write_text("[1, 2, 3]")
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "memory_flat.json").write_text(json.dumps({"runs": [{"n": 1}]}))  # no RSS
    got = br.load_results(tmp_path)
    assert set(got) == {"new_bench", "odd", "memory_flat"}
    assert br._tables(got["new_bench"]["data"]) == [("rows", [{"a": 1.5, "b": "x"}])]
    assert br.make_plot("memory_flat", got["memory_flat"]["data"], tmp_path / "p.png") is False
    assert br.make_plot("new_bench", got["new_bench"]["data"], tmp_path / "q.png") is False


def test_the_clustering_page_is_drawn_from_the_result_file(tmp_path):
    """docs/clustering.md's table and grid come from workflows/bench/results/clustering.json
    (docs/_ext/clustering_results.py): one row a data set, one panel a set and method."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import clustering_results as cr
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    res = json.loads((ROOT / "workflows" / "bench" / "results" / "clustering.json").read_text())
    header, rows = cr.comparison_rows(res)
    assert len(rows) == len(res["sets"]) and len(header) == len(rows[0])
    digits = rows[[s["data"] for s in res["sets"]].index("digits")]
    ours = res["sets"][[s["data"] for s in res["sets"]].index("digits")]["methods"]["ours"]
    assert digits[3].startswith(f"{ours['ari_median']:.3f}")
    assert cr.draw_grid(res, tmp_path / "grid.png") and (tmp_path / "grid.png").stat().st_size > 10_000
    assert cr.draw_grid({"sets": []}, tmp_path / "none.png") is False
    assert cr.memory_rows(res)[1] or "memory" not in res
    if len(res.get("memory", {}).get("runs", [])) >= 2:
        assert f"{res['memory']['peak_ratio']:.3f}" in cr.memory_summary(res)
