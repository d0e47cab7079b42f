"""The level-3 BLAS operations of the passes, on SciPy's OpenBLAS or on Intel MKL.

Pass 2 solves each kernel block against the dictionary's factor
(:func:`solve_lower_transposed`, :func:`solve_lower_rows`) and adds its Gram matrix
to an accumulator (:func:`add_gram_lower`); the kernel block itself takes a thin
product and an exponential (:func:`matmul_nt_into`, :func:`exp_inplace`). On
OpenBLAS each is one of SciPy's BLAS routines called through ctypes with the GIL
released (:mod:`ooc_spectral._accel.ctypes_blas`); where Intel MKL is installed
and not turned off (:func:`mkl`), the same Fortran arguments go to MKL's routine,
sequential on the calling thread. Both libraries' solves are backward stable;
their results agree to rounding.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
from scipy.linalg import solve_triangular

from .ctypes_blas import (_INT_MAX, _blas_call, _fortran_refs, gil_free_dgemm, gil_free_syrk,
                          gil_free_trsm)
from .support import accel_allowed, config_flag, contiguous_float64, intel_cpu, once

__all__ = ["solve_lower_transposed", "solve_lower_rows", "add_gram_lower", "symmetric_from_lower",
           "fast_solve_order", "mkl", "mkl_version", "blas_backend", "exp_inplace", "matmul_nt_into",
           "pass_libraries", "libraries_tag",
           "one_task_at_a_time"]

# --------------------------------------------------------------------------- MKL
#: ``MKL_THREADING_SEQUENTIAL`` of ``mkl_set_threading_layer``
_MKL_SEQUENTIAL = 1
#: The MKL routines pass 2 calls (their ILP64 entry points: 64-bit integers whatever
#: the library's interface layer), and the thread-count call it needs.
_MKL_SYMBOLS = ("dtrsm_64", "dsyrk_64", "dgemm_64", "MKL_Set_Num_Threads_Local",
                "mkl_get_version_string")


#: Paths of the MKL libraries this module loaded first (and made sequential): not one of
#: the BLAS libraries whose threads the passes pin (:func:`blas_thread_counts`).
_OWN_MKL: set[str] = set()
#: ``_handle`` of the MKL libraries this module made sequential: their calls need no
#: ``mkl_set_num_threads_local``, which costs time on every call and more when two
#: threads call at once (docs/measurements.md, "MKL's sequential threading layer").
_SEQUENTIAL_MKL: set[int] = set()


def _mkl_candidates() -> list[str]:
    """Where ``libmkl_rt`` may be: the ``mkl`` wheel's ``<prefix>/lib``, then the loader's path."""
    import ctypes.util
    import glob
    import os
    import sys

    found = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")), reverse=True)
    name = ctypes.util.find_library("mkl_rt")
    return found + ([name] if name else [])


def mkl():
    """Intel MKL's ``libmkl_rt`` as a ctypes library, or None.

    Installed (``pip install "ooc-spectral[mkl]"``, x86-64), on an Intel processor
    (:func:`~ooc_spectral._accel.support.intel_cpu`) unless the dask config
    ``ooc-spectral.mkl`` says otherwise (default ``"auto"``; ``True`` or ``False``, env
    ``DASK_OOC_SPECTRAL__MKL``; read at every call, once per block inside a task's
    :func:`~ooc_spectral._accel.support.accel_for`, so that a change takes effect at the
    next pass), pass 2 solves its
    kernel blocks with MKL's ``dtrsm`` and accumulates them with its ``dsyrk``
    (:func:`solve_lower_transposed` on blocks in the C order, :func:`fast_solve_order`;
    :func:`solve_lower_rows`; :func:`add_gram_lower`): OpenBLAS's ``dtrsm`` runs
    far below its ``dgemm`` rate, MKL's near it (docs/measurements.md, "Intel MKL for
    pass 2's solve"). The scan's block solves (:func:`solve_lower_transposed`) use it
    too. Both libraries' solves are backward stable; results agree to rounding.
    On other processors MKL takes slower paths than OpenBLAS: on an AMD EPYC its
    ``dtrsm`` and ``dsyrk`` ran at 64% of the gemm rate against OpenBLAS's 87% and 96%,
    its ``vmdExp`` at a fifth of NumPy's ``exp``, and pass 2 reached 58% of its floor on
    MKL against 79% on OpenBLAS (docs/measurements.md, "MKL on other processors").

    Each call runs on the calling thread alone: the tasks are the parallelism. When
    this module is the first to load the library (once per process, under a lock),
    its threading layer is set to sequential before any call (no OpenMP runtime is
    started); a library some other package loaded first keeps its own, and each call
    on it runs under ``mkl_set_num_threads_local(1)``, restored after.

    None, too, inside :func:`~ooc_spectral._accel.support.accel_for` a block too small to
    pay for loading the library (a small fit never loads it; issue 38).
    """
    if not config_flag("ooc-spectral.mkl", "auto", auto=intel_cpu) or not accel_allowed():
        return None  # off, or a block too small to pay for loading it (support.accel_for)
    return _load_mkl()


def _open_mkl():
    """Load the first candidate that has :data:`_MKL_SYMBOLS`; sequential if it is ours."""
    import os

    for path in _mkl_candidates():
        name = os.path.basename(path).split(".so")[0]
        try:
            already = _mapped_path(name) is not None
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
            if not all(hasattr(lib, s) for s in _MKL_SYMBOLS):
                continue
        except OSError:
            continue
        if not already:
            lib.MKL_Set_Threading_Layer.restype = ctypes.c_int
            layer = lib.MKL_Set_Threading_Layer(ctypes.c_int(_MKL_SEQUENTIAL))
            _OWN_MKL.add(os.path.realpath(_mapped_path(name) or path))
            if layer == _MKL_SEQUENTIAL:  # the layer in effect, as the call returns it
                _SEQUENTIAL_MKL.add(lib._handle)
        lib.MKL_Set_Num_Threads_Local.restype = ctypes.c_int
        lib.MKL_Set_Num_Threads_Local.argtypes = [ctypes.c_int]
        return lib
    return None


#: :func:`_open_mkl` once per process (the library or None)
_load_mkl = once(_open_mkl)


def _mapped_path(name: str) -> str | None:
    """The path of a library whose file name contains ``name`` mapped in this process
    (``/proc/self/maps``), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and name in fields[5].rsplit("/", 1)[-1]:
                    return fields[5].strip()
    except OSError:
        pass
    return None


def mkl_version() -> str | None:
    """MKL's version string when :func:`mkl` is in use, else None."""
    lib = mkl()
    if lib is None:
        return None
    buf = ctypes.create_string_buffer(256)
    lib.mkl_get_version_string(buf, ctypes.c_int(len(buf)))
    return buf.value.decode(errors="replace").strip()


def _mkl_call(name: str, *args) -> None:
    """``name`` of :func:`mkl` with Fortran's arguments (:func:`_fortran_refs`, integers
    64-bit), on the calling thread alone (ctypes releases the GIL for the call)."""
    _call_mkl(mkl(), name, args)


def _call_mkl(lib, name: str, args) -> None:
    """:func:`_mkl_call` on the library ``lib`` already looked up."""
    refs = _fortran_refs(args, ctypes.c_int64)
    if lib._handle in _SEQUENTIAL_MKL:  # no threads to hold back
        getattr(lib, name)(*refs)
        return
    previous = lib.MKL_Set_Num_Threads_Local(1)
    try:
        getattr(lib, name)(*refs)
    finally:
        lib.MKL_Set_Num_Threads_Local(previous)


def _level3(name: str, scipy_routine, *args) -> None:
    """BLAS routine ``name`` (``"dtrsm"``, ``"dsyrk"``) on MKL where :func:`mkl` is in
    use, else ``scipy_routine`` (its :func:`_gil_free` ctypes function); the same
    Fortran arguments either way."""
    lib = mkl()  # the config is read once per call
    if lib is not None:
        _call_mkl(lib, f"{name}_64", args)
    else:
        _blas_call(scipy_routine, *args)


def blas_backend() -> str:
    """What pass 2's solve and accumulation run on in this process: ``"mkl <version>"``
    or ``"openblas (scipy)"`` (the run's report). The embedded engines' workers share
    this process's installation and dask config; the workers of an external cluster
    decide by their own."""
    version = mkl_version()
    return f"mkl {version}" if version else "openblas (scipy)"


def pass_libraries(entries: int | None) -> dict:
    """What a task of a pass whose block has ``entries`` entries (rows x dictionary points)
    runs on in this process's installation and config: ``{"blas": blas_backend(),
    "compiled_loops": "numba <version>" or None}``. The accelerators (MKL, numba's loops)
    serve only blocks of at least :data:`~ooc_spectral._accel.support.ACCEL_MIN_ENTRIES`
    entries; None: not said (used wherever available). An external cluster's workers
    decide by their own installation and config."""
    from .fused import loops_backend
    from .support import accel_for

    with accel_for(entries):
        return {"blas": blas_backend(),
                "compiled_loops": loops_backend() if accel_allowed() else None}


def libraries_tag(entries: int | None) -> str:
    """A short name of :func:`pass_libraries` for a pass's checkpoint partials: MKL's and
    OpenBLAS's results, and numba's loops' and NumPy's, agree to rounding only, so a pass
    resumed under other libraries (a changed config, another machine, an upgrade)
    recomputes its partials instead of mixing the two into a result neither run gives."""
    import hashlib
    import json

    libs = json.dumps(pass_libraries(entries), sort_keys=True)
    return "l" + hashlib.sha256(libs.encode()).hexdigest()[:8]


def add_gram_lower(acc: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """``acc += Z' Z`` on the lower triangle of ``acc``, in place: one rank-c ``dsyrk``
    with ``beta = 1`` for a Fortran- or C-ordered float64 ``Z`` (c x m) and a
    Fortran-ordered ``acc`` (m x m).

    A task's sub-blocks add their products into one accumulator this way, with no
    m x m temporary per sub-block and without the copy of the triangle that
    ``Z.T @ Z`` makes (NumPy calls the same ``dsyrk``, then mirrors it). The strict
    upper triangle of ``acc`` is left as it was on this path; on the fallback
    (other layouts, no capsule) the whole product is added. Read the result with
    :func:`symmetric_from_lower`.

    Returns
    -------
    ndarray of shape (m, m)
        ``acc`` itself.
    """
    c, m = Z.shape
    if acc.shape != (m, m):
        raise ValueError(f"add_gram_lower: the accumulator is {acc.shape}, expected ({m}, {m})")
    syrk = gil_free_syrk()
    if (c == 0 or m == 0 or Z.dtype != np.float64
            or not (Z.flags.f_contiguous or Z.flags.c_contiguous)
            or acc.dtype != np.float64 or not acc.flags.f_contiguous or not acc.flags.writeable
            or (syrk is None and mkl() is None) or max(c, m) > _INT_MAX):
        acc += Z.T @ Z
        return acc
    if Z.flags.f_contiguous:  # Fortran terms: Z is c x m (leading dimension c); C = Z' Z
        _level3("dsyrk", syrk, b"L", b"T", m, c, 1.0, (Z, 0), c, 1.0, (acc, 0), m)
    else:  # Z's buffer is Z' (m x c, leading dimension m); C = Z' (Z')'
        _level3("dsyrk", syrk, b"L", b"N", m, c, 1.0, (Z, 0), m, 1.0, (acc, 0), m)
    return acc


#: ``vmdExp``'s mode: high accuracy (``VML_HA``, within 1 ulp, as NumPy's ``exp``) and no
#: error handling (``VML_ERRMODE_IGNORE``: an underflow to 0 is the value, not an event).
_VML_HA_IGNORE = 0x2 | 0x100


@functools.lru_cache(maxsize=4)
def _vector_exp(lib):
    """MKL's ``vmdExp_64`` (64-bit integers; not in releases before 2023), or None."""
    return getattr(lib, "vmdExp_64", None)


def exp_inplace(S: np.ndarray) -> np.ndarray:
    """``S = exp(S)`` in place; returns ``S``.

    Where :func:`mkl` is in use, by MKL's vector ``exp`` (``vmdExp``, high-accuracy mode,
    sequential on the calling thread) on a C-contiguous float64 block, else NumPy's.
    Both are within 1 ulp; on this machine they give the same bits (``tests/test_blas.py``).
    MKL's is the faster (docs/measurements.md, "MKL's vector exp").
    """
    lib = mkl()
    vexp = None if lib is None else _vector_exp(lib)
    if vexp is None or S.size == 0 or not contiguous_float64(S, writeable=True):
        with np.errstate(over="ignore"):  # exponentials taken before a clip at 1 may overflow
            return np.exp(S, out=S)
    ptr = ctypes.c_void_p(S.ctypes.data)
    args = (ctypes.c_int64(S.size), ptr, ptr, ctypes.c_int64(_VML_HA_IGNORE))
    if lib._handle in _SEQUENTIAL_MKL:
        vexp(*args)
        return S
    previous = lib.MKL_Set_Num_Threads_Local(1)
    try:
        vexp(*args)
    finally:
        lib.MKL_Set_Num_Threads_Local(previous)
    return S


def one_task_at_a_time() -> bool:
    """True in a dask worker process that runs one task at a time (the embedded cluster's
    workers, ``threads_per_worker=1``); False elsewhere (the threads engine's tasks share
    this process, as do a multi-threaded worker's)."""
    import sys

    if "distributed" not in sys.modules:  # no worker in this process (and no slow import)
        return False
    try:
        from distributed import Worker, get_worker

        # one worker in the process: LocalCluster(processes=False) runs several side by side
        return get_worker().state.nthreads == 1 and len(Worker._instances) == 1
    except (ImportError, ValueError, AttributeError):  # not inside a worker's task
        return False


def matmul_nt_into(A: np.ndarray, B: np.ndarray, out: np.ndarray,
                   use_mkl: bool | None = None) -> np.ndarray:
    """``out = A @ B.T`` for C-ordered float64 ``A`` (r x k), ``B`` (s x k) and ``out``
    (r x s); returns ``out``.

    By MKL's sequential ``dgemm`` on the calling thread where :func:`mkl` is in use and
    ``use_mkl`` (default: :func:`one_task_at_a_time`), else by NumPy's ``matmul``. The
    kernel block's product has k = d + 2 (the augmented rows of
    :class:`~ooc_spectral.core.kernels.RBFKernel`), a thin shape on which MKL runs faster
    than OpenBLAS. Only in a process that runs one task at a time: with two task threads
    in one process, MKL's product between NumPy's elementwise calls on the pieces ran
    slower than NumPy's, for a cause not found (docs/measurements.md, "MKL's thin
    product, one task per process").
    """
    (r, k), s = A.shape, B.shape[0]
    lib = mkl()
    if use_mkl is None:
        use_mkl = lib is not None and one_task_at_a_time()
    if (lib is None or not use_mkl or r == 0 or s == 0 or k == 0 or max(r, s, k) > _INT_MAX
            or out.shape != (r, s) or B.shape[1] != k
            or not (contiguous_float64(A, B) and contiguous_float64(out, writeable=True))):
        return np.matmul(A, B.T, out=out)
    # column-major terms: out' (s x r) = B (s x k, stored as k x s: transposed) times A' (k x r)
    _call_mkl(lib, "dgemm_64", (b"T", b"N", s, r, k, 1.0, (B, 0), k, (A, 0), k, 0.0, (out, 0), s))
    return out


def fast_solve_order() -> str:
    """The order of a c x m kernel block that pass 2's triangular solve is fastest on.

    ``"C"`` where :func:`mkl` is in use: one MKL ``dtrsm`` on the block's rows
    (:func:`solve_lower_transposed`) runs near the ``dgemm`` rate, and a block of a
    few MiB of whole rows (``k(X, D)``, its pieces of rows computed in the cache)
    then keeps the kernel's exponentials, the solve and the passes after it within
    the core's cache. ``"F"`` otherwise: OpenBLAS solves the C order slowly, and the
    transposed block ``k(D, X)`` faster by :func:`solve_lower_rows` (docs/measurements.md,
    "The recursive row solve").
    (Also ``"F"`` where SciPy's BLAS capsules are missing: the C order's solve would
    then fall back to ``solve_triangular`` on OpenBLAS, holding the GIL.)
    """
    return "C" if mkl() is not None and gil_free_trsm() is not None else "F"


def symmetric_from_lower(acc: np.ndarray) -> np.ndarray:
    """The symmetric matrix whose lower triangle is ``acc``'s (a new array)."""
    out = np.tril(acc)
    out += np.tril(acc, -1).T
    return out


def solve_lower_transposed(L: np.ndarray, K: np.ndarray) -> np.ndarray:
    """``K <- K L^-T`` in place, for a lower triangular ``L`` (m x m) and ``K`` (c x m).

    The solve ``L Z' = K'`` by one BLAS-3 triangular solve (backward stable),
    with the GIL released when ``K`` is a C-contiguous, writeable float64 array
    (its buffer is then ``K'`` in column-major order, solved in place) and
    :func:`gil_free_trsm` is available; otherwise by ``solve_triangular`` on
    ``K.T`` with the same result. Where :func:`mkl` is in use, MKL's ``dtrsm`` (the
    same solve to rounding; OpenBLAS's is slow in this layout).

    Returns
    -------
    ndarray of shape (c, m)
        ``K`` itself when solved in place, else a new array.
    """
    c, m = K.shape
    trsm = gil_free_trsm()
    if (trsm is None or K.dtype != np.float64 or not K.flags.c_contiguous
            or not K.flags.writeable or max(c, m) > _INT_MAX or c == 0 or m == 0):
        return solve_triangular(L, K.T, lower=True, overwrite_b=True, check_finite=False).T
    # K's buffer is K' (m x c) in column-major order: L Z' = K' from the left. A
    # C-ordered L is read as it is: its buffer is L' in column-major order, upper
    # triangular, and the solve is with its transpose (no copy of L per block)
    if L.dtype == np.float64 and L.flags.c_contiguous:
        _level3("dtrsm", trsm, b"L", b"U", b"T", b"N", m, c, 1.0, (L, 0), m, (K, 0), m)
    else:
        A = np.asfortranarray(L, dtype=np.float64)
        _level3("dtrsm", trsm, b"L", b"L", b"N", b"N", m, c, 1.0, (A, 0), m, (K, 0), m)
    return K


#: Rows of L solved by one small ``dtrsm`` at the leaves of :func:`solve_lower_rows`,
#: and the alignment of its splits (docs/measurements.md, "The recursive row solve").
SOLVE_LEAF = 32
SOLVE_ALIGN = 8


def solve_lower_rows(L: np.ndarray, KT: np.ndarray, leaf: int = SOLVE_LEAF) -> np.ndarray:
    """``KT <- L^-1 KT`` in place, for a lower triangular ``L`` (m x m) and a C-ordered
    ``KT`` (m x c): the coordinates of c rows, one row of KT per dictionary point.

    Recursive forward substitution: the rows are split in two halves (at a multiple
    of :data:`SOLVE_ALIGN`); the top half is solved, the bottom half updated by one
    matrix product with it (``KT[h:] -= L[h:, :h] KT[:h]``, where most of the flops
    are, at the gemm rate), and the bottom half solved, down to blocks of at most
    ``leaf`` rows, each one triangular solve on contiguous memory (``dtrsm`` from the
    right on the Fortran view of the block). Only triangular solves and products,
    as in LAPACK's level-3 solves: backward stable, and the results agree with one
    ``dtrsm`` to rounding (the order of the sums differs; ``tests/test_blas.py``).
    The BLAS calls are SciPy's ``cython_blas`` routines through ctypes, which
    release the GIL (see :func:`solve_lower_transposed`).

    OpenBLAS's ``dtrsm`` runs at a fraction of the ``dgemm`` rate, and the recursion
    leaves it only ``c m leaf`` of the ``c m^2`` flops, the rest in large products
    (docs/measurements.md, "The recursive row solve"). Where :func:`mkl` is in use,
    the block is solved by one MKL ``dtrsm`` instead.

    Returns
    -------
    ndarray of shape (m, c)
        ``KT`` itself.
    """
    m, c = KT.shape
    if not (KT.dtype == np.float64 and KT.flags.c_contiguous and KT.flags.writeable):
        raise ValueError("solve_lower_rows needs a writeable C-ordered float64 block")
    if np.shape(L) != (m, m):
        raise ValueError(f"solve_lower_rows needs an {m} x {m} factor for a block of {m} rows, "
                         f"got {np.shape(L)}")
    if m == 0 or c == 0:
        return KT
    if mkl() is not None:  # one dtrsm: MKL's runs near its gemm rate
        A = np.asfortranarray(L, dtype=np.float64)
        # KT is, in Fortran terms, K (c x m, leading dimension c): K <- K L^-T
        _mkl_call("dtrsm_64", b"R", b"L", b"T", b"N", c, m, 1.0, (A, 0), m, (KT, 0), c)
        return KT
    trsm, gemm = gil_free_trsm(), gil_free_dgemm()
    if trsm is None or gemm is None or max(c, m) > _INT_MAX:  # BLAS's dimensions are 32-bit here
        trsm = gemm = None
    L = np.ascontiguousarray(L, dtype=np.float64)
    leaf = max(int(leaf), 1)

    def solve_leaf(a: int, e: int) -> None:
        A = np.asfortranarray(L[a:e, a:e])
        if trsm is None:
            KT[a:e] = solve_triangular(A, KT[a:e], lower=True, check_finite=False)
            return
        # KT[a:e] is, in Fortran terms, K[:, a:e] (c x (e - a), leading dimension c)
        _blas_call(trsm, b"R", b"L", b"T", b"N", c, e - a, 1.0, (A, 0), e - a, (KT, a * c), c)

    def update(a: int, h: int, e: int) -> None:
        """``KT[h:e] -= L[h:e, a:h] KT[a:h]``, in place."""
        if gemm is None:
            KT[h:e] -= L[h:e, a:h] @ KT[a:h]
            return
        # In Fortran terms KT is K (c x m, leading dimension c) and L is L' (leading
        # dimension m): K[:, h:e] -= K[:, a:h] (L[h:e, a:h])', the latter the block of
        # L' at row a, column h. No temporary, the GIL released.
        _blas_call(gemm, b"N", b"N", c, e - h, h - a, -1.0, (KT, a * c), c, (L, h * m + a), m,
                   1.0, (KT, h * c), c)

    def solve(a: int, e: int) -> None:
        if e - a <= leaf:
            solve_leaf(a, e)
            return
        h = a + -(-((e - a) // 2) // SOLVE_ALIGN) * SOLVE_ALIGN
        if h >= e:
            h = a + (e - a) // 2
        solve(a, h)
        update(a, h, e)
        solve(h, e)

    solve(0, m)
    return KT


