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

Where the code is: the data sets, their generators and the resolution of the
arguments in :mod:`ooc_spectral.io.dataset_specs`; the zarr layout, the group
attribute and :func:`open_dataset` in :mod:`ooc_spectral.io.dataset_store`; the
generation in order and the streaming writer here. Every name of ``__all__``
is importable from here.
"""

from __future__ import annotations

import os
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from .dataset_specs import (
    DATASETS,
    GENERATION_BLOCK_ROWS,
    PART_INTRINSIC,
    PART_NOISE,
    PART_PAD,
    Block,
    BlockFunction,
    DatasetPlan,
    DatasetSpec,
    LabelSpec,
    blob_centers,
    block_rng,
    check_representable,
    check_whole,
    halo_geometry,
    plan_dataset,
)
from .dataset_store import (FORMAT_VERSION, check_free_space, create_arrays, create_group,
                            dataset_meta, existing_meta, intact_dataset, open_dataset,
                            stored_bytes)
from .layout import DATASET_KEY
from .manifest import (ATTRS_DIGEST, MEMBERS_KEY, DigestingArrays, description_damaged,
                       seal_description)
from ..exceptions import InvalidParameterError
from .layout import DATA_ARRAY_NAME

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

#: Target size of one storage chunk of ``data`` (bytes) when ``chunk_rows`` is None.
CHUNK_BYTES_TARGET = 8 << 20
#: Target size (bytes, float64) of the rows generated and written in one step.
REGION_BYTES_TARGET = 16 << 20
#: Largest storage chunk of ``data`` (bytes) chosen by default: wide rows get fewer
#: rows per chunk (down to one) rather than a chunk of 4096 of them.
CHUNK_BYTES_MAX = 64 << 20
#: Largest float64 piece of a generation block (bytes): a block of wide rows is
#: generated a few rows at a time (down to one row), and fewer blocks run ahead.
PIECE_BYTES_MAX = 128 << 20
#: Largest row make-data generates (bytes, float64): a wider one is refused up front.
ROW_BYTES_MAX = 1 << 30


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

    Clipped to ``[4096, 2^20]`` rows and to ``n``, and to :data:`CHUNK_BYTES_MAX`
    (at least one row); for ``dim=32`` float32 this is ``2^16`` rows.
    """
    itemsize = np.dtype(dtype).itemsize
    rows = max(1, CHUNK_BYTES_TARGET // (max(1, dim) * itemsize))
    rows = 1 << (rows.bit_length() - 1)
    widest = max(1, CHUNK_BYTES_MAX // (max(1, dim) * itemsize))
    return int(max(1, min(n, widest, max(4096, min(rows, 1 << 20)))))


# ---------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------


def _piece_rows(plan: DatasetPlan) -> int:
    """Rows per generation piece: a whole block, or fewer rows of a wide data set."""
    return int(min(GENERATION_BLOCK_ROWS, max(1, PIECE_BYTES_MAX // (8 * plan.dim))))


def _block_pieces(plan: DatasetPlan, b: int, piece_rows: int
                  ) -> Iterator[tuple[int, int, np.ndarray, dict[str, np.ndarray]]]:
    """Generation block ``b`` in pieces of ``piece_rows`` rows, in order: ``(start, stop,
    X (float64, dim columns), labels)``. The padding and noise generators are drawn row
    after row, so the values do not depend on ``piece_rows``; memory is one piece."""
    start = b * GENERATION_BLOCK_ROWS
    stop = min(plan.n, start + GENERATION_BLOCK_ROWS)
    block = Block(start, stop, plan.n, plan.seed)
    name = plan.spec.name
    Xi, labels = plan.spec.block(block_rng(plan.seed, b, name, PART_INTRINSIC), block, plan.params)
    if plan.dim == plan.k and plan.noise == 0.0:
        yield start, stop, Xi, labels
        return
    pad_rng = block_rng(plan.seed, b, name, PART_PAD) if plan.dim > plan.k else None
    noise_rng = block_rng(plan.seed, b, name, PART_NOISE) if plan.noise > 0.0 else None
    for a in range(0, block.size, piece_rows):
        z = min(block.size, a + piece_rows)
        X = np.empty((z - a, plan.dim))
        X[:, :plan.k] = Xi[a:z]
        if pad_rng is not None:
            pad = pad_rng.standard_normal((z - a, plan.dim - plan.k))
            pad *= plan.params["pad_std"]
            X[:, plan.k:] = pad
            del pad
        if noise_rng is not None:
            eps = noise_rng.standard_normal((z - a, plan.dim))
            eps *= plan.noise
            X += eps
            del eps
        yield start + a, start + z, X, {key: v[a:z] for key, v in labels.items()}


def _generate_block(plan: DatasetPlan, b: int) -> tuple[int, int, np.ndarray,
                                                        dict[str, np.ndarray]]:
    """Generation block ``b`` whole: ``(start, stop, X (float64), labels)``."""
    return next(_block_pieces(plan, b, GENERATION_BLOCK_ROWS))


def _iter_blocks(plan: DatasetPlan, executor: Executor | None = None, lookahead: int = 0,
                 piece_rows: int = GENERATION_BLOCK_ROWS
                 ) -> Iterator[tuple[int, int, np.ndarray, dict[str, np.ndarray]]]:
    """Every generation block in order, as pieces ``(start, stop, X, labels)``; whole
    blocks with an executor, ``lookahead`` run ahead.

    numpy's generators and ufuncs release the GIL, so blocks generated on a thread
    pool run in parallel while the caller copies and writes earlier ones. Blocks cut
    into pieces (wide rows) are generated in order, one piece at a time.
    """
    if piece_rows < GENERATION_BLOCK_ROWS and plan.n > piece_rows:
        for b in range(plan.n_blocks):
            yield from _block_pieces(plan, b, piece_rows)
        return
    if executor is None or lookahead < 1:
        for b in range(plan.n_blocks):
            yield _generate_block(plan, b)
        return
    queue: deque[Future] = deque()
    nxt = 0
    try:
        for b in range(plan.n_blocks):
            while nxt < plan.n_blocks and len(queue) < lookahead:
                queue.append(executor.submit(_generate_block, plan, nxt))
                nxt += 1
            yield queue.popleft().result()
    finally:
        for fut in queue:
            fut.cancel()


def _iter_regions(plan: DatasetPlan, dtype: np.dtype, region_rows: int,
                  pieces: Iterator[tuple[int, int, np.ndarray, dict[str, np.ndarray]]]
                  ) -> Iterator[tuple[int, int, np.ndarray, dict[str, np.ndarray]]]:
    """Consecutive regions ``(start, stop, X in dtype, labels)`` of ``region_rows`` rows.

    Regions and generated pieces need not line up: a piece cut by a region boundary
    is kept for the next region.
    """
    current: tuple[int, int, np.ndarray, dict[str, np.ndarray]] | None = None
    for a in range(0, plan.n, region_rows):
        b = min(plan.n, a + region_rows)
        X = np.empty((b - a, plan.dim), dtype=dtype)
        labels = {lab.name: np.empty(b - a, dtype=lab.dtype) for lab in plan.spec.labels}
        pos = a
        while pos < b:
            while current is None or current[1] <= pos:
                current = next(pieces)
            p0, p1, Xp, Lp = current
            stop = min(b, p1)
            X[pos - a:stop - a] = Xp[pos - p0:stop - p0]
            for key, out in labels.items():
                out[pos - a:stop - a] = Lp[key][pos - p0:stop - p0]
            pos = stop
        yield a, b, X, labels


def _check_width(plan: DatasetPlan) -> None:
    """Refuse rows too wide to generate in bounded memory (a 10 x 5e7 data set allocated
    3.7 GiB at once and failed with exit 1, "transient", before: an outside audit)."""
    if 8 * plan.dim > ROW_BYTES_MAX:
        raise InvalidParameterError(
            f"dim = {plan.dim} makes one row {8 * plan.dim / 2**30:.3g} GiB while generated "
            f"(float64), more than make-data holds in memory at once "
            f"({ROW_BYTES_MAX / 2**30:.3g} GiB); expected at most {ROW_BYTES_MAX // 8} "
            "columns: pass a smaller --dim")
    rows = min(plan.n, GENERATION_BLOCK_ROWS)
    if 8 * plan.k * rows > ROW_BYTES_MAX and plan.spec.dim_param is not None:
        raise InvalidParameterError(
            f"{plan.spec.dim_param} = {plan.k} makes a generation block of {rows} rows "
            f"{8 * plan.k * rows / 2**30:.3g} GiB (float64), more than make-data holds in "
            f"memory at once ({ROW_BYTES_MAX / 2**30:.3g} GiB); expected at most "
            f"{ROW_BYTES_MAX // (8 * rows)}: pass a smaller {plan.spec.dim_param} (and pad "
            "with --dim)")


def _check_finite(X: np.ndarray, start: int, plan: DatasetPlan, where: str) -> None:
    """The last guard: a region with an infinite or NaN value is never written."""
    if not np.isfinite(X).all():
        row = start + int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])
        raise InvalidParameterError(
            f"row {row} of {plan.spec.name!r} is not finite in {X.dtype} (noise = "
            f"{plan.noise!r}, parameters {plan.params}): the values overflow; expected "
            f"finite values: pass smaller parameters, or dtype float64{where}")


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
    plan = plan_dataset(name, n, dim, noise, seed, params)
    dt = np.dtype(np.float64) if dtype is None else _check_dtype(dtype)
    check_representable(plan, dt)
    _, _, X, labels = next(_iter_regions(plan, dt, plan.n, _iter_blocks(plan)))
    _check_finite(X, 0, plan, "")
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
    is bounded by a few regions and blocks, whatever ``n``. Wide rows get fewer rows per
    chunk (:data:`CHUNK_BYTES_MAX`) and are generated a few rows at a time
    (:data:`PIECE_BYTES_MAX`), so memory stays bounded whatever ``dim``. The values
    depend only on ``(name, n, dim, noise, seed, params)`` and equal :func:`generate`'s
    (cast to ``dtype``).

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
        ``chunk_rows`` or ``dtype`` out of range; values that ``dtype`` cannot hold
        finitely; a row wider than :data:`ROW_BYTES_MAX`.
    OutputNotWritableError
        ``out`` already holds data and ``overwrite`` is False, or cannot be written.

    Notes
    -----
    The group attribute ``ooc_spectral_dataset`` is written first with
    ``"complete": false`` and rewritten with ``"complete": true`` only after the last
    row is stored, so an interrupted run never looks complete (:func:`open_dataset`
    refuses it).
    """
    plan = plan_dataset(name, n, dim, noise, seed, params)
    dt = _check_dtype(dtype)
    check_representable(plan, dt)
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(plan.n, plan.dim, dt)
    chunk_rows = check_whole("chunk_rows", chunk_rows, 1,
                             "pass a positive number of rows per storage chunk, or leave it unset")
    chunk_rows = min(chunk_rows, plan.n)
    if threads is None:
        threads = min(4, os.cpu_count() or 1)
    threads = check_whole("threads", threads, 1, "pass a positive number of threads, or "
                          "leave it unset")
    loc = os.fspath(out)
    if reuse and not overwrite:
        found = existing_meta(loc)
        if found is not None:
            edited = description_damaged(found)  # its recorded parameters cannot be trusted
            same = not edited and {k: v for k, v in found.items() if k not in (
                "complete", MEMBERS_KEY, ATTRS_DIGEST)} == dataset_meta(plan, chunk_rows, dt)
            if same and found.get("complete") and intact_dataset(loc, DATASET_KEY):
                return loc  # an identical, complete data set is already there, intact
            if same or edited:
                overwrite = True  # interrupted, or damaged since: write it again

    check_free_space(loc, plan, dt)
    _check_width(plan)
    meta = dict(dataset_meta(plan, chunk_rows, dt), complete=False)
    group = create_group(loc, overwrite, {DATASET_KEY: meta})  # the marker in the same write
    arrays = DigestingArrays(create_arrays(group, plan, chunk_rows, dt), uuid.uuid4().hex)

    # Regions: whole storage chunks (aligned writes), about REGION_BYTES_TARGET of
    # float64 rows each; the next region is assembled while the previous is written.
    # Generation: whole blocks, at most about 4 x PIECE_BYTES_MAX of them ahead, or (wide
    # rows) pieces of a block in order.
    region_rows = max(1, REGION_BYTES_TARGET // (8 * plan.dim * chunk_rows)) * chunk_rows
    piece_rows = _piece_rows(plan)
    lookahead = min(2 * threads, max(1, 4 * PIECE_BYTES_MAX //
                                     (8 * plan.dim * min(plan.n, GENERATION_BLOCK_ROWS))))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="make-data-write") as writer, \
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="make-data-gen") as gen:
        blocks = _iter_blocks(plan, gen if threads > 1 else None, lookahead, piece_rows)
        pending: tuple[Future, int] | None = None
        try:
            for a, b, X, labels in _iter_regions(plan, dt, region_rows, blocks):
                _check_finite(X, a, plan, f" (the output at {loc} is marked incomplete)")
                if pending is not None:
                    _finish(pending, plan.n, progress)
                fut = writer.submit(_write_region, arrays, a, b, {DATA_ARRAY_NAME: X, **labels})
                pending = (fut, b)
            if pending is not None:
                _finish(pending, plan.n, progress)
        finally:
            blocks.close()

    group.attrs[DATASET_KEY] = seal_description(dict(meta, complete=True,
                                                     members=arrays.entries()))
    return loc
