"""fit_inverse_transform out of core: peak memory flat in n, and the pre-images' quality.

At each size, streams a swiss roll (3 features, float32, zarr) to disk, runs
``ooc-spectral fit --fit-inverse-transform`` on it with the same dictionary size
m (RP-Cholesky on a seeded sample) on the embedded LocalCluster, and samples
the resident set size of the command and all its descendants (client, nannies,
workers) every 50 ms, as ``memory_flat.py`` does. The pre-image map needs one
more parallel pass (the m x m and m x d sums of :mod:`ooc_spectral.core.preimage`).
Then loads the saved model and measures the pre-images of 2000 seeded rows:
``|inverse_transform(transform(x)) - x|`` relative to the rows' RMS distance to
their mean.

Writes ``inverse_transform.json`` and ``inverse_transform.md`` to ``--out``.

    python workflows/bench/inverse_transform.py --sizes 1000000 10000000
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).parent))
from memory_flat import run_sampled  # noqa: E402

from ooc_spectral import GreedySpectralEmbedding  # noqa: E402
from ooc_spectral.datasets import make_data  # noqa: E402
from ooc_spectral.io.source import open_source  # noqa: E402


def preimage_error(model_dir: Path, data: Path, rows: int = 2000) -> float:
    """RMS pre-image error of ``rows`` seeded rows, relative to their RMS radius."""
    est = GreedySpectralEmbedding.load(model_dir)
    source = open_source(str(data))
    idx = np.sort(np.random.default_rng(1).choice(source.n_rows, rows, replace=False))
    X = np.asarray(source.read_index(idx), dtype=np.float64)
    rec = est.inverse_transform(est.transform(X))
    rms = np.sqrt(np.mean(np.sum((X - X.mean(axis=0)) ** 2, axis=1)))
    return float(np.sqrt(np.mean(np.sum((rec - X) ** 2, axis=1))) / rms)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7])
    ap.add_argument("--dictionary-size", type=int, default=300)
    ap.add_argument("--n-components", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=1e-3)
    ap.add_argument("--chunk-rows", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workdir", default=None, help="where to put the data (default: a temp dir)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ooc-inv-"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in map(int, args.sizes):
        data = work / f"roll3-{n}.zarr"
        if not data.exists():
            make_data("swiss-roll", n, data, chunk_rows=args.chunk_rows, seed=0)
        fit_out = work / f"fit-inv-{n}"
        shutil.rmtree(fit_out, ignore_errors=True)
        cmd = ["ooc-spectral", "fit", str(data), "--out", str(fit_out), "--dictionary-size",
               str(args.dictionary_size), "--n-components", str(args.n_components),
               "--fit-inverse-transform", "--alpha", str(args.alpha),
               "--workers", str(args.workers), "--memory-limit", "4GiB", "-q"]
        peak, seconds, code = run_sampled(cmd)
        if code:
            raise SystemExit(f"fit failed for n={n}")
        report = json.loads((fit_out / "report.json").read_text())
        err = preimage_error(fit_out / "model", data)
        rows.append({"n": n, "dim": 3, "dictionary_size": report["dictionary_size"],
                     "n_components": args.n_components, "alpha": args.alpha,
                     "chunk_rows": args.chunk_rows, "peak_tree_rss_bytes": peak,
                     "seconds": round(seconds, 2), "input_bytes": n * 3 * 4,
                     "relative_preimage_error": err,
                     "stages": {k: v["seconds"] for k, v in report["stages"].items()}})
        print(f"n={n:>12,}  peak RSS {peak / 2**20:8.1f} MiB  {seconds:7.1f} s  "
              f"m={report['dictionary_size']}  pre-image error {err:.4f}", flush=True)
        shutil.rmtree(fit_out, ignore_errors=True)
    ratio = rows[-1]["peak_tree_rss_bytes"] / rows[0]["peak_tree_rss_bytes"]
    result = {"command": " ".join(sys.argv), "machine": {
              "cpus": psutil.cpu_count(), "ram_bytes": psutil.virtual_memory().total,
              "python": platform.python_version()},
              "runs": rows, "ratio_largest_to_smallest": ratio}
    (out / "inverse_transform.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# fit_inverse_transform: peak memory against n", "",
             f"Command: `{result['command']}`", "",
             "| n | d | m | p | input size | peak RSS (process tree) | wall time | "
             "pre-image stage | relative pre-image error |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        pre = r["stages"].get("preimage")
        lines.append(
            f"| {r['n']:,} | {r['dim']} | {r['dictionary_size']} | {r['n_components']} | "
            f"{r['input_bytes'] / 2**20:,.0f} MiB | {r['peak_tree_rss_bytes'] / 2**20:,.1f} MiB | "
            f"{r['seconds']:.1f} s | {'-' if pre is None else f'{pre:.1f} s'} | "
            f"{r['relative_preimage_error']:.4f} |")
    lines += ["", f"Largest / smallest peak: **{ratio:.3f}** (target: at most 1.25).",
              "", "Relative pre-image error: RMS of |inverse_transform(transform(x)) - x| over "
              "2000 seeded rows, divided by their RMS distance to their mean."]
    (out / "inverse_transform.md").write_text("\n".join(lines) + "\n")
    print(f"ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
