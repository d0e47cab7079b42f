import sys, os, shutil, json, glob
sys.path.insert(0, "/tmp/a52"); from h import *
os.chdir(W)
import pandas as pd
KINDS = {
 "md": ["make-data", "blobs", "--n", 4000, "--chunk-rows", 500],
 "imp": ["import", "/tmp/a52/tab.csv"],
}
if not os.path.exists("tab.csv"):
    rng = np.random.default_rng(3); pd.DataFrame(rng.normal(size=(4000, 3)), columns=list("abc")).to_csv("tab.csv", index=False)
for kind in sys.argv[1:]:
    cmd = KINDS[kind]; P = f"/tmp/a52/d_{kind}"; C = P + ".clean"; O = P + ".other"
    if not os.path.exists(C):
        shutil.rmtree(P, ignore_errors=True); rc, o, e = run(*cmd, "--out", P, "-q"); assert rc == 0, e
        shutil.copytree(P, C)
        other = cmd + ["--seed", 5] if kind == "md" else cmd
        if kind == "imp":
            pd.DataFrame(np.random.default_rng(4).normal(size=(4000, 3)), columns=list("abc")).to_csv("tab2.csv", index=False)
            other = ["import", "/tmp/a52/tab2.csv"]
        shutil.rmtree(O, ignore_errors=True); assert run(*other, "--out", O, "-q")[0] == 0
    arrays = [a for a in digest(C)]
    print(kind, "arrays", arrays, "chunks", {a: len(chunks(os.path.join(C, a))) for a in arrays})
    trials = []
    for a in arrays:
        trials += [(f"{a}:flip", lambda a=a: flip(chunks(os.path.join(P, a))[0])),
                   (f"{a}:del", lambda a=a: os.remove(chunks(os.path.join(P, a))[-1])),
                   (f"{a}:trunc", lambda a=a: trunc(chunks(os.path.join(P, a))[0])),
                   (f"{a}:swap", lambda a=a: (lambda cs: (lambda x, y: (open(cs[0], "wb").write(y), open(cs[1], "wb").write(x)))(open(cs[0], "rb").read(), open(cs[1], "rb").read()))(chunks(os.path.join(P, a))) if len(chunks(os.path.join(P, a))) > 1 else None),
                   (f"{a}:otherchunk", lambda a=a: shutil.copy(chunks(os.path.join(O, a))[0], chunks(os.path.join(P, a))[0])),
                   (f"{a}:other", lambda a=a: (shutil.rmtree(os.path.join(P, a)), shutil.copytree(os.path.join(O, a), os.path.join(P, a)))),
                   (f"{a}:rmmeta", lambda a=a: os.remove(os.path.join(P, a, "zarr.json")))]
    def edit_attr():
        p = os.path.join(P, "zarr.json"); z = json.load(open(p)); at = z["attributes"]
        k = [k for k in at if k.startswith("ooc_spectral")][0]; at[k]["n"] = at[k].get("n", 0) + 1 if "n" in at[k] else None; at[k]["seed"] = 99
        json.dump(z, open(p, "w"))
    trials += [("zarr.json:attr-edit", edit_attr), ("zarr.json:other", lambda: shutil.copy(os.path.join(O, "zarr.json"), os.path.join(P, "zarr.json")))]
    for name, fn in trials:
        shutil.rmtree(P, ignore_errors=True); shutil.copytree(C, P); fn()
        d0 = cmp(C, P)
        v, _, ve = run("verify", P)
        f, _, fe = run("fit", P, "--out", P + ".fit", "--overwrite", "-q")
        rc, o, e = run(*cmd, "--out", P, "-q")
        d1 = cmp(C, P); v2 = run("verify", P)[0]
        bad = []
        if v == 0 and d0: bad.append("verify-intact-on-changed")
        if f == 0 and d0: bad.append("fit-accepted-damaged-input")
        if rc == 0 and d1: bad.append("rerun0-DIFF")
        if rc != 0 or v2 != 0: bad.append(f"rerun{rc}/v{v2}")
        print(f"{kind:4} {name:28} valdiff={d0} verify={v} fit-on-it={f} rerun={rc} after={d1} verify2={v2} {'OK' if not bad else 'BAD:' + ','.join(bad)}", ("| " + (ve.strip().splitlines() or [''])[-1][:150] + " | " + (e.strip().splitlines() or [''])[-1][:150]) if bad else "", flush=True)
