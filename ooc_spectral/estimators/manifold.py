"""The spectral family of Bengio et al. (2003), each with its out-of-sample extension.

Every method here embeds training rows with the leading eigenvectors of a
data-dependent kernel and new rows with the Nyström formula of that kernel
(Bengio et al. 2003, eqs. 8-12; the kernels are eqs. 14-16).

Out of core (memory independent of n; X read block by block from numpy, dask,
zarr or a zarr path):

- :class:`LaplacianEigenmaps`, :class:`DiffusionMap`: the greedy dictionary and
  the divisive normalization of :class:`~ooc_spectral.GreedySpectralEmbedding`
  (exact degrees); O(m^2 + chunk x (d + m)) memory.
- :class:`MetricMDS` with ``metric="euclidean"``: classical scaling with
  Euclidean distances is kernel PCA with a linear kernel; the greedy dictionary
  then holds at most d + 1 rows and the result is exact.
- :class:`LandmarkIsomap`: the landmarks are the greedy dictionary; geodesics
  run on the k-NN graph of a seeded in-memory sample of ``graph_size`` rows
  (O(graph_size x (d + k + m)) memory); every row of X is embedded block by block.

In memory (the fitted model holds n x n or k-NN-graph-sized arrays):

- :class:`MetricMDS` with any other metric: the n x n distance matrix.
- :class:`Isomap`: the n x n geodesic distance matrix.
- :class:`LocallyLinearEmbedding`: the k-NN graph and the sparse n x n matrix
  ``M`` (dense with ``eigen_solver="dense"``).

The in-memory estimators refuse more than ``max_samples`` rows with a message
naming the out-of-core alternative; their ``transform`` still processes new
rows block by block (numpy result for numpy input, a lazy dask array
otherwise), so only the fitted model must fit in memory.

Out-of-sample formulas
----------------------
Laplacian eigenmaps (eq. 4, section 4.2)
    The generalized eigenvectors ``(D - K) f = mu D f`` normalized ``f'Df = 1``
    are ``f_k = D^-1/2 v_k`` with ``v_k`` the unit eigenvectors of
    ``D^-1/2 K D^-1/2`` (eigenvalue ``lambda_k = 1 - mu_k``); a new row gets
    ``v_k(x)`` by the Nyström formula of the normalized kernel (eq. 11) and its
    own degree ``d(x) = sum_i K(x, x_i)``. This is the scale of scikit-learn's
    ``SpectralEmbedding``.
Diffusion map (Coifman & Lafon; Homrighausen & McDonald, section 2.1)
    ``Psi_t(x) = (lambda_k^t psi_k(x))_k`` with ``psi_k = sqrt(vol) D^-1/2 v_k``
    the right eigenvectors of the Markov matrix ``D^-1 K`` normalized so that
    ``psi_0 = 1`` and ``sum_i (d_i / vol) psi_k(x_i)^2 = 1`` (``vol = sum_i d_i``);
    Euclidean distances between coordinates are diffusion distances at time t.
Metric MDS (eq. 14)
    Classical scaling: ``K~ = -1/2 (d^2(a,b) - E_x d^2(x,b) - E_x' d^2(a,x') + E d^2)``,
    ``e_k(x) = (1 / sqrt(lambda_k)) sum_i v_ki K~(x, x_i)``.
Isomap (eq. 14 with the geodesic distance, = eq. 15, Corollary 1)
    The geodesic distance of a new row to ``x_i`` goes through its k nearest
    training rows: ``D~(x, x_i) = min_j (||x - x_j|| + D~(x_j, x_i))``.
Landmark Isomap (eq. 15)
    ``e_k(x) = 1 / (2 sqrt(lambda_k)) sum_i v_ki (E_x'[D~^2(x', l_i)] - D~^2(x, l_i))``
    over the landmarks ``l_i``, whose classical scaling gives ``v`` and ``lambda``.
LLE (eq. 16, the mu -> infinity limit of eq. 17)
    ``y_k(x) = sum_i y_k(x_i) w(x, x_i)`` with the barycentric weights of x on its
    k nearest training rows, and ``w(x, x_i) = delta_ij`` when ``x = x_j``.

On a training row every ``transform`` gives back the training embedding.

Where the code is: the Laplacian eigenmaps, diffusion maps and metric MDS
here; :class:`Isomap` and :class:`LandmarkIsomap` in :mod:`ooc_spectral.estimators.isomap`;
:class:`LocallyLinearEmbedding` in :mod:`ooc_spectral.estimators.lle`; the blockwise
application and the eigenproblems they share in ``ooc_spectral.estimators._manifold``.
Every estimator is importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.spatial.distance import cdist
from sklearn.base import BaseEstimator, TransformerMixin

from ._manifold import (
    DENSE_EIGEN_MAX_ROWS,
    TASK_MEMORY,
    Fitted,
    check_in_memory_params,
    check_sizes,
    double_centre,
    read_in_memory,
    top_positive,
)
from .._params import EMBEDDING_PARAMS, params_of, store_params
from ._sklearn import FeatureNamesMixin
from .._validation import check_float
from ..core.config import resolve_seed
from .embedding import GreedySpectralEmbedding
from ..exceptions import InvalidInputError, InvalidParameterError
from .isomap import GRAPH_SAMPLE_PURPOSE, Isomap, LandmarkIsomap
from .lle import LocallyLinearEmbedding
from ..io.source import open_source
from ..pipeline.exact import divisive_volume

__all__ = [
    "LaplacianEigenmaps",
    "DiffusionMap",
    "MetricMDS",
    "Isomap",
    "LandmarkIsomap",
    "LocallyLinearEmbedding",
]
# TASK_MEMORY, DENSE_EIGEN_MAX_ROWS and GRAPH_SAMPLE_PURPOSE (imported above from their
# modules) stay importable from here.


# --------------------------------------------------------------------------- #
# Laplacian eigenmaps and diffusion maps: out of core, from the divisive embedding
# --------------------------------------------------------------------------- #
@dataclass(frozen=True, eq=False)
class _DivisiveCoordinates:
    """``scale_k v_k(x) / sqrt(d(x))`` from a ``divisive-exact`` spectral map."""

    smap: Any
    scale: np.ndarray

    @property
    def n_components(self) -> int:
        return int(self.scale.shape[0])

    def embed(self, X: np.ndarray) -> np.ndarray:
        V, d = self.smap.embed_with_degrees(X)
        V /= np.sqrt(d)[:, None]
        V *= self.scale
        return V


class _DivisiveBase(Fitted, FeatureNamesMixin, TransformerMixin, BaseEstimator):
    """Fit of the divisive embedding and the coordinate map; subclasses set the scale."""

    def __init__(self, n_components=2, *, kernel="rbf", gamma=None, degree=3, coef0=1.0,
                 tol=1e-3, dictionary_size=None, selection="greedy", max_dictionary_size=5000,
                 affine=True, sample_size=20000, chunk_rows=None, random_state=None):
        store_params(self, locals())

    def _scale(self, smap) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _check_extra(self) -> None:
        pass

    def _fit(self, X) -> None:
        """Fit the divisive embedding of X and compute the coordinates of its rows."""
        self._check_extra()
        seed = resolve_seed(self.random_state)
        source = open_source(X)
        est = GreedySpectralEmbedding(
            n_components=self.n_components, **params_of(self, EMBEDDING_PARAMS),
            normalization="divisive", degree_estimate="exact", drop_first=True,
            random_state=seed)
        # A dask view of numpy input keeps the estimator's own pass 3 lazy (and unused):
        # the coordinates below need the degrees, which that pass does not return.
        est.fit(source.to_dask() if source.kind == "numpy" else source)
        smap = est.spectral_map_
        self.embedding_estimator_ = est
        self.spectral_map_ = smap
        self.volume_ = divisive_volume(smap)
        self.eigenvalues_ = smap.eigenvalues.copy()
        self._map = _DivisiveCoordinates(smap, self._scale(smap))
        self.n_features_in_ = est.n_features_in_
        self.gamma_ = est.gamma_
        self.dictionary_ = est.dictionary_
        self.max_residual_ = est.max_residual_
        self.random_state_ = seed
        # the map itself, not transform: embedding_ stays an array under set_output
        self.embedding_ = self._apply(self._map, X)

    def _row_bytes(self, emap) -> int:
        m = emap.smap.dictionary.size
        return 8 * (2 * self.n_features_in_ + 3 * m)


class LaplacianEigenmaps(_DivisiveBase):
    """Laplacian eigenmaps (Belkin & Niyogi) from a greedy dictionary, out of core.

    The coordinates are the generalized eigenvectors of ``(D - K) f = mu D f``
    normalized ``f'Df = 1`` (Bengio et al. 2003, eq. 4), the trivial constant
    one dropped: ``f_k = D^-1/2 v_k`` where ``v_k`` are the unit eigenvectors of
    ``D^-1/2 K D^-1/2`` computed by :class:`~ooc_spectral.GreedySpectralEmbedding`
    (``normalization="divisive"``, exact degrees of the approximate Gram
    matrix). This is the scaling of scikit-learn's ``SpectralEmbedding``, but not
    its graph: here the degrees ``d_i = sum_j k(x_i, x_j)`` include each row's
    self-similarity ``k(x_i, x_i)`` (1 for rbf), as in Bengio et al. (2003) and
    Ouimet & Bengio (2005), while scikit-learn's Laplacian drops the affinity's
    diagonal. Each is exact for its own definition (to 1e-9 and 1e-13 against a
    dense computation of each); between them the embeddings differ by 0.3% to 23%
    of their largest entry on a 1,000-row swiss roll at gamma 0.01 to 1
    (``workflows/bench/self_loops.py``, ``results/self_loops.md``). The
    self-loops cannot be dropped here cheaply: the greedy Gram matrix is
    low-rank, and subtracting its diagonal is not.
    Memory is independent of n (three parallel passes over X and a sequential
    scan; see the core estimator).

    Parameters
    ----------
    n_components : int, default=2
        Coordinates p (the trivial one not counted).
    kernel, gamma, degree, coef0, tol, dictionary_size, selection, max_dictionary_size, \
affine, sample_size, chunk_rows, random_state
        As for :class:`~ooc_spectral.GreedySpectralEmbedding`; ``tol`` bounds the
        entrywise error of the approximate kernel matrix (Proposition 1).

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
        ``D^-1/2 v_k`` for each training row; numpy for numpy input, a lazy dask
        array otherwise.
    eigenvalues_ : ndarray of shape (n_components,)
        ``lambda_k`` of ``D^-1/2 K D^-1/2``; the Laplacian eigenvalues are ``1 - lambda_k``.
    volume_ : float
        ``sum_i d_i``, the sum of the degrees.
    embedding_estimator_ : GreedySpectralEmbedding
    spectral_map_ : SpectralMap
    dictionary_, gamma_, max_residual_, n_features_in_, random_state_
        As for the core estimator.

    Examples
    --------
    >>> from ooc_spectral.manifold import LaplacianEigenmaps
    >>> from ooc_spectral.datasets import generate
    >>> X, _ = generate("swiss-roll", 1000, seed=0)
    >>> LaplacianEigenmaps(2, gamma=0.1, random_state=0).fit(X).embedding_.shape
    (1000, 2)
    """

    def _scale(self, smap) -> np.ndarray:
        return np.ones(smap.n_components)


class DiffusionMap(_DivisiveBase):
    """Diffusion map coordinates from a greedy dictionary, out of core.

    ``Psi_t(x) = (lambda_k^t psi_k(x))_k`` with ``psi_k = sqrt(vol) D^-1/2 v_k`` the
    right eigenvectors of the Markov matrix ``D^-1 K`` (normalized so that the
    trivial one is 1 and ``sum_i (d_i / vol) psi_k(x_i)^2 = 1``), ``lambda_k``
    their eigenvalues (those of ``D^-1/2 K D^-1/2``), t the diffusion time;
    Euclidean distances between coordinates are diffusion distances
    (Coifman & Lafon 2006; the diffusion map of Homrighausen & McDonald 2011,
    section 2.1). Out of core, as :class:`LaplacianEigenmaps`.

    Parameters
    ----------
    n_components : int, default=2
    diffusion_time : float, default=1.0
        t >= 0; 0 gives the eigenvectors ``psi_k`` themselves.
    kernel, gamma, degree, coef0, tol, dictionary_size, selection, max_dictionary_size, \
affine, sample_size, chunk_rows, random_state
        As for :class:`~ooc_spectral.GreedySpectralEmbedding`.

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
    eigenvalues_ : ndarray of shape (n_components,)
        ``lambda_k`` (the coordinates carry ``lambda_k ** diffusion_time``).
    volume_ : float
    embedding_estimator_, spectral_map_, dictionary_, gamma_, max_residual_, \
n_features_in_, random_state_
        As for :class:`LaplacianEigenmaps`.
    """

    def __init__(self, n_components=2, *, diffusion_time=1.0, kernel="rbf", gamma=None,
                 degree=3, coef0=1.0, tol=1e-3, dictionary_size=None, selection="greedy",
                 max_dictionary_size=5000, affine=True, sample_size=20000, chunk_rows=None,
                 random_state=None):
        store_params(self, locals())

    def _check_extra(self) -> None:
        check_float(type(self).__name__, "diffusion_time", self.diffusion_time, low=0.0)

    def _scale(self, smap) -> np.ndarray:
        vol = divisive_volume(smap)
        return np.sqrt(vol) * smap.eigenvalues ** float(self.diffusion_time)


# --------------------------------------------------------------------------- #
# metric MDS
def finite_distances(owner: str, S: np.ndarray, metric: str) -> np.ndarray:
    """``S``, refused where a distance is not finite (the cosine or correlation distance of
    a row of zeros or a constant row is 0/0)."""
    bad = ~np.isfinite(S)
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise InvalidInputError(
            f"{owner}: metric={metric!r} gives no finite distance between row {i} and training "
            f"row {j} (got {S[i, j]}; the cosine and correlation distances of a row of zeros or "
            "a constant row are 0/0); remove such rows, or use a metric defined on them, "
            "e.g. 'euclidean'")
    return S


# --------------------------------------------------------------------------- #
@dataclass(frozen=True, eq=False)
class _MDSMap:
    """Eq. 14 with eq. 11: the double-centred kernel row of x against the training rows."""

    X_fit: np.ndarray
    metric: str
    col_mean: np.ndarray
    total_mean: float
    proj: np.ndarray  # V / sqrt(lambda)

    @property
    def n_components(self) -> int:
        return int(self.proj.shape[1])

    def embed(self, X: np.ndarray) -> np.ndarray:
        S = finite_distances("MetricMDS.transform", cdist(X, self.X_fit, metric=self.metric),
                             self.metric)
        S *= S
        Kt = S - S.mean(axis=1, keepdims=True)
        Kt -= self.col_mean
        Kt += self.total_mean
        Kt *= -0.5
        return Kt @ self.proj


class MetricMDS(Fitted, FeatureNamesMixin, TransformerMixin, BaseEstimator):
    """Metric (classical) multidimensional scaling with its out-of-sample extension.

    The double-centring of squared distances (Bengio et al. 2003, eq. 2 and
    its continuous version eq. 14): ``e_ik = sqrt(lambda_k) v_ki`` from the
    leading eigenpairs of ``-1/2 J D^2 J``, and for a new row
    ``e_k(x) = (1/sqrt(lambda_k)) sum_i v_ki K~(x, x_i)``. This is classical
    (Torgerson-Gower) scaling, not the stress-minimizing SMACOF of scikit-learn's
    ``MDS``.

    ``metric="euclidean"`` runs **out of core**: with Euclidean distances the
    kernel of eq. 14 is the centred linear kernel, so the result is kernel PCA
    with a linear kernel, computed by :class:`~ooc_spectral.GreedySpectralEmbedding`
    with ``k(x, y) = gamma x.y + 1`` (polynomial of degree 1, ``affine=False``; its
    centred Gram matrix is ``gamma`` times the linear one, undone on the output):
    the greedy dictionary spans the whole feature space with at most d + 1 rows,
    every row is projected exactly, and the embedding equals the dense
    computation (and PCA). ``n_components`` can then be at most the rank of X.
    Any other ``metric`` (a name ``scipy.spatial.distance.cdist`` knows) holds the
    n x n distance matrix **in memory** (at most ``max_samples`` rows).

    Parameters
    ----------
    n_components : int, default=2
    metric : str, default="euclidean"
    tol : float, default=0.0
        Euclidean only: the dictionary scan's tolerance. 0 keeps every direction
        of the data: rows in the span of the others are projected exactly, to the
        rounding of their values, which ``max_residual_`` of ``embedding_estimator_``
        bounds (see ``GreedySpectralEmbedding``'s ``tol``).
    eigen_solver : {"auto", "dense", "arpack"}, default="auto"
        Other metrics: the eigensolver of the n x n matrix.
    max_samples : int, default=20000
        Other metrics: most training rows.
    chunk_rows : int, default=None
        Rows per task of the blockwise passes.
    random_state : int, default=None
        Seed of the scan's visiting order (euclidean) or of ARPACK.

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
    eigenvalues_ : ndarray of shape (n_components,)
        ``lambda_k`` of the double-centred matrix.
    out_of_core_ : bool
        Whether the fit ran out of core (``metric="euclidean"``).
    embedding_estimator_ : GreedySpectralEmbedding or None
        The core estimator of the Euclidean case.
    n_features_in_ : int
    feature_names_in_ : ndarray of str, shape (n_features,)
        The column names of a DataFrame X (only then); ``transform`` refuses rows whose
        names differ or come in another order.
    """

    def __init__(self, n_components=2, *, metric="euclidean", tol=0.0, eigen_solver="auto",
                 max_samples=20000, chunk_rows=None, random_state=None):
        store_params(self, locals())

    def _fit(self, X) -> None:
        """Fit on X (see the class docstring for which path runs)."""
        name, p, _ = check_sizes(self, neighbors=False)
        solver, max_samples = check_in_memory_params(self)
        if not isinstance(self.metric, str):
            raise InvalidParameterError(
                f"{name}: metric={self.metric!r} must be a metric name of "
                "scipy.spatial.distance.cdist, e.g. 'euclidean' or 'cityblock'")
        seed = resolve_seed(self.random_state)
        self.random_state_ = seed
        if self.metric == "euclidean":
            check_float(name, "tol", self.tol, low=0.0)
            source = open_source(X)
            # The centred kernel of eq. 14 for Euclidean distances is the centred linear
            # kernel; k(x, y) = gamma x.y + 1 (polynomial, degree 1) has the same centred
            # Gram matrix up to the factor gamma, and its feature space has d + 1
            # dimensions, so the dictionary can hold d + 1 rows and n_components can reach
            # d. gamma = 1 / median ||x||^2 (the core's heuristic) keeps both terms of order 1.
            est = GreedySpectralEmbedding(
                n_components=p, kernel="polynomial", degree=1, coef0=1.0, gamma=None,
                affine=False, tol=self.tol, normalization="additive",
                max_dictionary_size=max(5000, source.n_features + 2),
                chunk_rows=self.chunk_rows, random_state=seed).fit(source)
            scale = 1.0 / np.sqrt(est.gamma_)
            self.embedding_estimator_ = est
            self.out_of_core_ = True
            self.embedding_ = est.embedding_ * scale
            self.eigenvalues_ = est.eigenvalues_ / est.gamma_
            self.n_features_in_ = est.n_features_in_
            self._map = est
            self._scale = scale
            return
        Xf = read_in_memory(name, X, max_samples, "the n x n distance matrix")
        try:
            S = cdist(Xf[:2], Xf[:2], metric=self.metric)
        except (ValueError, TypeError) as exc:
            raise InvalidParameterError(
                f"{name}: metric={self.metric!r} is not a metric scipy.spatial.distance.cdist "
                f"knows ({exc}); use e.g. 'euclidean', 'cityblock' or 'chebyshev'") from None
        S = finite_distances(name, cdist(Xf, Xf, metric=self.metric), self.metric)
        S *= S
        B, col, total = double_centre(S)
        del S
        vals, V = top_positive(name, B, p, solver, seed)
        self.embedding_estimator_ = None
        self.out_of_core_ = False
        self.eigenvalues_ = vals
        self.embedding_ = V * np.sqrt(vals)
        self.n_features_in_ = Xf.shape[1]
        self._map = _MDSMap(Xf, self.metric, col, total, V / np.sqrt(vals))

    def transform(self, X):
        """Out-of-sample embedding (eq. 14 with eq. 11; the core estimator's for
        ``metric="euclidean"``).

        Returns
        -------
        ndarray or dask array of shape (n_rows, n_components)
            numpy for numpy input, a lazy dask array otherwise.
        """
        emap = self._check_fitted()
        self._check_feature_names(X, reset=False)
        if self.out_of_core_:
            # the rows without their column names: checked above, not by the inner estimator
            return emap.transform(open_source(X)) * self._scale
        return self._apply(emap, X)

    def _row_bytes(self, emap) -> int:
        return 8 * 3 * emap.X_fit.shape[0]

