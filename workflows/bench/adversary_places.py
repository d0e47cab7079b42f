"""Where the commands run and what they read, tried as an adversary would (issue 52).

The input on object storage (moto's S3 server) changed between and during runs; a full
disk under every command (a tmpfs mounted in a private mount namespace, ``unshare``); a
worker of an external cluster stopped with SIGSTOP (``dask scheduler`` and ``dask
worker`` processes of this script) under ``transform`` and the representatives fit; a
read-only OUTDIR (a read-only bind mount: the trials run as root, whom file modes do not
stop); an OUTDIR whose path has spaces, or is a symbolic link (one leading into the
input too); zarr v2 input; float16, int8 and bool input; ``fit``, ``verify`` and
``transform`` at once on one OUTDIR; a workflow whose steps are killed, damaged, or read
a URL. Each is judged as :mod:`adversary_commands` judges: exit 0 with the fresh result
and ``verify`` 0, or a non-zero exit with its message and nothing that looks complete.
"""

from __future__ import annotations

import functools
import http.server
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import zarr

from adversary_commands import (BOUND, CHUNK, FIT, REPS, ROWS, chunks, edit_json, finish, flip,
                                has_chunk, producers_group, read, run, run_attrs, same, start)

TRANSFORM = ["--chunk-rows", str(CHUNK), "--engine", "threads", "--threads-per-worker", "1",
             "-q"]


class Places:
    """The trials of this module, recorded through ``t.record`` (adversarial.Trials).

    ``kit`` brings what the main script owns: ``s3()`` (moto's server, started on first
    use), ``Cluster`` (a scheduler and workers), ``unshare`` (the arguments of a private
    mount namespace, or None) and ``NotRun``."""

    def __init__(self, t, work: Path, kit):
        self.t, self.work, self.kit = t, work, kit
        self.data = work / "data.zarr"
        assert run(["make-data", "swiss-roll", "--n", ROWS, "--out", self.data, "--chunk-rows",
                    CHUNK, "-q"])[0] == 0
        producers_group(self.data)  # the trials rewrite copies of it
        self.npy = work / "data.npy"
        np.save(self.npy, zarr.open_array(str(self.data / "data"), mode="r")[...])
        self.fit_ref = work / "fit-ref"
        assert run(["fit", self.data, "--out", self.fit_ref, *FIT])[0] == 0
        self.ref = read(self.fit_ref, ["embedding"])
        self.t_ref_out = work / "transform-ref"
        assert run(["transform", self.fit_ref, self.data, "--out", self.t_ref_out,
                    *TRANSFORM])[0] == 0

    def case(self, name: str) -> Path:
        d = self.work / name
        d.mkdir()
        return d

    def verdict(self, name, what, runs, out, names, ref, answer=None) -> None:
        code, msg = runs[-1]
        answer = answer or "exit " + ", then ".join(str(c) for c, _ in runs)
        if any(c not in (0, 1, 2) for c, _ in runs):
            return self.t.record(name, what, code, msg, "UNSAFE: not an exit code of the table",
                                 answer)
        if code == 0:
            vcode, vmsg = run(["verify", out])
            if same(read(out, names), ref) and vcode == 0:
                return self.t.record(name, what, 0, "", "safe: identical", answer)
            return self.t.record(name, what, 0, vmsg, "UNSAFE: exit 0 with another result"
                                 if not same(read(out, names), ref) else
                                 "UNSAFE: verify exit 1", answer)
        if run_attrs(Path(out)).get("status") == "complete" and not same(read(out, names), ref):
            return self.t.record(name, what, code, msg, "UNSAFE: OUTDIR says complete", answer)
        if "ooc-spectral: error:" not in msg:
            return self.t.record(name, what, code, msg, "UNSAFE: no message", answer)
        self.t.record(name, what, code, msg, "safe: stopped" if code == 1 else "safe: refused",
                      answer)

    # ------------------------------------------------------------------ object storage
    def s3_changed(self, name: str, when: str, command: str) -> None:
        s3 = self.kit.s3()
        d = self.case(name)
        key = f"{name}.zarr"
        s3.fs.copy("adversary/data.zarr", f"adversary/{key}", recursive=True)
        url, out = s3.url(key), d / "out"

        def argv_of(o):
            return (["fit", url, "--out", o, *FIT] if command == "fit" else
                    ["transform", self.fit_ref, url, "--out", o, *TRANSFORM])

        argv = argv_of(out)

        def change():
            arr = zarr.open_group(url, mode="r+")["data"]
            arr[:CHUNK] = arr[:CHUNK] * 1.25  # one object rewritten, the same size

        first = None
        if when == "between":
            assert run(argv)[0] == 0
            change()
        else:
            proc = start(argv)
            deadline = time.time() + BOUND
            while proc.poll() is None and not has_chunk(out / "embedding_written") and \
                    time.time() < deadline:
                time.sleep(0.002)
            landed = proc.poll() is None
            if landed:
                os.killpg(proc.pid, signal.SIGSTOP)
            change()
            if landed:
                os.killpg(proc.pid, signal.SIGCONT)
            first = finish(proc)
            if first[0] == 1 and "InputChangedError" not in first[1]:
                return self.t.record(name, "-", 1, first[1], "UNSAFE: another failure", "exit 1")
        rerun = run(argv)
        fresh = d / "fresh"
        assert run(argv_of(fresh))[0] == 0
        what = (f"{command} from s3:// (moto), one input object rewritten " +
                ("after a complete run" if when == "between" else
                 "while the run was stopped (SIGSTOP) in its write-back") + ", then the same command")
        self.verdict(name, what, [r for r in (first, rerun) if r], out, ["embedding"],
                     read(fresh, ["embedding"]))

    # ------------------------------------------------------------------ a full disk
    def full_disk(self, name: str, argv_of, names, free_part: float = 0.5) -> None:
        """``argv_of(out)`` run with its output on a tmpfs filled but for ``free_part`` of
        what the output takes (in a private mount namespace): a non-zero exit naming the
        disk, nothing complete; the filler deleted, the same command: the fresh result."""
        if self.kit.unshare is None:
            raise self.kit.NotRun("no private mount namespace (unshare) to mount a tmpfs in")
        d = self.case(name)
        ref_out = d / "ref"
        assert run(argv_of(ref_out))[0] == 0
        need = sum(-(-p.stat().st_size // 4096) * 4096 for p in ref_out.rglob("*") if p.is_file())
        free = int(need * free_part) // 4096 * 4096
        size = need + (1 << 20)
        (d / "mnt").mkdir()
        py = shlex.join([sys.executable, "-m", "ooc_spectral"])
        cmd = shlex.join(map(str, argv_of("mnt/out")))
        script = f"""
mount -t tmpfs -o size={size} adversarial mnt || exit 99
head -c {size - free} /dev/zero > mnt/filler 2> /dev/null
{py} {cmd} 2> err1.txt; echo $? > code1.txt
{py} verify mnt/out > /dev/null 2> verify.txt; echo $? > vcode.txt
rm mnt/filler
{py} {cmd} 2> err2.txt; echo $? > code2.txt
cp -r mnt/out out
"""
        proc = subprocess.run([*self.kit.unshare, "sh", "-c", script], cwd=d, capture_output=True,
                              text=True, timeout=3 * BOUND, check=False)
        assert proc.returncode != 99, proc.stderr

        def txt(f):
            return " ".join((d / f).read_text().split()) if (d / f).exists() else ""

        code1, vcode, code2 = int(txt("code1.txt")), int(txt("vcode.txt")), int(txt("code2.txt"))
        what = (f"--out on a tmpfs with {free // 1024} KiB free of the {need // 1024} KiB the "
                f"output takes: verify exit {vcode}; the filler deleted, the same command")
        answer = f"exit {code1}, then {code2}"
        if code1 == 0:
            return self.t.record(name, what, 0, "", "UNSAFE: exit 0 on a full disk", answer)
        named = "space" in txt("err1.txt") or (code1 == 2 and " free" in txt("err1.txt"))
        if not named or vcode == 0:  # make-data checks the free space first: exit 2
            return self.t.record(name, what, code1, txt("err1.txt"), "UNSAFE: the disk is not "
                                 "named, or the output looks complete", answer)
        self.verdict(name, what, [(code1, txt("err1.txt")), (code2, txt("err2.txt"))], d / "out",
                     names, read(ref_out, names), answer)

    # ------------------------------------------------------------------ a damaged data set
    def damaged_data_set(self, name: str, how: str) -> None:
        """A make-data data set with a chunk copied over another (it decodes, its checksum
        holds) or its description edited (the seed): the fit refuses it, exit 2, naming
        make-data; the same make-data command writes it again; the fit then gives the
        reference (the same rows)."""
        d = self.case(name)
        data, out = d / "data.zarr", d / "out"
        make = ["make-data", "swiss-roll", "--n", ROWS, "--out", data, "--chunk-rows", CHUNK,
                "-q"]
        assert run(make)[0] == 0
        if how == "chunk":
            shutil.copyfile(chunks(data / "data")[0], chunks(data / "data")[2])
            what = "a make-data chunk copied over another"
        else:
            edit_json(data / "zarr.json", lambda m: m["attributes"]["ooc_spectral_dataset"]
                      .update(seed=99))
            what = "make-data's description edited (seed)"
        first = run(["fit", data, "--out", out, *FIT])
        repair = run(make)
        rerun = run(["fit", data, "--out", out, *FIT])
        what += f": the fit, the same make-data command (exit {repair[0]}), the fit again"
        if first[0] != 2 or "make-data" not in first[1]:
            return self.t.record(name, what, first[0], first[1], "UNSAFE: not refused naming "
                                 "make-data", f"exit {first[0]}")
        self.verdict(name, what, [first, rerun], out, ["embedding"], self.ref)

    # ------------------------------------------------------------------ an external worker stopped
    def worker_stopped(self, name: str, command: str) -> None:
        c = self.kit.Cluster(self.work / f"{name}-cluster")
        try:
            c.worker()
            d = self.case(name)
            out = d / "out"
            if command == "transform":
                argv = ["transform", self.fit_ref, self.data, "--out", out, "--chunk-rows",
                        str(CHUNK), "-q", "--scheduler", c.address]
                ref, names = read(self.t_ref_out, ["embedding"]), ["embedding"]
            else:
                argv = ["fit", self.data, "--out", out, *[a for a in REPS if a not in (
                    "--engine", "threads")], "--scheduler", c.address]
                ref_out = d / "ref"
                assert run(["fit", self.data, "--out", ref_out, *REPS])[0] == 0
                names = ["embedding", "labels"]
                ref = read(ref_out, names)
            env = {**os.environ, "DASK_OOC_SPECTRAL__STALL_TIMEOUT": "10s"}
            proc = subprocess.Popen([sys.executable, "-m", "ooc_spectral", *map(str, argv)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True, env=env, start_new_session=True)
            deadline = time.time() + BOUND
            while proc.poll() is None and not run_attrs(out) and time.time() < deadline:
                time.sleep(0.01)
            os.killpg(c.procs[-1].pid, signal.SIGSTOP)  # the only worker
            first = finish(proc)
            os.killpg(c.procs[-1].pid, signal.SIGCONT)
            rerun = run(argv)
            self.verdict(name, f"{command} --scheduler: the only worker SIGSTOPped once the run "
                         "began (stall-timeout 10 s); SIGCONT, the same command", [first, rerun],
                         out, names, ref)
        finally:
            c.close()

    # ------------------------------------------------------------------ read-only OUTDIR
    def read_only(self, name: str) -> None:
        """A complete OUTDIR, and a killed one, mounted read-only (a bind mount: root is not
        stopped by file modes): verify and transform FROM it work; the rerun INTO it is
        exit 2 naming it, nothing changed; writable again, the same command completes."""
        if self.kit.unshare is None:
            raise self.kit.NotRun("no private mount namespace (unshare) for a read-only mount")
        d = self.case(name)
        done, killed = d / "done", d / "killed"
        shutil.copytree(self.fit_ref, done)
        proc = start(["fit", self.data, "--out", killed, *FIT])
        deadline = time.time() + BOUND
        while proc.poll() is None and not has_chunk(killed / "embedding_written") and \
                time.time() < deadline:
            time.sleep(0.002)
        os.killpg(proc.pid, signal.SIGKILL) if proc.poll() is None else None
        finish(proc)
        py = shlex.join([sys.executable, "-m", "ooc_spectral"])
        fit = shlex.join(map(str, FIT))
        script = f"""
for o in done killed; do mount --bind $o $o && mount -o remount,bind,ro $o || exit 99; done
{py} verify done > /dev/null 2>&1; echo $? > v.txt
{py} transform done {self.data} --out t {shlex.join(TRANSFORM)} 2> t.txt; echo $? >> t.txt
{py} fit {self.data} --out done {fit} 2> f1.txt; echo $? >> f1.txt
{py} fit {self.data} --out killed {fit} 2> f2.txt; echo $? >> f2.txt
"""
        before = {p: p.stat().st_mtime_ns for p in killed.rglob("*")}
        proc = subprocess.run([*self.kit.unshare, "sh", "-c", script], cwd=d, capture_output=True,
                              text=True, timeout=3 * BOUND, check=False)
        assert proc.returncode != 99, proc.stderr

        def last(f):
            lines = (d / f).read_text().split("\n")
            return int([x for x in lines if x.strip()][-1]), " ".join(lines[:-2])

        v = int((d / "v.txt").read_text())
        tcode, _ = last("t.txt")
        f1, m1 = last("f1.txt")
        f2, m2 = last("f2.txt")
        unchanged = before == {p: p.stat().st_mtime_ns for p in killed.rglob("*")}
        what = (f"complete OUTDIR read-only: verify {v}, transform from it {tcode}, the fit "
                f"into it {f1}; a killed one read-only: the fit {f2} (unchanged: "
                f"{unchanged}); writable again, the same command")
        rerun = run(["fit", self.data, "--out", killed, *FIT])
        ok = v == 0 and tcode == 0 and same(read(d / "t", ["embedding"]),
                                            read(self.t_ref_out, ["embedding"]))
        ok = ok and f1 in (0, 2) and f2 == 2 and "read-only" in m2.lower() + m1.lower() and \
            unchanged
        if not ok:
            return self.t.record(name, what, f2, m2 or m1, "UNSAFE", f"exit {f1} and {f2}")
        self.verdict(name, what, [(f2, m2), rerun], killed, ["embedding"], self.ref,
                     f"exit {f1} and {f2}, then {rerun[0]}")

    # ------------------------------------------------------------------ odd paths
    def odd_path(self, name: str, kind: str) -> None:
        d = self.case(name)
        if kind == "spaces":
            out = d / "out dir with spaces"
            inp = d / "in put.zarr"
            shutil.copytree(self.data, inp)
        elif kind == "symlink":  # to a directory made for it (a dangling link is refused)
            (d / "real" / "out").mkdir(parents=True)
            out = d / "link"
            out.symlink_to(d / "real" / "out")
            inp = self.data
        else:  # a link leading into the input
            inp = d / "in.zarr"
            shutil.copytree(self.data, inp)
            out = d / "link"
            out.symlink_to(inp / "run")
            code, msg = run(["fit", inp, "--out", out, *FIT])
            ok = code == 2 and not (inp / "run").exists()
            return self.t.record(name, "--out a symbolic link leading inside the input",
                                 code, msg, "safe: refused" if ok else "UNSAFE")
        proc = start(["fit", inp, "--out", out, *FIT])
        deadline = time.time() + BOUND
        while proc.poll() is None and not has_chunk(out / "embedding_written") and \
                time.time() < deadline:
            time.sleep(0.002)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        finish(proc)
        rerun = run(["fit", inp, "--out", out, *FIT])
        flip(chunks(out / "embedding")[1])
        repair = run(["fit", inp, "--out", out, *FIT])
        tout = d / ("t out" if kind == "spaces" else "t")
        tcode = run(["transform", out, inp, "--out", tout, *TRANSFORM])
        what = (f"OUTDIR {'with spaces in its path' if kind == 'spaces' else 'a symbolic link'}: "
                "SIGKILL in pass 3, the same command; a chunk flipped, the same command; "
                "transform from it")
        if tcode[0] != 0 or not same(read(tout, ["embedding"]), read(self.t_ref_out,
                                                                     ["embedding"])):
            return self.t.record(name, what, tcode[0], tcode[1], "UNSAFE: the transform",
                                 f"exit {tcode[0]}")
        self.verdict(name, what, [rerun, repair], out, ["embedding"], self.ref)

    # ------------------------------------------------------------------ other inputs
    def zarr_v2(self, name: str) -> None:
        d = self.case(name)
        X = zarr.open_group(str(self.data))["data"][...]
        inp = d / "v2.zarr"
        g = zarr.open_group(str(inp), mode="w", zarr_format=2)
        g.create_array("data", shape=X.shape, chunks=(CHUNK, X.shape[1]), dtype=X.dtype)[...] = X
        out = d / "out"
        first = run(["fit", inp, "--out", out, *FIT])
        again = run(["fit", inp, "--out", out, *FIT])
        tcode = run(["transform", out, inp, "--out", d / "t", *TRANSFORM])
        if first[0] != 0 or not same(read(out, ["embedding"]), self.ref) or tcode[0] != 0:
            return self.verdict(name, "zarr v2 input", [first], out, ["embedding"], self.ref)
        g["data"][:CHUNK] = X[:CHUNK] * 1.25  # then a chunk of it rewritten
        rerun = run(["fit", inp, "--out", out, *FIT])
        fresh = d / "fresh"
        assert run(["fit", inp, "--out", fresh, *FIT])[0] == 0
        self.verdict(name, "zarr v2 input: the fit, the same command (no-op), transform; a "
                     "chunk rewritten, the same command", [first, again, tcode, rerun], out,
                     ["embedding"], read(fresh, ["embedding"]))

    def dtype_input(self, name: str, dtype: str) -> None:
        d = self.case(name)
        X = zarr.open_group(str(self.data))["data"][...].astype("f8")
        values = {"float16": X.astype("f2"), "int8": np.clip(np.round(X * 4), -128, 127)
                  .astype("i1"), "bool": X > 0}[dtype]
        for path, v in ((d / "in.zarr", values), (d / "f64.zarr", values.astype("f8"))):
            zarr.create_array(str(path), shape=v.shape, chunks=(CHUNK, v.shape[1]),
                              dtype=v.dtype)[...] = v
        code, msg = run(["fit", d / "in.zarr", "--out", d / "out", *FIT])
        ref_code, ref_msg = run(["fit", d / "f64.zarr", "--out", d / "ref", *FIT])
        what = (f"{dtype} input: the same values stored as float64 give " +
                ("the reference" if ref_code == 0 else f"exit {ref_code}"))
        if ref_code != 0:  # the values themselves are refused (e.g. a constant kernel)
            ok = code == ref_code and "ooc-spectral: error:" in msg
            return self.t.record(name, what, code, msg, "safe: refused" if ok else "UNSAFE",
                                 f"exit {code}")
        self.verdict(name, what, [(code, msg)], d / "out", ["embedding"],
                     read(d / "ref", ["embedding"]))

    # ------------------------------------------------------------------ at once
    def concurrent(self, name: str) -> None:
        """fit into OUTDIR; while it runs, verify OUTDIR, transform OUTDIR (its model),
        a second fit and a transform --out OUTDIR: each refuses or says not complete; the
        fit then completes; verify and transform then succeed."""
        d = self.case(name)
        big = d / "big.zarr"
        assert run(["make-data", "swiss-roll", "--n", 100_000, "--out", big, "--chunk-rows",
                    2000, "-q"])[0] == 0
        out = d / "out"
        proc = start(["fit", big, "--out", out, *FIT])
        deadline = time.time() + BOUND
        while proc.poll() is None and not run_attrs(out) and time.time() < deadline:
            time.sleep(0.002)
        argvs = {"verify": ["verify", out],
                 "transform from it": ["transform", out, big, "--out", d / "t", *TRANSFORM],
                 "a second fit": ["fit", big, "--out", out, *FIT],
                 "transform into it": ["transform", self.fit_ref, big, "--out", out,
                                       *TRANSFORM]}
        started = {k: start(v) for k, v in argvs.items()}  # all at once, beside the fit
        others = {k: finish(p) for k, p in started.items()}
        was_running = proc.poll() is None
        first = finish(proc)
        after = {"verify": run(["verify", out])[0],
                 "transform": run(["transform", out, big, "--out", d / "t2", *TRANSFORM])[0]}
        fresh = d / "fresh"
        assert run(["fit", big, "--out", fresh, *FIT])[0] == 0
        codes = {k: v[0] for k, v in others.items()}
        what = (f"while the fit ran ({'still running' if was_running else 'it had ended'}): " +
                ", ".join(f"{k} exit {c}" for k, c in codes.items()) +
                f"; after it: verify {after['verify']}, transform {after['transform']}")
        bad = [k for k, (c, m) in others.items() if was_running and (
            c not in (1, 2) or "ooc-spectral: error:" not in m)]
        if bad or after["transform"] != 0:
            return self.t.record(name, what, first[0], first[1], f"UNSAFE: {', '.join(bad)}",
                                 f"exit {first[0]}")
        self.verdict(name, what, [first], out, ["embedding"], read(fresh, ["embedding"]))

    # ------------------------------------------------------------------ workflow steps
    def workflow(self, name: str, act: str) -> None:
        d = self.case(name)
        root = d / "root"
        root.mkdir()
        shutil.copytree(self.data, root / "in.zarr")
        flow = root / "w.toml"
        flow.write_text('[[step]]\nrun = "fit"\ninput = "in.zarr"\nout = "fit"\ngamma = 0.05\n'
                        'tol = 0.01\nn_components = 2\nengine = "threads"\n'
                        'threads_per_worker = 1\nchunk_rows = 400\n\n'
                        '[[step]]\nrun = "transform"\nmodel = "fit"\ninput = "in.zarr"\n'
                        'out = "t"\nchunk_rows = 400\nengine = "threads"\n'
                        'threads_per_worker = 1\n')
        argv = ["run", flow, "-q"]
        runs = []
        if act == "kill":
            proc = start(argv)
            deadline = time.time() + BOUND
            while proc.poll() is None and not has_chunk(root / "t" / "embedding_written") and \
                    time.time() < deadline:
                time.sleep(0.002)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            finish(proc)
            what = "SIGKILL in the transform step, then the same run"
        elif act == "damage":
            runs.append(run(argv))
            flip(chunks(root / "fit" / "embedding")[1])
            flip(chunks(root / "t" / "embedding")[2])
            what = "a chunk of each step's output flipped, then the same run"
        else:  # the input rewritten between runs
            runs.append(run(argv))
            arr = zarr.open_group(str(root / "in.zarr"), mode="r+")["data"]
            arr[...] = arr[...][::-1] * 1.25
            what = "the input rewritten after a complete run, then the same run"
        runs.append(run(argv))
        fresh = d / "fresh"
        assert run(["fit", root / "in.zarr", "--out", fresh, *FIT])[0] == 0
        assert run(["transform", fresh, root / "in.zarr", "--out", d / "tfresh",
                    *TRANSFORM])[0] == 0
        if not same(read(root / "fit", ["embedding"]), read(fresh, ["embedding"])) and \
                runs[-1][0] == 0:
            return self.t.record(name, what, 0, "", "UNSAFE: the fit step's result", "exit 0")
        self.verdict(name, what, runs, root / "t", ["embedding"],
                     read(d / "tfresh", ["embedding"]))

    def workflow_url(self, name: str) -> None:
        """A workflow whose steps read an http:// URL, without --allow read=: exit 2 and not
        one request reaches the server; with it, the inspect step reads."""
        requests: list[str] = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *a):
                requests.append(self.path)

        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(self.work)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/data.zarr"
        d = self.case(name)
        try:
            flow = d / "w.toml"
            flow.write_text(f'[[step]]\nrun = "inspect"\npath = "{url}"\n\n[[step]]\nrun = "fit"'
                            f'\ninput = "{url}"\nout = "fit"\n')
            code, msg = run(["run", flow, "-q"])
            before = len(requests)
            flow.write_text(f'[[step]]\nrun = "inspect"\npath = "{url}"\n')
            allowed = run(["run", flow, "-q", "--allow", f"read={url}"])[0]
        finally:
            server.shutdown()
        refused = code == 2 and "--allow read=" in msg and before == 0
        self.t.record(name, f"workflow steps reading {url.split('/data')[0]}/... (inspect, fit); "
                      f"with --allow read=URL the inspect step: exit {allowed}, "
                      f"{len(requests)} requests", code, msg.split(".toml: ")[-1],
                      "safe: refused" if refused and allowed == 0 else "UNSAFE",
                      f"exit {code}, {before} requests")


def place_trials(t, work: Path, kit) -> list:
    """``(name, trial)`` of this module's trials."""
    holder: list[Places] = []

    def p() -> Places:
        if not holder:
            holder.append(Places(t, work, kit))
        return holder[0]

    trials = [
        ("s3-input-changed-between-fit", lambda: p().s3_changed(
            "s3-input-changed-between-fit", "between", "fit")),
        ("s3-input-changed-during-fit", lambda: p().s3_changed(
            "s3-input-changed-during-fit", "during", "fit")),
        ("s3-input-changed-between-transform", lambda: p().s3_changed(
            "s3-input-changed-between-transform", "between", "transform")),
        ("s3-input-changed-during-transform", lambda: p().s3_changed(
            "s3-input-changed-during-transform", "during", "transform")),
        ("full-disk-transform", lambda: p().full_disk(
            "full-disk-transform", lambda o: ["transform", p().fit_ref, p().data, "--out", o,
                                              *TRANSFORM], ["embedding"])),
        ("full-disk-representatives", lambda: p().full_disk(
            "full-disk-representatives", lambda o: ["fit", p().data, "--out", o, *REPS],
            ["embedding", "labels"])),
        ("full-disk-make-data", lambda: p().full_disk(
            "full-disk-make-data", lambda o: ["make-data", "swiss-roll", "--n", ROWS, "--out", o,
                                              "--chunk-rows", CHUNK, "-q"], ["data", "t"])),
        ("full-disk-import", lambda: p().full_disk(
            "full-disk-import", lambda o: ["import", p().npy, "--out", o, "--chunk-rows", CHUNK,
                                           "-q"], ["data"])),
        ("data-set-damaged-under-fit", lambda: p().damaged_data_set(
            "data-set-damaged-under-fit", "chunk")),
        ("data-set-description-edited", lambda: p().damaged_data_set(
            "data-set-description-edited", "description")),
        ("wd-worker-stopped-transform", lambda: p().worker_stopped(
            "wd-worker-stopped-transform", "transform")),
        ("wd-worker-stopped-representatives", lambda: p().worker_stopped(
            "wd-worker-stopped-representatives", "representatives")),
        ("read-only-outdir", lambda: p().read_only("read-only-outdir")),
        ("outdir-with-spaces", lambda: p().odd_path("outdir-with-spaces", "spaces")),
        ("outdir-symlink", lambda: p().odd_path("outdir-symlink", "symlink")),
        ("outdir-symlink-into-input", lambda: p().odd_path("outdir-symlink-into-input",
                                                           "into-input")),
        ("zarr-v2-input", lambda: p().zarr_v2("zarr-v2-input")),
        ("float16-input", lambda: p().dtype_input("float16-input", "float16")),
        ("int8-input", lambda: p().dtype_input("int8-input", "int8")),
        ("bool-input", lambda: p().dtype_input("bool-input", "bool")),
        ("concurrent-fit-verify-transform", lambda: p().concurrent(
            "concurrent-fit-verify-transform")),
        ("workflow-kill", lambda: p().workflow("workflow-kill", "kill")),
        ("workflow-damage", lambda: p().workflow("workflow-damage", "damage")),
        ("workflow-input-changed", lambda: p().workflow("workflow-input-changed", "input")),
        ("workflow-url-read", lambda: p().workflow_url("workflow-url-read")),
    ]
    return trials
