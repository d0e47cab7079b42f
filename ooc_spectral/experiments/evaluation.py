"""How the papers measure an embedding.

The main paper's protocol (Ouimet & Bengio 2005, section 5)
-------------------------------------------------------------
Split the data at random into ``D1`` (training), ``D2`` (test) and ``D3``.
The *reference* is the exact method (full Gram matrix) applied to
``D2 U D3``, restricted to ``D2``. A method is trained on ``D1`` (or on its
first ``n`` rows), embeds ``D2`` out of sample by the Nystrom formula, and that
embedding is aligned with the reference by a linear regression (each test
point's coordinates in one embedding mapped to its coordinates in the other,
with an intercept). The *generalization error* is the mean over the test points
of the squared difference between the aligned embedding and the reference,
with a 95% confidence interval from the standard error of that mean.

Scale: the reference is taken as unit-norm eigenvectors over ``D2 U D3`` (the
paper's Algorithm 1, line 24: ``f_k(x) / sqrt(n)``), for both normalizations,
and the per-point squared difference is averaged over the ``p`` coordinates.
The regression maps the candidate onto the reference, so the candidate's own
scale and signs do not matter.

:class:`Protocol` does the split and the reference once and evaluates any
estimator with ``fit``/``transform`` on it.

Other measures (Homrighausen & McDonald 2011)
---------------------------------------------
- :func:`kernel_reconstruction_error`: the normalized kernel matrix against the
  rank-``p`` matrix an embedding implies, on sampled entries.
- :func:`clustering_ari`: k-means on the embedding, adjusted Rand index against
  the true labels; :func:`threshold_accuracy`: the best one-coordinate
  threshold classifier ("separable even in one dimension").
- :func:`svm_accuracy`: an SVM trained on the embedding of labelled rows,
  its smoothing parameter ``C`` chosen by cross-validation, accuracy on the
  test rows.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import dask.array as da
import numpy as np

from ..baselines._common import kernel_matmul
from ..baselines.exact import ExactKernelEmbedding
from ..exceptions import InvalidInputError, InvalidParameterError
from ..runtime.execution import Executor
from ..core.kernel_choice import make_kernel
from ..core.kernels import Kernel
from ..io.source import open_source

__all__ = [
    "ErrorEstimate",
    "split_indices",
    "reference_embedding",
    "align",
    "generalization_error",
    "paired_difference",
    "pointwise_error",
    "Protocol",
    "ProtocolResult",
    "kernel_reconstruction_error",
    "clustering_ari",
    "threshold_accuracy",
    "svm_accuracy",
]

#: Two-sided 95% normal quantile.
Z95 = 1.959963984540054


@dataclass(frozen=True)
class ErrorEstimate:
    """A mean with its 95% confidence half-width.

    Attributes
    ----------
    mean : float
    ci95 : float
        ``1.96 * std / sqrt(n)`` (normal approximation; the per-point errors are
        independent given the fitted model).
    std : float
        Standard deviation of the per-point values.
    n : int
        Number of points.
    """

    mean: float
    ci95: float
    std: float
    n: int

    @classmethod
    def of(cls, values) -> "ErrorEstimate":
        """The estimate from per-point values."""
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size == 0:
            raise InvalidInputError("no values to average")
        std = float(v.std(ddof=1)) if v.size > 1 else 0.0
        return cls(float(v.mean()), Z95 * std / math.sqrt(v.size), std, int(v.size))

    @property
    def low(self) -> float:
        return self.mean - self.ci95

    @property
    def high(self) -> float:
        return self.mean + self.ci95

    def __str__(self) -> str:
        return f"{self.mean:.3g} ± {self.ci95:.2g}"

    def to_dict(self) -> dict:
        return {"mean": self.mean, "ci95": self.ci95, "std": self.std, "n": self.n}


def split_indices(n: int, sizes, random_state=0) -> tuple[np.ndarray, ...]:
    """Disjoint random index sets of the given sizes (D1, D2, D3 of the protocol).

    Parameters
    ----------
    n : int
        Number of rows available.
    sizes : sequence of int
        Size of each part; their sum must not exceed ``n``.
    random_state : int
        Seed of the permutation.

    Returns
    -------
    tuple of ndarray
        One index array per part, each in random order.
    """
    sizes = [int(s) for s in sizes]
    if any(s < 1 for s in sizes) or sum(sizes) > n:
        raise InvalidParameterError(
            f"split sizes {sizes} need {sum(sizes)} rows (each at least 1), but only {n} exist"
        )
    perm = np.random.default_rng(np.random.SeedSequence([int(random_state), 0x5E55])).permutation(n)
    bounds = np.cumsum([0, *sizes])
    return tuple(perm[a:b] for a, b in zip(bounds[:-1], bounds[1:]))


def reference_embedding(X_reference, n_test: int, *, n_components: int, normalization: str,
                        kernel: str = "rbf", gamma: float | None = None,
                        memory_budget="4GiB") -> tuple[np.ndarray, np.ndarray]:
    """The exact embedding of ``X_reference`` (``D2`` then ``D3``), first ``n_test`` rows.

    Returns
    -------
    reference : ndarray of shape (n_test, n_components)
        Unit-norm eigenvectors (over all of ``X_reference``) of the centred
        Gram matrix (additive) or of ``D^-1/2 K D^-1/2`` (divisive, trivial one
        dropped), restricted to the first ``n_test`` rows.
    eigenvalues : ndarray of shape (n_components,)
    """
    est = ExactKernelEmbedding(n_components, kernel=kernel, gamma=gamma,
                               normalization=normalization, memory_budget=memory_budget,
                               random_state=0).fit(np.asarray(X_reference))
    E = np.asarray(est.embedding_)
    if normalization == "additive":
        E = E / np.sqrt(est.eigenvalues_)
    return E[:n_test], est.eigenvalues_


def align(E, reference) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares affine map of ``E`` onto ``reference``.

    Parameters
    ----------
    E : ndarray of shape (n, p)
    reference : ndarray of shape (n, q)

    Returns
    -------
    aligned : ndarray of shape (n, q)
        ``[E, 1] @ B``.
    B : ndarray of shape (p + 1, q)
    """
    E = np.asarray(E, dtype=np.float64)
    R = np.asarray(reference, dtype=np.float64)
    if E.ndim != 2 or R.ndim != 2 or E.shape[0] != R.shape[0]:
        raise InvalidInputError(
            f"cannot align an embedding of shape {E.shape} with a reference of shape {R.shape}; "
            "they must be 2-D with the same rows"
        )
    if not np.all(np.isfinite(E)):
        raise InvalidInputError("the embedding to align contains NaN or infinity")
    A = np.column_stack([E, np.ones(E.shape[0])])
    B, *_ = np.linalg.lstsq(A, R, rcond=None)
    return A @ B, B


def pointwise_error(E, reference) -> np.ndarray:
    """Per test point: the squared difference between aligned ``E`` and ``reference``.

    Averaged over the reference's coordinates; :func:`generalization_error` is
    their mean.
    """
    aligned, _ = align(E, reference)
    return np.mean((aligned - np.asarray(reference)) ** 2, axis=1)


def generalization_error(E, reference) -> ErrorEstimate:
    """Mean squared difference between the aligned ``E`` and ``reference``, with 95% CI.

    The per-point value is the squared difference averaged over the reference's
    coordinates.
    """
    return ErrorEstimate.of(pointwise_error(E, reference))


def paired_difference(a: "ProtocolResult", b: "ProtocolResult") -> ErrorEstimate:
    """Mean of ``a``'s per-point error minus ``b``'s on the same test points, with 95% CI.

    Both results must come from the same :class:`Protocol`; a CI entirely below
    zero says ``a`` generalizes better than ``b``.
    """
    if a.per_point is None or b.per_point is None or a.per_point.shape != b.per_point.shape:
        raise InvalidInputError(
            "paired_difference needs two results of the same Protocol (per-point errors on "
            "the same test points)"
        )
    return ErrorEstimate.of(a.per_point - b.per_point)


@dataclass
class ProtocolResult:
    """One method evaluated under :class:`Protocol`.

    Attributes
    ----------
    error : ErrorEstimate
    n_train : int
    fit_seconds, transform_seconds : float
        Wall time, best of the timing repeats.
    fit_cpu_seconds, transform_cpu_seconds : float
        CPU time of this process (all its threads), best of the repeats: the
        steadier measure on a shared machine.
    info : dict
        Fitted facts worth reporting (dictionary size, tol, landmarks, ...).
    per_point : ndarray of shape (n_test,)
        The per-point errors (for paired comparisons; not in :meth:`to_dict`).
    """

    error: ErrorEstimate
    n_train: int
    fit_seconds: float
    transform_seconds: float
    fit_cpu_seconds: float = math.nan
    transform_cpu_seconds: float = math.nan
    info: dict = field(default_factory=dict)
    per_point: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {"error": self.error.to_dict(), "n_train": self.n_train,
                "fit_seconds": self.fit_seconds, "transform_seconds": self.transform_seconds,
                "fit_cpu_seconds": self.fit_cpu_seconds,
                "transform_cpu_seconds": self.transform_cpu_seconds, **self.info}


def _fitted_info(est) -> dict:
    info = {}
    for name in ("dictionary_indices_", "landmark_indices_"):
        if hasattr(est, name):
            info["m"] = int(len(getattr(est, name)))
    for name in ("tol_", "max_residual_", "gamma_"):
        if hasattr(est, name) and getattr(est, name) is not None:
            info[name.rstrip("_")] = float(getattr(est, name))
    return info


class Protocol:
    """The main paper's section 5 protocol on one data set.

    Parameters
    ----------
    X : array-like of shape (n, d)
        In memory (the exact reference needs ``D2 U D3`` in memory anyway).
    n_train, n_test, n_extra : int
        Sizes of ``D1``, ``D2``, ``D3`` (the paper: ``|D1| <= 3333``,
        ``|D2| = 3330``, ``|D3| = 3332`` for the spiral).
    n_components : int
    normalization : {"additive", "divisive"}
    kernel : str, default="rbf"
    gamma : float
        The kernel coefficient every method must use (fixed, so that all
        methods and the reference share the kernel).
    random_state : int, default=0
        Seed of the split.
    memory_budget : int or str, default="4GiB"
        Of the exact reference.
    reference : (ndarray, ndarray), optional
        A reference embedding of ``D2`` and its eigenvalues computed before for
        the same split and settings (e.g. read from a cache); skips the exact
        eigensolve.
    reference_seconds : float, optional
        The time that reference took, for the report.

    Attributes
    ----------
    X_train : ndarray of shape (n_train, d)
        ``D1`` in random order: ``X_train[:n]`` are nested training sets.
    X_test : ndarray of shape (n_test, d)
    reference : ndarray of shape (n_test, n_components)
    reference_eigenvalues : ndarray
    reference_seconds : float
    """

    def __init__(self, X, *, n_train: int, n_test: int, n_extra: int, n_components: int,
                 normalization: str, gamma: float, kernel: str = "rbf", random_state: int = 0,
                 memory_budget="4GiB", reference=None, reference_seconds: float | None = None):
        X = np.asarray(X, dtype=np.float64)
        self.indices = split_indices(X.shape[0], (n_train, n_test, n_extra), random_state)
        i1, i2, i3 = self.indices
        self.X_train, self.X_test = X[i1], X[i2]
        self.n_components = int(n_components)
        self.normalization = normalization
        self.kernel = kernel
        self.gamma = float(gamma)
        if reference is not None:
            ref, vals = reference
            ref = np.asarray(ref, dtype=np.float64)
            if ref.shape != (len(i2), self.n_components):
                raise InvalidInputError(
                    f"the given reference has shape {ref.shape}; expected ({len(i2)}, "
                    f"{self.n_components}) for this split"
                )
            self.reference, self.reference_eigenvalues = ref, np.asarray(vals)
            self.reference_seconds = float(reference_seconds or 0.0)
            return
        t0 = time.perf_counter()
        self.reference, self.reference_eigenvalues = reference_embedding(
            np.concatenate([X[i2], X[i3]]), len(i2), n_components=n_components,
            normalization=normalization, kernel=kernel, gamma=gamma, memory_budget=memory_budget)
        self.reference_seconds = time.perf_counter() - t0

    def evaluate(self, estimator, n_train: int | None = None, *, repeats: int = 1) -> ProtocolResult:
        """Fit ``estimator`` on the first ``n_train`` rows of ``D1``, embed ``D2``, score it.

        Parameters
        ----------
        estimator : estimator with ``fit`` and ``transform``
            Must be configured with the protocol's kernel and gamma.
        n_train : int, optional
            Default: all of ``D1``.
        repeats : int, default=1
            Fit (and transform) this many times; the best time is reported
            (the fits are deterministic for a fixed ``random_state``).

        Returns
        -------
        ProtocolResult
        """
        n = len(self.X_train) if n_train is None else int(n_train)
        if not 2 <= n <= len(self.X_train):
            raise InvalidParameterError(
                f"n_train={n_train} is outside [2, {len(self.X_train)}] (the size of D1)"
            )
        Xtr = self.X_train[:n]
        fit_t = tr_t = fit_c = tr_c = math.inf
        for _ in range(max(1, int(repeats))):
            t0, c0 = time.perf_counter(), time.process_time()
            estimator.fit(Xtr)
            t1, c1 = time.perf_counter(), time.process_time()
            E = np.asarray(estimator.transform(self.X_test))
            t2, c2 = time.perf_counter(), time.process_time()
            fit_t, tr_t = min(fit_t, t1 - t0), min(tr_t, t2 - t1)
            fit_c, tr_c = min(fit_c, c1 - c0), min(tr_c, c2 - c1)
        points = pointwise_error(E, self.reference)
        return ProtocolResult(ErrorEstimate.of(points), n, fit_t, tr_t, fit_c, tr_c,
                              _fitted_info(estimator), points)


# --------------------------------------------------------------------------- #
# kernel reconstruction
# --------------------------------------------------------------------------- #
def kernel_reconstruction_error(X, embedding, eigenvalues, *, kernel: Kernel | str = "rbf",
                                gamma: float | None = None, normalization: str = "additive",
                                drop_first: bool = True, n_pairs: int = 10000,
                                random_state=0, chunk_rows: int = 8192) -> dict:
    """The normalized kernel matrix against the rank-``p`` matrix an embedding implies.

    On ``n_pairs`` entries ``(i, j)`` drawn uniformly (with replacement) it
    compares the exact normalized kernel with:

    - additive: ``K_c(i, j) ~ e_i . e_j`` (``e`` kernel PCA's projections, so
      ``E E' = U Lambda U'``);
    - divisive: ``N(i, j) ~ sum_k lambda_k v_ik v_jk`` plus, when the trivial
      eigenvector was dropped, its exact term ``sqrt(d_i d_j) / sum(d)``.

    The exact entries need the row sums ``K 1``: one out-of-core product over
    the whole data (``O(n^2)`` time, :func:`~ooc_spectral.baselines.kernel_matmul`).

    Parameters
    ----------
    X : array-like, dask array, zarr array, or str
    embedding : array of shape (n, p)
    eigenvalues : array of shape (p,)
    kernel : Kernel or str, default="rbf"
    gamma : float, optional
        With a kernel name.
    normalization : {"additive", "divisive"}
    drop_first : bool, default=True
    n_pairs : int, default=10000
    random_state : int, default=0

    Returns
    -------
    dict
        ``relative_frobenius`` (``sqrt(sum (K - K^)^2 / sum K^2)`` over the
        sampled entries), ``max_abs``, ``mean_abs`` and ``n_pairs``.
    """
    if isinstance(kernel, str):
        kernel = make_kernel(kernel, gamma=gamma)
    source = open_source(X)
    n = source.n_rows
    E = np.asarray(embedding, dtype=np.float64)
    lam = np.asarray(eigenvalues, dtype=np.float64)
    if E.shape[0] != n:
        raise InvalidInputError(f"the embedding has {E.shape[0]} rows but X has {n}")
    rng = np.random.default_rng(np.random.SeedSequence([int(random_state), 0x4EC0]))
    i = rng.integers(n, size=int(n_pairs))
    j = rng.integers(n, size=int(n_pairs))
    rows = np.unique(np.concatenate([i, j]))
    Xd = source.to_dask(max(source.storage_chunk_rows,
                            -(-chunk_rows // source.storage_chunk_rows) * source.storage_chunk_rows))
    (r,) = Executor().values("kernel row sums",
                             kernel_matmul(kernel, Xd, Xd, da.ones((n, 1), chunks=(Xd.chunks[0], 1))))
    r = np.asarray(r)[:, 0]
    Xr = source.read_index(rows)
    pos = {int(v): a for a, v in enumerate(rows)}
    ia = np.array([pos[int(v)] for v in i])
    ja = np.array([pos[int(v)] for v in j])
    xi, xj = Xr[ia], Xr[ja]
    kij = _paired_kernel(kernel, xi, xj)
    if normalization == "additive":
        mu = r / n
        exact = kij - mu[i] - mu[j] + mu.mean()
        approx = np.einsum("tk,tk->t", E[i], E[j])
    else:
        exact = kij / np.sqrt(r[i] * r[j])
        approx = np.einsum("tk,tk,k->t", E[i], E[j], lam)
        if drop_first:
            approx = approx + np.sqrt(r[i] * r[j]) / r.sum()
    diff = exact - approx
    return {
        "relative_frobenius": float(np.sqrt(np.sum(diff**2) / np.sum(exact**2))),
        "max_abs": float(np.max(np.abs(diff))),
        "mean_abs": float(np.mean(np.abs(diff))),
        "n_pairs": int(n_pairs),
    }


def _paired_kernel(kernel: Kernel, A: np.ndarray, B: np.ndarray, step: int = 256) -> np.ndarray:
    """``k(a_t, b_t)`` for paired rows: the diagonals of small kernel blocks."""
    out = np.empty(A.shape[0])
    for a in range(0, A.shape[0], step):
        K = kernel.pairwise(A[a:a + step], B[a:a + step])
        out[a:a + step] = np.diagonal(K)
    return out


# --------------------------------------------------------------------------- #
# clustering and classification
# --------------------------------------------------------------------------- #
def clustering_ari(embedding, labels, *, n_clusters: int | None = None, random_state=0) -> float:
    """Adjusted Rand index of k-means on the embedding against the true labels.

    Parameters
    ----------
    embedding : array of shape (n, p)
    labels : array of shape (n,)
    n_clusters : int, optional
        Default: the number of distinct labels.
    random_state : int, default=0
        Seed of k-means (10 restarts).
    """
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    E = np.asarray(embedding, dtype=np.float64)
    y = np.asarray(labels)
    if E.ndim == 1:
        E = E[:, None]
    k = len(np.unique(y)) if n_clusters is None else int(n_clusters)
    pred = KMeans(n_clusters=k, n_init=10, random_state=random_state).fit_predict(E)
    return float(adjusted_rand_score(y, pred))


def threshold_accuracy(coordinate, labels) -> float:
    """Accuracy of the best threshold on one coordinate for two classes.

    Homrighausen & McDonald's "separable even in one dimension via linear
    methods": 1.0 when one threshold on the coordinate splits the classes.
    """
    x = np.asarray(coordinate, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel()
    classes = np.unique(y)
    if len(classes) != 2:
        raise InvalidInputError(f"threshold_accuracy needs two classes, got {len(classes)}")
    pos = (y == classes[1]).astype(np.int64)
    order = np.argsort(x, kind="stable")
    p = pos[order]
    # predict class 1 above the cut: correct = (#0 at or below) + (#1 above)
    zeros_below = np.concatenate([[0], np.cumsum(1 - p)])
    ones_above = p.sum() - np.concatenate([[0], np.cumsum(p)])
    correct = zeros_below + ones_above
    best = max(correct.max(), (len(p) - correct).max())
    return float(best / len(p))


def svm_accuracy(F_train, y_train, F_test, y_test, *, C_grid=(0.1, 1.0, 10.0, 100.0, 1000.0),
                 cv: int = 10, random_state=0) -> dict:
    """An RBF SVM on embedding features, ``C`` chosen by cross-validation.

    The features are standardized (eigenvector coordinates are of order
    ``1/sqrt(n)``), then ``SVC(kernel="rbf", gamma="scale")`` with ``C`` picked by
    stratified ``cv``-fold cross-validation on the training rows, as
    Homrighausen & McDonald choose the SVM's smoothing parameter.

    Returns
    -------
    dict
        ``accuracy``, ``n_correct``, ``n_test`` and the chosen ``C``.
    """
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    y_train = np.asarray(y_train)
    y_test = np.asarray(y_test)
    folds = StratifiedKFold(n_splits=int(cv), shuffle=True, random_state=random_state)
    search = GridSearchCV(make_pipeline(StandardScaler(), SVC(kernel="rbf", gamma="scale")),
                          {"svc__C": list(C_grid)}, cv=folds)
    search.fit(np.asarray(F_train), y_train)
    pred = search.predict(np.asarray(F_test))
    correct = int(np.sum(pred == y_test))
    return {"accuracy": correct / len(y_test), "n_correct": correct, "n_test": int(len(y_test)),
            "C": float(search.best_params_["svc__C"])}
