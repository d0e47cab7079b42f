"""Pictures of an embedding: a scatter, or a density image read chunk by chunk.

:func:`plot_embedding` reads an output directory of ``ooc-spectral fit`` (or
``transform``). Colours come from the input's stored label or generating
parameter (the 1-D arrays ``make-data`` writes beside ``data``), or from another
embedding coordinate. For ``n >= 10^6`` rows (or ``density="always"``) the
picture is a 2-D histogram accumulated over the zarr chunks in two passes
(range, then counts and colour sums), so memory stays flat whatever n.

What is drawn is checked first as ``verify`` checks it: the embedding's chunks and the
run's report against the OUTDIR's manifest (a damaged one is refused, exit 2, naming the
fit that repairs it, as ``transform`` refuses a damaged model), and a stored label against
the digests its writer recorded (exit 2 naming ``make-data`` or ``import``, as a fit of the
damaged data set).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import zarr

from ..io.checkpoint import RunDirectory
from ..exceptions import InvalidInputError, StoreNotFoundError
from ..io.source import open_zarr_array
from ..io.verify import check_fit_output
from ..pipeline.writeback import EMBEDDING

__all__ = ["plot_embedding", "DENSITY_THRESHOLD"]

DENSITY_THRESHOLD = 1_000_000
LABEL_NAMES = ("label", "t", "labels", "y")


def _find_labels(report: dict | None):
    """The 1-D label array stored beside the input's data array, if any."""
    url = ((report or {}).get("input") or {}).get("url")
    if not url:
        return None, None
    parent = Path(url).parent
    try:
        group = zarr.open_group(str(parent), mode="r")
    except Exception:
        return None, None
    for name in LABEL_NAMES:
        if name in group.array_keys() and group[name].ndim == 1:
            _check_writer_digests(group, name, str(parent))
            return group[name], name
    return None, None


def _check_writer_digests(group, name: str, loc: str) -> None:
    """Refuse the data set's array ``name`` unless it matches the digests its writer
    (``make-data``, ``import``) recorded: ``verify``'s check of that member, every chunk
    re-read. :class:`~ooc_spectral.exceptions.DamagedDataError` (exit 2, as a fit of the
    data set) naming the damage and the writer's command; an array no writer of ours
    recorded (added by the user) is not checked."""
    from ..exceptions import DamagedDataError
    from ..io.layout import DATASET_KEY, IMPORT_KEY, rewrite_input
    from ..io.manifest import audit_dataset

    for key in (DATASET_KEY, IMPORT_KEY):
        found = [str(f) for f in audit_dataset(group, key, only={name})]
        if found:
            raise DamagedDataError(
                f"the data set at {loc} is damaged, so its {name!r} is not drawn: "
                f"{'; '.join(found[:3])}; {rewrite_input(dict(group.attrs))}")


def _blocks(arr, rows: int):
    for a in range(0, arr.shape[0], rows):
        yield a, min(a + rows, arr.shape[0])


def plot_embedding(outdir, out_png, *, color_by: str = "label", dims=(0, 1),
                   density: str = "auto", title: str | None = None, bins: int = 600) -> dict:
    """Write a PNG of two embedding coordinates; returns what was drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir = os.fspath(outdir)
    rundir = RunDirectory(outdir)
    if not Path(outdir).exists():
        raise StoreNotFoundError(f"no output directory at {outdir!r}; run `ooc-spectral fit` first")
    if rundir.status() != "complete":
        raise InvalidInputError(f"{outdir} does not hold a complete run (status: "
                                f"{rundir.status()!r}); finish the run first")
    # verify's check of what is drawn: every embedding chunk against its digest, the report
    check_fit_output(outdir, only={EMBEDDING, "report.json"})
    emb = open_zarr_array(Path(outdir) / EMBEDDING)
    n, p = emb.shape
    i, j = dims
    if max(i, j) >= p or min(i, j) < 0:
        raise InvalidInputError(f"--dims {i},{j}: the embedding has {p} coordinates (0 to {p - 1})")
    report = rundir.read_report()
    labels, label_name = (None, None)
    if color_by == "label":
        labels, label_name = _find_labels(report)
    elif color_by == "coordinate":
        k = next((c for c in range(p) if c not in (i, j)), None)
        label_name = f"coordinate {k}" if k is not None else None
    step = int(emb.chunks[0]) * max(1, 2**20 // int(emb.chunks[0]))

    def color_values(a, b, E):
        if labels is not None:
            return np.asarray(labels[a:b], dtype=np.float64)
        if label_name and label_name.startswith("coordinate"):
            return E[:, int(label_name.split()[1])]
        return None

    use_density = density == "always" or (density == "auto" and n >= DENSITY_THRESHOLD)
    fig, ax = plt.subplots(figsize=(7, 6), dpi=120)
    if not use_density:
        E = emb[...]
        c = color_values(0, n, E)
        sc = ax.scatter(E[:, i], E[:, j], c=c, s=max(0.5, 20000 / max(n, 1)),
                        cmap="viridis" if c is not None else None, linewidths=0, rasterized=True)
        if c is not None:
            fig.colorbar(sc, ax=ax, label=label_name)
    else:
        lo = np.full(2, np.inf)
        hi = np.full(2, -np.inf)
        for a, b in _blocks(emb, step):  # pass 1: the range
            E = emb[a:b]
            lo = np.minimum(lo, E[:, [i, j]].min(axis=0))
            hi = np.maximum(hi, E[:, [i, j]].max(axis=0))
        edges = [np.linspace(lo[k], hi[k] + 1e-12 * max(1.0, abs(hi[k])), bins + 1) for k in (0, 1)]
        counts = np.zeros((bins, bins))
        csum = np.zeros((bins, bins))
        for a, b in _blocks(emb, step):  # pass 2: counts and colour sums
            E = emb[a:b]
            h, _, _ = np.histogram2d(E[:, i], E[:, j], bins=edges)
            counts += h
            c = color_values(a, b, E)
            if c is not None:
                hc, _, _ = np.histogram2d(E[:, i], E[:, j], bins=edges, weights=c)
                csum += hc
        extent = (edges[0][0], edges[0][-1], edges[1][0], edges[1][-1])
        if label_name and csum.any():
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = csum / counts
            cmap = plt.get_cmap("viridis")
            finite = np.isfinite(mean)
            vmin, vmax = np.nanmin(mean[finite]), np.nanmax(mean[finite])
            rgba = cmap((mean - vmin) / max(vmax - vmin, 1e-300))
            alpha = np.log1p(counts) / max(np.log1p(counts).max(), 1e-300)
            rgba[..., 3] = np.where(counts > 0, 0.25 + 0.75 * alpha, 0.0)
            ax.imshow(np.transpose(rgba, (1, 0, 2)), origin="lower", extent=extent, aspect="auto",
                      interpolation="nearest")
            sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(vmin, vmax))
            fig.colorbar(sm, ax=ax, label=f"mean {label_name} per pixel")
        else:
            img = ax.imshow(np.log1p(counts).T, origin="lower", extent=extent, aspect="auto",
                            cmap="magma", interpolation="nearest")
            fig.colorbar(img, ax=ax, label="log(1 + rows per pixel)")
    ax.set_xlabel(f"coordinate {i}")
    ax.set_ylabel(f"coordinate {j}")
    ax.set_title(title or f"{Path(outdir).name}: {n:,} rows"
                 + (f", coloured by {label_name}" if label_name else ""))
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
    plt.close(fig)
    return {"rows": int(n), "density": bool(use_density), "color_by": label_name}
