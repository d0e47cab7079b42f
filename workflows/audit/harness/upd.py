import sys, os, shutil, time, signal, glob
sys.path.insert(0, "/tmp/a52"); from h import *
os.chdir(W)
def base():
    for d in ("up.zarr", "FU"): shutil.rmtree(d, ignore_errors=True)
    X = make_input("up.zarr", n=4000, chunk=250, seed=21)
    assert run("fit", "up.zarr", "--out", "FU", "--chunk-rows", 500, "-q")[0] == 0
def append(k=1000, seed=22):
    a = zarr.open_array("up.zarr", mode="r+"); n = a.shape[0]
    a.resize((n + k, a.shape[1])); a[n:] = np.random.default_rng(seed).normal(size=(k, a.shape[1]))
if not os.path.exists("FU.clean"):
    base(); append()
    rc, o, e = run("fit", "up.zarr", "--out", "FU", "--chunk-rows", 500, "-q", "--json"); print(rc, o[:300])
    shutil.copytree("FU", "FU.clean"); shutil.copytree("up.zarr", "up.zarr.final")
    shutil.rmtree("FU_fresh", ignore_errors=True)
    print(run("fit", "up.zarr", "--out", "FU_fresh", "--chunk-rows", 500, "-q")[0])
    print("update vs fresh:", cmp("FU.clean", "FU_fresh"))
def trial(name, fn):
    shutil.rmtree("FU", ignore_errors=True); shutil.copytree("FU.clean", "FU")
    fn()
    v = run("verify", "FU")[0]
    rc, o, e = run("fit", "up.zarr", "--out", "FU", "--chunk-rows", 500, "-q", "--json")
    d_clean = [k for k in cmp("FU.clean", "FU") if not k.endswith("_written")]
    d_fresh = [k for k in cmp("FU_fresh", "FU") if not k.endswith("_written")]
    v2 = run("verify", "FU")[0]
    import json as J
    upd = J.loads(o).get("update") if o.strip() else None
    print(f"update {name:28} verify={v} rerun={rc} =update:{not d_clean} =fresh:{not d_fresh} verify2={v2} update_field={upd}", (e.strip().splitlines() or [''])[-1][:200] if rc else "", flush=True)
if "trials" in sys.argv:
    trial("embedding:flip", lambda: flip(chunks("FU/embedding")[3]))
    trial("embedding:del", lambda: os.remove(chunks("FU/embedding")[3]))
    trial("model/components:flip", lambda: flip(chunks("FU/model/components")[0]))
    trial("model/dictionary:del", lambda: os.remove(chunks("FU/model/dictionary")[0]))
    trial("report.json:rm", lambda: os.remove("FU/report.json"))
    trial("embedding_written:del", lambda: os.remove(chunks("FU/embedding_written")[0]))
    trial("checkpoint chunk:flip", lambda: flip(sorted(glob.glob("FU/checkpoint/**/c/**/*", recursive=True), key=str)[-1]) if False else [flip(f) for f in sorted(glob.glob("FU/checkpoint/**/c/*", recursive=True)) if os.path.isfile(f)][:1])
    trial("model:rmgroup", lambda: shutil.rmtree("FU/model"))
    trial("nothing", lambda: None)
