"""The GIL-free triangular solve of pass 2 (:mod:`ooc_spectral._accel.blas`)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import solve_triangular

from ooc_spectral._accel.blas import solve_lower_transposed
from ooc_spectral._accel.ctypes_blas import gil_free_trsm
from ooc_spectral._accel.threads import longest_gil_stall
from ooc_spectral.core.kernels import RBFKernel


def _factor(m, seed=0, jitter=1e-10):
    """The Cholesky factor of a Gaussian Gram matrix: ill-conditioned like the scan's."""
    rng = np.random.default_rng(seed)
    P = rng.standard_normal((m, 3))
    return np.linalg.cholesky(RBFKernel(gamma=0.5)(P) + jitter * np.eye(m)), rng


def test_the_capsule_is_found_on_this_scipy():
    from ooc_spectral._accel.ctypes_blas import gil_free_dgemm

    assert gil_free_trsm() is not None and gil_free_dgemm() is not None


@pytest.mark.parametrize("c, m", [(1, 1), (1, 7), (5, 1), (257, 64), (2000, 301)])
def test_bitwise_equal_to_solve_triangular_and_in_place(c, m):
    L, rng = _factor(m)
    K = rng.standard_normal((c, m))
    ref = solve_triangular(L, K.T, lower=True, check_finite=False).T
    work = K.copy()
    got = solve_lower_transposed(L, work)
    assert got is work  # solved in place
    if c > 1:
        assert np.array_equal(got, ref)
    else:  # LAPACK solves one right-hand side with trsv, not trsm: the last bits differ
        np.testing.assert_allclose(got, ref, rtol=1e-13, atol=0)
    # and it solves the system: Z L' = K to rounding
    np.testing.assert_allclose(got @ L.T, K, rtol=0, atol=1e-9 * np.abs(K).max())


@pytest.mark.parametrize("layout", ["fortran", "slice", "readonly", "float32"])
def test_other_layouts_take_the_scipy_path_with_the_same_result(layout):
    L, rng = _factor(40)
    K = rng.standard_normal((300, 80))[:, :40].copy()
    ref = solve_triangular(L, K.T, lower=True, check_finite=False).T
    if layout == "fortran":
        arg = np.asfortranarray(K)
    elif layout == "slice":
        big = np.zeros((300, 90))
        big[:, 10:50] = K
        arg = big[:, 10:50]
    elif layout == "readonly":
        arg = K.copy()
        arg.flags.writeable = False
    else:
        arg = K.astype(np.float32)
        ref = solve_triangular(L, arg.astype(np.float64).T, lower=True, check_finite=False).T
    got = solve_lower_transposed(L, arg.copy() if layout == "readonly" else arg)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())


def test_another_thread_runs_during_the_solve():
    """A Python thread spinning beside the solve is never stalled for most of it
    (``solve_triangular`` stalls it for the whole call: ``gil_release.py``)."""
    L, rng = _factor(400, jitter=1e-6)
    K = rng.standard_normal((40_000, 400))
    duration, stall = longest_gil_stall(lambda: solve_lower_transposed(L, K))
    assert duration > 0.02
    assert stall < 0.5 * duration, (stall, duration)


# ------------------------------------------------------------------ the blocked row solve
@pytest.mark.parametrize("leaf", [1, 5, 32])
@pytest.mark.parametrize("c, m", [(1, 1), (3, 7), (5, 64), (257, 65), (2000, 301), (700, 130)])
def test_the_blocked_row_solve_solves_in_place_to_the_accuracy_of_one_trsm(c, m, leaf):
    """``solve_lower_rows`` (products for the off-diagonal blocks, small solves on the
    diagonal, down to ``leaf`` rows) on ill-conditioned Gaussian factors: in place, and
    as close to the exact solution as one ``dtrsm`` is (the residual ``L Z - K`` at the
    same level)."""
    from ooc_spectral._accel.blas import solve_lower_rows

    L, rng = _factor(m)
    K = rng.standard_normal((c, m))
    ref = solve_triangular(L, K.T, lower=True, check_finite=False)  # m x c
    work = np.ascontiguousarray(K.T)
    got = solve_lower_rows(L, work, leaf)
    assert got is work
    scale = np.abs(ref).max()
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6 * scale)  # cond(L) up to ~1e5
    res_ref = np.abs(L @ ref - K.T).max()
    res_got = np.abs(L @ got - K.T).max()
    assert res_got <= 4 * res_ref + 1e-15 * np.abs(K).max(), (res_got, res_ref)


def test_the_blocked_row_solve_refuses_another_layout_and_handles_empty_blocks():
    from ooc_spectral._accel.blas import solve_lower_rows

    L, rng = _factor(10)
    with pytest.raises(ValueError, match="C-ordered"):
        solve_lower_rows(L, np.asfortranarray(rng.standard_normal((10, 30))))
    with pytest.raises(ValueError, match="10 x 10 factor"):  # BLAS would read past it
        solve_lower_rows(np.eye(13), rng.standard_normal((10, 30)))
    assert solve_lower_rows(L, np.empty((10, 0))).shape == (10, 0)


def test_the_blocked_row_solve_without_the_capsules_gives_the_same_result(monkeypatch):
    import ooc_spectral._accel.blas as blas

    L, rng = _factor(150)
    K = np.ascontiguousarray(rng.standard_normal((400, 150)).T)
    fast = blas.solve_lower_rows(L, K.copy())
    monkeypatch.setattr(blas, "gil_free_trsm", lambda: None)
    monkeypatch.setattr(blas, "gil_free_dgemm", lambda: None)
    slow = blas.solve_lower_rows(L, K.copy())
    np.testing.assert_allclose(slow, fast, rtol=0, atol=1e-12 * np.abs(fast).max())


@pytest.mark.parametrize("backend", ["openblas", "mkl"])
def test_another_thread_runs_during_the_blocked_row_solve(backend):
    from conftest import mkl_backend

    from ooc_spectral._accel.blas import solve_lower_rows

    L, rng = _factor(400, jitter=1e-6)
    KT = np.ascontiguousarray(rng.standard_normal((40_000, 400)).T)
    with mkl_backend(backend == "mkl"):
        duration, stall = longest_gil_stall(lambda: solve_lower_rows(L, KT))
    assert duration > 0.02
    assert stall < 0.5 * duration, (stall, duration)


def test_the_dictionarys_coordinates_equal_one_trsm_whatever_the_kernel_blocks_layout():
    """Pass 2 gets a Fortran-ordered kernel block and solves it by rows; a C-ordered one
    goes to one dtrsm: the coordinates, residuals and projections agree to rounding."""
    from sklearn.datasets import make_swiss_roll

    from ooc_spectral.core.scan.blocked import scan_rows
    from ooc_spectral.core.scan.state import DictionaryState

    X = make_swiss_roll(12_000, random_state=0)[0]
    st = DictionaryState(RBFKernel(0.05), 3, affine=True)
    scan_rows(st, X[:8000], np.arange(8000), 1e-4, limit=2000)
    D = st.freeze()
    assert D.size > 150
    B = X[:8000]  # the scanned rows: every one within tol
    K, kx = D.kernel_block(B)
    assert K.flags.f_contiguous and not K.flags.c_contiguous
    Zf = D.solve(K)
    Zc = D.solve(np.ascontiguousarray(K))
    assert Zf.flags.f_contiguous and Zc.flags.c_contiguous
    np.testing.assert_allclose(Zf, Zc, rtol=0, atol=1e-10)
    np.testing.assert_allclose(D.unconstrained_residuals(Zf, kx), D.unconstrained_residuals(Zc, kx),
                               rtol=0, atol=1e-10)
    Y, delta = D.project(B)
    Yc = Zc + np.outer(D.residuals(Zc, kx)[1] / D.beta, D.w)
    np.testing.assert_allclose(Y, Yc, rtol=0, atol=1e-10)
    assert delta.max() <= 1e-4 * (1 + 1e-6)  # the scan's guarantee, through the new layout


# --------------------------------------------------------------------------- the m x m accumulation
@pytest.mark.parametrize("backend", ["openblas", "mkl"])
@pytest.mark.parametrize("order", ["F", "C"])
@pytest.mark.parametrize("c, m", [(1, 1), (7, 3), (500, 64), (1000, 301)])
def test_the_gram_accumulates_in_place_on_the_lower_triangle(c, m, order, backend):
    from conftest import mkl_backend

    with mkl_backend(backend == "mkl"):
        _check_gram_in_place(c, m, order)


def test_the_gram_of_no_columns_adds_nothing():
    from ooc_spectral._accel.blas import add_gram_lower

    acc = np.zeros((0, 0), order="F")
    assert add_gram_lower(acc, np.zeros((5, 0), order="F")).shape == (0, 0)  # no illegal ldc = 0


def _check_gram_in_place(c, m, order="F"):
    from ooc_spectral._accel.blas import add_gram_lower, symmetric_from_lower
    from ooc_spectral._accel.ctypes_blas import gil_free_syrk

    assert gil_free_syrk() is not None
    rng = np.random.default_rng(c + m)
    acc = np.asfortranarray(rng.standard_normal((m, m)))
    start = acc.copy()
    Zs = [np.array(rng.standard_normal((c, m)), order=order) for _ in range(3)]
    for Z in Zs:
        assert add_gram_lower(acc, Z) is acc
    want = start + sum(Z.T @ Z for Z in Zs)
    scale = np.abs(want).max()
    np.testing.assert_allclose(np.tril(acc), np.tril(want), rtol=0, atol=1e-13 * scale)
    np.testing.assert_array_equal(np.triu(acc, 1), np.triu(start, 1))  # left as it was
    sym = symmetric_from_lower(acc)
    np.testing.assert_array_equal(sym, sym.T)
    np.testing.assert_array_equal(np.tril(sym), np.tril(acc))


def test_the_gram_of_other_layouts_takes_numpys_product(monkeypatch):
    import ooc_spectral._accel.blas as blas

    rng = np.random.default_rng(0)
    Z = rng.standard_normal((400, 30))[::2]  # neither C nor F contiguous: the whole product is added
    acc = np.zeros((30, 30), order="F")
    blas.add_gram_lower(acc, Z)
    np.testing.assert_allclose(acc, Z.T @ Z, rtol=1e-14, atol=1e-12)
    monkeypatch.setattr(blas, "gil_free_syrk", lambda: None)
    acc2 = np.zeros((30, 30), order="F")
    blas.add_gram_lower(acc2, np.asfortranarray(Z))
    np.testing.assert_allclose(np.tril(acc2), np.tril(acc), rtol=1e-14, atol=1e-12)
    with pytest.raises(ValueError, match=r"accumulator is \(3, 3\), expected \(30, 30\)"):
        blas.add_gram_lower(np.zeros((3, 3), order="F"), Z)


@pytest.mark.parametrize("backend", ["openblas", "mkl"])
def test_another_thread_runs_during_the_gram_accumulation(backend):
    from conftest import mkl_backend

    from ooc_spectral._accel.blas import add_gram_lower

    rng = np.random.default_rng(0)
    Z = np.asfortranarray(rng.standard_normal((40_000, 400)))
    acc = np.zeros((400, 400), order="F")
    with mkl_backend(backend == "mkl"):
        duration, stall = longest_gil_stall(lambda: add_gram_lower(acc, Z))
    assert duration > 0.02
    assert stall < 0.5 * duration, (stall, duration)


# --------------------------------------------------------------------------- Intel MKL
def test_mkl_solves_and_accumulates_as_openblas_does_to_rounding():
    from conftest import mkl_backend

    from ooc_spectral._accel import blas as _blas

    L, rng = _factor(301)
    KT = rng.standard_normal((301, 2000))
    Z = np.asfortranarray(rng.standard_normal((2000, 301)))
    with mkl_backend(False):
        assert _blas.mkl() is None and _blas.blas_backend() == "openblas (scipy)"
        ref = _blas.solve_lower_rows(L, KT.copy())
        gram = _blas.add_gram_lower(np.zeros((301, 301), order="F"), Z)
    with mkl_backend(True):
        assert _blas.blas_backend().startswith("mkl ")
        got = _blas.solve_lower_rows(L, KT.copy())
        gram_mkl = _blas.add_gram_lower(np.zeros((301, 301), order="F"), Z)
        # a backward-stable solve: the residual at the level of one dtrsm's
        resid = np.abs(L @ got - KT).max() / (np.abs(L).max() * np.abs(got).max())
        assert resid < 1e-13
        np.testing.assert_array_equal(np.triu(gram_mkl, 1), 0.0)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9 * np.abs(ref).max())
    np.testing.assert_allclose(np.tril(gram_mkl), np.tril(gram), rtol=0, atol=1e-13 * np.abs(gram).max())


@pytest.mark.parametrize("value, on", [(False, False), ("False", False), ("no", False), ("off", False),
                                       ("0", False), (True, True), ("True", True)])
def test_mkl_is_off_when_the_config_says_so_at_every_call(value, on):
    import dask

    from conftest import mkl_backend

    from ooc_spectral._accel import blas as _blas

    with mkl_backend(True):  # loaded once; the config decides at each call
        with dask.config.set({"ooc-spectral.mkl": value}):
            assert (_blas.mkl() is not None) is on
            assert (_blas.mkl_version() is not None) is on
            assert _blas.blas_backend().startswith("mkl ") is on


@pytest.mark.parametrize("vendor, on", [("GenuineIntel", True), ("AuthenticAMD", False),
                                        ("HygonGenuine", False), ("", False)])
@pytest.mark.parametrize("setting", ["auto", "AUTO", None])
def test_mkl_by_default_only_on_intel_processors(monkeypatch, vendor, on, setting):
    """``auto`` (also the setting's absence): MKL where the processor is Intel's, OpenBLAS
    elsewhere (on an AMD EPYC MKL's solve, accumulation and exp ran slower than
    OpenBLAS's and NumPy's); True and False still decide on any processor."""
    import dask

    from conftest import mkl_backend

    from ooc_spectral._accel import blas as _blas
    from ooc_spectral._accel import support

    monkeypatch.setattr(support, "cpu_vendor", lambda: vendor)
    with mkl_backend(True):  # installed and loaded
        with dask.config.set({"ooc-spectral.mkl": setting}):
            if setting is None:  # not set at all (the environment is read at import only)
                dask.config.config.get("ooc-spectral", {}).pop("mkl", None)
            assert (_blas.mkl() is not None) is on
            assert _blas.blas_backend().startswith("mkl ") is on
        for forced in (True, False):
            with dask.config.set({"ooc-spectral.mkl": forced}):
                assert (_blas.mkl() is not None) is forced


def test_the_processor_vendor_is_read_from_the_system():
    from ooc_spectral._accel import support

    vendor = support.cpu_vendor()
    assert isinstance(vendor, str) and vendor == support.cpu_vendor()  # read once
    try:
        with open("/proc/cpuinfo") as f:
            named = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("vendor_id")]
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    if not named:
        pytest.skip("/proc/cpuinfo names no vendor on this architecture")
    assert vendor == named[0]
    assert support.intel_cpu() is (named[0] == "GenuineIntel")


def test_mkl_is_loaded_once_and_sequential_under_concurrent_first_calls():
    import threading

    from conftest import mkl_backend

    from ooc_spectral._accel import blas as _blas

    with mkl_backend(True):
        got = []
        threads = [threading.Thread(target=lambda: got.append(_blas.mkl())) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(g) for g in got}) == 1 and got[0] is not None
        _blas.solve_lower_rows(np.eye(3), np.ones((3, 4)))  # a call: the layer's library is loaded
        assert _blas._mapped_path("libmkl_sequential") is not None or not _blas._OWN_MKL
        assert _blas._mapped_path("libiomp5") is None or not _blas._OWN_MKL  # no OpenMP runtime started
        # calls skip the per-call thread pinning only on a library this module made sequential
        assert (got[0]._handle in _blas._SEQUENTIAL_MKL) == bool(_blas._OWN_MKL)


def test_mkl_calls_pin_their_thread_on_a_library_someone_else_loaded(monkeypatch):
    """Where MKL was loaded first by another package (its threading layer not ours to
    set), each call runs under mkl_set_num_threads_local(1), restored after."""
    from conftest import mkl_backend

    from ooc_spectral._accel import blas as _blas

    L, rng = _factor(50)
    K = rng.standard_normal((20, 50))
    x = -rng.random((30, 40))
    with mkl_backend(True):
        lib = _blas.mkl()
        monkeypatch.setattr(_blas, "_SEQUENTIAL_MKL", set())
        calls = []
        real = lib.MKL_Set_Num_Threads_Local
        monkeypatch.setattr(lib, "MKL_Set_Num_Threads_Local", lambda n: calls.append(n) or real(n))
        got = solve_lower_transposed(L, K.copy())
        assert calls[0] == 1 and len(calls) == 2  # pinned to one thread, then restored
        e = _blas.exp_inplace(x.copy())  # the vector exp and the kernel product too
        assert calls[2] == 1 and calls[3] == calls[1] and len(calls) == 4
        prod = _blas.matmul_nt_into(K, K, np.empty((20, 20)), use_mkl=True)
        assert calls[4] == 1 and calls[5] == calls[1] and len(calls) == 6
    np.testing.assert_allclose(got @ L.T, K, rtol=0, atol=1e-9 * np.abs(K).max())
    assert np.all(np.abs(e - np.exp(x)) <= np.spacing(np.exp(x)))
    np.testing.assert_allclose(prod, K @ K.T, rtol=0, atol=1e-13 * np.abs(K).max() ** 2 * 50)


# --------------------------------------------------------------------------- the C-ordered pass 2
@pytest.mark.parametrize("backend", ["openblas", "mkl"])
def test_the_row_solve_reads_a_c_ordered_factor_as_it_is(backend):
    """A C-ordered L is solved with as the transpose of its column-major buffer (no copy):
    the same coordinates as from its Fortran-ordered copy, and only its lower triangle read."""
    from conftest import mkl_backend

    L, rng = _factor(301)
    K = rng.standard_normal((1500, 301))
    Lc = L + np.triu(rng.standard_normal((301, 301)), 1)  # garbage above the diagonal
    with mkl_backend(backend == "mkl"):
        from_c = solve_lower_transposed(Lc, K.copy())
        from_f = solve_lower_transposed(np.asfortranarray(Lc), K.copy())
    if backend == "openblas":
        np.testing.assert_array_equal(from_c, from_f)
    else:
        # MKL takes different kernels for the two layouts (2026.2 gives other bits): each is
        # a backward-stable triangular solve, so each lies within the first-order forward
        # error bound gamma_n |L^-1| |L| |x| of the exact solution (Higham, Thm 8.5)
        n = L.shape[0]
        u = np.finfo(float).eps / 2
        gamma = n * u / (1 - n * u)
        from extended_precision import forward

        exact = forward(L, K.T).T
        bound = gamma * (np.abs(exact) @ np.abs(L).T @ np.abs(np.linalg.inv(L)).T)
        assert np.all(np.abs(from_c - exact) <= 1.01 * bound)
        assert np.all(np.abs(from_f - exact) <= 1.01 * bound)
    np.testing.assert_allclose(from_c @ L.T, K, rtol=0, atol=1e-9 * np.abs(K).max())


def test_the_c_ordered_sub_blocks_hold_a_few_mib_of_kernel_block():
    from ooc_spectral.core.planning import MIN_BLOCK_ROWS, ROW_BLOCK_BYTES, solve_block_rows

    assert solve_block_rows(6990, 300, "F") == 6990  # the F order keeps the planned size
    assert solve_block_rows(6990, 300, "C") == ROW_BLOCK_BYTES // (8 * 300) == 1747
    assert solve_block_rows(2621, 800, "C") == 655
    assert solve_block_rows(1000, 300, "C") == 1000  # never above the planned size
    assert solve_block_rows(100_000, 20_000, "C") == MIN_BLOCK_ROWS
    assert solve_block_rows(0, 300, "C") == 1
