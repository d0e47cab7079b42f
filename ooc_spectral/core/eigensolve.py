"""The m x m eigensolve, in the client process, and the map it yields.

From the statistics of pass 2 (see :mod:`ooc_spectral.core.pass2`):

additive (kernel PCA, Proposition 2)
    ``C = sum (z - zbar)(z - zbar)'`` over the coordinates ``z_t = L^-1 k_t`` of
    the *orthogonal* projection of each row on the dictionary's span (pass 2
    sums them directly; see below); ``C W = W Lambda``. The training embedding
    is ``e_t = (z_t - zbar) W``: kernel PCA's projections (``sqrt(lambda_k)``
    times the unit eigenvector of the centred Gram matrix), the scale of
    scikit-learn's ``KernelPCA.fit_transform``; ``Lambda`` are the eigenvalues
    of the centred Gram matrix (scikit-learn's ``eigenvalues_``).

    **Why the orthogonal projection, and why coordinates.** Write
    ``phi(x_t) = p_t + r_t`` with ``p_t`` the orthogonal projection on the span
    and ``r_t`` orthogonal to it. Centring keeps ``p_t - pbar`` in the span and
    ``r_t - rbar`` orthogonal to it, so the exact centred Gram matrix is
    ``K_c = Z_c Z_c' + R_c`` with ``R_c`` positive semi-definite of trace at most
    ``sum_t dhat_t`` (``dhat_t = |r_t|^2``, the unconstrained residual, never
    above the paper's affine ``delta_t``). By Weyl's inequalities every exact
    eigenvalue lies in ``[lambda_i, lambda_i + sum_t dhat_t]``
    (:func:`eigenvalue_error_bound`). The paper's affine constraint still
    decides which rows enter the dictionary; the affine projection it also
    defines is never closer than the orthogonal one, and in a finite-dimensional
    feature space (linear, polynomial kernels) it cannot reach the rows that are
    in the span but not in the affine hull of the dictionary. The moments are
    taken on the coordinates, not on the kernel rows: mapping kernel-space
    moments by ``L^-1 C_K L^-T`` squares the condition number of L, which at
    small tol gives eigenvalues the exact spectrum does not have.
divisive, exact degrees (spectral clustering / Laplacian eigenmaps)
    ``d_t = y_t . s`` with ``s = sum y``; ``S = sum y y' / d``; ``S W = W Lambda``.
    The unit eigenvectors of ``D^-1/2 K D^-1/2`` are
    ``v_k = (y_t / sqrt(d_t)) w_k / sqrt(lambda_k)``; the first (eigenvalue 1,
    proportional to ``sqrt(d)``) is trivial and dropped by default.
divisive, subset degrees
    the kernel was normalized before the scan; ``S = sum y y'`` and
    ``v_k = y_t w_k / sqrt(lambda_k)``. The Gram matrix of that kernel is
    ``n D^-1/2 K D^-1/2``, so the eigenvalues reported are ``lambda / n``.

Eigenvectors come back in descending order of eigenvalue with a deterministic
sign: in each column of W the entry of largest magnitude is positive.

:class:`SpectralMap` is what pass 3 and ``transform`` apply to rows of X: the
Nyström formula of Bengio et al. (eqs. 8-12) in this basis, which on a training
row gives back its training embedding.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import eigh

from ..exceptions import DictionaryError, NumericalBreakdownError
from .model import Dictionary, SpectralMap
from .rounding import U, gamma
from .statistics import Certificate, Degrees, Gram, Moments, RowSums

__all__ = ["SpectralMap", "top_eigenpairs", "sorted_eigenpairs", "solve_additive",
           "spectrum_allowance", "summation_depth", "accumulation_error",
           "solve_divisive", "solve_exact", "solve_exact_divisive", "check_spectrum", "eigenvalue_error_bound",
           "check_n_components", "spent_directions"]


def fix_signs(V: np.ndarray) -> np.ndarray:
    """``V`` with each column's largest-magnitude entry positive (deterministic signs),
    as a new C-ordered array (the layout a saved model loads with, so that products
    with it round identically before and after a save)."""
    big = np.argmax(np.abs(V), axis=0)
    signs = np.sign(V[big, np.arange(V.shape[1])])
    signs[signs == 0] = 1.0
    return np.ascontiguousarray(V * signs)


def top_eigenpairs(A: np.ndarray, k: int, *, overwrite: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest eigenpairs of the symmetric ``A``, descending, signs fixed.

    With ``overwrite`` the exactly symmetric ``A`` is reduced in place (LAPACK's
    ``dsyevr`` on its transpose, a Fortran-ordered view, without the copy it makes
    of a C-ordered array): the peak memory is ``A`` itself plus ``O(n k)``, for the
    baselines' n x n Gram matrices. Otherwise ``A`` is symmetrized into a copy.
    """
    m = A.shape[0]
    if overwrite:
        vals, vecs = eigh(A.T, subset_by_index=[m - k, m - 1], driver="evr", overwrite_a=True,
                          check_finite=False)
    else:
        vals, vecs = eigh(0.5 * (A + A.T), subset_by_index=[m - k, m - 1], driver="evr")
    return vals[::-1].copy(), fix_signs(vecs[:, ::-1])


#: The exact path finds its top eigenpairs by Lanczos (ARPACK) when at most this
#: fraction of the spectrum is wanted and the matrix has at least LANCZOS_MIN_ROWS rows.
LANCZOS_MAX_FRACTION = 0.1
LANCZOS_MIN_ROWS = 500
#: Lanczos gives way to LAPACK after about this many products with the matrix per row.
LANCZOS_MAX_PRODUCTS = 0.25


def dense_top_eigenpairs(K: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest eigenpairs of the symmetric ``n x n`` matrix ``K``, ascending.

    A few eigenpairs of a large matrix come from implicitly restarted Lanczos
    (ARPACK, ``tol=0``: Ritz residuals at rounding, ``||K v - lambda v|| <= eps |lambda|``),
    which needs only products with ``K``; the dense LAPACK solve spends most of its time
    reducing all of ``K`` to tridiagonal form. ARPACK's start vector is seeded, so the
    result is deterministic. When ARPACK has not converged after about ``n / 4`` products
    (:data:`LANCZOS_MAX_PRODUCTS`: the cost of the dense solve's reduction is about
    ``2 n / 3`` of them; a tight cluster at the top, as the normalized kernel of
    well-separated clusters has, took thousands), or when many pairs are wanted,
    LAPACK's ``evr`` (falling back to ``evd`` when it misses a tight cluster).
    """
    n = K.shape[0]
    if n >= LANCZOS_MIN_ROWS and k <= LANCZOS_MAX_FRACTION * n:
        from scipy.sparse.linalg import ArpackNoConvergence, eigsh

        v0 = np.random.default_rng(0).standard_normal(n)
        ncv = min(n, max(2 * k + 1, 20))
        # the first iteration takes ncv products, each restart ncv - k
        restarts = max(3, int(LANCZOS_MAX_PRODUCTS * n) // max(ncv - k, 1))
        try:
            vals, V = eigsh(K, k=k, which="LA", v0=v0, tol=0.0, ncv=ncv, maxiter=restarts)
        except ArpackNoConvergence:
            pass
        else:
            order = np.argsort(vals)
            return vals[order], V[:, order]
    vals, V = eigh(K, subset_by_index=[n - k, n - 1], driver="evr", check_finite=False)
    if vals.shape[0] != k:  # LAPACK's evr can miss a highly degenerate cluster
        vals, V = eigh(K, driver="evd", check_finite=False)
        vals, V = vals[n - k:], V[:, n - k:]
    return vals, V


def spent_directions(affine: bool, mode: str, drop_first: bool) -> int:
    """Directions of the m-dimensional projection not available as components.

    Kernel PCA uses the orthogonal projection, whose centred coordinates span up
    to m directions; the divisive embedding drops the trivial eigenvector.
    """
    if mode == "additive":
        return 0
    return 1 if drop_first else 0


def check_n_components(dictionary_size: int, n_components: int, spent: int = 1) -> None:
    """Raise :class:`DictionaryError` unless ``n_components + spent <= dictionary_size``.

    ``spent`` is :func:`spent_directions`: with the defaults (affine kernel PCA,
    or divisive with the trivial eigenvector dropped) ``n_components`` must be
    below ``m``.
    """
    m = int(dictionary_size)
    if n_components + spent > m:
        bound = "below" if spent else "at most"
        raise DictionaryError(
            f"n_components={n_components} is not {bound} the dictionary size ({m} points); "
            f"lower n_components to at most {max(m - spent, 0)}, or grow the dictionary with a "
            "smaller tol, a larger gamma, or dictionary_size > n_components"
        )


def summation_depth(n_rows: int, task_rows: int | None = None, tasks: int | None = None) -> int:
    """How many roundings can touch one entry of pass 2's m x m sums: a task's rows (the
    products of its sub-blocks and their pooled updates), then the tree over tasks and
    the fold over segments. Without the plan, every row (any order of summation)."""
    if task_rows is None or tasks is None:
        return int(n_rows)
    return int(min(n_rows, 2 * int(task_rows) + 4 * (int(tasks) + 64)))


def accumulation_error(sums: RowSums, depth: int) -> float:
    """A bound on ``||C~ - C||_2``, C the exact centred sum of the rows' computed
    coordinates: each entry is a sum of at most ``depth`` rounded terms of
    ``|z_c||z_c|'`` (Higham 3.1), whose 2-norm is at most ``sum |z - mean|^2 <= 4 sum |z|^2``
    for any computed mean. ``sum |z|^2`` is pass 2's (``sum_sq``) where measured, else its
    bound ``sum k(x, x)``."""
    scale = float(sums.sum_sq) if sums.certified else float(sums.sum_kx)
    return gamma(depth + 4) * 4.0 * abs(scale)


def eigenvalue_error_bound(sums: RowSums, dictionary_size: int) -> float:
    """Width of Weyl's interval: each exact eigenvalue is in ``[lambda_i, lambda_i + b]``
    up to the spectrum's rounding (:func:`spectrum_allowance`).

    ``b`` bounds the trace of the residuals' centred Gram matrix, ``<= sum_t r_t`` over
    the rows' squared distances to the dictionary's span: with certified sums
    (:class:`~ooc_spectral.core.rounding.FactorRounding`), ``sum_dhat`` is already the
    sum of upper bounds of those, rounding included; without, the computed ``dhat``
    plus ``2 (m + 2) eps sum k(x, x)``.
    """
    if sums.certified:
        return float(sums.sum_dhat)
    eps = np.finfo(np.float64).eps
    return float(sums.sum_dhat) + 2.0 * (dictionary_size + 2) * eps * float(sums.sum_kx)


def spectrum_allowance(dictionary: Dictionary, C: np.ndarray, smap: SpectralMap, sums: RowSums,
                       depth: int) -> tuple[np.ndarray, np.ndarray]:
    """The rounding allowances ``(lower, upper)`` of the computed eigenvalues: every exact
    eigenvalue of the centred Gram matrix is in
    ``[lambda_i - lower_i, lambda_i + b + upper_i]``, b from :func:`eigenvalue_error_bound`.

    **Lower (a rigorous bound).** With ``b_j`` the computed solutions of ``L' b = w_j`` (w_j
    the eigenvectors) and ``u_j = sum_i b_ji phi(d_i)``, the Ritz values of the exact
    covariance operator on ``span(u_1..u_p)`` are at most the exact eigenvalues
    (Poincare's separation theorem). They are the eigenvalues of the pencil ``(T, G)``,
    ``T_jl = sum_t <u_j, phi_c(x_t)> <u_l, phi_c(x_t)>``, ``G = B' M B``, and

    - ``||G - I|| <= g = ||W'W - I|| + 2 ||R_B|| + ||R_B||^2 + theta (sum_j |b_j|_1)^2``,
      ``R_B = L'B - W`` (the solve's residual, ``gamma_{2m} |L'||B|``);
    - ``||T - Lambda|| <= tau``: ``<u_j, phi_c(x_t)> = w_j' z_c,t + eps_tj`` with
      ``|eps_tj| <= |b_j|_1 xi_t`` (kernel and solve errors, :meth:`FactorRounding.certify
      <ooc_spectral.core.rounding.FactorRounding.certify>`), so
      ``tau = ||R_E|| + tau_C + 2 (lambda_1 + tau_C) ||R_B|| + 2 sqrt(sum lambda_j) beta Xi
      + beta^2 Xi^2`` with ``R_E = C W - W Lambda``, ``tau_C`` the accumulation's rounding
      (:func:`accumulation_error`), ``beta^2 = sum_j |b_j|_1^2`` and ``Xi^2 = sum_t xi_t^2``.

    Hence ``lambda_i(exact) >= (lambda_i - tau) / (1 + g)``: ``lower_i = (g lambda_i + tau)
    / (1 + g)``.

    **Upper (first order).** The same perturbations bound the other side to first order:
    ``upper_i = g lambda_i + tau`` (the second-order terms are of order ``eps^2 cond``).

    Without certified sums (no rounding constants) both are ``inf`` where the terms need
    them, except for the accumulation and eigensolver's own rounding.
    """
    W = np.asarray(smap.components, dtype=np.float64)
    lam = np.asarray(smap.eigenvalues, dtype=np.float64)
    m, p = W.shape
    C = np.asarray(C, dtype=np.float64)
    tau_C = accumulation_error(sums, depth)
    R_E = C @ W - W * lam
    r_E = float(np.linalg.norm(R_E)) + gamma(m + 2) * float(
        np.linalg.norm(np.abs(C) @ np.abs(W) + np.abs(W) * np.abs(lam)))
    WW = W.T @ W - np.eye(p)
    g = float(np.linalg.norm(WW)) + gamma(m + 2) * p
    tau = r_E * (1 + g) + tau_C * (1 + g)
    rounding = dictionary.rounding
    if rounding is None or dictionary.L is None or not sums.certified:
        if dictionary.L is not None:
            return np.full(p, np.inf), np.full(p, np.inf)
        return (g * lam + tau) / (1 + g), g * lam + tau
    from scipy.linalg import solve_triangular

    L = dictionary.L
    B = solve_triangular(L, W, lower=True, trans="T", check_finite=False)
    b1 = np.abs(B).sum(axis=0)
    r_B = gamma(2 * m + 2) * float(np.linalg.norm(np.abs(L.T) @ np.abs(B)))
    beta2 = float(b1 @ b1)
    g = g + 2 * r_B * (1 + g) + r_B ** 2 + rounding.theta * float(np.sum(b1)) ** 2
    Xi = math.sqrt(max(float(sums.sum_xi2), 0.0))
    lam1 = float(np.max(np.abs(lam))) if p else 0.0
    tau = (tau + 2 * (lam1 + tau_C) * r_B + 2 * math.sqrt(float(np.sum(np.abs(lam))) * (1 + g))
           * math.sqrt(beta2) * Xi + beta2 * Xi * Xi)
    tau *= 1 + 16 * U
    if g >= 0.5:
        return np.full(p, np.inf), np.full(p, np.inf)
    return (g * lam + tau) / (1 + g), g * lam + tau


def check_spectrum(C: np.ndarray, all_values: np.ndarray, moments: Moments,
                   depth: int | None = None) -> None:
    """Raise :class:`NumericalBreakdownError` unless ``C`` passes the cheap checks, each at
    its derived rounding allowance.

    - ``trace(C)`` equals ``moments.sq``, the same diagonal sums read off the products
      before their symmetric completion and pooled updates: two sums of at most ``m`` of
      the same terms each, within ``2 gamma_{2m+2}`` of their scale;
    - no eigenvalue below ``-(tau_C + 2 (m + 1) u lambda_max)``: the exact C is a Gram
      matrix, and the computed one is within the accumulation's rounding ``tau_C``
      (:func:`accumulation_error`) and the eigensolver's backward error of it;
    - no eigenvalue nor the trace above ``sum k(x, x)`` plus those, the rounding of the
      sum itself and the rows' own (:func:`rows_rounding`): ``sum k(x, x)`` is the trace
      of the centred Gram matrix plus a non-negative term, and every eigenvalue is at most
      the trace; the computed ``|z|^2`` of a row exceeds its ``k(x, x)`` by at most its
      residual's rounding (rows in the span, such as every row of a linear kernel's
      saturated dictionary: standardised data, whose trace equals ``sum k(x, x)``).

    Parameters
    ----------
    C : ndarray of shape (m, m)
        The centred second moment that is eigensolved.
    all_values : ndarray of shape (m,)
        All its eigenvalues, ascending.
    moments : Moments
        Pass 2's statistic: ``sq`` (the rows' ``|z - zbar|^2`` summed one by
        one), ``sums.sum_kx`` (``sum k(x, x)``).
    depth : int, optional
        :func:`summation_depth` (default: every row).
    """
    m = C.shape[0]
    trace = float(np.trace(C))
    sq, sum_kx = float(moments.sq), float(moments.sums.sum_kx)
    scale = max(sq, abs(trace), np.finfo(np.float64).tiny)
    depth = int(moments.n) if depth is None else int(depth)
    tau_C = accumulation_error(moments.sums, depth)
    advice = ("the statistics of pass 2 are not those of the rows' projections, so the "
              "spectrum would be wrong and is not returned. If this run resumed from a "
              "checkpoint, rerun with --overwrite (a damaged checkpoint); otherwise report "
              "it with the data's shape, the kernel, gamma and tol, and meanwhile raise tol "
              "(e.g. by 100x) or use a smaller gamma")
    if not np.all(np.isfinite(C)):
        raise NumericalBreakdownError(f"the m x m statistic holds NaN or infinity: {advice}")
    trace_allowed = 2 * gamma(2 * m + 2) * scale
    if abs(trace - sq) > trace_allowed:
        raise NumericalBreakdownError(
            f"trace(C) = {trace:.17g} but the rows' squared centred norms sum to {sq:.17g} "
            f"(difference {abs(trace - sq):.3g}, rounding allows {trace_allowed:.3g}): {advice}")
    lo, hi = float(all_values[0]), float(all_values[-1])
    eig_err = 2 * (m + 1) * U * max(abs(hi), abs(lo))
    if lo < -(tau_C + eig_err):
        raise NumericalBreakdownError(
            f"C has the eigenvalue {lo:.3g}, below -{tau_C + eig_err:.3g} (the rounding of its "
            f"accumulation and eigensolve); a Gram matrix has none: {advice}")
    limit = sum_kx + gamma(depth + 2) * abs(sum_kx) + tau_C + eig_err + rows_rounding(moments, m)
    if hi > limit or trace > limit:
        raise NumericalBreakdownError(
            f"the top eigenvalue {hi:.6g} (trace {trace:.6g}) exceeds sum k(x, x) = {sum_kx:.6g} "
            f"by more than its rounding ({limit - sum_kx:.3g}); sum k(x, x) bounds every "
            f"eigenvalue of the centred Gram matrix: {advice}")


def rows_rounding(moments: Moments, m: int) -> float:
    """How far ``sum |z|^2`` may exceed ``sum k(x, x)``: each row's computed residual
    ``dhat = k(x, x) - |z|^2`` is at least ``-E`` (``dhat + E`` bounds an exact residual,
    which is not negative), so the sum is at most ``n`` times the largest certified ``E``
    (pass 2's ``max_rounding``); without certified sums, the a-priori rounding of each
    ``k(x, x) - |z|^2`` with ``|z|^2`` about ``k(x, x)``: ``2 gamma_{m+2} sum |k(x, x)|``."""
    s = moments.sums
    if s.certified:
        return float(moments.n) * float(s.max_rounding)
    return 2 * gamma(m + 2) * 2 * abs(float(s.sum_kx))


def sorted_eigenpairs(A: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All eigenvalues of the symmetric ``A`` (ascending) and its ``k`` largest pairs.

    The top pairs are descending with signs fixed as in :func:`top_eigenpairs`.
    """
    A = 0.5 * (A + A.T)
    vals, vecs = eigh(A, driver="evd", check_finite=False)
    return vals, vals[::-1][:k].copy(), fix_signs(vecs[:, ::-1][:, :k])


def solve_additive(dictionary: Dictionary, moments: Moments, n_components: int,
                   depth: int | None = None) -> SpectralMap:
    """Kernel PCA from the coordinate ``moments`` of pass 2, checked before use.

    Raises
    ------
    NumericalBreakdownError
        When ``C`` fails :func:`check_spectrum`.
    DictionaryError
        When ``n_components`` exceeds the dictionary size or the rank of ``C``.
    """
    m = dictionary.size
    every = n_components is None  # every direction above rounding, as KernelPCA(None)
    check_n_components(m, 1 if every else n_components,
                       spent_directions(dictionary.affine, "additive", False))
    C = np.asarray(moments.m2, dtype=np.float64)
    all_values, vals, W = sorted_eigenpairs(C, m if every else n_components)
    check_spectrum(C, all_values, moments, depth)
    # rounding level: the magnitude of a negative (rounding) eigenvalue, or m eps lambda_max
    noise = max(-float(all_values[0]), 16 * m * np.finfo(np.float64).eps * float(all_values[-1]))
    rank = int(np.sum(all_values > noise))
    if every:
        if rank == 0:
            raise DictionaryError(
                "the centred Gram matrix has no eigenvalue above rounding: every row is at the "
                "same point in feature space, so there is no direction to embed; check the data "
                "and the kernel")
        n_components, vals, W = rank, vals[:rank].copy(), W[:, :rank].copy()
    if n_components > rank:
        raise DictionaryError(
            f"n_components={n_components} exceeds the number of directions the data spans "
            f"in feature space ({rank}, with a dictionary of {m} points: every row is within "
            "tol of that span); components beyond it would be rounding noise. Lower "
            f"n_components to at most {rank}"
            + ("" if dictionary_saturated(moments.sums) else
               ", or grow the dictionary with a smaller tol"))
    return SpectralMap(dictionary, "additive", np.asarray(moments.mean, dtype=np.float64),
                       W, vals, int(moments.n))


def solve_exact(kernel, X: np.ndarray, n_components: int | None, *,
                affine: bool) -> tuple[SpectralMap, Certificate, RowSums]:
    """Exact kernel PCA on the full Gram matrix, for small data where the dictionary
    would hold (nearly) every row.

    ``K_c = K - 1 mu' - mu 1' + mean(mu)`` with ``mu`` the column means of
    ``K = k(X, X)``; its top eigenpairs ``K_c V = V Lambda`` (the computation of
    scikit-learn's ``KernelPCA(eigen_solver="dense")``). The map is written in the
    kernel basis (``Dictionary.L`` is None, the dictionary is every row):
    ``e(x) = (k(x, X) - mu) V / sqrt(Lambda)``, which on a training row gives
    ``sqrt(lambda_k) v_k``, and out of sample is scikit-learn's ``transform``
    (the terms constant across the columns vanish because ``1' V = 0``).

    Returns the map, its certificate (``max_delta`` 0: every row is its own
    dictionary point) and row sums (``sum_dhat`` 0, for the eigenvalue bound).
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    n = X.shape[0]
    aux = kernel.aux(X)
    K = kernel.pairwise(X, X, aux, aux)
    mu = K.mean(axis=0)
    K -= mu
    K -= mu[:, None]
    K += mu.mean()
    kx = kernel.diag(X, aux)
    trace = float(np.trace(K))
    noise = n * np.finfo(np.float64).eps * max(trace, 0.0)
    if n_components is None:
        # every direction above rounding, as KernelPCA(n_components=None), which keeps
        # the eigenvalues above 1e-12 of the largest
        vals, V = eigh(K, driver="evd", check_finite=False)
        noise = max(noise, 1e-12 * float(vals[-1]))
        n_components = max(int(np.sum(vals > noise)), 1)
        vals, V = vals[n - n_components:], V[:, n - n_components:]
    else:
        vals, V = dense_top_eigenpairs(K, n_components)
    del K
    vals, V = vals[::-1].copy(), fix_signs(V[:, ::-1])
    _above_rounding(vals, noise, n_components, "the number of directions the data spans in "
                    "feature space ({rank}: the centred Gram matrix has only {rank} eigenvalues "
                    "above rounding)")
    smap = SpectralMap(_every_row(kernel, X, aux, affine), "additive", mu, V / np.sqrt(vals),
                       vals, n)
    return smap, Certificate(0.0, 0), RowSums(float(kx.sum()), float(np.max(np.abs(kx))), 0.0)


def _every_row(kernel, X: np.ndarray, aux, affine: bool) -> Dictionary:
    """The exact path's dictionary: every row, no factor (the kernel basis)."""
    n = X.shape[0]
    return Dictionary(kernel=kernel, points=X, indices=np.arange(n, dtype=np.int64), aux=aux,
                      L=None, w=np.zeros(n), beta=0.0, affine=affine, solver="gemm")


def _above_rounding(vals: np.ndarray, noise: float, n_components, what: str) -> None:
    """Refuse components at or below the exact solve's rounding, naming how many there are
    (``what``, with ``{rank}``)."""
    if vals.size == 0 or np.any(vals <= noise):
        rank = int(np.sum(vals > noise))
        raise DictionaryError(f"n_components={n_components} exceeds {what.format(rank=rank)}; "
                              f"lower n_components to at most {rank}")


def solve_exact_divisive(kernel, X: np.ndarray, n_components: int | None, *, affine: bool,
                         drop_first: bool, subset: bool, negative_values: str | None = None
                         ) -> SpectralMap:
    """The exact spectral embedding on the full Gram matrix (Ng, Jordan & Weiss), for small
    data where the dictionary would hold (nearly) every row.

    Exact degrees (``subset=False``): ``d = K 1`` and ``S = D^-1/2 K D^-1/2``,
    ``S V = V Lambda``; the map in the kernel basis (``Dictionary.L`` is None) is
    ``v(x) = k(x, X) D^-1/2 V Lambda^-1 / sqrt(d(x))`` with ``d(x) = k(x, X) 1``, the
    Nystrom extension of the normalized kernel, which on a training row gives its row of
    the unit eigenvectors V (``SpectralMap`` mode ``divisive-exact``, ``center`` the ones
    that sum a kernel row into its degree). With subset degrees the kernel is already
    normalized (:class:`~ooc_spectral.core.kernels.SubsetNormalizedKernel`): ``K V = V
    Lambda``, ``v(x) = k(x, X) V Lambda^-1``, and the eigenvalues reported are
    ``Lambda / n``, as the greedy path's. The first eigenvector (eigenvalue 1 for exact
    degrees) is dropped with ``drop_first``.

    Raises :class:`DictionaryError` when a degree is not positive (a kernel with negative
    values: ``negative_values`` says why) or ``n_components`` exceeds the directions above
    rounding.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    n = X.shape[0]
    aux = kernel.aux(X)
    K = kernel.pairwise(X, X, aux, aux)
    center = None
    if subset:
        scale = np.ones(n)
    else:
        deg = K.sum(axis=1)
        i = int(np.argmin(deg))
        if not deg[i] > 0:
            raise DictionaryError(
                f"the degree of row {i} is {deg[i]:.3g} (not positive), so D^-1/2 K D^-1/2 is "
                f"undefined: {negative_values or 'the kernel is negative between rows'}, so a "
                "row's degree (the sum of its kernel row) can be negative whatever tol. The "
                "divisive normalization needs a kernel with values >= 0 on the data: use "
                "kernel='rbf' or 'laplacian', or normalization='additive' (kernel PCA)")
        scale = 1.0 / np.sqrt(deg)
        K *= scale[:, None]
        K *= scale[None, :]
        center = np.ones(n)
    extra = int(drop_first)
    if n_components is None:
        vals, V = eigh(0.5 * (K + K.T), driver="evd", check_finite=False)
        noise = 16 * n * np.finfo(np.float64).eps * max(float(vals[-1]), 0.0)
        keep = max(int(np.sum(vals > noise)), 1)
        vals, V = vals[n - keep:], V[:, n - keep:]
    else:
        vals, V = dense_top_eigenpairs(0.5 * (K + K.T), min(n, n_components + extra))
    del K
    vals, V = vals[::-1].copy(), fix_signs(V[:, ::-1])
    if drop_first:
        vals, V = vals[1:], V[:, 1:]
    noise = 16 * n * np.finfo(np.float64).eps * max(float(vals[0]) if vals.size else 0.0, 0.0)
    _above_rounding(vals, noise, n_components, "the non-trivial directions of the normalized "
                    "kernel ({rank} eigenvalues above rounding)")
    dictionary = _every_row(kernel, X, aux, affine)
    components = (V * scale[:, None]) / vals
    if subset:
        return SpectralMap(dictionary, "divisive-subset", None, components, vals / n, n)
    return SpectralMap(dictionary, "divisive-exact", center, components, vals, n)


def dictionary_saturated(sums: RowSums) -> bool:
    """Whether every row is in the span already (a smaller tol cannot add a point)."""
    eps = np.finfo(np.float64).eps
    return float(sums.sum_dhat) <= 1e3 * eps * float(sums.sum_kx)


def solve_divisive(dictionary: Dictionary, stats: Gram | Degrees, n_components: int, *,
                   drop_first: bool, subset: bool, total: np.ndarray | None = None) -> SpectralMap:
    """Spectral embedding from the ``degrees`` (exact) or ``gram`` (subset) statistics."""
    every = n_components is None  # every direction above rounding
    spent = spent_directions(dictionary.affine, "divisive", drop_first)
    check_n_components(dictionary.size, 1 if every else n_components, spent)
    k = dictionary.size if every else n_components + int(drop_first)
    vals, W = top_eigenpairs(stats.S, k)
    if every:
        noise = 16 * dictionary.size * np.finfo(np.float64).eps * max(float(vals[0]), 0.0)
        keep = int(np.sum(vals > noise))
        vals, W = vals[:keep], W[:, :keep]
    if drop_first:
        vals, W = vals[1:], W[:, 1:]
    if every:
        n_components = int(vals.shape[0])
        if n_components == 0:
            raise DictionaryError(
                "the normalized kernel has no non-trivial eigenvalue above rounding; lower tol")
    if np.any(vals <= 0):
        raise DictionaryError(
            f"the normalized kernel has only {int(np.sum(vals > 0))} positive eigenvalues among "
            f"the {n_components} requested; lower n_components or tol"
        )
    n = int(stats.n)
    components = W / np.sqrt(vals)
    if subset:
        return SpectralMap(dictionary, "divisive-subset", None, components, vals / n, n)
    return SpectralMap(dictionary, "divisive-exact", np.asarray(total), components, vals, n)
