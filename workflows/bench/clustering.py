"""Spectral clustering at its defaults against scikit-learn's, on real and synthetic data.

One run measures ``GreedySpectralClustering(n_clusters=k)`` with nothing else set (the
library's default) against the peers at *their* defaults, ``KMeans(k)``,
``MiniBatchKMeans(k)`` and ``SpectralClustering(k, affinity="nearest_neighbors")``, and
records what ``GreedySpectralClustering(k, affinity="kernel")`` (the previous default)
does, on:

* scikit-learn's digits (raw and standardised), iris, wine and breast cancer
  (standardised: their columns are in unrelated units);
* two nested circles (``factor=0.5, noise=0.05``) and two moons (``noise=0.1``), 10^4
  and 10^5 rows;
* blobs of unequal size and density (4000 / 800 / 200 rows, std 1.5 / 0.5 / 0.3, 2-D);
* 10^5 x 20 blobs, 10 centres, std 1 and 8 (``make_blobs(random_state=0)``);
* 2 * 10^5 x 784 low-rank mixtures (10 clusters, each a 5-dimensional Gaussian in its
  own random subspace around its own centre, plus unit noise in all 784 columns: the
  shape of MNIST-like data, written by :func:`low_rank_mixture`).

Every method is fitted with ``random_state`` = 0, 1, ... (``--seeds``, fewer for the
sets of 10^5 rows and more); the table reports the median ARI against the known labels
(and the least and largest), the median seconds, and for the sets of 10^5 rows and more
the ratio of our median time to ``KMeans``'s, the two fitted alternately in the same
process so that both see the same load. scikit-learn's nearest-neighbour spectral
clustering and the kernel affinity run in a child process with a time budget
(``--budget`` seconds, ``--kernel-budget`` for the kernel affinity, which is fitted at
seed 0 on the sets of at most ``--kernel-max-rows`` rows; a fit over it is recorded as not
fitted in time, and the other seeds of that set are not tried). ``uptime``'s load average is recorded with each set.

The result file also holds, per data set, a 2-D view of up to 600 of its rows (the
columns themselves for 2-D data, else the two leading principal axes of a seeded
sample) and every method's labels on them at seed 0: the docs draw the table and the
grid of data sets x methods from it (``docs/_ext/clustering_results.py``).

``--memory-sizes 1e6 1e7`` adds the out-of-core run: ``make-data blobs`` (5 clusters, 8
columns, float32, zarr) at each size, then ``ooc-spectral fit IN --out OUT --n-clusters
5 --engine cluster`` as a subprocess (its defaults otherwise: the representatives
graph; the same engine at every size, ``--memory-engine``), the resident set size of
its whole process tree sampled every 50 ms, the ARI of the labels written, and the
ratio of the largest size's peak to the smallest's.

    python workflows/bench/clustering.py                       # every set
    python workflows/bench/clustering.py --sets digits iris    # some
    python workflows/bench/clustering.py --sets --memory-sizes 1e6 1e7
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from memory_flat import run_sampled  # noqa: E402

#: The data sets: name -> (loader, k). Loaders are deterministic functions of the name.
SETS = ["digits", "digits-std", "iris", "wine", "breast-cancer", "circles-1e4", "moons-1e4",
        "unequal-density", "circles-1e5", "moons-1e5", "blobs-20d-std1", "blobs-20d-std8",
        "low-rank-784"]
#: The sets of at least this many rows: fewer seeds, and the time ratio to KMeans.
LARGE = 100_000
PEERS = ["KMeans", "MiniBatchKMeans", "SpectralClustering(nn)"]
FIGURE_ROWS = 600


def _std(X):
    from sklearn.preprocessing import StandardScaler

    return StandardScaler().fit_transform(X)


def low_rank_mixture(n: int, seed: int = 0, d: int = 784, k: int = 10, rank: int = 5):
    """``n`` rows of ``k`` clusters in ``d`` columns, float32: cluster ``c`` is
    ``mu_c + z A_c + e``, ``mu_c ~ N(0, I_d)``, ``A_c`` a ``rank x d`` Gaussian matrix
    scaled to rows of norm about 15, ``z ~ N(0, I_rank)``, ``e ~ N(0, I_d)``."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(0.0, 1.0, (k, d))
    A = rng.normal(0.0, 1.0, (k, rank, d)) / np.sqrt(d) * 15.0
    y = rng.integers(0, k, n)
    X = np.empty((n, d), dtype=np.float32)
    step = 20_000
    for a in range(0, n, step):
        yy = y[a:a + step]
        z = rng.normal(size=(len(yy), rank))
        X[a:a + step] = (mu[yy] + np.einsum("nr,nrd->nd", z, A[yy])
                         + rng.normal(0.0, 1.0, (len(yy), d)))
    return X, y


def load(name: str):
    """``(X, y, k, description)`` of a data set of :data:`SETS`."""
    from sklearn import datasets as skd

    if name in ("digits", "digits-std"):
        X, y = skd.load_digits(return_X_y=True)
        return (_std(X) if name == "digits-std" else X), y, 10, (
            "scikit-learn digits, " + ("standardised" if name == "digits-std" else "raw pixels"))
    if name in ("iris", "wine", "breast-cancer"):
        loader = {"iris": skd.load_iris, "wine": skd.load_wine,
                  "breast-cancer": skd.load_breast_cancer}[name]
        X, y = loader(return_X_y=True)
        return _std(X), y, len(np.unique(y)), f"scikit-learn {name}, standardised"
    if name.startswith(("circles", "moons")):
        n = int(float(name.split("-")[1]))
        if name.startswith("circles"):
            X, y = skd.make_circles(n, factor=0.5, noise=0.05, random_state=0)
            return X, y, 2, "make_circles(factor=0.5, noise=0.05)"
        X, y = skd.make_moons(n, noise=0.1, random_state=0)
        return X, y, 2, "make_moons(noise=0.1)"
    if name == "unequal-density":
        X, y = skd.make_blobs([4000, 800, 200], cluster_std=[1.5, 0.5, 0.3], random_state=1)
        return X, y, 3, "make_blobs([4000, 800, 200], cluster_std=[1.5, 0.5, 0.3], random_state=1)"
    if name.startswith("blobs-20d"):
        std = float(name.split("std")[1])
        X, y = skd.make_blobs(100_000, n_features=20, centers=10, cluster_std=std,
                              random_state=0)
        return X, y, 10, f"make_blobs(10^5, n_features=20, centers=10, cluster_std={std:g})"
    if name == "low-rank-784":
        X, y = low_rank_mixture(200_000)
        return X, y, 10, "low_rank_mixture(2 * 10^5): 10 clusters of rank 5 in 784 columns"
    raise KeyError(f"unknown data set {name!r}; one of {', '.join(SETS)}")


def make(method: str, k: int, seed: int):
    from sklearn.cluster import KMeans, MiniBatchKMeans, SpectralClustering

    from ooc_spectral.clustering import GreedySpectralClustering

    if method == "ours":
        return GreedySpectralClustering(k, random_state=seed)
    if method == "kernel":
        return GreedySpectralClustering(k, affinity="kernel", random_state=seed)
    if method == "KMeans":
        return KMeans(k, random_state=seed)
    if method == "MiniBatchKMeans":
        return MiniBatchKMeans(k, random_state=seed)
    if method == "SpectralClustering(nn)":
        return SpectralClustering(k, affinity="nearest_neighbors", random_state=seed)
    raise KeyError(method)


def fit_labels(method: str, X, k: int, seed: int):
    """``(labels, seconds, warnings)`` of one fit."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = time.perf_counter()
        est = make(method, k, seed).fit(X)
        seconds = time.perf_counter() - t
    said = sorted({type(w.message).__name__ for w in caught
                   if "Degenerate" in type(w.message).__name__})
    return np.asarray(est.labels_), seconds, said


def _child(conn, name, method, seed):
    X, _, k, _ = load(name)
    try:
        conn.send(fit_labels(method, X, k, seed))
    except Exception as exc:  # noqa: BLE001 -- reported in the table
        conn.send(exc)


def fit_in_child(name: str, method: str, seed: int, budget: float):
    """:func:`fit_labels` in a spawned process, stopped after ``budget`` seconds (then
    None)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, name, method, seed))
    proc.start()
    child.close()
    if parent.poll(budget):
        out = parent.recv()
        proc.join()
        if isinstance(out, Exception):
            raise out
        return out
    proc.kill()
    proc.join()
    return None


def load_average() -> float:
    return float(os.getloadavg()[0])


def view_2d(X, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, coordinates)``: up to :data:`FIGURE_ROWS` seeded rows and a 2-D view of
    them (their columns for 2-D data, else their two leading principal axes)."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(X), size=min(FIGURE_ROWS, len(X)), replace=False))
    S = np.asarray(X[rows], dtype=np.float64)
    if S.shape[1] > 2:
        S = S - S.mean(axis=0)
        _, _, Vt = np.linalg.svd(S, full_matrices=False)
        S = S @ Vt[:2].T
    return rows, S


def measure_set(name: str, seeds: int, budget: float, kernel: bool, log,
                kernel_budget: float | None = None) -> dict:
    """Every method on one data set (see the module docstring)."""
    from sklearn.metrics import adjusted_rand_score as ari

    X, y, k, description = load(name)
    large = len(X) >= LARGE
    n_seeds = max(1, seeds // 2 + 1) if large else seeds
    load_before = load_average()
    rows, view = view_2d(X)
    out = {"data": name, "description": description, "n": int(len(X)),
           "d": int(X.shape[1]), "k": int(k), "seeds": n_seeds, "methods": {},
           "figure": {"x": np.round(view[:, 0], 4).tolist(),
                      "y": np.round(view[:, 1], 4).tolist(),
                      "truth": np.asarray(y)[rows].astype(int).tolist(), "labels": {}}}

    def record(method, runs, note=None):
        if not runs:
            out["methods"][method] = {"fitted": False, "note": note}
            return
        a = [r[0] for r in runs]
        t = [r[1] for r in runs]
        out["methods"][method] = {
            "fitted": True, "ari_median": float(np.median(a)), "ari_min": float(min(a)),
            "ari_max": float(max(a)), "seconds_median": float(np.median(t)),
            "seconds": [round(v, 4) for v in t], "ari": [round(v, 4) for v in a],
            "warnings": sorted({w for r in runs for w in r[2]}), "note": note}

    # ours and KMeans alternately (the time ratio), then the rest
    runs = {"ours": [], "KMeans": []}
    for seed in range(n_seeds):
        for method in ("KMeans", "ours"):
            labels, sec, said = fit_labels(method, X, k, seed)
            runs[method].append((ari(y, labels), sec, said))
            if seed == 0:
                out["figure"]["labels"][method] = labels[rows].astype(int).tolist()
            log(f"  {name} {method} seed {seed}: ARI {runs[method][-1][0]:.3f}, {sec:.2f} s")
    record("ours", runs["ours"])
    record("KMeans", runs["KMeans"])
    mb = []
    for seed in range(n_seeds):
        labels, sec, said = fit_labels("MiniBatchKMeans", X, k, seed)
        mb.append((ari(y, labels), sec, said))
        if seed == 0:
            out["figure"]["labels"]["MiniBatchKMeans"] = labels[rows].astype(int).tolist()
    record("MiniBatchKMeans", mb)
    log(f"  {name} MiniBatchKMeans: ARI {out['methods']['MiniBatchKMeans']['ari_median']:.3f}")
    for method, wanted in (("SpectralClustering(nn)", True), ("kernel", kernel)):
        if not wanted:
            continue
        got, note = [], None
        limit = budget if method != "kernel" else (kernel_budget or budget)
        for seed in range(n_seeds if method != "kernel" else 1):
            res = fit_in_child(name, method, seed, limit)
            if res is None:
                note = f"not fitted in {limit:g} s (seed {seed})"
                break
            labels, sec, said = res
            got.append((ari(y, labels), sec, said))
            if seed == 0:
                out["figure"]["labels"][method] = labels[rows].astype(int).tolist()
        record(method, got, note)
        log(f"  {name} {method}: " + (f"ARI {got and np.median([g[0] for g in got]):.3f}"
                                      if got else note))
    fitted = [m for m in PEERS if out["methods"].get(m, {}).get("fitted")]
    best = max(fitted, key=lambda m: out["methods"][m]["ari_median"])
    ours = out["methods"]["ours"]
    out["best_peer"] = best
    out["best_peer_ari"] = out["methods"][best]["ari_median"]
    out["ours_minus_best_peer"] = ours["ari_median"] - out["best_peer_ari"]
    out["ari_within_0.02"] = bool(out["ours_minus_best_peer"] >= -0.02)
    if large:
        out["time_over_kmeans"] = ours["seconds_median"] / out["methods"]["KMeans"]["seconds_median"]
        out["time_within_3x"] = bool(out["time_over_kmeans"] <= 3.0)
    out["load_average"] = [round(load_before, 2), round(load_average(), 2)]
    return out


# --------------------------------------------------------------------------- memory
def memory_run(n: int, work: Path, k: int = 5, engine: str = "cluster") -> dict:
    """``make-data blobs`` at ``n`` rows, then ``ooc-spectral fit --n-clusters k`` on
    ``--engine engine`` (the same engine at every size: at its default ``auto`` the
    command runs in-process threads up to 128 MiB of input and the embedded
    LocalCluster above, and the cluster's fixed resident cost, about 0.9 GiB of
    scheduler, nannies and workers, would pass for growth in n)."""
    import zarr
    from sklearn.metrics import adjusted_rand_score as ari

    from ooc_spectral.datasets import make_data

    data = work / f"blobs-{n}.zarr"
    make_data("blobs", n, str(data), seed=0, dtype="float32", reuse=True,
              n_clusters=k, n_features=8)
    out = work / f"fit-{n}"
    cmd = [sys.executable, "-m", "ooc_spectral", "fit", str(data), "--out", str(out),
           "--n-clusters", str(k), "--engine", engine, "--overwrite", "--quiet"]
    load_before = load_average()
    peak, wall, code = run_sampled(cmd)  # memory_flat.py's: the process tree every 50 ms
    if code:
        raise RuntimeError(f"{' '.join(cmd)} exited {code}")
    report = json.loads((out / "report.json").read_text())
    truth = zarr.open_group(str(data), mode="r")
    labels = zarr.open_array(str(out / "labels"), mode="r")
    sample = np.arange(0, n, max(1, n // (1 << 20)))  # every row up to 2^20, else a stride
    y = np.asarray(truth["label"].get_orthogonal_selection((sample,)))
    got = np.asarray(labels.get_orthogonal_selection((sample,)))
    return {"n": n, "engine": engine, "command": " ".join(["ooc-spectral"] + cmd[3:]),
            "ari_on_rows": len(sample), "ari": float(ari(y, got)),
            "wall_seconds": round(wall, 2), "peak_tree_rss_bytes": int(peak),
            "peak_tree_rss_mib": round(peak / 2**20, 1),
            "stages": report.get("stages"), "cluster_sizes": report.get("cluster_sizes"),
            "load_average": [round(load_before, 2), round(load_average(), 2)]}


# --------------------------------------------------------------------------- output
def cell(m: dict | None) -> str:
    """One method's figures on one set, as the table shows them (also the docs' table)."""
    if m is None:
        return "-"
    if not m.get("fitted"):
        return m.get("note") or "-"
    warn = " (warns)" if m.get("warnings") else ""
    return (f"{m['ari_median']:.3f} ({m['ari_min']:.2f}-{m['ari_max']:.2f}), "
            f"{m['seconds_median']:.2f} s{warn}")


def markdown(res: dict) -> str:
    others = [f"- {r['data']}: measured {r['run']['date']} by `{r['run']['command']}`"
              for r in res["sets"]
              if r.get("run") and r["run"]["command"] != res["meta"]["command"]]
    lines = [f"# Spectral clustering at the defaults ({res['meta']['date']}, "
             f"{res['meta']['machine']})", "",
             f"`{res['meta']['command']}`", ""] + (
                 [res["meta"]["note"], ""] if res["meta"].get("note") else []) + (
                 ["Sets measured by another run (merged):", ""] + others + [""]
                 if others else []) + [
             "Median ARI over the seeds (least-largest), median seconds; ratio: our median "
             "time over KMeans's, fitted alternately (sets of 10^5 rows and more).", "",
             "| data | n x d | k | ours | KMeans | MiniBatchKMeans | SpectralClustering(nn) "
             "| kernel affinity | ours - best peer | time / KMeans | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    for r in res["sets"]:
        ms = r["methods"]
        ratio = f"{r['time_over_kmeans']:.2f}" if "time_over_kmeans" in r else ""
        lines.append(f"| {r['data']} | {r['n']} x {r['d']} | {r['k']} | {cell(ms.get('ours'))} "
                     f"| {cell(ms.get('KMeans'))} | {cell(ms.get('MiniBatchKMeans'))} "
                     f"| {cell(ms.get('SpectralClustering(nn)'))} | {cell(ms.get('kernel'))} "
                     f"| {r['ours_minus_best_peer']:+.3f} | {ratio} "
                     f"| {r['load_average'][0]:.1f} |")
    if res.get("memory"):
        lines += ["", "## Out of core: `ooc-spectral fit IN.zarr --out OUT --n-clusters 5`", "",
                  "| n | engine | ARI | wall s | peak RSS (process tree) | load |",
                  "|---|---|---|---|---|---|"]
        for m in res["memory"]["runs"]:
            lines.append(f"| {m['n']:.0e} | {m.get('engine', 'auto')} | {m['ari']:.3f} | "
                         f"{m['wall_seconds']:.1f} | {m['peak_tree_rss_mib']:.0f} MiB | "
                         f"{m['load_average'][0]:.1f} |")
        lines.append("")
        lines.append(f"Peak memory, largest over smallest size: {res['memory']['peak_ratio']:.3f}")
        if res["memory"].get("bench_command"):
            lines += ["", f"`{res['memory']['bench_command']}`"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="*", default=SETS, help="data sets (default: all)")
    ap.add_argument("--seeds", type=int, default=5,
                    help="seeds per method (sets of 10^5 rows and more: seeds // 2 + 1)")
    ap.add_argument("--budget", type=float, default=120.0,
                    help="seconds a nearest-neighbour or kernel-affinity fit may take")
    ap.add_argument("--kernel-budget", type=float, default=400.0,
                    help="seconds the kernel affinity's fit may take (seed 0 only)")
    ap.add_argument("--no-kernel", action="store_true",
                    help="do not record the kernel affinity")
    ap.add_argument("--kernel-max-rows", type=int, default=2000,
                    help="record the kernel affinity on sets of at most this many rows")
    ap.add_argument("--memory-sizes", type=float, nargs="*", default=[])
    ap.add_argument("--memory-engine", choices=("cluster", "threads"), default="cluster",
                    help="the engine of every memory run (default: the embedded LocalCluster, "
                    "which the command takes at its defaults above 128 MiB of input)")
    ap.add_argument("--note", default=None,
                    help="a sentence kept with the results (for instance which sets a later "
                    "--merge run measured again, and why)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--merge", action="store_true",
                    help="keep the sets (and memory runs) of the existing result file that "
                    "this run does not measure")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "clustering.json"
    old = json.loads(path.read_text()) if args.merge and path.exists() else {}

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    command = "python workflows/bench/clustering.py " + " ".join(sys.argv[1:])

    sets = []
    for name in args.sets:
        log(f"{name} (load {load_average():.1f})")
        X_rows = None
        kernel = not args.no_kernel
        if kernel:
            X_rows = load(name)[0].shape[0]
            kernel = X_rows <= args.kernel_max_rows
        sets.append(measure_set(name, args.seeds, args.budget, kernel, log, args.kernel_budget))
        sets[-1]["run"] = {"date": time.strftime("%Y-%m-%d %H:%M"), "command": command}
    if old.get("sets"):
        done = {s["data"] for s in sets}
        sets = [s for s in old["sets"] if s["data"] not in done] + sets
        sets.sort(key=lambda s: SETS.index(s["data"]) if s["data"] in SETS else len(SETS))
    memory = old.get("memory")
    if args.memory_sizes:
        work = Path(args.workdir or tempfile.mkdtemp(prefix="ooc-clustering-"))
        runs = [memory_run(int(n), work, engine=args.memory_engine) for n in args.memory_sizes]
        memory = {"runs": runs, "peak_ratio": runs[-1]["peak_tree_rss_bytes"]
                  / runs[0]["peak_tree_rss_bytes"],
                  "bench_command": "python workflows/bench/clustering.py "
                  + " ".join(sys.argv[1:])}
    import sklearn

    from ooc_spectral import __version__

    res = {
        "meta": {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.node(),
                 "cores": os.cpu_count(), "python": platform.python_version(),
                 "ooc_spectral": __version__, "scikit_learn": sklearn.__version__,
                 "command": command},
        "summary": {
            "sets": len(sets),
            "ari_within_0.02_of_best_peer": sum(s["ari_within_0.02"] for s in sets),
            "large_sets_within_3x_kmeans": sum(s.get("time_within_3x", False) for s in sets),
            "large_sets": sum("time_over_kmeans" in s for s in sets)},
        "sets": sets,
    }
    if args.note:
        res["meta"]["note"] = args.note
    if memory:
        res["memory"] = memory
    path.write_text(json.dumps(res, indent=1) + "\n")
    (out_dir / "clustering.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
