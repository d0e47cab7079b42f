"""Helpers shared by the paper reproductions (not an experiment module itself).

Parameter coercion (values arrive from ``--param key=value``, read as JSON when
possible, or from a workflow's ``param`` table, passed through ``str()``),
data loading, timing, markdown tables, figures and the cache of exact
reference embeddings.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..exceptions import InvalidParameterError

log = logging.getLogger("ooc_spectral.experiments")

#: Largest PNG written (bytes); figures are re-saved at a lower resolution above it.
MAX_PNG_BYTES = 200_000


# --------------------------------------------------------------------------- #
# parameters
# --------------------------------------------------------------------------- #
def as_list(name: str, value, cast: Callable = str) -> list:
    """A list from a list, a tuple, ``"a,b,c"``, ``"[1, 2]"`` / ``"['a', 'b']"`` or one value."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise InvalidParameterError(f"{name}={value!r} is not a list") from None
        else:
            value = [v.strip() for v in text.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        value = [value]
    try:
        return [cast(v) for v in value]
    except (TypeError, ValueError):
        raise InvalidParameterError(
            f"{name}={value!r} is not valid: expected a list of {cast.__name__}"
        ) from None


def as_int(name: str, value, low: int = 1) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name}={value!r} is not an integer") from None
    if out != float(value) or out < low:
        raise InvalidParameterError(f"{name}={value!r} is not valid: expected an integer >= {low}")
    return out


def as_float(name: str, value, low: float | None = None, *, inclusive: bool = False) -> float:
    """A finite float above ``low`` (at least ``low`` when ``inclusive``)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name}={value!r} is not a number") from None
    bad = low is not None and (out < low if inclusive else out <= low)
    if not math.isfinite(out) or bad:
        raise InvalidParameterError(
            f"{name}={value!r} is not valid: expected a number {'>=' if inclusive else '>'} {low}"
        )
    return out


def as_bool(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise InvalidParameterError(f"{name}={value!r} is not valid: expected true or false")


def check_choices(name: str, values: Sequence[str], choices: Sequence[str]) -> None:
    for v in values:
        if v not in choices:
            raise InvalidParameterError(
                f"{name}: {v!r} is not valid; expected some of {', '.join(choices)}"
            )


# --------------------------------------------------------------------------- #
# data
# --------------------------------------------------------------------------- #
def load_dataset(name: str, n: int | None, *, seed: int = 0, noise: float | None = None,
                 mnist: str | None = None) -> tuple[np.ndarray, dict]:
    """``(X, labels)`` of a named data set.

    ``spiral``, ``fishbowl``, ``halo-ball``, ``swiss-roll``, ``blobs``: generated
    (:func:`ooc_spectral.datasets.generate`, ``n`` rows). ``digits``:
    scikit-learn's bundled digits (all 1797, or the first ``n`` of a seeded
    permutation). ``mnist``: classes 0 and 1 at 14 x 14 from the local file(s)
    ``mnist`` (never downloaded).
    """
    from ..io.datasets import generate
    from ..io.loaders import load_digits, load_mnist

    if name == "digits":
        X, y = load_digits()
        if n is not None and n < len(y):
            perm = np.random.default_rng(seed).permutation(len(y))[:n]
            X, y = X[perm], y[perm]
        return X, {"label": y}
    if name == "mnist":
        if not mnist:
            raise InvalidParameterError(
                "dataset 'mnist' needs --param mnist=PATH (IDX files or an .npz you already "
                "have); nothing is downloaded. Use dataset 'digits' for scikit-learn's bundled "
                "digits instead"
            )
        X, y = load_mnist(mnist, classes=(0, 1), size=14)
        if n is not None and n < len(y):
            perm = np.random.default_rng(seed).permutation(len(y))[:n]
            X, y = X[perm], y[perm]
        return X, {"label": y}
    kwargs = {} if noise is None else {"noise": noise}
    X, labels = generate(name, int(n), seed=seed, **kwargs)
    return X, labels


def median_gamma(X: np.ndarray, seed: int = 0, sample: int = 2000) -> float:
    """``1 / median ||x - y||^2`` over a seeded sample of rows
    (:func:`~ooc_spectral.core.kernel_choice.median_heuristic_gamma` for ``rbf``)."""
    from ..core.kernel_choice import median_heuristic_gamma

    rows = np.random.default_rng(seed).permutation(len(X))[:sample]
    return median_heuristic_gamma("rbf", X[rows])


def single_threaded_experiment(func: Callable) -> Callable:
    """Run an experiment function inside :func:`single_threaded`."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with single_threaded():
            return func(*args, **kwargs)

    return wrapper


# --------------------------------------------------------------------------- #
# timing and statistics
# --------------------------------------------------------------------------- #
@contextlib.contextmanager
def single_threaded():
    """One BLAS thread and dask's synchronous scheduler, for comparable timings.

    Every method is then timed on one core: CPU seconds measure its cost, and
    no method gains or loses from thread scheduling (on an oversubscribed
    machine a multi-threaded BLAS can be a hundred times slower than one thread).
    """
    import dask
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1), dask.config.set(scheduler="synchronous"):
        yield


def timed(fn: Callable[[], Any], repeats: int = 1) -> tuple[Any, float, float]:
    """``(result, wall, cpu)``: the best wall and process CPU seconds over ``repeats``."""
    wall = cpu = math.inf
    result = None
    for _ in range(max(1, repeats)):
        w0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall = min(wall, time.perf_counter() - w0)
        cpu = min(cpu, time.process_time() - c0)
    return result, wall, cpu


def mean_ci(values) -> tuple[float, float]:
    """Mean and 95% t-interval half-width across repeats (0 for one value)."""
    from scipy import stats

    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return math.nan, math.nan
    if v.size == 1:
        return float(v[0]), 0.0
    half = stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean()), float(half)


def fmt(value: float, digits: int = 3) -> str:
    if value is None or not np.isfinite(value):
        return "n/a"
    return f"{value:.{digits}g}"


def fmt_ci(mean: float, half: float) -> str:
    if mean is None or not np.isfinite(mean):
        return "n/a"
    return f"{mean:.3g} ± {half:.2g}"


# --------------------------------------------------------------------------- #
# outputs
# --------------------------------------------------------------------------- #
def sparse_labels(xs: Sequence[float], factor: float = 1.4) -> list[bool]:
    """Which points of a log-scale series to label so that labels do not pile up."""
    keep, last = [], None
    for x in xs:
        ok = last is None or not (x > 0 and last > 0) or max(x / last, last / x) >= factor
        keep.append(ok)
        if ok:
            last = x
    return keep


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def write_outputs(out: Path, name: str, markdown: str, data: dict) -> dict:
    """Write ``name.md`` and ``name.json``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{name}.md"
    js = out / f"{name}.json"
    md.write_text(markdown.rstrip() + "\n")
    js.write_text(json.dumps(data, indent=1, default=_json_default) + "\n")
    return {"table": str(md), "json": str(js)}


def _json_default(obj):
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    return str(obj)


def save_figure(fig, path: Path, dpi: int = 100) -> str:
    """Save a PNG under :data:`MAX_PNG_BYTES` (lowering the resolution if needed)."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    for d in (dpi, 80, 64, 50):
        fig.savefig(path, dpi=d, bbox_inches="tight")
        if path.stat().st_size <= MAX_PNG_BYTES:
            break
    plt.close(fig)
    return str(path)


def log_xticks(ax, values: Sequence[float], max_labels: int = 8) -> None:
    """Log x axis labelled at (a thinned subset of) ``values``, no minor labels."""
    from matplotlib.ticker import NullFormatter

    values = sorted(set(values))
    step = max(1, -(-len(values) // max_labels))
    ticks = values[::step]
    ax.set_xscale("log")
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --------------------------------------------------------------------------- #
# cached protocol references
# --------------------------------------------------------------------------- #
def cached_protocol(cache_dir: Path | None, key: dict, X: np.ndarray, **kwargs):
    """A :class:`~ooc_spectral.experiments.evaluation.Protocol`, its reference kept in a cache.

    The exact reference on ``D2 U D3`` is the costliest step of the section 5
    protocol and is the same for the Table 1, Figure 3 and Figure 4
    reproductions; it is stored as ``reference-<hash of key>.npz`` in
    ``cache_dir`` (None: no cache) with the split it belongs to, and reused
    only when the split is the same.
    """
    from .evaluation import Protocol, split_indices

    if cache_dir is None:
        return Protocol(X, **kwargs)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    path = Path(cache_dir) / f"reference-{digest}.npz"
    split = split_indices(len(X), (kwargs["n_train"], kwargs["n_test"], kwargs["n_extra"]),
                          kwargs.get("random_state", 0))
    if path.exists():
        with np.load(path) as z:
            same = all(np.array_equal(z[f"i{k}"], split[k]) for k in range(3))
            if same:
                log.info("reference embedding read from %s", path)
                return Protocol(X, reference=(z["reference"], z["eigenvalues"]),
                                reference_seconds=float(z["seconds"]), **kwargs)
    proto = Protocol(X, **kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".partial.npz")
    np.savez(tmp, reference=proto.reference, eigenvalues=proto.reference_eigenvalues,
             i0=split[0], i1=split[1], i2=split[2], seconds=np.array(proto.reference_seconds))
    tmp.replace(path)
    return proto
