"""Defects an outside audit of issue 52 found, through the command line (``main(argv)``).

Each test was marked ``xfail(strict=True)`` while its defect stood; the marks are removed as
the defects are fixed. Reproductions as shell scripts are in ``workflows/audit/``.
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


def test_fit_refuses_a_data_set_whose_chunks_do_not_match_their_recorded_digests(tmp_path,
                                                                                capsys):
    """A chunk copied over another (it decodes, its checksum holds): the fit names the chunk
    and make-data; the same make-data command repairs the data set, and the fit then runs on
    the rows make-data wrote."""
    ds = tmp_path / "ds"
    make = ["make-data", "blobs", "--n", "1000", "--chunk-rows", "500", "--out", str(ds), "-q"]
    assert main(make) == 0
    rows = np.asarray(zarr.open_array(ds / "data", mode="r")[...])
    (ds / "data" / "c" / "0" / "0").write_bytes((ds / "data" / "c" / "1" / "0").read_bytes())
    assert main(["verify", str(ds), "-q"]) == 1  # the data set knows it is damaged
    capsys.readouterr()
    for path in (ds, ds / "data"):  # the group, and its array by its own path
        assert main(["fit", str(path), "--out", str(tmp_path / "out"), "-q"]) == 2
        err = capsys.readouterr().err
        assert "chunk 0 (rows 0-499)" in err and "ooc-spectral make-data" in err, err
    from ooc_spectral.exceptions import DamagedDataError
    from ooc_spectral.io.source import open_source

    with pytest.raises(DamagedDataError, match="chunk 0"):  # the array opened by the caller
        open_source(zarr.open_array(ds / "data", mode="r")).read_rows(0, 10)
    assert main(make) == 0  # the same command: it checks the digests and writes it again
    np.testing.assert_array_equal(zarr.open_array(ds / "data", mode="r")[...], rows)
    assert main(["verify", str(ds), "-q"]) == 0
    assert main(["fit", str(ds), "--out", str(tmp_path / "out"), "-q"]) == 0


def test_an_imported_chunk_that_fails_its_digest_is_refused_and_the_import_repairs_it(tmp_path,
                                                                                      capsys):
    src, ds = tmp_path / "t.npy", tmp_path / "imp"
    np.save(src, np.random.default_rng(2).normal(size=(300, 3)))
    imp = ["import", str(src), "--out", str(ds), "--chunk-rows", "100", "-q"]
    assert main(imp) == 0
    (ds / "data" / "c" / "2" / "0").write_bytes((ds / "data" / "c" / "1" / "0").read_bytes())
    capsys.readouterr()
    assert main(["fit", str(ds), "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "chunk 2 (rows 200-299)" in err and "ooc-spectral import" in err, err
    assert main(imp) == 0
    np.testing.assert_array_equal(zarr.open_array(ds / "data", mode="r")[...], np.load(src))
    assert main(["verify", str(ds), "-q"]) == 0


@pytest.mark.parametrize("writer", ["make-data", "make-data-manifest-removed", "import"])
def test_verify_sees_an_edited_data_set_description(tmp_path, capsys, writer):
    """An edited field of the description (make-data's seed, its manifest of digests
    removed, import's source): verify exit 1, the fit refuses it naming the writer, the
    same writer's command repairs it."""
    ds = tmp_path / "ds"
    if writer.startswith("make-data"):
        cmd = ["make-data", "blobs", "--n", "1000", "--chunk-rows", "500", "--seed", "1",
               "--out", str(ds), "-q"]
        key, field, value = "ooc_spectral_dataset", "seed", 99
        if writer != "make-data":
            field, value = "members", None
        writer = "make-data"
    else:
        src = tmp_path / "t.npy"
        np.save(src, np.random.default_rng(3).normal(size=(300, 3)))
        cmd = ["import", str(src), "--out", str(ds), "--chunk-rows", "100", "-q"]
        key, field, value = "ooc_spectral_import", "source", "/elsewhere.npy"
    assert main(cmd) == 0
    meta = ds / "zarr.json"
    z = json.loads(meta.read_text())
    z["attributes"][key][field] = value
    meta.write_text(json.dumps(z))
    assert main(["verify", str(ds), "-q"]) == 1
    capsys.readouterr()
    assert main(["fit", str(ds), "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "edited since" in err and f"ooc-spectral {writer}" in err, err
    assert main(cmd) == 0
    assert main(["verify", str(ds), "-q"]) == 0
    assert zarr.open_group(ds, mode="r").attrs[key].get(field) != value


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


def test_a_chunk_torn_by_a_writer_while_transform_reads_is_input_changed_exit_1(
        tmp_path, monkeypatch, capsys):
    """A producer rewrites the input under a transform and the reader meets a chunk caught
    mid-write (it does not decode): that is the input changing (exit 1, rerun), not damage
    to fix (exit 2): the fingerprint is taken again when a command fails while reading."""
    from ooc_spectral.io.zarr_rows import ZarrRows

    inp, fit, out = tmp_path / "in.zarr", tmp_path / "fit", tmp_path / "t"
    arr = zarr.create_array(inp, shape=(2000, 3), chunks=(400, 3), dtype="f8")
    arr[:] = np.random.default_rng(4).normal(size=(2000, 3))
    threads = ["--engine", "threads", "--threads-per-worker", "1", "-q"]
    assert main(["fit", str(inp), "--out", str(fit), "--gamma", "0.5", "--n-components", "2",
                 *threads]) == 0
    original, calls = ZarrRows.read_stored, []

    def read_then_tear(self, start, stop):  # the threads engine: the reads run in this process
        calls.append(start)
        if len(calls) == 1:  # the writer is half-way through the last chunk
            (inp / "c" / "4" / "0").write_bytes(b"half a chunk")
        return original(self, start, stop)

    monkeypatch.setattr(ZarrRows, "read_stored", read_then_tear)
    capsys.readouterr()
    code = main(["transform", str(fit), str(inp), "--out", str(out), "--chunk-rows", "400",
                 *threads])
    err = capsys.readouterr().err
    assert code == 1 and "InputChangedError" in err and "changed while this run" in err, err
    assert not (out / "report.json").exists()
