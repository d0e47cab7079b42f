"""The right engine for the size, and memory by budget (issue 18, items 2-4).

Three measurements, each through ``ooc-spectral fit`` as users run it (a
subprocess; its ``report.json`` gives the stage seconds, the tasks and the
engine; the process tree's RSS and CPU time are sampled every 50 ms):

``crossover``
    the same fits on ``--engine threads`` and ``--engine cluster`` (n = 10^5,
    10^6, 10^7 by default): wall time of each, and the cluster's fixed cost.
``default``
    the embedded default (``--engine auto``) at n = 10^5, 10^6, 10^7: wall
    seconds over the sum of the stages (aim: at most 1.5), the tasks per
    thread, and the cores busy during pass 2 (process-tree CPU seconds over
    pass 2's wall seconds).
``memory``
    8·10^6 x 8 float32 rows in 262,144-row storage chunks at m = 300 and
    m = 1000 (``--dictionary-size``), on both engines: peak RSS of the process
    tree (aim: m = 1000 within 1.5x of m = 300, and below 3 GiB).

Data: ``make-data swiss-roll --dim D`` (float32 zarr). The machine is shared:
the load average before and after each run is recorded with it.

    python workflows/bench/engines.py                       # all three
    python workflows/bench/engines.py --only default --sizes 1e5 1e6 1e7
    python workflows/bench/engines.py --only memory

Writes ``engines.json`` and ``engines.md`` to ``--out`` (merging with what an
earlier run with other ``--only`` left there).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from ooc_spectral.datasets import make_data
from ooc_spectral.runtime.monitor import tree_rss


def tree_cpu(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def run_fit(cmd: list[str], interval: float = 0.05) -> dict:
    """Run ``cmd`` (a fit, logging at INFO); peak tree RSS, wall, and pass 2's CPU use."""
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    marks: dict[str, float] = {}
    samples: list[tuple[float, float]] = []
    lines: list[str] = []

    def read():
        for line in proc.stderr:
            lines.append(line)
            if "stage pass2: start" in line and "pass2_start" not in marks:
                marks["pass2_start"] = time.perf_counter()
            elif "stage pass2:" in line and "start" not in line:
                marks["pass2_end"] = time.perf_counter()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        samples.append((time.perf_counter(), tree_cpu(proc.pid)))
        time.sleep(interval)
    reader.join(timeout=10)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        sys.stderr.write("".join(lines[-30:]))
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    busy = None
    if "pass2_start" in marks and "pass2_end" in marks:
        a, b = marks["pass2_start"], marks["pass2_end"]
        inside = [(t, c) for t, c in samples if a <= t <= b]
        if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
            busy = (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
    return {"peak_tree_rss_bytes": peak, "process_seconds": round(seconds, 2),
            "pass2_cores_busy": None if busy is None else round(busy, 2),
            "load_before": round(load0, 2), "load_after": round(os.getloadavg()[0], 2)}


def fit(data: Path, out: Path, extra: list[str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["ooc-spectral", "fit", str(data), "--out", str(out), "--n-components", "2", *extra]
    measured = run_fit(cmd)
    report = json.loads((out / "report.json").read_text())
    stages = {k: v["seconds"] for k, v in report["stages"].items()}
    row = {"n": report["n_samples"], "d": report["n_features"], "args": extra,
           "engine": report["engine"], "threads": report["threads"],
           "workers": report["workers"], "dictionary_size": report["dictionary_size"],
           "task_rows": report["task_rows"], "tasks": report["tasks"],
           "block_rows": report["block_rows"], "wall_seconds": report["wall_seconds"],
           "stage_seconds": round(sum(stages.values()), 3), "stages": stages, **measured}
    row["wall_over_stages"] = round(row["wall_seconds"] / row["stage_seconds"], 3)
    shutil.rmtree(out, ignore_errors=True)
    return row


def dataset(work: Path, n: int, dim: int, chunk_rows: int | None) -> Path:
    path = work / f"roll-{n}-{dim}-{chunk_rows}.zarr"
    if not path.exists():
        make_data("swiss-roll", n, path, dim=dim, chunk_rows=chunk_rows, seed=0)
    return path


def show(r: dict) -> None:
    print(f"  n={r['n']:>11,} m={r['dictionary_size']:>5} {r['engine']:>7}: wall {r['wall_seconds']:7.2f} s, "
          f"stages {r['stage_seconds']:7.2f} s (x{r['wall_over_stages']:.2f}), tasks {r['tasks']} "
          f"of {r['task_rows']} rows on {r['threads']} threads, pass 2 cores busy "
          f"{r['pass2_cores_busy']}, peak {r['peak_tree_rss_bytes'] / 2**20:.0f} MiB, "
          f"load {r['load_before']}->{r['load_after']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("crossover", "default", "memory"), action="append")
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e5, 1e6, 1e7])
    ap.add_argument("--crossover-sizes", type=float, nargs="+", default=[1e5, 1e6, 1e7])
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--dictionary-size", type=int, default=300)
    ap.add_argument("--memory-n", type=float, default=8e6)
    ap.add_argument("--memory-m", type=int, nargs="+", default=[300, 1000])
    ap.add_argument("--memory-engines", nargs="+", default=["auto", "cluster"])
    ap.add_argument("--workdir", default=None, help="where to put the data (default: a temp dir)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    which = args.only or ["crossover", "default", "memory"]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ooc-engines-"))
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "engines.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    result["machine"] = {"cpus": os.cpu_count(), "ram_bytes": psutil.virtual_memory().total,
                         "python": platform.python_version(),
                         "note": "shared with other engineers' test runs: see each row's load"}
    m = ["--dictionary-size", str(args.dictionary_size)]
    if "crossover" in which:
        print("crossover: the same fit on threads and on the embedded LocalCluster")
        rows = []
        for n in map(int, args.crossover_sizes):
            data = dataset(work, n, args.dim, None)
            for engine in ("threads", "cluster"):
                r = fit(data, work / "fit", [*m, "--engine", engine, "--workers", "2"])
                show(r)
                rows.append(r)
        result["crossover"] = rows
    if "default" in which:
        print("default: the embedded default (--engine auto)")
        rows = []
        for n in map(int, args.sizes):
            r = fit(dataset(work, n, args.dim, None), work / "fit", m)
            show(r)
            rows.append(r)
        result["default"] = rows
    if "memory" in which:
        print("memory: m = 300 and m = 1000, 262,144-row storage chunks")
        n = int(args.memory_n)
        data = dataset(work, n, args.dim, 262_144)
        rows = []
        for engine in args.memory_engines:
            for size in args.memory_m:
                r = fit(data, work / "fit", ["--dictionary-size", str(size), "--engine", engine])
                show(r)
                rows.append(r)
        result["memory"] = rows
    path.write_text(json.dumps(result, indent=1))
    (out / "engines.md").write_text(markdown(result))
    print(f"wrote {path} and {out / 'engines.md'}")


def markdown(result: dict) -> str:
    def table(rows, cols):
        head = "| " + " | ".join(c for c, _ in cols) + " |\n|" + "---|" * len(cols) + "\n"
        return head + "".join("| " + " | ".join(f(r) for _, f in cols) + " |\n" for r in rows)

    base = [("n", lambda r: f"{r['n']:,}"), ("m", lambda r: str(r["dictionary_size"])),
            ("engine", lambda r: r["engine"]),
            ("wall s", lambda r: f"{r['wall_seconds']:.2f}"),
            ("stages s", lambda r: f"{r['stage_seconds']:.2f}"),
            ("wall / stages", lambda r: f"{r['wall_over_stages']:.2f}"),
            ("process s", lambda r: f"{r['process_seconds']:.1f}"),
            ("tasks x rows", lambda r: f"{r['tasks']} x {r['task_rows']:,}"),
            ("threads", lambda r: str(r["threads"])),
            ("pass 2 cores busy", lambda r: str(r["pass2_cores_busy"])),
            ("pass 2 s", lambda r: f"{r['stages'].get('pass2', 0):.2f}"),
            ("pass 3 s", lambda r: f"{r['stages'].get('pass3', 0):.2f}"),
            ("peak RSS MiB", lambda r: f"{r['peak_tree_rss_bytes'] / 2**20:.0f}"),
            ("load before/after", lambda r: f"{r['load_before']}/{r['load_after']}")]
    text = ["# Engines, tasks and memory (issue 18)\n",
            f"Machine: {result['machine']['cpus']} cores, "
            f"{result['machine']['ram_bytes'] / 2**30:.0f} GiB; {result['machine']['note']}. "
            "`wall s` is report.json's `wall_seconds` (from the job's start to its report), "
            "`stages s` the sum of its stages, `process s` the command's whole life (Python "
            "start and imports included). `python workflows/bench/engines.py`\n"]
    if "crossover" in result:
        text += ["\n## Threads vs the embedded LocalCluster, same fit\n\n",
                 table(result["crossover"], base)]
    if "default" in result:
        text += ["\n## The embedded default (`--engine auto`)\n\n", table(result["default"], base)]
    if "memory" in result:
        text += ["\n## Memory: 262,144-row storage chunks, m = 300 vs m = 1000\n\n",
                 "Peak RSS of the whole process tree (the command, and on the cluster the "
                 "scheduler, nannies and workers), sampled every 50 ms. Seconds in rows run at "
                 "a high load average are not comparable with the others.\n\n",
                 table(result["memory"], base + [("block rows", lambda r: str(r["block_rows"]))])]
    return "".join(text)


if __name__ == "__main__":
    main()
