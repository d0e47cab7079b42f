import sys, os, shutil, json, glob
sys.path.insert(0, "/tmp/a52"); from h import *
os.chdir(W)
def L(e): return (e.strip().splitlines() or [""])[-1][:200]
# zarr v2 input: fit, rewrite a chunk (v2 layout), rerun
for d in ("v2.zarr", "v2b.zarr", "FV2", "FV2b"): shutil.rmtree(d, ignore_errors=True)
make_input("v2.zarr", n=3000, chunk=250, seed=51, zarr_format=2); make_input("v2b.zarr", n=3000, chunk=250, seed=52, zarr_format=2)
print("v2 files:", sorted(os.listdir("v2.zarr"))[:6])
print("fit v2:", run("fit", "v2.zarr", "--out", "FV2", "--chunk-rows", 500, "-q")[0])
src = sorted(f for f in os.listdir("v2b.zarr") if not f.startswith("."))
for f in src[:3]: shutil.copy("v2b.zarr/" + f, "v2.zarr/" + f)
rc, o, e = run("fit", "v2.zarr", "--out", "FV2", "--chunk-rows", 500); print("rerun after v2 chunks changed:", rc, L(e))
print("fresh:", run("fit", "v2.zarr", "--out", "FV2b", "--chunk-rows", 500, "-q")[0], "equal:", [k for k in cmp("FV2", "FV2b") if not k.endswith("_written")])
# dtypes
for dt in ("float16", "int8", "bool", "uint64"):
    p = f"dt_{dt}.zarr"; X = make_input(p, n=3000, chunk=250, seed=53, dtype=dt)
    q = f"dt_{dt}_f64.zarr"; shutil.rmtree(q, ignore_errors=True); a = zarr.create_array(q, shape=X.shape, chunks=(250, 3), dtype="float64"); a[:] = X.astype("float64")
    for d in ("FD", "FD64"): shutil.rmtree(d, ignore_errors=True)
    r1 = run("fit", p, "--out", "FD", "--chunk-rows", 500, "-q"); r2 = run("fit", q, "--out", "FD64", "--chunk-rows", 500, "-q")
    eq = [k for k in cmp("FD", "FD64") if not k.endswith("_written")] if r1[0] == 0 and r2[0] == 0 else "n/a"
    if eq and eq != "n/a":
        A = zarr.open_array("FD/embedding")[:]; B = zarr.open_array("FD64/embedding")[:]; eq = (eq, float(np.abs(A - B).max()))
    print(f"dtype {dt}: fit rc={r1[0]} {L(r1[2]) if r1[0] else ''} vs float64 copy rc={r2[0]} {L(r2[2]) if r2[0] else ''}: diff {eq}")
    rt = run("transform", "ref_fit", p, "--out", "TD_" + dt, "--overwrite", "-q"); print(f"   transform {dt}: rc={rt[0]} {L(rt[2]) if rt[0] else ''}; verify {run('verify', 'TD_' + dt)[0] if rt[0]==0 else '-'}")
# spaces and symlinks
for d in ("with space", "lnk", "real"): 
    if os.path.islink(d): os.remove(d)
    shutil.rmtree(d, ignore_errors=True)
os.makedirs("with space")
rc = run("fit", "in.zarr", "--out", "with space/out dir", "--chunk-rows", 500, "-q"); print("fit into path with spaces:", rc[0], L(rc[2]))
print("  equal to ref_fit:", [k for k in cmp("with space/out dir", "ref_fit") if not k.endswith("_written")], "verify", run("verify", "with space/out dir")[0])
rc = run("transform", "with space/out dir", "in2.zarr", "--out", "with space/t r", "-q"); print("transform with spaces:", rc[0], L(rc[2]), "equal:", [k for k in cmp("with space/t r", "ref_tr") if not k.endswith("_written")] if rc[0]==0 else "")
os.makedirs("real"); os.symlink("real/o", "lnk") 
rc = run("fit", "in.zarr", "--out", "lnk", "--chunk-rows", 500, "-q"); print("fit --out symlink to non-existing dir:", rc[0], L(rc[2]))
os.makedirs("real/o"); rc = run("fit", "in.zarr", "--out", "lnk", "--chunk-rows", 500, "-q"); print("fit --out symlink to empty dir:", rc[0], L(rc[2]))
if rc[0] == 0:
    print("  verify lnk", run("verify", "lnk")[0], "rerun", run("fit", "in.zarr", "--out", "lnk", "--chunk-rows", 500, "-q")[0], "equal:", [k for k in cmp("lnk", "ref_fit") if not k.endswith("_written")])
    flip(chunks("real/o/embedding")[2]); print("  after flip via real path: verify lnk", run("verify", "lnk")[0], "rerun", run("fit", "in.zarr", "--out", "lnk", "--chunk-rows", 500, "-q")[0], "equal:", [k for k in cmp("lnk", "ref_fit") if not k.endswith("_written")])
    # rerun under the real path: same OUTDIR, another spelling
    rc = run("fit", "in.zarr", "--out", "real/o", "--chunk-rows", 500, "-q"); print("  rerun via the real path:", rc[0], L(rc[2]))
