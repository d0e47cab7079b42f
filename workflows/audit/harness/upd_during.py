import sys, os, shutil, time, signal, glob
sys.path.insert(0, "/tmp/a52"); from h import *
os.chdir(W)
stage = sys.argv[1]  # glob relative to OUTDIR (written by the update) or 'sleep:X'
what = sys.argv[2]   # 'all' or 'new'
for d in ("up2.zarr", "FU2"): shutil.rmtree(d, ignore_errors=True)
make_input("up2.zarr", n=60000, chunk=3000, seed=31)
assert run("fit", "up2.zarr", "--out", "FU2", "--chunk-rows", 3000, "-q")[0] == 0
a = zarr.open_array("up2.zarr", mode="r+"); n = a.shape[0]
a.resize((n + 60000, 3)); a[n:] = np.random.default_rng(5).normal(size=(60000, 3))
before = {f: os.stat(f).st_mtime_ns for f in glob.glob("FU2/embedding/c/*/*")}
p = popen("fit", "up2.zarr", "--out", "FU2", "--chunk-rows", 3000)
t0 = time.time()
if stage.startswith("sleep:"):
    time.sleep(float(stage[6:]))
else:
    while p.poll() is None and time.time() - t0 < 300:
        new = [f for f in glob.glob("FU2/" + stage) if before.get(f) != os.stat(f).st_mtime_ns]
        if new: break
        time.sleep(0.01)
if p.poll() is not None: print("finished early", p.returncode); sys.exit()
os.kill(p.pid, signal.SIGSTOP); print("stopped after", round(time.time()-t0,2))
a = zarr.open_array("up2.zarr", mode="r+")
rng = np.random.default_rng(77)
if what == "all": a[:] = a[:] * 0.5 + 1.0
else: a[60000:] = rng.normal(size=(60000, 3)) + 2
os.kill(p.pid, signal.SIGCONT)
o, e = p.communicate()
print("rc", p.returncode, "|", (e.strip().splitlines() or [""])[-1][:300])
print("verify", run("verify", "FU2")[0])
if p.returncode == 0:
    # compare the embedding with the OUTDIR's own model applied to the final input
    shutil.rmtree("FU2_tr", ignore_errors=True)
    print(run("transform", "FU2", "up2.zarr", "--out", "FU2_tr", "-q")[0])
    E = zarr.open_array("FU2/embedding")[:]; T = zarr.open_array("FU2_tr/embedding")[:]
    print("rows differing from own model on the final input:", int((np.abs(E - T).max(axis=1) > 1e-8).sum()), "of", len(E))
