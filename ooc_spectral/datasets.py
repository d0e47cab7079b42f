"""Synthetic data sets of the papers, generated block by block and streamed to zarr.

Every data set is a pure function that turns a numpy ``Generator`` and a range of
row numbers into one block of rows (the *intrinsic* coordinates) and its labels.
:func:`make_data` writes any number of rows (10^9 included) to a zarr v3 group in
flat memory; :func:`generate` returns the very same values in memory; and
:func:`open_dataset` opens a group written by :func:`make_data`.

The data sets (``s``, ``h``, ``w`` below are independent ``U(0, 1)`` draws per row)
-------------------------------------------------------------------------------------

``spiral`` (2-D; Ouimet & Bengio 2005, section 5: "a 2-D artificially generated
spiral", no formula given there).  An Archimedean spiral, the cross-section of the
swiss roll::

    t = t_min + (t_max - t_min) s        (defaults t_min = 1.5 pi, t_max = 4.5 pi)
    x = t cos t,   y = t sin t

Stores ``t``.  Default noise 0.

``swiss-roll`` (3-D; the formula of scikit-learn's ``make_swiss_roll``; mentioned
in Homrighausen & McDonald 2011, section 3.1, footnote 4)::

    t = 1.5 pi (1 + 2 s),   x = t cos t,   y = 21 h,   z = t sin t

Stores ``t`` (in ``[1.5 pi, 4.5 pi]``).  Default noise 0 (as scikit-learn).

``fishbowl`` (3-D; Homrighausen & McDonald 2011, section 3.1).  The ellipsoid::

    x = a cos(u) sin(v),   y = b sin(u) sin(v),   z = c cos(v),
    u in [0, 2 pi),  v in [d, pi]

with ``v`` sampled uniformly over ``[d, pi]`` and ``u`` "a regularly spaced
sequence" (here ``u_i = 2 pi i / n`` for row ``i``, ``u_sampling="grid"``;
``u_sampling="uniform"`` draws ``u ~ U[0, 2 pi)`` instead).  ``(a, b, c) > 0`` set
the size (default 1, 1, 1: the unit sphere) and ``d in [0, pi)`` the opening at
the top (the paper gives no value; default ``pi / 4``).  Stores ``u`` and ``v``.
Default noise 0.

``halo-ball`` (3-D; Homrighausen & McDonald 2011, section 3.2: "we removed the
bottom fifth of the fishbowl and created a glob in the middle of the resulting
halo").  Each row is, independently, in the ball with probability
``ball_fraction`` (default 0.25, label 1) and on the halo otherwise (label 0):

* halo: the fishbowl above with its bottom ``cut`` (default 1/5) of the height
  removed, i.e. ``z >= z_cut = c (-1 + cut (1 + cos d))``, which is
  ``v in [d, v_max]`` with ``v_max = arccos(z_cut / c)``; ``v`` uniform there, ``u``
  as for the fishbowl;
* ball ("glob"): uniform in the solid ball of radius ``ball_radius`` (default 0.3)
  centred at ``(0, 0, z_mid)``, ``z_mid`` the middle of the halo's height range
  ``(z_cut + c cos d) / 2``: ``center + ball_radius * w^(1/3) * g / |g|`` with
  ``w ~ U(0, 1)``, ``g ~ N(0, I_3)``.

Stores ``label`` (0 halo, 1 ball).  Default noise 0.

``blobs`` (``n_features``-D, default 2).  Gaussian clusters: ``n_clusters``
(default 3) centres drawn once from the seed, uniform in
``[-center_box, center_box]^n_features`` (default 10, as scikit-learn's
``make_blobs``); each row picks a cluster uniformly at random and is
``center[label] + cluster_std * N(0, I)`` (default ``cluster_std = 1``).  Stores
``label`` in ``[0, n_clusters)``.  Default noise 0.

Common options
--------------
``dim=D`` appends ``D - k`` columns of pure noise ``N(0, pad_std^2)`` to the ``k``
intrinsic coordinates (``pad_std`` is a parameter of every data set: 1.0 for
spiral, swiss-roll and blobs, 0.1 for fishbowl and halo-ball, about a tenth of the
extent of the intrinsic coordinates); ``D < k`` is an error.  ``noise=S`` then adds
``N(0, S^2)`` to every one of the ``D`` coordinates.

Reproducibility
---------------
Values depend only on ``(name, n, dim, noise, seed, params)``, never on the storage
chunking: rows are generated in fixed generation blocks of
:data:`GENERATION_BLOCK_ROWS` rows, block ``b`` with its own generators
``np.random.default_rng(np.random.SeedSequence([seed, b, crc32(name), part]))``
(``part`` 0 for the intrinsic coordinates, 1 for the padding columns, 2 for the
noise).  The intrinsic coordinates and labels therefore do not depend on ``dim``
or ``noise`` either.

Layout of a group written by :func:`make_data`::

    data      (n, D)  float32/float64   chunks (chunk_rows, D)
    t | u, v  (n,)    float64           generating parameters, chunks (chunk_rows,)
    label     (n,)    int32             cluster labels, chunks (chunk_rows,)

with the group attribute ``ooc_spectral_dataset`` (name, n, dim, noise, seed,
params, chunk_rows, dtype, labels, ..., ``complete``); ``complete`` becomes true
only after the last block is written.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import shutil
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import zarr
import zarr.errors

from .exceptions import (
    InvalidInputError,
    InvalidParameterError,
    OutputNotWritableError,
    StoreNotFoundError,
)
from .source import DATA_ARRAY_NAME

__all__ = [
    "DATASETS",
    "DATASET_KEY",
    "GENERATION_BLOCK_ROWS",
    "Block",
    "DatasetSpec",
    "LabelSpec",
    "blob_centers",
    "default_chunk_rows",
    "generate",
    "halo_geometry",
    "make_data",
    "open_dataset",
]

#: Group attribute that describes a data set written by :func:`make_data`.
DATASET_KEY = "ooc_spectral_dataset"
#: Version of the layout written by :func:`make_data`.
FORMAT_VERSION = 1
#: Rows per generation block; fixed, so values never depend on the storage chunks.
GENERATION_BLOCK_ROWS = 1 << 14
#: Target size of one storage chunk of ``data`` (bytes) when ``chunk_rows`` is None.
CHUNK_BYTES_TARGET = 8 << 20
#: Target size (bytes, float64) of the rows generated and written in one step.
REGION_BYTES_TARGET = 16 << 20

_TWO_PI = 2.0 * math.pi
_PART_INTRINSIC, _PART_PAD, _PART_NOISE, _PART_CENTERS = 0, 1, 2, 3


# ---------------------------------------------------------------------------------------
# Specifications
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """The rows ``start:stop`` of a data set of ``n`` rows generated with ``seed``."""

    start: int
    stop: int
    n: int
    seed: int

    @property
    def size(self) -> int:
        """Number of rows in the block."""
        return self.stop - self.start

    def row_numbers(self) -> np.ndarray:
        """Global row numbers of the block (int64)."""
        return np.arange(self.start, self.stop, dtype=np.int64)


@dataclass(frozen=True)
class LabelSpec:
    """A 1-D array stored beside ``data``, one value per row.

    Attributes
    ----------
    name : str
        Array name in the group (``"t"``, ``"u"``, ``"v"``, ``"label"``).
    kind : str
        ``"parameter"`` (a generating parameter, float64) or ``"class"`` (an integer
        cluster label, int32).
    description : str
        One line saying what the value means.
    """

    name: str
    kind: str
    description: str

    @property
    def dtype(self) -> np.dtype:
        """Storage dtype: float64 for parameters, int32 for class labels."""
        return np.dtype(np.float64 if self.kind == "parameter" else np.int32)


BlockFunction = Callable[[np.random.Generator, Block, Mapping[str, Any]],
                         "tuple[np.ndarray, dict[str, np.ndarray]]"]


@dataclass(frozen=True)
class DatasetSpec:
    """A synthetic data set: what it is, its parameters and its block generator.

    Attributes
    ----------
    name : str
        Registry name (``"swiss-roll"``).
    intrinsic_dim : int
        Number of intrinsic coordinates with the default parameters (blobs: the
        ``n_features`` parameter sets it, see :meth:`intrinsic_dim_for`).
    labels : tuple of LabelSpec
        The 1-D arrays stored beside ``data``.
    default_noise : float
        Standard deviation of the noise added to every coordinate by default.
    description : str
        One line for ``--help``.
    block : callable
        ``block(rng, Block, params) -> (X (rows, k) float64, {label: (rows,)})``, a
        pure function of its arguments.
    defaults : mapping
        Every accepted parameter with its default (``pad_std`` included).
    validate : callable
        ``validate(params) -> None``; raises :class:`InvalidParameterError`.
    dim_param : str or None
        Name of the parameter that sets the intrinsic dimension, if any.
    """

    name: str
    intrinsic_dim: int
    labels: tuple[LabelSpec, ...]
    default_noise: float
    description: str
    block: BlockFunction
    defaults: Mapping[str, Any]
    validate: Callable[[Mapping[str, Any]], None]
    dim_param: str | None = None

    @property
    def label_names(self) -> tuple[str, ...]:
        """Names of the 1-D arrays stored beside ``data``."""
        return tuple(lab.name for lab in self.labels)

    @property
    def label_kinds(self) -> dict[str, str]:
        """``{name: kind}`` of the stored 1-D arrays."""
        return {lab.name: lab.kind for lab in self.labels}

    def intrinsic_dim_for(self, params: Mapping[str, Any]) -> int:
        """Number of intrinsic coordinates with the (resolved) ``params``."""
        if self.dim_param is not None:
            return int(params[self.dim_param])
        return self.intrinsic_dim

    def resolve_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The defaults updated with ``params``, validated and JSON-ready.

        Raises
        ------
        InvalidParameterError
            A parameter is unknown to this data set or out of range.
        """
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise InvalidParameterError(
                f"unknown parameter{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(repr(u) for u in unknown)} for data set {self.name!r}; expected "
                f"one of: {', '.join(sorted(self.defaults))}; remove it or check its spelling"
            )
        resolved = dict(self.defaults)
        resolved.update(params)
        for key, default in self.defaults.items():
            resolved[key] = _coerce_like(self.name, key, resolved[key], default)
        self.validate(resolved)
        return resolved


def _coerce_like(dataset: str, key: str, value: Any, default: Any) -> Any:
    """``value`` as a plain Python value of the default's type (JSON-ready)."""
    if isinstance(default, str):
        if not isinstance(value, str):
            raise InvalidParameterError(
                f"parameter {key!r} of data set {dataset!r} must be a string, got {value!r}"
            )
        return value
    if isinstance(default, bool):  # pragma: no cover - no boolean parameters yet
        return bool(value)
    if isinstance(default, numbers.Integral):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise InvalidParameterError(
                f"parameter {key!r} of data set {dataset!r} must be an integer, got {value!r}; "
                f"pass a whole number such as {default}"
            )
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameterError(
            f"parameter {key!r} of data set {dataset!r} must be a real number, got {value!r}; "
            f"pass a number such as {default}"
        )
    value = float(value)
    if not math.isfinite(value):
        raise InvalidParameterError(
            f"parameter {key!r} of data set {dataset!r} must be finite, got {value!r}"
        )
    return value


def _require(ok: bool, dataset: str, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise InvalidParameterError(
            f"parameter {key!r} of data set {dataset!r} is {value!r}; expected {expected}; "
            f"pass a value in that range"
        )


# ---------------------------------------------------------------------------------------
# Block generators (pure functions of rng, block and parameters)
# ---------------------------------------------------------------------------------------


def _spiral_block(rng: np.random.Generator, block: Block, p: Mapping[str, Any]):
    t = p["t_min"] + (p["t_max"] - p["t_min"]) * rng.random(block.size)
    X = np.empty((block.size, 2))
    np.multiply(t, np.cos(t), out=X[:, 0])
    np.multiply(t, np.sin(t), out=X[:, 1])
    return X, {"t": t}


def _validate_spiral(p: Mapping[str, Any]) -> None:
    _require(p["t_max"] > p["t_min"], "spiral", "t_max", p["t_max"],
             f"a value greater than t_min = {p['t_min']!r}")
    _check_pad("spiral", p)


def _swiss_roll_block(rng: np.random.Generator, block: Block, p: Mapping[str, Any]):
    uv = rng.random((block.size, 2))
    t = 1.5 * np.pi * (1.0 + 2.0 * uv[:, 0])
    X = np.empty((block.size, 3))
    np.multiply(t, np.cos(t), out=X[:, 0])
    np.multiply(21.0, uv[:, 1], out=X[:, 1])
    np.multiply(t, np.sin(t), out=X[:, 2])
    return X, {"t": t}


def _validate_swiss_roll(p: Mapping[str, Any]) -> None:
    _check_pad("swiss-roll", p)


def _fishbowl_u(rng_column: np.ndarray, block: Block, sampling: str) -> np.ndarray:
    if sampling == "grid":
        return _TWO_PI * (block.row_numbers() / block.n)
    return _TWO_PI * rng_column


def _ellipsoid(u: np.ndarray, v: np.ndarray, p: Mapping[str, Any]) -> np.ndarray:
    X = np.empty((u.shape[0], 3))
    sv = np.sin(v)
    X[:, 0] = p["a"] * np.cos(u) * sv
    X[:, 1] = p["b"] * np.sin(u) * sv
    X[:, 2] = p["c"] * np.cos(v)
    return X


def _fishbowl_block(rng: np.random.Generator, block: Block, p: Mapping[str, Any]):
    r = rng.random((block.size, 2))
    d = p["d"]
    v = d + (np.pi - d) * r[:, 0]
    u = _fishbowl_u(r[:, 1], block, p["u_sampling"])
    return _ellipsoid(u, v, p), {"u": u, "v": v}


def _validate_ellipsoid(name: str, p: Mapping[str, Any]) -> None:
    for key in ("a", "b", "c"):
        _require(p[key] > 0, name, key, p[key], "a positive number")
    _require(0 <= p["d"] < np.pi, name, "d", p["d"], "an opening angle in [0, pi)")
    _require(p["u_sampling"] in ("grid", "uniform"), name, "u_sampling", p["u_sampling"],
             "'grid' (u_i = 2 pi i / n, as in the paper) or 'uniform'")
    _check_pad(name, p)


def _validate_fishbowl(p: Mapping[str, Any]) -> None:
    _validate_ellipsoid("fishbowl", p)


def halo_geometry(p: Mapping[str, Any]) -> tuple[float, float, np.ndarray]:
    """``(v_max, z_cut, ball_center)`` of the halo-ball data set with parameters ``p``.

    The halo is the fishbowl with ``z >= z_cut = c (-1 + cut (1 + cos d))``, that is
    ``v <= v_max = arccos(z_cut / c)``; the ball is centred at the middle of the
    halo's height range on the axis.
    """
    cos_d = math.cos(p["d"])
    z_cut_rel = -1.0 + p["cut"] * (1.0 + cos_d)
    v_max = math.acos(min(1.0, max(-1.0, z_cut_rel)))
    z_cut = p["c"] * z_cut_rel
    center = np.array([0.0, 0.0, 0.5 * (z_cut + p["c"] * cos_d)])
    return v_max, z_cut, center


def _halo_ball_block(rng: np.random.Generator, block: Block, p: Mapping[str, Any]):
    m = block.size
    r = rng.random((m, 4))  # ball?, v, radius, u (if uniform)
    g = rng.standard_normal((m, 3))
    v_max, _, center = halo_geometry(p)
    d = p["d"]
    in_ball = r[:, 0] < p["ball_fraction"]
    v = d + (v_max - d) * r[:, 1]
    u = _fishbowl_u(r[:, 3], block, p["u_sampling"])
    X = _ellipsoid(u, v, p)
    norms = np.sqrt(np.einsum("ij,ij->i", g, g))
    np.maximum(norms, np.finfo(float).tiny, out=norms)
    radius = p["ball_radius"] * np.cbrt(r[:, 2]) / norms
    ball = center + g * radius[:, None]
    X[in_ball] = ball[in_ball]
    return X, {"label": in_ball.astype(np.int32)}


def _validate_halo_ball(p: Mapping[str, Any]) -> None:
    _validate_ellipsoid("halo-ball", p)
    _require(0 <= p["cut"] < 1, "halo-ball", "cut", p["cut"],
             "the fraction of the height removed at the bottom, in [0, 1)")
    _require(0 < p["ball_fraction"] < 1, "halo-ball", "ball_fraction", p["ball_fraction"],
             "the probability that a row is in the ball, in (0, 1)")
    _require(p["ball_radius"] > 0, "halo-ball", "ball_radius", p["ball_radius"],
             "a positive radius")


def blob_centers(seed: int, n_clusters: int = 3, n_features: int = 2,
                 center_box: float = 10.0) -> np.ndarray:
    """The cluster centres of the ``blobs`` data set, a function of the seed only.

    Parameters
    ----------
    seed : int
        The data set's seed.
    n_clusters, n_features : int
        Number of centres and their dimension.
    center_box : float
        Centres are uniform in ``[-center_box, center_box]^n_features``.

    Returns
    -------
    ndarray of shape (n_clusters, n_features)
    """
    rng = _rng(seed, 0, "blobs", _PART_CENTERS)
    return rng.uniform(-center_box, center_box, size=(n_clusters, n_features))


def _blobs_block(rng: np.random.Generator, block: Block, p: Mapping[str, Any]):
    centers = blob_centers(block.seed, p["n_clusters"], p["n_features"], p["center_box"])
    label = rng.integers(0, p["n_clusters"], size=block.size)
    X = rng.standard_normal((block.size, p["n_features"]))
    X *= p["cluster_std"]
    X += centers[label]
    return X, {"label": label.astype(np.int32)}


def _validate_blobs(p: Mapping[str, Any]) -> None:
    _require(p["n_clusters"] >= 1, "blobs", "n_clusters", p["n_clusters"], "an integer >= 1")
    _require(p["n_features"] >= 1, "blobs", "n_features", p["n_features"], "an integer >= 1")
    _require(p["cluster_std"] >= 0, "blobs", "cluster_std", p["cluster_std"],
             "a non-negative standard deviation")
    _require(p["center_box"] > 0, "blobs", "center_box", p["center_box"], "a positive number")
    _check_pad("blobs", p)


def _check_pad(name: str, p: Mapping[str, Any]) -> None:
    _require(p["pad_std"] >= 0, name, "pad_std", p["pad_std"],
             "a non-negative standard deviation for the padding columns")


_ELLIPSOID_DEFAULTS = {"a": 1.0, "b": 1.0, "c": 1.0, "d": math.pi / 4, "u_sampling": "grid",
                       "pad_std": 0.1}

DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            name="spiral",
            intrinsic_dim=2,
            labels=(LabelSpec("t", "parameter", "angle (and radius) along the spiral"),),
            default_noise=0.0,
            description="2-D Archimedean spiral x = t cos t, y = t sin t, t uniform in "
                        "[1.5pi, 4.5pi] (Ouimet & Bengio 2005, sec. 5)",
            block=_spiral_block,
            defaults=MappingProxyType({"t_min": 1.5 * math.pi, "t_max": 4.5 * math.pi,
                                       "pad_std": 1.0}),
            validate=_validate_spiral,
        ),
        DatasetSpec(
            name="swiss-roll",
            intrinsic_dim=3,
            labels=(LabelSpec("t", "parameter", "angle along the roll, in [1.5pi, 4.5pi]"),),
            default_noise=0.0,
            description="3-D swiss roll of scikit-learn's make_swiss_roll "
                        "(t cos t, 21 v, t sin t)",
            block=_swiss_roll_block,
            defaults=MappingProxyType({"pad_std": 1.0}),
            validate=_validate_swiss_roll,
        ),
        DatasetSpec(
            name="fishbowl",
            intrinsic_dim=3,
            labels=(LabelSpec("u", "parameter", "azimuth in [0, 2pi)"),
                    LabelSpec("v", "parameter", "polar angle in [d, pi]")),
            default_noise=0.0,
            description="3-D fishbowl: ellipsoid open at the top, v uniform in [d, pi] "
                        "(Homrighausen & McDonald 2011, sec. 3.1)",
            block=_fishbowl_block,
            defaults=MappingProxyType(dict(_ELLIPSOID_DEFAULTS)),
            validate=_validate_fishbowl,
        ),
        DatasetSpec(
            name="halo-ball",
            intrinsic_dim=3,
            labels=(LabelSpec("label", "class", "0 = halo (outer ring), 1 = ball (inner glob)"),),
            default_noise=0.0,
            description="3-D halo and ball: fishbowl without its bottom fifth around a "
                        "solid ball (Homrighausen & McDonald 2011, sec. 3.2)",
            block=_halo_ball_block,
            defaults=MappingProxyType(dict(_ELLIPSOID_DEFAULTS, cut=0.2, ball_fraction=0.25,
                                           ball_radius=0.3)),
            validate=_validate_halo_ball,
        ),
        DatasetSpec(
            name="blobs",
            intrinsic_dim=2,
            labels=(LabelSpec("label", "class", "cluster number in [0, n_clusters)"),),
            default_noise=0.0,
            description="Gaussian clusters around seeded centres (n_clusters=3, "
                        "cluster_std=1, n_features=2)",
            block=_blobs_block,
            defaults=MappingProxyType({"n_clusters": 3, "cluster_std": 1.0, "n_features": 2,
                                       "center_box": 10.0, "pad_std": 1.0}),
            validate=_validate_blobs,
            dim_param="n_features",
        ),
    )
}


# ---------------------------------------------------------------------------------------
# Resolution of the arguments
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    spec: DatasetSpec
    n: int
    dim: int
    k: int
    noise: float
    seed: int
    params: dict[str, Any]

    @property
    def n_blocks(self) -> int:
        return -(-self.n // GENERATION_BLOCK_ROWS)


def _lookup(name: Any) -> DatasetSpec:
    key = name.strip().lower().replace("_", "-") if isinstance(name, str) else None
    if key not in DATASETS:
        raise InvalidParameterError(
            f"unknown data set {name!r}; expected one of: {', '.join(sorted(DATASETS))}; "
            "pick one of these names"
        )
    return DATASETS[key]


def _check_int(what: str, value: Any, low: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise InvalidParameterError(f"{what} is {value!r}; expected an integer >= {low}; {fix}")
    return int(value)


def _plan(name, n, dim, noise, seed, params) -> _Plan:
    spec = _lookup(name)
    n = _check_int("n (the number of rows)", n, 1, "pass a positive whole number of rows, "
                   "e.g. n=1_000_000 (not a float such as 1e6)")
    seed = _check_int("seed", seed, 0, "pass a non-negative integer seed")
    resolved = spec.resolve_params(params)
    k = spec.intrinsic_dim_for(resolved)
    if dim is None:
        dim = k
    dim = _check_int("dim", dim, k, f"data set {spec.name!r} has {k} intrinsic coordinates; "
                     f"pass dim >= {k} (extra columns are noise) or leave dim unset")
    if noise is None:
        noise = spec.default_noise
    if (isinstance(noise, bool) or not isinstance(noise, numbers.Real)
            or not math.isfinite(noise) or noise < 0):
        raise InvalidParameterError(
            f"noise is {noise!r}; expected a finite standard deviation >= 0; pass e.g. "
            f"noise=0.05, or leave it unset for the default ({spec.default_noise})"
        )
    return _Plan(spec, n, dim, k, float(noise), seed, resolved)


def _check_dtype(dtype: Any) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise InvalidParameterError(
            f"dtype is {dtype!r}; expected 'float32' or 'float64'; pass one of these"
        ) from exc
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise InvalidParameterError(
            f"dtype is {dtype!r}; expected 'float32' or 'float64'; pass one of these"
        )
    return dt


def default_chunk_rows(n: int, dim: int, dtype: Any = "float32") -> int:
    """Rows per storage chunk: a power of two near 8 MiB per chunk of ``data``.

    Clipped to ``[4096, 2^20]`` rows and to ``n``; for ``dim=32`` float32 this is
    ``2^16`` rows.
    """
    itemsize = np.dtype(dtype).itemsize
    rows = max(1, CHUNK_BYTES_TARGET // (max(1, dim) * itemsize))
    rows = 1 << (rows.bit_length() - 1)
    return int(max(1, min(n, max(4096, min(rows, 1 << 20)))))


# ---------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------


def _rng(seed: int, block_index: int, name: str, part: int) -> np.random.Generator:
    code = zlib.crc32(name.encode("utf-8"))
    return np.random.default_rng(np.random.SeedSequence([seed, block_index, code, part]))


def _generate_block(plan: _Plan, b: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Generation block ``b``: its rows (float64, ``dim`` columns) and labels."""
    start = b * GENERATION_BLOCK_ROWS
    stop = min(plan.n, start + GENERATION_BLOCK_ROWS)
    block = Block(start, stop, plan.n, plan.seed)
    name = plan.spec.name
    Xi, labels = plan.spec.block(_rng(plan.seed, b, name, _PART_INTRINSIC), block, plan.params)
    if plan.dim == plan.k and plan.noise == 0.0:
        return Xi, labels
    X = np.empty((block.size, plan.dim))
    X[:, :plan.k] = Xi
    if plan.dim > plan.k:
        pad = _rng(plan.seed, b, name, _PART_PAD).standard_normal((block.size, plan.dim - plan.k))
        pad *= plan.params["pad_std"]
        X[:, plan.k:] = pad
    if plan.noise > 0.0:
        eps = _rng(plan.seed, b, name, _PART_NOISE).standard_normal((block.size, plan.dim))
        eps *= plan.noise
        X += eps
    return X, labels


def _iter_blocks(plan: _Plan, executor: Executor | None = None, lookahead: int = 0
                 ) -> Iterator[tuple[int, np.ndarray, dict[str, np.ndarray]]]:
    """Every generation block in order; with an executor, ``lookahead`` run ahead.

    numpy's generators and ufuncs release the GIL, so blocks generated on a thread
    pool run in parallel while the caller copies and writes earlier ones.
    """
    if executor is None or lookahead < 1:
        for b in range(plan.n_blocks):
            yield (b, *_generate_block(plan, b))
        return
    queue: deque[Future] = deque()
    nxt = 0
    try:
        for b in range(plan.n_blocks):
            while nxt < plan.n_blocks and len(queue) < lookahead:
                queue.append(executor.submit(_generate_block, plan, nxt))
                nxt += 1
            yield (b, *queue.popleft().result())
    finally:
        for fut in queue:
            fut.cancel()


def _iter_regions(plan: _Plan, dtype: np.dtype, region_rows: int,
                  blocks: Iterator[tuple[int, np.ndarray, dict[str, np.ndarray]]]
                  ) -> Iterator[tuple[int, int, np.ndarray, dict[str, np.ndarray]]]:
    """Consecutive regions ``(start, stop, X in dtype, labels)`` of ``region_rows`` rows.

    Regions and generation blocks need not line up: a block cut by a region boundary
    is kept for the next region.
    """
    G = GENERATION_BLOCK_ROWS
    current: tuple[int, np.ndarray, dict[str, np.ndarray]] | None = None
    for a in range(0, plan.n, region_rows):
        b = min(plan.n, a + region_rows)
        X = np.empty((b - a, plan.dim), dtype=dtype)
        labels = {lab.name: np.empty(b - a, dtype=lab.dtype) for lab in plan.spec.labels}
        pos = a
        while pos < b:
            blk = pos // G
            while current is None or current[0] < blk:
                current = next(blocks)
            _, Xb, Lb = current
            stop = min(b, (blk + 1) * G)
            X[pos - a:stop - a] = Xb[pos - blk * G:stop - blk * G]
            for key, out in labels.items():
                out[pos - a:stop - a] = Lb[key][pos - blk * G:stop - blk * G]
            pos = stop
        yield a, b, X, labels


def generate(name: str, n: int, *, dim: int | None = None, noise: float | None = None,
             seed: int = 0, dtype: Any = None, **params: Any
             ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Generate a data set in memory, exactly the values :func:`make_data` writes.

    Parameters
    ----------
    name : str
        A key of :data:`DATASETS` (``"spiral"``, ``"swiss-roll"``, ``"fishbowl"``,
        ``"halo-ball"``, ``"blobs"``; underscores are accepted for hyphens).
    n : int
        Number of rows, at least 1.
    dim : int, optional
        Number of columns, at least the intrinsic dimension (the default); the extra
        columns are ``N(0, pad_std^2)`` noise.
    noise : float, optional
        Standard deviation of the Gaussian noise added to every coordinate; the data
        set's ``default_noise`` if None.
    seed : int, default 0
        Non-negative seed.
    dtype : str or dtype, optional
        If given (``"float32"`` or ``"float64"``), ``X`` is cast to it, as
        :func:`make_data` stores it; otherwise ``X`` is float64.
    **params
        Parameters of the data set (see :data:`DATASETS` ``[name].defaults``).

    Returns
    -------
    X : ndarray of shape (n, dim)
    labels : dict of str to ndarray of shape (n,)
        The generating parameters (float64) and/or cluster labels (int32).

    Raises
    ------
    InvalidParameterError
        Unknown data set or parameter, or a value out of range.
    """
    plan = _plan(name, n, dim, noise, seed, params)
    dt = np.dtype(np.float64) if dtype is None else _check_dtype(dtype)
    _, _, X, labels = next(_iter_regions(plan, dt, plan.n, _iter_blocks(plan)))
    return X, labels


# ---------------------------------------------------------------------------------------
# Streaming to zarr
# ---------------------------------------------------------------------------------------


def _write_region(arrays: Mapping[str, Any], start: int, stop: int,
                  values: Mapping[str, np.ndarray]) -> None:
    """Write rows ``start:stop`` of every array (a whole number of storage chunks)."""
    for key, arr in arrays.items():
        arr[start:stop] = values[key]


def _finish(pending: tuple[Future, int], n: int,
            progress: Callable[[int, int], None] | None) -> None:
    """Wait for a region's write (re-raising its error) and report progress."""
    fut, stop = pending
    fut.result()
    if progress is not None:
        progress(stop, n)


def _is_local(loc: str) -> bool:
    return "://" not in loc or loc.startswith("file://")


def stored_bytes(plan: _Plan, dt: np.dtype) -> int:
    """Bytes of the arrays ``make_data`` writes (uncompressed: random values barely compress)."""
    return plan.n * plan.dim * dt.itemsize + sum(plan.n * lab.dtype.itemsize
                                                 for lab in plan.spec.labels)


def _check_free_space(loc: str, plan: _Plan, dt: np.dtype) -> None:
    """Refuse a data set larger than the free space of its file system (before writing)."""
    if not _is_local(loc):
        return
    path = os.path.abspath(loc.removeprefix("file://"))
    existing = 0  # an older store at ``path`` is replaced: its space comes back
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                existing += os.lstat(os.path.join(dirpath, f)).st_size
    probe = path
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return
    need = stored_bytes(plan, dt)
    if need > free + existing:
        raise OutputNotWritableError(
            f"make-data {plan.spec.name} with n = {plan.n} x dim = {plan.dim} ({dt.name}) needs "
            f"{need / 2**30:.3g} GiB, but the file system of {loc!r} has {free / 2**30:.3g} GiB "
            "free; choose a smaller --n or --dim, or another location"
        )


def _create_group(loc: str, overwrite: bool):
    if _is_local(loc):
        path = loc.removeprefix("file://")
        if os.path.exists(path) and not os.path.isdir(path):
            raise OutputNotWritableError(
                f"{loc!r} is an existing file, not a directory; choose another output path"
            )
        if (overwrite and os.path.isdir(path) and os.listdir(path)
                and not os.path.exists(os.path.join(path, "zarr.json"))):
            raise OutputNotWritableError(
                f"{loc!r} is a non-empty directory that is not a zarr store; refusing to "
                "delete it with overwrite=True; choose another output path"
            )
    try:
        return zarr.open_group(loc, mode="w" if overwrite else "w-", zarr_format=3)
    except (FileExistsError, zarr.errors.ContainsGroupError,
            zarr.errors.ContainsArrayError) as exc:
        raise OutputNotWritableError(
            f"data already exist at {loc!r}; pass overwrite=True (--overwrite) to replace "
            "them, or choose another output path"
        ) from exc
    except OSError as exc:
        raise OutputNotWritableError(f"cannot create a zarr group at {loc!r}: {exc}") from exc


def make_data(name: str, n: int, out: str | os.PathLike, *, dim: int | None = None,
              noise: float | None = None, seed: int = 0, chunk_rows: int | None = None,
              dtype: Any = "float32", overwrite: bool = False, reuse: bool = False,
              threads: int | None = None,
              progress: Callable[[int, int], None] | None = None, **params: Any) -> str:
    """Stream a synthetic data set to a zarr v3 group, block by block, in flat memory.

    Rows are generated in fixed generation blocks (:data:`GENERATION_BLOCK_ROWS`) on
    ``threads`` threads, a few blocks ahead, and written in regions of whole storage
    chunks (about 16 MiB of float64 rows each, never less than one chunk), the next
    region being assembled while a background thread writes the previous one; memory
    is bounded by a few regions and blocks, whatever ``n``. The values depend only on ``(name, n,
    dim, noise, seed, params)`` and equal :func:`generate`'s (cast to ``dtype``).

    Parameters
    ----------
    name : str
        A key of :data:`DATASETS`.
    n : int
        Number of rows, at least 1.
    out : str or path-like
        Location of the zarr group to create (a directory or an fsspec URL).
    dim : int, optional
        Number of columns (default: the intrinsic dimension); extra columns are noise.
    noise : float, optional
        Standard deviation of the noise added to every coordinate (default: the data
        set's ``default_noise``).
    seed : int, default 0
        Non-negative seed.
    chunk_rows : int, optional
        Rows per storage chunk of ``data`` and of the label arrays; default
        :func:`default_chunk_rows` (about 8 MiB per chunk of ``data``). Does not
        change the values.
    dtype : {"float32", "float64"}, default "float32"
        Storage dtype of ``data``.
    overwrite : bool, default False
        Replace an existing zarr store at ``out`` (a non-empty directory that is
        not a zarr store is never deleted).
    reuse : bool, default False
        If ``out`` already holds a complete data set with the same attributes,
        return at once; if it holds an unfinished one, write it again. Any other
        existing store is an error (unless ``overwrite``). The command line sets it.
    threads : int, optional
        Threads generating blocks (default ``min(4, os.cpu_count())``). Does not
        change the values.
    progress : callable, optional
        Called as ``progress(rows_written, n)`` after each region is written.
    **params
        Parameters of the data set (see ``DATASETS[name].defaults``).

    Returns
    -------
    str
        The location of the group (``out`` as a string).

    Raises
    ------
    InvalidParameterError
        Unknown data set or parameter, or ``n``, ``dim``, ``noise``, ``seed``,
        ``chunk_rows`` or ``dtype`` out of range.
    OutputNotWritableError
        ``out`` already holds data and ``overwrite`` is False, or cannot be written.

    Notes
    -----
    The group attribute ``ooc_spectral_dataset`` is written first with
    ``"complete": false`` and rewritten with ``"complete": true`` only after the last
    row is stored, so an interrupted run never looks complete (:func:`open_dataset`
    refuses it).
    """
    plan = _plan(name, n, dim, noise, seed, params)
    dt = _check_dtype(dtype)
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(plan.n, plan.dim, dt)
    chunk_rows = _check_int("chunk_rows", chunk_rows, 1,
                            "pass a positive number of rows per storage chunk, or leave it unset")
    chunk_rows = min(chunk_rows, plan.n)
    if threads is None:
        threads = min(4, os.cpu_count() or 1)
    threads = _check_int("threads", threads, 1, "pass a positive number of threads, or "
                         "leave it unset")
    loc = os.fspath(out)
    if reuse and not overwrite:
        found = _existing_meta(loc)
        if found is not None:
            same = {k: v for k, v in found.items() if k != "complete"} == \
                _meta(plan, chunk_rows, dt)
            if same and found.get("complete"):
                return loc  # an identical, complete data set is already there
            if same:
                overwrite = True  # an interrupted make-data of the same data: start over

    _check_free_space(loc, plan, dt)
    group = _create_group(loc, overwrite)
    # zarr v3 dimension names, so that xarray.open_zarr opens the group
    arrays = {DATA_ARRAY_NAME: group.create_array(
        DATA_ARRAY_NAME, shape=(plan.n, plan.dim), chunks=(chunk_rows, plan.dim), dtype=dt,
        dimension_names=("sample", "feature"))}
    for lab in plan.spec.labels:
        arrays[lab.name] = group.create_array(lab.name, shape=(plan.n,), chunks=(chunk_rows,),
                                              dtype=lab.dtype, dimension_names=("sample",))
    meta = dict(_meta(plan, chunk_rows, dt), complete=False)
    group.attrs[DATASET_KEY] = meta

    # Regions: whole storage chunks (aligned writes), about REGION_BYTES_TARGET of
    # float64 rows each; the next region is assembled while the previous is written.
    region_rows = max(1, REGION_BYTES_TARGET // (8 * plan.dim * chunk_rows)) * chunk_rows
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="make-data-write") as writer, \
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="make-data-gen") as gen:
        blocks = _iter_blocks(plan, gen if threads > 1 else None, lookahead=2 * threads)
        pending: tuple[Future, int] | None = None
        try:
            for a, b, X, labels in _iter_regions(plan, dt, region_rows, blocks):
                if pending is not None:
                    _finish(pending, plan.n, progress)
                fut = writer.submit(_write_region, arrays, a, b, {DATA_ARRAY_NAME: X, **labels})
                pending = (fut, b)
            if pending is not None:
                _finish(pending, plan.n, progress)
        finally:
            blocks.close()

    group.attrs[DATASET_KEY] = dict(meta, complete=True)
    return loc


def _meta(plan: _Plan, chunk_rows: int, dt: np.dtype) -> dict[str, Any]:
    """The ``ooc_spectral_dataset`` attribute of a store (without ``complete``)."""
    meta = {
        "format": FORMAT_VERSION,
        "name": plan.spec.name,
        "n": plan.n,
        "dim": plan.dim,
        "intrinsic_dim": plan.k,
        "noise": plan.noise,
        "seed": plan.seed,
        "params": plan.params,
        "chunk_rows": chunk_rows,
        "dtype": dt.name,
        "generation_block_rows": GENERATION_BLOCK_ROWS,
        "labels": plan.spec.label_kinds,
        "description": plan.spec.description,
    }
    if plan.spec.name == "blobs":
        meta["centers"] = blob_centers(plan.seed, plan.params["n_clusters"],
                                       plan.params["n_features"],
                                       plan.params["center_box"]).tolist()
    # through JSON, as the store holds it (tuples become lists, ...)
    return json.loads(json.dumps(meta))


def _existing_meta(loc: str) -> dict[str, Any] | None:
    try:
        group = zarr.open_group(loc, mode="r")
    except Exception:
        return None
    meta = group.attrs.get(DATASET_KEY)
    return meta if isinstance(meta, dict) else None


def open_dataset(path: str | os.PathLike) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Open a data set written by :func:`make_data`.

    Parameters
    ----------
    path : str or path-like
        Location of the zarr group.

    Returns
    -------
    data : zarr.Array
        The ``(n, dim)`` data array.
    labels : dict of str to zarr.Array
        The 1-D arrays beside it (``t``, ``u``, ``v`` or ``label``).
    attrs : dict
        The ``ooc_spectral_dataset`` attribute (name, n, dim, noise, seed, params, ...).

    Raises
    ------
    StoreNotFoundError
        Nothing at ``path``.
    InvalidInputError
        The store is not a data set written by :func:`make_data`, or its writing did
        not finish (``complete`` is false).
    """
    loc = os.fspath(path)
    try:
        group = zarr.open_group(loc, mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError,
            zarr.errors.NodeNotFoundError) as exc:
        raise StoreNotFoundError(
            f"no data set at {loc!r}; check the path, or create one with "
            "`ooc-spectral make-data NAME --n N --out PATH`"
        ) from exc
    except zarr.errors.ContainsArrayError as exc:
        raise InvalidInputError(
            f"{loc!r} is a zarr array, not a data set group written by make-data; open it "
            "with zarr.open_array, or create a data set with `ooc-spectral make-data`"
        ) from exc
    attrs = group.attrs.get(DATASET_KEY)
    if not isinstance(attrs, dict):
        raise InvalidInputError(
            f"the zarr group at {loc!r} is not a data set written by make-data (no "
            f"{DATASET_KEY!r} attribute); create one with `ooc-spectral make-data`"
        )
    if not attrs.get("complete", False):
        raise InvalidInputError(
            f"the data set at {loc!r} is incomplete: make-data was interrupted before the "
            "last block was written; run make-data again with overwrite=True (--overwrite)"
        )
    data = group[DATA_ARRAY_NAME]
    labels = {key: group[key] for key in attrs.get("labels", {})}
    return data, labels, dict(attrs)
