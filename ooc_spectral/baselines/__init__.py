"""The baselines the papers compare the greedy dictionary with.

Every estimator here has the interface of
:class:`~ooc_spectral.GreedySpectralEmbedding` (``fit`` / ``transform`` /
``embedding_`` / ``eigenvalues_``, scikit-learn parameter conventions, the same
input types through :func:`~ooc_spectral.io.source.open_source`) and the same two
normalizations:

``normalization="additive"`` (kernel PCA, metric MDS)
    ``embedding_`` holds kernel PCA's projections ``sqrt(lambda_k) u_k`` (the
    scale of scikit-learn's ``KernelPCA.fit_transform``) and ``eigenvalues_`` the
    eigenvalues ``lambda_k`` of the centred Gram matrix ``H K H``.
``normalization="divisive"`` (spectral clustering, Laplacian eigenmaps, diffusion maps)
    ``embedding_`` holds unit-norm eigenvectors of ``D^-1/2 K D^-1/2`` with
    ``D = diag(K 1)``, the trivial first one (eigenvalue 1) dropped by default;
    ``eigenvalues_`` their eigenvalues.

``transform`` is the Nystrom formula of Bengio et al. (2003, eqs. 8-12) for the
data-dependent kernel of each normalization; on training rows it gives back the
training embedding (exactly for :class:`ExactKernelEmbedding`). Each column's
sign is fixed as in :func:`~ooc_spectral.core.eigensolve.top_eigenpairs`: the entry
of largest magnitude of the eigenvector is positive.

The estimators
--------------
:class:`ExactKernelEmbedding`
    The full n x n Gram matrix in memory: the oracle. Refuses an ``n`` whose
    Gram matrix does not fit ``memory_budget``.
:class:`NystromEmbedding`
    Eigen-decomposition on ``n_landmarks`` rows only, extended to every row by the
    Nystrom formula (Williams & Seeger 2001; Homrighausen & McDonald 2011,
    Algorithm 1). Landmarks ``uniform`` (at random), ``diagonal`` (sampled in
    proportion to the diagonal of the normalized kernel), ``largest-diagonal``
    (the largest diagonal entries, Belabbas & Wolfe's deterministic rule) or
    ``volume`` (``P(I) ~ det(G_I)``, Belabbas & Wolfe's Metropolis chain). The
    extension to all rows is a dask map over row blocks (a ``c x m`` kernel block
    each); only the ``m`` landmarks are held.
:class:`GaussianProjectionEmbedding`
    The randomized range finder of Halko, Martinsson & Tropp (2011) on the n x n
    normalized kernel matrix (Homrighausen & McDonald's "Gaussian projection"),
    with every product ``K V`` computed out of core block by block as a sum over
    column blocks (:func:`kernel_matmul`), never forming ``K``.

The random dictionary of Harmeling et al. (every row projected on a random
subset) is ``GreedySpectralEmbedding(selection="random", dictionary_size=m)``.

Modules
-------
``_common``
    Task rows, kernel resolution, :class:`NystromModel`, :func:`kernel_matmul`
    and the base class (parameter checks, ``fit`` skeleton, ``transform``).
``exact``
    :class:`ExactKernelEmbedding`.
``selection``
    The normalized kernels and samplers of Nystrom's landmarks: largest
    diagonal, Efraimidis-Spirakis keys, volume sampling by a Metropolis chain.
``nystrom``
    :class:`NystromEmbedding`.
``gaussian_projection``
    :class:`GaussianProjectionEmbedding` and its scratch arrays.

Layer 6, beside :mod:`ooc_spectral.estimators`: may import the estimators' shared
helpers, :mod:`ooc_spectral.pipeline` and every layer below it.
"""

from ._common import (
    DEFAULT_TASK_ROWS,
    NORMALIZATIONS,
    RANDOM_WINDOW_ROWS,
    SUB_BLOCK_ROWS,
    NystromModel,
    _dense_fit,
    _embed_source,
    _f64,
    _finite_block,
    _KernelEmbeddingBase,
    _kv_block,
    _positive_or_raise,
    _resolve_kernel,
    _row_random,
    _task_rows,
    kernel_matmul,
)
from .exact import ExactKernelEmbedding
from .gaussian_projection import (
    GaussianProjectionEmbedding,
    _gaussian_block,
    _ProjectionModel,
    _read_leased,
    _Scratch,
    _ScratchLease,
)
from .nystrom import NYSTROM_SELECTIONS, NystromEmbedding
from .selection import (
    _PURPOSE,
    _REFRESH_EVERY,
    SubsetCenteredKernel,
    _diag_block,
    _keep_top,
    _merge_top,
    _pivoted_start,
    efraimidis_spirakis_keys,
    metropolis_volume_sample,
    selection_kernel,
)

__all__ = [
    "ExactKernelEmbedding",
    "NystromEmbedding",
    "GaussianProjectionEmbedding",
    "SubsetCenteredKernel",
    "NystromModel",
    "metropolis_volume_sample",
    "efraimidis_spirakis_keys",
    "selection_kernel",
    "kernel_matmul",
    "NYSTROM_SELECTIONS",
]
