"""Run a larger-than-RAM workflow end to end and record what it cost.

Runs ``ooc-spectral run WORKFLOW`` in a subprocess (default
``workflows/larger-than-memory.toml``: 2.5 x 10^8 rows x 32 float32 features, 32 GB
in zarr; ``workflows/billion.toml``: 10^9 x 8, the issue-18 night run), samples the
peak RSS of its whole process tree (client, scheduler, nannies, workers) every
100 ms, and writes ``<name>.json`` and ``.md`` (``name`` the workflow's, with
``_`` for ``-``) with the fit's ``report.json``, the peak RSS, the per-stage times,
which stages resumed, and the disk used.

    python workflows/bench/larger_than_memory.py [--set data.n=10000000]
    python workflows/bench/larger_than_memory.py --workflow workflows/billion.toml
    python workflows/bench/larger_than_memory.py --from-report   # results of a finished fit

``--from-report`` writes the figures of the fit already in the workflow's fit
directory without running anything: its peak RSS is the one the fit's own sampler
recorded in ``report.json`` (the same process tree, sampled every 50 ms, over the
fit only). A run killed part way is resumed by running the same command again.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from ooc_spectral.runtime.monitor import tree_rss

ROOT = Path(__file__).resolve().parents[2]


def _steps(workflow: Path) -> dict:
    """The workflow's name and the paths of its data, fit and plot steps."""
    wf = tomllib.loads(workflow.read_text())
    root = (workflow.parent / wf["workflow"].get("root", ".")).resolve()
    by_run = {st["run"]: st for st in wf["step"]}
    return {"name": wf["workflow"]["name"], "data": root / by_run["make-data"]["out"],
            "fit": root / by_run["fit"]["out"],
            "plot": root / by_run["plot"]["out"] if "plot" in by_run else None}


def _disk(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workflow", default=str(ROOT / "workflows" / "larger-than-memory.toml"))
    ap.add_argument("--set", action="append", default=[], help="passed to ooc-spectral run")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--from-report", action="store_true",
                    help="summarize the finished fit's report.json instead of running")
    args = ap.parse_args()
    wf = Path(args.workflow).resolve()
    steps = _steps(wf)
    fit_dir = steps["fit"]
    if args.from_report:
        report = json.loads((fit_dir / "report.json").read_text())
        if report.get("status") != "complete":
            raise SystemExit(f"{fit_dir} holds no finished fit")
        write_results(args.out, steps, report, wall=None, peak=report["peak_memory_bytes"],
                      scope="the fit (its own sampler, report.json)")
        return
    cmd = ["ooc-spectral", "run", str(wf), "--json"] + [a for s in args.set for a in ("--set", s)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.1)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"the workflow failed (exit {proc.returncode})")
    report = json.loads((fit_dir / "report.json").read_text())
    write_results(args.out, steps, report, wall=wall, peak=peak,
                  scope="the workflow (make-data, fit, plot)")


def write_results(out_dir, steps: dict, report: dict, *, wall: float | None, peak: int,
                  scope: str) -> None:
    size = _disk(steps["data"])
    result = {"command": " ".join([sys.executable, *sys.argv]), "workflow_wall_seconds": wall,
              "fit_wall_seconds": report["wall_seconds"], "peak_tree_rss_bytes": peak,
              "peak_scope": scope, "input_bytes_on_disk": size,
              "output_bytes_on_disk": _disk(steps["fit"]),
              "input_bytes_decoded": report["n_samples"] * report["n_features"] * 4,
              "resumed_stages": report.get("resumed_stages", []),
              "picture": None if steps["plot"] is None else str(steps["plot"].relative_to(ROOT)),
              "report": report}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = steps["name"].replace("-", "_")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    st = report["stages"]
    lines = [f"# Larger than RAM: {steps['name']}", "", f"Command: `{result['command']}`", "",
             f"- input: {report['n_samples']:,} rows x {report['n_features']} float32 = "
             f"{result['input_bytes_decoded'] / 1e9:.1f} GB decoded, {size / 1e9:.1f} GB on disk "
             "(machine RAM: 24 GiB)",
             f"- dictionary: {report['dictionary_size']} points; certificate max residual "
             f"{report['max_residual']:.3g}",
             f"- peak RSS of the whole process tree over {scope}: **{peak / 2**30:.2f} GiB**",
             f"- fit wall time: {report['wall_seconds'] / 60:.1f} min (finished {report['finished']}); "
             f"stages resumed from an earlier attempt: {', '.join(result['resumed_stages']) or 'none'}",
             f"- disk: input {size / 1e9:.1f} GB, fit directory (embedding, model, checkpoint) "
             f"{result['output_bytes_on_disk'] / 1e9:.1f} GB"]
    if wall is not None:
        lines.append(f"- workflow wall time (make-data, fit, plot): {wall / 60:.1f} min")
    lines += ["", "| stage | seconds | peak RSS during stage |", "|---|---:|---:|"]
    for name, s in st.items():
        mem = s.get("peak_memory_bytes")
        lines.append(f"| {name} | {s['seconds']:.1f} | {mem / 2**30:.2f} GiB |" if mem else
                     f"| {name} | {s['seconds']:.1f} | - |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
