"""The README's Python examples run as written and do what their comments say."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import zarr
from sklearn.datasets import make_s_curve, make_swiss_roll

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    """The README's ```python blocks, dedented (some sit inside a list item)."""
    blocks = re.findall(r"^( *)```python\n(.*?)^\1```", README.read_text(), re.S | re.M)
    return [re.sub(rf"^{indent}", "", body, flags=re.M) for indent, body in blocks]


def test_the_readme_has_the_python_examples_this_file_runs():
    blocks = python_blocks()
    assert len(blocks) == 2
    assert "est.fit(\"results/quickstart/swiss-roll.zarr\")" in blocks[0]
    assert "pipe.inverse_transform(emb)" in blocks[1]


def test_the_quick_start_from_python(tmp_path, monkeypatch):
    from ooc_spectral import GreedySpectralEmbedding

    monkeypatch.chdir(tmp_path)
    X, _ = make_swiss_roll(3000, random_state=0)
    Path("results/quickstart").mkdir(parents=True)
    arr = zarr.create_array("results/quickstart/swiss-roll.zarr", shape=X.shape,
                            chunks=(1000, 3), dtype="f8")
    arr[...] = X
    ns = {"X": X, "X_new": X[:50] + 0.01}
    exec(python_blocks()[0], ns)  # noqa: S102 -- our own documentation
    est = ns["est"]
    E = np.asarray(est.embedding_)
    assert E.shape == (3000, 2)
    # the last fit was on the numpy rows with output="emb.zarr": the same numbers on disk
    np.testing.assert_array_equal(zarr.open_array("emb.zarr/embedding", mode="r")[...], E)
    back = GreedySpectralEmbedding.load("model.zarr")
    np.testing.assert_allclose(back.transform(X[:50]), est.transform(X[:50]), rtol=0, atol=1e-12)


def test_the_pipeline_with_pandas_output_and_inverse_transform():
    pd = pytest.importorskip("pandas")
    X, _ = make_s_curve(1200, random_state=0)
    ns = {"X": X}
    exec(python_blocks()[1], ns)  # noqa: S102 -- our own documentation
    emb, back = ns["emb"], ns["back"]
    assert isinstance(emb, pd.DataFrame)
    assert list(emb.columns) == [f"greedyspectralembedding{i}" for i in range(10)]
    assert back.shape == X.shape
    # "the rows of df, reconstructed": within 5% of the data's RMS radius
    radius = np.sqrt(np.mean(np.sum((X - X.mean(0)) ** 2, axis=1)))
    err = np.sqrt(np.mean(np.sum((np.asarray(back) - X) ** 2, axis=1)))
    assert err < 0.05 * radius, err / radius
