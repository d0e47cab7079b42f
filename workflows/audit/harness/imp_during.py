import sys, os, shutil, time, signal, glob
sys.path.insert(0, "/tmp/a52"); from h import *
os.chdir(W)
import pandas as pd
if not os.path.exists("bigtab.csv.orig"):
    pd.DataFrame(np.random.default_rng(1).normal(size=(600000, 3)), columns=list("abc")).to_csv("bigtab.csv.orig", index=False)
    pd.DataFrame(np.random.default_rng(2).normal(size=(600000, 3)), columns=list("abc")).to_csv("bigtab.csv.alt", index=False)
mode = sys.argv[1]  # inplace (same inode) or replace (rename)
shutil.copy("bigtab.csv.orig", "bigtab.csv"); shutil.rmtree("IMP", ignore_errors=True)
p = popen("import", "bigtab.csv", "--out", "IMP", "--chunk-rows", 20000) if False else popen("import", "bigtab.csv", "--out", "IMP")
t0 = time.time()
while p.poll() is None and not glob.glob("IMP/data/c/*/*") and time.time() - t0 < 300: time.sleep(0.01)
if p.poll() is not None: print("finished early", p.returncode); sys.exit()
os.kill(p.pid, signal.SIGSTOP); print("stopped after", round(time.time() - t0, 2), glob.glob("IMP/data/c/*/*"))
if mode == "inplace":
    with open("bigtab.csv", "r+b") as f: f.write(open("bigtab.csv.alt", "rb").read())
else:
    shutil.copy("bigtab.csv.alt", "bigtab.csv.tmp"); os.replace("bigtab.csv.tmp", "bigtab.csv")
os.kill(p.pid, signal.SIGCONT)
o, e = p.communicate(); print("rc", p.returncode, (e.strip().splitlines() or [""])[-1][:250])
print("verify", run("verify", "IMP")[0])
if p.returncode == 0:
    a = zarr.open_array("IMP/data")[:]; new = pd.read_csv("bigtab.csv").to_numpy()
    print("rows equal to the final table:", int(np.all(a == new, axis=1).sum()), "of", len(a))
