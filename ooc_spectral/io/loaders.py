"""Image data sets of the papers, from local files only (nothing is ever downloaded).

- :func:`load_digits`: scikit-learn's bundled 8 x 8 handwritten digits (1797
  images, installed with scikit-learn, so always available offline). The
  stand-in for MNIST in the reproductions.
- :func:`load_mnist`: MNIST from files the user already has, in either of the
  two common layouts:

  * the original IDX files (``train-images-idx3-ubyte``,
    ``train-labels-idx1-ubyte``, optionally gzipped), given as the images
    file, the labels file, or the directory holding them;
  * an ``.npz`` archive with ``x_train``/``y_train`` (and ``x_test``/``y_test``),
    the layout of ``keras.datasets.mnist``, or ``images``/``labels``.

  As in Ouimet & Bengio (2005, section 5) it keeps the classes 0 and 1 by
  default and scales the 28 x 28 images down to 14 x 14 (2 x 2 block means).

Pixel values are returned as float64 in ``[0, 1]`` (the stored 0..255 or 0..16
divided by the maximum of the format).
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

from ..exceptions import InvalidInputError, InvalidParameterError, StoreNotFoundError

__all__ = ["load_digits", "load_mnist", "read_idx", "downscale"]

#: IDX element types: code -> numpy dtype (big-endian).
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IDX_NAMES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _check_classes(classes):
    if classes is None:
        return None
    try:
        out = [int(c) for c in classes]
    except (TypeError, ValueError):
        raise InvalidParameterError(
            f"classes={classes!r} is not valid: expected a sequence of integer labels or None"
        ) from None
    if not out:
        raise InvalidParameterError("classes=[] selects nothing; give at least one label or None")
    return out


def _select(X, y, classes):
    classes = _check_classes(classes)
    if classes is None:
        return X, y
    keep = np.isin(y, classes)
    if not keep.any():
        raise InvalidInputError(
            f"no image has a label in {classes}; the labels present are {sorted(set(y.tolist()))}"
        )
    return X[keep], y[keep]


def load_digits(classes=None) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8 x 8 digits (offline).

    Parameters
    ----------
    classes : sequence of int, optional
        Keep only these labels (default: all ten).

    Returns
    -------
    X : ndarray of shape (n, 64)
        Pixel values in ``[0, 1]`` (the stored 0..16 divided by 16).
    y : ndarray of shape (n,)
        Labels 0-9.
    """
    from sklearn.datasets import load_digits as _sk_load_digits

    d = _sk_load_digits()
    X = np.asarray(d.data, dtype=np.float64) / 16.0
    y = np.asarray(d.target, dtype=np.int64)
    return _select(X, y, classes)


def _open_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StoreNotFoundError(f"no such file: {path}") from None
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return raw


def read_idx(path) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzipped or not.

    The header is two zero bytes, a type code, the number of dimensions, then
    one big-endian 32-bit size per dimension; the data follow, big-endian.

    Raises
    ------
    StoreNotFoundError
        The file does not exist.
    InvalidInputError
        The file is not IDX, or its size disagrees with its header.
    """
    path = Path(path)
    raw = _open_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise InvalidInputError(
            f"{path} is not an IDX file (its first bytes are {raw[:4]!r}; an IDX file starts "
            "with two zero bytes, a type code and the number of dimensions)"
        )
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise InvalidInputError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise InvalidInputError(
            f"{path}: the header announces shape {shape} ({expected} bytes of data) but the "
            f"file holds {len(raw) - header}; the file is truncated or not IDX"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def downscale(images: np.ndarray, factor: int = 2) -> np.ndarray:
    """Scale images down by an integer ``factor`` (means of ``factor x factor`` blocks).

    Parameters
    ----------
    images : ndarray of shape (n, h, w)
        ``h`` and ``w`` multiples of ``factor``.

    Returns
    -------
    ndarray of shape (n, h // factor, w // factor), float64
    """
    images = np.asarray(images, dtype=np.float64)
    n, h, w = images.shape
    if h % factor or w % factor:
        raise InvalidInputError(
            f"cannot scale {h} x {w} images down by {factor}: the sides must be multiples of it"
        )
    return images.reshape(n, h // factor, factor, w // factor, factor).mean(axis=(2, 4))


def _find_idx(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (directory / name).exists():
            return directory / name
    raise StoreNotFoundError(
        f"no {stem} (or {stem}.gz) in {directory}; put the MNIST IDX files there or pass "
        "the images file and labels= explicitly"
    )


def _load_arrays(path: Path, labels, subset: str):
    if path.is_dir():
        img_name, lab_name = _IDX_NAMES[subset]
        return read_idx(_find_idx(path, img_name)), read_idx(_find_idx(path, lab_name))
    if not path.exists():
        raise StoreNotFoundError(
            f"no such file or directory: {path}; ooc_spectral never downloads MNIST: give the "
            "path of files you already have (IDX files or an .npz archive)"
        )
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            keys = set(z.files)
            for xk, yk in ((f"x_{subset}", f"y_{subset}"), ("images", "labels"), ("x", "y"), ("X", "y")):
                if xk in keys and yk in keys:
                    return np.asarray(z[xk]), np.asarray(z[yk])
        raise InvalidInputError(
            f"{path} holds the arrays {sorted(keys)}; expected x_{subset}/y_{subset} (the "
            "keras layout) or images/labels"
        )
    images = read_idx(path)
    if labels is None:
        guess = path.with_name(path.name.replace("images-idx3", "labels-idx1"))
        if guess == path or not guess.exists():
            raise InvalidParameterError(
                f"labels=None and no labels file next to {path}; pass labels=PATH of the "
                "labels-idx1-ubyte file"
            )
        labels = guess
    return images, read_idx(Path(labels))


def load_mnist(path, *, labels=None, subset: str = "train", classes=(0, 1), size: int = 14,
               limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """MNIST from local files, as the main paper uses it (classes 0 and 1, 14 x 14).

    Parameters
    ----------
    path : str or path
        An IDX images file (``*-images-idx3-ubyte[.gz]``), a directory holding
        the IDX files, or an ``.npz`` archive (``x_train``/``y_train``,
        ``x_test``/``y_test``, or ``images``/``labels``).
    labels : str or path, optional
        The IDX labels file, when ``path`` is an images file whose labels file
        is not beside it under the standard name.
    subset : {"train", "test"}, default="train"
        Which part of a directory or ``.npz`` archive.
    classes : sequence of int or None, default=(0, 1)
        Keep these labels (None: all).
    size : int, default=14
        Side of the returned images: the stored side divided by an integer
        factor (28 -> 14 by 2 x 2 block means, as in the paper).
    limit : int, optional
        Keep the first ``limit`` images (after the class selection).

    Returns
    -------
    X : ndarray of shape (n, size * size)
        Pixel values in ``[0, 1]``.
    y : ndarray of shape (n,)

    Raises
    ------
    StoreNotFoundError
        A file is missing; nothing is downloaded.
    InvalidInputError
        A file is not IDX / npz, or images and labels disagree.
    """
    if subset not in _IDX_NAMES:
        raise InvalidParameterError(f"subset={subset!r} is not valid: expected 'train' or 'test'")
    path = Path(os.fspath(path)).expanduser()
    images, y = _load_arrays(path, labels, subset)
    images = np.asarray(images)
    y = np.asarray(y).astype(np.int64).ravel()
    if images.ndim == 2:  # flattened square images
        side = int(round(np.sqrt(images.shape[1])))
        if side * side != images.shape[1]:
            raise InvalidInputError(
                f"images of {images.shape[1]} pixels are not square; expected 28 x 28 images"
            )
        images = images.reshape(-1, side, side)
    if images.ndim != 3 or images.shape[1] != images.shape[2]:
        raise InvalidInputError(f"expected square images (n, h, h), got shape {images.shape}")
    if images.shape[0] != y.shape[0]:
        raise InvalidInputError(
            f"{images.shape[0]} images but {y.shape[0]} labels; the files do not belong together"
        )
    side = images.shape[1]
    if not isinstance(size, int) or size < 1 or side % size:
        raise InvalidParameterError(
            f"size={size!r} is not valid: expected a divisor of the stored side {side} (e.g. 14)"
        )
    scale = 255.0 if np.issubdtype(images.dtype, np.integer) else max(float(images.max()), 1.0)
    keep = np.ones(len(y), dtype=bool)
    classes = _check_classes(classes)
    if classes is not None:
        keep = np.isin(y, classes)
        if not keep.any():
            raise InvalidInputError(
                f"no image has a label in {classes}; the labels present are {sorted(set(y.tolist()))}"
            )
    idx = np.flatnonzero(keep)
    if limit is not None:
        idx = idx[:int(limit)]
    small = downscale(images[idx], side // size) / scale
    return small.reshape(len(idx), size * size), y[idx]
