"""A small job as a whole process: this library against scikit-learn (issue 38).

People meet the library on small data, where the cost of a job is mostly its start-up.
Each figure here is one *whole process*, as a user runs it: Python starts, makes a
swiss roll with NumPy (the same rows in every process: seed 0), imports the method and
fits 2 components with the rbf kernel, gamma 0.004, and exits. Three methods:

- ``ooc``: ``GreedySpectralEmbedding(n_components=2, gamma=0.004, tol=1e-3)``; its
  dictionary size m is read from the first run;
- ``nystroem_pca``: scikit-learn's ``Nystroem(n_components=m)`` then ``PCA(2)``, with
  the same m (the cheapest scikit-learn pipeline of the same kind);
- ``kernelpca``: ``KernelPCA(2, eigen_solver="arpack")`` on the full Gram matrix
  (n = 20,000: 3.2 GB; ``--no-kernelpca`` leaves it out);
- ``core_imports``: no method, only the rows and the imports a fit of this library
  cannot do without: ``scipy.linalg`` and ``dask`` (its core dependencies) and
  ``sklearn.base`` (the estimators subclass scikit-learn's bases, as ``check_estimator``
  expects): the floor of any scikit-learn estimator built on those dependencies.

The processes run in turn (ooc, nystroem_pca, kernelpca, ooc, ...) ``--runs`` times
after one warm-up round, so a drift of the machine's speed falls on all of them; each
ratio is taken run by run (ooc over the other of the same round) and its median quoted.
Each process also reports its own import and fit seconds. ``ooc-spectral --help`` (the
console script) and ``python -m ooc_spectral --help`` are timed the same way.

    python workflows/bench/startup.py                       # n = 2,000 and 20,000
    python workflows/bench/startup.py --sizes 2000 --runs 3

The package is byte-compiled first (``compileall``), as pip does when it installs a wheel:
scikit-learn's modules come precompiled from theirs, while a checkout run with
``PYTHONDONTWRITEBYTECODE`` set (as on the project's machines) would compile this
package's ~40 modules in every process (about 0.15 s of its import).

Writes ``startup.json`` and ``startup.md`` to ``--out`` (default: results/ beside this
file). The machine's load average is recorded before and after: on a shared machine
quote the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

GAMMA, TOL, P = 0.004, 1e-3, 2

#: The rows every process makes: sklearn's make_swiss_roll formula, with NumPy only (so
#: that no method is charged another's import).
DATA = f"""
import time
t0 = time.perf_counter()
import numpy as np
n = int(sys.argv[1])
rng = np.random.default_rng(0)
t = 1.5 * np.pi * (1 + 2 * rng.random(n))
X = np.c_[t * np.cos(t), 21 * rng.random(n), t * np.sin(t)]
"""

METHODS = {
    "ooc": DATA + f"""
t1 = time.perf_counter()
from ooc_spectral import GreedySpectralEmbedding
t2 = time.perf_counter()
est = GreedySpectralEmbedding(n_components={P}, gamma={GAMMA}, tol={TOL}, random_state=0)
E = est.fit_transform(X)
t3 = time.perf_counter()
print(json.dumps({{"import": t2 - t1, "fit": t3 - t2, "m": int(est.dictionary_.shape[0]),
                  "loaded": sorted(m for m in ("distributed", "zarr", "fsspec", "numba",
                                                "matplotlib") if m in sys.modules)}}))
""",
    "nystroem_pca": DATA + f"""
m = int(sys.argv[2])
t1 = time.perf_counter()
from sklearn.decomposition import PCA
from sklearn.kernel_approximation import Nystroem
t2 = time.perf_counter()
F = Nystroem(kernel="rbf", gamma={GAMMA}, n_components=m, random_state=0).fit_transform(X)
E = PCA({P}).fit_transform(F)
t3 = time.perf_counter()
print(json.dumps({{"import": t2 - t1, "fit": t3 - t2, "m": m}}))
""",
    "kernelpca": DATA + f"""
t1 = time.perf_counter()
from sklearn.decomposition import KernelPCA
t2 = time.perf_counter()
E = KernelPCA({P}, kernel="rbf", gamma={GAMMA}, eigen_solver="arpack",
              random_state=0).fit_transform(X)
t3 = time.perf_counter()
print(json.dumps({{"import": t2 - t1, "fit": t3 - t2}}))
""",
    "core_imports": DATA + """
t1 = time.perf_counter()
import dask
import scipy.linalg
import sklearn.base
t2 = time.perf_counter()
print(json.dumps({"import": t2 - t1, "fit": 0.0}))
""",
}


def run_process(argv: list[str]) -> tuple[float, dict]:
    """Wall seconds of one whole process, and the JSON line it printed last (if any)."""
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    lines = [s for s in proc.stdout.strip().splitlines() if s.startswith("{")]
    return wall, (json.loads(lines[-1]) if lines else {})


def method_argv(name: str, n: int, m: int | None) -> list[str]:
    code = "import json, sys\n" + METHODS[name]
    return [sys.executable, "-c", code, str(n)] + ([str(m)] if m is not None else [])


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}


def bench_size(n: int, runs: int, kernelpca: bool) -> dict:
    _, first = run_process(method_argv("ooc", n, None))  # the warm-up round, and m
    m = first["m"]
    names = ["ooc", "nystroem_pca"] + (["kernelpca"] if kernelpca else []) + ["core_imports"]
    for name in names[1:]:
        run_process(method_argv(name, n, m))
    walls = {k: [] for k in names}
    inner = {k: [] for k in names}
    for _ in range(runs):
        for name in names:
            wall, out = run_process(method_argv(name, n, m))
            walls[name].append(wall)
            inner[name].append(out)
    result = {"n": n, "m": m, "loaded_by_ooc": first.get("loaded"),
              "wall": {k: summary(v) for k, v in walls.items()},
              "import": {k: statistics.median(o["import"] for o in v) for k, v in inner.items()},
              "fit": {k: statistics.median(o["fit"] for o in v) for k, v in inner.items()}}
    result["ratio"] = {f"ooc / {k}": summary([a / b for a, b in zip(walls["ooc"], walls[k])])
                       for k in names[1:]}
    return result


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
        run_process(argv)
        out[name] = summary([run_process(argv)[0] for _ in range(runs)])
    return out


def markdown(result: dict) -> str:
    lines = ["# A small job as a whole process (issue 38)", "",
             f"Command: `{result['command']}`; {result['cores']} cores, Python "
             f"{result['python']}; load average {result['load_before']} before, "
             f"{result['load_after']} after. Each figure is a whole process (start, make "
             "the rows with NumPy, import, fit 2 components, rbf gamma 0.004, exit), "
             f"median of {result['runs']} runs taken in turn; the ratio is taken run by run. "
             + ("The package was byte-compiled first, as pip does when it installs a wheel."
                if result.get("byte_compiled") else ""),
             "",
             "| n | m | method | process s (median, min-max) | import s | fit s | ooc / this |",
             "|---:|---:|---|---|---:|---:|---|"]
    for r in result["sizes"]:
        for k, w in r["wall"].items():
            ratio = r["ratio"].get(f"ooc / {k}")
            rtxt = "" if ratio is None else (f"**{ratio['median']:.2f}** "
                                             f"({ratio['min']:.2f}-{ratio['max']:.2f})")
            lines.append(f"| {r['n']:,} | {r['m']} | {k} | {w['median']:.2f} "
                         f"({w['min']:.2f}-{w['max']:.2f}) | {r['import'][k]:.2f} | "
                         f"{r['fit'][k]:.2f} | {rtxt} |")
    for r in result["sizes"]:
        if "kernelpca" in r["wall"]:
            k, floor = r["wall"]["kernelpca"]["median"], r["wall"]["core_imports"]["median"]
            lines += ["", f"n = {r['n']:,}: 1/20 of KernelPCA's process is {k / 20:.2f} s; "
                      f"making the rows and importing numpy, scipy.linalg, dask and sklearn.base alone "
                      f"takes {floor:.2f} s."]
    lines += ["", "Modules the ooc process loaded among distributed, zarr, fsspec, numba, "
              "matplotlib: " + "; ".join(f"n = {r['n']:,}: {r['loaded_by_ooc'] or 'none'}"
                                         for r in result["sizes"]), "",
              "| command | seconds (median, min-max) |", "|---|---|"]
    for name, w in result["help"].items():
        lines.append(f"| `{name}` | {w['median']:.3f} ({w['min']:.3f}-{w['max']:.3f}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2000,20000")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-kernelpca", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    import compileall

    import ooc_spectral

    compiled = compileall.compile_dir(str(Path(ooc_spectral.__file__).parent), quiet=1)
    load_before = os.getloadavg()[0]
    sizes = [bench_size(int(float(s)), args.runs, not args.no_kernelpca)
             for s in args.sizes.split(",")]
    result = {"command": "python " + " ".join(sys.argv), "cores": os.cpu_count(),
              "python": sys.version.split()[0], "runs": args.runs, "sizes": sizes,
              "help": bench_help(max(args.runs, 5)), "byte_compiled": bool(compiled),
              "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "startup.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "startup.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
