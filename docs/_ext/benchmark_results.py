"""Sphinx extension: the performance page's tables and plots, from the benchmarks' result files.

Each benchmark in ``workflows/bench/`` writes ``workflows/bench/results/<name>.json`` (and
sometimes ``<name>.png``). The directive ``benchmark-results`` turns what is there at build
time into one section per benchmark: the command that produced it, its scalar figures, a
table per list of runs, the benchmark's own picture and, for the benchmarks listed in
``PLOTS``, a matplotlib plot. Nothing here knows a figure: a result file added, changed or
removed changes the page at the next build, and a file this code does not understand is
shown as tables only (a plot that fails is left out and logged, never a build error).

Where a benchmark has variants (``<name>-<variant>.json``) beside its current file
``<name>.json``, the current one is shown and the variants are named.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

#: at most this many columns in a table (the JSON file holds the rest)
MAX_COLUMNS = 10
#: at most this many rows in a table
MAX_ROWS = 40


# ----------------------------------------------------------------------------- reading
def load_results(folder: Path) -> dict[str, dict[str, Any]]:
    """``{benchmark: {"current": stem, "data": ..., "variants": [stems]}}``, sorted by name.

    A file that is not valid JSON is skipped with a log line.
    """
    groups: dict[str, list[str]] = {}
    data: dict[str, Any] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            data[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            logger.info("benchmark results: %s skipped (%s)", path.name, exc)
            continue
        groups.setdefault(path.stem.split("-")[0], []).append(path.stem)
    out: dict[str, dict[str, Any]] = {}
    for name, stems in sorted(groups.items()):
        shown = [name] if name in stems else stems
        variants = [s for s in stems if s not in shown]
        for stem in shown:
            out[stem] = {"data": data[stem], "variants": variants if stem == name else []}
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if value is None:
        return ""
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _flatten(row: dict[str, Any]) -> dict[str, Any]:
    """Scalars of ``row`` and of its nested dicts (one level: ``stages.pass2``)."""
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if _is_scalar(value):
            flat[key] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                if _is_scalar(v):
                    flat[f"{key}.{k}"] = v
    return flat


def _tables(data: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, list[dict]]]:
    """Every list of runs (a list of dicts, or a dict of dicts) down to depth 2."""
    found: list[tuple[str, list[dict]]] = []
    if not isinstance(data, dict) or depth > 2:
        return found
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            found.append((name, value))
        elif (isinstance(value, dict) and len(value) > 1
              and all(isinstance(v, dict) for v in value.values())
              and any(_is_scalar(x) for v in value.values() for x in v.values())):
            found.append((name, [{"": k, **v} for k, v in value.items()]))
            for k, v in value.items():
                found += _tables(v, f"{name}.{k}.", depth + 1)
        elif isinstance(value, dict):
            found += _tables(value, f"{name}.", depth + 1)
    return found


def _scalars(data: Any) -> list[tuple[str, str]]:
    if not isinstance(data, dict):
        return []
    rows = []
    for key, value in _flatten(data).items():
        if key in ("command",) or key.endswith(".command"):
            continue
        if isinstance(value, str) and len(value) > 80:
            continue
        rows.append((key, _fmt(value)))
    return rows


def _command(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    for holder in (data, data.get("meta"), data.get("machine")):
        if isinstance(holder, dict) and isinstance(holder.get("command"), str):
            return holder["command"]
    return None


# ----------------------------------------------------------------------------- plots
def _mib(b: float) -> float:
    return b / 2**20


def _plot_memory_flat(d, plt):
    runs = d["runs"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([r["n"] for r in runs], [_mib(r["peak_tree_rss_bytes"]) for r in runs], "o-")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set(xlabel="rows n", ylabel="peak RSS of the process tree (MiB)",
           title="Memory does not grow with n")
    return fig


def _plot_peers(d, plt):
    methods = {k: v for k, v in d["methods"].items() if v.get("ran", True) and "seconds" in v}
    names = list(methods)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
    a1.barh(names, [methods[k]["seconds"] for k in names])
    a1.set_xscale("log")
    a1.set(xlabel="seconds (log)", title=f"fit, n = {d.get('n', '?'):,}")
    mem = [k for k in names if "peak_rss_bytes" in methods[k]]
    a2.barh(mem, [_mib(methods[k]["peak_rss_bytes"]) for k in mem])
    a2.set_xscale("log")
    a2.set(xlabel="peak RSS (MiB, log)", title="memory")
    fig.tight_layout()
    return fig


def _plot_scan_threads(d, plt):
    rows = d["rows"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    m = [r["m"] for r in rows]
    ax.plot(m, [r["blas_threads_s"] for r in rows], "o-", label="BLAS's own threads")
    ax.plot(m, [r["block_split_s"] for r in rows], "s-", label="block split between threads")
    ax.set(xlabel="dictionary size m", ylabel="scan seconds", title=f"scan of {d['n']:,} rows")
    ax.legend()
    return fig


def _plot_engines(d, plt):
    rows = d["default"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for engine in sorted({r["engine"] for r in rows}):
        sel = [r for r in rows if r["engine"] == engine]
        ax.plot([r["n"] for r in sel], [r["wall_seconds"] for r in sel], "o", label=engine)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(xlabel="rows n", ylabel="fit wall seconds", title="embedded default engine")
    ax.legend(title="engine")
    return fig


def _plot_cli_floors(d, plt):
    sizes = d["sizes"]
    labels = [f"n={s['n']:.0e}\nm={s['m']}" for s in sizes]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    width = 0.38
    for i, p in enumerate(("pass2", "pass3")):
        ax.bar([j + (i - 0.5) * width for j in range(len(sizes))],
               [100 * s["passes"][p]["of_floor"] for s in sizes], width, label=p)
    ax.set_xticks(range(len(sizes)), labels)
    ax.set(ylabel="% of the floor measured in the same run", title="passes 2 and 3 vs floors")
    ax.legend()
    return fig


def _plot_gil_release(d, plt):
    ops = d["operations"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    names = [re.sub(r"\s*\(.*\)", "", o["operation"]) + ("" if o["releases_gil"] else " *")
             for o in ops]
    ax.barh(names, [o["longest_stall_seconds"] / o["seconds"] for o in ops])
    ax.set(xlabel="longest stall of another thread / call time",
           title="which calls hold the GIL (*)")
    fig.tight_layout()
    return fig


def _plot_inverse_transform(d, plt):
    runs = d["runs"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([r["n"] for r in runs], [_mib(r["peak_tree_rss_bytes"]) for r in runs], "o-")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set(xlabel="rows n", ylabel="peak RSS (MiB)", title="fit with the pre-image map")
    return fig


#: benchmark -> plot of its current result file
PLOTS: dict[str, Callable] = {
    "memory_flat": _plot_memory_flat,
    "peers": _plot_peers,
    "scan_threads": _plot_scan_threads,
    "engines": _plot_engines,
    "cli_floors": _plot_cli_floors,
    "gil_release": _plot_gil_release,
    "inverse_transform": _plot_inverse_transform,
}


def make_plot(stem: str, data: Any, out: Path) -> bool:
    """Write ``out`` (PNG) for a benchmark in ``PLOTS``; False when there is none or it fails."""
    fn = PLOTS.get(stem)
    if fn is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    try:
        fig = fn(data, plt)
        fig.savefig(out, dpi=90, bbox_inches="tight")
        plt.close(fig)
    except Exception as exc:  # noqa: BLE001 -- a result file of another shape: tables only
        plt.close("all")
        logger.info("benchmark results: no plot for %s (%s: %s)", stem, type(exc).__name__, exc)
        return False
    return True


# ----------------------------------------------------------------------------- nodes
def _table(header: list[str], rows: list[list[str]]) -> nodes.table:
    table = nodes.table(classes=["benchmark-table"])
    group = nodes.tgroup(cols=len(header))
    table += group
    for _ in header:
        group += nodes.colspec(colwidth=1)
    thead = nodes.thead()
    group += thead
    hrow = nodes.row()
    for h in header:
        hrow += nodes.entry("", nodes.paragraph(text=h))
    thead += hrow
    tbody = nodes.tbody()
    group += tbody
    for r in rows:
        row = nodes.row()
        for cell in r:
            row += nodes.entry("", nodes.paragraph(text=cell))
        tbody += row
    return table


def _runs_table(runs: list[dict]) -> tuple[nodes.table, int]:
    flat = [_flatten(r) for r in runs[:MAX_ROWS]]
    columns: list[str] = []
    for f in flat:
        for k in f:
            if k not in columns and not (isinstance(f[k], str) and len(f[k]) > 80):
                columns.append(k)
    hidden = max(0, len(columns) - MAX_COLUMNS)
    columns = columns[:MAX_COLUMNS]
    return _table(columns, [[_fmt(f.get(c)) for c in columns] for f in flat]), hidden


class BenchmarkResults(SphinxDirective):
    """``.. benchmark-results::`` -- one section per benchmark result file."""

    has_content = False
    option_spec = {"folder": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        folder = Path(self.options.get("folder") or self.config.benchmark_results_dir)
        srcdir = Path(self.env.srcdir)
        figdir = srcdir / "_generated" / "benchmarks"
        figdir.mkdir(parents=True, exist_ok=True)
        results = load_results(folder) if folder.is_dir() else {}
        if not results:
            para = nodes.paragraph(text=f"No benchmark result file in {folder.name}/ at the "
                                        "time of this build.")
            return [para]
        out: list[nodes.Node] = []
        for stem, item in results.items():
            data = item["data"]
            self.env.note_dependency(str(folder / f"{stem}.json"))
            section = nodes.section(ids=[nodes.make_id(f"bench-{stem}")])
            section += nodes.title(text=stem)
            para = nodes.paragraph()
            para += nodes.Text("Result file ")
            para += nodes.literal(text=f"workflows/bench/results/{stem}.json")
            script = folder.parent / f"{stem.split('-')[0]}.py"
            if script.exists():
                para += nodes.Text(", written by ")
                para += nodes.literal(text=f"workflows/bench/{script.name}")
            para += nodes.Text(".")
            section += para
            command = _command(data)
            if command:
                section += nodes.literal_block(command, command, language="text")
            picture = folder / f"{stem}.png"
            images = []
            if picture.exists():
                shutil.copyfile(picture, figdir / picture.name)
                images.append(f"/_generated/benchmarks/{picture.name}")
            if make_plot(stem, data, figdir / f"{stem}-plot.png"):
                images.append(f"/_generated/benchmarks/{stem}-plot.png")
            for uri in images:
                section += nodes.image(uri=uri, alt=f"{stem} benchmark")
            scalars = _scalars(data)
            if scalars:
                section += _table(["quantity", "value"], [list(r) for r in scalars])
            for name, runs in _tables(data):
                sub = nodes.paragraph()
                sub += nodes.strong(text=name)
                section += sub
                table, hidden = _runs_table(runs)
                section += table
                if hidden or len(runs) > MAX_ROWS:
                    section += nodes.paragraph(
                        text=f"({hidden} more columns"
                             + (f", {len(runs) - MAX_ROWS} more rows" if len(runs) > MAX_ROWS
                                else "") + " in the JSON file.)")
            if item["variants"]:
                section += nodes.paragraph(
                    text="Other result files of this benchmark: "
                         + ", ".join(f"{v}.json" for v in item["variants"]) + ".")
            out.append(section)
        return out


def setup(app):
    app.add_config_value("benchmark_results_dir", "", "env")
    app.add_directive("benchmark-results", BenchmarkResults)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
