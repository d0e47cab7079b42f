import sys, os, shutil, time, signal, glob
sys.path.insert(0, "/tmp/a52"); from h import *
os.chdir(W)
engine = sys.argv[1]
for d in ("FM", "FM_alt", "TM", "TM_old", "TM_new"): shutil.rmtree(d, ignore_errors=True)
assert run("fit", "in.zarr", "--out", "FM", "--chunk-rows", 500, "-q")[0] == 0
assert run("fit", "in.zarr", "--out", "FM_alt", "--chunk-rows", 500, "--seed", 1, "--gamma", 0.3, "-q")[0] == 0
shutil.copytree("FM", "FM_orig")  if not os.path.exists("FM_orig") else None
assert run("transform", "FM", "big.zarr", "--out", "TM_old", "--engine", engine, "-q")[0] == 0
p = popen("transform", "FM", "big.zarr", "--out", "TM", "--engine", engine)
t0 = time.time()
while time.time() - t0 < 300 and p.poll() is None and len(glob.glob("TM/embedding/c/*/*")) < 3: time.sleep(0.02)
os.kill(p.pid, signal.SIGSTOP); print("stopped after", len(glob.glob("TM/embedding/c/*/*")), "chunks")
os.rename("FM", "FM_gone"); shutil.copytree("FM_alt", "FM")
os.kill(p.pid, signal.SIGCONT)
o, e = p.communicate(); print("rc", p.returncode, (e.strip().splitlines() or [""])[-1][:300])
shutil.rmtree("FM_gone")
assert run("transform", "FM", "big.zarr", "--out", "TM_new", "--engine", engine, "-q")[0] == 0
import zarr, numpy as np
a = zarr.open_array("TM/embedding")[:]; old = zarr.open_array("TM_old/embedding")[:]; new = zarr.open_array("TM_new/embedding")[:]
rows_old = np.all(a == old, axis=1).sum(); rows_new = np.all(a == new, axis=1).sum()
print("rows equal old model:", rows_old, "new model:", rows_new, "of", len(a))
print("verify", run("verify", "TM")[0])
