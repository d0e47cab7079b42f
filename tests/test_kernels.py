"""Kernel blocks against scikit-learn's pairwise kernels; float64 whatever the input."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sklearn.metrics.pairwise import laplacian_kernel, linear_kernel, polynomial_kernel, rbf_kernel

from ooc_spectral import InvalidParameterError
from ooc_spectral.core.kernel_choice import (kernel_from_attrs, kernel_to_attrs, make_kernel,
                                             median_heuristic_gamma)
from ooc_spectral.core.kernels import SubsetNormalizedKernel

rng = np.random.default_rng(0)
X = rng.normal(size=(40, 5)) * 3
Y = rng.normal(size=(17, 5)) * 3

CASES = [
    (make_kernel("rbf", gamma=0.07), rbf_kernel(X, Y, gamma=0.07)),
    (make_kernel("laplacian", gamma=0.2), laplacian_kernel(X, Y, gamma=0.2)),
    (make_kernel("linear"), linear_kernel(X, Y)),
    (make_kernel("polynomial", gamma=0.1, degree=3, coef0=1.5), polynomial_kernel(X, Y, degree=3, gamma=0.1, coef0=1.5)),
]


@pytest.mark.parametrize("kernel, expected", CASES, ids=[c[0].name for c in CASES])
def test_blocks_and_diagonal_match_sklearn(kernel, expected):
    np.testing.assert_allclose(kernel(X, Y), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(kernel.diag(X), np.diag(kernel(X)), rtol=1e-12, atol=1e-12)
    K = kernel.pairwise(X, Y, kernel.aux(X), kernel.aux(Y))
    assert K.dtype == np.float64 and K.shape == (40, 17)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int16])
def test_any_real_dtype_is_computed_in_float64(dtype):
    Xi = (X * 2).astype(dtype)
    k = make_kernel("rbf", gamma=0.01)
    got = k(Xi)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, k(Xi.astype(np.float64)))


@pytest.mark.parametrize("scale", [1e-165, 1e-200, 1e-300, 1e150, 1e300])
def test_the_cosine_of_rows_does_not_depend_on_their_scale(scale):
    """Rows at 1e-165 had squared norms that underflow to 0 and were taken for rows of
    zeros (k(x, x) = 0; the spectrum 68.7 where it is 109.7, inside its own 'certified'
    interval, an outside audit); at 1e300 they were refused. Scaled exactly by powers of
    two, every row has its cosine, to rounding."""
    from sklearn.metrics.pairwise import cosine_similarity

    k = make_kernel("cosine")
    A = X.copy()
    A[::3] *= scale  # one row in three at that scale, the rest as they are
    ref = cosine_similarity(X, Y)
    np.testing.assert_allclose(k(A, Y), ref, rtol=0, atol=1e-14)
    np.testing.assert_allclose(k(Y, A), ref.T, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(k.diag(A), np.ones(len(A)))
    np.testing.assert_allclose(k(A, A), cosine_similarity(X), rtol=0, atol=1e-14)
    Z = np.zeros_like(X[:2])
    assert not k(Z, A).any() and not k.diag(Z).any()  # a row of zeros stays one


@pytest.mark.parametrize("scale", [1e-165, 1e300])
def test_a_cosine_fit_on_rows_at_extreme_scales_equals_the_fit_at_unit_scale(scale):
    """Also without a warning: the scan's dictionary radius overflowed at 1e300."""
    import warnings

    from ooc_spectral import GreedySpectralEmbedding

    Xf = np.random.default_rng(3).normal(size=(300, 3))
    A = Xf.copy()
    A[::3] *= scale
    kw = dict(n_components=2, kernel="cosine", tol=1e-6, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = GreedySpectralEmbedding(**kw).fit(A)
    b = GreedySpectralEmbedding(**kw).fit(Xf)
    np.testing.assert_allclose(a.eigenvalues_, b.eigenvalues_, rtol=1e-12)
    np.testing.assert_allclose(a.embedding_, b.embedding_, rtol=0, atol=1e-10)


def test_rbf_distances_never_negative():
    # identical rows: the expansion |x|^2 + |y|^2 - 2 x.y rounds, the kernel must stay <= 1
    Z = np.repeat(rng.normal(size=(1, 5)) * 1e3, 4, axis=0)
    assert np.all(make_kernel("rbf", gamma=1.0)(Z) <= 1.0)


def test_median_heuristic():
    S = rng.normal(size=(50, 3))
    d2 = ((S[:, None] - S[None]) ** 2).sum(-1)[np.triu_indices(50, 1)]
    assert median_heuristic_gamma("rbf", S) == pytest.approx(1 / np.median(d2), rel=1e-12)
    d1 = np.abs(S[:, None] - S[None]).sum(-1)[np.triu_indices(50, 1)]
    assert median_heuristic_gamma("laplacian", S) == pytest.approx(1 / np.median(d1), rel=1e-12)
    assert median_heuristic_gamma("polynomial", S) == pytest.approx(1 / np.median((S**2).sum(1)))
    assert median_heuristic_gamma("linear", S) is None
    assert median_heuristic_gamma("rbf", np.ones((5, 2))) == 1.0  # all distances zero


@pytest.mark.parametrize("kernel, scale", [
    ("rbf", 1e-155),  # squared distances subnormal: 1 / median overflowed to inf
    ("rbf", 1e-165),  # they underflow to 0: the all-equal fallback (gamma 1) took it
    ("polynomial", 1e-165),
    ("laplacian", 1e-310),  # L1 distances subnormal
], ids=["rbf-1e-155", "rbf-1e-165", "polynomial-1e-165", "laplacian-1e-310"])
def test_data_too_small_for_a_median_gamma_are_refused_with_a_scale_that_works(kernel, scale):
    """Rows too small in scale for the median-heuristic gamma to be formed in float64 (found
    by two audits: a raw OverflowError, then advice that could not work). They are refused
    naming the power of ten that brings them to scale; the data so multiplied fit, certified.
    (Rows too large: tests/test_batch_safety.py::test_finite_values_whose_squared_norms_
    overflow_are_named.)"""
    from sklearn.datasets import make_s_curve

    from ooc_spectral import GreedySpectralEmbedding, InvalidInputError

    X = (make_s_curve(300, random_state=0)[0] + [3.0, 1.0, 2.0]) * scale
    tol = 1e-7 if kernel == "polynomial" else 1e-3
    with pytest.raises(InvalidInputError, match=r"multiply the data by (1e-?\d+)") as info:
        GreedySpectralEmbedding(n_components=2, kernel=kernel, tol=tol, random_state=0).fit(X)
    power = int(re.search(r"multiply the data by 1e(-?\d+)", str(info.value)).group(1))
    est = GreedySpectralEmbedding(n_components=2, kernel=kernel, tol=tol, random_state=0)
    est.fit(X * 10.0**power)
    assert np.isfinite(est.gamma_) and est.gamma_ > 0 and est.max_residual_ <= tol
    from extended_precision import HAS_EXTENDED, true_residuals

    # the certificate, against residuals in extended precision (the exact path has no
    # factor: every row is a dictionary point, as in tests/test_certificate.py)
    if HAS_EXTENDED and est.spectral_map_.dictionary.L is not None:
        assert true_residuals(est.kernel_, X * 10.0**power, est.dictionary_).max() \
            <= est.max_residual_
    assert est.dictionary_.shape[0] > 2 and np.all(np.isfinite(est.embedding_))


def test_subset_normalized_kernel_is_divisive_normalization():
    base = make_kernel("rbf", gamma=0.05)
    k = SubsetNormalizedKernel(base, X)  # the subset is the data itself
    deg = base(X).mean(axis=1)
    np.testing.assert_allclose(k(X), base(X) / np.sqrt(np.outer(deg, deg)), rtol=1e-12)
    np.testing.assert_allclose(k.diag(X), 1.0 / deg, rtol=1e-12)


@pytest.mark.parametrize("kernel", [c[0] for c in CASES] + [SubsetNormalizedKernel(make_kernel("rbf", gamma=0.3), Y)],
                         ids=lambda k: k.name)
def test_attrs_round_trip(kernel):
    attrs, arrays = kernel_to_attrs(kernel)
    back = kernel_from_attrs(attrs, arrays)
    np.testing.assert_array_equal(back(X, Y), kernel(X, Y))


def test_unknown_kernel():
    with pytest.raises(InvalidParameterError, match="kernel='sigmoid' is not a known kernel"):
        make_kernel("sigmoid")


# --------------------------------------------------------------------------- pieces (issue 18)
@pytest.mark.parametrize("name", ["rbf", "laplacian", "linear", "polynomial", "cosine",
                                  "subset-normalized"])
def test_pieces_and_pairwise_dot_equal_the_whole_block_for_every_kernel(name):
    """Kernel blocks are computed in cache-sized row pieces and pass 3 multiplies each
    piece by the folded map: for every kernel at its defaults, a block of many pieces
    equals the block computed at once, and ``pairwise_dot`` equals ``pairwise @ G``."""
    from ooc_spectral.core.kernels import PIECE_ELEMENTS, PIECE_MIN_ROWS

    rng = np.random.default_rng(5)
    m, d = 300, 6
    P = rng.standard_normal((m, d))
    rows = 5 * (PIECE_ELEMENTS // m) + 7  # several pieces and a partial one
    assert PIECE_ELEMENTS // m > PIECE_MIN_ROWS
    X = rng.standard_normal((rows, d))
    if name == "subset-normalized":
        k = SubsetNormalizedKernel(make_kernel("rbf", gamma=0.3), P[:50])
    else:
        k = make_kernel(name, gamma=1.0 / d)
    G = rng.standard_normal((m, 3))
    whole = np.vstack([k.pairwise(X[i:i + 1], P) for i in range(0, rows, 97)])
    block = k.pairwise(X, P)
    np.testing.assert_allclose(block[::97], whole, rtol=1e-14, atol=1e-15)
    if hasattr(k, "pairwise_monotone") and name in ("rbf", "laplacian"):
        ref = k.monotone_to_kernel(k.pairwise_monotone(X, P))  # the unpieced formula
        # Equal up to the gemm's rounding of a row, which on some CPUs depends on where the
        # row sits in the call: on an AVX-512 machine (2026-11-25) OpenBLAS gave 13 of these
        # 329,100 entries, rows at the end of a piece, one ulp off the one-call block; on
        # the AVX2 machines before, every bit was equal. The exponent is exp's argument, so
        # an ulp in it is at most a few ulps of k (|k| <= 1).
        np.testing.assert_allclose(block, ref, rtol=0, atol=8 * np.finfo(float).eps)
    ref = block @ G
    got = k.pairwise_dot(X, P, G)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    assert k.pairwise_dot(X[:0], P, G).shape == (0, 3)


@pytest.mark.parametrize("backend", ["openblas", "mkl"])
@pytest.mark.parametrize("name", ["rbf", "laplacian", "linear", "polynomial", "cosine",
                                  "subset-normalized"])
def test_the_dictionarys_kernel_block_is_the_same_in_either_order(name, backend):
    """``kernel_block(order="C")`` (k(X, D) by rows of X, MKL's pass 2) and the default
    Fortran-ordered transpose of k(D, X): the same values to rounding, for every kernel."""
    from conftest import mkl_backend

    from ooc_spectral.core.model import Dictionary

    rng = np.random.default_rng(7)
    m, d = 300, 6
    P = rng.standard_normal((m, d))
    Xb = rng.standard_normal((1000, d))
    k = (SubsetNormalizedKernel(make_kernel("rbf", gamma=0.3), P[:50]) if name == "subset-normalized"
         else make_kernel(name, gamma=1.0 / d))
    D = Dictionary(k, P, np.arange(m), k.aux(P), np.eye(m), np.ones(m), float(m), True)
    with mkl_backend(backend == "mkl"):
        KF, kxF = D.kernel_block(Xb)
        KC, kxC = D.kernel_block(Xb, out=np.empty((1000, m)), order="C")
    assert KF.flags.f_contiguous and KC.flags.c_contiguous and KC.shape == KF.shape == (1000, m)
    np.testing.assert_array_equal(kxF, kxC)
    ref = k.pairwise(Xb, P)
    scale = np.abs(ref).max()
    np.testing.assert_allclose(KC, ref, rtol=0, atol=32 * np.finfo(float).eps * scale)
    np.testing.assert_allclose(KF, ref, rtol=0, atol=32 * np.finfo(float).eps * scale)
    with pytest.raises(ValueError, match="order must be 'C' or 'F'"):
        D.kernel_block(Xb, order="K")
