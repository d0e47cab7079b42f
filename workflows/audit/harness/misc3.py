import sys, os, shutil, json, glob, time, subprocess
sys.path.insert(0, "/tmp/a52"); from h import *
os.chdir(W)
def L(e): return (e.strip().splitlines() or [""])[-1][:200]
# concurrent fit, verify, transform on one OUTDIR
shutil.rmtree("CC", ignore_errors=True); shutil.rmtree("CCT", ignore_errors=True)
pf = popen("fit", "big.zarr", "--out", "CC", "--chunk-rows", 10000, "-q")
time.sleep(3)
res = []
for i in range(6):
    v = run("verify", "CC"); t = run("transform", "CC", "in2.zarr", "--out", "CCT", "-q"); f2 = run("fit", "big.zarr", "--out", "CC", "--chunk-rows", 10000, "-q")
    res.append((pf.poll(), v[0], t[0], f2[0]))
    if pf.poll() is not None: break
    time.sleep(1)
o, e = pf.communicate(); print("first fit rc", pf.returncode, L(e))
print("during (fit alive?, verify, transform, second fit):", res)
print("after: verify", run("verify", "CC")[0], "transform", run("transform", "CC", "in2.zarr", "--out", "CCT", "-q")[0], "verify CCT", run("verify", "CCT")[0])
# read-only OUTDIR via a read-only bind mount
shutil.rmtree("RO", ignore_errors=True); shutil.copytree("ref_fit", "RO")
os.makedirs("/tmp/a52/ro_mnt", exist_ok=True)
r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind /tmp/a52/RO /tmp/a52/ro_mnt && mount -o remount,ro,bind /tmp/a52/ro_mnt && cd /tmp/a52 && PYTHONPATH=/work/wt/a52 ooc-spectral fit in.zarr --out /tmp/a52/ro_mnt --chunk-rows 500 -q; echo rerun-intact=$?; PYTHONPATH=/work/wt/a52 ooc-spectral verify /tmp/a52/ro_mnt >/dev/null 2>&1; echo verify=$?"], capture_output=True, text=True)
print("read-only complete OUTDIR:", r.stdout.strip().replace("\n", " "), L(r.stderr))
flip(chunks("RO/embedding")[1])
r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind /tmp/a52/RO /tmp/a52/ro_mnt && mount -o remount,ro,bind /tmp/a52/ro_mnt && cd /tmp/a52 && PYTHONPATH=/work/wt/a52 ooc-spectral fit in.zarr --out /tmp/a52/ro_mnt --chunk-rows 500 -q; echo rerun-damaged=$?"], capture_output=True, text=True)
print("read-only damaged OUTDIR:", r.stdout.strip(), L(r.stderr))
