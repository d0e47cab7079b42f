"""The one-pass loops of pass 2 (``ooc_spectral._accel.fused``, compiled by numba) and MKL's
vector ``exp`` and kernel product (``ooc_spectral._accel.blas``) against the NumPy calls they
replace: the same values to rounding, the same moments, and the fallbacks where they
do not apply."""

from __future__ import annotations

import dask
import numpy as np
import pytest

from conftest import mkl_backend
from ooc_spectral._accel import blas as _blas, fused as _fused
from ooc_spectral._accel.support import once
from ooc_spectral.core.pass2 import chunk_moments
from ooc_spectral.core.kernels import RBFKernel
from ooc_spectral.core.model import Dictionary

numba = pytest.importorskip("numba")


def numba_off():
    return dask.config.set({"ooc-spectral.numba": False})


def test_the_compiled_loops_are_used_where_numba_is_installed_and_not_turned_off():
    assert _fused.numba_loops() is not None
    with numba_off():
        assert _fused.numba_loops() is None
    with dask.config.set({"ooc-spectral.numba": "false"}):  # as the environment gives it
        assert _fused.numba_loops() is None


@pytest.mark.parametrize("with_w", [True, False])
@pytest.mark.parametrize("shape", [(1747, 300), (3, 1), (1, 7), (513, 93)])
def test_centre_rows_compiled_equals_numpy(shape, with_w):
    rng = np.random.default_rng(shape[0] + 7 * shape[1])
    Z0 = rng.standard_normal(shape) * 10.0 + 3.0
    mean, w = rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
    Z1, Z2 = Z0.copy(), Z0.copy()
    sq1, zw1 = _fused.centre_rows(Z1, mean, w if with_w else None)
    with numba_off():
        sq2, zw2 = _fused.centre_rows(Z2, mean, w if with_w else None)
    np.testing.assert_array_equal(Z1, Z0 - mean)  # the centring is the same subtraction
    np.testing.assert_array_equal(Z2, Z0 - mean)
    np.testing.assert_allclose(sq1, np.sum(Z0 * Z0, axis=1), rtol=1e-13)
    np.testing.assert_allclose(sq1, sq2, rtol=1e-13)
    if with_w:
        scale = np.abs(Z0) @ np.abs(w)  # the products' rounding is relative to this
        assert np.all(np.abs(zw1 - Z0 @ w) <= 1e-14 * scale)
        assert np.all(np.abs(zw1 - zw2) <= 1e-14 * scale)
    else:
        assert zw1 is None and zw2 is None


def test_centre_rows_of_a_block_it_cannot_compile_for_falls_back_to_numpy():
    rng = np.random.default_rng(3)
    Z0 = rng.standard_normal((40, 12))
    mean, w = rng.standard_normal(12), rng.standard_normal(12)
    F = np.asfortranarray(Z0)  # not C-contiguous: NumPy's calls
    sq, zw = _fused.centre_rows(F, mean, w)
    np.testing.assert_array_equal(F, Z0 - mean)
    np.testing.assert_allclose(sq, np.sum(Z0 * Z0, axis=1), rtol=1e-14)
    np.testing.assert_allclose(zw, Z0 @ w, rtol=1e-12, atol=1e-13)
    Z = Z0.copy()
    sq, _ = _fused.centre_rows(Z, mean.astype(np.float32), None)  # a float32 mean
    np.testing.assert_allclose(Z, Z0 - mean.astype(np.float32), rtol=0, atol=0)


def test_clip_unit_col_sums_compiled_equals_numpy():
    rng = np.random.default_rng(5)
    S0 = np.exp(rng.standard_normal((700, 300)) * 0.1 - 0.05)  # about half above 1
    S0[3, :] = 1.0 + 2**-52  # the rounding the clip is for
    assert (S0 > 1).mean() > 0.3
    S1, S2 = S0.copy(), S0.copy()
    c1, c2 = np.full(300, 2.5), np.full(300, 2.5)  # the sums are added to what is there
    _fused.clip_unit_col_sums(S1, c1)
    with numba_off():
        _fused.clip_unit_col_sums(S2, c2)
    np.testing.assert_array_equal(S1, np.minimum(S0, 1.0))
    np.testing.assert_array_equal(S2, np.minimum(S0, 1.0))
    assert S1.max() == 1.0
    np.testing.assert_allclose(c1, 2.5 + np.minimum(S0, 1.0).sum(axis=0), rtol=1e-14)
    np.testing.assert_allclose(c1, c2, rtol=1e-14)


@pytest.mark.parametrize("mkl", [True, False])
def test_the_rbf_block_and_its_column_sums_equal_the_clipped_exponentials(mkl):
    """The exponentials first and the clip at 1 after them (the pass 2 form) give the
    block that the clip of the exponent at 0 gives, bit for bit, and no value above 1
    (an identical row's exponent may round either side of 0: at most 1 either way)."""
    rng = np.random.default_rng(11)
    X = rng.standard_normal((1000, 7)) * 3.0 + 100.0  # large norms: the exponent rounds above 0
    Y = np.vstack([X[:5], rng.standard_normal((295, 7)) * 3.0 + 100.0])
    k = RBFKernel(gamma=0.05)
    with mkl_backend(mkl):
        want = k.pairwise(X, Y)  # exp(min(s, 0)), piece by piece
        out, sums = np.empty((1000, 300)), np.empty(300)
        k.pairwise_into(out, X, Y, k.aux(X), k.aux(Y), col_sums=sums)
    np.testing.assert_array_equal(out, want)
    assert np.all(out[np.arange(5), np.arange(5)] >= 1.0 - 1e-11)
    assert out.max() <= 1.0
    np.testing.assert_allclose(sums, want.sum(axis=0), rtol=1e-13)
    d2 = ((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1)  # the definition, directly
    np.testing.assert_allclose(out, np.exp(-0.05 * d2), rtol=1e-9, atol=1e-12)


def test_mkl_vector_exp_is_within_one_ulp_of_numpys_and_silent_on_underflow(capfd):
    with mkl_backend():
        rng = np.random.default_rng(2)
        x = np.concatenate([-rng.random(100_000) * 50, [0.0, -0.0, -1e-300, -708.4, -745.2,
                                                        -800.0, -1e10]])
        y = x.copy()
        out = _blas.exp_inplace(y)
        assert out is y
    ref = np.exp(x)
    assert np.all(np.abs(y - ref) <= np.spacing(ref))
    assert y[-7] == 1.0 and y[-6] == 1.0 and y[-5] == 1.0
    assert y[-2] == 0.0 and y[-1] == 0.0
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_exp_inplace_falls_back_to_numpy_off_mkl_and_for_other_blocks():
    x = -np.random.default_rng(0).random((50, 8))
    for on in (True, False):
        with mkl_backend(on):
            F = np.asfortranarray(x)
            np.testing.assert_array_equal(_blas.exp_inplace(F), np.exp(x))
            f32 = x.astype(np.float32)
            np.testing.assert_array_equal(_blas.exp_inplace(f32), np.exp(x.astype(np.float32)))
            e = np.empty((0, 3))
            assert _blas.exp_inplace(e).shape == (0, 3)


@pytest.mark.parametrize("shape", [(437, 34, 300), (1, 3, 1), (64, 18, 800), (5, 1, 2)])
def test_mkl_kernel_product_equals_numpys(shape):
    r, k, s = shape
    rng = np.random.default_rng(r + k + s)
    A, B = rng.standard_normal((r, k)), rng.standard_normal((s, k))
    with mkl_backend():
        out = np.full((r, s), np.nan)
        got = _blas.matmul_nt_into(A, B, out, use_mkl=True)
    assert got is out
    scale = np.abs(A) @ np.abs(B).T
    assert np.all(np.abs(out - A @ B.T) <= 1e-14 * scale)
    with mkl_backend():  # a transposed B, as a caller might pass: NumPy's matmul
        out2 = np.empty((r, s))
        _blas.matmul_nt_into(A, np.asfortranarray(B), out2, use_mkl=True)
    assert np.all(np.abs(out2 - A @ B.T) <= 1e-14 * scale)


def _in_task():
    from ooc_spectral._accel import blas as _blas

    return _blas.one_task_at_a_time()


def test_mkl_multiplies_the_kernel_block_only_in_processes_running_one_task_at_a_time(client):
    """Two task threads of one process slowed MKL's product 1.8-2x (``matmul_nt_into``):
    it is used in single-threaded worker processes only, as the embedded cluster's."""
    from distributed import LocalCluster, Client

    assert _blas.one_task_at_a_time() is False  # this process: the threads engine's tasks
    assert client.submit(_in_task, pure=False).result() is True  # threads_per_worker=1
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=":0", memory_limit="1GiB") as two, Client(two) as c2:
        assert c2.submit(_in_task, pure=False).result() is False
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,  # two in one process
                      dashboard_address=":0") as inproc, Client(inproc) as c3:
        assert c3.submit(_in_task, pure=False).result() is False


def _dictionary(m, d, gamma, affine, seed=0):
    """m Gaussian points with their Cholesky factor (and ``w = L^-1 1`` when affine)."""
    P = np.random.default_rng(seed).standard_normal((m, d))
    k = RBFKernel(gamma=gamma)
    L = np.linalg.cholesky(k(P) + 1e-10 * np.eye(m))
    w = np.linalg.solve(L, np.ones(m))
    return Dictionary(kernel=k, points=P, indices=np.arange(m), aux=k.aux(P), L=L, w=w,
                      beta=float(w @ w), affine=affine)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("mkl", [True, False])
def test_chunk_moments_with_the_compiled_loops_equal_numpys(mkl, affine):
    """Pass 2's statistic of a chunk in sub-blocks: the compiled loops (and on MKL its
    exp and kernel product) against NumPy's calls, to rounding."""
    rng = np.random.default_rng(4)
    D = _dictionary(120, 9, 0.08, affine)
    X = (rng.standard_normal((9000, 9)) * 1.5).astype(np.float32)
    with mkl_backend(mkl):
        a = chunk_moments(X, D, 100, block_rows=2000)
        with numba_off():
            b = chunk_moments(X, D, 100, block_rows=2000)
    assert a.n == b.n == 9000
    np.testing.assert_allclose(a.mean, b.mean, rtol=0, atol=1e-14 * np.abs(b.mean).max())
    np.testing.assert_allclose(a.m2, b.m2, rtol=0, atol=1e-12 * np.abs(b.m2).max())
    assert a.certificate.argmax == b.certificate.argmax
    assert a.certificate.max_delta == pytest.approx(b.certificate.max_delta, rel=1e-12, abs=0)
    assert a.sq == pytest.approx(b.sq, rel=1e-12, abs=0)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 7, 8, 9])
def test_clip_unit_dot_compiled_equals_numpy(p):
    rng = np.random.default_rng(p)
    S0 = np.exp(rng.standard_normal((333, 800)) * 0.1 - 0.05)  # about half above 1
    G = np.asfortranarray(rng.standard_normal((800, p)))
    want = np.minimum(S0, 1.0) @ G
    scale = np.minimum(S0, 1.0) @ np.abs(G)
    got = _fused.clip_unit_dot(S0.copy(), G, np.empty((333, p)))
    with numba_off():
        ref = _fused.clip_unit_dot(S0.copy(), G, np.empty((333, p)))
    assert np.all(np.abs(got - want) <= 1e-14 * scale)
    assert np.all(np.abs(ref - want) <= 1e-14 * scale)
    # a C-ordered G (as a caller might pass) takes NumPy's product: the same values
    got_c = _fused.clip_unit_dot(S0.copy(), np.ascontiguousarray(G), np.empty((333, p)))
    assert np.all(np.abs(got_c - want) <= 1e-14 * scale)


@pytest.mark.parametrize("mkl", [True, False])
def test_the_rbf_kernel_times_g_in_pieces_equals_the_whole_block_times_g(mkl):
    """Pass 3's ``k(X, D) @ G``, piece by piece through the compiled clip-and-product,
    against the whole kernel block times G; no kernel value above 1."""
    rng = np.random.default_rng(8)
    Y = rng.standard_normal((800, 5)) * 2.0 + 50.0
    X = np.vstack([Y[:3], rng.standard_normal((5000, 5)) * 2.0 + 50.0])
    G = rng.standard_normal((800, 2))
    k = RBFKernel(gamma=0.2)
    with mkl_backend(mkl):
        got = k.pairwise_dot(X, Y, G, None, k.aux(Y))
        K = k.pairwise(X, Y)
    want = K @ G
    assert np.all(np.abs(got - want) <= 1e-13 * (K @ np.abs(G)))
    assert np.all(K[np.arange(3), np.arange(3)] >= 1.0 - 1e-11) and K.max() <= 1.0


def test_the_report_names_the_loops_without_importing_numba():
    import subprocess
    import sys

    code = ("import sys; from ooc_spectral._accel.fused import loops_backend; "
            "print(loops_backend(), 'numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["numba", numba.__version__, "False"]
    with numba_off():
        assert _fused.loops_backend() is None


class _Spy:
    """The compiled loops, each call counted."""

    def __init__(self, loops):
        self.loops, self.calls = loops, {}

    def __getattr__(self, name):
        fn = getattr(self.loops, name)

        def counted(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args)
        return counted


def test_pass_2_and_pass_3_take_the_compiled_loops(monkeypatch):
    """Not only the same values: the loops are the path taken (C order on MKL), for
    pass 2's kernel block, its coordinates, and pass 3's product with G."""
    spy = _Spy(_fused.numba_loops())
    monkeypatch.setattr(_fused, "numba_loops", lambda: spy)
    rng = np.random.default_rng(6)
    D = _dictionary(50, 4, 0.3, affine=True)
    X = rng.standard_normal((3000, 4)).astype(np.float32)
    with mkl_backend():
        chunk_moments(X, D, 0, block_rows=1000)
    assert spy.calls.get("clip_unit_col_sums", 0) >= 3 and spy.calls.get("centre_rows_w", 0) >= 3
    D0 = _dictionary(50, 4, 0.3, affine=False)
    with mkl_backend():
        chunk_moments(X, D0, 0, block_rows=1000)
    assert spy.calls.get("centre_rows", 0) >= 3
    G = rng.standard_normal((50, 2))
    D.kernel.pairwise_dot(X.astype(np.float64), D.points, G, None, D.aux)
    assert spy.calls.get("clip_unit_dot", 0) >= 1


def test_read_only_or_misshapen_inputs_take_numpys_path_with_the_same_values():
    rng = np.random.default_rng(12)
    Z0 = rng.standard_normal((30, 10))
    mean, w = rng.standard_normal(10), rng.standard_normal(10)
    mean.flags.writeable = w.flags.writeable = False  # e.g. a memory-mapped dictionary
    Z = Z0.copy()
    sq, zw = _fused.centre_rows(Z, mean, w)
    np.testing.assert_array_equal(Z, Z0 - mean)
    np.testing.assert_allclose(zw, Z0 @ w, rtol=1e-12, atol=1e-13)
    Z = Z0.copy()
    _fused.centre_rows(Z, np.array([0.5]), None)  # broadcast, as NumPy does: no read past it
    np.testing.assert_array_equal(Z, Z0 - 0.5)
    S0 = np.exp(rng.standard_normal((20, 10)) * 0.1)
    G = np.asfortranarray(rng.standard_normal((10, 2)))
    G.flags.writeable = False
    got = _fused.clip_unit_dot(S0.copy(), G, np.empty((20, 2)))
    np.testing.assert_allclose(got, np.minimum(S0, 1.0) @ G, rtol=1e-13)
    k = RBFKernel(gamma=0.5)
    X, Y = rng.standard_normal((40, 3)), rng.standard_normal((10, 3))
    Gc = rng.standard_normal((10, 1))
    Gc.flags.writeable = False
    np.testing.assert_allclose(k.pairwise_dot(X, Y, Gc), k.pairwise(X, Y) @ Gc, rtol=1e-12)


def test_loops_that_cannot_be_loaded_fall_back_to_numpy_with_one_warning(monkeypatch, caplog):
    """numba installed but its loops unusable here (e.g. no writable cache: numba raises
    at import): one warning, then NumPy's calls, the same values."""
    import importlib.abc
    import logging
    import sys

    import ooc_spectral._accel

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "ooc_spectral._accel.fused_numba":
                raise RuntimeError("cannot cache function 'centre_rows_w': no locator available")
            return None

    monkeypatch.delitem(sys.modules, "ooc_spectral._accel.fused_numba", raising=False)
    monkeypatch.delattr(ooc_spectral._accel, "fused_numba", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Refuse(), *sys.meta_path])
    monkeypatch.setattr(_fused, "_loops", once(_fused._import_loops))
    with caplog.at_level(logging.WARNING, logger="ooc_spectral._accel.fused"):
        assert _fused.numba_loops() is None
        assert _fused.numba_loops() is None
    warnings = [r for r in caplog.records if "compiled loops are not available" in r.message]
    assert len(warnings) == 1 and "no locator available" in warnings[0].message
    assert _fused.loops_backend() is None  # the report does not claim them
    Z0 = np.random.default_rng(1).standard_normal((8, 5))
    Z = Z0.copy()
    sq, _ = _fused.centre_rows(Z, np.ones(5), None)
    np.testing.assert_allclose(sq, (Z0 ** 2).sum(axis=1), rtol=1e-14)


def test_numba_disable_jit_means_numpys_calls(monkeypatch):
    """Under NUMBA_DISABLE_JIT the loops would run as Python (thousands of times slower):
    NumPy's calls are taken and the report names no loops."""
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "1")
    assert _fused.numba_loops() is None and _fused.loops_backend() is None
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "0")
    assert _fused.numba_loops() is not None


def test_exponentials_before_the_clip_do_not_warn_or_raise_on_overflow():
    """Near points at huge norms: the exponent rounds far above 0, its exponential
    overflows before the clip at 1; no warning (nor an error under seterr raise), and
    the kernel values those points have (1, by the clip)."""
    X = np.array([[1.7e18], [1.7e18 + 256.0], [1.7e18 + 512.0]])
    k = RBFKernel(gamma=1e-4)
    exponent = k._exponent_of_rows(X, X, k.aux(X), k.aux(X))(0, 3, np.empty((3, 3)))
    assert exponent.max() > 710  # exp overflows there
    out, sums = np.empty((3, 3)), np.empty(3)
    for mkl in (False, True):
        with mkl_backend(mkl), np.errstate(over="raise"):
            k.pairwise_into(out, X, X, k.aux(X), k.aux(X), col_sums=sums)
            dotted = k.pairwise_dot(X, X, np.ones((3, 1)), None, k.aux(X))
        np.testing.assert_array_equal(out, k.pairwise(X, X))
        assert out.max() <= 1.0 and np.all(np.isfinite(out)) and np.all(np.isfinite(dotted))


def _moments_in_worker(X, D):
    from ooc_spectral._accel import blas as _blas
    from ooc_spectral.core import kernels
    from ooc_spectral.core.pass2 import chunk_moments

    used = []
    real = kernels.matmul_nt_into

    def spy(A, B, out, use_mkl=None):
        used.append(bool(use_mkl) and _blas.mkl() is not None)
        return real(A, B, out, use_mkl)

    kernels.matmul_nt_into = spy
    try:
        return chunk_moments(X, D, 0, block_rows=1000), any(used)
    finally:
        kernels.matmul_nt_into = real


def test_mkl_kernel_product_in_a_single_task_worker_gives_the_same_moments():
    """The one path the test process never takes: MKL's product inside a worker process
    that runs one task at a time (the embedded cluster's), for values, against this
    process's NumPy product."""
    from distributed import Client, LocalCluster

    rng = np.random.default_rng(21)
    D = _dictionary(80, 6, 0.2, affine=True)
    X = (rng.standard_normal((4000, 6)) * 1.3).astype(np.float32)
    with mkl_backend():
        here = chunk_moments(X, D, 0, block_rows=1000)
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                          dashboard_address=":0", memory_limit="1GiB") as cl, Client(cl) as c:
            there, on_mkl = c.submit(_moments_in_worker, X, D, pure=False).result()
    assert on_mkl  # the worker took MKL's product
    np.testing.assert_allclose(there.mean, here.mean, rtol=0, atol=1e-14 * np.abs(here.mean).max())
    np.testing.assert_allclose(there.m2, here.m2, rtol=0, atol=1e-12 * np.abs(here.m2).max())
    assert there.certificate.argmax == here.certificate.argmax
    assert there.certificate.max_delta == pytest.approx(here.certificate.max_delta, rel=1e-12, abs=0)
