import sys, os, shutil, time, signal, glob
sys.path.insert(0, "/tmp/a52"); from h import *
os.chdir(W)
# usage: during.py OUT INPUTPATH ALTPATH STAGE_GLOB -- cmd...
out, inp, alt, stage = sys.argv[1:5]; cmd = sys.argv[6:]
shutil.rmtree(out, ignore_errors=True)
if not os.path.exists(inp + ".orig"): shutil.copytree(inp, inp + ".orig")
shutil.rmtree(inp); shutil.copytree(inp + ".orig", inp)
p = popen(*cmd, "--out", out)
t0 = time.time()
while time.time() - t0 < 300:
    if glob.glob(os.path.join(out, stage)): break
    if p.poll() is not None: break
    time.sleep(0.02)
if p.poll() is not None:
    print("finished before the stage", p.returncode); sys.exit()
os.kill(p.pid, signal.SIGSTOP)
print("stopped at", stage, "after", round(time.time() - t0, 2), "s; files:", len(glob.glob(os.path.join(out, stage))))
# rewrite every chunk of the input with alt's (same shape & chunking)
for f in glob.glob(os.path.join(alt, "c", "**", "*"), recursive=True):
    if os.path.isfile(f):
        rel = os.path.relpath(f, alt); shutil.copy(f, os.path.join(inp, rel))
os.kill(p.pid, signal.SIGCONT)
o, e = p.communicate()
print("rc", p.returncode, "|", (e.strip().splitlines() or [""])[-1][:300])
rc2, _, e2 = run("verify", out)
print("verify", rc2, (e2.strip().splitlines() or [''])[-1][:200] if rc2 else "")
