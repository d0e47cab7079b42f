import sys, os, json, shutil, random
sys.path.insert(0, "/tmp/a52"); from h import *
os.chdir(W)
kind = sys.argv[1]
make_input("in2b.zarr", n=3000, seed=11) if not os.path.exists("in2b.zarr") else None
CMDS = {
 "fit":   (["fit", "in.zarr", "--chunk-rows", 500], ["fit", "in_b.zarr", "--chunk-rows", 500]),
 "tr":    (["transform", "ref_fit", "in2.zarr"], ["transform", "ref_fit", "in2b.zarr"]),
 "rep":   (["fit", "in.zarr", "--chunk-rows", 500, "--n-clusters", 3], ["fit", "in.zarr", "--chunk-rows", 500, "--n-clusters", 3, "--seed", 1]),
 "reptr": (["transform", "ref_rep", "in2.zarr"], ["transform", "ref_rep", "in2b.zarr"]),
}
cmd, other = CMDS[kind]
P = f"/tmp/a52/m_{kind}"; C = P + ".clean"; O = P + ".other"
def fresh():
    if os.path.exists(P): shutil.rmtree(P)
    shutil.copytree(C, P, symlinks=True)
if not os.path.exists(C):
    for d in (P, O):
        if os.path.exists(d): shutil.rmtree(d)
    rc, o, e = run(*cmd, "--out", P, "-q"); assert rc == 0, e
    shutil.copytree(P, C)
    rc, o, e = run(*other, "--out", O, "-q"); assert rc == 0, e
clean = digest(C)
arrays = sorted(k for k in clean)
# plus checkpoint arrays
ck = []
for root, ds, fs in os.walk(C):
    if "zarr.json" in fs and os.path.isdir(os.path.join(root, "c")):
        rel = os.path.relpath(root, C)
        if rel.startswith("checkpoint"): ck.append(rel)
trials = []
def T(name, fn): trials.append((name, fn))
for a in arrays + sorted(ck)[:4]:
    def mk(a, op):
        def f():
            cs = chunks(os.path.join(P, a))
            if not cs: return "nochunks"
            c = cs[len(cs)//2]
            if op == "flip": flip(c)
            elif op == "del": os.remove(c)
            elif op == "trunc": trunc(c)
            elif op == "swap":
                if len(cs) < 2: return "nochunks"
                x, y = open(cs[0], "rb").read(), open(cs[1], "rb").read()
                open(cs[0], "wb").write(y); open(cs[1], "wb").write(x)
            elif op == "rmarr": shutil.rmtree(os.path.join(P, a))
            elif op == "rmmeta": os.remove(os.path.join(P, a, "zarr.json"))
            elif op == "other":
                src = os.path.join(O, a)
                if not os.path.exists(src): return "noother"
                shutil.rmtree(os.path.join(P, a)); shutil.copytree(src, os.path.join(P, a))
            elif op == "otherchunk":
                oc = chunks(os.path.join(O, a))
                rel = os.path.relpath(c, os.path.join(P, a))
                src = os.path.join(O, a, rel)
                if not os.path.exists(src): return "noother"
                shutil.copy(src, c)
        return f
    ops = os.environ.get("OPS", "flip,del,trunc,swap,other,otherchunk,rmmeta").split(",") if not a.startswith("checkpoint") else ["flip", "del"]
    if a.count("/") == 0: ops.append("rmarr")
    for op in ops: T(f"{a}:{op}", mk(a, op))
# top-level groups
for g in ("model", "representatives_model"):
    if os.path.isdir(os.path.join(C, g)):
        T(f"{g}:rmgroup", lambda g=g: shutil.rmtree(os.path.join(P, g)))
        T(f"{g}:othergroup", lambda g=g: (shutil.rmtree(os.path.join(P, g)), shutil.copytree(os.path.join(O, g), os.path.join(P, g))) and None)
        def editattr(g=g):
            p = os.path.join(P, g, "zarr.json"); s = open(p).read()
            import re
            for key in ("n_neighbors", "gamma", "n_components"):
                m = re.search(r'"%s": ([0-9.e+-]+)' % key, s)
                if m:
                    v = m.group(1); nv = "1" if key == "n_neighbors" else (v[:-1] + str((int(v[-1]) + 1) % 10) if v[-1].isdigit() else v)
                    s = s[:m.start(1)] + nv + s[m.end(1):]; open(p, "w").write(s); return key
            return "nokey"
        T(f"{g}:editattr", editattr)
T("report.json:rm", lambda: os.remove(os.path.join(P, "report.json")))
T("report.json:other", lambda: shutil.copy(os.path.join(O, "report.json"), os.path.join(P, "report.json")))
def edrep():
    p = os.path.join(P, "report.json"); r = json.load(open(p)); r["n_samples"] = r.get("n_samples", 0) + 1; json.dump(r, open(p, "w"))
T("report.json:edit", edrep)
T("report.json:garble", lambda: open(os.path.join(P, "report.json"), "w").write("{garbled"))
T("zarr.json:other", lambda: shutil.copy(os.path.join(O, "zarr.json"), os.path.join(P, "zarr.json")))
T("report+zarr.json:other", lambda: (shutil.copy(os.path.join(O, "zarr.json"), os.path.join(P, "zarr.json")), shutil.copy(os.path.join(O, "report.json"), os.path.join(P, "report.json"))) and None)
def allbutmodel():
    for m in os.listdir(O):
        if m in ("model", "representatives_model", ".lock", "checkpoint"): continue
        s, d = os.path.join(O, m), os.path.join(P, m)
        if os.path.isdir(d): shutil.rmtree(d)
        elif os.path.exists(d): os.remove(d)
        (shutil.copytree if os.path.isdir(s) else shutil.copy)(s, d)
T("everything_but_model:other", allbutmodel)
def emb_and_markers():
    for m in ("embedding", "embedding_written"):
        shutil.rmtree(os.path.join(P, m)); shutil.copytree(os.path.join(O, m), os.path.join(P, m))
T("embedding+markers:other", emb_and_markers)
def emb_mk_rep():
    emb_and_markers(); shutil.copy(os.path.join(O, "report.json"), os.path.join(P, "report.json"))
T("embedding+markers+report:other", emb_mk_rep)
def status_edit():
    p = os.path.join(P, "zarr.json"); z = json.load(open(p)); z["attributes"]["ooc_spectral_run"]["members"]["embedding"]["sha256"] = "0" * 64; json.dump(z, open(p, "w"))
T("zarr.json:members_sha_edit", status_edit)
only = sys.argv[2:] 
res = []
for name, fn in trials:
    if only and not any(o in name for o in only): continue
    fresh()
    r = fn()
    if r in ("nochunks", "noother"): continue
    try: d0 = cmp(C, P)
    except Exception as ex: d0 = ["unreadable"]
    vrc, vo, ve = run("verify", P)
    trc = None
    if kind in ("fit", "rep") and not name.startswith(("embedding", "labels")):
        tp = P + ".tr"; shutil.rmtree(tp, ignore_errors=True)
        trc, to, te = run("transform", P, "in2.zarr", "--out", tp, "-q")
        if trc == 0:
            ref = "ref_tr" if kind == "fit" else "ref_reptr"
            tdiff = cmp(ref, tp)
            if tdiff: trc = f"0-DIFF{tdiff}"
    rrc, ro, re_ = run(*cmd, "--out", P, "-q")
    try: d1 = cmp(C, P)
    except Exception as ex: d1 = ["unreadable"]
    v2, _, v2e = run("verify", P)
    bad = []
    if vrc == 0 and d0: bad.append("verify-intact-on-changed")
    if vrc == 0 and not d0: bad.append("verify0(no value change)")
    if rrc == 0 and d1: bad.append("rerun0-DIFF")
    if rrc != 0: bad.append(f"rerun-rc{rrc}")
    if v2 != 0: bad.append("verify-after-rerun!=0")
    if isinstance(trc, str): bad.append("transform0-DIFF")
    line = f"{kind:5} {name:40} valdiff={len(d0)} verify={vrc} transform={trc} rerun={rrc} after={d1} verify2={v2} {'OK' if not bad else 'BAD:'+','.join(bad)}"
    if bad: line += " | verify:" + (ve.strip().splitlines() or [''])[-1][:200] + " | rerun:" + (re_.strip().splitlines() or [''])[-1][:200]
    print(line, flush=True)
