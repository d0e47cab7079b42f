"""Pieces shared by the estimators of :mod:`ooc_spectral.manifold`.

Each fitted estimator holds a *map*: a small frozen object with
``n_components`` and ``embed(X) -> (rows, n_components)``, the estimator's
out-of-sample formula on one block of rows. :func:`apply_rows` applies a map
to every row of an input block by block (numpy in, numpy out; dask, zarr or a
path in, a lazy dask array out). The in-memory estimators read their training
rows with :func:`read_in_memory` and solve their eigenproblems with
:func:`top_positive` (after :func:`double_centre` for classical scaling).
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import eigsh
from sklearn.base import TransformerMixin

from ._sklearn import FeatureNamesMixin
from .._validation import check_choice, check_fitted, check_int, check_n_features
from ..core.eigensolve import fix_signs, top_eigenpairs
from ..core.model import PIVOT_FLOOR
from ..exceptions import InvalidInputError, InvalidParameterError
from ..core.planning import whole_chunks
from ..io.source import DataSource, open_source
from ..pipeline.writeback import map_rows

__all__ = ["TASK_MEMORY", "DENSE_EIGEN_MAX_ROWS", "EIGEN_SOLVERS", "apply_rows", "read_in_memory",
           "check_sizes", "check_in_memory_params", "fix_signs", "top_positive", "double_centre",
           "check_connected", "Fitted"]

#: Bytes one task of a blockwise ``transform`` may use for its temporaries.
TASK_MEMORY = 256 * 2**20
#: ``eigen_solver="auto"`` uses the dense solver up to this many rows.
DENSE_EIGEN_MAX_ROWS = 3000
#: The ``eigen_solver`` choices of the in-memory estimators.
EIGEN_SOLVERS = ("auto", "dense", "arpack")


def _task_rows(source: DataSource, per_row_bytes: int, requested: int | None) -> int:
    """Rows per task: a whole number of storage chunks, within :data:`TASK_MEMORY`."""
    rows = int(requested) if requested is not None else max(1, TASK_MEMORY // max(per_row_bytes, 1))
    return whole_chunks(rows, source.storage_chunk_rows, source.n_rows)


def apply_rows(owner: str, emap, X, n_features: int, per_row_bytes: int,
               chunk_rows: int | None):
    """``emap.embed`` over the rows of X, block by block.

    numpy input: computed here, a numpy array. dask, zarr or a path: a lazy
    dask array with one task per block, ``emap`` a single key of the graph.
    """
    source = open_source(X)
    check_n_features(owner, source.n_features, n_features)
    rows = _task_rows(source, per_row_bytes, chunk_rows)
    if source.kind == "numpy":
        parts = [emap.embed(source.read_rows(a, min(a + rows, source.n_rows)))
                 for a in range(0, source.n_rows, rows)]
        return np.concatenate(parts, axis=0)
    return map_rows(source.to_dask(rows), emap, chunk_starts=source.chunk_starts,
                    name=f"ooc-spectral-{owner.lower()}")


def read_in_memory(owner: str, X, max_samples: int,
                   what: str = "an n x n matrix") -> np.ndarray:
    """All rows of X as float64 (checked finite), refusing more than ``max_samples``."""
    source = open_source(X)
    n = source.n_rows
    if n > max_samples:
        raise InvalidInputError(
            f"{owner} holds {what} in memory and X has {n} rows, above "
            f"max_samples={max_samples} (one dense n x n float64 matrix would take about "
            f"{8 * n * n / 2**30:.1f} GiB); fit on a sample, raise max_samples if the memory "
            "is there, or "
            "use an out-of-core method: LandmarkIsomap, MetricMDS(metric='euclidean'), "
            "LaplacianEigenmaps or DiffusionMap")
    return source.read_rows(0, n)


def check_sizes(estimator, neighbors: bool = True) -> tuple[str, int, int | None]:
    """The estimator's class name, ``n_components`` and ``n_neighbors`` (None when not
    ``neighbors``), each checked at least 1."""
    name = type(estimator).__name__
    p = check_int(name, "n_components", estimator.n_components, low=1)
    k = check_int(name, "n_neighbors", estimator.n_neighbors, low=1) if neighbors else None
    return name, p, k


def check_in_memory_params(estimator) -> tuple[str, int]:
    """``(eigen_solver, max_samples)`` of an in-memory estimator, checked with ``chunk_rows``."""
    name = type(estimator).__name__
    solver = check_choice(name, "eigen_solver", estimator.eigen_solver, EIGEN_SOLVERS)
    max_samples = check_int(name, "max_samples", estimator.max_samples, low=2)
    check_int(name, "chunk_rows", estimator.chunk_rows, low=1, none=True)
    return solver, max_samples


def top_positive(owner: str, B: np.ndarray, p: int, solver: str, seed: int):
    """The p largest eigenpairs of the symmetric B, checked positive."""
    n = B.shape[0]
    if p >= n:
        raise InvalidParameterError(
            f"{owner}: n_components={p} must be below the number of training rows ({n})")
    if solver == "auto":
        solver = "dense" if n <= DENSE_EIGEN_MAX_ROWS else "arpack"
    if solver == "dense":
        vals, V = top_eigenpairs(B, p)
    else:
        v0 = np.random.default_rng(seed).uniform(-1.0, 1.0, n)
        vals, V = eigsh(B, k=p, which="LA", v0=v0)
        order = np.argsort(vals)[::-1]
        vals, V = vals[order], fix_signs(V[:, order])
    floor = rounding_level(B)
    kept = int(np.sum(vals > floor))
    if kept < p:
        spans = (f"the data span {kept} direction{'s' if kept != 1 else ''} in this embedding; "
                 f"lower n_components to {kept}" if kept else
                 "the data span no direction in this embedding (every row is at the same place)")
        raise InvalidParameterError(
            f"{owner}: only {kept} of the {p} leading eigenvalues of the double-centred matrix "
            f"are above its rounding level {floor:.2g} (they are "
            f"{np.array2string(vals, precision=3)}): components beyond would be rounding noise, "
            f"or directions of negative eigenvalues; {spans}")
    return vals, V


def rounding_level(B: np.ndarray) -> float:
    """The eigenvalues of the double-centred ``B`` (n x n) that float64 cannot tell from 0.

    The entries of ``B`` carry the rounding of the distances and of the centring, a
    relative :data:`~ooc_spectral.core.model.PIVOT_FLOOR` (1e3 eps) of its largest entry
    at most, and an error ``E`` of the entries moves each eigenvalue by at most
    ``||E||_2 <= n max |E_ij|`` (Weyl): an eigenvalue below ``n PIVOT_FLOOR max |B_ij|`` may be
    rounding alone, and its eigenvector, scaled by ``1/sqrt(lambda)`` in the
    out-of-sample map, would be noise. The dictionary estimators refuse such components
    by the same floor on their pivots."""
    return PIVOT_FLOOR * B.shape[0] * float(np.max(np.abs(B)))


def double_centre(S: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """``B = -1/2 J S J`` for squared distances S; returns (B, column means of S, mean of S)."""
    col = S.mean(axis=0)
    row = S.mean(axis=1)
    total = float(col.mean())
    B = S - row[:, None]
    B -= col[None, :]
    B += total
    B *= -0.5
    return B, col, total


def check_connected(owner: str, graph, n_neighbors: int, what: str, X=None):
    """``graph``, its connected components joined as scikit-learn's Isomap does.

    A neighbour graph with several components leaves some geodesic distances
    infinite. As :class:`sklearn.manifold.Isomap` does, each pair of components is
    joined by an edge between its two closest rows (with a ``UserWarning``); ``X``
    are the graph's rows.
    """
    n_comp, labels = connected_components(graph, directed=False)
    if n_comp == 1:
        return graph
    warnings.warn(
        f"{owner}: the {n_neighbors}-nearest-neighbour graph of {what} has {n_comp} "
        "connected components; they are joined by their closest pairs of rows, as "
        "scikit-learn's Isomap does. Increase n_neighbors to avoid this.",
        UserWarning, stacklevel=3)
    from sklearn.utils.graph import _fix_connected_components

    graph = graph.tolil()
    graph = _fix_connected_components(X, graph, n_comp, labels, mode="distance",
                                      metric="euclidean")
    return graph.tocsr()


class Fitted(FeatureNamesMixin, TransformerMixin):
    """``_check_fitted``, ``fit_transform`` and ``transform`` shared by the estimators (a
    ``TransformerMixin`` itself, so ``set_output`` wraps these ``fit_transform`` and
    ``transform``).

    A subclass fits in ``_fit(X)``, which sets the fitted attributes and the map
    ``_map``, and says how many bytes of temporaries one row of a ``transform`` task
    takes (``_row_bytes``).
    """

    def _fit(self, X) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def fit(self, X, y=None):
        """Fit on X (the class docstring says how).

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str
            The n x d data or the path/URL of a zarr array.
        y : ignored

        Returns
        -------
        self
        """
        self._check_feature_names(X, reset=True)
        self._fit(X)
        return self

    def fit_transform(self, X, y=None):
        """Fit and return ``embedding_`` (no second pass over X)."""
        return self.fit(X).embedding_

    def _check_fitted(self):
        return check_fitted(self, "_map")

    def _row_bytes(self, emap) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _apply(self, emap, X):
        """``emap`` over the rows of X (:func:`apply_rows`)."""
        return apply_rows(type(self).__name__, emap, X, self.n_features_in_,
                          self._row_bytes(emap), self.chunk_rows)

    def transform(self, X):
        """Out-of-sample embedding of new rows, block by block (the class docstring
        gives the formula).

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str
            Rows with the training columns.

        Returns
        -------
        ndarray or dask array of shape (n_rows, n_components)
            numpy for numpy input, a lazy dask array otherwise; on training rows,
            the training embedding.
        """
        emap = self._check_fitted()
        self._check_feature_names(X, reset=False)
        return self._apply(emap, X)
