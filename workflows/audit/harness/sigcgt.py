import subprocess, os, time, signal, sys, shutil
os.environ["PYTHONPATH"] = "/work/wt/a52"
B = "/root/.pyenv/versions/3.11.7/bin/ooc-spectral"
for delay in (0, 0.001, 0.005, 0.02, 0.05, 0.1, 0.2):
    shutil.rmtree("/tmp/a52/sx", ignore_errors=True)
    p = subprocess.Popen([B, "fit", "/tmp/a52/in.zarr", "--out", "/tmp/a52/sx", "-q"], stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while True:
        try:
            st = open(f"/proc/{p.pid}/status").read()
        except FileNotFoundError: break
        cgt = int([l for l in st.splitlines() if l.startswith("SigCgt")][0].split()[1], 16)
        if cgt & (1 << 14): break
        time.sleep(0.0005)
    t1 = time.time(); time.sleep(delay)
    p.send_signal(signal.SIGTERM); e = p.communicate()[1]
    print(f"handler after {t1-t0:.3f}s, +{delay}: rc={p.returncode}", e.strip().splitlines()[-1][:150] if e.strip() else "")
