"""Passes 2 and 3 of ``ooc-spectral fit`` against floors measured in the same run (issue 54, item 4).

As users run it, through the command line: ``ooc-spectral make-data swiss-roll`` writes
n x d float32 rows to zarr (kept with ``--keep``), then ``ooc-spectral fit DATA --out OUT
--dictionary-size m --n-components 2`` runs ``--fits`` times (the embedded default engine).
Before and after each fit the floors are measured with the fastest libraries this machine
has for each (``cli_floors.floors``): float64 gemm (NumPy's BLAS, or Intel MKL's sequential
``dgemm``, one per core, where it is installed: the ``mkl`` extra), ``exp`` (NumPy's, or
MKL's vector ``vmdExp`` in the high-accuracy mode the passes use), each on in-cache pieces,
and the zarr read of the whole input; the result names the library each floor used.

A pass's counted work (as issue 18 counts it): pass 2, ``2nmd + 2nm^2`` flops (the kernel
product, the triangular solve and the m x m accumulation), ``n m`` exponentials and the
read; pass 3, ``2nmd + 2nmp`` flops, ``n m`` exponentials and the read. Two figures:

- ``of floor``: the floor's seconds on all cores (the work at the all-cores rates of the
  floors measured before and after that fit, plus the read) over the pass's wall seconds
  (the fit's ``report.json``): what a quiet machine shows;
- ``of floor (CPU)``: the floor's CPU seconds (the work at one thread's rates, measured
  by the thread's CPU clock, plus the read's CPU seconds) over the CPU seconds the fit's
  process tree spent in the pass (read at the log's stage lines): much less sensitive to
  other work on a shared machine, blind to idle cores.

Each figure is the median over the fits, with the load average beside it.

    python workflows/bench/passes.py                          # 2e6 x 16, m = 800, 3 fits
    python workflows/bench/passes.py --workdir /tmp/w --keep  # keep the input for a rerun

Writes ``passes.json`` and ``passes.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).parent))
from cli_floors import EXP_PIECE, floors, read_seconds  # noqa: E402
from startup import machine  # noqa: E402

P = 2
STAGE = re.compile(r"stage (\w+): (start|[0-9.]+ s)")


def tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds (user + system) of a process and its live descendants."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def run_fit(cmd: list[str]) -> tuple[dict, dict]:
    """Run the fit command; CPU seconds of its process tree per stage (between the log's
    ``stage X: start`` and ``stage X: ... s`` lines), and its wall seconds."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    ps = psutil.Process(proc.pid)
    cpu, started = {}, {}
    for line in proc.stderr:
        m = STAGE.search(line)
        if not m:
            continue
        now = tree_cpu(ps)
        name, what = m.groups()
        if what == "start":
            started[name] = now
        elif name in started:
            cpu[name] = cpu.get(name, 0.0) + now - started.pop(name)
    if proc.wait():
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode})")
    return cpu, {"process_seconds": time.perf_counter() - t0}


def thread_cpu_rate(fn, work: float, seconds: float = 1.0) -> float:
    """``work`` per CPU second of the calling thread running ``fn`` (best of a few)."""
    fn()
    best = 0.0
    deadline = time.perf_counter() + seconds
    while True:
        t = time.thread_time()
        fn()
        dt = time.thread_time() - t
        if dt > 0:
            best = max(best, work / dt)
        if time.perf_counter() > deadline:
            return best


def one_thread_floors(data: Path) -> dict:
    """The floors' rates on one thread, by its CPU clock: gemm (the faster of NumPy's on one
    BLAS thread and MKL's sequential one), exp (NumPy's or MKL's vmdExp), and the CPU
    seconds of reading and decoding the whole input."""
    from threadpoolctl import threadpool_limits

    import ctypes

    import dask

    from cli_floors import installed_mkl
    from ooc_spectral._accel.blas import _VML_HA_IGNORE, _vector_exp

    n = 1500
    a, b, c = np.random.rand(n, n), np.random.rand(n, n), np.zeros((n, n))
    with threadpool_limits(1, user_api="blas"):
        numpy_gemm = thread_cpu_rate(lambda: np.matmul(a, b, out=c), 2.0 * n**3)
    mkl_gemm = None
    lib = installed_mkl()  # the fastest this machine offers, used by the passes or not
    if lib is not None:
        from solve_layouts import mkl_matmul

        with dask.config.set({"ooc-spectral.mkl": True}):
            mkl_gemm = thread_cpu_rate(lambda: mkl_matmul(a, b, c), 2.0 * n**3)
    x = -np.random.rand(EXP_PIECE)
    y = np.empty_like(x)
    numpy_exp = thread_cpu_rate(lambda: [np.exp(x, out=y) for _ in range(32)], 32.0 * x.size)

    vml = None if lib is None else _vector_exp(lib)

    def vexp():  # out of place: no copy timed
        for _ in range(32):
            vml(ctypes.c_int64(x.size), ctypes.c_void_p(x.ctypes.data),
                ctypes.c_void_p(y.ctypes.data), ctypes.c_int64(_VML_HA_IGNORE))

    mkl_exp = thread_cpu_rate(vexp, 32.0 * x.size) if vml is not None else None
    t = time.process_time()
    read_seconds(data, 1)
    read_cpu = time.process_time() - t
    return {"gemm_gflops": max(numpy_gemm, mkl_gemm or 0.0) / 1e9,
            "gemm_library": "mkl" if (mkl_gemm or 0.0) > numpy_gemm else "numpy",
            "numpy_gemm_gflops": numpy_gemm / 1e9,
            "mkl_gemm_gflops": None if mkl_gemm is None else mkl_gemm / 1e9,
            "exp_per_s": max(numpy_exp, mkl_exp or 0.0),
            "exp_library": "mkl vmdExp (HA)" if (mkl_exp or 0.0) > numpy_exp else "numpy",
            "numpy_exp_per_s": numpy_exp, "mkl_exp_per_s": mkl_exp,
            "read_cpu_seconds": read_cpu}


def counted(n: int, d: int, m: int) -> dict:
    """Flops and exponentials of passes 2 and 3."""
    return {"pass2": {"flops": 2.0 * n * m * d + 2.0 * n * m * m, "exps": 1.0 * n * m},
            "pass3": {"flops": 2.0 * n * m * d + 2.0 * n * m * P, "exps": 1.0 * n * m}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=float, default=2e6)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--m", type=int, default=800)
    ap.add_argument("--fits", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true", help="reuse the input in --workdir")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    n, d, cores = int(args.n), args.dim, os.cpu_count() or 1
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ooc-passes-"))
    work.mkdir(parents=True, exist_ok=True)
    exe = [sys.executable, "-m", "ooc_spectral"]
    data = work / f"roll-{n}-{d}.zarr"
    try:
        if not (args.keep and data.exists()):
            subprocess.run([*exe, "make-data", "swiss-roll", "--n", str(n), "--dim", str(d),
                            "--out", str(data), "--chunk-rows", "262144", "--overwrite", "-q"],
                           check=True)
        fits = []
        before = floors(data, cores)
        for i in range(args.fits):
            out = work / "fit"
            shutil.rmtree(out, ignore_errors=True)
            cmd = [*exe, "fit", str(data), "--out", str(out), "--dictionary-size", str(args.m),
                   "--n-components", str(P)]
            load0 = os.getloadavg()[0]
            cpu, extra = run_fit(cmd)
            load1 = os.getloadavg()[0]
            after = floors(data, cores)
            one = one_thread_floors(data)
            report = json.loads((out / "report.json").read_text())
            fits.append({"before": before, "after": after, "one_thread": one, "cpu": cpu,
                         "report": {k: report.get(k) for k in (
                             "dictionary_size", "engine", "threads", "tasks", "task_rows",
                             "block_rows", "pass2_block_rows", "blas", "compiled_loops",
                             "wall_seconds")},
                         "stages": {k: v["seconds"] for k, v in report["stages"].items()},
                         "load": [round(load0, 2), round(load1, 2)], **extra})
            before = after
            print(f"fit {i + 1}: {fits[-1]['stages']}, CPU {cpu}, load {load0:.1f}-{load1:.1f}",
                  flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    m = fits[0]["report"]["dictionary_size"]
    work_of = counted(n, d, m)
    passes = {}
    for name, w in work_of.items():
        walls, cpus, ofs, ofs_cpu = [], [], [], []
        for f in fits:
            rate = {k: (f["before"][k] + f["after"][k]) / 2
                    for k in ("gemm_gflops", "exp_per_s", "read_seconds")}
            floor = (w["flops"] / (rate["gemm_gflops"] * 1e9) + w["exps"] / rate["exp_per_s"]
                     + rate["read_seconds"])
            one = f["one_thread"]
            floor_cpu = (w["flops"] / (one["gemm_gflops"] * 1e9) + w["exps"] / one["exp_per_s"]
                         + one["read_cpu_seconds"])
            wall, cpu = f["stages"][name], f["cpu"].get(name)
            walls.append(wall)
            ofs.append(floor / wall)
            if cpu:
                cpus.append(cpu)
                ofs_cpu.append(floor_cpu / cpu)
        passes[name] = {"seconds": statistics.median(walls), "seconds_runs": walls,
                        "of_floor": statistics.median(ofs), "of_floor_runs": ofs,
                        "cpu_seconds": statistics.median(cpus) if cpus else None,
                        "of_floor_cpu": statistics.median(ofs_cpu) if ofs_cpu else None,
                        "of_floor_cpu_runs": ofs_cpu, **w}
    result = {"command": "python workflows/bench/passes.py " + " ".join(sys.argv[1:]),
              "n": n, "d": d, "m": m, "machine": machine(), "passes": passes, "fits": fits}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "passes.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "passes.md").write_text(markdown(result))
    print(markdown(result))


def markdown(r: dict) -> str:
    mc, f0 = r["machine"], r["fits"][0]
    libs = (f"gemm: {f0['before']['gemm_library']} (NumPy {f0['before']['numpy_gemm_gflops']}, "
            f"MKL {f0['before']['mkl_gemm_gflops']} GFLOP/s on all cores; one thread "
            f"{f0['one_thread']['gemm_library']}, {f0['one_thread']['gemm_gflops']:.1f} GFLOP/s "
            f"of CPU time); exp: {f0['before']['exp_library']} (NumPy "
            f"{f0['before']['numpy_exp_per_s']:.3g}, MKL {f0['before']['mkl_exp_per_s'] or 0:.3g}"
            f" values/s on all cores; one thread {f0['one_thread']['exp_library']}, "
            f"{f0['one_thread']['exp_per_s']:.3g} per CPU second)")
    lines = [f"# Passes 2 and 3 of `ooc-spectral fit` against their floors (n = {r['n']:,}, "
             f"d = {r['d']}, m = {r['m']})", "",
             f"Command: `{r['command']}`. Machine: {mc['cpu']}, {mc['cores']} cores, NumPy "
             f"{mc['numpy']} on {', '.join(mc['numpy_blas'])}; the passes on "
             f"{f0['report']['blas']}, loops {f0['report']['compiled_loops'] or 'NumPy'}, engine "
             f"{f0['report']['engine']} ({f0['report']['tasks']} tasks of "
             f"{f0['report']['task_rows']:,} rows). Floors measured before and after each fit "
             f"with the fastest library for each: {libs}. Median of {len(r['fits'])} fits.", "",
             "| pass | seconds | of floor (wall) | CPU seconds | of floor (CPU) | runs: of floor, of floor (CPU) |",
             "|---|---:|---:|---:|---:|---|"]
    for name, p in r["passes"].items():
        cpu = "" if p["cpu_seconds"] is None else f"{p['cpu_seconds']:.1f}"
        ofc = "" if p["of_floor_cpu"] is None else f"**{100 * p['of_floor_cpu']:.0f}%**"
        runs = "; ".join(f"{100 * a:.0f}%, {100 * b:.0f}%"
                         for a, b in zip(p["of_floor_runs"], p["of_floor_cpu_runs"]))
        lines.append(f"| {name} | {p['seconds']:.1f} | **{100 * p['of_floor']:.0f}%** | {cpu} | "
                     f"{ofc} | {runs} |")
    lines += ["", "Fits (stages in seconds; load average at start and end of the fit):", ""]
    for f in r["fits"]:
        st = ", ".join(f"{k} {v:.1f}" for k, v in f["stages"].items())
        lines.append(f"- {st}; load {f['load'][0]}-{f['load'][1]}; gemm GFLOP/s "
                     f"{f['before']['gemm_gflops']} / {f['after']['gemm_gflops']}, exp/s "
                     f"{f['before']['exp_per_s']:.3g} / {f['after']['exp_per_s']:.3g}, read "
                     f"{f['before']['read_seconds']} / {f['after']['read_seconds']} s")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
