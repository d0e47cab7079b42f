import sys, os, shutil, time, signal, glob
sys.path.insert(0, "/tmp/a52"); from h import *
os.chdir(W)
kind = sys.argv[1]; sigs = sys.argv[2].split(","); 
CMDS = {
 "fit":   ["fit", "in.zarr", "--chunk-rows", 500],
 "tr":    ["transform", "ref_fit", "in2.zarr"],
 "rep":   ["fit", "in.zarr", "--chunk-rows", 500, "--n-clusters", 3],
 "reptr": ["transform", "ref_rep", "in2.zarr"],
 "mk":    ["make-data", "swiss-roll", "--n", 20000, "--chunk-rows", 1000],
}
cmd = CMDS[kind]; P = f"/tmp/a52/s_{kind}"; C = P + ".clean"
if not os.path.exists(C):
    shutil.rmtree(P, ignore_errors=True)
    t0 = time.time(); rc, o, e = run(*cmd, "--out", P, "-q"); assert rc == 0, e
    dur = time.time() - t0; shutil.copytree(P, C); open(C + ".dur", "w").write(str(dur))
dur = float(open(C + ".dur").read())
ign = lambda d: [k for k in d if not k.endswith("_written")]
points = [("t", dur * f) for f in (0.02, 0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 0.95)] + [("file", "report.json"), ("file", "model/zarr.json"), ("file", "embedding/c/0/0")]
for sig in sigs:
    S = getattr(signal, sig)
    for how, at in points:
        shutil.rmtree(P, ignore_errors=True)
        p = popen(*cmd, "--out", P, "-q")
        t0 = time.time()
        if how == "t":
            time.sleep(at)
        else:
            while p.poll() is None and not os.path.exists(os.path.join(P, at)) and time.time() - t0 < 120: time.sleep(0.002)
        if p.poll() is None:
            try: os.kill(p.pid, S)
            except ProcessLookupError: pass
        o, e = p.communicate()
        rc = p.returncode
        st = "?"
        try: st = json.load(open(os.path.join(P, "zarr.json")))["attributes"]
        except Exception: st = None
        st = (st.get("ooc_spectral_run") or st.get("ooc_spectral_dataset") or {}).get("status", (st.get("ooc_spectral_dataset") or {}).get("complete")) if st else None
        vrc = run("verify", P)[0]
        rrc, ro, re_ = run(*cmd, "--out", P, "-q")
        d = [k for k in cmp(C, P) if not k.endswith("_written")]
        v2 = run("verify", P)[0]
        bad = []
        if sig != "SIGKILL" and rc not in (0, 1): bad.append(f"rc{rc}")
        if rc == 0 and (st not in ("complete", True) or vrc != 0): bad.append("rc0-notcomplete")
        if rc != 0 and vrc == 0 and st not in ("complete", True): bad.append("verify0-incomplete")
        if rrc != 0 or d or v2 != 0: bad.append(f"rerun{rrc}-diff{d}-v{v2}")
        print(f"{kind:5} {sig:7} {how}={at if how=='file' else round(at,2)!s:18} rc={rc} status={st} verify={vrc} rerun={rrc} diff={d} verify2={v2} {'OK' if not bad else 'BAD:' + ','.join(bad)}" + ("" if not bad else " | " + (e.strip().splitlines() or [''])[-1][:200]), flush=True)
