"""Reliability: worker loss, determinism across workers/threads/chunking, security.

The bad-input matrix through the command line is in ``test_bad_input_cli.py``;
property-based tests of the scan are in ``test_scan_properties.py``.
"""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

import ooc_spectral
from ooc_spectral import GreedySpectralEmbedding, InvalidInputError, WorkflowError
from ooc_spectral.datasets import make_data

PARAMS = dict(n_components=3, gamma=0.05, tol=1e-3, chunk_rows=2000, random_state=4)


@pytest.fixture(scope="module")
def roll(tmp_path_factory):
    path = tmp_path_factory.mktemp("rel") / "roll.zarr"
    make_data("swiss-roll", 40_000, path, chunk_rows=2000, seed=3)  # 20 tasks per pass
    return path


@pytest.fixture(scope="module")
def two_workers():
    """A cluster of 2 workers x 1 thread that no test kills: the reference's, and one of
    the configurations the determinism test compares (a cluster each was one more start)."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cl:
        yield cl


@pytest.fixture(scope="module")
def reference(roll, tmp_path_factory, two_workers):
    """A fault-free run on a 2-worker cluster."""
    out = tmp_path_factory.mktemp("ref") / "out.zarr"
    with Client(two_workers):
        est = GreedySpectralEmbedding(**PARAMS).fit(str(roll), output=str(out))
    return est, zarr.open_array(str(out / "embedding"))[...]


def _kill_a_worker_when(client: Client, prefix: str, killed: list) -> threading.Thread:
    """Kill one worker process (SIGKILL) while tasks of ``prefix`` are being processed."""
    pids = list(client.run(os.getpid).values())

    def running(dask_scheduler, prefix=prefix):
        tp = dask_scheduler.task_prefixes.get(prefix)
        return 0 if tp is None else dict(tp.states).get("processing", 0)

    def watch():
        deadline = time.time() + 300
        while time.time() < deadline:
            if client.run_on_scheduler(running) > 0:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
                return
            time.sleep(0.005)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("prefix", ["chunk_moments", "write_block"])
def test_worker_killed_mid_pass_gives_identical_result(roll, reference, tmp_path, prefix):
    ref_est, ref_emb = reference
    out = tmp_path / "out.zarr"
    killed: list = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cl, \
            Client(cl) as client:
        watcher = _kill_a_worker_when(client, prefix, killed)
        est = GreedySpectralEmbedding(**PARAMS).fit(str(roll), output=str(out))
        watcher.join(timeout=1)
    assert killed, "the worker was not killed during the pass"
    np.testing.assert_array_equal(est.dictionary_indices_, ref_est.dictionary_indices_)
    np.testing.assert_array_equal(est.eigenvalues_, ref_est.eigenvalues_)
    got = zarr.open_array(str(out / "embedding"))[...]
    np.testing.assert_array_equal(got, ref_emb)
    assert zarr.open_array(str(out / "embedding")).attrs["complete"] is True


@pytest.fixture(scope="module")
def small_roll(tmp_path_factory):
    """Half the kill tests' roll in chunks of half the rows: the same 20 tasks per pass.
    No worker is killed on it, so no task needs to last long enough to be caught."""
    path = tmp_path_factory.mktemp("rel") / "small.zarr"
    make_data("swiss-roll", 20_000, path, chunk_rows=1000, seed=3)
    return path


def test_same_seed_same_result_whatever_workers_threads_and_chunks(small_roll, two_workers):
    # four configurations of workers, threads and chunk rows, each against the first's fit
    configs = [(1, 1, 1000), (2, 2, 1000), (1, 2, 5000), (2, 1, 3000)]
    ref_est = ref_emb = None
    for workers, threads, chunk_rows in configs:
        shared = contextlib.nullcontext(two_workers) if (workers, threads) == (2, 1) else \
            LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True,
                         dashboard_address=":0")
        with shared as cl, Client(cl):
            est = GreedySpectralEmbedding(**{**PARAMS, "chunk_rows": chunk_rows}).fit(str(small_roll))
            emb = est.embedding_.compute()
        if ref_est is None:
            ref_est, ref_emb = est, emb
            continue
        # the dictionary bit for bit, the embedding to 1e-12
        np.testing.assert_array_equal(est.dictionary_indices_, ref_est.dictionary_indices_)
        np.testing.assert_array_equal(est.dictionary_, ref_est.dictionary_)
        np.testing.assert_allclose(emb, ref_emb, rtol=0, atol=1e-12)
        np.testing.assert_allclose(est.eigenvalues_, ref_est.eigenvalues_, rtol=1e-12)


# --------------------------------------------------------------------------- #
# security
# --------------------------------------------------------------------------- #
def test_no_pickle_anywhere_in_the_package():
    root = Path(ooc_spectral.__file__).parent
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.split(".")[0] in ("pickle", "cloudpickle", "dill", "joblib")
                           for n in names), f"{path} imports {names}"
        assert "allow_pickle=True" not in path.read_text(), path


def test_loading_a_tampered_model_is_an_error_not_code(tmp_path):
    X = np.random.default_rng(0).normal(size=(300, 3))
    est = GreedySpectralEmbedding(tol=1e-2, random_state=0).fit(X)
    est.save(tmp_path / "m.zarr")
    g = zarr.open_group(str(tmp_path / "m.zarr"), mode="a")
    meta = dict(g.attrs["ooc_spectral_model"])
    meta["format"] = "__import__('os').system('touch pwned')"
    g.attrs["ooc_spectral_model"] = meta
    with pytest.raises(InvalidInputError, match="has format"):
        GreedySpectralEmbedding.load(tmp_path / "m.zarr")
    assert not Path("pwned").exists()
    del g.attrs["ooc_spectral_model"]
    with pytest.raises(InvalidInputError, match="not a complete saved model"):
        GreedySpectralEmbedding.load(tmp_path / "m.zarr")


def test_workflow_paths_resolve_relative_to_the_file_and_may_not_escape(tmp_path):
    from ooc_spectral.batch.cli import build_parser
    from ooc_spectral.batch.workflow import run_workflow

    wf = tmp_path / "wf" / "w.toml"
    wf.parent.mkdir()
    wf.write_text('[[step]]\nrun = "make-data"\nname = "spiral"\nn = 10\nout = "../../escape.zarr"\n')
    with pytest.raises(WorkflowError, match="outside the workflow's root"):
        run_workflow(wf, parser=build_parser())
    wf.write_text('[[step]]\nrun = "make-data"\nname = "spiral"\nn = 10\nout = "sub/d.zarr"\n')
    run_workflow(wf, parser=build_parser())
    assert (wf.parent / "sub" / "d.zarr" / "zarr.json").exists()


def test_two_lazy_embeddings_computed_together_keep_their_own_values():
    # pass 3's keys once had one fixed name: computed together (or one while the
    # other's results were held on a cluster), two fits shared keys and values
    import dask
    import dask.array as da

    X = da.from_array(np.random.default_rng(0).normal(size=(2000, 3)), chunks=500)
    a = GreedySpectralEmbedding(n_components=2, gamma=0.5, tol=1e-2, random_state=0).fit(X)
    b = GreedySpectralEmbedding(n_components=2, gamma=0.05, tol=1e-2, random_state=0).fit(X)
    ea, eb = dask.compute(a.embedding_, b.embedding_)
    np.testing.assert_array_equal(ea, a.embedding_.compute())
    np.testing.assert_array_equal(eb, b.embedding_.compute())
    assert np.abs(ea - eb).max() > 0.1
