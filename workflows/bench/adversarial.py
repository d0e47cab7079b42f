"""The adversary of a nightly batch job (issue 37): trials and their outcomes, as a table.

Each trial runs the real console script (``python -m ooc_spectral``) in subprocesses
against a small swiss roll, does what an adversary or an accident would (a kill at
a chosen moment, a damaged or deleted file, an input changed under the run, a
foreign directory as OUTDIR, a planted symlink, a hostile workflow file, data zarr
wrote sparsely, two runs at once on one OUTDIR, a full disk, a worker or scheduler
paused, stopped or killed, object storage killed under the run, damaged, unreachable
or refusing the keys) and classifies what the tool answered:

- ``safe: refused`` - exit 2 with a message naming the fix, and nothing outside
  OUTDIR changed (a listing with SHA-256 digests of the parent directory compared);
- ``safe: stopped`` - exit 1 ("rerun") naming the cause within the bound, and the
  rerun gives the fresh run's result;
- ``safe: identical`` - exit 0 with an embedding bit-identical to a fresh run on the
  same input (after a rerun where the trial says so);
- ``UNSAFE ...`` - anything else: an exit 0 with a wrong, stale or damaged result, a
  write outside OUTDIR, a hang past the bound. The script exits 1 when any trial is.

The services are this script's own: object storage is moto's S3 server on 127.0.0.1
(a thread of this script; the commands reach it through ``AWS_ENDPOINT_URL`` and fake
keys), a full disk is a small tmpfs mounted in a private mount namespace (``unshare``;
where the machine allows none those rows say "not run"), the watchdog trials start a
``dask scheduler`` and ``dask worker`` processes and pass ``--scheduler``.

    python workflows/bench/adversarial.py              # every trial (254; hours on a loaded 2 cores)
    python workflows/bench/adversarial.py --only s3-   # the trials whose name holds "s3-"
    # three processes sharing the trials, then their tables joined:
    python workflows/bench/adversarial.py --shard K/3 --out /tmp/shardK   # K = 0, 1, 2
    python workflows/bench/adversarial.py --merge /tmp/shard{0,1,2}/adversarial.md

Writes ``adversarial.md`` to ``--out`` (default ``workflows/bench/results``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import numpy as np
import zarr

from adversary_commands import matrix_trials, producers_group
from adversary_places import place_trials

FIT = ["--gamma", "0.05", "--tol", "1e-2", "--n-components", "2", "--engine", "threads",
       "--threads-per-worker", "1", "--chunk-rows", "400", "--checkpoint-every", "1", "-q"]
BOUND = 600  # seconds any one command may take before it counts as a hang
SECRETS: list[str] = []  # never printed in the table (the fake keys of the S3 trials)


def cli(*args, cwd=None, wait=True, env=None, timeout=BOUND):
    cmd = [sys.executable, "-m", "ooc_spectral", *map(str, args)]
    if not wait:
        return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, start_new_session=True)
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           env=env)
    except subprocess.TimeoutExpired:
        return 124, "hang"
    return p.returncode, " ".join(p.stderr.split())


def timed(proc: subprocess.Popen, timeout: float) -> tuple[int, str, float]:
    """Wait for ``proc`` at most ``timeout`` s: (exit code, stderr on one line, seconds);
    a command still running then is killed and answers (124, "hang")."""
    t0 = time.time()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return 124, "hang", time.time() - t0
    return proc.returncode, " ".join(err.split()), time.time() - t0


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


def embedding(out):
    """OUTDIR's embedding (a local path or an s3:// URL), or None where it cannot be read."""
    try:
        return zarr.open_array(f"{str(out).rstrip('/')}/embedding", mode="r")[...]
    except Exception:
        return None


class Trials:
    def __init__(self, work: Path):
        self.work = work
        self.rows: list[tuple[str, str, str, str]] = []
        self.data = work / "data.zarr"
        assert cli("make-data", "swiss-roll", "--n", 2000, "--out", self.data,
                   "--chunk-rows", 400, "-q")[0] == 0
        producers_group(self.data)  # the trials rewrite copies of it (a producer's group)
        self.fresh = work / "fresh"
        assert cli("fit", self.data, "--out", self.fresh, *FIT)[0] == 0
        self.ref = embedding(self.fresh)

    def case(self, name: str) -> Path:
        d = self.work / name
        d.mkdir()
        return d

    def record(self, name, what, code, msg, verdict, answer=None):
        if msg.find("ooc-spectral: error: ") > 0:  # the tool's line, after others' log lines
            msg = "(after dask's log lines) " + msg[msg.index("ooc-spectral: error: "):]
        msg = msg.replace("ooc-spectral: error: ", "").replace(str(self.work), "$TMP")
        msg = re.sub(r"pid \d+ on (\S+) since [\d\-T:+]+", r"pid PID on \1 since START", msg)
        for secret in SECRETS:
            msg = msg.replace(secret, "***")
        self.rows.append((name, what, answer or f"exit {code}",
                          verdict + (f": {msg[:110]}" if msg and code else "")))

    def stopped(self, name, what, first, rerun, out, reference, needle="", bound=BOUND):
        """The first command (code, message, seconds) ended nonzero within ``bound`` with
        ``needle`` in its message; the rerun (code, message) gave the fresh run's result."""
        code1, msg1, secs = first
        code2, msg2 = rerun
        answer = f"exit {code1} in {secs:.0f} s, then {code2}"
        if code1 == 124 or secs > bound:
            self.record(name, what, code1, msg1, f"UNSAFE: no end within {bound} s", answer)
        elif code1 == 0:
            self.identical(name, what + " (it completed)", code2, msg2, out, reference)
        elif code1 not in (1, 2) or needle.lower() not in msg1.lower():
            self.record(name, what, code1, msg1, "UNSAFE: another answer", answer)
        else:
            emb = embedding(out)
            same = code2 == 0 and emb is not None and np.array_equal(emb, reference)
            verdict = ("safe: stopped" if code1 == 1 else "safe: refused") if same else \
                "UNSAFE: the rerun failed" if code2 else "UNSAFE: the rerun gave another result"
            self.record(name, what, code1, msg1 if same else msg2 or msg1, verdict, answer)

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


def sigterm_then_rerun(t: Trials, sig=signal.SIGTERM):
    name = sig.name.lower()
    d = t.case(name)
    out = d / "out"
    proc = cli("fit", t.data, "--out", out, *FIT, wait=False)
    while proc.poll() is None and not (out / "checkpoint").exists():
        time.sleep(0.002)
    proc.send_signal(sig)
    first = proc.wait()
    if first not in (0, 1):
        return t.record(name, f"{sig.name} in the run", first, "", f"UNSAFE: {sig.name} gave "
                        f"{first}, not an exit code 0 or 1", f"exit {first}")
    code, msg = cli("fit", t.data, "--out", out, *FIT)
    t.identical(name, f"{sig.name} in the run (exit {first}), then the same command", code,
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
    ok = vcode == 1 and after == 0  # verify: damage of every kind is exit 1
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
        ok = vcode == 1 and code == 2 and "zarr.json" in msg
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


# --------------------------------------------------------------------------- races
def race(t: Trials, name: str, configs: list[list[str]], out=None, data=None,
         references=None):
    """Two fits started at once into the same OUTDIR: one runs, the other refuses naming the
    lock (or, had it started after, finds the run complete or of another configuration);
    OUTDIR ends with the result of a fresh run of the one that answered 0."""
    d = t.case(name)
    out = d / "out" if out is None else out
    data = t.data if data is None else data
    before = snapshot(d, skip=out if isinstance(out, Path) else None)
    procs = [cli("fit", data, "--out", out, *cfg, wait=False, cwd=d) for cfg in configs]
    answers = [timed(p, BOUND) for p in procs]
    codes = [a[0] for a in answers]
    answer = "exits " + " and ".join(map(str, codes))
    loser = next((a[1] for a in answers if a[0]), "")
    what = ("two fits at once into one OUTDIR"
            + (" (tol 1e-2 and 1e-3)" if configs[0] != configs[1] else ""))
    winners = [i for i, c in enumerate(codes) if c == 0]
    if 124 in codes:
        t.record(name, what, 124, "hang", "UNSAFE: a hang", answer)
    elif snapshot(d, skip=out if isinstance(out, Path) else None) != before:
        t.record(name, what, 0, "", "UNSAFE: a write outside OUTDIR", answer)
    elif not winners:
        t.record(name, what, codes[0], loser, "UNSAFE: neither ran", answer)
    elif len(winners) == 2 and configs[0] != configs[1]:
        t.record(name, what, 0, "", "UNSAFE: both exit 0 with two configurations", answer)
    elif len(winners) == 1 and (codes[1 - winners[0]] != 2 or not any(
            w in loser for w in ("locked by another run", "different configuration"))):
        t.record(name, what, codes[1 - winners[0]], loser, "UNSAFE: another answer", answer)
    else:
        ref = (references or [t.ref, t.ref])[winners[0]]
        emb = embedding(out)
        same = emb is not None and np.array_equal(emb, ref)
        t.record(name, what + ": OUTDIR holds the fresh result of the run that answered 0",
                 2 if len(winners) == 1 else 0, loser,
                 "safe: identical" if same else "UNSAFE: another result", answer)


def race_configs(t: Trials):
    d = t.work / "race-configs-fresh"
    other = [*FIT[:2], "--tol", "1e-3", *FIT[4:]]
    assert FIT[2:4] == ["--tol", "1e-2"]
    assert cli("fit", t.data, "--out", d, *other)[0] == 0
    race(t, "race-configs", [FIT, other], references=[t.ref, embedding(d)])


# --------------------------------------------------------------------------- a full disk
def private_mount_namespace() -> list[str] | None:
    """``unshare`` arguments for a private mount namespace where a tmpfs can be mounted."""
    for cmd in (["unshare", "--mount", "--propagation", "private"], ["unshare", "-rm"]):
        try:
            ok = subprocess.run([*cmd, "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"],
                                capture_output=True, timeout=30, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return cmd
    return None


STATUS = """
import json, os, sys
out = sys.argv[1]
try:
    with open(os.path.join(out, "zarr.json")) as f:
        status = json.load(f)["attributes"]["ooc_spectral_run"]["status"]
except FileNotFoundError:
    status = "no run"
except Exception as exc:
    status = f"zarr.json unreadable ({type(exc).__name__})"
print(status, "with" if os.path.exists(os.path.join(out, "report.json")) else "without",
      "report.json")
"""


def full_disk(t: Trials, free_part: float):
    """OUTDIR on a tmpfs (in a private mount namespace) filled but for ``free_part`` of what
    the output takes: the fit stops naming the disk, OUTDIR does not say complete; the same
    command after the filler is deleted gives the fresh result."""
    name = f"full-disk-{round(free_part * 100)}"
    d = t.case(name)
    if UNSHARE is None:
        t.record(name, "OUTDIR on a full tmpfs", 0, "", "not run: no private mount namespace "
                 "(unshare) to mount a tmpfs in", "-")
        return
    need = sum(-(-p.stat().st_size // 4096) * 4096 for p in t.fresh.rglob("*") if p.is_file())
    free = int(need * free_part) // 4096 * 4096
    size = need + (1 << 20)
    py = shlex.join([sys.executable, "-m", "ooc_spectral"])
    fit = shlex.join(["fit", str(t.data), "--out", "mnt/out", *FIT])
    (d / "mnt").mkdir()
    script = f"""
mount -t tmpfs -o size={size} adversarial mnt || exit 99
head -c {size - free} /dev/zero > mnt/filler 2> /dev/null
{py} {fit} 2> err1.txt; echo $? > code1.txt
{py} verify mnt/out > /dev/null 2> verify.txt; echo $? > vcode.txt
{shlex.quote(sys.executable)} -c {shlex.quote(STATUS)} mnt/out > status.txt
rm mnt/filler
{py} {fit} 2> err2.txt; echo $? > code2.txt
ls -A mnt > listing.txt
cp -r mnt/out out
"""
    t0 = time.time()
    try:
        proc = subprocess.run([*UNSHARE, "sh", "-c", script], cwd=d, capture_output=True,
                              text=True, timeout=3 * BOUND, check=False)
    except subprocess.TimeoutExpired:
        t.record(name, "OUTDIR on a full tmpfs", 124, "hang", "UNSAFE: a hang", "-")
        return
    assert proc.returncode != 99, proc.stderr

    def read(f):
        return " ".join((d / f).read_text().split()) if (d / f).exists() else ""

    code1, code2, vcode = int(read("code1.txt")), int(read("code2.txt")), int(read("vcode.txt"))
    status, msg = read("status.txt"), read("err1.txt")
    what = (f"OUTDIR on a tmpfs with {free // 1024} KiB free of the {need // 1024} KiB the output "
            f"takes: then {status}, verify exit {vcode}; the filler deleted, the same command")
    answer = f"exit {code1}, then {code2} ({time.time() - t0:.0f} s)"
    if code1 == 0:
        t.record(name, what, code1, msg, "UNSAFE: exit 0 on a full disk", answer)
    elif code1 == 124 or "space" not in msg:
        t.record(name, what, code1, msg, "UNSAFE: the disk is not named", answer)
    elif status.startswith("complete") or "without" not in status:
        t.record(name, what, code1, msg, "UNSAFE: the output looks complete", answer)
    elif read("listing.txt") != "out":
        t.record(name, what, code1, msg, f"UNSAFE: the disk holds {read('listing.txt')}",
                 answer)
    else:
        same = code2 == 0 and np.array_equal(embedding(d / "out"), t.ref)
        t.record(name, what, code1, msg if same else read("err2.txt"),
                 "safe: stopped" if same else "UNSAFE: the rerun gave another answer", answer)


UNSHARE: list[str] | None = None


# --------------------------------------------------------------------------- the watchdog
class Cluster:
    """A dask scheduler and workers, each its own process (SIGSTOP, SIGKILL at will)."""

    def __init__(self, d: Path):
        self.d = d
        d.mkdir()
        self.procs: list[subprocess.Popen] = []
        sched = d / "scheduler.json"
        self.scheduler = self._start(["scheduler", "--scheduler-file", sched, "--port", "0",
                                      "--no-dashboard"])
        deadline = time.time() + 120
        while not sched.exists():
            assert time.time() < deadline and self.scheduler.poll() is None
            time.sleep(0.1)
        time.sleep(0.5)
        self.address = json.loads(sched.read_text())["address"]

    def _start(self, args, env=None):
        p = subprocess.Popen([DASK, *map(str, args)], cwd=self.d, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True,
                             env=None if env is None else {**os.environ, **env})
        self.procs.append(p)
        return p

    def worker(self, env=None) -> subprocess.Popen:
        from distributed import Client

        w = self._start(["worker", self.address, "--nthreads", "1", "--no-nanny",
                         "--no-dashboard", "--memory-limit", "2GiB"], env)
        n = sum(p.poll() is None for p in self.procs) - 1  # the live workers
        with Client(self.address, timeout=60) as c:
            c.wait_for_workers(n, timeout=120)
        return w

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


DASK = shutil.which("dask") or "dask"
CFIT = [a for a in FIT if a not in ("--engine", "threads")]
assert len(CFIT) == len(FIT) - 2


def cluster_reference(t: Trials):
    if getattr(t, "cluster_ref", None) is None:
        c = Cluster(t.work / "cluster-fresh-cluster")
        try:
            c.worker()
            code, msg = cli("fit", t.data, "--out", t.work / "cluster-fresh", *CFIT,
                            "--scheduler", c.address)
            assert code == 0, msg
        finally:
            c.close()
        t.cluster_ref = embedding(t.work / "cluster-fresh")
    return t.cluster_ref


def in_pass2(out: Path) -> bool:
    return (out / "checkpoint" / "partials").exists()


def watchdog(t: Trials, name: str, what: str, env: dict, needle: str, *, worker_env=None,
             act=None, when=in_pass2, heal=None, bound=BOUND):
    """A fit on a scheduler and one worker of this script's; ``act(cluster, fit)`` done
    when ``when(out)`` (or before the fit when ``when`` is None); the fit must end within
    ``bound`` naming ``needle``; ``heal(cluster)``, then the same command."""
    ref = cluster_reference(t)
    d = t.case(name)
    out = d / "out"
    c = Cluster(t.work / f"{name}-cluster")
    try:
        c.worker(worker_env)
        args = ["fit", t.data, "--out", out, *CFIT, "--scheduler", c.address]
        before = snapshot(d, skip=out)
        if when is None:
            act(c, None)
        proc = cli(*args, wait=False, cwd=d, env={**os.environ, **env})
        if when is not None:
            deadline = time.time() + BOUND
            while proc.poll() is None and not when(out) and time.time() < deadline:
                time.sleep(0.002)
            act(c, proc)
        first = timed(proc, bound)
        if heal is not None:
            heal(c)
        rerun = cli(*args, cwd=d)
        if snapshot(d, skip=out) != before:
            t.record(name, what, first[0], first[1], "UNSAFE: a write outside OUTDIR")
            return
        t.stopped(name, what, first, rerun, out, ref, needle, bound)
    finally:
        c.close()


def stop(which):
    def act(c: Cluster, _):
        p = c.scheduler if which == "scheduler" else c.procs[-1]
        os.killpg(p.pid, signal.SIGSTOP)
    return act


def cont(which):
    def heal(c: Cluster):
        p = c.scheduler if which == "scheduler" else c.procs[1]
        os.killpg(p.pid, signal.SIGCONT)
    return heal


def kill_worker(c: Cluster, _):
    os.killpg(c.procs[-1].pid, signal.SIGKILL)


def new_worker(c: Cluster):
    for p in c.procs[1:]:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    c.worker()


# --------------------------------------------------------------------------- object storage
BUCKET = "adversary"
S3_KEY, S3_SECRET = "AKIAADVERSARY0000000", "adversary-secret-never-shown"
AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION")


class _Throttle:
    """WSGI middleware of the moto server: once ``needle`` is set, each PUT whose path
    holds it waits 50 ms, and the first one sets ``seen`` (a kill then lands mid-write)."""

    def __init__(self, app):
        self.app, self.needle, self.seen = app, None, threading.Event()

    def __call__(self, environ, start_response):
        needle = self.needle
        if needle and environ.get("REQUEST_METHOD") == "PUT" and \
                needle in environ.get("PATH_INFO", ""):
            self.seen.set()
            time.sleep(0.05)
        return self.app(environ, start_response)


class S3:
    """moto's S3 server on 127.0.0.1 (a thread of this script); this script and its
    commands reach it through the standard AWS variables; the trials' data set in a bucket."""

    def __init__(self, t: Trials):
        import logging

        import s3fs
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        self.throttle = _Throttle(self.server._server.app)
        self.server._server.app = self.throttle
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.saved = {k: os.environ.get(k) for k in AWS_VARS}
        os.environ.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID=S3_KEY,
                          AWS_SECRET_ACCESS_KEY=S3_SECRET, AWS_DEFAULT_REGION="us-east-1")
        SECRETS.extend([S3_KEY, S3_SECRET])
        s3fs.S3FileSystem.clear_instance_cache()
        self.fs = s3fs.S3FileSystem()
        self.fs.mkdir(BUCKET)
        self.fs.put(str(t.data), f"{BUCKET}/data.zarr", recursive=True)
        assert self.fs.exists(f"{BUCKET}/data.zarr/data/zarr.json")
        self.data = self.url("data.zarr")
        self.fresh = self.url("fresh")
        code, msg = cli("fit", self.data, "--out", self.fresh, *FIT, cwd=t.work)
        assert code == 0, msg
        self.ref = embedding(self.fresh)

    def url(self, name: str) -> str:
        return f"s3://{BUCKET}/{name}"

    def objects(self) -> dict:
        self.fs.invalidate_cache()
        return {k: v.get("ETag") for k, v in self.fs.find(BUCKET, detail=True).items()}

    def outside(self, name: str) -> dict:
        return {k: v for k, v in self.objects().items() if not k.startswith(f"{BUCKET}/{name}/")}

    def close(self):
        import s3fs

        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        s3fs.S3FileSystem.clear_instance_cache()
        self.server.stop()


def s3_fit(t: Trials, s3: S3):
    t.identical("s3-fit", "input and OUTDIR on s3:// at moto's server: the local fresh run's "
                "result", 0, "", s3.fresh)


def s3_kill(t: Trials, s3: S3, name: str, member: str, what: str):
    d = t.case(name)
    out = s3.url(name)
    before = s3.outside(name)
    s3.throttle.seen.clear()
    s3.throttle.needle = f"/{BUCKET}/{name}/{member}"
    try:
        proc = cli("fit", s3.data, "--out", out, *FIT, wait=False, cwd=d)
        deadline = time.time() + BOUND
        while proc.poll() is None and not s3.throttle.seen.wait(0.01) and time.time() < deadline:
            pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    finally:
        s3.throttle.needle = None
    code, msg = cli("fit", s3.data, "--out", out, *FIT, cwd=d)
    if s3.outside(name) != before or list(d.iterdir()):
        t.record(name, what, code, msg, "UNSAFE: a write outside OUTDIR")
        return
    t.identical(name, f"SIGKILL while {what} is written to s3://, then the same command",
                code, msg, out, s3.ref)


def s3_deleted(t: Trials, s3: S3, name: str, member: str):
    out = s3.url(name)
    s3.fs.copy(f"{BUCKET}/fresh", f"{BUCKET}/{name}", recursive=True)
    s3.fs.rm(f"{BUCKET}/{name}/{member}", recursive=True)
    s3.fs.invalidate_cache()
    vcode, vmsg = cli("verify", out)
    code, msg = cli("fit", s3.data, "--out", out, *FIT)
    after, _ = cli("verify", out)
    what = f"the object {member} of an s3:// OUTDIR deleted: verify exit {vcode}"
    if vcode == 0 or after != 0:
        t.record(name, what + f", rerun, verify exit {after}", vcode, vmsg,
                 "UNSAFE: verify called it intact" if vcode == 0 else "UNSAFE")
        return
    t.identical(name, what + ", the rerun restores it, verify exit 0", code, msg, out, s3.ref)


def s3_unreachable(t: Trials, s3: S3, kind: str):
    """The endpoint closed or silent, or keys the server does not know: the fit ends, names
    the cause, writes nothing; with the right endpoint and keys the same command."""
    import socket

    from moto import settings

    name = f"s3-{kind}"
    d = t.case(name)
    out = s3.url(name)
    env = dict(os.environ)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    if kind == "silent-endpoint":
        srv.listen(64)  # accepts connections (the kernel does), never answers
        what = "AWS_ENDPOINT_URL a port that accepts and never answers"
    else:
        srv.close()  # nothing listens there
        what = "AWS_ENDPOINT_URL a port where nothing listens"
    if kind.endswith("endpoint"):
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{port}"
        needle = f"127.0.0.1:{port}"
    else:  # unknown-keys
        what, needle = "keys the server does not know (moto's authentication on)", ""
    before = s3.outside(name)
    if kind == "unknown-keys":
        settings.INITIAL_NO_AUTH_ACTION_COUNT = 0  # every request is checked from now on
    try:
        first = timed(cli("fit", s3.data, "--out", out, *FIT, wait=False, cwd=d, env=env),
                      BOUND)
    finally:
        settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")
        srv.close()
    written = [k for k in s3.objects() if k.startswith(f"{BUCKET}/{name}/")]
    rerun = cli("fit", s3.data, "--out", out, *FIT, cwd=d)
    if s3.outside(name) != before or list(d.iterdir()) or written:
        t.record(name, what, first[0], first[1], "UNSAFE: a write" + (
            f" at the server ({len(written)} objects)" if written else " outside OUTDIR"))
        return
    t.stopped(name, what + "; then the right one, the same command", first, rerun, out,
              s3.ref, needle)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--only", default="", help="run only the trials whose name holds this "
                    "(or one of these, comma-separated)")
    ap.add_argument("--shard", default="0/1", help="K/N: run only every N-th trial from the "
                    "K-th (N processes share the trials; --merge joins their tables)")
    ap.add_argument("--merge", nargs="*", default=None, metavar="TABLE",
                    help="join the tables of shards into --out's adversarial.md, in the "
                    "trials' order (a trial in several: the last table's row), and run nothing")
    ap.add_argument("--first", default="", help="run the trials whose name holds one of "
                    "these (comma-separated) before the others")
    ap.add_argument("--skip-done", nargs="*", default=[], metavar="TABLE",
                    help="skip the trials that have a row in these tables")
    args = ap.parse_args(argv)
    shard, shards = (int(v) for v in args.shard.split("/"))
    work = Path(tempfile.mkdtemp(prefix="adversarial-"))
    t = Trials(work) if args.merge is None else None
    trials = [
        ("kill-begun", lambda: kill_at(t, "kill-begun", "begun")),
        ("kill-pass2", lambda: kill_at(t, "kill-pass2", "pass2")),
        ("kill-pass3", lambda: kill_at(t, "kill-pass3", "pass3")),
        ("sigterm", lambda: sigterm_then_rerun(t)),
        ("sigusr1", lambda: sigterm_then_rerun(t, signal.SIGUSR1)),
        ("sigusr2", lambda: sigterm_then_rerun(t, signal.SIGUSR2)),
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
        ("race-same", lambda: race(t, "race-same", [FIT, FIT])),
        ("race-configs", lambda: race_configs(t)),
        ("full-disk-5", lambda: full_disk(t, 0.05)),
        ("full-disk-50", lambda: full_disk(t, 0.5)),
        ("full-disk-95", lambda: full_disk(t, 0.95)),
        ("wd-worker-paused", lambda: watchdog(
            t, "wd-worker-paused", "the only worker paused at its memory limit from the start "
            "(pause fraction 0.01), paused-timeout 5 s; then a new worker, the same command",
            {"DASK_OOC_SPECTRAL__PAUSED_TIMEOUT": "5s"}, "paused at its memory limit",
            worker_env={"DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "0.01",
                        "DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "False",
                        "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False"},
            act=lambda c, p: None, when=None, heal=new_worker)),
        ("wd-worker-stopped", lambda: watchdog(
            t, "wd-worker-stopped", "the only worker SIGSTOPped in pass 2, stall-timeout 10 s; "
            "then SIGCONT, the same command", {"DASK_OOC_SPECTRAL__STALL_TIMEOUT": "10s"},
            "no part finished", act=stop("worker"), heal=cont("worker"))),
        ("wd-worker-killed", lambda: watchdog(
            t, "wd-worker-killed", "the only worker SIGKILLed in pass 2, no-workers-timeout 5 s;"
            " then a new worker, the same command",
            {"DASK_OOC_SPECTRAL__NO_WORKERS_TIMEOUT": "5s"}, "no dask worker",
            act=kill_worker, heal=new_worker)),
        ("wd-scheduler-stopped-before", lambda: watchdog(
            t, "wd-scheduler-stopped-before", "--scheduler a SIGSTOPped scheduler (connect "
            "timeout 30 s, the default); then SIGCONT, the same command", {},
            "no dask handshake", act=stop("scheduler"), when=None, heal=cont("scheduler"))),
        ("wd-scheduler-stopped", lambda: watchdog(
            t, "wd-scheduler-stopped", "the scheduler SIGSTOPped in pass 2, stall-timeout 10 s; "
            "then SIGCONT, the same command", {"DASK_OOC_SPECTRAL__STALL_TIMEOUT": "10s"}, "",
            act=stop("scheduler"), heal=cont("scheduler"), bound=240)),
        ("s3-fit", lambda: s3_fit(t, s3())),
        ("s3-kill-pass2", lambda: s3_kill(t, s3(), "s3-kill-pass2", "checkpoint/partials/",
                                          "a checkpoint part of pass 2")),
        ("s3-kill-model", lambda: s3_kill(t, s3(), "s3-kill-model", "model/", "the model")),
        ("s3-kill-pass3", lambda: s3_kill(t, s3(), "s3-kill-pass3", "embedding/c/",
                                          "an embedding chunk (pass 3)")),
        ("s3-deleted-chunk", lambda: s3_deleted(t, s3(), "s3-deleted-chunk", "embedding/c/1/0")),
        ("s3-deleted-report", lambda: s3_deleted(t, s3(), "s3-deleted-report", "report.json")),
        ("s3-race", lambda: race(t, "s3-race", [FIT, FIT], out=s3().url("s3-race"),
                                 data=s3().data, references=[s3().ref, s3().ref])),
        ("s3-closed-endpoint", lambda: s3_unreachable(t, s3(), "closed-endpoint")),
        ("s3-silent-endpoint", lambda: s3_unreachable(t, s3(), "silent-endpoint")),
        ("s3-unknown-keys", lambda: s3_unreachable(t, s3(), "unknown-keys")),
    ]
    for sub in ("matrix", "places"):
        (work / sub).mkdir()
    kit = types.SimpleNamespace(s3=lambda: s3(), Cluster=Cluster, unshare=None, NotRun=NotRun)
    trials += matrix_trials(t, work / "matrix") + place_trials(t, work / "places", kit)
    if args.merge is not None:
        shutil.rmtree(work, ignore_errors=True)
        return merge_tables([Path(f) for f in args.merge], Path(args.out),
                            [name for name, _ in trials])
    done = {row[0] for table in args.skip_done for row in table_rows(Path(table))}
    first = [part for part in args.first.split(",") if part]
    trials = sorted((tr for tr in trials if tr[0] not in done and
                     any(part in tr[0] for part in args.only.split(","))),
                    key=lambda tr: not any(part in tr[0] for part in first))[shard::shards]
    servers: list[S3] = []

    def s3() -> S3:
        if not servers:
            try:
                import moto.server  # noqa: F401
                import s3fs  # noqa: F401
            except ImportError as exc:
                raise NotRun(f"moto's server and s3fs are needed ({exc})") from None
            servers.append(S3(t))
        return servers[0]

    global UNSHARE
    UNSHARE = kit.unshare = private_mount_namespace()
    t0_all = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for name, trial in trials:
            t0 = time.time()
            try:
                trial()
            except NotRun as exc:
                t.record(name, "-", 0, "", f"not run: {exc}", "-")
            except Exception as exc:  # the trial's own set-up failed
                t.record(name, "trial set-up failed", -1, f"{type(exc).__name__}: {exc}",
                         "UNSAFE: not run")
            t.rows[-1] = (name, *t.rows[-1][1:])  # the row under the trial's name (--only's)
            print(f"{name}: {t.rows[-1][3]} ({time.time() - t0:.0f} s)", file=sys.stderr)
            write_table(t.rows, time.time() - t0_all, out, final=False)
    finally:
        for server in servers:
            server.close()
    table, unsafe = write_table(t.rows, time.time() - t0_all, out, final=True)
    print(table)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if unsafe else 0


def write_table(rows, seconds: float, out: Path, final: bool) -> tuple[str, int]:
    """Write ``adversarial.md`` (after every trial, so that an interrupted run keeps the
    rows it made: its last line then says so); ``(table, number of UNSAFE rows)``."""
    lines = ["| trial | what was done | answer | outcome |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    safe = sum(r[3].startswith("safe") for r in rows)
    unsafe = sum(r[3].startswith("UNSAFE") for r in rows)
    lines += ["", (f"{len(rows)} trials: {safe} safe, {unsafe} UNSAFE, "
                   f"{len(rows) - safe - unsafe} not run ({seconds:.0f} s)"
                   + ("." if final else "; the run had not finished.")), ""]
    table = "\n".join(lines)
    (out / "adversarial.md").write_text(table)
    return table, unsafe


def table_rows(table: Path) -> list[tuple[str, ...]]:
    """The rows ``(trial, what, answer, outcome)`` of an ``adversarial.md``."""
    return [tuple(c.strip() for c in line.strip().strip("|").split(" | ", 3))
            for line in table.read_text().splitlines()[2:] if line.startswith("| ")]


def merge_tables(tables: list[Path], out: Path, names: list[str]) -> int:
    """Join the tables of several runs (``--shard``, ``--skip-done``) in the trials' order
    ``names``, a trial run twice taking its last table's row, a trial in none listed as not
    run; the seconds are the runs' sum. Exit 1 when a row is UNSAFE."""
    rows, seconds, unfinished = {}, 0.0, False
    for table in tables:
        rows.update((row[0], row) for row in table_rows(table))
        m = re.search(r"\((\d+) s\)", table.read_text().strip().splitlines()[-1])
        seconds += float(m.group(1)) if m else 0.0
    missing = [n for n in names if n not in rows]
    ordered = [rows.get(n, (n, "-", "-", "not run: not reached in the time the run had"))
               for n in names] + [r for n, r in rows.items() if n not in set(names)]
    out.mkdir(parents=True, exist_ok=True)
    table, unsafe = write_table(ordered, seconds, out, final=not missing)
    print(table)
    return 1 if unsafe else 0


class NotRun(Exception):
    """What a trial needs is not on this machine (the row says what)."""


if __name__ == "__main__":
    sys.exit(main())
