"""``ooc-spectral import``: Parquet, CSV, .npy and HDF5 streamed into zarr (issue 15)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import zarr

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.batch.cli import main
from ooc_spectral.exceptions import IncompleteInputError, InvalidInputError
from ooc_spectral.io.importing import import_table

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def frame():
    rng = np.random.default_rng(0)
    n = 5000
    return pd.DataFrame({"x": rng.normal(size=n), "label": rng.choice(["a", "b"], n),
                         "y": rng.normal(size=n) * 1e-7, "k": rng.integers(0, 9, n),
                         "z": rng.uniform(-1e6, 1e6, n)})


pytestmark = pytest.mark.usefixtures("restore_logging")  # tests run main() in-process


def _data(path):
    return zarr.open_group(str(path), mode="r")["data"]


def test_parquet_import_equals_the_source(frame, tmp_path):
    src = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pandas(frame), src, row_group_size=700)
    out = import_table(src, tmp_path / "all.zarr", chunk_rows=1000)
    assert out["columns"] == ["x", "y", "k", "z"] and out["n"] == 5000  # the string column left
    arr = _data(tmp_path / "all.zarr")
    assert arr.chunks == (1000, 4) and arr.metadata.dimension_names == ("sample", "feature")
    np.testing.assert_array_equal(arr[:], frame[["x", "y", "k", "z"]].to_numpy(dtype=float))
    # column choice, in the order given, through the command line
    assert main(["import", str(src), "--out", str(tmp_path / "zx.zarr"), "--columns", "z,x",
                 "--chunk-rows", "512", "-q"]) == 0
    np.testing.assert_array_equal(_data(tmp_path / "zx.zarr")[:],
                                  frame[["z", "x"]].to_numpy())
    import_table(src, tmp_path / "kx.zarr", columns=["k", "x"], chunk_rows=512)
    # and fit reads it like any zarr input
    est = GreedySpectralEmbedding(2, gamma=0.05, tol=1e-2, random_state=0)
    a = est.fit(str(tmp_path / "kx.zarr")).eigenvalues_
    b = GreedySpectralEmbedding(2, gamma=0.05, tol=1e-2, random_state=0).fit(
        frame[["k", "x"]].to_numpy(dtype=float)).eigenvalues_
    np.testing.assert_array_equal(a, b)


def test_csv_import_equals_the_source(frame, tmp_path):
    src = tmp_path / "t.csv"
    frame.to_csv(src, index=False)
    out = import_table(src, tmp_path / "c.zarr", columns=["y", "x"], chunk_rows=999)
    assert out["n"] == 5000
    np.testing.assert_array_equal(_data(tmp_path / "c.zarr")[:], frame[["y", "x"]].to_numpy())
    with pytest.raises(InvalidInputError, match="no column 'w'.*x, label, y, k, z"):
        import_table(src, tmp_path / "w.zarr", columns=["w"])
    with pytest.raises(InvalidInputError, match="do not all convert to numbers"):
        import_table(src, tmp_path / "s.zarr", columns=["x", "label"], overwrite=True)


def test_csv_a_bad_value_early_in_a_numeric_column_is_an_error_not_a_dropped_column(
        frame, tmp_path, caplog):
    """With no --columns, a typo among a column's first rows made it look like text, and
    the column was dropped with exit 0 (an outside audit); text columns are still skipped,
    and named in the log."""
    bad = frame.astype({"z": object})
    bad.loc[5, "z"] = "1.2x"
    bad.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(InvalidInputError, match="column 'z' holds numbers, but row 5 holds '1.2x'"):
        import_table(tmp_path / "bad.csv", tmp_path / "bad.zarr")
    frame.to_csv(tmp_path / "t.csv", index=False)
    with caplog.at_level("WARNING", logger="ooc_spectral"):
        out = import_table(tmp_path / "t.csv", tmp_path / "t.zarr")
    assert out["columns"] == ["x", "y", "k", "z"]
    assert "skipping the non-numeric column(s) label" in caplog.text


def test_npy_and_hdf5_import_by_column_index(tmp_path):
    h5py = pytest.importorskip("h5py")
    X = np.random.default_rng(1).normal(size=(3001, 5))
    np.save(tmp_path / "x.npy", X)
    import_table(tmp_path / "x.npy", tmp_path / "n.zarr", columns=[4, 0], chunk_rows=700)
    np.testing.assert_array_equal(_data(tmp_path / "n.zarr")[:], X[:, [4, 0]])
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f.create_dataset("grp/values", data=X)
        f.create_dataset("labels", data=np.arange(3001))
    assert main(["import", str(tmp_path / "x.h5"), "--out", str(tmp_path / "h.zarr"),
                 "--chunk-rows", "1000", "-q"]) == 0
    np.testing.assert_array_equal(_data(tmp_path / "h.zarr")[:], X)


def test_import_streams_in_flat_memory(tmp_path):
    # 1,200,000 x 8 float64 (73 MiB) in 24 row groups, imported 65536 rows at a time
    # (numpy peak about 8.5 MiB: one batch and its column stack, whatever n)
    n, d = 1_200_000, 8
    rng = np.random.default_rng(2)
    table = pa.table({f"c{j}": rng.normal(size=n) for j in range(d)})
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=50_000)
    del table
    pool = pa.default_memory_pool()
    tracemalloc.start()
    try:
        import_table(tmp_path / "big.parquet", tmp_path / "big.zarr")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = n * d * 8
    assert peak < size / 4, f"numpy peak {peak / 2**20:.1f} MiB for {size / 2**20:.0f} MiB"
    # pyarrow's own buffers (not traced): its pool's high-water mark of the process
    # (about 21 MiB, 108 MiB if the file were pre-buffered)
    assert pool.max_memory() < size / 2, f"arrow peak {pool.max_memory() / 2**20:.1f} MiB"


def test_a_table_given_to_fit_says_how_to_convert_it(frame, tmp_path, capsys):
    src = tmp_path / "data.csv"
    frame.to_csv(src, index=False)
    with pytest.raises(InvalidInputError, match=r"is a CSV file, not a zarr store.*"
                                                r"ooc-spectral import .*data.csv --out .*data.zarr"):
        GreedySpectralEmbedding().fit(str(src))
    assert main(["fit", str(src), "--out", str(tmp_path / "o"), "-q"]) == 2
    assert "ooc-spectral import" in capsys.readouterr().err


def test_a_failed_import_is_refused_as_input(tmp_path):
    X = np.ones((300, 2))
    X[250, 1] = np.nan
    np.save(tmp_path / "bad.npy", X)
    with pytest.raises(InvalidInputError, match="row 250 .* non-finite"):
        import_table(tmp_path / "bad.npy", tmp_path / "bad.zarr", chunk_rows=100)
    with pytest.raises(IncompleteInputError, match="import"):
        GreedySpectralEmbedding().fit(str(tmp_path / "bad.zarr"))
