"""Passes 2 and 3 of ``ooc-spectral fit`` against the machine's floors (issue 18, item 1).

For each size, in one run on one machine:

1. ``make-data swiss-roll`` writes ``n x d`` float32 rows to zarr (262,144-row chunks),
   unless ``--keep`` finds them from an earlier run;
2. the floors are measured on all cores: float64 gemm (GFLOP/s, a 3000^2 product
   on every BLAS thread), ``exp`` (values/s, one NumPy ``exp`` per core on
   separate arrays) and the zarr read (seconds to read and decode every chunk of
   the input, one reader thread per core);
3. ``ooc-spectral fit DATA --out OUT --dictionary-size m --n-components 2 -q`` runs
   as users run it (the embedded default engine), and its ``report.json`` gives
   the seconds of each stage;
4. the floors are measured again; each pass is set against its counted work at
   the mean of the two measurements:

   - pass 2: ``2nmd + 2nm^2`` flops (the kernel product, the triangular solve and
     the m x m accumulation) and ``n m`` exponentials, plus the read;
   - pass 3: ``2nmd + 2nmp`` flops and ``n m`` exponentials, plus the read.

   ``of floor`` is floor seconds over pass seconds (issue 18 asks for 70%).

    python workflows/bench/cli_floors.py                      # 2e6 x 16 (m=800) and 1e8 x 32 (m=300)
    python workflows/bench/cli_floors.py --sizes 2e6:16:800   # one size

Writes ``cli_floors.json`` and ``cli_floors.md`` to ``--out``. The work directory
(``--workdir``, default a temporary one) holds the inputs: 1e8 x 32 float32 is
12.8 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import zarr
from threadpoolctl import threadpool_limits

from ooc_spectral.datasets import make_data

CHUNK_ROWS = 262_144


def gemm_gflops(threads: int) -> float:
    n = 3000
    a, b = np.random.rand(n, n), np.random.rand(n, n)
    with threadpool_limits(threads, user_api="blas"):
        a @ b
        reps, t = 3, time.perf_counter()
        for _ in range(reps):
            a @ b
        return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def installed_mkl():
    """Intel MKL where it is installed (``ooc_spectral._accel.blas.mkl`` with the config
    forced on): the floors are the fastest this machine offers, whether or not the passes
    use MKL here (by default only on Intel processors); None where not installed."""
    import dask

    from ooc_spectral._accel.blas import mkl

    with dask.config.set({"ooc-spectral.mkl": True}):
        return mkl()


def mkl_gemm_gflops(threads: int) -> float | None:
    """MKL's float64 gemm rate, one sequential product per thread side by side (as pass 2
    runs it), or None where MKL is not installed (:func:`installed_mkl`)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from solve_layouts import mkl_matmul

    import dask

    if installed_mkl() is None:
        return None
    n = 3000
    mats = [(np.random.rand(n, n), np.random.rand(n, n), np.zeros((n, n))) for _ in range(threads)]

    def one(i):
        mkl_matmul(*mats[i])

    with dask.config.set({"ooc-spectral.mkl": True}), ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(threads)))
        reps, t = 3, time.perf_counter()
        for _ in range(reps):
            list(pool.map(one, range(threads)))
        return 2 * n**3 * reps * threads / (time.perf_counter() - t) / 1e9


#: Values per piece of the exp floors: in the core's cache, as the passes take their
#: exponentials piece by piece (the fastest a library computes them).
EXP_PIECE = 1 << 16


def _exp_rate(threads: int, exp) -> float:
    """Values/s of ``exp(piece)`` on ``threads`` threads, each on its own in-cache piece."""
    x = -np.random.rand(threads, EXP_PIECE)
    out = np.empty_like(x)
    each = 64

    def one(i):
        for _ in range(each):
            exp(x[i], out[i])

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(threads)))
        reps, t = 5, time.perf_counter()
        for _ in range(reps):
            list(pool.map(one, range(threads)))
        return x.size * each * reps / (time.perf_counter() - t)


def exp_per_s(threads: int) -> float:
    """NumPy's ``exp`` rate (values/s) on ``threads`` threads."""
    return _exp_rate(threads, lambda a, out: np.exp(a, out=out))


def mkl_exp_per_s(threads: int) -> float | None:
    """MKL's vector ``exp`` rate (``vmdExp``, the high-accuracy mode the passes use:
    ``ooc_spectral._accel.blas.exp_inplace``), or None where MKL is not installed."""
    import ctypes

    from ooc_spectral._accel.blas import _VML_HA_IGNORE, _vector_exp

    lib = installed_mkl()
    vexp = None if lib is None else _vector_exp(lib)
    if vexp is None:
        return None
    mode = ctypes.c_int64(_VML_HA_IGNORE)

    def exp(a, out):  # out of place, as exp_inplace's call is in place: no copy timed
        vexp(ctypes.c_int64(a.size), ctypes.c_void_p(a.ctypes.data),
             ctypes.c_void_p(out.ctypes.data), mode)

    # MKL's own threads are sequential where this package loaded it (_accel.blas._open_mkl)
    return _exp_rate(threads, exp)


def read_seconds(data: Path, threads: int) -> float:
    """Seconds to read and decode every chunk of ``data/data`` on ``threads`` threads."""
    arr = zarr.open_array(str(data / "data"), mode="r")
    rows = arr.chunks[0]
    starts = range(0, arr.shape[0], rows)
    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda a: arr[a:a + rows].shape, starts))
    return time.perf_counter() - t


def floors(data: Path, threads: int) -> dict:
    """The floors' rates; the gemm and exp rates are the faster of NumPy's and, where MKL
    is installed, MKL's (so that a faster library raises the floor as well, whether or not
    the passes use it on this processor).
    ``gemm_library`` and ``exp_library`` name the library each floor used."""
    numpy_rate = gemm_gflops(threads)
    mkl_rate = mkl_gemm_gflops(threads)
    numpy_exp, mkl_exp = exp_per_s(threads), mkl_exp_per_s(threads)
    return {"gemm_gflops": round(max(numpy_rate, mkl_rate or 0.0), 1),
            "gemm_library": "mkl" if (mkl_rate or 0.0) > numpy_rate else "numpy",
            "numpy_gemm_gflops": round(numpy_rate, 1),
            "mkl_gemm_gflops": None if mkl_rate is None else round(mkl_rate, 1),
            "exp_per_s": float(f"{max(numpy_exp, mkl_exp or 0.0):.3g}"),
            "exp_library": "mkl vmdExp (HA)" if (mkl_exp or 0.0) > numpy_exp else "numpy",
            "numpy_exp_per_s": float(f"{numpy_exp:.3g}"),
            "mkl_exp_per_s": None if mkl_exp is None else float(f"{mkl_exp:.3g}"),
            "read_seconds": round(read_seconds(data, threads), 2)}


def run_size(n: int, d: int, m: int, work: Path, keep: bool, cores: int,
             engine: str = "auto") -> dict:
    data = work / f"roll-{n}-{d}.zarr"
    t = time.perf_counter()
    if not (keep and data.exists()):
        make_data("swiss-roll", n, data, dim=d, seed=0, chunk_rows=CHUNK_ROWS, overwrite=True)
    make_seconds = time.perf_counter() - t
    before = floors(data, cores)
    load0 = os.getloadavg()[0]
    out = work / f"fit-{n}-{d}-{m}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["ooc-spectral", "fit", str(data), "--out", str(out), "--dictionary-size", str(m),
           "--n-components", "2", "-q"] + ([] if engine == "auto" else ["--engine", engine])
    t = time.perf_counter()
    subprocess.run(cmd, check=True)
    process_seconds = time.perf_counter() - t
    load1 = os.getloadavg()[0]
    after = floors(data, cores)
    report = json.loads((out / "report.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    m = report["dictionary_size"]
    p = 2
    rate = {k: (before[k] + after[k]) / 2 for k in before
            if isinstance(before[k], (int, float)) and isinstance(after[k], (int, float))}
    gemm, exps, read = rate["gemm_gflops"] * 1e9, rate["exp_per_s"], rate["read_seconds"]
    counted = {"pass2": {"flops": (2 * n * m * d + 2 * n * m * m) / gemm, "exp": n * m / exps},
               "pass3": {"flops": (2 * n * m * d + 2 * n * m * p) / gemm, "exp": n * m / exps}}
    passes = {}
    for name, parts in counted.items():
        seconds = report["stages"][name]["seconds"]
        floor = parts["flops"] + parts["exp"] + read
        passes[name] = {"seconds": seconds, "flops_seconds": round(parts["flops"], 2),
                        "exp_seconds": round(parts["exp"], 2), "read_seconds": round(read, 2),
                        "floor_seconds": round(floor, 2), "of_floor": round(floor / seconds, 4),
                        "of_floor_without_read": round((floor - read) / seconds, 3)}
    return {"n": n, "d": d, "m": m, "command": " ".join(cmd), "engine": report["engine"],
            "blas": report.get("blas"),
            "compiled_loops": report.get("compiled_loops"),
            "threads": report["threads"], "tasks": report["tasks"],
            "pass2_tasks": report.get("pass2_tasks", report["tasks"]),
            "task_rows": report["task_rows"], "block_rows": report["block_rows"],
            "pass2_block_rows": report.get("pass2_block_rows", report["block_rows"]),
            "make_data_seconds": round(make_seconds, 1),
            "process_seconds": round(process_seconds, 1),
            "wall_seconds": report["wall_seconds"],
            "stages": {k: v["seconds"] for k, v in report["stages"].items()},
            "floors_before": before, "floors_after": after,
            "load_before": round(load0, 2), "load_after_fit": round(load1, 2), "passes": passes}


def markdown(result: dict) -> str:
    lines = ["# Passes 2 and 3 through `ooc-spectral fit` against the machine's floors\n",
             f"Command: `{result['command']}`; {result['cores']} cores, NumPy "
             f"{result['numpy']}. Floors measured in the same run, before and after each fit "
             "(gemm float64 on all BLAS threads, `exp` on one thread per core, the zarr read of "
             "the whole input on one thread per core); a pass's floor is its counted flops at "
             "the gemm rate, its n m exponentials at the exp rate and the read. Where Intel "
             "MKL is installed (the `mkl` extra) the gemm rate is the faster of NumPy's and "
             "MKL's (one sequential product per core).\n",
             "| n | d | m | engine | tasks x rows | pass | seconds | flops s | exp s | read s | "
             "floor s | of floor | without the read | gemm GFLOP/s | exp /s | load |",
             "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in result["sizes"]:
        fb, fa = r["floors_before"], r["floors_after"]
        for name, p in r["passes"].items():
            tasks = r.get("pass2_tasks", r["tasks"]) if name == "pass2" else r["tasks"]
            rows = (f"{r['task_rows']:,}" if tasks == r["tasks"] else
                    f"{r['task_rows']:,} (the last ones re-split: `pass2_tasks`)")
            lines.append(
                f"| {r['n']:,} | {r['d']} | {r['m']} | {r['engine']} | {tasks} x "
                f"{rows} | {name} | {p['seconds']:.1f} | {p['flops_seconds']:.1f} | "
                f"{p['exp_seconds']:.1f} | {p['read_seconds']:.1f} | {p['floor_seconds']:.1f} | "
                f"**{100 * p['of_floor']:.1f}%** | {100 * p['of_floor_without_read']:.0f}% | "
                f"{fb['gemm_gflops']} / {fa['gemm_gflops']} | {fb['exp_per_s']:.3g} / "
                f"{fa['exp_per_s']:.3g} | {r['load_before']} / {r['load_after_fit']} |")
    lines.append("")
    for r in result["sizes"]:
        stages = ", ".join(f"{k} {v:.1f} s" for k, v in r["stages"].items())
        lines.append(f"- n = {r['n']:,}: `{r['command']}`; wall {r['wall_seconds']:.1f} s "
                     f"(process {r['process_seconds']:.1f} s); stages: {stages}; sub-blocks of "
                     f"{r['block_rows']:,} rows (pass 2: {r['pass2_block_rows']:,}); pass 2 on "
                     f"{r.get('blas') or 'openblas (scipy)'}, loops {r.get('compiled_loops') or 'NumPy'}; "
                     f"gemm GFLOP/s NumPy {r['floors_before']['numpy_gemm_gflops']} / "
                     f"{r['floors_after']['numpy_gemm_gflops']}, MKL "
                     f"{r['floors_before']['mkl_gemm_gflops']} / {r['floors_after']['mkl_gemm_gflops']}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["2e6:16:800", "1e8:32:300"],
                    help="n:d:m triples")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true", help="reuse inputs in --workdir")
    ap.add_argument("--engine", choices=("auto", "threads", "cluster"), default="auto",
                    help="the fit's --engine (default: the embedded default, as users run it)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ooc-floors-"))
    work.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    result = {"command": " ".join(["python", "workflows/bench/cli_floors.py", *sys.argv[1:]]),
              "cores": cores, "numpy": np.__version__, "sizes": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for spec in args.sizes:
            n, d, m = spec.split(":")
            result["sizes"].append(run_size(int(float(n)), int(d), int(m), work, args.keep,
                                            cores, args.engine))
            (out / "cli_floors.json").write_text(json.dumps(result, indent=1) + "\n")
            (out / "cli_floors.md").write_text(markdown(result))
            print(markdown(result), flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
