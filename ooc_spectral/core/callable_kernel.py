"""A user's kernel function as a :class:`~ooc_spectral.core.kernels.Kernel`.

scikit-learn calls a kernel callable on one pair of rows at a time
(``KernelPCA(kernel=func)``); ``sklearn.metrics.pairwise`` and dask-ml write kernels
that take two blocks of rows and return their matrix. :class:`CallableKernel` takes
both and tells them apart on the first block it sees (issue 38).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..exceptions import InvalidParameterError
from .kernels import Kernel, _f64

__all__ = ["CallableKernel"]


@dataclass(frozen=True, eq=False)
class CallableKernel(Kernel):
    """A user's kernel ``func(x, y, **params)``: on two rows, or on two blocks of rows.

    Two kinds of callables are taken, and told apart on the first block
    (:meth:`_probe`):

    - *per pair*, as scikit-learn's ``KernelPCA(kernel=callable)``: ``func`` gets two
      rows (1-D arrays) and returns a number; a block of c x m entries costs c m
      Python calls, so a built-in kernel is much faster;
    - *matrix-wise*, as ``sklearn.metrics.pairwise.rbf_kernel`` and the kernels
      dask-ml passes around: ``func`` gets two blocks (c x d and m x d) and returns
      their c x m matrix, one call per block.

    The probe calls ``func`` on the first two rows of X and three of Y: it is
    matrix-wise when that returns a 2 x 3 array equal (to rounding) to the six
    per-pair values, or when the per-pair calls fail; otherwise per pair (a
    function such as ``np.dot`` that gives another matrix on blocks is per pair).
    ``func`` must be a positive semi-definite kernel. It travels to dask workers
    with the dictionary (cloudpickle, as every dask task does), each process
    probing once, but is never saved: a model with a callable kernel cannot be
    written without pickle (:func:`kernel_to_attrs` raises
    :class:`~ooc_spectral.exceptions.ModelNotSavableError`).
    """

    func: object
    kernel_params: tuple = ()
    name = "callable"

    #: rows per call of :meth:`diag` for a matrix-wise function (it computes a
    #: square block and keeps its diagonal)
    DIAG_BLOCK = 32

    @property
    def _kw(self) -> dict:
        return dict(self.kernel_params)

    def aux(self, X):
        return None

    @property
    def matrix_wise(self) -> bool | None:
        """True for a matrix-wise function, False per pair, None before the first block."""
        return self.__dict__.get("_matrix")

    def _probe(self, X, Y) -> bool:
        found = self.__dict__.get("_matrix")
        if found is not None:
            return found
        f, kw = self.func, self._kw
        A, B = X[:2], Y[:3]
        try:
            pairs = np.array([[float(f(x, y, **kw)) for y in B] for x in A])
        except Exception:
            pairs = None
        try:
            block = np.asarray(f(A, B, **kw), dtype=np.float64)
            ok = block.shape == (A.shape[0], B.shape[0])
        except Exception:
            block, ok = None, False
        if pairs is None and not ok:
            # neither form works: call it per pair, as scikit-learn does, so that the
            # function's own error reaches the user
            found = False
        elif pairs is None:
            found = True
        else:
            found = bool(ok and np.allclose(block, pairs, rtol=1e-10, atol=1e-12))
        object.__setattr__(self, "_matrix", found)  # frozen: a cache, not a field
        return found

    def pairwise(self, X, Y, x_aux=None, y_aux=None):
        X, Y = _f64(X), _f64(Y)
        f, kw = self.func, self._kw
        if X.shape[0] and Y.shape[0] and self._probe(X, Y):
            K = np.asarray(f(X, Y, **kw), dtype=np.float64)
            if K.shape != (X.shape[0], Y.shape[0]):
                raise InvalidParameterError(
                    f"the kernel function {self.params['function']} returned an array of shape "
                    f"{K.shape} for blocks of {X.shape[0]} and {Y.shape[0]} rows; a matrix-wise "
                    "kernel must return the (len(X), len(Y)) matrix")
            return np.array(K, dtype=np.float64, order="C")  # a copy the caller may write
        out = np.empty((X.shape[0], Y.shape[0]))
        for i in range(X.shape[0]):
            x = X[i]
            out[i] = [f(x, y, **kw) for y in Y]
        return out

    def diag(self, X, x_aux=None):
        X = _f64(X)
        f, kw = self.func, self._kw
        if X.shape[0] and self._probe(X, X):
            step = self.DIAG_BLOCK
            out = np.empty(X.shape[0])
            for a in range(0, X.shape[0], step):
                P = X[a:a + step]
                out[a:a + len(P)] = np.diagonal(np.asarray(f(P, P, **kw), dtype=np.float64))
            return out
        return np.array([f(x, x, **kw) for x in X], dtype=np.float64)

    @property
    def params(self):
        return {"function": getattr(self.func, "__qualname__", repr(self.func)), **self._kw}
