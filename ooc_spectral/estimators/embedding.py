"""The scikit-learn-style estimator :class:`GreedySpectralEmbedding`."""

from __future__ import annotations

import os

import dask
import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.metaestimators import available_if

from ._sklearn import FeatureNamesMixin
from .._params import store_params
from .._validation import check_fitted, check_n_features
from ..core.config import FitConfig
from ..core.degenerate import check_divisive_embedding
from ..core.model import SpectralMap
from ..exceptions import DictionaryError, InvalidInputError
from ..runtime.execution import compute, task_threads
from ..pipeline.advice import with_advice
from ..pipeline.writeback import EmbeddingOutput, client_accel, map_rows
from ..pipeline.fit import FitResult, FitRun
from ..core.planning import plan_block_rows, plan_tasks
from ..io.source import open_source

__all__ = ["GreedySpectralEmbedding"]


class GreedySpectralEmbedding(FeatureNamesMixin, TransformerMixin, BaseEstimator):
    """Kernel PCA and spectral embedding from a greedy dictionary, out of core.

    The method of Ouimet & Bengio (2005): a sequential scan selects a small
    dictionary of m rows whose feature-space span holds every row to within
    ``tol`` (Algorithm 1, eqs. 5-10, in Cholesky form); every row is projected
    on that span, and the projections' m x m second moments give the
    eigenvectors of the n x n normalized Gram matrix (Proposition 2) in
    O(n m^2) time and O(m^2) memory. The data can be a numpy array, a dask
    array, a zarr array or the path of a zarr store; nothing of size n x m is
    held in memory.

    Parameters
    ----------
    n_components : int or None, default=2
        Number of embedding coordinates p; must be below the dictionary size.
        None: every direction the dictionary supports, as
        ``KernelPCA(n_components=None)`` keeps every non-zero eigenvalue: with the
        additive normalization every eigenvalue certified above 0 (its
        ``eigenvalue_interval_`` lies above 0), with the divisive one every
        eigenvalue above rounding; the number kept is ``eigenvalues_.shape[0]``.
    kernel : {"rbf", "laplacian", "linear", "polynomial", "poly", "cosine"} or callable, default="rbf"
        ``rbf``: ``exp(-gamma ||x-y||^2)``; ``laplacian``: ``exp(-gamma ||x-y||_1)``;
        ``linear``: ``x.y``; ``polynomial`` (or ``poly``, KernelPCA's name):
        ``(gamma x.y + coef0)^degree``; ``cosine``: ``x.y / (||x|| ||y||)`` (0 for
        a row of zeros). A callable ``k(x, y, **kernel_params)`` may take two rows
        and return a number, as in scikit-learn (slow: one Python call per entry),
        or two blocks of rows (c x d and m x d) and return their c x m kernel
        matrix, as ``sklearn.metrics.pairwise.rbf_kernel`` does (one call per
        block); which of the two is found on the first block
        (:class:`~ooc_spectral.core.callable_kernel.CallableKernel`). It works on a dask
        cluster, but a model with a callable kernel cannot be saved
        (:class:`~ooc_spectral.exceptions.ModelNotSavableError`).
    gamma : float, default=None
        Kernel coefficient. None: the median heuristic on a seeded sample of
        1000 rows (``1/median ||x-y||^2`` for rbf, ``1/median ||x-y||_1`` for
        laplacian, ``1/median ||x||^2`` for polynomial, with ``x`` moved by the
        sample's mean where the kernel takes a centre: degree 1 with the additive
        normalization, see the user guide's certificate page); the value used is
        ``gamma_``.
    degree : int, default=3
        Degree of the polynomial kernel.
    coef0 : float, default=1.0
        Constant term of the polynomial kernel.
    kernel_params : dict, default=None
        Keyword arguments of a callable kernel (an error with a built-in one).
    tol : float, default=1e-3
        The paper's epsilon: a row enters the dictionary when its squared
        feature-space distance to the dictionary's span exceeds ``tol``; after
        the scan every row is within ``tol`` (see ``max_residual_``). ``tol=0``
        asks for every direction of the data: a row is left out only where float64
        certifies it in the span (within 1e-4 of ``k(x, x)``, its bound reported in
        ``max_residual_``); where it cannot, kernel PCA whose n x n problem fits in a
        quarter of the memory (and n at most ``max_dictionary_size``: 5,000 at the
        default) is solved exactly on the full Gram matrix (with a ``DictionaryWarning``),
        and any other fit is refused naming a tol that works. A fit whose dictionary
        holds fewer points than ``n_components`` at ``tol`` (a smaller tol would add
        some, or a Gaussian or Laplacian kernel nearly constant over the rows) is solved
        exactly there too.
    dictionary_size : int, default=None
        Ask for a dictionary of exactly this many points instead (by
        ``selection``: RP-Cholesky by default, or the paper's Algorithm 2, a
        search on the tolerance). The selection runs on a seeded
        in-memory sample of ``sample_size`` rows (all rows when n is not
        larger); the dictionary comes from that sample and ``tol_`` is the
        largest residual on it. Rows outside the sample are projected, not scanned,
        so ``max_residual_`` may exceed ``tol_``.
    scan : {"full", "prefix"}, default="full"
        ``full``: the sequential scan visits every row. ``prefix``: it stops once
        the dictionary stops growing (``prefix_patience`` windows of 65,536 rows
        that each added at most 0.1% of it); pass 2 then collects every row whose
        residual exceeds ``tol``, and those few rows are scanned in visiting
        order. This selects exactly the dictionary of the full scan, with the
        same guarantee, while the sequential part reads only a prefix of the
        data. If the dictionary grew, kernel PCA extends pass 2's moments to the
        new points with a cheap pass (O(n m (d + new points))) and
        ``max_residual_`` becomes an upper bound (pass 2's residuals within
        ``tol`` can only have shrunk); the divisive normalization runs pass 2 again.
    prefix_patience : int, default=2
    selection : {"auto", "greedy", "random", "rpcholesky"}, default="auto"
        ``greedy``: the paper's scan. ``random``: ``dictionary_size`` rows of the
        same seeded sample, in random order, skipping rows already in the span
        (the random dictionary of Harmeling et al., every row still projected);
        the baseline the paper's Figure 4 compares with. ``rpcholesky``: blocked
        randomly pivoted Cholesky (Chen, Epperly, Tropp & Webber, 2023) on the
        seeded sample of ``sample_size`` rows, pivots drawn in proportion to
        their residual; with ``tol`` the rows pass 2 finds beyond tol are taken
        in by the same algorithm until none is left
        (:mod:`ooc_spectral.core.scan.rpcholesky`). ``auto``: ``rpcholesky`` with
        ``dictionary_size`` (at equal m it has the lowest subspace error of the
        four selections on every data set measured, RESULTS.md), ``greedy`` with
        ``tol`` (one sequential pass certifies every row by construction).
    max_dictionary_size : int, default=5000
        The scan stops with :class:`~ooc_spectral.exceptions.DictionarySizeError`
        (naming a tol and a gamma to try) when the dictionary grows past this.
    affine : bool, default=True
        The paper's constraint ``sum_i a_ti = 1`` on the projection weights
        (eq. 7-8): the residual becomes invariant to translations in feature space.
    normalization : {"additive", "divisive"}, default="additive"
        ``additive``: kernel PCA (same scale and eigenvalues as scikit-learn's
        ``KernelPCA``). ``divisive``: unit-norm eigenvectors of
        ``D^-1/2 K D^-1/2`` (spectral clustering, Laplacian eigenmaps).
    degree_estimate : {"exact", "subset"}, default="exact"
        Divisive only. ``exact``: the degrees of the approximate Gram matrix
        (Proposition 2; one more parallel pass). ``subset``: the kernel is
        normalized before the scan with degrees estimated on a seeded subset of
        ``degree_subset_size`` rows (the paper's alternative).
    degree_subset_size : int, default=1000
        Rows of that subset.
    drop_first : bool, default=True
        Divisive only: drop the trivial first eigenvector (eigenvalue 1).
    sample_size : int, default=20000
        Rows of the in-memory sample for ``dictionary_size``.
    solver : {"gemm", "trsm"}, default="gemm"
        How pass 3 and ``transform`` map a chunk to its embedding. ``gemm``:
        ``L^-T``, the centring and the eigenvectors are folded into one m x p
        matrix, so a chunk costs a kernel block and one product (O(c m (d + p))
        instead of O(c m^2)). ``trsm``: one triangular solve per chunk, then the
        eigenvectors. Both pass the exactness tests at ``tol=1e-6``. Pass 2
        always solves: it needs every row's coordinates for the certificate.
    chunk_rows : int, default=None
        Rows per task of the parallel passes, used as given (a task may read a
        row range of a storage chunk). None: whole storage chunks, split so that
        every thread has at least two tasks. Either way each task works in
        sub-blocks whose kernel block keeps it within about 256 MiB, whatever
        the dictionary size.
    fit_inverse_transform : bool, default=False
        Learn the pre-image map of :meth:`inverse_transform`, as scikit-learn's
        ``KernelPCA``: kernel ridge regression from the embedding back to the
        rows, with the model's kernel on the embedding coordinates, restricted
        to the kernel functions centred at the dictionary points' embeddings.
        It needs an m x m and an m x d statistic, accumulated in one more
        parallel pass after the eigensolve. On the exact path (every row in the
        dictionary) it is scikit-learn's regression on every row. Additive
        normalization only.
    alpha : float, default=1.0
        Ridge penalty of the pre-image map.
    output_dtype : {"float64", "float32"} or None, default=None
        dtype of ``embedding_`` and of ``transform``'s output. The values are
        computed in float64 and rounded once: float32 halves the write-back and
        the output on disk, at float32 precision (relative 6e-8). None: float32
        for float32 input, float64 otherwise (as scikit-learn's transformers
        keep float32); the command line's default is float64.
    random_state : int, RandomState or Generator, default=None
        Seed of the visiting order and of every sample. The same seed gives the
        same dictionary whatever the chunking, workers or threads.

    Attributes
    ----------
    embedding_ : ndarray or dask array of shape (n_samples, n_components)
        The training embedding; numpy for numpy input, a dask array otherwise
        (backed by the output zarr array when ``fit(..., output=...)`` was used).
    eigenvalues_ : ndarray of shape (n_components,)
        Additive: eigenvalues of the centred Gram matrix. Divisive: eigenvalues
        of ``D^-1/2 K D^-1/2`` (the dropped trivial one excluded).
    dictionary_ : ndarray of shape (m, n_features)
        The dictionary rows, in the order selected.
    dictionary_indices_ : ndarray of shape (m,)
        Their row numbers in X.
    max_residual_ : float
        ``max_t delta_t`` with the final dictionary over all rows (the certificate).
    max_residual_row_ : int
        A row where it is reached.
    eigenvalue_interval_ : ndarray of shape (n_components, 2) or None
        Additive normalization: every eigenvalue of the exact centred Gram matrix lies in
        ``[eigenvalue_interval_[i, 0], eigenvalue_interval_[i, 1]]``, that is from
        ``eigenvalues_[i]`` to ``eigenvalues_[i] + eigenvalue_error_bound_``, widened by
        the eigensolve's rounding (the certificate of the spectrum). None for the
        divisive normalization and after ``partial_fit``.
    eigenvalue_error_bound_ : float or None
        Additive normalization: the dictionary's part ``b`` of Weyl's interval, the sum of
        the rows' certified squared distances to the dictionary's span (at most
        ``n * max_residual_``); on the exact path, where no row has a distance, the
        interval's width above ``eigenvalues_``. After ``partial_fit`` with NumPy batches
        carried by their projections, two-sided: each exact eigenvalue lies within
        ``eigenvalue_error_bound_`` of ``eigenvalues_[i]``, below it too (in exact
        arithmetic; :mod:`ooc_spectral.pipeline.incremental`). None for the divisive
        normalization.
    gamma_ : float or None
        The kernel coefficient used.
    tol_ : float
        The tolerance used (found by the search with ``dictionary_size``).
    n_features_in_ : int
    feature_names_in_ : ndarray of str, shape (n_features,)
        The column names of a DataFrame X (only then); ``transform`` refuses rows whose
        names differ or come in another order.
    n_samples_fit_ : int
    random_state_ : int
        The seed used.
    spectral_map_ : SpectralMap
        Dictionary, factor, centring and eigenvectors: what ``transform`` applies.
    timings_ : dict
        Wall time of each stage in seconds.
    dual_coef_ : ndarray of shape (n_centers, n_features)
        The pre-image map's coefficients (``fit_inverse_transform=True``).
    X_transformed_fit_ : ndarray of shape (n_centers, n_components)
        The embeddings of the pre-image map's centres: the dictionary points
        (every training row on the exact path).

    References
    ----------
    M. Ouimet and Y. Bengio, *Greedy Spectral Embedding*, AISTATS 2005.
    Y. Bengio et al., *Out-of-Sample Extensions for LLE, Isomap, MDS,
    Eigenmaps, and Spectral Clustering*, NIPS 2003 (eqs. 8-12).

    Examples
    --------
    Kernel PCA of a swiss roll, against scikit-learn's exact one on the full
    Gram matrix:

    >>> import numpy as np
    >>> from sklearn.datasets import make_swiss_roll
    >>> from sklearn.decomposition import KernelPCA
    >>> from ooc_spectral import GreedySpectralEmbedding
    >>> X, _ = make_swiss_roll(3000, random_state=0)
    >>> est = GreedySpectralEmbedding(n_components=3, gamma=0.01, tol=1e-6,
    ...                               random_state=0).fit(X)
    >>> exact = KernelPCA(3, kernel="rbf", gamma=0.01, eigen_solver="dense").fit(X)
    >>> lo, hi = est.eigenvalue_interval_.T  # certified: each exact eigenvalue is inside
    >>> bool(np.all((lo <= exact.eigenvalues_) & (exact.eigenvalues_ <= hi)))
    True
    >>> est.dictionary_.shape[0] < 500, est.max_residual_ <= 1e-6
    (True, True)
    >>> est.transform(X[:5]).shape
    (5, 3)
    """

    def __init__(self, n_components=2, *, kernel="rbf", gamma=None, degree=3, coef0=1.0,
                 kernel_params=None, tol=1e-3, dictionary_size=None, scan="full", prefix_patience=2,
                 selection="auto", max_dictionary_size=5000,
                 affine=True,
                 normalization="additive", degree_estimate="exact", degree_subset_size=1000,
                 drop_first=True, sample_size=20000, solver="gemm", chunk_rows=None,
                 fit_inverse_transform=False, alpha=1.0,
                 output_dtype=None, random_state=None):
        store_params(self, locals())

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # float32 input gives float32 output (output_dtype=None)
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    # ------------------------------------------------------------------ #
    def _config(self) -> FitConfig:
        return FitConfig.from_params(self.get_params(deep=False))

    def fit(self, X, y=None, *, output=None):
        """Fit on X and compute the training embedding.

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str
            The n x d data, or the path/URL of a zarr array (or of a group
            holding one data array).
        y : ignored
        output : str or os.PathLike, optional
            Path/URL of a zarr group; the embedding is written there as the
            array ``embedding`` (n x p, ``output_dtype``, chunks aligned with the tasks' rows)
            and ``embedding_`` reads it back lazily. The location is checked
            before any work starts.

        Returns
        -------
        self
        """
        # the column names first, as scikit-learn does: mixed types are refused before the work
        self._check_feature_names(X, reset=True)
        source = open_source(X)
        config = self._config().with_output_dtype(source.dtype)
        try:
            with client_accel(source.n_rows):
                result = FitRun(config, source).run(output)
        except DictionaryError as err:
            advised = with_advice(err, config, source, getattr(self, "_parameter_names", None))
            if advised is err:
                raise
            raise advised from None  # one advice: the original's diagnosis is in it
        self._incremental = None  # a later partial_fit starts afresh
        self._set_fitted(result)
        if self.normalization == "divisive":  # a graph in pieces or on outliers is said
            check_divisive_embedding(self)
        return self

    def fit_transform(self, X, y=None, *, output=None):
        """Fit and return ``embedding_`` (no second projection of X)."""
        return self.fit(X, y, output=output).embedding_

    def _supports_partial_fit(self) -> bool:
        """``partial_fit`` is offered only where it works: kernel PCA
        (``normalization="additive"``); scikit-learn's ``available_if`` pattern."""
        if self.normalization == "divisive":
            raise AttributeError(
                "partial_fit is not available with normalization='divisive' (the degrees "
                "change with every batch); use fit, or normalization='additive'")
        return True

    @available_if(_supports_partial_fit)
    def partial_fit(self, X, y=None):
        """Add a batch of rows and re-solve (kernel PCA with ``tol``; issue 16).

        Each call scans the batch against the current dictionary (adding the rows
        beyond ``tol``), accumulates the batch's statistics and solves again;
        ``transform`` works between calls. ``fit`` starts from scratch; a
        ``partial_fit`` after ``fit`` continues from nothing fit left (call it
        from the first batch on). ``gamma=None`` is resolved on the first batch.

        Earlier batches that can be read again (zarr arrays, paths, dask arrays)
        are extended exactly when the dictionary grows, so the result is kernel
        PCA of every row seen projected on the final dictionary. numpy batches
        are not kept: their rows are carried by their projections on the span
        they were seen with, and ``eigenvalue_error_bound_`` widens to cover that
        and becomes two-sided: an exact eigenvalue may then lie below ``eigenvalues_[i]``
        by up to it (see :mod:`ooc_spectral.pipeline.incremental`). Only ``normalization="additive"``.

        Returns
        -------
        self
        """
        from ..pipeline.incremental import IncrementalFit
        from ..core.kernel_choice import resolve_kernel

        source = open_source(X)
        inc = getattr(self, "_incremental", None)
        # a later batch's columns must be the first batch's (before it is added)
        self._check_feature_names(X, reset=inc is None)
        if inc is None and self.n_components is not None and source.n_rows <= self.n_components:
            # every call solves: the first batch alone must span the components
            raise InvalidInputError(
                f"{type(self).__name__}.partial_fit: the first batch has {source.n_rows} "
                f"row{'s' * (source.n_rows != 1)}, and the solve after it needs at least "
                f"n_components + 1 = {self.n_components + 1} (centring takes one direction); "
                "pass a first batch of that many rows, or lower n_components")
        if inc is None:
            c = self._config()
            kernel, gamma = resolve_kernel(c, source)
            inc = IncrementalFit(c, kernel, source.n_features)
            self.gamma_ = gamma
        inc.add(source, keep=source.kind != "numpy")
        self._incremental = inc
        self.spectral_map_ = inc.spectral_map
        self.kernel_ = inc.kernel
        self.eigenvalues_ = inc.spectral_map.eigenvalues.copy()
        self.dictionary_ = inc.dictionary.points
        self.dictionary_indices_ = inc.dictionary.indices
        self.max_residual_, self.max_residual_row_ = inc.max_residual
        self.eigenvalue_error_bound_ = inc.eigenvalue_error_bound
        # no interval is derived for the incremental solve: an earlier fit's would certify
        # another spectrum (found by an outside audit)
        self.eigenvalue_interval_, self.rounding_ = None, None
        self.tol_ = inc.config.tol
        self.n_features_in_ = inc.n_features
        self.n_samples_fit_ = inc.n_samples
        self.random_state_ = inc.config.random_state
        self.embedding_ = None
        self.timings_, self.resumed_stages_ = {}, []
        self._set_preimage(None)  # partial_fit learns no pre-image map
        return self

    def _set_fitted(self, r: FitResult) -> None:
        self.spectral_map_ = r.spectral_map
        self.kernel_ = r.kernel
        # written to an output: read back lazily
        self.embedding_ = (r.embedding.as_dask() if isinstance(r.embedding, EmbeddingOutput)
                           else r.embedding)
        self.eigenvalues_ = r.spectral_map.eigenvalues.copy()
        self.dictionary_ = r.dictionary.points
        self.dictionary_indices_ = r.dictionary.indices
        self.max_residual_ = r.max_residual
        self.max_residual_row_ = r.max_residual_row
        self.eigenvalue_error_bound_ = r.eigenvalue_error_bound
        self.eigenvalue_interval_ = r.eigenvalue_interval
        self.rounding_ = r.rounding
        self.gamma_ = r.gamma
        self.tol_ = r.tol
        self.n_features_in_ = r.n_features
        self.n_samples_fit_ = r.n_samples
        self.random_state_ = r.config.random_state
        self.timings_ = dict(r.timings)
        self.resumed_stages_ = list(r.resumed)
        self._set_preimage(r.preimage)

    def _set_preimage(self, preimage) -> None:
        self.preimage_map_ = preimage
        for name in ("dual_coef_", "X_transformed_fit_"):
            if hasattr(self, name):
                delattr(self, name)
        if preimage is not None:
            self.dual_coef_ = preimage.dual_coef
            self.X_transformed_fit_ = preimage.centers

    # ------------------------------------------------------------------ #
    def _check_fitted(self) -> SpectralMap:
        return check_fitted(self, "spectral_map_",
                            " or load a saved model with GreedySpectralEmbedding.load(path)")

    def transform(self, X):
        """Out-of-sample embedding of new rows by the Nyström formula.

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str
            Same input types as :meth:`fit`, with ``n_features_in_`` columns.

        Returns
        -------
        ndarray or dask array of shape (n_rows, n_components)
            numpy for numpy input, a lazy dask array otherwise. On training rows
            this gives back the training embedding.
        """
        smap = self._check_fitted()
        self._check_feature_names(X, reset=False)
        source = open_source(X)
        check_n_features(type(self).__name__, source.n_features, self.n_features_in_)
        # Rows are checked finite block by block inside the projection.
        plan = plan_tasks(source.n_rows, source.n_features, source.storage_chunk_rows,
                          threads=task_threads(), requested=self.chunk_rows,
                          itemsize=source.itemsize)
        block = plan_block_rows(plan.rows, source.n_features, smap.dictionary.size,
                                itemsize=source.itemsize)
        dtype = FitConfig.from_params({"output_dtype": self.output_dtype}
                                      ).with_output_dtype(source.dtype).output_dtype
        # numpy for numpy input (RowBlocks), else the lazy dask array
        return map_rows(source.task_view(plan.rows), smap, chunk_starts=source.chunk_starts,
                        block_rows=block, dtype=dtype)

    def inverse_transform(self, X):
        """Rows of the input space whose embedding is X (the learned pre-image map).

        As scikit-learn's ``KernelPCA.inverse_transform``: the kernel ridge
        regression learned with ``fit_inverse_transform=True`` (see that
        parameter), applied block by block.

        Parameters
        ----------
        X : array-like, dask array, zarr array, or str of shape (n_rows, n_components)
            Embedding coordinates.

        Returns
        -------
        ndarray or dask array of shape (n_rows, n_features_in_)
            numpy for numpy input, a lazy dask array otherwise.
        """
        import dask.array as da

        from ..exceptions import NotFittedError
        from ..runtime.execution import shared

        self._check_fitted()
        pre = getattr(self, "preimage_map_", None)
        if pre is None:
            raise NotFittedError(
                f"this {type(self).__name__} has no pre-image map: inverse_transform needs "
                "fit_inverse_transform=True when fitting (a fit, not partial_fit)")
        source = open_source(X)
        p = pre.centers.shape[1]
        if source.n_features != p:
            raise InvalidInputError(
                f"X has {source.n_features} columns, but the embedding of this "
                f"{type(self).__name__} has {p}; pass embedding coordinates (the output of "
                "transform)")
        rows = plan_tasks(source.n_rows, p, source.storage_chunk_rows, threads=task_threads(),
                          requested=self.chunk_rows, itemsize=source.itemsize).rows
        block = plan_block_rows(rows, p, pre.centers.shape[0], itemsize=source.itemsize)
        d = pre.dual_coef.shape[1]
        E = source.to_dask(rows)
        starts = None if source.chunk_starts is None else shared(np.asarray(source.chunk_starts))
        out = da.map_blocks(_preimage_block, E, shared(pre), block, starts, dtype=np.float64, meta=np.empty((0, d)), chunks=(E.chunks[0], (d,)),
                            name="ooc-spectral-preimage-" + dask.base.tokenize(E, pre))
        return compute(out)[0] if source.kind == "numpy" else out

    # ------------------------------------------------------------------ #
    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> None:
        """Save the fitted model as a zarr group of arrays with JSON attributes.

        Never pickles. Load with :meth:`load`.
        """
        from ..io.persistence import save_model

        self._check_fitted()
        save_model(self, path, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "GreedySpectralEmbedding":
        """Load a model written by :meth:`save` (or by ``ooc-spectral fit``)."""
        from ..io.persistence import load_model

        return load_model(cls, path)


def _preimage_block(E, pre, block_rows, chunk_starts, block_info=None):
    """The pre-image of one block of embedding rows, ``block_rows`` at a time (finite checked)."""
    from .._validation import check_finite

    offset = int(block_info[0]["array-location"][0][0]) if block_info else 0
    E = np.ascontiguousarray(E, dtype=np.float64)
    check_finite(E, offset, chunk_starts=chunk_starts)
    out = np.empty((E.shape[0], pre.dual_coef.shape[1]))
    step = max(int(block_rows), 1)
    for a in range(0, E.shape[0], step):
        out[a:a + step] = pre.apply(E[a:a + step])
    return out
