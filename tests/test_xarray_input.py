"""xarray DataArray input (numpy- and dask-backed) and zarr v3 dimension names (issue 15)."""

from __future__ import annotations

import tracemalloc

import dask.array as da
import numpy as np
import pytest

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.datasets import make_data

xr = pytest.importorskip("xarray")


def _open(path):
    return xr.open_zarr(str(path), consolidated=False)


@pytest.fixture(scope="module")
def roll_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("xr") / "roll.zarr"
    make_data("swiss-roll", 3000, path, chunk_rows=500, seed=0)
    return path


def test_make_data_and_the_embedding_open_with_xarray(roll_store, tmp_path):
    ds = _open(roll_store)
    assert ds["data"].dims == ("sample", "feature") and ds["t"].dims == ("sample",)
    assert ds["data"].shape == (3000, 3)
    est = GreedySpectralEmbedding(2, gamma=0.05, tol=1e-3, random_state=0)
    est.fit(ds["data"], output=str(tmp_path / "emb.zarr"))  # one variable of open_zarr
    out = _open(tmp_path / "emb.zarr")
    assert out["embedding"].dims == ("sample", "component")
    np.testing.assert_array_equal(out["embedding"].values, np.asarray(est.embedding_))
    # the same fit as from the path
    ref = GreedySpectralEmbedding(2, gamma=0.05, tol=1e-3, random_state=0).fit(str(roll_store))
    np.testing.assert_array_equal(out["embedding"].values, np.asarray(ref.embedding_))


def test_numpy_backed_data_array_equals_numpy(roll_store):
    X = _open(roll_store)["data"].load()  # numpy-backed
    assert isinstance(X.data, np.ndarray)
    a = GreedySpectralEmbedding(2, gamma=0.05, tol=1e-3, random_state=0).fit(X)
    b = GreedySpectralEmbedding(2, gamma=0.05, tol=1e-3, random_state=0).fit(X.values)
    assert isinstance(a.embedding_, np.ndarray)
    np.testing.assert_array_equal(a.embedding_, b.embedding_)
    np.testing.assert_array_equal(a.transform(X[:40]), b.transform(X.values[:40]))


def test_dask_backed_data_array_stays_lazy(tmp_path):
    # 400,000 x 64 float32 on disk (98 MiB; 195 MiB as the float64 the kernels compute
    # in): the fit reads it chunk by chunk, its traced peak (about 35 MiB, the same at
    # half the rows) stays far below
    path = tmp_path / "wide.zarr"
    make_data("swiss-roll", 400_000, path, dim=64, chunk_rows=5_000, seed=0)
    X = _open(path)["data"]
    assert isinstance(X.data, da.Array)
    size64 = X.shape[0] * X.shape[1] * 8
    tracemalloc.start()
    try:
        est = GreedySpectralEmbedding(2, dictionary_size=20, tol=None, sample_size=1000,
                                      chunk_rows=5_000, random_state=0).fit(X)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(est.embedding_, da.Array)  # lazy, as for any dask input
    assert peak < size64 / 4, f"traced peak {peak / 2**20:.1f} MiB for {size64 / 2**20:.0f} MiB"
    ref = GreedySpectralEmbedding(2, dictionary_size=20, tol=None, sample_size=1000,
                                  chunk_rows=5_000, random_state=0).fit(X.data)
    np.testing.assert_array_equal(est.eigenvalues_, ref.eigenvalues_)
    np.testing.assert_array_equal(est.dictionary_indices_, ref.dictionary_indices_)
