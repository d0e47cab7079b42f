"""Pass 2's typed statistics: combine in row order equals the whole, and the flat form
a checkpoint stores gives back the same statistic (every kind)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import make_swiss_roll

from ooc_spectral import GreedySpectralEmbedding
from ooc_spectral.core.pass2 import (chunk_cross_moments, chunk_degrees, chunk_gram,
                                     chunk_kernel_cross, chunk_ksums, chunk_moments, combine)
from ooc_spectral.core.statistics import (KINDS, BeyondTol, Certificate, Moments, PreimageSums,
                                          from_flat)


@pytest.fixture(scope="module")
def fitted():
    X = make_swiss_roll(1200, random_state=3)[0]
    # gamma 0.03: a 277-point dictionary, below sqrt(80 n) = 310 where the fit would solve the
    # exact problem instead (pipeline/exact.exact_limit) and keep no dictionary to test
    est = GreedySpectralEmbedding(n_components=3, gamma=0.03, tol=1e-3, random_state=0).fit(X)
    return X, est.spectral_map_.dictionary


def _kinds(X, d):
    m = d.size
    total = np.linalg.solve(d.L, chunk_ksums(X, d, 0).sum)
    return {
        "moments": lambda a, b: chunk_moments(X[a:b], d, a, tol_check=1e-4),
        "cross": lambda a, b: chunk_cross_moments(X[a:b], d, a, m - 4),
        "kernel_cross": lambda a, b: chunk_kernel_cross(X[a:b], d, a, m - 4),
        "ksums": lambda a, b: chunk_ksums(X[a:b], d, a),
        "gram": lambda a, b: chunk_gram(X[a:b], d, a, tol_check=1e-4),
        "degrees": lambda a, b: chunk_degrees(X[a:b], d, a, total, tol_check=1e-4),
    }


def _assert_same(a, b, rtol=0.0):
    fa, fb = a.to_flat(), b.to_flat()
    assert fa.keys() == fb.keys()
    for key in fa:
        if isinstance(fa[key], np.ndarray):
            np.testing.assert_allclose(fa[key], fb[key], rtol=rtol, atol=rtol * np.abs(fb[key]).max())
        elif isinstance(fa[key], float) and rtol:
            assert fa[key] == pytest.approx(fb[key], rel=rtol, abs=1e-300)
        else:
            assert fa[key] == fb[key], key


@pytest.mark.parametrize("kind", ["moments", "cross", "kernel_cross", "ksums", "gram", "degrees"])
def test_parts_combined_in_row_order_equal_the_whole(fitted, kind):
    X, d = fitted
    part = _kinds(X, d)[kind]
    whole = part(0, len(X))
    pieces = combine(combine(part(0, 300), part(300, 301)), part(301, len(X)))
    assert type(pieces) is type(whole) and pieces.n == len(X)
    _assert_same(pieces, whole, rtol=1e-11)
    # combine is associative up to rounding: another tree, same statistic
    other = combine(part(0, 300), combine(part(300, 301), part(301, len(X))))
    _assert_same(other, whole, rtol=1e-11)


@pytest.mark.parametrize("kind", ["moments", "cross", "kernel_cross", "ksums", "gram", "degrees"])
def test_flat_form_round_trips_every_kind(fitted, kind):
    X, d = fitted
    stat = _kinds(X, d)[kind](0, 700)
    flat = stat.to_flat()
    assert flat["kind"] == stat.kind
    back = from_flat(flat)
    assert type(back) is type(stat)
    _assert_same(back, stat)


def test_preimage_sums_round_trip_and_combine():
    rng = np.random.default_rng(0)
    a = PreimageSums(3, rng.normal(size=(4, 4)), rng.normal(size=(4, 2)))
    b = PreimageSums(2, rng.normal(size=(4, 4)), rng.normal(size=(4, 2)))
    c = a.combine(b)
    assert c.n == 5
    np.testing.assert_array_equal(c.ktk, a.ktk + b.ktk)
    _assert_same(from_flat(c.to_flat()), c)
    assert set(KINDS) == {"moments", "cross", "ksums", "gram", "degrees", "preimage"}


def test_certificate_ties_go_to_the_earlier_row_and_beyond_tol_keeps_row_order():
    a, b = Certificate(0.5, 10), Certificate(0.5, 3)
    assert a.combine(b) == b and b.combine(a) == b
    delta = np.array([0.1, 2.0, 0.3, 5.0])
    X = np.arange(8.0).reshape(4, 2)
    first = BeyondTol.of(delta[:2], 0, X[:2], 1.0)
    second = BeyondTol.of(delta[2:], 2, X[2:], 1.0)
    both = first.combine(second)
    np.testing.assert_array_equal(both.rows, [1, 3])
    np.testing.assert_array_equal(both.X, X[[1, 3]])
    assert both.within == Certificate(0.3, 2)


def test_combining_two_kinds_is_a_type_error(fitted):
    X, d = fitted
    with pytest.raises(TypeError, match="cannot combine"):
        combine(chunk_moments(X, d, 0), chunk_ksums(X, d, 0))


def test_unknown_kind_in_a_checkpoint_is_named():
    with pytest.raises(ValueError, match="unknown statistic kind 'bogus'"):
        from_flat({"kind": "bogus", "n": 1})
    assert isinstance(from_flat(chunk_like_moments()), Moments)


def chunk_like_moments() -> dict:
    """The flat form an older checkpoint stored (no ``beyond`` keys)."""
    return {"kind": "moments", "n": 2, "mean": np.zeros(2), "m2": np.eye(2), "sq": 2.0,
            "sum_kx": 2.0, "max_kx": 1.0, "sum_dhat": 0.0, "max_delta": 0.0, "argmax": 0}


def test_partials_folded_as_they_arrive_in_any_order_equal_the_fold_at_the_end(fitted):
    """Pass 2 folds its segment partials in segment order as they arrive (holding only
    the early ones), instead of holding all until the end: the same combine calls in
    the same order, so the bits are the same."""
    from ooc_spectral.core.pass2 import _combine_many, _InOrder

    X, d = fitted
    parts = [chunk_moments(X[a:a + 100], d, a) for a in range(0, len(X), 100)]
    fold = _InOrder()
    held = []
    for i in (3, 0, 1, 5, 2, 4, *range(6, len(parts))):
        fold.add(i, parts[i])
        held.append(len(fold.early))
    _assert_same(fold.result(len(parts)), _combine_many(parts))
    assert max(held) == 2 and held[-1] == 0  # only the parts that came before their turn
    with pytest.raises(RuntimeError, match="11 of 12"):
        short = _InOrder()
        for i in range(len(parts) - 1):
            short.add(i, parts[i])
        short.result(len(parts))


@pytest.mark.parametrize("engine", ["threads", "cluster"])
def test_the_executor_hands_every_result_over_and_keeps_none_when_asked(engine, tmp_path):
    import dask

    from ooc_spectral.runtime.cluster import ClusterOptions, compute_engine
    from ooc_spectral.runtime.execution import Executor

    parts = {i: dask.delayed(lambda i: i * i, pure=True)(i) for i in range(6)}
    with compute_engine(ClusterOptions(workers=1, threads_per_worker=2, engine=engine,
                                       quiet=True)) as eng:
        ex = Executor(client=eng.client, local=eng.client is None, threads=eng.threads)
        seen = {}
        assert ex.run("test", parts, on_result=seen.__setitem__, keep=False) == {}
        assert seen == {i: i * i for i in range(6)}
        assert ex.run("test", parts) == {i: i * i for i in range(6)}


def test_a_chunk_functions_results_do_not_share_its_reused_kernel_block(fitted):
    """Pass 2's kernel block is a per-thread buffer reused by the next sub-block: what a
    chunk function returns must not be a view of it (the same results after other
    sub-blocks of other sizes ran in the same thread)."""
    X, d = fitted
    first = chunk_moments(X[:500], d, 0)
    kept = first.to_flat()
    snapshot = {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for k, v in kept.items()}
    for a, b in ((500, 1200), (0, 37), (100, 900)):
        chunk_moments(X[a:b], d, a)
        chunk_cross_moments(X[a:b], d, a, d.size - 4)
    _assert_same(first, from_flat(snapshot))
    _assert_same(chunk_moments(X[:500], d, 0), first)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("block_rows", [None, 300, 257])
def test_moments_on_mkl_by_rows_equal_openblas_by_columns(fitted, block_rows, affine):
    """Where MKL is in use pass 2 computes k(X, D) by rows (C order) in sub-blocks of a
    few MiB, solves it by one dtrsm, takes the mean from the kernel's column sums and
    the residuals and centring piece by piece; on OpenBLAS the Fortran-ordered block by
    the recursive row solve: the same statistic to rounding, whatever the sub-blocks,
    with and without the affine constraint."""
    import dataclasses

    X, d = fitted
    assert d.affine
    d = d if affine else dataclasses.replace(d, affine=False)
    got, ref, orders = _moments_both_ways(X, d, block_rows)
    assert orders == ("C", "F")
    assert got.n == ref.n == len(X)
    # the coordinates of two backward-stable solves differ by up to eps cond(L) |z|; the
    # residuals (1 - |z|^2, k(x, x) = 1 here) by as much in absolute terms
    atol = 64 * np.finfo(float).eps * np.linalg.cond(d.L)
    fa, fb = got.to_flat(), ref.to_flat()
    for key in fa:
        a, b = fa[key], fb[key]
        if isinstance(a, np.ndarray) and a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=0, atol=atol * max(1.0, np.abs(b).max(initial=0)))
        elif isinstance(a, float):
            scale = len(X) if key.startswith("sum") else 1.0
            assert abs(a - b) <= atol * max(scale, abs(b)), (key, a, b)
        else:
            np.testing.assert_array_equal(a, b, err_msg=key)
    np.testing.assert_array_equal(got.m2, got.m2.T)


def _moments_both_ways(X, d, block_rows):
    """``chunk_moments`` on MKL and on OpenBLAS, and the block order each used."""
    from conftest import mkl_backend

    from ooc_spectral._accel.blas import fast_solve_order

    with mkl_backend(False):
        ref, ref_order = chunk_moments(X, d, 0, tol_check=1e-4, block_rows=block_rows), fast_solve_order()
    with mkl_backend(True):
        got, got_order = chunk_moments(X, d, 0, tol_check=1e-4, block_rows=block_rows), fast_solve_order()
    return got, ref, (got_order, ref_order)


@pytest.mark.parametrize("block_rows", [None, 257])
def test_moments_by_rows_at_tol_1e_9_stay_within_eps_cond_l(block_rows):
    """The C order's mean is L^-1 kbar, the F order's the mean of the solved rows: at a
    small tol (cond(L) near 10^7) both stay within 64 eps cond(L) of each other."""
    from test_exactness import uncertified_dictionary

    X = make_swiss_roll(2000, random_state=4)[0]
    # the dictionary the computed residuals select at 1e-9 (a fit refuses this tol: float64
    # cannot certify it on this data)
    d = uncertified_dictionary(X, 0.01, 1e-9)
    cond = np.linalg.cond(d.L)
    assert cond > 1e6  # an ill-conditioned factor, as at small tol
    got, ref, _ = _moments_both_ways(X, d, block_rows)
    atol = 64 * np.finfo(float).eps * cond
    np.testing.assert_allclose(got.mean, ref.mean, rtol=0, atol=atol * np.abs(ref.mean).max())
    np.testing.assert_allclose(got.m2, ref.m2, rtol=0, atol=atol * np.abs(ref.m2).max())
    # the spectrum the eigensolve reads off m2 agrees far more closely than that bound
    top = np.linalg.eigvalsh(ref.m2)[-5:]
    np.testing.assert_allclose(np.linalg.eigvalsh(got.m2)[-5:], top, rtol=1e-10)


@pytest.mark.parametrize("rows", [1, 2, 513])
@pytest.mark.parametrize("kernel", ["rbf", "callable", "exact"])
def test_moments_by_rows_of_few_rows_other_kernels_and_the_exact_path(rows, kernel):
    """The C order on a single row, a partial piece, a callable kernel (the generic
    pairwise_into and its column sums) and the exact path (no factor: the
    coordinates are the kernel rows)."""
    import dataclasses

    from ooc_spectral.core.kernel_choice import make_kernel
    from ooc_spectral.core.model import Dictionary

    rng = np.random.default_rng(rows)
    P, X = rng.standard_normal((40, 3)), rng.standard_normal((rows, 3))
    # a callable Laplacian kernel: full rank, so that the factor stays well conditioned
    k = (make_kernel(lambda x, y: np.exp(-0.5 * np.abs(x - y).sum()))
         if kernel == "callable" else make_kernel("rbf", gamma=0.3))
    M = k(P) + 1e-10 * np.eye(40)
    L = np.linalg.cholesky(M)
    w = np.linalg.solve(L, np.ones(40))
    d = Dictionary(k, P, np.arange(40), k.aux(P), L, w, float(w @ w), True)
    if kernel == "exact":
        d = dataclasses.replace(d, L=None, affine=False)
    got, ref, _ = _moments_both_ways(X, d, 256)
    Z = k(X, P) if kernel == "exact" else np.linalg.solve(L, k(P, X)).T
    np.testing.assert_allclose(got.mean, Z.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.m2, (Z - Z.mean(axis=0)).T @ (Z - Z.mean(axis=0)),
                               rtol=1e-9, atol=1e-9 * max(1.0, np.abs(got.m2).max()))
    np.testing.assert_allclose(got.m2, ref.m2, rtol=1e-9, atol=1e-9 * max(1.0, np.abs(ref.m2).max()))
    assert got.n == ref.n == rows


def test_residuals_without_coordinates_need_what_they_replace(fitted):
    X, d = fitted
    kx = np.ones(3)
    with pytest.raises(ValueError, match="give dhat"):
        d.residuals(None, kx, np.zeros(3))
