"""DEFECT: a CSV rewritten in place (same inode) while `import` reads it ends with exit 2,
"row N has a missing or non-finite value ... fill or drop those rows", blaming the data,
instead of InputChangedError, exit 1 (the docs: "`import` does the same with the table file
it reads"). A nightly job is told to fix a table that is fine; the same command succeeds
once the writer is done. (Replaced by a rename, the same change gives exit 1, as documented.)

Run with PYTHONPATH=<worktree>: python workflows/audit/import_table_rewritten_in_place.py
"""
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pandas as pd

d = tempfile.mkdtemp()
os.chdir(d)
pd.DataFrame(np.random.default_rng(1).normal(size=(200000, 3)), columns=list("abc")).to_csv("t.csv", index=False)
pd.DataFrame(np.random.default_rng(2).normal(size=(200000, 3)), columns=list("abc")).to_csv("alt.csv", index=False)
p = subprocess.Popen(["ooc-spectral", "import", "t.csv", "--out", "imp", "--chunk-rows", "2000"],
                     stderr=subprocess.PIPE, text=True)
while p.poll() is None and not glob.glob("imp/data/c/*/*"):
    time.sleep(0.005)
if p.poll() is not None:
    sys.exit(f"import finished before it could be paused (exit {p.returncode}); rerun")
os.kill(p.pid, signal.SIGSTOP)
with open("t.csv", "r+b") as f:  # the producer rewrites the table in place
    f.write(open("alt.csv", "rb").read())
os.kill(p.pid, signal.SIGCONT)
err = p.communicate()[1].strip().splitlines()[-1]
print(f"exit code {p.returncode} (expected 1, InputChangedError): {err[:200]}")
