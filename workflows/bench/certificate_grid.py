"""The certificate against exact references: the grid of issue 36, PCA, the greedy path at
tol 1e-12, and the real data sets of issue 53.

Sections (each case is one fit; on a :class:`NumericalBreakdownError`, the fit again at the
tol its message advises):

- ``grid``: circles, moons and an S-curve (300 rows) x the Gaussian kernel (median
  heuristic, gamma 0.5 and 5), the Laplacian, the linear kernel and ``MetricMDS`` x offsets
  of the data from the origin (0 to 1e6) x tol (1e-3 to 1e-12, and 0); the S-curve with a
  constant column of 1e4. The defaults: where the exact problem is at hand (300 rows) a
  tol float64 cannot certify with a dictionary is solved exactly.
- ``greedy``: the Gaussian and Laplacian kernels of the grid at tol 1e-6 to 1e-12 with the
  exact problem out of reach (``max_dictionary_size`` below the rows), so the greedy
  path's certificate, double-double where float64 cannot decide, is what is tested.
- ``pca``: the linear kernel on iris, wine, breast cancer and digits, raw, centred and
  standardised, at every tol.
- ``extreme``: kernel parameters at their extremes (the Gaussian and Laplacian kernels at
  gamma 1e-8 and 1e3 times the median heuristic's, the polynomial kernel at degree 1 and 9,
  coef0 0 and 1e3) on the moons and the S-curve at offsets 0 and 1e3, tol 1e-3, 1e-8, 1e-12,
  two components; a ``DictionaryError`` there (fewer directions than asked for) is
  ``refused``, its message kept.
- ``real``: breast cancer standardised with the Gaussian kernel at 10 times the median
  gamma, digits standardised and blobs in 50-D at the median gamma, tol 1e-6 down to 1e-12
  (wine standardised with the linear kernel is in ``pca``).

Every returned fit is checked against references computed another way
(``tests/extended_precision.py``: kernel values from differences in extended precision, a
Cholesky factorization in that precision, 40-digit arithmetic where long double cannot
decide, 80 digits for the linear kernel): ``max_residual_`` at least every row's
exact squared distance to the dictionary's span, every exact eigenvalue of the centred Gram
matrix inside ``eigenvalue_interval_``. Each case's outcome:

- ``certified``: returned at the tol asked, by the greedy path, every check holds;
- ``exact``: returned at the tol asked by the exact path (the n x n problem), checks hold;
- ``advised``: refused with advice, and the fit at the advised tol is certified;
- ``size``: the greedy section's cap (``max_dictionary_size``) reached: the data need every
  row, which the exact path serves (see ``grid``);
- ``SILENT``: returned something a check refutes (the defect this grid hunts);
- ``FAILED``: the advice did not lead to a certified fit.

    python workflows/bench/certificate_grid.py            # every section (1,111 fits)
    python workflows/bench/certificate_grid.py --quick    # one case in three
    python workflows/bench/certificate_grid.py --only greedy pca

Writes ``certificate_grid.json`` and ``certificate_grid.md`` to ``--out``
(default ``workflows/bench/results``): the counts per section, the checks of issue 53's
"Done when", every refusal with its time against the fit of the same case at tol 1e-6 and
the fit that follows its advice, the slowest Gaussian or Laplacian fit below tol 1e-6
against its fit at 1e-6, and one table per section (the worst outcome over the offsets, per
tol). ``--rows FILE`` saves each case's row as it ends; ``--from-rows FILE...`` writes the
result files from saved rows (sections run in separate processes, then put together):

    python workflows/bench/certificate_grid.py --only grid --rows grid.jsonl --out /tmp/g
    python workflows/bench/certificate_grid.py --only greedy pca real --rows rest.jsonl --out /tmp/r
    python workflows/bench/certificate_grid.py --from-rows grid.jsonl rest.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from test_certificate import (DATASETS, KERNELS, N, OFFSETS, TOLS, check_certified,  # noqa: E402
                              dataset, estimator)

from ooc_spectral import GreedySpectralEmbedding  # noqa: E402
from ooc_spectral.exceptions import (DictionaryError, DictionarySizeError,  # noqa: E402
                                     NumericalBreakdownError)

GREEDY_KERNELS = ["rbf-median", "rbf-0.5", "rbf-5", "laplacian"]
GREEDY_TOLS = [1e-6, 1e-8, 1e-10, 1e-12]
GREEDY_OFFSETS = [0.0, 1e3, 1e6]
PCA_SETS = ["iris", "wine", "breast_cancer", "digits"]
PCA_FORMS = ["raw", "centred", "standardised"]
REAL = [("breast cancer, rbf 10x median", 1e-3), ("breast cancer, rbf 10x median", 1e-6),
        ("breast cancer, rbf 10x median", 1e-8), ("breast cancer, rbf 10x median", 1e-10),
        ("breast cancer, rbf 10x median", 1e-12), ("digits standardised, rbf median", 1e-6),
        ("digits standardised, rbf median", 1e-8), ("digits standardised, rbf median", 1e-10),
        ("digits standardised, rbf median", 1e-12), ("blobs 50-D, rbf median", 1e-6),
        ("blobs 50-D, rbf median", 1e-8), ("blobs 50-D, rbf median", 1e-10),
        ("blobs 50-D, rbf median", 1e-12)]
#: kernel parameters at their extremes: (label, kernel, parameters; "median" x the heuristic)
EXTREME_KERNELS = [("rbf gamma=1e-8", "rbf", {"gamma": 1e-8}),
                   ("rbf gamma=1e3 x median", "rbf", {"gamma": ("median", 1e3)}),
                   ("laplacian gamma=1e-8", "laplacian", {"gamma": 1e-8}),
                   ("laplacian gamma=1e3 x median", "laplacian", {"gamma": ("median", 1e3)}),
                   ("poly degree=1", "poly", {"degree": 1}),
                   ("poly degree=9", "poly", {"degree": 9}),
                   ("poly coef0=0", "poly", {"coef0": 0.0}),
                   ("poly coef0=1e3", "poly", {"coef0": 1e3})]
EXTREME_SETS = ["moons", "s-curve"]
EXTREME_OFFSETS = [0.0, 1e3]
EXTREME_TOLS = [1e-3, 1e-8, 1e-12]
#: the tol whose fit is the yardstick of every refusal's and every small tol's time
REFERENCE_TOL = 1e-6
#: rows checked against the references of a data set with more rows (every one otherwise)
CHECK_ROWS = 600


def real_data(name: str) -> np.ndarray:
    from sklearn import datasets
    from sklearn.preprocessing import StandardScaler

    if name in PCA_SETS:
        return getattr(datasets, f"load_{name}")().data.astype(np.float64)
    if name.startswith("breast"):
        return StandardScaler().fit_transform(datasets.load_breast_cancer().data)
    if name.startswith("digits"):
        return StandardScaler().fit_transform(datasets.load_digits().data)
    return datasets.make_blobs(2000, n_features=50, centers=5, random_state=0)[0]


def pca_data(name: str, form: str) -> np.ndarray:
    X = real_data(name)
    if form == "centred":
        return X - X.mean(axis=0)
    if form == "standardised":
        sd = X.std(axis=0)
        return (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    return X


def _fit(make, X: np.ndarray, tol: float):
    """``(estimator, tol used, refusal)``: the fit, or the fit at the advised tol; refusal is
    ``{"advice", "refuse_seconds", "advised_fit_seconds", "message"}`` or None."""
    import re

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        try:
            return make(tol).fit(X), tol, None
        except NumericalBreakdownError as err:
            refused = time.perf_counter() - t
            found = re.search(r"Use tol >= ([0-9.e+-]+)", str(err))
            if not found:
                raise AssertionError(f"a breakdown without advice: {err}") from err
            advice = float(found.group(1))
            t = time.perf_counter()
            est = make(advice).fit(X)
            return est, advice, {"advice": advice, "refuse_seconds": round(refused, 3),
                                 "advised_fit_seconds": round(time.perf_counter() - t, 3),
                                 "message": str(err)[:240]}


def run_case(case: dict) -> dict:
    row = dict(case)
    section, kernel, tol = case["section"], case["kernel"], case["tol"]
    if section in ("grid", "greedy"):
        X = dataset(case["dataset"].split(" + ")[0]) + case["offset"]
        if case["dataset"].endswith("column"):
            X = np.column_stack([X, np.full(len(X), 1e4)])
        params = {"max_dictionary_size": N - 1} if section == "greedy" else {}

        def make(t):
            return estimator(kernel, t, **params)
    elif section == "pca":
        X = pca_data(case["dataset"], case["form"])

        def make(t):
            return GreedySpectralEmbedding(n_components=2, kernel="linear", tol=t, random_state=0)
    elif section == "extreme":
        X = dataset(case["dataset"]) + case["offset"]
        params = dict(next(p for label, _, p in EXTREME_KERNELS if label == case["kernel"]))
        if isinstance(params.get("gamma"), tuple):
            from ooc_spectral.core.kernel_choice import median_heuristic_gamma

            params["gamma"] = params["gamma"][1] * median_heuristic_gamma(case["base"], X)

        def make(t):
            return GreedySpectralEmbedding(n_components=2, kernel=case["base"], tol=t,
                                           random_state=0, **params)
    else:
        X = real_data(case["dataset"])
        gamma = None
        if "10x" in case["dataset"]:
            from ooc_spectral.core.kernel_choice import median_heuristic_gamma

            gamma = 10 * median_heuristic_gamma("rbf", X)

        def make(t):
            return GreedySpectralEmbedding(n_components=4, gamma=gamma, tol=t, random_state=0)
    t = time.perf_counter()
    try:
        est, used, refusal = _fit(make, X, tol)
    except DictionarySizeError as exc:
        row.update(outcome="size" if section == "greedy" else "FAILED", error=str(exc)[:240])
        row["seconds"] = round(time.perf_counter() - t, 3)
        return row
    except DictionaryError as exc:  # extreme parameters: fewer directions than asked for
        row.update(outcome="refused" if section == "extreme" else "FAILED",
                   error=f"{type(exc).__name__}: {exc}"[:400])
        row["seconds"] = round(time.perf_counter() - t, 3)
        return row
    except Exception as exc:  # the advised fit failed too
        row.update(outcome="FAILED", error=f"{type(exc).__name__}: {exc}"[:300])
        row["seconds"] = round(time.perf_counter() - t, 3)
        return row
    row["seconds"] = round(time.perf_counter() - t, 3) if refusal is None else refusal[
        "refuse_seconds"]
    row.update(tol_used=used)
    if refusal is not None:
        row["refusal"] = refusal
    core = est.embedding_estimator_ if kernel == "mds" else est
    exact = core.spectral_map_.dictionary.L is None
    try:
        rows = None
        if len(X) > CHECK_ROWS:  # the largest residual's row and a stride of the others
            rows = np.unique(np.r_[core.max_residual_row_,
                                   np.arange(0, len(X), len(X) // CHECK_ROWS + 1)])
        row["checks"] = check_certified(kernel, X, est, used, rows=rows)
        row["outcome"] = "advised" if refusal else ("exact" if exact else "certified")
    except AssertionError as exc:
        row.update(outcome="SILENT", error=str(exc)[:300])
    return row


def cases(only=None) -> list[dict]:
    out = []
    if only is None or "grid" in only:
        out += [dict(section="grid", dataset=ds, kernel=k, offset=o, tol=t)
                for ds in DATASETS for k in KERNELS for o in OFFSETS for t in TOLS]
        out += [dict(section="grid", dataset="s-curve + 1e4 column", kernel=k, offset=0.0, tol=t)
                for k in ("rbf-0.5", "rbf-median", "linear") for t in TOLS]
    if only is None or "greedy" in only:
        out += [dict(section="greedy", dataset=ds, kernel=k, offset=o, tol=t)
                for ds in DATASETS for k in GREEDY_KERNELS for o in GREEDY_OFFSETS
                for t in GREEDY_TOLS]
    if only is None or "pca" in only:
        out += [dict(section="pca", dataset=ds, form=f, kernel="linear", offset=0.0, tol=t)
                for ds in PCA_SETS for f in PCA_FORMS for t in TOLS]
    if only is None or "extreme" in only:
        out += [dict(section="extreme", dataset=ds, kernel=label, base=base, offset=o, tol=t)
                for ds in EXTREME_SETS for label, base, _ in EXTREME_KERNELS
                for o in EXTREME_OFFSETS for t in EXTREME_TOLS]
    if only is None or "real" in only:
        out += [dict(section="real", dataset=ds, kernel="rbf", offset=0.0, tol=t)
                for ds, t in REAL]
    return out


RANK = {"SILENT": 0, "FAILED": 1, "refused": 2, "advised": 2, "size": 3, "exact": 4,
        "certified": 5}


def tables(rows: list[dict]) -> dict[str, list[dict]]:
    """Per section, one row per (data set, form, kernel): per tol the worst outcome over the
    offsets (and how many offsets reached it)."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        key = (r["section"], r["dataset"], r.get("form", ""), r["kernel"])
        out.setdefault(key, []).append(r)
    by_section: dict[str, list[dict]] = {}
    for (section, ds, form, kernel), rs in out.items():
        line = {"data set": ds + (f", {form}" if form else ""), "kernel": kernel}
        for t in sorted({r["tol"] for r in rs}, reverse=True):
            sel = [r for r in rs if r["tol"] == t]
            worst = min(sel, key=lambda r: RANK.get(r["outcome"], -1))
            cell = worst["outcome"]
            if cell == "advised":
                ref = worst["refusal"]
                cell = (f"refused in {ref['refuse_seconds']:.2g} s, {ref['advice']:g} certified "
                        f"in {ref['advised_fit_seconds']:.2g} s")
            if len(sel) > 1:
                cell += f" ({sum(r['outcome'] == worst['outcome'] for r in sel)}/{len(sel)})"
            line[f"tol {t:g}"] = cell
        by_section.setdefault(section, []).append(line)
    return by_section


def _key(r: dict) -> tuple:
    return (r["section"], r["dataset"], r.get("form", ""), r["kernel"], r["offset"])


def reference_seconds(rows: list[dict]) -> dict[tuple, float]:
    """The time of the fit at ``REFERENCE_TOL`` of each (section, data set, form, kernel,
    offset), where it returned without refusal."""
    return {_key(r): r["seconds"] for r in rows
            if r["tol"] == REFERENCE_TOL and r["outcome"] in ("certified", "exact")}


def refusal_row(r: dict, rows: list[dict], ref: dict) -> dict:
    """One refusal against the fit of the same case: at ``REFERENCE_TOL``, else (the
    extreme section has no such tol) the nearest tol whose fit returned. A
    ``NumericalBreakdownError`` with its advised tol and the advised fit's time; a
    ``DictionaryError`` (fewer directions than asked for) with its message."""
    against = ref.get(_key(r))
    against_tol = REFERENCE_TOL if against is not None else None
    if against is None:
        same = [x for x in rows if _key(x) == _key(r) and x["outcome"] in ("certified", "exact")]
        near = min(same, key=lambda x: abs(np.log10(max(x["tol"], 1e-300) / max(r["tol"], 1e-300))),
                   default=None)
        if near is not None:
            against, against_tol = near["seconds"], near["tol"]
    advice = r.get("refusal") or {}
    return {"section": r["section"], "data set": r["dataset"] + (f", {r['form']}" if
            r.get("form") else ""), "kernel": r["kernel"], "offset": r["offset"], "tol": r["tol"],
            "error": "NumericalBreakdownError" if advice else r.get("error", "").split(":")[0],
            "advice": advice.get("advice"), "message": advice.get("message", r.get("error", "")),
            "refuse_seconds": advice.get("refuse_seconds", r.get("seconds")),
            "advised_fit_seconds": advice.get("advised_fit_seconds"),
            "fit_seconds": against, "fit_tol": against_tol}


def done_when(rows: list[dict]) -> dict:
    """Issue 53's "Done when": no silent, no failed advice, no refusal for rbf/laplacian at
    tol >= 1e-12 nor for the linear kernel at any tol; and the slowest small-tol fit of the
    Gaussian and Laplacian kernels against the fit at ``REFERENCE_TOL`` (the issue's goal:
    at most 10x)."""
    refused = [r for r in rows if r["outcome"] in ("advised", "refused")]
    gauss = [r for r in refused if r["kernel"].startswith(("rbf", "laplacian")) and r["tol"] >= 1e-12]
    linear = [r for r in refused if r["kernel"] == "linear"]
    ref = reference_seconds(rows)
    ratios = [(r["seconds"] / ref[_key(r)], r) for r in rows
              if r["kernel"].startswith(("rbf", "laplacian")) and 0 < r["tol"] < REFERENCE_TOL
              and r["outcome"] in ("certified", "exact") and ref.get(_key(r))]
    worst = max(ratios, key=lambda x: x[0], default=(None, None))
    return {"silent": sum(r["outcome"] == "SILENT" for r in rows),
            "advice_failed": sum(r["outcome"] == "FAILED" for r in rows),
            "refused_rbf_laplacian_tol_ge_1e-12": len(gauss),
            "refused_linear": len(linear),
            "refusals": len(refused),
            "max_time_vs_tol_1e-6_rbf_laplacian": None if worst[0] is None else round(worst[0], 1),
            "max_time_vs_tol_1e-6_case": None if worst[1] is None else
            f"{worst[1]['section']} {worst[1]['dataset']} {worst[1]['kernel']} "
            f"offset {worst[1]['offset']:g} tol {worst[1]['tol']:g}"}


def time_ratios(rows: list[dict]) -> list[dict]:
    """Per section and tol below ``REFERENCE_TOL``: the Gaussian and Laplacian fits' times
    against the fit of the same case at ``REFERENCE_TOL`` (median, largest, how many above
    10x: the issue's goal)."""
    ref = reference_seconds(rows)
    out = []
    for section in sorted({r["section"] for r in rows}):
        for tol in sorted({r["tol"] for r in rows if r["tol"] < REFERENCE_TOL}, reverse=True):
            ratios = [r["seconds"] / ref[_key(r)] for r in rows
                      if r["section"] == section and r["tol"] == tol
                      and r["kernel"].startswith(("rbf", "laplacian"))
                      and r["outcome"] in ("certified", "exact") and ref.get(_key(r))]
            if ratios:
                out.append({"section": section, "tol": tol, "fits": len(ratios),
                            "median": round(float(np.median(ratios)), 1),
                            "largest": round(max(ratios), 1),
                            "above 10x": sum(x > 10 for x in ratios)})
    return out


def report(rows: list[dict], command: str, seconds, load, how: str = "") -> tuple[dict, str]:
    """The result file's content and its Markdown, from the rows of the fits."""
    sections = sorted({r["section"] for r in rows})
    counts = {s: {o: sum(r["outcome"] == o and r["section"] == s for r in rows) for o in RANK}
              for s in sections}
    done = done_when(rows)
    ref = reference_seconds(rows)
    refusals = [refusal_row(r, rows, ref) for r in rows
                if r.get("refusal") or r["outcome"] == "refused"]
    by_section = tables(rows)
    result = {"command": command, "cases": len(rows), "seconds": seconds,
              "load_average": load, "done_when": done, "counts": counts,
              "refusals": refusals, "time_against_tol_1e-6": time_ratios(rows),
              **{f"table_{s}": t for s, t in by_section.items()},
              "detail": {"all": {"rows": rows}}}
    md = [f"# The certificate against exact references ({len(rows)} fits)", "",
          f"Command: `{command}`{how} (the fits took {sum(r.get('seconds', 0) for r in rows):.0f} s "
          "in all, the checks against the references the rest"
          + (f"; load average {load:.1f} at the end, on a shared machine)" if load is not None
             else ")"), "",
          "Done when (issue 53): " + ", ".join(f"{k} {v}" for k, v in done.items()) + ".", ""]
    for s in sections:
        md += [f"### {s}", "", "Outcomes: " + ", ".join(f"{k} {v}" for k, v in counts[s].items()
                                                       if v) + ".", ""]
        tab = by_section[s]
        cols = list(dict.fromkeys(k for line in tab for k in line))
        md += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        md += ["| " + " | ".join(str(line.get(c, "")) for c in cols) + " |" for line in tab]
        md.append("")
    md += ["### Time against the fit at tol 1e-6", "",
           "The Gaussian and Laplacian kernels' fits at each tol below 1e-6 against the fit of "
           "the same case (data set, kernel, offset) at tol 1e-6, in the same process:", "",
           "| section | tol | fits | median | largest | above 10x |", "|---|---|---|---|---|---|"]
    md += [f"| {t['section']} | {t['tol']:g} | {t['fits']} | {t['median']:g} | {t['largest']:g} "
           f"| {t['above 10x']} |" for t in result["time_against_tol_1e-6"]]
    md += ["", "### Refusals", ""]
    if refusals:
        md += ["| section | data set | kernel | offset | tol | refused by | advice | refused in (s) "
               "| the fit of the case (tol: s) | advised fit (s) |",
               "|---|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['section']} | {r['data set']} | {r['kernel']} | {r['offset']:g} | {r['tol']:g} "
               f"| {r['error']} | " + (f"tol {r['advice']:g}" if r["advice"] is not None else
                                      r["message"].split("; ")[-1][:200].replace("|", "/"))
               + f" | {r['refuse_seconds']:.2f} | "
               + ("none returned" if r["fit_seconds"] is None else
                  f"{r['fit_tol']:g}: {r['fit_seconds']:.2f}")
               + " | " + ("" if r["advised_fit_seconds"] is None else
                          f"{r['advised_fit_seconds']:.2f}") + " |" for r in refusals]
    else:
        md += ["None."]
    md.append("")
    md += ["`certified`: returned at the tol asked by the greedy path, with `max_residual_` at "
           "least every row's exact residual (extended precision, 40-digit arithmetic where long "
           "double cannot decide, 80 digits for the linear kernel) and every exact "
           "eigenvalue in `eigenvalue_interval_`; `exact`: the exact path, its eigenvalues "
           "checked the same way; `refused in r s, t certified in f s`: "
           "`NumericalBreakdownError` after r seconds advised tol t, and the fit at t, certified, "
           "took f seconds; `refused` (the extreme section): `DictionaryError`, fewer directions "
           "than asked for, each listed under Refusals with its time and its message's advice; `size`: the greedy section's cap reached (the data need every row). "
           "**SILENT** / **FAILED**: a check refuted what was returned / the advice did not "
           "work. A cell is the worst outcome over the offsets, with how many reached it. "
           "`max_time_vs_tol_1e-6`: the slowest fit of the Gaussian or Laplacian kernel at a tol "
           "below 1e-6 against the fit of the same case at tol 1e-6.", ""]
    return result, "\n".join(md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one case in three")
    ap.add_argument("--only", nargs="*", choices=("grid", "greedy", "pca", "real", "extreme"))
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--rows", help="append each case's row to this JSON-lines file as it ends")
    ap.add_argument("--from-rows", nargs="*", metavar="JSONL",
                    help="write the result files from rows saved by --rows, fitting nothing")
    args = ap.parse_args(argv)
    command = ("python workflows/bench/certificate_grid.py" + (" --quick" if args.quick else "")
               + (" --only " + " ".join(args.only) if args.only else ""))
    t0 = time.perf_counter()
    how = ""
    if args.from_rows:
        rows = [json.loads(line) for f in args.from_rows for line in Path(f).read_text().splitlines()
                if line.strip()]
        seconds = None  # the wall time of runs in other processes is not known here
        how = f", its sections run in {len(args.from_rows)} processes and put together by --from-rows"
    else:
        todo = cases(args.only)
        if args.quick:
            todo = todo[::3]
        rows = []
        for i, case in enumerate(todo):
            rows.append(run_case(case))
            r = rows[-1]
            if args.rows:
                with open(args.rows, "a") as f:
                    f.write(json.dumps(r, default=float) + "\n")
            print(f"[{i + 1}/{len(todo)}] {r['section']} {r['dataset']} {r.get('form', '')} "
                  f"{r['kernel']} offset={r['offset']:g} tol={r['tol']:g}: {r['outcome']} "
                  f"({r.get('seconds', 0):.2f} s)", flush=True)
        seconds = round(time.perf_counter() - t0, 1)
    # the load of runs in other processes is not known here (only that of this one's end)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") and not args.from_rows else None
    result, md = report(rows, command, seconds, load, how)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "certificate_grid.json").write_text(json.dumps(result, indent=1, default=float))
    (out / "certificate_grid.md").write_text(md)
    done = result["done_when"]
    print(json.dumps(done))
    ok = done["silent"] == 0 and done["advice_failed"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
