"""The embedded cluster's workers with and without dask's allocator setting (issue 18, item 1).

distributed starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536`` (its
``distributed.nanny.pre-spawn-environ``). Setting it also fixes glibc's mmap
threshold at 128 KiB, so every array of a sub-block above that size (the float64
rows, the augmented rows, the m x m product, the decoded chunk) is a fresh
``mmap``, faulted in page by page, and unmapped when freed. ooc_spectral's
embedded cluster leaves it unset (``ooc_spectral.runtime.cluster.worker_pre_spawn_environ``;
the dask config ``ooc-spectral.worker-malloc-trim-threshold`` restores one).

This runs ``ooc-spectral fit`` (``--engine cluster``) on the same input with the
threshold unset (``glibc``) and at distributed's 65536 (``dask``), alternately,
``--repeats`` times each, each in a fresh process (the fork server's allocator
is set up when it starts), and records each pass's seconds, the report's peak
RSS, and the user and system CPU seconds of every process of the tree (sampled
every 0.5 s).

    python workflows/bench/worker_malloc.py --n 1e7 --dim 32 --dictionary-size 300

Writes ``worker_malloc.json`` and ``worker_malloc.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from ooc_spectral.datasets import make_data

SETTINGS = {"glibc": None, "dask": 65536}


def run_fit(data: str, out: str, m: int, trim) -> dict:
    """One fit in a fresh process with the setting; its report and the tree's CPU times."""
    env = dict(os.environ)
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    code = ("import dask, sys\n"
            "from ooc_spectral.batch.cli import main\n"
            f"dask.config.set({{'ooc-spectral.worker-malloc-trim-threshold': {trim!r}}})\n"
            "sys.exit(main(sys.argv[1:]))\n")
    cmd = [sys.executable, "-c", code, "fit", data, "--out", out, "--dictionary-size", str(m),
           "--n-components", "2", "-q", "--engine", "cluster", "--overwrite"]
    p = subprocess.Popen(cmd, env=env)
    root = psutil.Process(p.pid)
    cpu = {}
    while p.poll() is None:
        try:
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            procs = []
        for q in procs:
            try:
                cpu[q.pid] = (q.cmdline(), q.cpu_times())
            except psutil.Error:
                pass
        time.sleep(0.5)
    if p.returncode != 0:
        raise SystemExit(f"fit failed with exit code {p.returncode}")
    report = json.loads((Path(out) / "report.json").read_text())
    workers = [t for cl, t in cpu.values() if "forkserver" in " ".join(cl) and t.user > 2.0]
    return {"stages": {k: v["seconds"] for k, v in report["stages"].items()},
            "wall_seconds": report["wall_seconds"],
            "peak_memory_mib": report["peak_memory_bytes"] / 2**20,
            "client_cpu": {"user": cpu[p.pid][1].user, "system": cpu[p.pid][1].system},
            "worker_cpu": [{"user": t.user, "system": t.system} for t in workers]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=float, default=1e7)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--dictionary-size", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", default=None, help="an existing zarr input (default: make-data)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="worker_malloc-"))
    work.mkdir(parents=True, exist_ok=True)
    n = int(args.n)
    data = args.data or str(work / f"roll-{n}-{args.dim}.zarr")
    if args.data is None and not Path(data).exists():
        make_data("swiss-roll", n, data, dim=args.dim, seed=0, chunk_rows=262_144, overwrite=True)
    runs = []
    for r in range(args.repeats):
        for name, trim in SETTINGS.items():
            res = run_fit(data, str(work / f"fit-{name}"), args.dictionary_size, trim)
            res.update(setting=name, repeat=r, load=os.getloadavg()[0])
            runs.append(res)
            print(name, {k: round(v, 2) for k, v in res["stages"].items()},
                  f"peak {res['peak_memory_mib']:.0f} MiB",
                  "workers", [(round(w["user"], 1), round(w["system"], 1)) for w in res["worker_cpu"]],
                  flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"n": n, "dim": args.dim, "m": args.dictionary_size, "data": data,
            "command": "python workflows/bench/worker_malloc.py " + " ".join(sys.argv[1:])}
    (out / "worker_malloc.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    lines = ["# Embedded workers: glibc's allocator thresholds against dask's MALLOC_TRIM_THRESHOLD_=65536",
             "", f"`{meta['command']}`; n = {n:,}, d = {args.dim}, m = {args.dictionary_size}, "
             "`--engine cluster`, 2 workers x 1 thread, alternating runs, each a fresh process.", "",
             "| setting | repeat | pass 2 s | pass 3 s | wall s | peak RSS MiB | worker user s | "
             "worker system s | client user + system s | load |",
             "|---|---|---:|---:|---:|---:|---|---|---:|---:|"]
    for r in runs:
        w = r["worker_cpu"]
        lines.append(f"| {r['setting']} | {r['repeat']} | {r['stages']['pass2']:.2f} | "
                     f"{r['stages']['pass3']:.2f} | {r['wall_seconds']:.1f} | {r['peak_memory_mib']:.0f} | "
                     + " / ".join(f"{x['user']:.1f}" for x in w) + " | "
                     + " / ".join(f"{x['system']:.1f}" for x in w) + " | "
                     f"{r['client_cpu']['user'] + r['client_cpu']['system']:.1f} | {r['load']:.2f} |")
    (out / "worker_malloc.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
