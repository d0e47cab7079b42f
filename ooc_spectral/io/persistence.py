"""Saving and loading fitted models: a zarr group of arrays with JSON attributes.

Never pickle: a model is numbers (zarr arrays) and a JSON description (the
group's attributes), so loading one cannot execute code.

Layout of a saved model (group attributes under the key ``ooc_spectral_model``)::

    dictionary            (m, d)  float64   the dictionary rows, in selection order
    dictionary_indices    (m,)    int64     their row numbers in the training data
    dictionary_aux        (m,...) float64   the kernel's cached per-row values (if any)
    cholesky              (m, m)  float64   L, with L L' = k(D, D)
    w                     (m,)    float64   L^-1 1
    components            (m, p)  float64   eigenvectors (scaled, see SpectralMap)
    eigenvalues           (p,)    float64
    center                (m,)    float64   ybar or sum y (absent for subset degrees)
    kernel_subset         (s, d)  float64   the subset of the normalized kernel (if any)
    preimage_centers      (c, p)  float64   the pre-image map's centres (fit_inverse_transform)
    preimage_dual_coef    (c, d)  float64   its coefficients (the map's alpha is an attribute)

The attributes are written last: a group without them is not a model. Every
chunk carries a CRC-32C checksum and the attributes record ``arrays_sha256``,
a digest of every array's values; :func:`load_model` checks both and raises
:class:`~ooc_spectral.exceptions.DamagedDataError` naming the array when one
fails (a flipped bit, a deleted chunk read back as fill values).
"""

from __future__ import annotations

import os
from importlib import metadata

import numpy as np
import zarr
import zarr.errors

from ..core.config import FitConfig
from ..exceptions import (
    DamagedDataError,
    InvalidInputError,
    OutputNotWritableError,
    StoreNotFoundError,
)
from .integrity import arrays_digest, checksummed
from ..core.kernel_choice import kernel_from_attrs, kernel_to_attrs
from ..core.model import Dictionary, SpectralMap

__all__ = ["save_model", "load_model", "MODEL_KEY", "FORMAT_VERSION", "package_versions"]

MODEL_KEY = "ooc_spectral_model"
#: 2: kernel PCA models map rows by their orthogonal projection (``center`` is the
#: mean coordinate ``zbar``); format 1 used the affine projection.
FORMAT_VERSION = 2


def package_versions() -> dict[str, str]:
    """Versions of ooc_spectral and of the libraries the numbers depend on."""
    out = {}
    for name in ("ooc_spectral", "numpy", "scipy", "dask", "distributed", "zarr", "scikit-learn"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
            out[name] = "unknown"
    return out


def save_model(est, path, *, overwrite: bool = False) -> None:
    """Write the fitted estimator ``est`` to the zarr group at ``path``."""
    smap: SpectralMap = est.spectral_map_
    d: Dictionary = smap.dictionary
    kernel_attrs, kernel_arrays = kernel_to_attrs(d.kernel)
    arrays = {
        "dictionary": d.points,
        "dictionary_indices": d.indices,
        "w": d.w,
        "components": smap.components,
        "eigenvalues": smap.eigenvalues,
        **kernel_arrays,
    }
    if d.L is not None:  # None: the exact path's kernel basis (every row, no factor)
        arrays["cholesky"] = d.L
    if d.aux is not None:
        arrays["dictionary_aux"] = d.aux
    if smap.center is not None:
        arrays["center"] = smap.center
    preimage = getattr(est, "preimage_map_", None)
    if preimage is not None:  # its kernel is the model's kernel (saved above)
        arrays["preimage_centers"] = preimage.centers
        arrays["preimage_dual_coef"] = preimage.dual_coef
    loc = os.fspath(path)
    if overwrite:  # only a model (or a save killed before its marker) is ever replaced
        from .safety import check_replaceable

        check_replaceable(loc, (MODEL_KEY,), "a model", bare_members=set(arrays))
    try:
        group = zarr.open_group(_listed_afresh(loc), mode="w" if overwrite else "w-")
    except (FileExistsError, zarr.errors.ContainsGroupError, zarr.errors.ContainsArrayError) as exc:
        raise OutputNotWritableError(
            f"a model or other data already exists at {loc!r}; pass overwrite=True to replace it"
        ) from exc
    except OSError as exc:
        raise OutputNotWritableError(f"cannot write a model at {loc!r}: {exc}") from exc
    values = {name: np.asarray(value) for name, value in arrays.items()}
    for name, value in values.items():
        group.create_array(name, shape=value.shape, dtype=value.dtype,
                           chunks=value.shape or (1,), **checksummed())[...] = value
    group.attrs[MODEL_KEY] = {
        "arrays_sha256": arrays_digest(values),
        "format": FORMAT_VERSION,
        "class": type(est).__name__,
        "params": est._config().to_json() | {"random_state": int(est.random_state_)},
        "kernel": kernel_attrs,
        "mode": smap.mode,
        "affine": bool(d.affine),
        "solver": d.solver,
        "beta": float(d.beta),
        "n_samples": int(smap.n_samples),
        "preimage_alpha": None if preimage is None else float(preimage.alpha),
        "fitted": {
            "gamma_": est.gamma_,
            "tol_": float(est.tol_),
            "max_residual_": float(est.max_residual_),
            "max_residual_row_": int(est.max_residual_row_),
            "eigenvalue_error_bound_": (
                None if getattr(est, "eigenvalue_error_bound_", None) is None
                else float(est.eigenvalue_error_bound_)),
            "eigenvalue_interval_": (
                None if getattr(est, "eigenvalue_interval_", None) is None
                else [[float(a), float(b)] for a, b in est.eigenvalue_interval_]),
            "n_features_in_": int(est.n_features_in_),
            "n_samples_fit_": int(est.n_samples_fit_),
            "random_state_": int(est.random_state_),
            "timings_": {k: float(v) for k, v in est.timings_.items()},
        },
        "versions": package_versions(),
    }


def _listed_afresh(loc: str):
    """``loc`` for zarr to create a group at: a URL as a store whose listing cache is
    dropped first. zarr shares one file system instance per process, and its cached
    listings may predate a deletion made through another instance (a rerun removing the
    model of a complete OUTDIR on S3, then saving it again): mode ``w-`` then saw the
    deleted model and refused."""
    from .storage import is_url

    if not is_url(loc):
        return loc
    store = zarr.storage.FsspecStore.from_url(loc, read_only=False)
    store.fs.invalidate_cache()
    return store


def _open_model_group(loc: str):
    try:
        group = zarr.open_group(loc, mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError, zarr.errors.NodeNotFoundError) as exc:
        raise StoreNotFoundError(
            f"no saved model at {loc!r}; check the path (a model is a zarr group written by "
            "GreedySpectralEmbedding.save or the 'model' group of an ooc-spectral fit output)"
        ) from exc
    if MODEL_KEY not in group.attrs and "model" in group.group_keys():
        group = group["model"]  # an `ooc-spectral fit` output directory
    if MODEL_KEY not in group.attrs:
        raise InvalidInputError(
            f"the zarr group at {loc!r} is not a complete saved model (no {MODEL_KEY!r} "
            "attribute: it was not written by save(), or saving was interrupted); save the "
            "model again"
        )
    return group


def load_model(cls, path):
    """Read a model written by :func:`save_model`; returns a fitted ``cls``."""
    return load_model_and_digest(cls, path)[0]


def load_model_and_digest(cls, path):
    """:func:`load_model`, and the ``arrays_sha256`` recorded with those arrays (None for
    a model saved without one): the model's identity, which changes whenever a refit or
    an overwrite writes new arrays at ``path``."""
    from ..exceptions import DamagedFileError, OocSpectralError

    loc = os.fspath(path)
    try:
        return _load_model(cls, loc)
    except OocSpectralError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # garbled metadata
        raise DamagedFileError(
            f"the model at {loc!r} is damaged: its metadata (a zarr.json) is garbled or lost "
            f"a field ({type(exc).__name__}: {' '.join(str(exc).split())[:120]}); restore it, "
            "or rerun the fit (a rerun of `ooc-spectral fit` rewrites it)") from None


def _load_model(cls, loc: str):
    group = _open_model_group(loc)
    meta = group.attrs[MODEL_KEY]
    if meta.get("format") != FORMAT_VERSION:
        raise InvalidInputError(
            f"the model at {loc!r} has format {meta.get('format')!r}; this version of "
            f"ooc_spectral reads format {FORMAT_VERSION}: refit, or use the version that wrote it"
        )
    arr = {}
    for name in group.array_keys():
        try:
            arr[name] = np.asarray(group[name][...])
        except Exception as exc:  # a checksum or codec failure
            raise DamagedDataError(
                f"the model at {loc!r} is damaged: its array {name!r} cannot be read "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); restore it, or "
                "rerun the fit (a rerun of `ooc-spectral fit` rewrites it)"
            ) from exc
    digest = meta.get("arrays_sha256")
    if digest is not None and arrays_digest(arr) != digest:
        raise DamagedDataError(
            f"the model at {loc!r} is damaged: its arrays do not match the digest saved with "
            "them (a changed or deleted chunk); restore it, or rerun the fit (a rerun of "
            "`ooc-spectral fit` rewrites it)"
        )
    kernel = kernel_from_attrs(meta["kernel"], arr)
    dictionary = Dictionary(
        kernel=kernel,
        points=arr["dictionary"],
        indices=arr["dictionary_indices"],
        aux=arr.get("dictionary_aux"),
        L=arr.get("cholesky"),
        w=arr["w"],
        beta=float(meta["beta"]),
        affine=bool(meta["affine"]),
        solver=meta.get("solver", "trsm"),
    )
    smap = SpectralMap(dictionary, meta["mode"], arr.get("center"), arr["components"],
                       arr["eigenvalues"], int(meta["n_samples"]))
    params = FitConfig.from_params(meta["params"]).to_json()
    est = cls(**params)
    fitted = meta["fitted"]
    est.spectral_map_ = smap
    est.kernel_ = kernel
    est.eigenvalues_ = smap.eigenvalues.copy()
    est.dictionary_ = dictionary.points
    est.dictionary_indices_ = dictionary.indices
    for name, value in fitted.items():
        if name == "eigenvalue_interval_" and value is not None:
            value = np.asarray(value, dtype=np.float64).reshape(-1, 2)
        setattr(est, name, value)
    est.resumed_stages_ = []
    preimage = None
    if "preimage_dual_coef" in arr:
        from ..core.preimage import PreimageMap

        preimage = PreimageMap(kernel.without_center(), arr["preimage_centers"],
                               arr["preimage_dual_coef"], float(meta["preimage_alpha"]))
    est._set_preimage(preimage)
    return est, digest
