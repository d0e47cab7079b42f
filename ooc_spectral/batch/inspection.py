"""``ooc-spectral inspect``: a readable summary of an OUTDIR, a model or a data set."""

from __future__ import annotations

import warnings
from pathlib import Path

import zarr
import zarr.errors

from ..io.checkpoint import RUN_KEY, RunDirectory
from ..exceptions import InvalidInputError, StoreNotFoundError
from ..io.persistence import MODEL_KEY

__all__ = ["inspect_path"]


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)  # pragma: no cover


def _run_summary(path: Path, rundir: RunDirectory, attrs: dict) -> tuple[str, dict]:
    report = rundir.read_report() or {}
    lines = [f"ooc-spectral run at {path}", f"  status           {attrs.get('status')}"]
    holder = rundir.lock_holder() if rundir.is_locked() else None  # a dead run's file: no lock
    if holder:
        lines.append(f"  locked by        pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')}")
    if attrs.get("error"):
        lines.append(f"  last error       {attrs['error']}")
    est = attrs.get("config", {}).get("estimator", {})
    inp = attrs.get("config", {}).get("input", {})
    lines += [f"  input            {inp.get('url')} {tuple(inp.get('shape', ()))} {inp.get('dtype')}",
              "  parameters       " + ", ".join(f"{k}={v}" for k, v in est.items())]
    if report:
        lines += [
            f"  rows x features  {report.get('n_samples')} x {report.get('n_features')}",
            f"  dictionary       {report.get('dictionary_size')} points (tol {report.get('tol')}, "
            f"gamma {report.get('gamma')})",
            f"  certificate      max residual {report.get('max_residual')} "
            f"(row {report.get('max_residual_row')})",
            f"  eigenvalues      {', '.join(f'{v:.6g}' for v in report.get('eigenvalues', []))}",
            f"  wall time        {report.get('wall_seconds')} s, peak memory "
            f"{_fmt_bytes(report.get('peak_memory_bytes'))}",
        ]
        for name, st in (report.get("stages") or {}).items():
            lines.append(f"    {name:<10} {st.get('seconds'):>10.3f} s  peak {_fmt_bytes(st.get('peak_memory_bytes'))}")
        if report.get("resumed_stages"):
            lines.append(f"  resumed stages   {', '.join(report['resumed_stages'])}")
    info = {"kind": "run", "path": str(path), "status": attrs.get("status"), "report": report}
    return "\n".join(lines), info


def _model_summary(path: Path, meta: dict, group) -> tuple[str, dict]:
    fitted = meta.get("fitted", {})
    m = group["dictionary"].shape
    lines = [f"ooc-spectral model at {path}",
             f"  mode             {meta.get('mode')} (affine={meta.get('affine')})",
             f"  kernel           {meta.get('kernel')}",
             f"  dictionary       {m[0]} points x {m[1]} features",
             f"  components       {group['components'].shape[1]}",
             f"  eigenvalues      {', '.join(f'{v:.6g}' for v in group['eigenvalues'][...])}",
             f"  trained on       {fitted.get('n_samples_fit_')} rows",
             f"  certificate      max residual {fitted.get('max_residual_')} (tol {fitted.get('tol_')})",
             "  versions         " + ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items())]
    return "\n".join(lines), {"kind": "model", "path": str(path), "meta": meta}


def inspect_path(path) -> tuple[str, dict]:
    """Text and a JSON-able dict describing ``path``."""
    from ..io.storage import check_location, is_unreachable, is_url, missing_credentials

    text = check_location(path, "path")
    if is_url(text):  # object storage: the URL as given
        path = text.rstrip("/")
        try:
            node = zarr.open(path, mode="r")
        except (FileNotFoundError, KeyError, zarr.errors.NodeNotFoundError) as exc:
            raise StoreNotFoundError(f"nothing at {path!r}; check the URL") from exc
        except Exception as exc:
            if is_unreachable(exc) or missing_credentials(exc):  # not an answer about the
                raise  # store: exit 1 (unreachable) or 2 naming the credentials, as for fit
            raise InvalidInputError(f"{path} is not a zarr store: {exc}") from exc
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Object at .* is not recognized")
            return _describe(path, node)
    path = Path(text)
    if not path.exists():
        raise StoreNotFoundError(f"nothing at {str(path)!r}; check the path")
    try:
        node = zarr.open(str(path), mode="r")
    except Exception as exc:
        raise InvalidInputError(f"{path} is not a zarr store: {exc}") from exc
    with warnings.catch_warnings():
        # report.json and .lock sit in an OUTDIR beside the zarr nodes
        warnings.filterwarnings("ignore", message="Object at .* is not recognized")
        return _describe(path, node)


def _describe(path: Path, node) -> tuple[str, dict]:
    if isinstance(node, zarr.Array):
        text = f"zarr array at {path}: shape {node.shape}, dtype {node.dtype}, chunks {node.chunks}"
        return text, {"kind": "array", "shape": list(node.shape), "dtype": str(node.dtype)}
    attrs = dict(node.attrs)
    if RUN_KEY in attrs:
        return _run_summary(path, RunDirectory(path), attrs[RUN_KEY])
    if MODEL_KEY in attrs:
        return _model_summary(path, attrs[MODEL_KEY], node)
    arrays = {k: node[k] for k in node.array_keys()}
    lines = [f"zarr group at {path}"]
    for key, value in attrs.items():
        lines.append(f"  attribute {key}: {value}")
    for k, a in arrays.items():
        lines.append(f"  array {k}: shape {a.shape}, dtype {a.dtype}, chunks {a.chunks}")
    return "\n".join(lines), {"kind": "group", "attrs": attrs,
                              "arrays": {k: list(a.shape) for k, a in arrays.items()}}
