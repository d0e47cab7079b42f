import sys, os, shutil, json, glob, time, signal
sys.path.insert(0, "/tmp/a52"); from h import *
os.chdir(W)
def L(e): return (e.strip().splitlines() or [""])[-1][:220]
for d in ("R", "RT", "RT2", "R2", "RX"): shutil.rmtree(d, ignore_errors=True)
make_input("rin.zarr", n=4000, chunk=250, seed=41); make_input("rin_alt.zarr", n=4000, chunk=250, seed=42)
rc = run("fit", "rin.zarr", "--out", "R", "--n-clusters", 3, "--chunk-rows", 500, "-q")[0]
rc2 = run("transform", "R", "in2.zarr", "--out", "RT", "-q")[0]; print("setup", rc, rc2)
RT0 = digest("RT")
# 15: the rep fit refit with another seed under RT
print("refit R seed1:", run("fit", "rin.zarr", "--out", "R", "--n-clusters", 3, "--chunk-rows", 500, "--seed", 1, "--overwrite", "-q")[0])
print("verify RT:", run("verify", "RT")[0])
rc, o, e = run("transform", "R", "in2.zarr", "--out", "RT"); print("rerun RT after model change:", rc, L(e))
print("RT changed:", digest("RT")["labels"] != RT0["labels"] or digest("RT")["embedding"] != RT0["embedding"])
print("fresh:", run("transform", "R", "in2.zarr", "--out", "RT2", "-q")[0], "equal fresh:", [k for k in cmp("RT", "RT2") if not k.endswith("_written")])
# 6: input changed between runs of rep fit
R_old = digest("R")
for f in glob.glob("rin_alt.zarr/c/*/*"): shutil.copy(f, "rin.zarr/" + os.path.relpath(f, "rin_alt.zarr"))
rc, o, e = run("fit", "rin.zarr", "--out", "R", "--n-clusters", 3, "--chunk-rows", 500, "--seed", 1); print("rep rerun after input changed:", rc, L(e))
print("fresh on new input:", run("fit", "rin.zarr", "--out", "R2", "--n-clusters", 3, "--chunk-rows", 500, "--seed", 1, "-q")[0], "equal:", [k for k in cmp("R", "R2") if not k.endswith("_written")])
# 13: cross-kind OUTDIRs
rc, o, e = run("transform", "ref_fit", "in2.zarr", "--out", "R", "-q"); print("transform --out a rep fit OUTDIR:", rc, L(e))
rc, o, e = run("fit", "in.zarr", "--out", "RT2", "-q"); print("fit --out a transform OUTDIR:", rc, L(e))
rc, o, e = run("fit", "in.zarr", "--out", "R", "-q"); print("plain fit --out a rep OUTDIR:", rc, L(e))
rc, o, e = run("transform", "ref_fit", "in2.zarr", "--out", "RT2", "-q"); print("transform --out a rep transform OUTDIR:", rc, L(e))
rc, o, e = run("make-data", "blobs", "--n", 1000, "--out", "RT2", "-q"); print("make-data --out a transform OUTDIR:", rc, L(e))
print("verify R, RT2 still:", run("verify", "R")[0], run("verify", "RT2")[0])
