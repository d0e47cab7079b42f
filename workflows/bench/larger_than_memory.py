"""Run ``workflows/larger-than-memory.toml`` and record what it cost.

Runs ``ooc-spectral run workflows/larger-than-memory.toml`` (2.5 x 10^8 rows x 32
float32 features, 32 GB in zarr, more than this machine's 24 GiB of RAM) in a
subprocess, samples the peak RSS of its whole process tree (client, nannies,
workers) every 100 ms, and writes ``larger_than_memory.json`` and ``.md`` with the
fit's ``report.json``, the peak RSS and the per-pass times.

    python workflows/bench/larger_than_memory.py [--set data.n=10000000]
    python workflows/bench/larger_than_memory.py --from-report   # results of a finished fit

``--from-report`` writes the figures of the fit already in
``results/larger-than-memory/fit`` without running anything: its peak RSS is the
one the fit's own sampler recorded in ``report.json`` (the same process tree,
client and workers, sampled every 50 ms, over the fit only).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from ooc_spectral.monitor import tree_rss

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", action="append", default=[], help="passed to ooc-spectral run")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--from-report", action="store_true",
                    help="summarize the finished fit's report.json instead of running")
    args = ap.parse_args()
    fit_dir = ROOT / "results" / "larger-than-memory" / "fit"
    if args.from_report:
        report = json.loads((fit_dir / "report.json").read_text())
        if report.get("status") != "complete":
            raise SystemExit(f"{fit_dir} holds no finished fit")
        write_results(args.out, report, wall=None, peak=report["peak_memory_bytes"],
                      scope="the fit (its own sampler, report.json)")
        return
    wf = ROOT / "workflows" / "larger-than-memory.toml"
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
    write_results(args.out, report, wall=wall, peak=peak, scope="the workflow (make-data, fit, plot)")


def write_results(out_dir, report: dict, *, wall: float | None, peak: int, scope: str) -> None:
    data = ROOT / "results" / "larger-than-memory" / "swiss-roll-32d.zarr"
    size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    result = {"command": " ".join([sys.executable, *sys.argv]), "workflow_wall_seconds": wall,
              "fit_wall_seconds": report["wall_seconds"], "peak_tree_rss_bytes": peak,
              "peak_scope": scope, "input_bytes_on_disk": size,
              "input_bytes_decoded": report["n_samples"] * report["n_features"] * 4,
              "report": report}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "larger_than_memory.json").write_text(json.dumps(result, indent=2) + "\n")
    st = report["stages"]
    lines = ["# Larger than RAM", "", f"Command: `{result['command']}`", "",
             f"- input: {report['n_samples']:,} rows x {report['n_features']} float32 = "
             f"{result['input_bytes_decoded'] / 1e9:.1f} GB decoded, {size / 1e9:.1f} GB on disk "
             "(machine RAM: 24 GiB)",
             f"- dictionary: {report['dictionary_size']} points; certificate max residual "
             f"{report['max_residual']:.3g}",
             f"- peak RSS of the whole process tree over {scope}: **{peak / 2**30:.2f} GiB**",
             f"- fit wall time: {report['wall_seconds'] / 60:.1f} min (finished {report['finished']})"]
    if wall is not None:
        lines.append(f"- workflow wall time (make-data, fit, plot): {wall / 60:.1f} min")
    lines += ["", "| stage | seconds | peak RSS during stage |", "|---|---:|---:|"]
    for name, s in st.items():
        mem = s.get("peak_memory_bytes")
        lines.append(f"| {name} | {s['seconds']:.1f} | {mem / 2**30:.2f} GiB |" if mem else
                     f"| {name} | {s['seconds']:.1f} | - |")
    (out / "larger_than_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
