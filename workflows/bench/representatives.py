"""Spectral clustering on nearest representatives (issue 39): quality, time, memory.

Three parts, written to ``representatives.json`` and ``representatives.md`` in ``--out``:

1. **digits** (scikit-learn's ``load_digits``, 1797 x 64, 10 classes), in memory:
   ``GreedySpectralClustering(10, affinity="representatives")`` at its defaults against
   ``SpectralClustering(10, affinity="nearest_neighbors")`` and k-means: ARI over
   ``--seeds`` seeds, and the median of ``--repeats`` timed fits after one warm-up each,
   run alternately so both see the same load;
2. **2 * 10^4 rows** of ``--dataset`` (in memory): the same three, ARI and time;
3. **out of core**: ``--dataset`` written by ``make-data`` at each of ``--sizes`` (zarr,
   float32), then ``ooc-spectral fit IN --out OUT --affinity representatives
   --n-clusters K`` as a subprocess, with the resident set size of its whole process
   tree (client, and a LocalCluster's nanny and workers if the engine starts one)
   sampled every 50 ms: ARI of the labels written (against the data set's stored labels,
   read after the run), the seconds of each stage from ``report.json``, the peak memory,
   and the ratio of the largest size's peak to the smallest's.

    nice -n 10 python workflows/bench/representatives.py --sizes 1e6 1e7
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DATASET_CLUSTERS = {"halo-ball": 2, "blobs": 3}


def run_sampled(cmd: list[str], interval: float = 0.05) -> tuple[int, float, int, str]:
    """Run ``cmd``; returns (peak tree RSS in bytes, seconds, exit code, stdout)."""
    from ooc_spectral.runtime.monitor import tree_rss

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(interval)
    out, err = proc.communicate()
    if proc.returncode:
        sys.stderr.write(err)
    return peak, time.perf_counter() - t0, proc.returncode, out


def _timed(make, X, repeats):
    """(labels, median seconds) of ``make().fit(X)`` after one warm-up fit."""
    make().fit(X)
    times, est = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        est = make().fit(X)
        times.append(time.perf_counter() - t)
    return np.asarray(est.labels_), float(np.median(times)), times


def compare_in_memory(name, X, y, k, seeds, repeats) -> dict:
    """Ours, scikit-learn's nearest-neighbour spectral clustering and k-means on X."""
    import warnings

    from sklearn.cluster import KMeans, SpectralClustering
    from sklearn.metrics import adjusted_rand_score as ari

    from ooc_spectral.clustering import GreedySpectralClustering

    def ours(seed=0):
        return GreedySpectralClustering(k, affinity="representatives", random_state=seed)

    def theirs():
        return SpectralClustering(k, affinity="nearest_neighbors", random_state=0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn: "Graph is not fully connected"
        ours_ari = [ari(y, ours(s).fit(X).labels_) for s in seeds]
        t_ours, t_sk = [], []
        ours().fit(X)
        theirs().fit(X)
        for _ in range(repeats):  # alternately, so that both see the same load
            t = time.perf_counter()
            ours().fit(X)
            t_ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            sk = theirs().fit(X)
            t_sk.append(time.perf_counter() - t)
        stages = ours().fit(X).stage_times_
    km = KMeans(k, n_init=10, random_state=0).fit_predict(X)
    return {
        "data": name, "n": int(X.shape[0]), "d": int(X.shape[1]), "k": int(k),
        "ours_ari_mean": float(np.mean(ours_ari)), "ours_ari_min": float(np.min(ours_ari)),
        "ours_ari_seed0": float(ours_ari[0]), "seeds": len(seeds),
        "sklearn_nn_ari": float(ari(y, sk.labels_)), "kmeans_ari": float(ari(y, km)),
        "ours_seconds": float(np.median(t_ours)), "sklearn_seconds": float(np.median(t_sk)),
        "ratio": float(np.median(t_ours) / np.median(t_sk)),
        "ours_times": [round(v, 4) for v in t_ours], "sklearn_times": [round(v, 4) for v in t_sk],
        "ours_stages": {s: round(v, 4) for s, v in stages.items()},
    }


def out_of_core(dataset, n, k, work: Path, engine, chunk_rows) -> dict:
    import zarr
    from sklearn.metrics import adjusted_rand_score as ari

    from ooc_spectral.datasets import make_data

    t = time.perf_counter()
    inp = make_data(dataset, n, work / f"{dataset}-{n}.zarr", seed=0, chunk_rows=chunk_rows,
                    reuse=True)
    t_make = time.perf_counter() - t
    out = work / f"fit-{dataset}-{n}"
    cmd = [sys.executable, "-m", "ooc_spectral", "fit", str(inp), "--out", str(out),
           "--affinity", "representatives", "--n-clusters", str(k), "--overwrite", "--quiet",
           "--json"]
    if engine:
        cmd += ["--engine", engine]
    peak, seconds, code, _ = run_sampled(cmd)
    if code:
        raise SystemExit(f"fit failed with exit code {code}")
    report = json.loads((out / "report.json").read_text())
    labels = zarr.open_array(str(out / "labels"), mode="r")[:]
    truth = zarr.open_group(str(inp), mode="r")["label"][:]
    return {
        "data": dataset, "n": int(n), "k": int(k), "ari": float(ari(truth, labels)),
        "seconds": round(seconds, 2), "make_data_seconds": round(t_make, 2),
        "stages": {s: v["seconds"] for s, v in report["stages"].items()},
        "peak_memory_bytes": int(peak), "engine": report.get("engine"),
        "threads": report.get("threads"), "workers": report.get("workers"),
        "n_representatives": report["n_representatives"], "n_components": report["n_components"],
    }


def markdown(res: dict) -> str:
    lines = [f"# Spectral clustering on nearest representatives ({res['when']}, "
             f"{res['machine']})", "", "## In memory", "",
             "| data | n x d | k | ours ARI seed 0 / mean / least | sklearn nn ARI | k-means ARI "
             "| ours s | sklearn s | ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for r in res["in_memory"]:
        lines.append(f"| {r['data']} | {r['n']} x {r['d']} | {r['k']} | {r['ours_ari_seed0']:.3f} "
                     f"/ {r['ours_ari_mean']:.3f} / {r['ours_ari_min']:.3f} ({r['seeds']} seeds) "
                     f"| {r['sklearn_nn_ari']:.3f} | {r['kmeans_ari']:.3f} | {r['ours_seconds']:.2f} "
                     f"| {r['sklearn_seconds']:.2f} | {r['ratio']:.2f} |")
    lines += ["", "## Out of core (`ooc-spectral fit --affinity representatives`, zarr float32)", "",
              "| data | n | k | ARI | representatives s | bipartite pass s | solve s | k-means s "
              "| write-back s | total s | peak memory (process tree) | engine |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["out_of_core"]:
        s = r["stages"]
        lines.append(
            f"| {r['data']} | {r['n']:.0e} | {r['k']} | {r['ari']:.3f} | {s.get('representatives', 0):.1f} "
            f"| {s.get('bipartite pass', 0):.1f} | {s.get('solve', 0):.2f} | {s.get('k-means', 0):.1f} "
            f"| {s.get('write-back', 0):.1f} | {r['seconds']:.1f} | {r['peak_memory_bytes'] / 2**20:.0f} MiB "
            f"| {r['engine']} |")
    if res.get("peak_ratio") is not None:
        lines += ["", f"Peak memory ratio, largest / smallest size: {res['peak_ratio']:.3f}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="*", default=[1e6, 1e7])
    ap.add_argument("--dataset", default="halo-ball", choices=sorted(DATASET_CLUSTERS))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunk-rows", type=int, default=262_144)
    ap.add_argument("--engine", default=None, help="the fit's --engine (default: its choice)")
    ap.add_argument("--skip-in-memory", action="store_true")
    ap.add_argument("--workdir", default=None, help="where the data go (default: a temp dir)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    from sklearn.datasets import load_digits

    from ooc_spectral.datasets import generate

    k = DATASET_CLUSTERS[args.dataset]
    res = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.node()}, "
           f"{__import__('os').cpu_count()} cores", "in_memory": [], "out_of_core": [],
           "command": " ".join(sys.argv)}
    if not args.skip_in_memory:
        X, y = load_digits(return_X_y=True)
        res["in_memory"].append(compare_in_memory("digits", X, y, 10, range(args.seeds),
                                                  args.repeats))
        print(json.dumps(res["in_memory"][-1]), flush=True)
        X, lab = generate(args.dataset, 20000, seed=0)
        res["in_memory"].append(compare_in_memory(args.dataset, X, lab["label"], k,
                                                  range(min(args.seeds, 3)), min(args.repeats, 3)))
        print(json.dumps(res["in_memory"][-1]), flush=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ooc-reps-"))
    for n in map(int, args.sizes):
        res["out_of_core"].append(out_of_core(args.dataset, n, k, work, args.engine,
                                              args.chunk_rows))
        print(json.dumps(res["out_of_core"][-1]), flush=True)
    peaks = [r["peak_memory_bytes"] for r in res["out_of_core"]]
    res["peak_ratio"] = peaks[-1] / peaks[0] if len(peaks) > 1 else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "representatives.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "representatives.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
