"""Defects an outside audit of issue 52 found, through the command line (``main(argv)``).

Each test is marked ``xfail(strict=True)``: it documents a defect and starts to pass (and so
to fail as XPASS) once the defect is fixed; then remove the mark. Reproductions as shell
scripts are in ``workflows/audit/``.
"""

from __future__ import annotations

import http.server
import json
import threading

import numpy as np
import pytest
import zarr

from ooc_spectral.batch.cli import main


@pytest.fixture
def http_root(tmp_path):
    """An HTTP server on 127.0.0.1 serving ``tmp_path``; yields (base URL, request paths)."""
    seen: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(tmp_path), **k)

        def log_message(self, fmt, *args):  # record, do not print
            seen.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_workflow_cannot_leave_the_allowed_read_prefix_with_dot_dot(tmp_path, http_root):
    base, seen = http_root
    arr = zarr.create_array(tmp_path / "in.zarr", shape=(300, 2), chunks=(150, 2), dtype="f8")
    arr[:] = np.random.default_rng(0).normal(size=(300, 2))
    (tmp_path / "pub").mkdir()
    root = tmp_path / "root"
    root.mkdir()
    wf = root / "w.toml"
    wf.write_text(f'[[step]]\nrun = "inspect"\npath = "{base}/pub/../in.zarr"\n')
    code = main(["run", str(wf), "--allow", f"read={base}/pub", "-q"])
    outside = [p for p in seen if not p.startswith("/pub/")]
    assert code == 2 and outside == []


@pytest.mark.xfail(strict=True, reason="audit 52: fit reads a make-data data set whose chunk "
                   "no longer matches the digest make-data recorded (verify says damaged)")
def test_fit_refuses_a_data_set_whose_chunks_do_not_match_their_recorded_digests(tmp_path):
    ds = tmp_path / "ds"
    assert main(["make-data", "blobs", "--n", "1000", "--chunk-rows", "500", "--out", str(ds),
                 "-q"]) == 0
    (ds / "data" / "c" / "0" / "0").write_bytes((ds / "data" / "c" / "1" / "0").read_bytes())
    assert main(["verify", str(ds), "-q"]) == 1  # the data set knows it is damaged
    assert main(["fit", str(ds), "--out", str(tmp_path / "out"), "-q"]) == 2


@pytest.mark.xfail(strict=True, reason="audit 52: a data set's recorded description (seed, "
                   "centres) carries no digest: edited, verify says intact")
def test_verify_sees_an_edited_data_set_description(tmp_path):
    ds = tmp_path / "ds"
    assert main(["make-data", "blobs", "--n", "1000", "--chunk-rows", "500", "--seed", "1",
                 "--out", str(ds), "-q"]) == 0
    meta = ds / "zarr.json"
    z = json.loads(meta.read_text())
    z["attributes"]["ooc_spectral_dataset"]["seed"] = 99
    meta.write_text(json.dumps(z))
    assert main(["verify", str(ds), "-q"]) == 1


@pytest.mark.xfail(strict=True, reason="audit 52: a table rewritten in place while import "
                   "reads it is exit 2 blaming the data, not InputChangedError exit 1")
def test_import_of_a_table_rewritten_in_place_while_read_is_exit_1(tmp_path):
    import glob
    import os
    import signal
    import subprocess
    import sys
    import time

    rng = np.random.default_rng(1)
    table, alt = tmp_path / "t.csv", tmp_path / "alt.csv"
    np.savetxt(table, rng.normal(size=(60000, 3)), delimiter=",", header="a,b,c", comments="")
    np.savetxt(alt, rng.normal(size=(60000, 3)), delimiter=",", header="a,b,c", comments="")
    out = tmp_path / "imp"
    proc = subprocess.Popen([sys.executable, "-m", "ooc_spectral", "import", str(table), "--out",
                             str(out), "--chunk-rows", "1000", "-q"], stderr=subprocess.PIPE)
    while proc.poll() is None and not glob.glob(str(out / "data" / "c" / "*" / "*")):
        time.sleep(0.005)
    if proc.poll() is not None:
        pytest.skip("import finished before it could be paused")
    os.kill(proc.pid, signal.SIGSTOP)
    table.write_bytes(alt.read_bytes())  # in place: the same inode
    os.kill(proc.pid, signal.SIGCONT)
    proc.communicate(timeout=300)
    assert proc.returncode == 1
