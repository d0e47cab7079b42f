"""The adversary of a nightly batch job (issue 37): trials and their outcomes, as a table.

Each trial runs the real console script (``python -m ooc_spectral``) in subprocesses
against a small swiss roll, does what an adversary or an accident would (a kill at
a chosen moment, a damaged or deleted file, an input changed under the run, a
foreign directory as OUTDIR, a planted symlink, a hostile workflow file, data zarr
wrote sparsely) and classifies what the tool answered:

- ``safe: refused`` - exit 2 with a message naming the fix, and nothing outside
  OUTDIR changed (a listing with SHA-256 digests of the parent directory compared);
- ``safe: stopped`` - exit 1 ("rerun"), and the rerun gives the fresh run's result;
- ``safe: identical`` - exit 0 with an embedding bit-identical to a fresh run on the
  same input (after a rerun where the trial says so);
- ``UNSAFE ...`` - anything else: an exit 0 with a wrong, stale or damaged result, a
  write outside OUTDIR, a hang past the bound. The script exits 1 when any trial is.

Not here (they need services this script does not start): object storage on moto's
server (``tests/test_object_storage.py``), a full disk on a small tmpfs
(``tests/test_batch_safety.py``, which needs a private mount namespace), the memory
watchdog on a paused cluster (``tests/test_outdir_safety.py``).

    python workflows/bench/adversarial.py                # every trial (a few minutes)
    python workflows/bench/adversarial.py --only lock    # trials whose name holds "lock"

Writes ``adversarial.md`` to ``--out`` (default ``workflows/bench/results``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

FIT = ["--gamma", "0.05", "--tol", "1e-2", "--n-components", "2", "--engine", "threads",
       "--threads-per-worker", "1", "--chunk-rows", "400", "--checkpoint-every", "1", "-q"]
BOUND = 600  # seconds any one command may take before it counts as a hang


def cli(*args, cwd=None, wait=True):
    cmd = [sys.executable, "-m", "ooc_spectral", *map(str, args)]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=BOUND)
    except subprocess.TimeoutExpired:
        return 124, "hang"
    return p.returncode, " ".join(p.stderr.split())


def snapshot(root: Path, skip: Path | None = None) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if skip is not None and (p == skip or skip in p.parents):
                continue
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def embedding(out: Path):
    try:
        return zarr.open_array(str(out / "embedding"), mode="r")[...]
    except Exception:
        return None


class Trials:
    def __init__(self, work: Path):
        self.work = work
        self.rows: list[tuple[str, str, str, str]] = []
        self.data = work / "data.zarr"
        assert cli("make-data", "swiss-roll", "--n", 2000, "--out", self.data,
                   "--chunk-rows", 400, "-q")[0] == 0
        self.fresh = work / "fresh"
        assert cli("fit", self.data, "--out", self.fresh, *FIT)[0] == 0
        self.ref = embedding(self.fresh)

    def case(self, name: str) -> Path:
        d = self.work / name
        d.mkdir()
        return d

    def record(self, name, what, code, msg, verdict):
        msg = msg.replace("ooc-spectral: error: ", "").replace(str(self.work), "$TMP")
        self.rows.append((name, what, f"exit {code}", verdict + (f": {msg[:110]}" if msg and
                                                                 code else "")))

    def refused(self, name, what, code, msg, before, after, needle=""):
        ok = code == 2 and before == after and needle in msg
        self.record(name, what, code, msg, "safe: refused" if ok else
                    f"UNSAFE (changed outside: {before != after})")

    def identical(self, name, what, code, msg, out, reference=None):
        ref = self.ref if reference is None else reference
        emb = embedding(out)
        same = code == 0 and emb is not None and np.array_equal(emb, ref)
        verdict = "safe: identical" if same else "UNSAFE: exit 0 with another result" \
            if code == 0 else "UNSAFE: the rerun failed"
        self.record(name, what, code, msg, verdict)

    def fit_copy(self, d: Path) -> Path:
        out = d / "out"
        shutil.copytree(self.fresh, out)
        return out


# --------------------------------------------------------------------------- trials
def kill_at(t: Trials, name: str, predicate_name: str):
    d = t.case(name)
    out = d / "out"
    proc = cli("fit", t.data, "--out", out, *FIT, wait=False)
    deadline = time.time() + BOUND
    checks = {
        "begun": lambda: (out / "zarr.json").exists(),
        "pass2": lambda: (out / "checkpoint" / "partials").exists(),
        "pass3": lambda: (out / "embedding_written").exists(),
    }
    while proc.poll() is None and not checks[predicate_name]() and time.time() < deadline:
        time.sleep(0.002)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    code, msg = cli("fit", t.data, "--out", out, *FIT)
    t.identical(name, f"SIGKILL when {predicate_name}, then the same command", code, msg, out)


def sigterm_then_rerun(t: Trials):
    d = t.case("sigterm")
    out = d / "out"
    proc = cli("fit", t.data, "--out", out, *FIT, wait=False)
    while proc.poll() is None and not (out / "checkpoint").exists():
        time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)
    first = proc.wait()
    code, msg = cli("fit", t.data, "--out", out, *FIT)
    t.identical("sigterm", f"SIGTERM in the run (exit {first}), then the same command", code,
                msg, out)


def foreign_outdir(t: Trials, overwrite: bool):
    name = "foreign-outdir" + ("-overwrite" if overwrite else "")
    d = t.case(name)
    (d / "home").mkdir()
    (d / "home" / "thesis.tex").write_text("years of work")
    before = snapshot(d)
    code, msg = cli("fit", t.data, "--out", d / "home", *FIT,
                    *(["--overwrite"] if overwrite else []))
    t.refused(name, "fit --out a directory holding thesis.tex", code, msg, before, snapshot(d),
              "not an ooc-spectral output")


def make_data_overwrite(t: Trials):
    d = t.case("make-data-overwrite")
    g = d / "mine.zarr"
    zarr.open_group(str(g), mode="w").attrs["mine"] = 1
    before = snapshot(d)
    code, msg = cli("make-data", "spiral", "--n", 1000, "--out", g, "--overwrite", "-q")
    t.refused("make-data-overwrite", "make-data --overwrite on a user's zarr group", code, msg,
              before, snapshot(d), "nothing was deleted")


def lock_symlink(t: Trials):
    d = t.case("lock-symlink")
    (d / "victim.txt").write_text("keep me")
    out = t.fit_copy(d)
    (out / ".lock").symlink_to(d / "victim.txt")
    before = snapshot(d)
    code, msg = cli("fit", t.data, "--out", out, *FIT)
    t.refused("lock-symlink", "OUTDIR/.lock planted as a symlink to a foreign file", code, msg,
              before, snapshot(d), "symbolic link")


def deleted_member(t: Trials, member: str):
    name = f"deleted-{member.replace('/', '-')}"
    d = t.case(name)
    out = t.fit_copy(d)
    p = out / member
    shutil.rmtree(p) if p.is_dir() else p.unlink()
    vcode, vmsg = cli("verify", out)
    code, msg = cli("fit", t.data, "--out", out, *FIT)
    after, _ = cli("verify", out)
    ok = vcode == 2 and after == 0
    if not ok:
        t.record(name, f"{member} deleted: verify exit {vcode}, rerun, verify exit {after}",
                 vcode, vmsg, "UNSAFE: verify called it intact" if vcode == 0 else "UNSAFE")
        return
    t.identical(name, f"{member} deleted: verify exit {vcode}, the rerun restores it", code,
                msg, out)


def garbled_json(t: Trials, member: str, expect_rerun: int):
    name = f"garbled-{member.replace('/', '-')}"
    d = t.case(name)
    out = t.fit_copy(d)
    (out / member).write_text('{"zarr_format": 3, "node_')
    vcode, vmsg = cli("verify", out)
    code, msg = cli("fit", t.data, "--out", out, *FIT)
    if expect_rerun == 2:
        ok = vcode == 2 and code == 2 and "zarr.json" in msg
        t.record(name, f"{member} garbled: verify and fit name the file", code, msg,
                 "safe: refused" if ok else "UNSAFE")
        return
    t.identical(name, f"{member} garbled: verify exit {vcode}, the rerun repairs it", code, msg,
                out)


def flipped_checkpoint(t: Trials):
    d = t.case("flipped-checkpoint")
    out = t.fit_copy(d)
    chunk = next(p for p in sorted((out / "checkpoint").rglob("*"))
                 if p.is_file() and p.name != "zarr.json")
    b = bytearray(chunk.read_bytes())
    b[len(b) // 2] ^= 0xFF
    chunk.write_bytes(bytes(b))
    vcode, _ = cli("verify", out)
    code, msg = cli("fit", t.data, "--out", out, *FIT)
    after, _ = cli("verify", out)
    ok = vcode != 0 and after == 0
    if not ok:
        t.record("flipped-checkpoint", "a checkpoint byte flipped", code, msg, "UNSAFE")
        return
    t.identical("flipped-checkpoint", f"a checkpoint byte flipped: verify exit {vcode}, the "
                "rerun repairs it, verify exit 0", code, msg, out)


def changed_input(t: Trials, restore_mtime: bool):
    name = "changed-input" + ("-mtime-restored" if restore_mtime else "")
    d = t.case(name)
    data = d / "data.zarr"
    shutil.copytree(t.data, data)
    out = d / "out"
    assert cli("fit", data, "--out", out, *FIT)[0] == 0
    chunk = data / "data" / "c" / "1" / "0"
    st = chunk.stat()
    arr = zarr.open_group(str(data), mode="r+")["data"]
    arr[400:800] = arr[400:800][::-1]
    if restore_mtime:
        os.utime(chunk, ns=(st.st_atime_ns, st.st_mtime_ns))
    code, msg = cli("fit", data, "--out", out, *FIT)
    fresh = d / "fresh"
    copy = d / "copy.zarr"
    shutil.copytree(data, copy)
    cli("fit", copy, "--out", fresh, *FIT)
    t.identical(name, "a chunk rewritten" + (" with its mtime restored" if restore_mtime else "")
                + ", then the same command", code, msg, out, embedding(fresh))


def sharded_unwritten(t: Trials):
    d = t.case("sharded-unwritten")
    X = zarr.open_group(str(t.data), mode="r")["data"][...]
    arr = zarr.create_array(str(d / "s.zarr"), shape=X.shape, shards=(400, X.shape[1]),
                            chunks=(100, X.shape[1]), dtype=X.dtype, fill_value=0)
    arr[:500] = X[:500]
    arr[600:] = X[600:]
    before = snapshot(d)
    code, msg = cli("fit", d / "s.zarr", "--out", d / "out", *FIT)
    t.refused("sharded-unwritten", "a shard whose inner chunk (rows 500-599) was never written",
              code, msg, before, snapshot(d), "never written")


def missing_chunk(t: Trials):
    d = t.case("missing-chunk")
    data = d / "data.zarr"
    shutil.copytree(t.data, data)
    (data / "data" / "c" / "2" / "0").unlink()
    before = snapshot(d)
    code, msg = cli("fit", data, "--out", d / "out", *FIT)
    t.refused("missing-chunk", "an input chunk deleted", code, msg, before, snapshot(d),
              "does not exist")


def sparse_fill(t: Trials):
    d = t.case("fill-chunks")
    X = np.array(zarr.open_group(str(t.data), mode="r")["data"][...], dtype="f8")
    X[400:800] = 0.0
    g = zarr.open_group(str(d / "z.zarr"), mode="w")
    g.create_array("data", shape=X.shape, chunks=(400, X.shape[1]), dtype="f8",
                   fill_value=0.0)[...] = X
    code1, _ = cli("fit", d / "z.zarr", "--out", d / "out", *FIT)
    g.attrs["ooc_spectral_complete"] = True
    code, msg = cli("fit", d / "z.zarr", "--out", d / "out", *FIT)
    h = zarr.open_group(str(d / "dense.zarr"), mode="w")
    h.create_array("data", shape=X.shape, chunks=(400, X.shape[1]), dtype="f8", fill_value=0.0,
                   config={"write_empty_chunks": True})[...] = X
    cli("fit", d / "dense.zarr", "--out", d / "ref", *FIT)
    t.identical("fill-chunks", f"a chunk of zeros zarr did not write: exit {code1} naming the "
                "attribute, then marked complete", code, msg, d / "out", embedding(d / "ref"))


def hostile_workflow(t: Trials, name: str, text: str, allow=(), what: str = ""):
    d = t.case(name)
    (d / "victim.pdf").write_bytes(b"%PDF precious")
    flow = d / "flow"
    flow.mkdir()
    wf = flow / "w.toml"
    wf.write_text(text.format(data=t.data, victim=d / "victim.pdf", outside=d / "elsewhere"))
    before = snapshot(d)
    code, msg = cli("run", wf, *allow, "-q")
    msg = msg.split(".toml: ", 1)[-1]  # the step and key, without the file's path
    t.refused(name, "workflow file: " + what, code, msg, before, snapshot(d), "--allow")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--only", default="", help="run only the trials whose name holds this")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="adversarial-"))
    t = Trials(work)
    trials = [
        ("kill-begun", lambda: kill_at(t, "kill-begun", "begun")),
        ("kill-pass2", lambda: kill_at(t, "kill-pass2", "pass2")),
        ("kill-pass3", lambda: kill_at(t, "kill-pass3", "pass3")),
        ("sigterm", lambda: sigterm_then_rerun(t)),
        ("foreign-outdir", lambda: foreign_outdir(t, False)),
        ("foreign-outdir-overwrite", lambda: foreign_outdir(t, True)),
        ("make-data-overwrite", lambda: make_data_overwrite(t)),
        ("lock-symlink", lambda: lock_symlink(t)),
        ("deleted-embedding", lambda: deleted_member(t, "embedding")),
        ("deleted-model", lambda: deleted_member(t, "model")),
        ("deleted-report", lambda: deleted_member(t, "report.json")),
        ("deleted-embedding-meta", lambda: deleted_member(t, "embedding/zarr.json")),
        ("garbled-outdir-json", lambda: garbled_json(t, "zarr.json", 2)),
        ("garbled-model-json", lambda: garbled_json(t, "model/zarr.json", 0)),
        ("flipped-checkpoint", lambda: flipped_checkpoint(t)),
        ("changed-input", lambda: changed_input(t, False)),
        ("changed-input-mtime", lambda: changed_input(t, True)),
        ("missing-chunk", lambda: missing_chunk(t)),
        ("sharded-unwritten", lambda: sharded_unwritten(t)),
        ("fill-chunks", lambda: sparse_fill(t)),
        ("wf-performance-report", lambda: hostile_workflow(
            t, "wf-performance-report", '[[step]]\nrun = "fit"\ninput = "{data}"\nout = "fit"\n'
            'performance_report = "{victim}"\n',
            what="performance_report = an existing file outside its root")),
        ("wf-plot-absolute", lambda: hostile_workflow(
            t, "wf-plot-absolute", '[[step]]\nrun = "plot"\noutdir = "{data}"\n'
            'out = "{victim}"\n', what="a plot step's out = an existing PDF outside its root")),
        ("wf-file-url", lambda: hostile_workflow(
            t, "wf-file-url", '[[step]]\nrun = "fit"\ninput = "{data}"\n'
            'out = "file://{outside}"\n', what="out = a file:// URL outside its root")),
        ("wf-endpoint", lambda: hostile_workflow(
            t, "wf-endpoint", '[storage_options]\nendpoint_url = "http://127.0.0.1:9"\n'
            '[[step]]\nrun = "fit"\ninput = "s3://b/x.zarr"\nout = "fit"\n',
            what="[storage_options] endpoint_url = another host")),
        ("wf-workers", lambda: hostile_workflow(
            t, "wf-workers", '[[step]]\nrun = "fit"\ninput = "{data}"\nout = "fit"\n'
            'workers = 64\n', what="workers = 64")),
        ("wf-overwrite-allowed", lambda: hostile_workflow(
            t, "wf-overwrite-allowed", '[[step]]\nrun = "make-data"\nname = "spiral"\nn = 100\n'
            'out = "{outside}"\noverwrite = true\n', allow=("--allow", "overwrite"),
            what="make-data, overwrite = true, out outside its root; --allow overwrite")),
    ]
    for name, trial in trials:
        if args.only in name:
            t0 = time.time()
            try:
                trial()
            except Exception as exc:  # the trial's own set-up failed
                t.record(name, "trial set-up failed", -1, f"{type(exc).__name__}: {exc}",
                         "UNSAFE: not run")
            print(f"{name}: {t.rows[-1][3]} ({time.time() - t0:.0f} s)", file=sys.stderr)
    lines = ["| trial | what was done | answer | outcome |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in t.rows]
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "adversarial.md").write_text(table + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 1 if any(r[3].startswith("UNSAFE") for r in t.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
