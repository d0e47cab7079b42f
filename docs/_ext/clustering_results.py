"""Sphinx extension: the clustering page's table and figure, from the benchmark's result file.

``workflows/bench/clustering.py`` writes ``workflows/bench/results/clustering.json``: per
data set, every method's ARI (median, least and largest over the seeds), its seconds,
the time of ours over KMeans's on the large sets, and a 2-D view of up to 600 rows with
each method's labels on them at seed 0; and the out-of-core memory runs. The directive

    ```{clustering-results}
    :part: table    (or: figure, memory)
    ```

turns what the file holds at build time into the comparison table, the grid of data
sets x methods coloured by label (drawn here with matplotlib, as scikit-learn's
gallery draws its clustering comparison), or the memory table. Nothing here knows a
figure: a rerun of the benchmark changes the page at the next build; a missing file
gives a sentence saying so, never a build error.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmark_results import _table
from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

#: The methods in the order of the table's and the figure's columns, and their headings.
METHODS = [("ours", "GreedySpectralClustering (default)"), ("KMeans", "KMeans"),
           ("MiniBatchKMeans", "MiniBatchKMeans"),
           ("SpectralClustering(nn)", "SpectralClustering (nearest_neighbors)"),
           ("kernel", "GreedySpectralClustering (affinity='kernel')")]


def _bench():
    """``workflows/bench/clustering.py`` as a module: its cell format is the table's."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "workflows" / "bench" / "clustering.py"
    spec = importlib.util.spec_from_file_location("_clustering_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def comparison_rows(res: dict) -> tuple[list[str], list[list[str]]]:
    header = ["data", "n x d", "k"] + [h for _, h in METHODS] + [
        "ours - best peer", "time / KMeans", "load"]
    cell = _bench().cell
    rows = []
    for s in res.get("sets", []):
        ratio = f"{s['time_over_kmeans']:.2f}" if "time_over_kmeans" in s else ""
        rows.append([s["data"], f"{s['n']:,} x {s['d']}", str(s["k"])]
                    + [cell(s["methods"].get(key)) for key, _ in METHODS]
                    + [f"{s['ours_minus_best_peer']:+.3f} ({s['best_peer']})", ratio,
                       f"{s['load_average'][0]:.1f}"])
    return header, rows


def memory_rows(res: dict) -> tuple[list[str], list[list[str]]]:
    header = ["rows n", "engine", "ARI", "wall seconds", "peak RSS of the process tree",
              "load"]
    rows = [[f"{m['n']:,}", m.get("engine", "auto"), f"{m['ari']:.3f}",
             f"{m['wall_seconds']:.1f}", f"{m['peak_tree_rss_mib']:.0f} MiB",
             f"{m['load_average'][0]:.1f}"]
            for m in res.get("memory", {}).get("runs", [])]
    return header, rows


def memory_summary(res: dict) -> str | None:
    """The sentence under the memory table: the largest size's peak over the smallest's."""
    runs = res.get("memory", {}).get("runs", [])
    if len(runs) < 2:
        return None
    small, large = runs[0], runs[-1]
    return (f"Peak resident memory of the process tree at {large['n']:,} rows over "
            f"{small['n']:,} rows: {large['peak_tree_rss_bytes'] / small['peak_tree_rss_bytes']:.3f} "
            f"for {large['n'] / small['n']:g} times the rows.")


def draw_grid(res: dict, out: Path) -> bool:
    """The grid of data sets (rows) x methods (columns), each panel the 2-D view of the
    set's rows coloured by the method's labels, its ARI in the corner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    sets = [s for s in res.get("sets", []) if s.get("figure")]
    if not sets:
        return False
    cols = [(k, h) for k, h in METHODS
            if any(k in s["figure"]["labels"] for s in sets)]
    fig, axes = plt.subplots(len(sets), len(cols) + 1,
                             figsize=(1.9 * (len(cols) + 1), 1.75 * len(sets)), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for i, s in enumerate(sets):
        f = s["figure"]
        x, y = np.asarray(f["x"]), np.asarray(f["y"])
        panels = [("truth", "known labels", f["truth"])] + [
            (k, h, f["labels"].get(k)) for k, h in cols]
        for j, (key, head, labels) in enumerate(panels):
            ax = axes[i, j]
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(head.replace(" (", "\n("), fontsize=7)
            if j == 0:
                ax.set_ylabel(f"{s['data']}\n{s['n']:,} x {s['d']}", fontsize=7)
            if labels is None:
                ax.text(0.5, 0.5, "not fitted", ha="center", va="center", fontsize=7,
                        transform=ax.transAxes)
                continue
            ax.scatter(x, y, c=cmap(np.asarray(labels) % 10), s=2, linewidths=0)
            m = s["methods"].get(key)
            if m and m.get("fitted"):
                ax.text(0.98, 0.02, f"{m['ari_median']:.2f}", ha="right", va="bottom",
                        fontsize=7, transform=ax.transAxes,
                        bbox={"facecolor": "white", "alpha": 0.7, "pad": 1, "lw": 0})
    fig.tight_layout(pad=0.3)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return True


class ClusteringResults(SphinxDirective):
    """``.. clustering-results::`` with ``:part: table | figure | memory``."""

    has_content = False
    option_spec = {"part": directives.unchanged, "file": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        folder = Path(self.config.benchmark_results_dir)
        path = Path(self.options.get("file") or folder / "clustering.json")
        part = self.options.get("part", "table")
        if not path.exists():
            return [nodes.paragraph(text=f"No {path.name} at the time of this build: run "
                                         "python workflows/bench/clustering.py.")]
        self.env.note_dependency(str(path))
        res = json.loads(path.read_text())
        meta = res.get("meta", {})
        caption = nodes.paragraph()
        caption += nodes.Text(f"From workflows/bench/results/{path.name} "
                              f"({meta.get('date', '?')}, {meta.get('machine', '?')}, "
                              f"{meta.get('cores', '?')} cores, scikit-learn "
                              f"{meta.get('scikit_learn', '?')}): ")
        command = meta.get("command", "")
        if part == "memory":  # the memory runs may come from a run of their own
            command = res.get("memory", {}).get("bench_command") or command
        caption += nodes.literal(text=command)
        if part == "figure":
            figdir = Path(self.env.srcdir) / "_generated" / "benchmarks"
            figdir.mkdir(parents=True, exist_ok=True)
            out = figdir / "clustering-grid.png"
            try:
                drawn = draw_grid(res, out)
            except Exception as exc:  # noqa: BLE001 -- a file of another shape: no figure
                logger.info("clustering results: no figure (%s: %s)", type(exc).__name__, exc)
                drawn = False
            if not drawn:
                return [nodes.paragraph(text="No figure data in the result file.")]
            return [nodes.image(uri="/_generated/benchmarks/clustering-grid.png",
                                alt="data sets x methods, coloured by label"), caption]
        header, rows = memory_rows(res) if part == "memory" else comparison_rows(res)
        if not rows:
            return [nodes.paragraph(text=f"The result file holds no {part} runs.")]
        summary = memory_summary(res) if part == "memory" else None
        return [_table(header, rows)] + ([nodes.paragraph(text=summary)] if summary else []) + [
            caption]


def setup(app):
    if "benchmark_results_dir" not in app.config.values:
        app.add_config_value("benchmark_results_dir", "", "env")
    app.add_directive("clustering-results", ClusteringResults)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
