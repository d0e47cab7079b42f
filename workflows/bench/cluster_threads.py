"""Where the cores go during pass 2 on the embedded cluster, thread by thread.

Runs ``ooc-spectral fit`` on ``n x d`` float32 swiss-roll rows from zarr (the
embedded ``LocalCluster``, ``--dictionary-size m``), alternately with the dask
config ``ooc-spectral.cluster-diagnostics`` off (the default: no worker profiler,
a 500 ms tick, a 2 s system monitor; ``ooc_spectral.runtime.cluster.EMBEDDED_DIAGNOSTICS_OFF``)
and on (distributed's defaults). Once the workers are busy (pass 2), it reads the
CPU time of every thread of the process tree over ``--window`` seconds: each
worker's busiest thread (the task thread), the workers' other threads (event loop,
zarr's I/O and decoding) and the client process (scheduler, nannies, the fit's own
threads), in percent of one core.

    python workflows/bench/cluster_threads.py [--n 1e7] [--dim 32] [--dictionary-size 300]
        [--repeats 2] [--window 8] [--workdir DIR] [--out DIR]

Writes ``cluster_threads.json`` and ``cluster_threads.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import psutil

from ooc_spectral.datasets import make_data

CHUNK_ROWS = 262_144


def _thread_times(procs) -> dict:
    out = {}
    for p in procs:
        try:
            for t in p.threads():
                out[(p.pid, t.id)] = t.user_time + t.system_time
        except psutil.Error:
            pass
    return out


def sample(data: Path, out: Path, m: int, diagnostics: bool, window: float) -> dict:
    """One fit; the threads' CPU over ``window`` seconds of pass 2, and the stages."""
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, DASK_OOC_SPECTRAL__CLUSTER_DIAGNOSTICS=str(diagnostics))
    cmd = ["ooc-spectral", "fit", str(data), "--out", str(out), "--dictionary-size", str(m),
           "--n-components", "2", "--engine", "cluster", "-q"]
    proc = subprocess.Popen(cmd, env=env)
    root = psutil.Process(proc.pid)
    shares = None
    while proc.poll() is None and shares is None:
        try:
            workers = [c for c in root.children(recursive=True) if c.num_threads() > 4]
            if len(workers) >= 2:  # the pass is on when the workers keep their cores busy
                c0 = sum(w.cpu_times().user + w.cpu_times().system for w in workers)
                time.sleep(1.0)
                c1 = sum(w.cpu_times().user + w.cpu_times().system for w in workers)
                if c1 - c0 > 1.5:
                    procs = [root] + workers
                    a, t0 = _thread_times(procs), time.perf_counter()
                    time.sleep(window)
                    b, dt = _thread_times(procs), time.perf_counter() - t0
                    used = {k: 100 * (b[k] - a.get(k, 0.0)) / dt for k in b}
                    task = {w.pid: max((v for (pid, _), v in used.items() if pid == w.pid), default=0.0)
                            for w in workers}
                    shares = {"task_threads": sum(task.values()),
                              "worker_other_threads": sum(v for (pid, _), v in used.items()
                                                          if pid in task) - sum(task.values()),
                              "client_process": sum(v for (pid, _), v in used.items()
                                                    if pid == root.pid)}
                    continue
            time.sleep(0.5)
        except psutil.Error:
            time.sleep(0.5)
    proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {proc.returncode}")
    report = json.loads((out / "report.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return {"diagnostics": diagnostics, "pass2_seconds": report["stages"]["pass2"]["seconds"],
            "shares_percent_of_a_core": shares}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=float, default=1e7)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--dictionary-size", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--window", type=float, default=8.0)
    ap.add_argument("--workdir", default="/tmp/ooc-cluster-threads")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    n, work = int(args.n), Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"roll-{n}-{args.dim}.zarr"
    if not data.exists():
        make_data("swiss-roll", n, data, dim=args.dim, seed=0, chunk_rows=CHUNK_ROWS)
    runs = []
    for _ in range(args.repeats):
        for diagnostics in (False, True):
            runs.append(sample(data, work / "fit", args.dictionary_size, diagnostics, args.window))
            print(runs[-1], flush=True)
    command = ("python workflows/bench/cluster_threads.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "workdir")))
    result = {"command": command, "n": n, "dim": args.dim, "m": args.dictionary_size, "runs": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cluster_threads.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Pass 2's threads on the embedded cluster, with and without distributed's diagnostics",
             "", f"Command: `{command}`; {n:,} x {args.dim} rows, m = {args.dictionary_size}, "
             f"2 workers x 1 thread; CPU of each group of threads over {args.window:g} s of pass 2, "
             "percent of one core.", "",
             "| diagnostics | task threads | workers' other threads | client process | pass 2 s |",
             "|---|---:|---:|---:|---:|"]
    for r in runs:
        s = r["shares_percent_of_a_core"] or {}
        lines.append(f"| {'on' if r['diagnostics'] else 'off'} | {s.get('task_threads', np.nan):.1f} | "
                     f"{s.get('worker_other_threads', np.nan):.1f} | {s.get('client_process', np.nan):.1f} | "
                     f"{r['pass2_seconds']:.1f} |")
    (out / "cluster_threads.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
