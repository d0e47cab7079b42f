"""The synthetic data sets: their specifications, block generators and registry.

:data:`DATASETS` maps each name to a :class:`DatasetSpec`, whose ``block``
function turns a numpy ``Generator`` and a :class:`Block` of row numbers into
those rows' intrinsic coordinates and labels (the formulas are in
:mod:`ooc_spectral.datasets`, which re-exports every public name here).
:func:`plan_dataset` checks and resolves the arguments of
:func:`~ooc_spectral.datasets.generate` and :func:`~ooc_spectral.datasets.make_data`
into a :class:`DatasetPlan`; :func:`block_rng` is the seeding scheme that makes
the values independent of the storage chunks.

To add a data set: a block function and a validator here, and its
:class:`DatasetSpec` in :data:`DATASETS`.
"""

from __future__ import annotations

import math
import numbers
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from ..exceptions import InvalidParameterError

__all__ = [
    "DATASETS",
    "GENERATION_BLOCK_ROWS",
    "Block",
    "DatasetPlan",
    "DatasetSpec",
    "LabelSpec",
    "blob_centers",
    "block_rng",
    "check_representable",
    "check_whole",
    "halo_geometry",
    "plan_dataset",
]

#: Rows per generation block; fixed, so values never depend on the storage chunks.
GENERATION_BLOCK_ROWS = 1 << 14

_TWO_PI = 2.0 * math.pi
#: ``part`` of :func:`block_rng`: the intrinsic coordinates, the padding columns, the
#: noise, the blob centres.
PART_INTRINSIC, PART_PAD, PART_NOISE, PART_CENTERS = 0, 1, 2, 3


def block_rng(seed: int, block_index: int, name: str, part: int) -> np.random.Generator:
    """The generator of one ``part`` of generation block ``block_index`` of data set ``name``."""
    code = zlib.crc32(name.encode("utf-8"))
    return np.random.default_rng(np.random.SeedSequence([seed, block_index, code, part]))


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
# The data sets: each block generator (a pure function of rng, block and parameters)
# registered in DATASETS with its spec
# ---------------------------------------------------------------------------------------

#: Every data set by name.
DATASETS: dict[str, DatasetSpec] = {}


def _register(name: str, intrinsic_dim: int, labels: tuple[LabelSpec, ...], description: str,
              defaults: Mapping[str, Any], validate: Callable[[Mapping[str, Any]], None],
              dim_param: str | None = None) -> Callable[[BlockFunction], BlockFunction]:
    """Decorator: the block function as data set ``name`` in :data:`DATASETS` (noise 0)."""
    def register(block: BlockFunction) -> BlockFunction:
        DATASETS[name] = DatasetSpec(name=name, intrinsic_dim=intrinsic_dim, labels=labels,
                                     default_noise=0.0, description=description, block=block,
                                     defaults=MappingProxyType(dict(defaults)),
                                     validate=validate, dim_param=dim_param)
        return block
    return register


def _check_pad(name: str, p: Mapping[str, Any]) -> None:
    _require(p["pad_std"] >= 0, name, "pad_std", p["pad_std"],
             "a non-negative standard deviation for the padding columns")


def _validate_spiral(p: Mapping[str, Any]) -> None:
    _require(p["t_max"] > p["t_min"], "spiral", "t_max", p["t_max"],
             f"a value greater than t_min = {p['t_min']!r}")
    _check_pad("spiral", p)


@_register("spiral", 2, (LabelSpec("t", "parameter", "angle (and radius) along the spiral"),),
           "2-D Archimedean spiral x = t cos t, y = t sin t, t uniform in [1.5pi, 4.5pi] "
           "(Ouimet & Bengio 2005, sec. 5)",
           {"t_min": 1.5 * math.pi, "t_max": 4.5 * math.pi, "pad_std": 1.0}, _validate_spiral)
def _spiral_block(rng: np.random.Generator, block: Block, p: Mapping[str, Any]):
    t = p["t_min"] + (p["t_max"] - p["t_min"]) * rng.random(block.size)
    X = np.empty((block.size, 2))
    np.multiply(t, np.cos(t), out=X[:, 0])
    np.multiply(t, np.sin(t), out=X[:, 1])
    return X, {"t": t}



def _validate_swiss_roll(p: Mapping[str, Any]) -> None:
    _check_pad("swiss-roll", p)


@_register("swiss-roll", 3,
           (LabelSpec("t", "parameter", "angle along the roll, in [1.5pi, 4.5pi]"),),
           "3-D swiss roll of scikit-learn's make_swiss_roll (t cos t, 21 v, t sin t)",
           {"pad_std": 1.0}, _validate_swiss_roll)
def _swiss_roll_block(rng: np.random.Generator, block: Block, p: Mapping[str, Any]):
    uv = rng.random((block.size, 2))
    t = 1.5 * np.pi * (1.0 + 2.0 * uv[:, 0])
    X = np.empty((block.size, 3))
    np.multiply(t, np.cos(t), out=X[:, 0])
    np.multiply(21.0, uv[:, 1], out=X[:, 1])
    np.multiply(t, np.sin(t), out=X[:, 2])
    return X, {"t": t}



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


def _validate_ellipsoid(name: str, p: Mapping[str, Any]) -> None:
    for key in ("a", "b", "c"):
        _require(p[key] > 0, name, key, p[key], "a positive number")
    _require(0 <= p["d"] < np.pi, name, "d", p["d"], "an opening angle in [0, pi)")
    _require(p["u_sampling"] in ("grid", "uniform"), name, "u_sampling", p["u_sampling"],
             "'grid' (u_i = 2 pi i / n, as in the paper) or 'uniform'")
    _check_pad(name, p)


def _validate_fishbowl(p: Mapping[str, Any]) -> None:
    _validate_ellipsoid("fishbowl", p)


_ELLIPSOID_DEFAULTS = {"a": 1.0, "b": 1.0, "c": 1.0, "d": math.pi / 4, "u_sampling": "grid",
                       "pad_std": 0.1}


@_register("fishbowl", 3, (LabelSpec("u", "parameter", "azimuth in [0, 2pi)"),
                           LabelSpec("v", "parameter", "polar angle in [d, pi]")),
           "3-D fishbowl: ellipsoid open at the top, v uniform in [d, pi] "
           "(Homrighausen & McDonald 2011, sec. 3.1)",
           _ELLIPSOID_DEFAULTS, _validate_fishbowl)
def _fishbowl_block(rng: np.random.Generator, block: Block, p: Mapping[str, Any]):
    r = rng.random((block.size, 2))
    d = p["d"]
    v = d + (np.pi - d) * r[:, 0]
    u = _fishbowl_u(r[:, 1], block, p["u_sampling"])
    return _ellipsoid(u, v, p), {"u": u, "v": v}



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



def _validate_halo_ball(p: Mapping[str, Any]) -> None:
    _validate_ellipsoid("halo-ball", p)
    _require(0 <= p["cut"] < 1, "halo-ball", "cut", p["cut"],
             "the fraction of the height removed at the bottom, in [0, 1)")
    _require(0 < p["ball_fraction"] < 1, "halo-ball", "ball_fraction", p["ball_fraction"],
             "the probability that a row is in the ball, in (0, 1)")
    _require(p["ball_radius"] > 0, "halo-ball", "ball_radius", p["ball_radius"],
             "a positive radius")



@_register("halo-ball", 3,
           (LabelSpec("label", "class", "0 = halo (outer ring), 1 = ball (inner glob)"),),
           "3-D halo and ball: fishbowl without its bottom fifth around a solid ball "
           "(Homrighausen & McDonald 2011, sec. 3.2)",
           dict(_ELLIPSOID_DEFAULTS, cut=0.2, ball_fraction=0.25, ball_radius=0.3),
           _validate_halo_ball)
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
    rng = block_rng(seed, 0, "blobs", PART_CENTERS)
    return rng.uniform(-center_box, center_box, size=(n_clusters, n_features))



def _validate_blobs(p: Mapping[str, Any]) -> None:
    _require(p["n_clusters"] >= 1, "blobs", "n_clusters", p["n_clusters"], "an integer >= 1")
    _require(p["n_features"] >= 1, "blobs", "n_features", p["n_features"], "an integer >= 1")
    _require(p["cluster_std"] >= 0, "blobs", "cluster_std", p["cluster_std"],
             "a non-negative standard deviation")
    _require(p["center_box"] > 0, "blobs", "center_box", p["center_box"], "a positive number")
    _check_pad("blobs", p)



@_register("blobs", 2, (LabelSpec("label", "class", "cluster number in [0, n_clusters)"),),
           "Gaussian clusters around seeded centres (n_clusters=3, cluster_std=1, n_features=2)",
           {"n_clusters": 3, "cluster_std": 1.0, "n_features": 2, "center_box": 10.0,
            "pad_std": 1.0}, _validate_blobs, dim_param="n_features")
def _blobs_block(rng: np.random.Generator, block: Block, p: Mapping[str, Any]):
    centers = blob_centers(block.seed, p["n_clusters"], p["n_features"], p["center_box"])
    label = rng.integers(0, p["n_clusters"], size=block.size)
    X = rng.standard_normal((block.size, p["n_features"]))
    X *= p["cluster_std"]
    X += centers[label]
    return X, {"label": label.astype(np.int32)}



# ---------------------------------------------------------------------------------------
# Resolution of the arguments
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetPlan:
    """The checked arguments of one data set: its spec, rows, columns, intrinsic
    dimension ``k``, noise, seed and resolved parameters."""

    spec: DatasetSpec
    n: int
    dim: int
    k: int
    noise: float
    seed: int
    params: dict[str, Any]

    @property
    def n_blocks(self) -> int:
        """Number of generation blocks of :data:`GENERATION_BLOCK_ROWS` rows."""
        return -(-self.n // GENERATION_BLOCK_ROWS)


def lookup(name: Any) -> DatasetSpec:
    """The spec of data set ``name`` (case and ``_``/``-`` ignored)."""
    key = name.strip().lower().replace("_", "-") if isinstance(name, str) else None
    if key not in DATASETS:
        raise InvalidParameterError(
            f"unknown data set {name!r}; expected one of: {', '.join(sorted(DATASETS))}; "
            "pick one of these names"
        )
    return DATASETS[key]


def check_whole(what: str, value: Any, low: int, fix: str) -> int:
    """``value`` as an int ``>= low``; the error message ends with ``fix``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise InvalidParameterError(f"{what} is {value!r}; expected an integer >= {low}; {fix}")
    return int(value)


def plan_dataset(name, n, dim, noise, seed, params) -> DatasetPlan:
    """``(name, n, dim, noise, seed, params)`` checked and resolved (defaults filled in)."""
    spec = lookup(name)
    n = check_whole("n (the number of rows)", n, 1, "pass a positive whole number of rows, "
                    "e.g. n=1_000_000 (not a float such as 1e6)")
    seed = check_whole("seed", seed, 0, "pass a non-negative integer seed")
    resolved = spec.resolve_params(params)
    k = spec.intrinsic_dim_for(resolved)
    if dim is None:
        dim = k
    dim = check_whole("dim", dim, k, f"data set {spec.name!r} has {k} intrinsic coordinates; "
                      f"pass dim >= {k} (extra columns are noise) or leave dim unset")
    if noise is None:
        noise = spec.default_noise
    if (isinstance(noise, bool) or not isinstance(noise, numbers.Real)
            or not math.isfinite(noise) or noise < 0):
        raise InvalidParameterError(
            f"noise is {noise!r}; expected a finite standard deviation >= 0; pass e.g. "
            f"noise=0.05, or leave it unset for the default ({spec.default_noise})"
        )
    return DatasetPlan(spec, n, dim, k, float(noise), seed, resolved)


#: A bound on |N(0, 1)| draws, far beyond any draw numpy's generator makes.
_GAUSSIAN_BOUND = 64.0

#: A bound on |intrinsic coordinate| of each data set, from its parameters.
_EXTENTS: dict[str, Callable[[Mapping[str, Any]], float]] = {
    "spiral": lambda p: max(abs(p["t_min"]), abs(p["t_max"])),
    "swiss-roll": lambda p: 21.0,
    "fishbowl": lambda p: max(p["a"], p["b"], p["c"]),
    "halo-ball": lambda p: max(p["a"], p["b"], p["c"]) + p["ball_radius"],
    "blobs": lambda p: p["center_box"] + _GAUSSIAN_BOUND * p["cluster_std"],
}


def check_representable(plan: DatasetPlan, dtype: np.dtype) -> None:
    """Refuse, before anything is written, parameters whose values ``dtype`` cannot hold.

    ``noise=1e39`` in float32 was stored as infinity with exit code 0, and ``verify``
    called the store intact (an outside audit). The bound is the data set's extent plus
    :data:`_GAUSSIAN_BOUND` standard deviations of padding and noise.
    """
    terms = {"the data set's parameters": _EXTENTS[plan.spec.name](plan.params),
             "pad_std": _GAUSSIAN_BOUND * plan.params["pad_std"] if plan.dim > plan.k else 0.0,
             "noise": _GAUSSIAN_BOUND * plan.noise}
    largest = float(np.finfo(dtype).max)
    bound = math.fsum(terms.values())
    if bound <= largest:
        return
    cause = max(terms, key=terms.get)
    name = np.dtype(dtype).name
    if cause == "noise":
        what, fix = f"noise = {plan.noise!r}", "pass a smaller noise (--noise)"
    elif cause == "pad_std":
        what, fix = f"pad_std = {plan.params['pad_std']!r}", "pass a smaller pad_std"
    else:
        what = (f"the parameters of {plan.spec.name!r} "
                f"({', '.join(f'{k}={v!r}' for k, v in plan.params.items())})")
        fix = "pass smaller parameter values"
    if name != "float64":
        fix += ", or dtype float64"
    raise InvalidParameterError(
        f"with {what}, the values of {plan.spec.name!r} reach about {bound:.3g}, beyond the "
        f"largest finite {name} ({largest:.3g}): they would be stored as infinity; expected "
        f"values that {name} holds: {fix}")
