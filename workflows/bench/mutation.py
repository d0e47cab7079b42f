"""Mutation run over the numerical core: do the tests hold the guarantees at their values?

Each mutant is one single-line fault of the kind an outside audit injected (a tolerance
10x looser or tighter, a sum halved, a term dropped, a comparison flipped, a centre or
offset lost), written out below as ``(file, original, mutated)`` so that the run is
reproducible and a snippet that no longer matches the code fails loudly instead of
silently testing nothing. For each mutant the package and tests are copied to a scratch
directory, the fault applied, and the test files that cover that module run with ``-x``
(stop at the first failure): the mutant is *killed* when a test fails, *survived* when
all pass. A survivor is then checked for whether it changes a result at all (a fit on
three probe data sets compared bit for bit with the unmutated package's): survivors that
change nothing on the probes are listed as candidates for equivalence, with the reason.

    python workflows/bench/mutation.py                 # every mutant (about an hour, 2 cores)
    python workflows/bench/mutation.py --only 3 7      # some of them
    python workflows/bench/mutation.py --check         # only that every snippet matches

Writes ``mutation.json`` and ``mutation.md`` to ``--out`` (default
``workflows/bench/results``).
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = "ooc_spectral"

EIG = "ooc_spectral/core/eigensolve.py"
STAT = "ooc_spectral/core/statistics.py"
ROUND = "ooc_spectral/core/rounding.py"
CERT = "ooc_spectral/core/scan/certify.py"
MODEL = "ooc_spectral/core/model.py"
KERN = "ooc_spectral/core/kernels.py"
CHECKS = "ooc_spectral/core/checks.py"
PASS2 = "ooc_spectral/core/pass2.py"
FUSED = "ooc_spectral/_accel/fused.py"
SEARCH = "ooc_spectral/core/scan/search.py"
EXPL = "ooc_spectral/core/explicit_features.py"
EXT = "ooc_spectral/core/extended.py"
DD = "ooc_spectral/core/double_double.py"
EXACT = "ooc_spectral/pipeline/exact.py"
BLOCKED = "ooc_spectral/core/scan/blocked.py"
ERRF = "ooc_spectral/core/error_free.py"

#: the test files that cover each module (run with -x, in this order: cheap first)
PIN, XT = "tests/test_pinned.py", "tests/test_extended.py"
COVER = {
    EIG: [PIN, "tests/test_bound_values.py", "tests/test_thresholds.py", "tests/test_exactness.py"],
    STAT: ["tests/test_statistics.py", "tests/test_thresholds.py", "tests/test_exactness.py"],
    ROUND: [PIN, "tests/test_bound_values.py", XT, "tests/test_certificate.py",
            "tests/test_thresholds.py"],
    CERT: [PIN, "tests/test_bound_values.py", XT, "tests/test_certificate.py", "tests/test_scan.py"],
    MODEL: ["tests/test_thresholds.py", "tests/test_kernels.py", "tests/test_exactness.py"],
    KERN: [PIN, "tests/test_bound_values.py", "tests/test_kernels.py", "tests/test_certificate.py",
           "tests/test_exactness.py"],
    CHECKS: [PIN, "tests/test_bound_values.py", "tests/test_thresholds.py",
             "tests/test_certificate.py"],
    PASS2: [PIN, "tests/test_bound_values.py", "tests/test_statistics.py", "tests/test_thresholds.py",
            "tests/test_exactness.py"],
    FUSED: ["tests/test_fused.py", "tests/test_statistics.py"],
    SEARCH: [PIN, "tests/test_thresholds.py", "tests/test_scan.py"],
    EXPL: [PIN, XT, "tests/test_certificate.py"],
    EXT: [PIN, XT, "tests/test_certificate.py"],
    DD: [XT],
    EXACT: [XT, "tests/test_advice.py", "tests/test_certificate.py"],
    BLOCKED: [XT, "tests/test_scan.py", "tests/test_certificate.py"],
    ERRF: [PIN, "tests/test_bound_values.py", "tests/test_certificate.py"],
}

MUTANTS = [
    # eigensolve: the run-time checks' tolerances and the interval
    (EIG, "trace_allowed = 2 * gamma(2 * m + 2) * scale", "trace_allowed = 200 * gamma(2 * m + 2) * scale"),
    (EIG, "trace_allowed = 2 * gamma(2 * m + 2) * scale", "trace_allowed = 0.02 * gamma(2 * m + 2) * scale"),
    (EIG, "eig_err = 2 * (m + 1) * U * max(abs(hi), abs(lo))", "eig_err = 200 * (m + 1) * U * max(abs(hi), abs(lo))"),
    (EIG, "if lo < -(tau_C + eig_err):", "if lo < -10 * (tau_C + eig_err):"),
    (EIG, "limit = sum_kx + gamma(depth + 2) * abs(sum_kx) + tau_C + eig_err",
     "limit = sum_kx + 100 * gamma(depth + 2) * abs(sum_kx) + tau_C + eig_err"),
    (EIG, "if hi > limit or trace > limit:", "if hi > 2 * limit or trace > 2 * limit:"),
    (EIG, "        return float(sums.sum_dhat)\n", "        return 0.5 * float(sums.sum_dhat)\n"),
    (EIG, "return gamma(depth + 4) * 4.0 * abs(scale)", "return gamma(depth + 4) * 0.04 * abs(scale)"),
    (EIG, "\n    return (g * lam + tau) / (1 + g), g * lam + tau", "\n    return (g * lam + tau) / (1 + g) / 100, g * lam + tau"),
    (EIG, "\n    return (g * lam + tau) / (1 + g), g * lam + tau", "\n    return (g * lam + tau) / (1 + g), (g * lam + tau) / 100"),
    # statistics: the tree reduction
    (STAT, "self.sum_dhat + other.sum_dhat, self.sum_sq + other.sum_sq",
     "self.sum_dhat, self.sum_sq + other.sum_sq"),
    (STAT, "return n, mean_a + diff * (nb / n), diff, na * nb / n",
     "return n, mean_a + diff * (na / n), diff, na * nb / n"),
    (STAT, "return n, mean_a + diff * (nb / n), diff, na * nb / n",
     "return n, mean_a + diff * (nb / n), diff, na * nb / (n + 1)"),
    (STAT, "self.sum_xi2 + other.sum_xi2, max(self.max_rounding, other.max_rounding)",
     "self.sum_xi2 + other.sum_xi2, min(self.max_rounding, other.max_rounding)"),
    (STAT, "float(np.maximum(bounds, 0.0).sum()), float(sq.sum()), float(xi @ xi)",
     "float(np.maximum(bounds, 0.0).max()), float(sq.sum()), float(xi @ xi)"),
    # rounding: the residual bound
    (ROUND, "E = (2 * A * (eta + g2m * ell * zn) + theta * A * A",
     "E = (2 * A * (eta + g2m * ell * zn) + 0 * theta * A * A"),
    (ROUND, "E = (2 * A * (eta + g2m * ell * zn) + theta * A * A",
     "E = (0.2 * A * (eta + g2m * ell * zn) + theta * A * A"),
    (ROUND, "+ gamma(m + 2) * (np.abs(sq) + np.abs(kx)) + kx_error)",
     "+ gamma(m + 2) * (np.abs(sq) + np.abs(kx)))"),
    (ROUND, "bounds = np.minimum(dhat + E, self.cap)", "bounds = np.minimum(dhat, self.cap)"),
    (ERRF, "nu = float(n) * U", "nu = float(n) * U / 100"),
    (ROUND, "        return np.abs(Z) @ self.inverse_sums\n", "        return 0.01 * (np.abs(Z) @ self.inverse_sums)\n"),
    # the scan's membership test
    (CERT, "    if upper <= tol:\n        return delta > tol and not inspan",
     "    if dhat <= tol:\n        return delta > tol and not inspan"),
    (CERT, "(spread <= RESOLVED * tol or", "(spread <= 4 * tol or"),
    (CERT, "if tol > 0 and delta > tol and low <= (1.0 - RESOLVED) * tol:",
     "if tol > 0 and delta > tol and low <= 0.0 * tol:"),
    # model: residuals and the affine correction
    (MODEL, "delta = dhat + alpha * alpha / self.beta", "delta = dhat + alpha * alpha * self.beta"),
    (MODEL, "alpha = 1.0 - (Z @ self.w if zw is None else zw)", "alpha = 1.0 + (Z @ self.w if zw is None else zw)"),
    (MODEL, "c0 = -self.center @ W", "c0 = self.center @ W"),
    # kernels: the centre and the augmented product
    (KERN, "            B[:, :d] *= 2.0 * g\n", "            B[:, :d] *= 2.0 * g * (1 + 1e-9)\n"),
    (KERN, "        B[:, d + 1] = -g * yy\n", "        B[:, d + 1] = -g * yy * (1 + 1e-12)\n"),
    (KERN, "np.minimum(S, 0.0, out=S)  # a distance is never negative", "pass"),
    # checks: the certificate's slack
    (CHECKS, "slack = (PIVOT_FLOOR + 16.0 * (m + 2) * eps) * kmax + rounding",
     "slack = (PIVOT_FLOOR + 16.0 * (m + 2) * eps) * kmax + 100 * rounding"),
    (CHECKS, "slack = (PIVOT_FLOOR + 16.0 * (m + 2) * eps) * kmax + rounding",
     "slack = 100 * (PIVOT_FLOOR + 16.0 * (m + 2) * eps) * kmax + rounding"),
    (CHECKS, "if worst > tol + slack:", "if worst > 2 * tol + slack:"),
    # pass 2: the certified residual and the degrees
    (PASS2, "if d[i] > 0:", "if d[i] >= 0:"),
    # issue 53, item 6: the faults an independent audit injected that no test caught
    (CERT, "RESOLVED = 0.25", "RESOLVED = 2.5"),
    (CERT, "ZERO_TOL_SKIP = 1e-4", "ZERO_TOL_SKIP = 1.0"),
    (CHECKS, "CONDITION_LIMIT = 1e-4 / np.finfo(np.float64).eps",
     "CONDITION_LIMIT = 1e-2 / np.finfo(np.float64).eps"),
    (PASS2, "KERNEL_CROSS_LIMIT = 1e-9", "KERNEL_CROSS_LIMIT = 1e-5"),
    (EIG, "r_B ** 2 + rounding.theta * float(np.sum(b1)) ** 2", "r_B ** 2"),
    (CERT, "                 + theta_n * (2 * A - An) * An\n", "\n"),
    (SEARCH, "            return st, eps_minus\n        eps /= 10.0",
     "            return st, eps\n        eps /= 10.0"),
    (ROUND, "coef = (2 * dim + 8) * U * 1.01", "coef = (dim + 4) * U * 1.01"),
    (EIG, "    if n_components > rank:\n", "    if n_components > rank + 1:\n"),
    (EIG, "components, vals / n, n)\n    return SpectralMap(dictionary, \"divisive-exact\", np.asarray",
     "components, vals / (n - 1), n)\n    return SpectralMap(dictionary, \"divisive-exact\", np.asarray"),
    (PASS2, "block[a:a + step], dictionary, int(offset) + a,", "block[a:a + step], dictionary, int(offset),"),
    (KERN, "        col_sums += np.ones(S.shape[0]) @ S\n", "        col_sums[...] = np.ones(S.shape[0]) @ S\n"),
    # issue 53's new numerics: explicit features, double-double, the exact path
    (EXPL, "W = (gamma(m + 3) * mag + U * np.abs(V))", "W = (gamma(1) * mag + U * np.abs(V))"),
    (EXPL, "upper = (f + w) ** 2 * (1 + 8 * U)", "upper = f ** 2 * (1 + 8 * U)"),
    (EXT, "E = (2 * A * (rho + max(eta_k, self.eta)) + self.theta * A * A",
     "E = (2 * A * (rho + max(eta_k, self.eta))"),
    (EXT, "upper = dhat + (s2 * (1 + 4 * U) + E)", "upper = dhat + E"),
    (EXT, "return float(1.1 * (EXP_REL_ERROR + (3 * dim + 12) * _U2 / math.e) + 2.3e-290)",
     "return float(1.1 * (EXP_REL_ERROR / 100 + (3 * dim + 12) * _U2 / math.e) + 2.3e-290)"),
    (DD, "eh, el = dd_add(2.0 * eh, 2.0 * el, sh, sl)", "eh, el = dd_add(2.0 * eh, 0.0 * el, sh, sl)"),
    (EIG, "+ tau_C + eig_err + rows_rounding(moments, m)", "+ tau_C + eig_err"),
    (CERT, "spread <= RESOLVED * dhat) & (lower > tol))", "spread <= RESOLVED * dhat) & (lower > 0))"),
    (EXACT, "EARLY_EXACT = (76, 240, 320)", "EARLY_EXACT = (60, 240, 320)"),
    (EXACT, "EXACT_MEMORY_FRACTION = 0.25", "EXACT_MEMORY_FRACTION = 0.5"),
]


def apply(src: Path, file: str, old: str, new: str) -> None:
    path = src / file
    text = path.read_text()
    count = text.count(old)
    if count != 1:
        raise SystemExit(f"mutant snippet found {count} times in {file} (expected once): {old!r}")
    path.write_text(text.replace(old, new))


def scratch_copy(dest: Path) -> None:
    shutil.copytree(ROOT / PKG, dest / PKG, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", dest / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")


def run_tests(src: Path, files: list[str], timeout: float) -> tuple[str, str, float]:
    """The covering test files one at a time, in the order given (the suite's conftest
    sorts a run's files longest first), stopping at the first failure."""
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONDONTWRITEBYTECODE="1")
    t = time.perf_counter()
    for f in files:
        left = timeout - (time.perf_counter() - t)
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p",
                                   "no:cacheprovider", "-n", "0", f], cwd=src, env=env,
                                  capture_output=True, text=True, timeout=max(left, 1.0))
        except subprocess.TimeoutExpired:
            return "killed (time-out)", f, time.perf_counter() - t
        if proc.returncode != 0:
            failed = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
            return ("killed", (failed[0] if failed else proc.stdout.strip().splitlines()[-1])[:200],
                    time.perf_counter() - t)
    return "survived", "", time.perf_counter() - t


PROBE = r"""
import json, sys, warnings
import numpy as np
from sklearn.datasets import make_circles, make_moons, make_s_curve
from ooc_spectral import GreedySpectralEmbedding
out = {}
for name, X in {"circles": make_circles(400, factor=0.3, noise=0.05, random_state=0)[0] + 10,
                "moons": make_moons(400, noise=0.05, random_state=0)[0],
                "s-curve": make_s_curve(400, noise=0.1, random_state=0)[0]}.items():
    for norm in ("additive", "divisive"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                e = GreedySpectralEmbedding(n_components=3, tol=1e-6, gamma=1.0,
                                            normalization=norm, random_state=0).fit(X)
                iv = getattr(e, "eigenvalue_interval_", None)
                out[f"{name}-{norm}"] = [e.eigenvalues_.tolist(), float(e.max_residual_),
                                         None if iv is None else np.asarray(iv).tolist(),
                                         np.asarray(e.embedding_).round(12).tolist()]
            except Exception as exc:
                out[f"{name}-{norm}"] = f"{type(exc).__name__}: {exc}"[:200]
json.dump(out, sys.stdout)
"""


def probe(src: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=src, env=env, capture_output=True,
                          text=True, timeout=900)
    return json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr[-300:]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", type=int, nargs="*", help="mutant numbers to run")
    ap.add_argument("--check", action="store_true", help="only check that every snippet matches")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per mutant's tests")
    ap.add_argument("--out", type=Path, default=ROOT / "workflows" / "bench" / "results")
    ap.add_argument("--combine", type=Path, nargs="*", metavar="JSON",
                    help="write the result files from the rows of earlier runs' mutation.json "
                         "(each mutant's latest row), running nothing")
    args = ap.parse_args(argv)
    if args.combine:
        runs = [json.loads(f.read_text()) for f in args.combine]
        rows = {r["id"]: r for run in runs for r in run["mutants"]}
        commands = list(dict.fromkeys(c for run in runs for c in run.get("commands", [])))
        return write_results([rows[i] for i in sorted(rows)], args.out, commands)
    chosen = [(i, m) for i, m in enumerate(MUTANTS) if not args.only or i in args.only]
    command = "python workflows/bench/mutation.py" + (
        " --only " + " ".join(map(str, args.only)) if args.only else "")
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        tmp = Path(tmp)
        for i, (file, old, new) in chosen:  # every snippet matches before anything runs
            d = tmp / f"check{i}"
            shutil.copytree(ROOT / PKG, d / PKG, ignore=shutil.ignore_patterns("__pycache__"))
            apply(d, file, old, new)
            shutil.rmtree(d)
        if args.check:
            print(f"{len(chosen)} mutants: every snippet found once")
            return 0
        base = tmp / "base"
        scratch_copy(base)
        reference = None
        rows = []
        for i, (file, old, new) in chosen:
            src = tmp / f"m{i}"
            scratch_copy(src)
            apply(src, file, old, new)
            outcome, why, took = run_tests(src, COVER[file], args.timeout)
            row = {"id": i, "file": file, "original": old.strip(), "mutant": new.strip(),
                   "outcome": outcome, "first_failure": why, "seconds": round(took, 1)}
            if outcome == "survived":
                reference = reference or probe(base)
                row["changes_a_result"] = probe(src) != reference
            rows.append(row)
            print(f"[{i}] {outcome:18s} {took:7.1f} s  {file}: {new.strip()[:70]}", flush=True)
            shutil.rmtree(src)
            write_results(rows, args.out, [command])  # a run stopped early keeps what it found
    return write_results(rows, args.out, [command])


def killing_test(first_failure: str) -> str:
    """The test's node id from pytest's ``FAILED path::name[params] - message`` line."""
    return first_failure.split(" - ")[0].removeprefix("FAILED ").removeprefix("ERROR ").strip()


def _cell(row: dict) -> str:
    """The mutant as one table cell: its code on one line, or the line it deletes."""
    text = " ".join(row["mutant"].split()) or "deleted: " + " ".join(row["original"].split())
    return "`" + text[:100].replace("|", "/") + "`"


def write_results(rows: list[dict], out: Path, commands: list[str]) -> int:
    changing = [r for r in rows if r["outcome"] != "survived" or r.get("changes_a_result")]
    killed = [r for r in changing if r["outcome"] != "survived"]
    score = len(killed) / len(changing) if changing else 1.0
    for r in rows:
        r["killed_by"] = killing_test(r["first_failure"]) if r["outcome"] != "survived" else None
    out.mkdir(parents=True, exist_ok=True)
    (out / "mutation.json").write_text(json.dumps({"score": score, "commands": commands,
                                                   "mutants": rows}, indent=1))
    lines = ["# Mutation run over the numerical core", "",
             f"{len(killed)} of {len(changing)} mutants that change a result killed "
             f"({100 * score:.0f}%); {len(rows)} mutants in all ("
             + "; ".join(f"`{c}`" for c in commands) + ").", "",
             "| # | file | mutant | outcome | killed by (the first failing test) |",
             "|---|---|---|---|---|"]
    for r in rows:
        what = r["outcome"] + ("" if r["outcome"] != "survived" else
                               (", changes a result" if r["changes_a_result"]
                                else ", no change on the probes"))
        lines.append(f"| {r['id']} | `{Path(r['file']).name}` | {_cell(r)} | {what} | "
                     f"{killing_test(r['first_failure']).replace('|', '/')} |")
    (out / "mutation.md").write_text("\n".join(lines) + "\n")
    print(f"score {100 * score:.0f}% ({len(killed)}/{len(changing)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
