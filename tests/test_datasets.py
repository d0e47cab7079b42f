"""Synthetic data sets: formulas, labels, streaming to zarr, reproducibility, errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import zarr

from ooc_spectral.io import datasets as ds
from ooc_spectral.datasets import (
    DATASET_KEY,
    DATASETS,
    GENERATION_BLOCK_ROWS,
    blob_centers,
    generate,
    halo_geometry,
    make_data,
    open_dataset,
)
from ooc_spectral.exceptions import (
    InvalidInputError,
    InvalidParameterError,
    OutputNotWritableError,
    StoreNotFoundError,
)

NAMES = sorted(DATASETS)
# More than two generation blocks, and not a multiple of anything used below.
N = 2 * GENERATION_BLOCK_ROWS + 4321


def _read(path):
    data, labels, attrs = open_dataset(path)
    return data[...], {k: v[...] for k, v in labels.items()}, attrs


# --------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("name", NAMES)
def test_values_do_not_depend_on_chunking_and_equal_generate(name, tmp_path, monkeypatch):
    # Small regions, so that regions cut generation blocks in two.
    monkeypatch.setattr(ds, "REGION_BYTES_TARGET", 8 * 5 * 3000)
    kw = {"dim": 5, "noise": 0.01, "seed": 7}
    a = make_data(name, N, tmp_path / "a", chunk_rows=1000, threads=1, **kw)
    b = make_data(name, N, tmp_path / "b", chunk_rows=7919, threads=3, **kw)
    Xa, La, attrs_a = _read(a)
    Xb, Lb, attrs_b = _read(b)
    assert attrs_a["chunk_rows"] == 1000 and attrs_b["chunk_rows"] == 7919
    assert zarr.open_array(f"{a}/data").chunks == (1000, 5)
    assert zarr.open_array(f"{b}/data").chunks == (7919, 5)
    np.testing.assert_array_equal(Xa, Xb)
    assert La.keys() == Lb.keys() == set(DATASETS[name].label_names)
    for key in La:
        np.testing.assert_array_equal(La[key], Lb[key])
        assert zarr.open_array(f"{a}/{key}").chunks == (1000,)

    X, L = generate(name, N, dtype="float32", **kw)
    assert X.dtype == np.float32 and Xa.dtype == np.float32
    np.testing.assert_array_equal(Xa, X)
    for key in L:
        np.testing.assert_array_equal(La[key], L[key])
    # Not a degenerate array: rows differ, every column varies.
    assert np.all(X.std(axis=0) > 0)
    assert len(np.unique(X[:, 0])) > N // 2


def test_float64_store_equals_generate_exactly(tmp_path):
    out = make_data("fishbowl", 5000, tmp_path / "f", dim=4, noise=0.02, seed=3,
                    dtype="float64", chunk_rows=999)
    X, L = generate("fishbowl", 5000, dim=4, noise=0.02, seed=3)
    Xs, Ls, attrs = _read(out)
    assert Xs.dtype == np.float64 and attrs["dtype"] == "float64"
    np.testing.assert_array_equal(Xs, X)
    np.testing.assert_array_equal(Ls["u"], L["u"])
    np.testing.assert_array_equal(Ls["v"], L["v"])


def test_writes_are_chunk_aligned_and_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(ds, "REGION_BYTES_TARGET", 8 * 3 * 2500)
    calls = []
    real = ds._write_region

    def spy(arrays, start, stop, values):
        calls.append((start, stop))
        real(arrays, start, stop, values)

    monkeypatch.setattr(ds, "_write_region", spy)
    progress = []
    make_data("swiss-roll", 20_001, tmp_path / "s", chunk_rows=1000,
              progress=lambda done, n: progress.append((done, n)))
    starts, stops = zip(*calls, strict=True)
    assert starts[0] == 0 and stops[-1] == 20_001
    assert list(starts[1:]) == list(stops[:-1])  # contiguous, in order
    assert all(s % 1000 == 0 for s in starts)  # aligned to storage chunks
    assert max(b - a for a, b in calls) <= 2000  # bounded, independent of n
    assert [d for d, _ in progress] == list(stops) and all(n == 20_001 for _, n in progress)


def test_attributes_describe_the_data(tmp_path):
    out = make_data("halo-ball", 3000, tmp_path / "h", dim=6, seed=11, chunk_rows=512,
                    ball_fraction=0.4)
    data, labels, attrs = open_dataset(out)
    assert data.shape == (3000, 6) and data.dtype == np.float32
    assert set(labels) == {"label"} and labels["label"].shape == (3000,)
    assert attrs["complete"] is True
    assert attrs["name"] == "halo-ball" and attrs["n"] == 3000 and attrs["dim"] == 6
    assert attrs["intrinsic_dim"] == 3 and attrs["seed"] == 11 and attrs["noise"] == 0.0
    assert attrs["chunk_rows"] == 512 and attrs["dtype"] == "float32"
    # Resolved parameters: the one passed and every default.
    assert attrs["params"]["ball_fraction"] == 0.4
    assert attrs["params"]["cut"] == pytest.approx(0.2)
    assert attrs["params"]["d"] == pytest.approx(math.pi / 4)
    assert attrs["labels"] == {"label": "class"}
    # The attributes alone regenerate the data.
    X, _ = generate(attrs["name"], attrs["n"], dim=attrs["dim"], noise=attrs["noise"],
                    seed=attrs["seed"], dtype=attrs["dtype"], **attrs["params"])
    np.testing.assert_array_equal(data[...], X)


def test_default_chunk_rows_and_source_integration(tmp_path):
    from ooc_spectral.io.source import open_source

    assert ds.default_chunk_rows(10**9, 32, "float32") == 1 << 16
    assert ds.default_chunk_rows(10**9, 3, "float64") == 1 << 18
    assert ds.default_chunk_rows(100, 3) == 100
    out = make_data("spiral", 1000, tmp_path / "sp")
    assert zarr.open_group(out, mode="r")[ds.DATA_ARRAY_NAME].chunks == (1000, 2)
    src = open_source(out)  # the estimator's reader picks the `data` array of the group
    assert src.shape == (1000, 2)
    np.testing.assert_array_equal(src.read_rows(0, 1000), generate("spiral", 1000,
                                                                   dtype="float32")[0])


# --------------------------------------------------------------------------- complete marker


def test_complete_only_after_the_last_block(tmp_path, monkeypatch):
    out = tmp_path / "c"
    seen = []
    real = ds._write_region

    def spy(arrays, start, stop, values):
        seen.append(zarr.open_group(str(out), mode="r").attrs[DATASET_KEY]["complete"])
        real(arrays, start, stop, values)

    monkeypatch.setattr(ds, "_write_region", spy)
    monkeypatch.setattr(ds, "REGION_BYTES_TARGET", 8 * 3 * 1000)
    make_data("swiss-roll", 5000, out, chunk_rows=1000)
    assert seen == [False] * 5
    assert zarr.open_group(str(out), mode="r").attrs[DATASET_KEY]["complete"] is True


def test_interrupted_run_is_never_complete(tmp_path, monkeypatch):
    out = tmp_path / "broken"
    calls = []
    real = ds._write_region

    def failing(arrays, start, stop, values):
        calls.append(start)
        if len(calls) == 3:
            raise OSError("disk full (simulated)")
        real(arrays, start, stop, values)

    monkeypatch.setattr(ds, "_write_region", failing)
    monkeypatch.setattr(ds, "REGION_BYTES_TARGET", 8 * 3 * 1000)
    with pytest.raises(OSError, match="disk full"):
        make_data("swiss-roll", 10_000, out, chunk_rows=1000)
    assert len(calls) == 3  # stopped at the failure, did not write the rest
    attrs = zarr.open_group(str(out), mode="r").attrs[DATASET_KEY]
    assert attrs["complete"] is False
    with pytest.raises(InvalidInputError, match="incomplete.*overwrite"):
        open_dataset(out)
    # Rerunning without overwrite is refused; with overwrite it completes.
    monkeypatch.setattr(ds, "_write_region", real)
    with pytest.raises(OutputNotWritableError):
        make_data("swiss-roll", 10_000, out, chunk_rows=1000)
    make_data("swiss-roll", 10_000, out, chunk_rows=1000, overwrite=True)
    X, _, attrs = _read(out)
    assert attrs["complete"] is True
    np.testing.assert_array_equal(X, generate("swiss-roll", 10_000, dtype="float32")[0])


def test_failure_while_generating_is_not_complete(tmp_path, monkeypatch):
    real = ds._generate_block

    def failing(plan, b):
        if b == 2:
            raise MemoryError("simulated")
        return real(plan, b)

    monkeypatch.setattr(ds, "_generate_block", failing)
    with pytest.raises(MemoryError):
        make_data("spiral", N, tmp_path / "g", chunk_rows=4096, threads=2)
    assert zarr.open_group(str(tmp_path / "g"), mode="r").attrs[DATASET_KEY]["complete"] is False


# --------------------------------------------------------------------------- overwrite


def test_overwrite_protection(tmp_path):
    out = make_data("blobs", 500, tmp_path / "b", seed=1)
    with pytest.raises(OutputNotWritableError, match="already exist.*overwrite=True"):
        make_data("blobs", 800, out, seed=1)
    X, _, attrs = _read(out)
    assert X.shape == (500, 2) and attrs["n"] == 500  # untouched
    make_data("blobs", 800, out, seed=2, dim=4, overwrite=True)
    X, labels, attrs = _read(out)
    assert X.shape == (800, 4) and attrs["n"] == 800 and attrs["seed"] == 2
    assert labels["label"].shape == (800,)


def test_overwrite_never_deletes_a_foreign_directory(tmp_path):
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    for overwrite in (False, True):
        with pytest.raises(OutputNotWritableError):
            make_data("spiral", 100, foreign, overwrite=overwrite)
    assert (foreign / "thesis.tex").read_text() == "precious"
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(OutputNotWritableError, match="file"):
        make_data("spiral", 100, a_file, overwrite=True)


def test_open_dataset_errors(tmp_path):
    with pytest.raises(StoreNotFoundError, match="make-data"):
        open_dataset(tmp_path / "nothing")
    zarr.open_group(str(tmp_path / "plain"), mode="w")
    with pytest.raises(InvalidInputError, match="not a data set"):
        open_dataset(tmp_path / "plain")


# --------------------------------------------------------------------------- formulas


def test_swiss_roll_formula():
    X, L = generate("swiss-roll", 20_000, seed=5)
    t = L["t"]
    assert X.shape == (20_000, 3) and t.shape == (20_000,)
    assert t.min() >= 1.5 * np.pi and t.max() <= 4.5 * np.pi
    np.testing.assert_allclose(X[:, 0], t * np.cos(t))
    np.testing.assert_allclose(X[:, 2], t * np.sin(t))
    assert X[:, 1].min() >= 0 and X[:, 1].max() <= 21
    # t = 1.5 pi (1 + 2u) with u uniform: the quartiles of t are where they should be.
    u = (t / (1.5 * np.pi) - 1) / 2
    np.testing.assert_allclose(np.quantile(u, [0.25, 0.5, 0.75]), [0.25, 0.5, 0.75], atol=0.02)
    np.testing.assert_allclose(np.quantile(X[:, 1] / 21, [0.25, 0.75]), [0.25, 0.75], atol=0.02)


def test_spiral_formula():
    X, L = generate("spiral", 10_000, seed=2, t_min=1.0, t_max=7.0)
    t = L["t"]
    assert t.min() >= 1.0 and t.max() <= 7.0 and t.max() - t.min() > 5.9
    np.testing.assert_allclose(X, np.column_stack([t * np.cos(t), t * np.sin(t)]))
    np.testing.assert_allclose(np.hypot(X[:, 0], X[:, 1]), t)  # radius = angle


def test_fishbowl_is_the_open_ellipsoid_of_section_3_1():
    a, b, c, d = 2.0, 1.5, 0.5, math.pi / 3
    n = 9000
    X, L = generate("fishbowl", n, seed=4, a=a, b=b, c=c, d=d)
    u, v = L["u"], L["v"]
    np.testing.assert_allclose((X[:, 0] / a) ** 2 + (X[:, 1] / b) ** 2 + (X[:, 2] / c) ** 2, 1.0)
    np.testing.assert_allclose(X[:, 0], a * np.cos(u) * np.sin(v))
    np.testing.assert_allclose(X[:, 1], b * np.sin(u) * np.sin(v))
    np.testing.assert_allclose(X[:, 2], c * np.cos(v))
    # v uniform over [d, pi]: an opening of angle d at the top, closed at the bottom.
    assert v.min() >= d and v.max() <= np.pi
    assert X[:, 2].max() <= c * math.cos(d) + 1e-12 and X[:, 2].min() < -0.99 * c
    np.testing.assert_allclose(np.median(v), (d + np.pi) / 2, atol=0.03)
    # u: a regularly spaced sequence over [0, 2 pi), one value per row.
    np.testing.assert_allclose(u, 2 * np.pi * np.arange(n) / n)
    # u_sampling="uniform" draws u instead, with the same shape of the data.
    _, Lu = generate("fishbowl", n, seed=4, u_sampling="uniform")
    assert not np.all(np.diff(Lu["u"]) > 0)
    assert Lu["u"].min() >= 0 and Lu["u"].max() < 2 * np.pi


def test_halo_ball_section_3_2():
    n = 40_000
    X, L = generate("halo-ball", n, seed=9)
    label = L["label"]
    assert label.dtype == np.int32 and set(np.unique(label)) == {0, 1}
    assert abs(label.mean() - 0.25) < 0.02  # default ball_fraction
    p = dict(DATASETS["halo-ball"].defaults)
    v_max, z_cut, center = halo_geometry(p)
    assert v_max == pytest.approx(math.acos(z_cut))
    halo, ball = X[label == 0], X[label == 1]
    # The halo: the unit-sphere fishbowl without its bottom fifth (of the height).
    np.testing.assert_allclose(np.linalg.norm(halo, axis=1), 1.0)
    top = math.cos(p["d"])
    assert z_cut == pytest.approx(-1 + 0.2 * (1 + top))
    assert halo[:, 2].min() >= z_cut - 1e-12 and halo[:, 2].max() <= top + 1e-12
    assert halo[:, 2].min() < z_cut + 0.01  # the cut is reached
    # The ball: a solid glob in the middle of the halo, well separated from it.
    assert center[:2].tolist() == [0.0, 0.0]
    assert center[2] == pytest.approx((z_cut + top) / 2)
    r = np.linalg.norm(ball - center, axis=1)
    assert r.max() <= p["ball_radius"] + 1e-12
    assert np.median(r) == pytest.approx(p["ball_radius"] * 0.5 ** (1 / 3), rel=0.03)  # solid
    assert np.linalg.norm(halo - center, axis=1).min() > 0.5
    # Parameters move the proportion.
    _, L2 = generate("halo-ball", n, seed=9, ball_fraction=0.6)
    assert abs(L2["label"].mean() - 0.6) < 0.02


def test_blobs_labels_and_centers(tmp_path):
    n = 30_000
    X, L = generate("blobs", n, seed=3, n_clusters=5, cluster_std=0.5)
    label = L["label"]
    assert label.dtype == np.int32 and label.min() >= 0 and label.max() <= 4
    counts = np.bincount(label, minlength=5)
    assert np.all(np.abs(counts / n - 0.2) < 0.02)
    centers = blob_centers(3, 5, 2, 10.0)
    assert np.all(np.abs(centers) <= 10)
    for k in range(5):
        pts = X[label == k]
        np.testing.assert_allclose(pts.mean(axis=0), centers[k], atol=0.05)
        np.testing.assert_allclose(pts.std(axis=0), 0.5, rtol=0.06)
    # Centres depend on the seed only, and are recorded in the store.
    out = make_data("blobs", 1000, tmp_path / "b", seed=3, n_clusters=5, cluster_std=0.5)
    np.testing.assert_allclose(open_dataset(out)[2]["centers"], centers)
    assert not np.allclose(blob_centers(4, 5, 2, 10.0), centers)
    # n_features sets the intrinsic dimension.
    X3, _ = generate("blobs", 100, n_features=7)
    assert X3.shape == (100, 7)


# --------------------------------------------------------------------------- dim, noise, seed


@pytest.mark.parametrize("name", NAMES)
def test_dim_pads_with_noise_columns(name):
    k = DATASETS[name].intrinsic_dim
    X0, L0 = generate(name, 20_000, seed=1)
    X, L = generate(name, 20_000, seed=1, dim=k + 6)
    assert X0.shape == (20_000, k) and X.shape == (20_000, k + 6)
    np.testing.assert_array_equal(X[:, :k], X0)  # intrinsic part unchanged by padding
    for key in L0:
        np.testing.assert_array_equal(L[key], L0[key])
    pad_std = DATASETS[name].defaults["pad_std"]
    np.testing.assert_allclose(X[:, k:].std(axis=0), pad_std, rtol=0.05)
    np.testing.assert_allclose(X[:, k:].mean(axis=0), 0.0, atol=0.05 * pad_std)
    # Padding columns are independent of each other and of the data.
    corr = np.corrcoef(X, rowvar=False)[k:, :]
    corr[:, k:] -= np.eye(6)
    assert np.abs(corr).max() < 0.05
    with pytest.raises(InvalidParameterError, match=rf"dim is {k - 1}.*>= {k}"):
        generate(name, 10, dim=k - 1)


def test_noise_adds_gaussian_to_every_coordinate():
    X0, L0 = generate("swiss-roll", 20_000, seed=8, dim=5)
    X, L = generate("swiss-roll", 20_000, seed=8, dim=5, noise=0.3)
    np.testing.assert_array_equal(L["t"], L0["t"])
    diff = X - X0
    np.testing.assert_allclose(diff.std(axis=0), 0.3, rtol=0.05)
    np.testing.assert_allclose(diff.mean(axis=0), 0.0, atol=0.015)
    assert DATASETS["swiss-roll"].default_noise == 0.0
    np.testing.assert_array_equal(generate("swiss-roll", 100, seed=8, noise=0.0)[0],
                                  generate("swiss-roll", 100, seed=8)[0])


def test_seed_controls_the_values():
    a = generate("spiral", 1000, seed=1)[0]
    assert np.array_equal(a, generate("spiral", 1000, seed=1)[0])
    assert not np.allclose(a, generate("spiral", 1000, seed=2)[0])
    # Different data sets with the same seed do not share streams.
    t_spiral = generate("spiral", 1000, seed=1)[1]["t"]
    t_roll = generate("swiss-roll", 1000, seed=1)[1]["t"]
    assert not np.allclose(t_spiral, t_roll)


# --------------------------------------------------------------------------- registry, errors


def test_registry():
    assert set(DATASETS) == {"spiral", "swiss-roll", "fishbowl", "halo-ball", "blobs"}
    expected = {"spiral": (2, {"t": "parameter"}), "swiss-roll": (3, {"t": "parameter"}),
                "fishbowl": (3, {"u": "parameter", "v": "parameter"}),
                "halo-ball": (3, {"label": "class"}), "blobs": (2, {"label": "class"})}
    for name, spec in DATASETS.items():
        assert spec.name == name
        assert (spec.intrinsic_dim, spec.label_kinds) == expected[name]
        assert spec.description and "\n" not in spec.description
        assert "pad_std" in spec.defaults
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.name = "other"
    np.testing.assert_array_equal(generate("swiss_roll", 10)[0], generate("swiss-roll", 10)[0])


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: generate("moons", 10), ["unknown data set 'moons'", "swiss-roll", "halo-ball"]),
        (lambda: generate("spiral", 0), ["n (the number of rows) is 0", ">= 1"]),
        (lambda: generate("spiral", 1e6), ["1000000.0", "integer", "not a float"]),
        (lambda: generate("spiral", True), ["True", "integer"]),
        (lambda: generate("spiral", 10, noise=-1.0), ["noise is -1.0", ">= 0"]),
        (lambda: generate("spiral", 10, noise=float("nan")), ["noise is nan", "finite"]),
        (lambda: generate("spiral", 10, seed=-3), ["seed is -3", "non-negative"]),
        (lambda: generate("spiral", 10, dim=2.5), ["dim is 2.5", "integer"]),
        (lambda: generate("spiral", 10, sigma=1.0), ["unknown parameter 'sigma'", "t_max"]),
        (lambda: generate("spiral", 10, t_min=5.0, t_max=1.0), ["t_max", "greater than t_min"]),
        (lambda: generate("halo-ball", 10, ball_fraction=1.5), ["ball_fraction", "(0, 1)"]),
        (lambda: generate("fishbowl", 10, d=4.0), ["'d'", "[0, pi)"]),
        (lambda: generate("fishbowl", 10, u_sampling="random"), ["u_sampling", "'grid'"]),
        (lambda: generate("blobs", 10, n_clusters=2.5), ["n_clusters", "integer"]),
        (lambda: generate("blobs", 10, cluster_std="wide"), ["cluster_std", "real number"]),
        (lambda: generate("spiral", 10, dtype="int32"), ["dtype", "float32"]),
    ],
)
def test_bad_parameters_raise_with_a_useful_message(call, words):
    with pytest.raises(InvalidParameterError) as info:
        call()
    assert isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value)


def test_bad_parameters_are_rejected_before_writing(tmp_path):
    for kwargs in ({"chunk_rows": 0}, {"dtype": "float16"}, {"dim": 1}, {"threads": 0}):
        out = tmp_path / f"x{len(list(tmp_path.iterdir()))}"
        with pytest.raises(InvalidParameterError):
            make_data("swiss-roll", 100, out, **kwargs)
        assert not out.exists()


# --------------------------------------------------------------------------- outside audit 8


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_values_a_dtype_cannot_hold_are_refused_before_writing(tmp_path, monkeypatch, capsys):
    """noise=1e39 in float32 was stored as infinity with exit 0, and verify called it
    intact (defect 6): it is refused up front, exit 2, naming the noise, the dtype and the
    fix; float64 holds it."""
    from ooc_spectral.batch.cli import main

    with pytest.raises(InvalidParameterError,
                       match=r"noise = 1e\+39.*largest finite float32.*--noise.*float64"):
        make_data("swiss-roll", 200, tmp_path / "a", noise=1e39)
    assert not (tmp_path / "a").exists()
    with pytest.raises(InvalidParameterError, match="t_max=1e\\+300.*smaller parameter values"):
        generate("spiral", 10, dtype="float32", t_max=1e300)
    with pytest.raises(InvalidParameterError, match="pad_std = 1e\\+38"):
        make_data("fishbowl", 10, tmp_path / "p", dim=5, pad_std=1e38)
    assert np.isfinite(generate("swiss-roll", 200, noise=1e39, dtype="float64")[0]).all()
    assert main(["make-data", "swiss-roll", "--n", "200", "--noise", "1e39", "--out",
                 str(tmp_path / "c"), "-q"]) == 2
    assert "stored as infinity" in capsys.readouterr().err
    # the last guard: a region that is not finite anyway is never written
    monkeypatch.setattr(ds, "check_representable", lambda plan, dt: None)
    with pytest.raises(InvalidParameterError, match=r"row 0 of 'swiss-roll' is not finite in "
                                                    r"float32.*marked incomplete"):
        make_data("swiss-roll", 200, tmp_path / "d", noise=1e39)
    assert zarr.open_group(str(tmp_path / "d"), mode="r").attrs[DATASET_KEY]["complete"] is False


def test_wide_rows_are_generated_in_bounded_pieces_with_the_same_values(tmp_path, monkeypatch):
    """make-data of 10 x 5e7 allocated one n x dim float64 block (3.7 GiB) and failed with
    MemoryError, exit 1 (defect 9): wide rows get small chunks and are generated a few
    rows at a time, with the values of whole blocks; a row too wide to hold is refused."""
    import tracemalloc

    from ooc_spectral.batch.cli import main
    from ooc_spectral.io import dataset_specs

    assert ds.default_chunk_rows(10, 50_000_000, "float32") == 1  # not one 2 GiB chunk
    assert ds.default_chunk_rows(10**9, 4096, "float32") == 4096  # as before up to 64 MiB
    # pieces of 5 rows, chunks of 7 rows, generation blocks of 16: every boundary cut
    monkeypatch.setattr(ds, "GENERATION_BLOCK_ROWS", 16)
    monkeypatch.setattr(dataset_specs, "GENERATION_BLOCK_ROWS", 16)
    monkeypatch.setattr(ds, "PIECE_BYTES_MAX", 8 * 3000 * 5)
    monkeypatch.setattr(ds, "CHUNK_BYTES_MAX", 4 * 3000 * 7)
    out = make_data("halo-ball", 50, tmp_path / "w", dim=3000, noise=0.01, seed=4, threads=2)
    X, labels, attrs = _read(out)
    assert attrs["chunk_rows"] == 7
    ref, ref_labels = generate("halo-ball", 50, dim=3000, noise=0.01, seed=4, dtype="float32")
    np.testing.assert_array_equal(X, ref)  # generate: whole blocks
    np.testing.assert_array_equal(labels["label"], ref_labels["label"])
    monkeypatch.undo()
    # memory: pieces and regions of about one row, not the n x dim block
    n, dim = 64, 250_000  # 128 MiB of float64
    monkeypatch.setattr(ds, "PIECE_BYTES_MAX", 8 * dim)
    monkeypatch.setattr(ds, "CHUNK_BYTES_MAX", 4 * dim)
    monkeypatch.setattr(ds, "REGION_BYTES_TARGET", 8 * dim)
    tracemalloc.start()
    try:
        make_data("swiss-roll", n, tmp_path / "m", dim=dim, threads=2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < n * dim * 8 / 8, f"peak {peak / 2**20:.1f} MiB"  # about 9 MiB
    assert zarr.open_group(str(tmp_path / "m"), mode="r")["data"].chunks == (1, dim)
    # a row wider than make-data holds at once: exit 2 naming --dim
    monkeypatch.setattr(ds, "ROW_BYTES_MAX", 8 * 1000)
    with pytest.raises(InvalidParameterError, match=r"dim = 1001 makes one row .*at most 1000 "
                                                    r"columns: pass a smaller --dim"):
        make_data("swiss-roll", 10, tmp_path / "x", dim=1001)
    assert main(["make-data", "swiss-roll", "--n", "10", "--dim", "5000", "--out",
                 str(tmp_path / "y"), "-q"]) == 2
    assert not (tmp_path / "y").exists()
