"""Small jobs as whole processes, and a fit from zarr in one process (issues 38 and 54).

People meet the library on small data, where the cost of a job is its start-up and a fit of
a few thousand rows. Each figure of the first part is one *whole process*, as a user runs
it: Python starts, makes or loads the rows (the same rows in every process), imports the
method, fits, and exits. The cases, each against its scikit-learn counterpart:

- ``clustering_digits``: ``GreedySpectralClustering(10)`` at its defaults on digits (1,797
  x 64) against ``SpectralClustering(10, affinity="nearest_neighbors")``;
- ``roll_gamma0.1``: ``GreedySpectralEmbedding(2, gamma=0.1)`` on a 2,000-row swiss roll
  against ``KernelPCA(2, gamma=0.1)`` and ``Nystroem(gamma=0.1, n_components=m) + PCA(2)``
  (m: this library's dictionary size, read from a first run);
- ``embedding_digits``: the default ``GreedySpectralEmbedding()`` on digits against
  ``KernelPCA(2)`` with the gamma this library chose (its median heuristic);
- ``roll_2000`` and ``roll_20000``: ``GreedySpectralEmbedding(2, gamma=0.004, tol=1e-3)``
  on 2,000 and 20,000 swiss-roll rows against ``Nystroem(n_components=m) + PCA(2)`` and
  ``KernelPCA(2, eigen_solver="arpack")``;
- ``core_imports``: no method, only the rows and the imports any scikit-learn estimator on
  this library's core dependencies cannot do without (numpy, ``scipy.linalg``, dask,
  ``sklearn.base``): the floor of such a process.

Every random choice is seeded (``random_state=0``). The processes of a case run in turn
(ours, a peer, the other peer, ours, ...) ``--runs`` times after one warm-up round, so a
drift of the machine's speed falls on all of them; each ratio is taken run by run (ours
over the peer of the same round) and its median quoted, with the load average beside it.
Each process reports its own seconds: making the rows, the import, the fit, the fit's
stages (``timings_``) and its CPU seconds; the whole process's CPU seconds (every thread,
start to exit) are taken beside its wall time, and their ratio too: on a shared machine the
wall figures carry the other jobs' load. Where the fit is this library's, a sampler
(every 5 ms, the fit's threads) splits it into *certification* (the rounding bounds of
``core/rounding.py``, ``core/scan/certify.py`` and ``pipeline/certification.py``: issue
53's part), imports made during the fit, and the rest.

The second part (``zarr_fit``, issue 54 item 3) is a fit *in one process*: a 20,000-row
swiss roll (``make-data``'s, float32 in zarr) is fitted by ``GreedySpectralEmbedding(2,
gamma=0.004, tol=1e-3)`` from its path, the first fit of a fresh process (what it imports
on first use is part of it), then by ``KernelPCA(2, gamma=0.004, eigen_solver="arpack")``
on the same rows in memory; the ratio is KernelPCA's fit over ours. The figure with
``embedding_`` read into memory (a lazy dask array for zarr input: its first compute
makes dask look for a distributed client) is reported beside it.

``ooc-spectral --help`` and ``python -m ooc_spectral --help`` are timed the same way.

    python workflows/bench/startup.py                     # everything, 5 runs each
    python workflows/bench/startup.py --cases roll_2000,zarr_fit --runs 3

The package is byte-compiled first (``compileall``), as pip does when it installs a wheel
(a checkout run with ``PYTHONDONTWRITEBYTECODE`` set would compile its modules in every
process). Writes ``startup.json`` and ``startup.md`` to ``--out`` (default: results/ beside
this file), with the machine (CPU model, cores, BLAS libraries) named.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Sampling of the fit's threads: the share of its wall time in certification, in imports
#: and elsewhere (fractions of the busy threads, every 5 ms).
SAMPLER = r'''
import sys, threading, time, json
CERT = ("core/rounding.py", "core/scan/certify.py", "pipeline/certification.py")
IDLE = ("threading.py", "queue.py", "concurrent/futures", "selectors.py")
class Sampler:
    def __init__(self, every=0.005):
        self.every, self.counts, self.samples = every, {"certification": 0.0, "import": 0.0,
                                                        "other": 0.0}, 0
    def _category(self, frame):
        files = []
        while frame is not None:
            files.append(frame.f_code.co_filename)
            frame = frame.f_back
        if not files or any(s in files[0] for s in IDLE):
            return None  # waiting
        if any("importlib" in f for f in files):
            return "import"
        if any(f.endswith(c) for f in files for c in CERT):
            return "certification"
        return "other"
    def _run(self):
        me = threading.get_ident()
        while not self._stop.is_set():
            cats = [c for t, f in sys._current_frames().items() if t != me
                    for c in [self._category(f)] if c is not None]
            if cats:
                self.samples += 1
                for c in cats:
                    self.counts[c] += 1.0 / len(cats)
            time.sleep(self.every)
    def __enter__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self
    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
    def shares(self):
        n = max(self.samples, 1)
        return {k: v / n for k, v in self.counts.items()}
'''

#: The rows of each data set, made with NumPy (the swiss roll: scikit-learn's formula, so
#: that no method is charged another's import) or loaded (digits).
DATA = {
    "roll": """
import numpy as np
rng = np.random.default_rng(0)
t = 1.5 * np.pi * (1 + 2 * rng.random(N))
X = np.c_[t * np.cos(t), 21 * rng.random(N), t * np.sin(t)]
""",
    "digits": """
from sklearn.datasets import load_digits
X = load_digits().data
""",
}

#: (import statement, fit statement) of each method; ``M`` and ``GAMMA`` come from the
#: first run of this library's method of the case.
METHODS = {
    "ooc_embedding": ("from ooc_spectral import GreedySpectralEmbedding",
                      "est = GreedySpectralEmbedding({params}random_state=0)\n"
                      "E = est.fit_transform(X)"),
    "ooc_clustering": ("from ooc_spectral import GreedySpectralClustering",
                       "est = GreedySpectralClustering({params}random_state=0)\n"
                       "labels = est.fit_predict(X)"),
    "kernelpca": ("from sklearn.decomposition import KernelPCA",
                  "E = KernelPCA(2, kernel='rbf', gamma=GAMMA, {params}random_state=0)"
                  ".fit_transform(X)"),
    "nystroem_pca": ("from sklearn.decomposition import PCA\n"
                     "from sklearn.kernel_approximation import Nystroem",
                     "F = Nystroem(kernel='rbf', gamma=GAMMA, n_components=M, random_state=0)"
                     ".fit_transform(X)\nE = PCA(2).fit_transform(F)"),
    "spectral_clustering": ("from sklearn.cluster import SpectralClustering",
                            "labels = SpectralClustering(10, affinity='nearest_neighbors', "
                            "random_state=0).fit_predict(X)"),
    "core_imports": ("import dask\nimport scipy.linalg\nimport sklearn.base", "pass"),
}

#: case -> (data, rows, ours (method, parameters), peers [(method, parameters)])
CASES = {
    "clustering_digits": ("digits", None, ("ooc_clustering", "10, "),
                          [("spectral_clustering", "")]),
    "roll_gamma0.1": ("roll", 2000, ("ooc_embedding", "2, gamma=0.1, "),
                      [("kernelpca", ""), ("nystroem_pca", "")]),
    "embedding_digits": ("digits", None, ("ooc_embedding", ""), [("kernelpca", "")]),
    "roll_2000": ("roll", 2000, ("ooc_embedding", "2, gamma=0.004, tol=1e-3, "),
                  [("nystroem_pca", ""), ("kernelpca", "eigen_solver='arpack', "),
                   ("core_imports", "")]),
    "roll_20000": ("roll", 20000, ("ooc_embedding", "2, gamma=0.004, tol=1e-3, "),
                   [("nystroem_pca", ""), ("kernelpca", "eigen_solver='arpack', "),
                    ("core_imports", "")]),
}


def process_code(data: str, n: int | None, method: str, params: str, m: int, gamma: float) -> str:
    """The source of one whole process: rows, import, fit, one JSON line of its seconds."""
    imports, fit = METHODS[method]
    ours = method.startswith("ooc_")
    body = fit.format(params=params).replace("\n", "\n    " if ours else "\n")
    return "\n".join([
        "import time, json, sys, os", "t0 = time.perf_counter()", f"N, M, GAMMA = {n}, {m}, {gamma!r}",
        DATA[data], "t1 = time.perf_counter()", imports, "t2 = time.perf_counter()",
        "c2 = time.process_time()",
        SAMPLER + "\nwith Sampler() as sampler:\n    " + body if ours else body,
        "t3 = time.perf_counter()",
        "out = {'data': t1 - t0, 'import': t2 - t1, 'fit': t3 - t2, 'fit_cpu': time.process_time() - c2}",
        "if 'est' in dir():",
        "    e = getattr(est, 'embedding_estimator_', est)",
        "    out['stages'] = getattr(e, 'timings_', None) or getattr(est, 'timings_', {})",
        "    d = getattr(e, 'dictionary_', None)",
        "    out['m'] = None if d is None else int(d.shape[0])",
        "    out['gamma'] = float(getattr(e, 'gamma_', None) or getattr(est, 'gamma_', 0) or 0)",
        "    out['shares'] = sampler.shares()",
        "    out['loaded'] = sorted(k for k in ('distributed', 'zarr', 'fsspec', 'numba', "
        "'dask.array', 'xarray') if k in sys.modules)",
        "print(json.dumps(out))",
    ])


def run_process(argv: list[str], cwd: str | None = None) -> tuple[float, dict]:
    """Wall seconds of one whole process, and the JSON line it printed last (if any)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    lines = [s for s in proc.stdout.strip().splitlines() if s.startswith("{")]
    out = json.loads(lines[-1]) if lines else {}
    # the whole process's CPU seconds (start to exit, every thread): on a shared machine
    # the wall figures carry the other jobs' load, the CPU ones much less of it
    out["process_cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, out


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}


def bench_case(name: str, runs: int) -> dict:
    data, n, (ours, params), peers = CASES[name]
    run = lambda method, p, m=0, g=0.0: run_process(  # noqa: E731
        [sys.executable, "-c", process_code(data, n, method, p, m, g)], cwd=tempfile.gettempdir())
    _, first = run(ours, params)  # the warm-up round, and m and gamma for the peers
    m = first.get("m") or 1
    gamma = first.get("gamma") or (float(params.split("gamma=")[1].split(",")[0])
                                   if "gamma=" in params else 0.0)
    names = [ours] + [p for p, _ in peers]
    extra = dict(peers)
    for p in names[1:]:
        run(p, extra[p], m, gamma)
    walls, inner, loads = {k: [] for k in names}, {k: [] for k in names}, []
    for _ in range(runs):
        loads.append(os.getloadavg()[0])
        for k in names:
            wall, out = run(k, params if k == ours else extra[k], m, gamma)
            walls[k].append(wall)
            inner[k].append(out)
    med = lambda k, f: statistics.median(o[f] for o in inner[k])  # noqa: E731
    result = {"case": name, "rows": n or "digits (1,797)", "m": m, "gamma": gamma,
              "ours": ours, "loaded_by_ours": first.get("loaded"),
              "load": summary(loads),
              "wall": {k: summary(v) for k, v in walls.items()},
              "import": {k: med(k, "import") for k in names},
              "fit": {k: med(k, "fit") for k in names},
              "fit_cpu": {k: med(k, "fit_cpu") for k in names},
              "ratio": {f"ours / {k}": summary([a / b for a, b in zip(walls[ours], walls[k])])
                        for k in names[1:]},
              "process_cpu": {k: med(k, "process_cpu") for k in names},
              "cpu_ratio": {f"ours / {k}": summary([a["process_cpu"] / b["process_cpu"]
                                                    for a, b in zip(inner[ours], inner[k])])
                            for k in names[1:]}}
    stages = [o.get("stages") or {} for o in inner[ours]]
    result["stages"] = {s: statistics.median(st.get(s, 0.0) for st in stages)
                        for s in sorted({s for st in stages for s in st})}
    shares = [o.get("shares") or {} for o in inner[ours]]
    result["fit_shares"] = {c: statistics.median(sh.get(c, 0.0) for sh in shares)
                            for c in ("certification", "import", "other")}
    return result


ZARR_FIT = """
import time, json, sys
import numpy as np
import zarr
path = sys.argv[1]
X = np.asarray(zarr.open_group(path, mode="r")["data"][...], dtype=np.float64)
t0 = time.perf_counter()
from ooc_spectral import GreedySpectralEmbedding
from sklearn.decomposition import KernelPCA
t1 = time.perf_counter()
""" + SAMPLER + """
with Sampler() as sampler:
    c1 = time.process_time()
    est = GreedySpectralEmbedding(2, gamma=0.004, tol=1e-3, random_state=0).fit(path)
    t2 = time.perf_counter()
    c2 = time.process_time()
E = np.asarray(est.embedding_)
t3 = time.perf_counter()
E2 = KernelPCA(2, kernel="rbf", gamma=0.004, eigen_solver="arpack", random_state=0).fit_transform(X)
t4 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "fit": t2 - t1, "fit_cpu": c2 - c1, "embedding_read": t3 - t2,
                  "kernelpca": t4 - t3, "m": int(est.dictionary_.shape[0]),
                  "stages": est.timings_, "shares": sampler.shares()}))
"""


def bench_zarr_fit(runs: int, n: int = 20_000) -> dict:
    from ooc_spectral.datasets import make_data

    work = Path(tempfile.mkdtemp(prefix="ooc-startup-"))
    try:
        path = str(work / f"roll-{n}.zarr")
        make_data("swiss-roll", n, path, seed=0)
        argv = [sys.executable, "-c", ZARR_FIT, path]
        run_process(argv, cwd=str(work))  # warm-up
        outs, loads = [], []
        for _ in range(runs):
            loads.append(os.getloadavg()[0])
            outs.append(run_process(argv, cwd=str(work))[1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = lambda f: statistics.median(o[f] for o in outs)  # noqa: E731
    stages = {s: statistics.median(o["stages"].get(s, 0.0) for o in outs)
              for s in sorted({s for o in outs for s in o["stages"]})}
    return {"n": n, "m": outs[0]["m"], "load": summary(loads),
            "fit": summary([o["fit"] for o in outs]),
            "fit_cpu": med("fit_cpu"), "embedding_read": med("embedding_read"),
            "kernelpca": summary([o["kernelpca"] for o in outs]),
            "ratio": summary([o["kernelpca"] / o["fit"] for o in outs]),
            "ratio_with_embedding": summary([o["kernelpca"] / (o["fit"] + o["embedding_read"])
                                             for o in outs]),
            "stages": stages,
            "fit_shares": {c: statistics.median(o["shares"].get(c, 0.0) for o in outs)
                           for c in ("certification", "import", "other")}}


def bench_help(runs: int) -> dict:
    out = {}
    exe = shutil.which("ooc-spectral")
    commands = {"python -m ooc_spectral --help": [sys.executable, "-m", "ooc_spectral", "--help"],
                "python -c pass (the interpreter alone)": [sys.executable, "-c", "pass"]}
    if exe:
        # where it is a pyenv shim, bash and pyenv's own start-up come first
        shim = Path(exe).read_text(errors="replace").startswith("#!/usr/bin/env bash")
        commands = {"ooc-spectral --help" + (" (a pyenv shim)" if shim else ""):
                    [exe, "--help"], **commands}
    for name, argv in commands.items():
        run_process(argv, cwd=tempfile.gettempdir())
        out[name] = summary([run_process(argv, cwd=tempfile.gettempdir())[0]
                             for _ in range(runs)])
    return out


def machine() -> dict:
    """The CPU model, cores and the BLAS libraries NumPy and this package's passes use."""
    from threadpoolctl import threadpool_info

    import numpy as np

    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from ooc_spectral._accel.blas import blas_backend
    from ooc_spectral._accel.support import accel_for

    with accel_for(None):
        passes = blas_backend()
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__,
            "numpy_blas": sorted({f"{i['internal_api']} {i['version']}" for i in threadpool_info()
                                  if i["user_api"] == "blas"}),
            "passes_blas": passes}


def markdown(result: dict) -> str:
    mc = result["machine"]
    lines = ["# Small jobs as whole processes, and a fit from zarr in one process", "",
             f"Command: `{result['command']}`. Machine: {mc['cpu']}, {mc['cores']} cores, "
             f"Python {mc['python']}, NumPy {mc['numpy']} on {', '.join(mc['numpy_blas'])}; "
             f"the passes' BLAS: {mc['passes_blas']}. Load average {result['load_before']} "
             f"before, {result['load_after']} after. Each figure of a case is a whole process "
             "(start, make or load the rows, import, fit, exit), median of "
             f"{result['runs']} runs taken in turn; the ratio is ours over the peer's, taken run "
             "by run (median, min-max). The package was byte-compiled first. "
             "*Process CPU s* is the whole process's CPU time (every "
             "thread, start to exit), and its ratio the same taken on it: on a shared machine the "
             "wall figures carry the other jobs' load.", "",
             "| case | m | method | process s | import s | fit s | fit CPU s | ours / this | "
             "process CPU s | ours / this (CPU) |",
             "|---|---:|---|---|---:|---:|---:|---|---:|---|"]
    for r in result["cases"]:
        for k, w in r["wall"].items():
            ratio = r["ratio"].get(f"ours / {k}")
            rtxt = "" if ratio is None else (f"**{ratio['median']:.2f}** "
                                             f"({ratio['min']:.2f}-{ratio['max']:.2f})")
            cpu = r.get("cpu_ratio", {}).get(f"ours / {k}")
            ctxt = "" if cpu is None else (f"**{cpu['median']:.2f}** "
                                           f"({cpu['min']:.2f}-{cpu['max']:.2f})")
            pcpu = r.get("process_cpu", {}).get(k)
            lines.append(f"| {r['case']} | {r['m']} | {k} | {w['median']:.2f} "
                         f"({w['min']:.2f}-{w['max']:.2f}) | {r['import'][k]:.2f} | "
                         f"{r['fit'][k]:.2f} | {r['fit_cpu'][k]:.2f} | {rtxt} | "
                         f"{'' if pcpu is None else f'{pcpu:.2f}'} | {ctxt} |")
    lines += ["", "Our fit, split: its stages (`timings_`, seconds, median) and, by sampling its "
              "threads, the shares of its time in certification (`core/rounding.py`, "
              "`core/scan/certify.py`, `pipeline/certification.py`), in imports made during "
              "the fit, and the rest.", "",
              "| case | load | import s | fit s | stages | certification | imports | rest |",
              "|---|---|---:|---:|---|---:|---:|---:|"]
    for r in result["cases"] + ([dict(result["zarr_fit"], case="zarr_fit",
                                      import_=None)] if result.get("zarr_fit") else []):
        ours = r.get("ours")
        imp = f"{r['import'][ours]:.2f}" if ours else ""
        fit = r["fit"][ours] if ours else r["fit"]["median"]
        st = ", ".join(f"{k} {v:.2f}" for k, v in r["stages"].items())
        sh = r["fit_shares"]
        lines.append(f"| {r['case']} | {r['load']['median']:.1f} | {imp} | {fit:.2f} | {st} | "
                     f"{100 * sh['certification']:.0f}% | {100 * sh['import']:.0f}% | "
                     f"{100 * sh['other']:.0f}% |")
    z = result.get("zarr_fit")
    if z:
        lines += ["", f"**Fit from zarr in one process** (n = {z['n']:,}, m = {z['m']}, the first "
                  "fit of a fresh process): ours "
                  f"{z['fit']['median']:.2f} s ({z['fit']['min']:.2f}-{z['fit']['max']:.2f}; "
                  f"CPU {z['fit_cpu']:.2f} s), `KernelPCA(arpack)` {z['kernelpca']['median']:.2f} s: "
                  f"**{z['ratio']['median']:.1f}x** ({z['ratio']['min']:.1f}-{z['ratio']['max']:.1f}) "
                  "faster, run by run; with `embedding_` read into memory as well "
                  f"(+{z['embedding_read']:.2f} s): {z['ratio_with_embedding']['median']:.1f}x."]
    lines += ["", "| command | seconds (median, min-max) |", "|---|---|"]
    for name, w in result["help"].items():
        lines.append(f"| `{name}` | {w['median']:.3f} ({w['min']:.3f}-{w['max']:.3f}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join([*CASES, "zarr_fit"]),
                    help="comma-separated: " + ", ".join([*CASES, "zarr_fit"]))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    import compileall

    import ooc_spectral

    compiled = compileall.compile_dir(str(Path(ooc_spectral.__file__).parent), quiet=1)
    load_before = os.getloadavg()[0]
    names = args.cases.split(",")
    unknown = set(names) - set(CASES) - {"zarr_fit"}
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}")
    result = {"command": "python " + " ".join(sys.argv), "machine": machine(),
              "runs": args.runs, "byte_compiled": bool(compiled),
              "cases": [], "zarr_fit": None}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name == "zarr_fit":
            result["zarr_fit"] = bench_zarr_fit(args.runs)
        else:
            result["cases"].append(bench_case(name, args.runs))
        print(f"{name} done", flush=True)
    result["help"] = bench_help(max(args.runs, 5))
    result["load_before"] = round(load_before, 2)
    result["load_after"] = round(os.getloadavg()[0], 2)
    (out / "startup.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "startup.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
