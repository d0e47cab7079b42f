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
chunk carries a CRC-32C checksum, the attributes record ``arrays_sha256``, a
digest of every array's values, and ``attrs_sha256``, a digest of the attributes
themselves (the kernel, the parameters, the certificate's figures, and
``arrays_sha256``); :func:`read_model` checks all three and raises
:class:`~ooc_spectral.exceptions.DamagedDataError` naming what failed (a flipped
bit, a deleted chunk read back as fill values, a changed digit in zarr.json, a
description from another save). These detect damage, not an adversary: whoever
can rewrite a model can rewrite its digests too.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from importlib import metadata
from typing import Any

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
from .integrity import arrays_digest, checksummed, seal_holds, sealed
from .zarr_nodes import new_array
from ..core.kernel_choice import kernel_from_attrs, kernel_to_attrs
from ..core.kernel_names import KERNEL_ALIASES
from ..core.model import Dictionary, SpectralMap

__all__ = ["SavedModel", "save_model", "load_model", "read_model", "write_model", "model_of_fit",
           "MODEL_KEY", "FORMAT_VERSION", "package_versions"]

MODEL_KEY = "ooc_spectral_model"
#: 2: kernel PCA models map rows by their orthogonal projection (``center`` is the
#: mean coordinate ``zbar``); format 1 used the affine projection. 3: the attributes
#: carry their own digest, ``attrs_sha256`` (format 2 is still read, without it).
FORMAT_VERSION = 3
READABLE_FORMATS = (2, 3)


#: The attribute under which a model's description carries its own digest
#: (:func:`~ooc_spectral.io.integrity.sealed`): with ``arrays_sha256`` among the fields
#: it covers, it ties the description (kernel, parameters, the certificate's figures) to
#: the arrays. A digest detects damage (a changed digit, a field lost, a description from
#: another save), not someone who rewrites it too.
ATTRS_KEY = "attrs_sha256"


def attrs_digest(meta: dict) -> str:
    """The digest :data:`ATTRS_KEY` of a model's attributes should hold."""
    return sealed({k: v for k, v in meta.items() if k != ATTRS_KEY}, key=ATTRS_KEY)[ATTRS_KEY]


def package_versions() -> dict[str, str]:
    """Versions of ooc_spectral and of the libraries the numbers depend on."""
    out = {}
    for name in ("ooc_spectral", "numpy", "scipy", "dask", "distributed", "zarr", "scikit-learn"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
            out[name] = "unknown"
    return out


@dataclass
class SavedModel:
    """A fitted model as it is saved: what ``GreedySpectralEmbedding``'s fitted
    attributes hold, without the estimator (the command line writes and reads models
    without importing scikit-learn).

    ``fitted`` maps the scalar fitted attributes (``gamma_``, ``tol_``,
    ``max_residual_``, ...) to JSON values (:func:`fitted_record`); ``params`` are the
    estimator's parameters; ``digest`` is the ``arrays_sha256`` read with the arrays
    (None for a model being written).
    """

    class_name: str
    params: dict
    spectral_map: SpectralMap
    fitted: dict
    preimage: Any = None
    digest: str | None = None


#: The fitted attributes every saved model records (:func:`fitted_record`).
FITTED = ("gamma_", "tol_", "max_residual_", "max_residual_row_", "eigenvalue_error_bound_",
          "eigenvalue_interval_", "n_features_in_", "n_samples_fit_", "random_state_",
          "timings_")


def fitted_record(*, gamma, tol, max_residual, max_residual_row, eigenvalue_error_bound,
                  eigenvalue_interval, n_features, n_samples, random_state, timings) -> dict:
    """The fitted attributes a model saves, as JSON values, under their ``*_`` names."""
    return {
        "gamma_": gamma,
        "tol_": float(tol),
        "max_residual_": float(max_residual),
        "max_residual_row_": int(max_residual_row),
        "eigenvalue_error_bound_": (None if eigenvalue_error_bound is None
                                    else float(eigenvalue_error_bound)),
        "eigenvalue_interval_": (None if eigenvalue_interval is None
                                 else [[float(a), float(b)] for a, b in eigenvalue_interval]),
        "n_features_in_": int(n_features),
        "n_samples_fit_": int(n_samples),
        "random_state_": int(random_state),
        "timings_": {k: float(v) for k, v in timings.items()},
    }


def model_of_fit(result, config: FitConfig, *, n_samples: int | None = None,
                 class_name: str = "GreedySpectralEmbedding") -> SavedModel:
    """The model of a finished fit (a :class:`~ooc_spectral.pipeline.fit.FitResult` of
    ``config``), as ``GreedySpectralEmbedding.save`` writes it after that fit;
    ``n_samples`` overrides the fitted row count (an update's)."""
    random_state = result.config.random_state
    return SavedModel(
        class_name=class_name,
        params=config.to_json() | {"random_state": int(random_state)},
        spectral_map=result.spectral_map,
        fitted=fitted_record(
            gamma=result.gamma, tol=result.tol, max_residual=result.max_residual,
            max_residual_row=result.max_residual_row,
            eigenvalue_error_bound=result.eigenvalue_error_bound,
            eigenvalue_interval=result.eigenvalue_interval, n_features=result.n_features,
            n_samples=result.n_samples if n_samples is None else n_samples,
            random_state=random_state, timings=result.timings),
        preimage=result.preimage)


def save_model(est, path, *, overwrite: bool = False) -> None:
    """Write the fitted estimator ``est`` to the zarr group at ``path``.

    Its ``feature_names_in_`` (a fit on a DataFrame) is saved too, so the loaded model
    checks new rows' column names as the fitted one does."""
    names = getattr(est, "feature_names_in_", None)
    write_model(SavedModel(
        class_name=type(est).__name__,
        # the kernel's name as the user gave it ('poly' stays 'poly' for get_params)
        params=est._config().to_json() | {"random_state": int(est.random_state_)}
        | ({"kernel": est.kernel} if isinstance(est.kernel, str) else {}),
        spectral_map=est.spectral_map_,
        fitted=({} if names is None else {"feature_names_in_": [str(c) for c in names]})
        | fitted_record(
            gamma=est.gamma_, tol=est.tol_, max_residual=est.max_residual_,
            max_residual_row=est.max_residual_row_,
            eigenvalue_error_bound=getattr(est, "eigenvalue_error_bound_", None),
            eigenvalue_interval=getattr(est, "eigenvalue_interval_", None),
            n_features=est.n_features_in_, n_samples=est.n_samples_fit_,
            random_state=est.random_state_, timings=est.timings_),
        preimage=getattr(est, "preimage_map_", None)), path, overwrite=overwrite)


def write_model(model: SavedModel, path, *, overwrite: bool = False) -> None:
    """Write ``model`` to the zarr group at ``path`` (the layout above)."""
    smap = model.spectral_map
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
    preimage = model.preimage
    if preimage is not None:  # its kernel is the model's kernel (saved above)
        arrays["preimage_centers"] = preimage.centers
        arrays["preimage_dual_coef"] = preimage.dual_coef
    loc = os.fspath(path)
    if overwrite:  # only a model (or a save killed before its marker) is ever replaced
        from .safety import check_replaceable

        check_replaceable(loc, (MODEL_KEY,), "a model", bare_members=set(arrays))
    try:
        group = zarr.open_group(_listed_afresh(loc), mode="w" if overwrite else "w-")
    except (FileExistsError, zarr.errors.ContainsGroupError, zarr.errors.ContainsArrayError):
        # from None: the refusal is the whole story, zarr's own traceback adds nothing (a
        # notebook cell that saves, run twice, showed two chained tracebacks)
        raise OutputNotWritableError(_exists_message(loc)) from None
    except OSError as exc:
        raise OutputNotWritableError(f"cannot write a model at {loc!r}: {exc}") from exc
    values = {name: np.asarray(value) for name, value in arrays.items()}
    for name, value in values.items():  # on a store rooted at the array: no parent checked
        new_array(group, name, value, **checksummed())
    meta = {
        "arrays_sha256": arrays_digest(values),
        "format": FORMAT_VERSION,
        "class": model.class_name,
        "params": model.params,
        "kernel": kernel_attrs,
        "mode": smap.mode,
        "affine": bool(d.affine),
        "solver": d.solver,
        "beta": float(d.beta),
        "n_samples": int(smap.n_samples),
        "preimage_alpha": None if preimage is None else float(preimage.alpha),
        "fitted": model.fitted,
        "versions": package_versions(),
    }
    group.attrs[MODEL_KEY] = sealed(meta, key=ATTRS_KEY)


def _exists_message(loc: str) -> str:
    """Why ``save`` without ``overwrite`` refused ``loc``, and what to do about it."""
    try:
        is_model = MODEL_KEY in zarr.open_group(loc, mode="r").attrs
    except Exception:  # noqa: BLE001 -- only chooses the wording; the refusal stands
        is_model = False
    if is_model:
        return (f"a saved model already exists at {loc!r}; pass overwrite=True to replace it "
                "(save(path, overwrite=True)), or choose another path")
    return (f"{loc!r} already exists and is not a saved model; choose another path "
            "(overwrite=True replaces a saved model or an interrupted save, nothing else)")


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
    except zarr.errors.ContainsArrayError as exc:
        raise InvalidInputError(
            f"{loc!r} is a zarr array, not a saved model (a zarr group written by "
            "GreedySpectralEmbedding.save, or an ooc-spectral fit output); pass the model's path"
        ) from exc
    if MODEL_KEY not in group.attrs:  # an `ooc-spectral fit` output directory?
        # looked up by name: listing the members warns of report.json, not zarr's
        try:
            inner = group["model"]
        except KeyError:
            inner = None
        if isinstance(inner, zarr.Group):
            group = inner
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
    """:func:`load_model`, and the ``arrays_sha256`` recorded with those arrays: the
    model's identity, which changes whenever a refit or an overwrite writes new arrays
    at ``path``."""
    model = read_model(path)
    with _garbled_metadata(os.fspath(path)):
        est = cls(**model.params)
        smap = model.spectral_map
        est.spectral_map_ = smap
        est.kernel_ = smap.dictionary.kernel
        est.eigenvalues_ = smap.eigenvalues.copy()
        est.dictionary_ = smap.dictionary.points
        est.dictionary_indices_ = smap.dictionary.indices
        for name, value in model.fitted.items():
            if name == "eigenvalue_interval_" and value is not None:
                value = np.asarray(value, dtype=np.float64).reshape(-1, 2)
            elif name == "feature_names_in_":
                value = np.asarray(value, dtype=object)
            setattr(est, name, value)
        est.resumed_stages_ = []
        est._set_preimage(model.preimage)
    return est, model.digest


def read_model(path) -> SavedModel:
    """Read the model at ``path`` (a saved model, or an ``ooc-spectral fit`` OUTDIR),
    checking every array against its checksums and the digest saved with them."""
    loc = os.fspath(path)
    with _garbled_metadata(loc):
        return _read_model(loc)


@contextlib.contextmanager
def _garbled_metadata(loc: str):
    """A field of the model's metadata missing or of the wrong type: DamagedFileError."""
    from ..exceptions import DamagedFileError, OocSpectralError

    try:
        yield
    except OocSpectralError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DamagedFileError(
            f"the model at {loc!r} is damaged: its metadata (a zarr.json) is garbled or lost "
            f"a field ({type(exc).__name__}: {' '.join(str(exc).split())[:120]}); restore it, "
            "or rerun the fit (a rerun of `ooc-spectral fit` rewrites it)") from None


def _read_model(loc: str) -> SavedModel:
    group = _open_model_group(loc)
    meta = group.attrs[MODEL_KEY]
    if meta.get("format") not in READABLE_FORMATS:
        raise InvalidInputError(
            f"the model at {loc!r} has format {meta.get('format')!r}; this version of "
            f"ooc_spectral reads formats {', '.join(map(str, READABLE_FORMATS))}: refit, or "
            "use the version that wrote it"
        )
    if meta["format"] >= 3 and not seal_holds(meta, key=ATTRS_KEY):
        raise DamagedDataError(
            f"the model at {loc!r} is damaged: its description (zarr.json: the kernel, the "
            "parameters, the certificate's figures) does not match the digest saved with it "
            f"({'no digest' if ATTRS_KEY not in meta else 'a changed field'}); restore it, "
            "or rerun the fit (a rerun of `ooc-spectral fit` rewrites it)"
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
    if digest is None or arrays_digest(arr) != digest:
        raise DamagedDataError(
            f"the model at {loc!r} is damaged: its arrays do not match the digest saved with "
            f"them ({'no digest' if digest is None else 'a changed or deleted chunk'}); "
            "restore it, or rerun the fit (a rerun of `ooc-spectral fit` rewrites it)"
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
    preimage = None
    if "preimage_dual_coef" in arr:
        from ..core.preimage import PreimageMap

        preimage = PreimageMap(kernel.without_center(), arr["preimage_centers"],
                               arr["preimage_dual_coef"], float(meta["preimage_alpha"]))
    fitted = dict(meta["fitted"])
    lost = [name for name in FITTED if name not in fitted]
    if lost:
        raise KeyError(", ".join(lost))
    params = FitConfig.from_params(meta["params"], saved=True).to_json()
    if meta["params"].get("kernel") in KERNEL_ALIASES:  # as the user named it ('poly')
        params["kernel"] = meta["params"]["kernel"]
    return SavedModel(class_name=str(meta.get("class", "")),
                      params=params,
                      spectral_map=smap, fitted=fitted, preimage=preimage, digest=digest)
