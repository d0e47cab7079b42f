"""Kernels evaluated block by block, always in float64.

Every pass of the pipeline needs one thing from a kernel: the block
``K[i, j] = k(X[i], Y[j])`` between a block of data rows and the dictionary, and
the diagonal ``k(x, x)``. The interface is three methods:

``aux(Y)``
    a per-row quantity that can be computed once and reused (squared norms for
    the Gaussian kernel, degree estimates for the normalized kernel), or None;
``pairwise(X, Y, x_aux=None, y_aux=None)``
    the ``len(X) x len(Y)`` block;
``diag(X, x_aux=None)``
    ``k(x, x)`` for every row.

Inputs of any real dtype are converted to float64 here, so float32, float16 and
integer data are computed in float64.

The Gaussian block is computed as ``exp(-gamma (|x|^2 + |y|^2 - 2 x.y))`` with
one matrix product of the rows augmented with their squared norms (BLAS), then
clipped (a distance is never negative) and exponentiated in place.

Kernels are plain frozen dataclasses; :mod:`ooc_spectral.core.kernel_choice` builds
them by name (:func:`~ooc_spectral.core.kernel_choice.make_kernel`) and turns them into
JSON-able attributes (plus named arrays) for persistence, never pickle.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import numpy as np

from .._accel.blas import exp_inplace, matmul_nt_into, one_task_at_a_time
from .._accel.fused import clip_unit_col_sums, clip_unit_dot
from ..exceptions import InvalidInputError, InvalidParameterError

__all__ = [
    "Kernel",
    "RBFKernel",
    "LaplacianKernel",
    "LinearKernel",
    "PolynomialKernel",
    "CosineKernel",
    "SubsetNormalizedKernel",
    "subset_means",
    "first_nonpositive",
]

def _f64(X) -> np.ndarray:
    # C order always: BLAS rounds differently on other layouts, and the same
    # rows must give the same bits whatever container they came in.
    return np.ascontiguousarray(X, dtype=np.float64)


class Kernel:
    """Interface of a positive semi-definite kernel evaluated on blocks of rows."""

    name: str = "kernel"
    #: True when :meth:`aux` returns an array worth caching.
    has_aux: bool = False

    def aux(self, X: np.ndarray) -> np.ndarray | None:  # pragma: no cover - interface
        """Per-row quantity reused across calls (or None)."""
        return None

    def pairwise(self, X, Y, x_aux=None, y_aux=None) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def pairwise_into(self, out, X, Y, x_aux=None, y_aux=None, col_sums=None) -> np.ndarray:
        """:meth:`pairwise` written into ``out`` (a C-ordered float64 array of its shape);
        kernels that can fill it in place do so without a block of their own. With
        ``col_sums`` (float64, one per column of ``out``), also the block's column sums
        ``1' out``, written there (kernels computed in pieces add each piece's while it
        is in the cache)."""
        out[...] = self.pairwise(X, Y, x_aux, y_aux)
        if col_sums is not None:
            np.matmul(np.ones(out.shape[0]), out, out=col_sums)
        return out

    def diag(self, X, x_aux=None) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def pairwise_dot(self, X, Y, G, x_aux=None, y_aux=None) -> np.ndarray:
        """``k(X, Y) @ G`` (c x p) for a small ``G`` (m x p), in pieces of about
        :data:`PIECE_ELEMENTS` kernel entries: the c x m block is never held whole,
        and each piece is consumed while it is in the core's cache."""
        X, Y = _f64(X), _f64(Y)
        if x_aux is None and self.has_aux:
            x_aux = self.aux(X)  # once, so that its errors name rows of the whole block
        if x_aux is not None and not (isinstance(x_aux, np.ndarray) and len(x_aux) == len(X)):
            return self.pairwise(X, Y, x_aux, y_aux) @ G
        out = np.empty((X.shape[0], G.shape[1]))
        for a, b in _pieces(X.shape[0], Y.shape[0]):
            xa = None if x_aux is None else x_aux[a:b]
            np.matmul(self.pairwise(X[a:b], Y, xa, y_aux), G, out=out[a:b])
        return out

    def pairwise_monotone(self, X, Y, x_aux=None, y_aux=None, out=None) -> np.ndarray:
        """A block ``S`` with ``pairwise = monotone_to_kernel(S)``, increasing elementwise.

        Ordered like the kernel block but cheaper when the kernel is an increasing
        function of something simpler (the Gaussian's exponent): the scan's local
        certificate finds each row's most similar dictionary point on ``S`` and
        maps only a few entries. By default ``S`` is the kernel block itself.
        ``out``, a C-ordered float64 array of the block's shape, receives it.
        """
        K = self.pairwise(X, Y, x_aux, y_aux)
        if out is None:
            return K
        out[...] = K
        return out

    def monotone_to_kernel(self, S: np.ndarray) -> np.ndarray:
        """Kernel values from entries of :meth:`pairwise_monotone` (in place when possible)."""
        return S

    def without_center(self) -> "Kernel":
        """The kernel on unmoved rows (for another space's coordinates, as the pre-image
        map's); itself for kernels without a centre (:class:`_Centred`)."""
        return self

    def __call__(self, X, Y=None) -> np.ndarray:
        """Full kernel matrix ``k(X, Y)`` (``Y=X`` when omitted); for small inputs."""
        X = _f64(X)
        Y = X if Y is None else _f64(Y)
        return self.pairwise(X, Y, self.aux(X), self.aux(Y))

    @property
    def params(self) -> dict:
        """The JSON-able parameters of the kernel."""
        return {}


#: Entries of a kernel block computed at a time (1 MiB of float64): the piece's
#: product, clip and exponentials then stay in a core's 2 MiB L2 cache instead of
#: streaming a block of tens of MB through memory three times. Each piece costs some
#: NumPy calls under the GIL, which two task threads of one process (the threads
#: engine) contend for: fewer, larger pieces, as long as they stay in the L2 cache
#: (docs/measurements.md, "Kernel pieces").
PIECE_ELEMENTS = 2**17


#: Fewest rows of a piece of :meth:`Kernel.pairwise_into` (and so of
#: :meth:`Kernel.pairwise`): each piece is one product, and a product of a few rows
#: runs far below the gemm rate. Pass 2 writes ``k(D, X)``, m rows by thousands of
#: columns, where pieces of PIECE_ELEMENTS entries had 16 rows (docs/measurements.md,
#: "Kernel pieces").
PIECE_MIN_ROWS = 64


def _pieces(rows: int, cols: int, min_rows: int = 16):
    """``(a, b)`` row ranges of a ``rows x cols`` block: as many as pieces of
    ``max(min_rows, PIECE_ELEMENTS // cols)`` rows would make, of equal sizes (within
    one row), so that no piece is a small remainder."""
    rows = int(rows)
    if rows <= 0:
        return []
    step = max(int(min_rows), PIECE_ELEMENTS // max(int(cols), 1))
    count = -(-rows // step)
    bounds = [rows * i // count for i in range(count + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _sq_norms(X: np.ndarray) -> np.ndarray:
    """Squared row norms; finite values whose squares overflow float64 are a named error."""
    with np.errstate(over="ignore"):
        out = np.einsum("ij,ij->i", X, X)
    if not np.isfinite(out).all() and (err := overflow_error(X, out=out)) is not None:
        raise err
    return out


def overflow_error(X: np.ndarray, rows=None, out=None) -> InvalidInputError | None:
    """The error naming the first row of ``X`` whose finite values have a squared norm past
    float64, or None: by its number in the data set where ``rows`` gives them (the scan's
    rows come in a seeded order), else by its place in this block."""
    if out is None:
        with np.errstate(over="ignore"):
            out = np.einsum("ij,ij->i", X, X)
    bad = np.flatnonzero(~np.isfinite(out))
    finite = np.isfinite(X[bad]).all(axis=1)
    if not finite.any():
        return None
    i = int(bad[np.argmax(finite)])
    big = float(np.abs(X[i]).max())
    name = f"row {int(rows[i])}" if rows is not None else f"row {i} (of this block)"
    return InvalidInputError(
        f"{name} has finite values up to {big:.3g} whose squared norm overflows float64 "
        "(above 1.8e308), so no kernel value can be computed; scale the data first, e.g. "
        f"divide every column by {10.0 ** np.floor(np.log10(big)):.0e}")


class _Stationary(Kernel):
    """A kernel ``exp(-gamma * distance)``: unit diagonal, one parameter.

    Subclasses give the exponent (:meth:`pairwise_monotone`) and its map to
    kernel values (:meth:`monotone_to_kernel`); the block is the two composed.
    """

    gamma: float

    def _exponent_of_rows(self, X, Y, x_aux, y_aux):
        """A function ``(a, b, out)`` writing the exponent of rows ``a:b`` of X into
        ``out``; subclasses prepare what every piece shares once (RBF: the augmented rows)."""
        def fill(a, b, out):
            xa = None if x_aux is None else x_aux[a:b]
            return self.pairwise_monotone(X[a:b], Y, xa, y_aux, out=out)
        return fill

    def pairwise(self, X, Y, x_aux=None, y_aux=None):
        """The kernel block, :data:`PIECE_ELEMENTS` entries (at least
        :data:`PIECE_MIN_ROWS` rows) at a time: each piece's exponent and
        exponentials are computed while it is in the core's cache."""
        X, Y = _f64(X), _f64(Y)
        return self.pairwise_into(np.empty((X.shape[0], Y.shape[0])), X, Y, x_aux, y_aux)

    def pairwise_into(self, out, X, Y, x_aux=None, y_aux=None, col_sums=None):
        X, Y = _f64(X), _f64(Y)
        fill = self._exponent_of_rows(X, Y, x_aux, y_aux)
        pieces = _pieces(X.shape[0], Y.shape[0], PIECE_MIN_ROWS)
        if col_sums is not None:
            col_sums[...] = 0.0
        for a, b in pieces:
            if col_sums is None:
                self.monotone_to_kernel(fill(a, b, out[a:b]))
            else:
                self.kernel_adding_col_sums(fill(a, b, out[a:b]), col_sums)
        return out

    def kernel_adding_col_sums(self, S, col_sums):
        """``monotone_to_kernel(S)`` (in place), its column sums added to ``col_sums``:
        one piece of :meth:`pairwise_into`."""
        S = self.monotone_to_kernel(S)
        col_sums += np.ones(S.shape[0]) @ S
        return S

    def pairwise_dot(self, X, Y, G, x_aux=None, y_aux=None):
        """``k(X, Y) @ G`` in pieces (see :meth:`Kernel.pairwise_dot`), one piece
        buffer reused."""
        X, Y = _f64(X), _f64(Y)
        fill = self._exponent_of_rows(X, Y, x_aux, y_aux)
        out = np.empty((X.shape[0], G.shape[1]))
        pieces = _pieces(X.shape[0], Y.shape[0])
        buf = np.empty((max(b - a for a, b in pieces), Y.shape[0])) if pieces else None
        G = np.asfortranarray(G, dtype=np.float64)
        for a, b in pieces:
            self.kernel_dot(fill(a, b, buf[:b - a]), G, out[a:b])
        return out

    def kernel_dot(self, S, G, out):
        """``monotone_to_kernel(S) @ G`` into ``out`` (S overwritten): one piece of
        :meth:`pairwise_dot`."""
        return np.matmul(self.monotone_to_kernel(S), G, out=out)

    def diag(self, X, x_aux=None):
        return np.ones(np.shape(X)[0])

    @property
    def params(self):
        return {"gamma": float(self.gamma)}


class _Centred:
    """A kernel that moves every row by a fixed centre before evaluating it.

    Where a kernel depends only on ``x - y`` (rbf), or its kernel PCA does (linear and
    degree-1 polynomial kernels: a translation leaves the centred Gram matrix as it
    is), the exact values are the same with or without the centre; the rounding is not.
    ``|x|^2 + |y|^2 - 2 x.y`` (or ``x.y``) loses about ``eps |x|^2`` to cancellation,
    a relative error of ``eps R^2 / s^2`` for rows at distance R from the origin with a
    spread s. Moved by a centre inside the data (the mean of a seeded sample,
    :func:`~ooc_spectral.core.kernel_choice.data_center`), R is the data's own extent
    whatever their offset. The centre is part of the kernel: saved with the model and
    applied to every row it sees. A tuple of floats (kernels compare as values); None
    keeps the rows as they are (models saved before the centre existed).
    """

    center: tuple | None

    @functools.cached_property
    def _center(self) -> np.ndarray | None:
        return None if self.center is None else np.asarray(self.center, dtype=np.float64)

    def _moved(self, X: np.ndarray) -> np.ndarray:
        """The rows minus the centre (a new array), or the rows themselves."""
        return X if self._center is None else X - self._center

    def without_center(self) -> "Kernel":
        return self if self.center is None else dataclasses.replace(self, center=None)


@dataclass(frozen=True)
class RBFKernel(_Centred, _Stationary):
    """Gaussian kernel ``k(x, y) = exp(-gamma * ||x - y||^2)``, on rows moved by
    ``center`` (:class:`_Centred`); ``aux`` is their squared norms."""

    gamma: float
    center: tuple | None = field(default=None, repr=False)
    name = "rbf"
    has_aux = True

    def aux(self, X):
        return _sq_norms(self._moved(_f64(X)))

    def monotone_to_kernel(self, S):
        np.minimum(S, 0.0, out=S)  # a distance is never negative
        return exp_inplace(S)

    def kernel_adding_col_sums(self, S, col_sums):
        """The exponentials first, then the clip at 1 and the column sums in one pass
        (:func:`~ooc_spectral._accel.fused.clip_unit_col_sums`): the same values as
        :meth:`monotone_to_kernel`'s clip of the exponent at 0."""
        return clip_unit_col_sums(exp_inplace(S), col_sums)

    def kernel_dot(self, S, G, out):
        """The exponentials, then the clip at 1 and the product with G in one pass
        (:func:`~ooc_spectral._accel.fused.clip_unit_dot`)."""
        return clip_unit_dot(exp_inplace(S), G, out)

    def pairwise_monotone(self, X, Y, x_aux=None, y_aux=None, out=None):
        """The exponent ``-gamma ||x - y||^2`` (before the clip at 0)."""
        A, B = self._augmented(_f64(X), _f64(Y), x_aux, y_aux)
        return np.matmul(A, B.T, out=out)

    def _augmented(self, X, Y, x_aux=None, y_aux=None):
        """The exponent -gamma (|x|^2 + |y|^2 - 2 x.y) of the moved rows is ``A B'``: the
        rows augmented with their squared norms, ``[x, |x|^2, 1] . [2g y, -g, -g |y|^2]``.
        One BLAS call; monotone_to_kernel then clips at 0 and exponentiates in place."""
        xx = self.aux(X) if x_aux is None else x_aux
        yy = self.aux(Y) if y_aux is None else y_aux
        g, c = self.gamma, self._center
        d = X.shape[1]
        A = np.empty((X.shape[0], d + 2))
        if c is None:
            A[:, :d] = X
        else:
            np.subtract(X, c, out=A[:, :d])
        A[:, d] = xx
        A[:, d + 1] = 1.0
        B = np.empty((Y.shape[0], d + 2))
        if c is None:
            np.multiply(Y, 2.0 * g, out=B[:, :d])
        else:
            np.subtract(Y, c, out=B[:, :d])
            B[:, :d] *= 2.0 * g
        B[:, d] = -g
        B[:, d + 1] = -g * yy
        return A, B

    def _exponent_of_rows(self, X, Y, x_aux, y_aux):
        """The augmented rows built once; each piece is one product of them."""
        A, B = self._augmented(X, Y, x_aux, y_aux)
        on_mkl = one_task_at_a_time()  # decided once per block (see matmul_nt_into)
        return lambda a, b, out: matmul_nt_into(A[a:b], B, out, on_mkl)


@dataclass(frozen=True)
class LaplacianKernel(_Stationary):
    """Laplacian kernel ``k(x, y) = exp(-gamma * ||x - y||_1)``."""

    gamma: float
    name = "laplacian"

    def aux(self, X):
        return None

    def pairwise_monotone(self, X, Y, x_aux=None, y_aux=None, out=None):
        """The exponent ``-gamma ||x - y||_1``."""
        from scipy.spatial.distance import cdist

        K = cdist(_f64(X), _f64(Y), metric="cityblock", out=out)
        K *= -self.gamma
        return K

    def monotone_to_kernel(self, S):
        return exp_inplace(S)


@dataclass(frozen=True)
class LinearKernel(_Centred, Kernel):
    """Linear kernel ``k(x, y) = x . y``, on rows moved by ``center`` if given (its
    kernel PCA is PCA either way; :class:`_Centred`)."""

    center: tuple | None = field(default=None, repr=False)
    name = "linear"

    def aux(self, X):
        return None

    def pairwise(self, X, Y, x_aux=None, y_aux=None):
        return self._moved(_f64(X)) @ self._moved(_f64(Y)).T

    def diag(self, X, x_aux=None):
        return _sq_norms(self._moved(_f64(X)))


@dataclass(frozen=True)
class PolynomialKernel(_Centred, Kernel):
    """Polynomial kernel ``k(x, y) = (gamma * x . y + coef0) ** degree``; ``center``
    (degree 1 only, where kernel PCA does not depend on a translation) moves the rows."""

    gamma: float
    degree: int = 3
    coef0: float = 1.0
    center: tuple | None = field(default=None, repr=False)
    name = "polynomial"

    def __post_init__(self):
        if self.center is not None and int(self.degree) != 1:
            raise ValueError(f"a centre changes the degree-{self.degree} polynomial kernel's "
                             "kernel PCA; it is only allowed for degree 1")

    def aux(self, X):
        return None

    def pairwise(self, X, Y, x_aux=None, y_aux=None):
        K = self._moved(_f64(X)) @ self._moved(_f64(Y)).T
        K *= self.gamma
        K += self.coef0
        return np.power(K, self.degree, out=K)

    def diag(self, X, x_aux=None):
        return (self.gamma * _sq_norms(self._moved(_f64(X))) + self.coef0) ** self.degree

    @property
    def params(self):
        return {"gamma": float(self.gamma), "degree": int(self.degree), "coef0": float(self.coef0)}


@dataclass(frozen=True)
class CosineKernel(Kernel):
    """Cosine kernel ``k(x, y) = x . y / (||x|| ||y||)`` (scikit-learn's ``cosine``).

    A row of zeros has ``k(0, y) = 0`` for every y, its diagonal included, as
    scikit-learn's ``cosine_similarity`` (which normalizes rows and leaves zero
    rows as they are). ``aux`` is the row norms.

    The values do not depend on a row's scale, and neither does their arithmetic: rows
    whose norms are far from 1 (below ``2**-450`` or above ``2**450``, where products of
    two rows could under- or overflow) are first scaled by the power of two that brings
    their largest entry into ``[1/2, 1)`` (exact), so rows at ``1e-165`` or ``1e300``,
    whose squared norms under- or overflow float64, have their cosines like any others
    (:meth:`_scaled`). Other rows take the plain products, at no extra cost.
    """

    name = "cosine"
    has_aux = True

    #: Norms between these are multiplied as they are (their products stay normal).
    SAFE_NORMS = (2.0 ** -450, 2.0 ** 450)

    @staticmethod
    def _scaled(X):
        """``(Xs, ns, e)``: X's rows scaled exactly by ``2**-e`` to a largest entry in
        ``[1/2, 1)``, and their norms (in ``[1/2, sqrt(n_features)]``, 0 for a row of zeros)."""
        _, e = np.frexp(np.max(np.abs(X), axis=1, initial=0.0))
        Xs = np.ldexp(X, -e[:, None])
        return Xs, np.sqrt(np.einsum("ij,ij->i", Xs, Xs)), e

    @classmethod
    def _safe(cls, norms) -> bool:
        lo, hi = cls.SAFE_NORMS
        return bool(np.all((norms == 0) | ((norms > lo) & (norms < hi))))

    def aux(self, X):
        X = _f64(X)
        with np.errstate(over="ignore", under="ignore"):
            norms = np.sqrt(np.einsum("ij,ij->i", X, X))
        lo, hi = self.SAFE_NORMS
        odd = ~((norms > lo) & (norms < hi))  # zero, under- or overflowed, or near it
        if odd.any():
            _, ns, e = self._scaled(X[odd])
            with np.errstate(over="ignore"):
                norms[odd] = np.ldexp(ns, e)  # > 0 for every nonzero row, inf past 1.8e308
        return norms

    @staticmethod
    def _inverse_norms(norms):
        inv = np.zeros_like(norms)
        np.divide(1.0, norms, out=inv, where=norms > 0)
        return inv

    def pairwise(self, X, Y, x_aux=None, y_aux=None):
        X, Y = _f64(X), _f64(Y)
        nx = self.aux(X) if x_aux is None else np.asarray(x_aux, dtype=np.float64)
        ny = self.aux(Y) if y_aux is None else np.asarray(y_aux, dtype=np.float64)
        if not (self._safe(nx) and self._safe(ny)):
            # rows whose products could under- or overflow: scaled exactly first
            (X, nx, _), (Y, ny, _) = self._scaled(X), self._scaled(Y)
        K = X @ Y.T
        K *= self._inverse_norms(nx)[:, None]
        K *= self._inverse_norms(ny)[None, :]
        return K

    def diag(self, X, x_aux=None):
        nx = self.aux(X) if x_aux is None else x_aux
        return (np.asarray(nx) > 0).astype(np.float64)


@dataclass(frozen=True, eq=False)
class SubsetNormalizedKernel(Kernel):
    """Divisively normalized kernel with degrees estimated on a subset (paper eq. 4).

    ``k~(x, y) = k(x, y) / sqrt(deg(x) deg(y))`` with
    ``deg(x) = mean_{s in subset} k(x, s)``. This is the paper's "normalization
    before the scan": the dictionary scan, the projections and the out-of-sample
    extension all use ``k~``. Because the degree is a mean, not a sum, the Gram
    matrix of ``k~`` over n points is ``n`` times ``D^-1/2 K D^-1/2``.

    ``aux(X)`` is the pair (base aux, degrees) packed in a 2-column array.
    """

    base: Kernel
    subset: np.ndarray
    name = "subset-normalized"
    has_aux = True

    def degrees(self, X, base_aux=None) -> np.ndarray:
        return subset_means(self.base, self.subset, X, base_aux)

    def aux(self, X):
        X = _f64(X)
        base_aux = self.base.aux(X)
        deg = self.degrees(X, base_aux)
        if (row := first_nonpositive(deg)) is not None:
            raise InvalidParameterError(
                f"the subset degree estimate of a row is {deg[row]:.3g} (not positive), "
                "so the divisive normalization is undefined; use a kernel with positive "
                "values (rbf or laplacian), a larger degree_subset_size, or "
                "degree_estimate='exact'"
            )
        col0 = np.zeros(X.shape[0]) if base_aux is None else base_aux
        return np.column_stack([col0, deg])

    def _split(self, X, aux):
        if aux is None:
            aux = self.aux(X)
        base_aux = aux[:, 0] if self.base.has_aux else None
        return base_aux, aux[:, 1]

    def pairwise(self, X, Y, x_aux=None, y_aux=None):
        X, Y = _f64(X), _f64(Y)
        xb, xd = self._split(X, x_aux)
        yb, yd = self._split(Y, y_aux)
        K = self.base.pairwise(X, Y, xb, yb)
        K /= np.sqrt(xd)[:, None]
        K /= np.sqrt(yd)[None, :]
        return K

    def diag(self, X, x_aux=None):
        X = _f64(X)
        xb, xd = self._split(X, x_aux)
        return self.base.diag(X, xb) / xd

    @property
    def params(self):
        return {"base": self.base.name, **self.base.params, "subset_size": int(self.subset.shape[0])}


def first_nonpositive(degrees: np.ndarray) -> int | None:
    """Index of the first degree that is not positive (the divisive normalization's
    ``D^-1/2`` is undefined there), or None; callers raise their own named error."""
    bad = np.flatnonzero(degrees <= 0)
    return int(bad[0]) if bad.size else None


def subset_means(base: Kernel, subset: np.ndarray, X, base_aux=None, step: int = 4096) -> np.ndarray:
    """``mean_{s in subset} k(x, s)`` for each row of X, ``step`` rows at a time."""
    X = _f64(X)
    out = np.empty(X.shape[0])
    s_aux = base.aux(subset)
    for a in range(0, X.shape[0], step):  # bounded temporaries: step x len(subset)
        b = min(a + step, X.shape[0])
        xa = None if base_aux is None else base_aux[a:b]
        out[a:b] = base.pairwise(X[a:b], subset, xa, s_aux).mean(axis=1)
    return out
