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


# --------------------------------------------------------------------------- outside audit 8


class _MakesADirectoryWhenUnpickled:
    """Unpickling this object creates a directory: the proof that a file was unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        import os

        return (os.mkdir, (self.path,))


def test_complex_data_are_refused_not_cast_to_their_real_parts(tmp_path, capsys):
    """A complex .npy was imported as its real parts with exit 0 (defect 13): it is refused
    with exit 2, naming the dtype and the fix, before any output is created."""
    X = np.array([[1 + 5j, 2 - 3j], [3 + 1j, 4 + 0j], [9j, 1 + 1j]])
    np.save(tmp_path / "c.npy", X)
    assert main(["import", str(tmp_path / "c.npy"), "--out", str(tmp_path / "c.zarr"),
                 "-q"]) == 2
    err = capsys.readouterr().err
    assert "c.npy: expected a real numeric dtype" in err and "got complex128" in err
    assert "X.real, X.imag" in err  # the fix
    assert not (tmp_path / "c.zarr").exists()
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("z", data=X.astype(np.complex64))
    with pytest.raises(InvalidInputError, match=r"dataset 'z'.*got complex64"):
        import_table(tmp_path / "c.h5", tmp_path / "h.zarr")


def test_malformed_files_are_input_errors_naming_the_problem(tmp_path, capsys):
    """A ragged CSV row and an object .npy exited 1 ("transient") with a raw pandas or numpy
    exception (defect 14); they exit 2 with the file, the problem and the fix, and an
    object array is never unpickled."""
    (tmp_path / "ragged.csv").write_text("a,b,c\n1,2,3\n4,5,6\n7,8,9,10\n")
    assert main(["import", str(tmp_path / "ragged.csv"), "--out", str(tmp_path / "r.zarr"),
                 "-q"]) == 2
    err = capsys.readouterr().err
    assert "ragged.csv: line 4 has 4 fields where the first line has 3" in err
    assert "fix that line" in err and "ParserError" not in err
    # a ragged line far past the first batch (found while streaming): the same
    lines = ["x,y"] + [f"{i},{i}" for i in range(1000)] + ["1,2,3"]
    (tmp_path / "late.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidInputError, match="late.csv: line 1002 has 3 fields"):
        import_table(tmp_path / "late.csv", tmp_path / "l.zarr", chunk_rows=100)

    marker = tmp_path / "unpickled"
    obj = np.empty((1, 2), dtype=object)
    obj[0, 0], obj[0, 1] = 1.0, _MakesADirectoryWhenUnpickled(marker)
    np.save(tmp_path / "obj.npy", obj, allow_pickle=True)
    assert main(["import", str(tmp_path / "obj.npy"), "--out", str(tmp_path / "o.zarr"),
                 "-q"]) == 2
    err = capsys.readouterr().err
    assert "obj.npy: expected a real numeric dtype" in err and "got object" in err
    assert "never loaded" in err and "memory-mapped" not in err
    assert not marker.exists()  # never unpickled

    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(InvalidInputError, match="empty.csv is empty"):
        import_table(tmp_path / "empty.csv", tmp_path / "e.zarr")
    np.save(tmp_path / "cut.npy", np.ones((100, 3)))
    raw = (tmp_path / "cut.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(raw[:len(raw) - 800])
    with pytest.raises(InvalidInputError, match="cut.npy cannot be read .* damaged or truncated"):
        import_table(tmp_path / "cut.npy", tmp_path / "t.zarr")
    (tmp_path / "junk.npy").write_bytes(b"not an array at all")
    with pytest.raises(InvalidInputError, match="junk.npy is not a readable .npy file"):
        import_table(tmp_path / "junk.npy", tmp_path / "j.zarr")


def test_a_first_line_of_numbers_is_data_not_a_header(tmp_path, caplog, capsys):
    """A headerless numeric CSV lost its first row to the header, silently (defect 15): a
    first line whose every cell is a number is data (with a warning); --header and
    --no-header decide explicitly."""
    src = tmp_path / "x.csv"
    src.write_text("1.5,2.25\n3.0,4.0\n5.0,6.0\n7.0,8.0\n")
    every = np.array([[1.5, 2.25], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    with caplog.at_level("WARNING", logger="ooc_spectral"):
        out = import_table(src, tmp_path / "auto.zarr")
    assert out["n"] == 4 and out["columns"] == ["0", "1"]
    np.testing.assert_array_equal(_data(tmp_path / "auto.zarr")[:], every)
    assert "the first line (1.5, 2.25) is all numbers, so it is read as data" in caplog.text
    caplog.clear()
    assert main(["import", str(src), "--out", str(tmp_path / "no.zarr"), "--no-header",
                 "--columns", "1", "-q"]) == 0
    np.testing.assert_array_equal(_data(tmp_path / "no.zarr")[:], every[:, [1]])
    assert "read as data" not in caplog.text + capsys.readouterr().err  # asked: no warning
    assert main(["import", str(src), "--out", str(tmp_path / "h.zarr"), "--header", "-q"]) == 0
    np.testing.assert_array_equal(_data(tmp_path / "h.zarr")[:], every[1:])
    assert zarr.open_group(str(tmp_path / "h.zarr"), mode="r").attrs[
        "ooc_spectral_import"]["columns"] == ["1.5", "2.25"]
    # a header with one name among numbers is a header, as before
    (tmp_path / "named.csv").write_text("x,2\n1,2\n3,4\n")
    assert import_table(tmp_path / "named.csv", tmp_path / "n.zarr")["n"] == 2
