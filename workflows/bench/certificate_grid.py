"""The certificate against exact references, over the whole grid of issue 36.

For every data set (circles, moons, an S-curve; 300 rows), kernel (rbf with the median
heuristic, rbf with gamma 0.5 and 5, laplacian, linear, ``MetricMDS``), offset of the data
from the origin (0 to 1e6) and tol (1e-3 to 1e-12), and for the S-curve with a constant
column of 1e4 added: fit; on a :class:`NumericalBreakdownError`, fit again at the tol its
message advises. Then check what was returned against references computed another way
(``tests/extended_precision.py``: kernel values from differences in extended precision, a
Cholesky factorization in that precision): ``max_residual_`` at least every row's exact
squared distance to the dictionary's span, and every exact eigenvalue of the centred
Gram matrix inside ``eigenvalue_interval_``.

Each case's outcome is one of

- ``certified``: returned at the tol asked, every check holds;
- ``advised``: refused with advice, and the fit at the advised tol is certified;
- ``SILENT``: returned something a check refutes (the defect this grid hunts);
- ``FAILED``: the advice did not lead to a certified fit.

    python workflows/bench/certificate_grid.py            # the whole grid (about 1,000 fits)
    python workflows/bench/certificate_grid.py --quick    # one offset and tol in three

Writes ``certificate_grid.json`` and ``certificate_grid.md`` to ``--out``
(default ``workflows/bench/results``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from test_certificate import (DATASETS, KERNELS, OFFSETS, TOLS, check_certified,  # noqa: E402
                              dataset, fit_or_follow_advice)


def run_case(ds: str, kernel: str, offset: float, tol: float, column: bool = False) -> dict:
    X = dataset(ds) + offset
    if column:
        X = np.column_stack([X, np.full(len(X), 1e4)])
    row = {"dataset": ds + (" + 1e4 column" if column else ""), "kernel": kernel,
           "offset": offset, "tol": tol}
    t = time.perf_counter()
    try:
        est, used, advised = fit_or_follow_advice(kernel, X, tol)
    except Exception as exc:  # the advised fit failed too
        row.update(outcome="FAILED", error=f"{type(exc).__name__}: {exc}"[:300])
        return row
    row.update(tol_used=used)
    try:
        row.update(check_certified(kernel, X, est, used))
        row["outcome"] = "advised" if advised else "certified"
    except AssertionError as exc:
        row.update(outcome="SILENT", error=str(exc)[:300])
    row["seconds"] = round(time.perf_counter() - t, 2)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| data set | kernel | offset | " + " | ".join(f"tol {t:g}" for t in TOLS) + " |",
             "|---|---|---|" + "---|" * len(TOLS)]
    key = {}
    for r in rows:
        key[(r["dataset"], r["kernel"], r["offset"], r["tol"])] = r
    seen = []
    for r in rows:
        k = (r["dataset"], r["kernel"], r["offset"])
        if k in seen:
            continue
        seen.append(k)
        cells = []
        for t in TOLS:
            c = key.get(k + (t,))
            if c is None:
                cells.append("")
            elif c["outcome"] == "certified":
                cells.append("certified")
            elif c["outcome"] == "advised":
                cells.append(f"refused, {c['tol_used']:g} certified")
            else:
                cells.append(f"**{c['outcome']}**")
        lines.append(f"| {k[0]} | {k[1]} | {k[2]:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one offset and tol in three")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    cases = [(ds, k, o, t, False) for ds in DATASETS for k in KERNELS for o in OFFSETS for t in TOLS]
    cases += [("s-curve", k, 0.0, t, True) for k in ("rbf-0.5", "rbf-median", "linear") for t in TOLS]
    if args.quick:
        cases = cases[::3]
    rows = []
    t0 = time.perf_counter()
    for i, case in enumerate(cases):
        rows.append(run_case(*case))
        r = rows[-1]
        print(f"[{i + 1}/{len(cases)}] {r['dataset']} {r['kernel']} offset={r['offset']:g} "
              f"tol={r['tol']:g}: {r['outcome']}", flush=True)
    counts = {o: sum(r["outcome"] == o for r in rows) for o in ("certified", "advised", "SILENT", "FAILED")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "certificate_grid.json").write_text(json.dumps(
        {"command": "python workflows/bench/certificate_grid.py" + (" --quick" if args.quick else ""),
         "cases": len(rows), "counts": counts, "seconds": round(time.perf_counter() - t0, 1),
         "rows": rows}, indent=1, default=float))
    md = [f"# The certificate against exact references ({len(rows)} fits)", "",
          "Command: `python workflows/bench/certificate_grid.py`" + (" --quick" if args.quick else ""), "",
          "Outcomes: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + ".", "",
          "`certified`: returned at the tol asked, with `max_residual_` at least every row's exact "
          "residual (extended precision, the fit's own dictionary) and every exact eigenvalue in "
          "`eigenvalue_interval_`. `refused, t certified`: `NumericalBreakdownError` advised tol t, "
          "and the fit at t is certified. **SILENT** / **FAILED**: a check refuted what was "
          "returned / the advice did not work.", "", table(rows), ""]
    (out / "certificate_grid.md").write_text("\n".join(md))
    print(counts)
    return 0 if counts["SILENT"] == 0 and counts["FAILED"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
