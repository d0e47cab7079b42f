"""Every command that writes an output, tried as an adversary would (issue 52).

For each command (``fit``, ``transform``, the update with appended rows, ``--affinity
representatives`` fit and transform, ``import``, ``make-data``, a workflow of a fit step
and a transform step):

- a kill at each of its stages (SIGKILL of the process group, SIGTERM, SIGINT and SIGHUP
  of the process), then the same command;
- damage of each member of its complete output (a chunk flipped, deleted, copied over
  another chunk of the same array; a member deleted; a description edited), then
  ``verify`` and the same command;
- a member from another run of the same command (another seed, another input);
- the input changed before the rerun (between runs) and while the command reads it (the
  process stopped with SIGSTOP at a stage, every row rewritten, SIGCONT).

Each outcome is judged by :func:`judge`: safe is exit 0 with the result of a fresh run
(bit for bit) and ``verify`` exit 0, or a non-zero exit with a one-line message and
nothing that looks complete; anything else (a plausible wrong answer with exit 0, a
death by a signal, a hang) is UNSAFE.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import zarr

BOUND = 600
PY = [sys.executable, "-m", "ooc_spectral"]
FIT = ["--gamma", "0.05", "--tol", "1e-2", "--n-components", "2", "--engine", "threads",
       "--threads-per-worker", "1", "--chunk-rows", "400", "--checkpoint-every", "1", "-q"]
REPS = ["--affinity", "representatives", "--n-clusters", "3", "--n-representatives", "60",
        "--engine", "threads", "--threads-per-worker", "1", "--chunk-rows", "400", "-q"]
ROWS, CHUNK = 4000, 400


def run(argv, cwd=None, timeout=BOUND) -> tuple[int, str]:
    try:
        p = subprocess.run([*PY, *map(str, argv)], capture_output=True, text=True,
                           timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return 124, "hang"
    return p.returncode, " ".join(p.stderr.split())


def start(argv, cwd=None) -> subprocess.Popen:
    return subprocess.Popen([*PY, *map(str, argv)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=cwd,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout=BOUND) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return 124, "hang"
    return proc.returncode, " ".join(err.split())


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_attrs(out: Path) -> dict:
    meta = _json(out / "zarr.json") or {}
    return (meta.get("attributes") or {}).get("ooc_spectral_run") or {}


def has_chunk(arr: Path) -> bool:
    c = arr / "c"
    return c.is_dir() and any(p.is_file() and p.stat().st_size for p in c.rglob("*"))


def attr_in(path: Path, key: str) -> bool:
    meta = _json(path / "zarr.json") or {}
    return key in (meta.get("attributes") or {})


def chunks(arr: Path) -> list[Path]:
    return sorted(p for p in (arr / "c").rglob("*") if p.is_file())


def flip(path: Path) -> None:
    b = bytearray(path.read_bytes())
    b[len(b) // 2] ^= 0x10
    path.write_bytes(bytes(b))


def rm(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def edit_json(path: Path, edit) -> None:
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def read(out, names) -> dict | None:
    try:
        return {n: zarr.open_array(str(Path(out) / n), mode="r")[...] for n in names}
    except Exception:
        return None


def same(a: dict | None, b: dict | None) -> bool:
    return a is not None and b is not None and a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and np.array_equal(a[k], b[k]) for k in a)


def producers_group(path: Path) -> Path:
    """The data set at ``path`` made its producer's own zarr group (the same arrays, without
    make-data's description and digests): the input a producer rewrites or appends to. (Rows
    of a make-data data set changed afterwards are damage, which the fit refuses: the
    trial ``data-set-damaged-under-fit``.)"""
    group = zarr.open_group(str(path), mode="r+")
    group.attrs.put({k: v for k, v in group.attrs.items()
                     if k not in ("ooc_spectral_dataset", "ooc_spectral_import")})
    return path


def rewrite_zarr(inp: Path) -> None:
    """Every row of the input rewritten (another order, another scale): a new input."""
    arr = zarr.open_group(str(inp), mode="r+")["data"]
    arr[...] = arr[...][::-1] * 1.25


# --------------------------------------------------------------------------- the commands
@dataclass
class Command:
    """One command, as the trials drive it."""

    name: str
    argv: Callable[[Path, Path], list]            # (input, out) -> arguments
    results: tuple[str, ...]                      # the arrays its output holds
    stages: dict[str, Callable[[Path], bool]]     # stage -> reached? (from OUTDIR's files)
    damage: dict[str, Callable[[Path], None]]     # member damage -> act on OUTDIR
    foreign: dict[str, Callable[[Path, Path], None]] = field(default_factory=dict)
    input_kind: str | None = "zarr"               # "zarr", "npy" or None (make-data)
    change: Callable[[Path], None] = rewrite_zarr
    after_damage: str = "fresh"                   # what the repair equals: "fresh" or "refit"
    other_argv: Callable[[Path, Path], list] | None = None  # the run a foreign member is from


def embedding_damage(arr="embedding", markers="embedding_written") -> dict:
    return {
        f"{arr} chunk flipped": lambda o: flip(chunks(o / arr)[1]),
        f"{arr} chunk deleted": lambda o: chunks(o / arr)[1].unlink(),
        f"{arr} chunk copied over another of the same array": lambda o: shutil.copyfile(
            chunks(o / arr)[0], chunks(o / arr)[2]),
        f"{arr} deleted": lambda o: rm(o / arr),
        f"{arr}/zarr.json deleted": lambda o: rm(o / arr / "zarr.json"),
        f"{markers} deleted": lambda o: rm(o / markers),
        f"{markers} chunk deleted": lambda o: chunks(o / markers)[1].unlink(),
    }


def edit_run_config(o: Path) -> None:
    """A number of the run's recorded configuration (OUTDIR/zarr.json) changed."""
    def change(meta):
        def first_number(d):
            for k, v in d.items():
                if isinstance(v, dict):
                    if first_number(v):
                        return True
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    d[k] = v * 2 + 1
                    return True
            return False
        first_number(meta["attributes"]["ooc_spectral_run"]["config"])
    edit_json(o / "zarr.json", change)


REPORT_DAMAGE = {
    "zarr.json run configuration edited": edit_run_config,
    "report.json deleted": lambda o: rm(o / "report.json"),
    "report.json edited (n_samples)": lambda o: edit_json(
        o / "report.json", lambda r: r.update(n_samples=r.get("n_samples", 0) + 1)),
}


#: A data set's damage (make-data, import).
DATA_DAMAGE = {
    "data chunk flipped": lambda o: flip(chunks(o / "data")[1]),
    "data chunk deleted": lambda o: chunks(o / "data")[1].unlink(),
    "data chunk copied over another": lambda o: shutil.copyfile(chunks(o / "data")[0],
                                                                chunks(o / "data")[2]),
}


def model_damage(name="model", key="ooc_spectral_model", field_name="gamma") -> dict:
    def edit(o):
        def change(meta):
            d = meta["attributes"][key]
            if field_name in d:
                d[field_name] = d[field_name] + 1 if isinstance(d[field_name], int) else 0.5
            else:
                d[field_name] = 1
        edit_json(o / name / "zarr.json", change)
    first = {"model": "components", "representatives_model": "centers"}[name]
    return {f"{name} chunk flipped": lambda o: flip(chunks(o / name / first)[0]),
            f"{name} chunk deleted": lambda o: chunks(o / name / first)[0].unlink(),
            f"{name} description edited ({field_name})": edit,
            f"{name} deleted": lambda o: rm(o / name)}


def checkpoint_damage() -> dict:
    def part_chunk(o):
        return next(p for p in sorted((o / "checkpoint").rglob("*"))
                    if p.is_file() and p.name != "zarr.json" and "partials" in p.parts)
    return {"checkpoint part chunk deleted": lambda o: part_chunk(o).unlink(),
            "checkpoint part chunk flipped": lambda o: flip(part_chunk(o))}


def swap(member):
    def act(out: Path, other: Path):
        rm(out / member)
        shutil.copytree(other / member, out / member)
    return act


def chunk_with_marker(out: Path, other: Path):
    """A chunk and its written-marker copied from another run's output."""
    shutil.copyfile(chunks(other / "embedding")[1], chunks(out / "embedding")[1])
    shutil.copyfile(chunks(other / "embedding_written")[1], chunks(out / "embedding_written")[1])


def fit_stages():
    return {
        "begun": lambda o: bool(run_attrs(o)),
        "scan": lambda o: attr_in(o / "checkpoint", "scan"),
        "pass 2": lambda o: any(attr_in(p, "partial") for p in
                                (o / "checkpoint" / "partials").glob("*")),
        "pass 3": lambda o: has_chunk(o / "embedding_written"),
        "model": lambda o: attr_in(o / "model", "ooc_spectral_model"),
        "report": lambda o: (o / "report.json").exists(),
    }


def write_stages(markers="embedding_written"):
    return {"begun": lambda o: bool(run_attrs(o)),
            "write-back": lambda o: has_chunk(o / markers),
            "report": lambda o: (o / "report.json").exists()}


def commands(work: Path) -> dict[str, Command]:
    """The commands (specifications only); ``work/model`` and ``work/model-reps`` are the
    fit OUTDIRs the transforms apply (made by :class:`Matrix`)."""
    fit = Command(
        "fit", lambda i, o: ["fit", i, "--out", o, *FIT], ("embedding",), fit_stages(),
        {**embedding_damage(), **model_damage(), **REPORT_DAMAGE, **checkpoint_damage()},
        {"model from a fit with another seed": swap("model"),
         "embedding (and markers) from a fit with another seed": lambda o, x: (
             swap("embedding")(o, x), swap("embedding_written")(o, x)),
         "a chunk and its marker from a fit with another seed": chunk_with_marker,
         "report.json from a fit with another seed": lambda o, x: shutil.copyfile(
             x / "report.json", o / "report.json")},
        other_argv=lambda i, o: ["fit", i, "--out", o, *FIT, "--seed", "5",
                                 "--selection", "rpcholesky",
                                 "--dictionary-size", "40"])
    transform = Command(
        "transform", lambda i, o: ["transform", work / "model", i, "--out", o, "--chunk-rows",
                                   CHUNK, "--engine", "threads", "--threads-per-worker", "1",
                                   "-q"],
        ("embedding",), write_stages(), {**embedding_damage(), **REPORT_DAMAGE},
        {"embedding (and markers) from a transform of other rows": lambda o, x: (
            swap("embedding")(o, x), swap("embedding_written")(o, x)),
         "a chunk and its marker from a transform of other rows": chunk_with_marker},
        other_argv="other-input")
    reps = Command(
        "fit-representatives", lambda i, o: ["fit", i, "--out", o, *REPS],
        ("embedding", "labels"),
        {"begun": lambda o: bool(run_attrs(o)),
         "bipartite pass": lambda o: any(attr_in(p, "partial") for p in
                                         (o / "checkpoint" / "partials").glob("*")),
         "write-back": lambda o: has_chunk(o / "labels_written"),
         "model": lambda o: attr_in(o / "representatives_model", "ooc_spectral_representatives"),
         "report": lambda o: (o / "report.json").exists()},
        {**embedding_damage("labels", "labels_written"),
         "embedding chunk flipped": lambda o: flip(chunks(o / "embedding")[1]),
         **model_damage("representatives_model", "ooc_spectral_representatives", "n_neighbors"),
         **REPORT_DAMAGE},
        {"representatives_model from a fit with another seed": swap("representatives_model"),
         "labels (and markers) from a fit with another seed": lambda o, x: (
             swap("labels")(o, x), swap("labels_written")(o, x))},
        other_argv=lambda i, o: ["fit", i, "--out", o, *REPS, "--seed", "5"])
    reps_t = Command(
        "transform-representatives",
        lambda i, o: ["transform", work / "model-reps", i, "--out", o, "--engine", "threads",
                      "--threads-per-worker", "1", "-q"],
        ("embedding", "labels"), write_stages("labels_written"),
        {**embedding_damage("labels", "labels_written"), **REPORT_DAMAGE,
         "embedding deleted": lambda o: rm(o / "embedding")},
        {"labels (and markers) from a transform of other rows": lambda o, x: (
            swap("labels")(o, x), swap("labels_written")(o, x))},
        other_argv="other-input")
    update = Command(
        "update", lambda i, o: ["fit", i, "--out", o, *FIT], ("embedding",),
        {"solve": lambda o: (run_attrs(o).get("update") or {}).get("phase") == "solve",
         "model": lambda o: (run_attrs(o).get("update") or {}).get("phase") == "write",
         "pass 3": lambda o: (run_attrs(o).get("update") or {}).get("phase") == "write"
         and has_chunk(o / "embedding_written"),
         "report": lambda o: bool(run_attrs(o).get("last_update"))},
        {**{k: v for k, v in embedding_damage().items() if "deleted" in k},
         **model_damage(), **REPORT_DAMAGE},
        after_damage="refit")
    importing = Command(
        "import", lambda i, o: ["import", i, "--out", o, "--chunk-rows", CHUNK, "-q"], ("data",),
        {"begun": lambda o: attr_in(o, "ooc_spectral_import"),
         "writing": lambda o: (o / "data" / "c" / "2" / "0").exists()},
        {**DATA_DAMAGE, "data/zarr.json deleted": lambda o: rm(o / "data" / "zarr.json")},
        input_kind="npy", change=lambda i: np.save(i, np.load(i)[::-1] * 1.25))
    make = Command(
        "make-data", lambda i, o: ["make-data", "swiss-roll", "--n", ROWS, "--out", o,
                                   "--chunk-rows", CHUNK, "-q"], ("data", "t"),
        {"begun": lambda o: attr_in(o, "ooc_spectral_dataset"),
         "writing": lambda o: (o / "data" / "c" / "1" / "0").exists()},
        {**DATA_DAMAGE, "t chunk flipped": lambda o: flip(chunks(o / "t")[1])},
        input_kind=None)
    workflow = Command(
        "workflow", workflow_argv, ("embedding",),
        {"fit step begun": lambda o: bool(run_attrs(o.parent / f"{o.name}-fit")),
         "fit step pass 3": lambda o: has_chunk(o.parent / f"{o.name}-fit" / "embedding_written"),
         "transform step": lambda o: has_chunk(o / "embedding_written"),
         "report": lambda o: (o / "report.json").exists()},
        {})  # its steps' outputs damaged: adversary_places' workflow-damage
    return {c.name: c for c in (fit, transform, reps, reps_t, update, importing, make,
                                workflow)}


def workflow_argv(inp: Path, out: Path) -> list:
    """``ooc-spectral run`` of a workflow file beside ``out`` (its root): a fit step into
    ``OUT-fit``, then a transform step of ``inp`` with that model into ``out``."""
    flow = out.parent / f"{out.name}.toml"
    if not flow.exists():
        flow.write_text(
            f'[[step]]\nrun = "fit"\ninput = "{inp.name}"\nout = "{out.name}-fit"\n'
            'gamma = 0.05\ntol = 0.01\nn_components = 2\nengine = "threads"\n'
            'threads_per_worker = 1\nchunk_rows = 400\ncheckpoint_every = 1\n\n'
            f'[[step]]\nrun = "transform"\nmodel = "{out.name}-fit"\ninput = "{inp.name}"\n'
            f'out = "{out.name}"\nchunk_rows = 400\nengine = "threads"\n'
            'threads_per_worker = 1\n')
    return ["run", flow, "-q"]


# --------------------------------------------------------------------------- the trials
class Matrix:
    """The trials of :func:`commands`, recorded through ``t.record`` (adversarial.Trials)."""

    def __init__(self, t, work: Path):
        self.t, self.work = t, work
        self.cmds = commands(work)
        self.refs: dict[str, dict] = {}
        base, self.extra = work / "base.zarr", work / "extra.zarr"
        for path, seed in ((base, "0"), (self.extra, "3")):
            assert run(["make-data", "swiss-roll", "--n", ROWS, "--out", path, "--chunk-rows",
                        CHUNK, "--seed", seed, "-q"])[0] == 0
            producers_group(path)  # the trials rewrite and append to copies of it
        assert run(["fit", base, "--out", work / "model", *FIT])[0] == 0
        assert run(["fit", base, "--out", work / "model-reps", *REPS])[0] == 0

    # -- inputs and references
    def prepare(self, cmd: Command, d: Path) -> tuple[Path, Path]:
        """``(input, out)`` for a trial in ``d``: the input copied (an update's: fitted, then
        rows appended)."""
        out = d / "out"
        if cmd.input_kind == "npy":
            inp = d / "in.npy"
            np.save(inp, zarr.open_group(str(self.work / "base.zarr"))["data"][...]
                    .astype("f8"))
            return inp, out
        if cmd.input_kind is None:
            return d, out
        inp = d / "in.zarr"
        shutil.copytree(self.work / "base.zarr", inp)
        if cmd.name == "update":
            assert run(["fit", inp, "--out", out, *FIT])[0] == 0
            self.append(inp)
        return inp, out

    def append(self, inp: Path) -> None:
        """What a nightly producer does: rows appended after the fitted ones."""
        arr = zarr.open_group(str(inp), mode="r+")["data"]
        more = zarr.open_group(str(self.extra))["data"][:2 * CHUNK]
        arr.resize((ROWS + len(more), arr.shape[1]))
        arr[ROWS:] = more

    def fresh(self, cmd: Command, inp: Path, into: Path, *, refit: bool = False) -> dict | None:
        """The result of the command run once, uninterrupted, on ``inp`` (an update: from
        the same base; ``refit``: a plain fit of every row)."""
        if cmd.name == "update" and not refit:
            base = into.parent / f"{into.name}-base.zarr"
            shutil.copytree(self.work / "base.zarr", base)
            assert run(["fit", base, "--out", into, *FIT])[0] == 0
            self.append(base)  # the same rows appended (only them: the old chunks untouched)
            code, msg = run(cmd.argv(base, into))
        else:
            code, msg = run(cmd.argv(inp, into))
        assert code == 0, msg
        return read(into, cmd.results)

    def reference(self, cmd: Command) -> dict:
        if cmd.name not in self.refs:
            d = self.work / f"ref-{cmd.name}"
            d.mkdir()
            if cmd.name == "update":
                inp = d / "in.zarr"
                shutil.copytree(self.work / "base.zarr", inp)
                self.append(inp)
            else:
                inp, _ = self.prepare(cmd, d)
            self.refs[cmd.name] = self.fresh(cmd, inp, d / "fresh")
        return self.refs[cmd.name]

    def case(self, name: str) -> Path:
        d = self.work / "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name)
        d.mkdir()
        return d

    # -- the verdict
    def judge(self, name: str, what: str, runs: list[tuple[int, str]], out: Path,
              cmd: Command, reference, answer: str | None = None) -> None:
        """``reference``: the fresh result, or a list of the results that are right."""
        code, msg = runs[-1]
        refs = reference if isinstance(reference, list) else [reference]
        answer = answer or "exit " + ", then ".join(str(c) for c, _ in runs)
        if any(c == 124 for c, _ in runs):
            return self.t.record(name, what, 124, "hang", "UNSAFE: a hang", answer)
        if any(c not in (0, 1, 2) for c, _ in runs):
            return self.t.record(name, what, code, msg, "UNSAFE: not an exit code of the "
                                 "table (death by a signal?)", answer)
        if code == 0:
            result = read(out, cmd.results)
            vcode, vmsg = run(["verify", out])
            right = any(same(result, r) for r in refs)
            if right and vcode == 0:
                return self.t.record(name, what, 0, "", "safe: identical", answer)
            return self.t.record(name, what, 0, vmsg, "UNSAFE: exit 0 with " + (
                "another result" if not right else "verify exit 1"), answer)
        status = run_attrs(out).get("status")
        if status == "complete" and not (any(same(read(out, cmd.results), r) for r in refs)
                                         and run(["verify", out])[0] == 0):
            return self.t.record(name, what, code, msg, "UNSAFE: exit != 0 but OUTDIR says "
                                 "complete and is not the fresh result", answer)
        if "ooc-spectral: error:" not in msg:
            return self.t.record(name, what, code, msg, "UNSAFE: no message", answer)
        self.t.record(name, what, code, msg, "safe: stopped" if code == 1 else "safe: refused",
                      answer)

    # -- kills
    def kill(self, name: str, cmd: Command, stage: str, sig: int) -> None:
        signame = signal.Signals(sig).name
        d = self.case(name)
        inp, out = self.prepare(cmd, d)
        ref = self.reference(cmd)
        proc = start(cmd.argv(inp, out))
        deadline = time.time() + BOUND
        reached = cmd.stages[stage]
        while proc.poll() is None and not reached(out) and time.time() < deadline:
            time.sleep(0.002)
        landed = proc.poll() is None
        if landed:
            if sig == signal.SIGKILL:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        first = finish(proc)
        what = (f"{signame} at {stage}" + ("" if landed else " (the run had ended)")
                + ", then the same command")
        if sig != signal.SIGKILL and first[0] not in (0, 1):
            return self.t.record(name, what, first[0], first[1], f"UNSAFE: {signame} gave "
                                 f"{first[0]}, not an exit code 0 or 1", f"exit {first[0]}")
        rerun = run(cmd.argv(inp, out))
        self.judge(name, what, [rerun], out, cmd, ref,
                   answer=f"{first[0] if sig != signal.SIGKILL else 'killed'}, then exit "
                          f"{rerun[0]}")

    # -- damage and members of other runs
    def damage(self, name: str, cmd: Command, label: str, act) -> None:
        d = self.case(name)
        inp, out = self.prepare(cmd, d)
        assert run(cmd.argv(inp, out))[0] == 0
        act(out)
        self._repair(name, f"{label}: verify, then the same command", cmd, inp, out, d)

    def foreign(self, name: str, cmd: Command, label: str, act) -> None:
        d = self.case(name)
        inp, out = self.prepare(cmd, d)
        assert run(cmd.argv(inp, out))[0] == 0
        other = d / "other"
        if cmd.other_argv == "other-input":
            oin = d / "other.zarr"
            shutil.copytree(self.extra, oin)
            assert run(cmd.argv(oin, other))[0] == 0
        else:
            assert run(cmd.other_argv(inp, other))[0] == 0
        act(out, other)
        self._repair(name, f"{label}: verify, then the same command", cmd, inp, out, d)

    def _repair(self, name, what, cmd, inp, out, d) -> None:
        vcode, vmsg = run(["verify", out])
        code, msg = run(cmd.argv(inp, out))
        ref = self.reference(cmd) if cmd.after_damage == "fresh" else \
            self.fresh(cmd, inp, d / "refit", refit=True)
        if cmd.after_damage != "fresh" and "configuration edited" in what:
            # only the record was edited: the results, checked by their digests, may be kept
            ref = [ref, self.reference(cmd)]
        if vcode != 1:
            return self.t.record(name, what, vcode, vmsg, "UNSAFE: verify called it intact"
                                 if vcode == 0 else "UNSAFE: verify's answer", f"verify {vcode}")
        self.judge(name, what, [(code, msg)], out, cmd, ref,
                   answer=f"verify 1, then exit {code}")

    # -- the input changed
    def changed_between(self, name: str, cmd: Command) -> None:
        d = self.case(name)
        inp, out = self.prepare(cmd, d)
        if cmd.name == "update":  # an old row changed as well as rows appended: not an append
            arr = zarr.open_group(str(inp), mode="r+")["data"]
            arr[5] = arr[5] + 1.0
        else:
            assert run(cmd.argv(inp, out))[0] == 0
            cmd.change(inp)
        code, msg = run(cmd.argv(inp, out))
        ref = self.fresh(cmd, inp, d / "fresh", refit=cmd.name == "update")
        self.judge(name, "the input rewritten after a complete run, then the same command",
                   [(code, msg)], out, cmd, ref)

    def changed_during(self, name: str, cmd: Command, stage: str) -> None:
        d = self.case(name)
        inp, out = self.prepare(cmd, d)
        old = self.reference(cmd)
        proc = start(cmd.argv(inp, out))
        deadline = time.time() + BOUND
        while proc.poll() is None and not cmd.stages[stage](out) and time.time() < deadline:
            time.sleep(0.002)
        landed = proc.poll() is None
        if landed:
            os.killpg(proc.pid, signal.SIGSTOP)
        cmd.change(inp)
        if landed:
            os.killpg(proc.pid, signal.SIGCONT)
        first = finish(proc)
        what = (f"stopped (SIGSTOP) at {stage}, every row rewritten, SIGCONT; then the same "
                "command" + ("" if landed else " (the run had ended before the stop)"))
        if first[0] == 0 and not same(read(out, cmd.results), old):
            return self.t.record(name, what, 0, "", "UNSAFE: exit 0 with a mix of two inputs",
                                 "exit 0")
        if first[0] == 0:
            what += " (the run had read every row before the change: the old input's result)"
        if first[0] == 1 and "InputChangedError" not in first[1]:
            return self.t.record(name, what, 1, first[1], "UNSAFE: another failure",
                                 "exit 1")
        rerun = run(cmd.argv(inp, out))
        ref = self.fresh(cmd, inp, d / "fresh", refit=cmd.name == "update")
        self.judge(name, what, [first, rerun], out, cmd, ref)


def matrix_trials(t, work: Path) -> list[tuple[str, Callable[[], None]]]:
    """``(name, trial)`` for every command x every kind of trial."""
    holder: list[Matrix] = []

    def m() -> Matrix:
        if not holder:
            holder.append(Matrix(t, work))
        return holder[0]

    during = {"fit": ["pass 2", "pass 3"], "transform": ["write-back"],
              "fit-representatives": ["write-back"], "transform-representatives": ["write-back"],
              "update": ["pass 3"], "import": ["writing"], "make-data": [],
              "workflow": ["transform step"]}
    out = []

    def add(name, method, *args):
        out.append((name, lambda: getattr(m(), method)(name, m().cmds[args[0]], *args[1:])))

    for cname, cmd in commands(work).items():
        for stage in cmd.stages:
            for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                add(f"{cname}-{signal.Signals(sig).name.lower()}-{stage}", "kill", cname,
                    stage, sig)
        for label, act in cmd.damage.items():
            add(f"{cname}: {label}", "damage", cname, label, act)
        for label, act in cmd.foreign.items():
            add(f"{cname}: {label}", "foreign", cname, label, act)
        if cmd.input_kind is not None:
            add(f"{cname}-input-changed-between-runs", "changed_between", cname)
        for stage in during[cname]:
            add(f"{cname}-input-changed-during-{stage}", "changed_during", cname, stage)
    return out
