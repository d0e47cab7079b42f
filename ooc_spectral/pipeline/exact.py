"""The exact path: the whole problem on the full n x n Gram matrix, where it is at hand.

The greedy method pays off when the dictionary is small against the rows. Two situations
make the exact problem the better answer, where its n x n Gram matrix fits in memory
(:func:`exact_at_hand`):

- **the dictionary heads for every row** (a kernel so narrow that no row is near the span of
  the others): the scan would cost more than the full problem, and its factor would be as
  large and far worse conditioned. The scan stops once nearly every one of a stretch of
  the first rows of the visiting order entered (:data:`EARLY_EXACT`), or the dictionary
  reached :func:`exact_limit` points (half of the rows on a few hundred, ``sqrt(80 n)`` on
  more: the greedy problem then costs more than the exact one); both normalizations then
  solve exactly. A float64 probe of the first window that certifies nothing tells it
  before the certified scan starts (:func:`~ooc_spectral.pipeline.scan.probe_exact`);
- **a tol below what float64 certifies** with a dictionary on these rows (a
  :class:`~ooc_spectral.exceptions.NumericalBreakdownError` of the scan, of pass 2's
  certificate or of the eigenvalue interval): the exact problem is what a tol that small
  asks for, and its answer has no residual at all;
- **more components than the dictionary at this tol has points** (:data:`SHORT_EXACT`: a
  tol that could add points, or a Gaussian or Laplacian kernel so wide, gamma 1e-8 on
  data of unit scale, that it is nearly constant over the rows and every row is within tol
  of the first point): the exact problem has every direction the rows span, its
  eigenvalues (of size gamma times the data's variance, however small) in a certified
  interval (:func:`exact_interval`); where the exact problem is not at hand the fit is
  refused with advice (:mod:`ooc_spectral.pipeline.advice`).

Either way a :class:`~ooc_spectral.exceptions.DictionaryWarning` says so. Where the exact
problem is not at hand, a dictionary heading for every row stops early with a
:class:`~ooc_spectral.exceptions.DictionarySizeError` naming the way out (a smaller gamma, a
larger tol), instead of growing one point at a time for minutes.
"""

from __future__ import annotations

import math

import numpy as np

from .._validation import check_finite
from ..core.eigensolve import check_n_components, solve_exact, solve_exact_divisive
from ..core.kernels import Kernel
from ..core.model import SpectralMap
from ..core.rounding import U, entry_error, gamma, kernel_center
from ..exceptions import DictionaryWarning, warn_once

__all__ = ["EXACT_MEMORY_FRACTION", "EXACT_MATRICES", "EXACT_FRACTION", "EARLY_EXACT",
           "EARLY_STOP", "EARLY_ROWS", "EXACT_COST", "SHORT_EXACT", "divisive_allowance",
           "unresolved", "exact_limit", "exact_max_rows", "exact_at_hand", "exact_interval",
           "exact_reason", "solve_exactly", "divisive_volume", "capped_exact",
           "check_exact_finite"]

#: The exact path may use this fraction of the machine's physical memory ...
EXACT_MEMORY_FRACTION = 0.25
#: ... for this many n x n float64 matrices: the Gram matrix, the eigensolver's copy and
#: workspace, and (for every direction) its eigenvectors.
EXACT_MATRICES = 4
#: A scan whose dictionary holds this fraction of all rows stops: the exact problem is then
#: cheaper than the greedy one.
EXACT_FRACTION = 0.5
#: ... or ``sqrt(EXACT_COST n)`` points, where fewer: the exact problem costs about
#: ``EXACT_COST`` products with its n x n Gram matrix (forming it from rows of a few
#: columns, an iterative eigensolver's products), the greedy one at least ``n m^2``
#: (every row's coordinates against m points) and a certified factor's measurement
#: besides. On 2,000 rows a dictionary of 400 points stops (a swiss roll at gamma 0.1,
#: heading for 749 points, fits in a third of the time exactly).
EXACT_COST = 80
#: A scan whose dictionary took ``points`` of the rows ``start:stop`` of the visiting order
#: (95%, where a dictionary that will stop growing has slowed down: 47 to 67 of 80 on a
#: swiss roll whose dictionary settles at a fifth of the rows, 80 of 80 on standardised
#: digits at the median gamma) heads for every row: it switches to the exact problem
#: where that is at hand ...
EARLY_EXACT = (76, 240, 320)
#: ... and, on more rows than ``max_dictionary_size`` otherwise, stops with the way out.
EARLY_STOP = (76, 560, 640)
#: The kinds of a dictionary too small for ``n_components``
#: (:func:`~ooc_spectral.core.checks.check_dictionary`) that the exact problem answers where
#: it is at hand: ``"tol"`` (a smaller tol would add points) and ``"constant"`` (a kernel
#: nearly constant over the data: one point holds every row within tol, and the exact
#: problem's small eigenvalues are the answer at the gamma asked). The other kinds have no
#: more directions to give (the kernel's feature space, groups of equal rows, tol 0).
SHORT_EXACT = ("tol", "constant")
#: Where the scan parts its first rows to recognise it (:func:`~ooc_spectral.pipeline.scan.scan_source`).
EARLY_ROWS = tuple(sorted({*EARLY_EXACT[1:], *EARLY_STOP[1:]}))


def exact_limit(n_rows: int) -> int:
    """The dictionary size at which a scan whose exact problem is at hand stops for it:
    :data:`EXACT_FRACTION` of the rows or ``sqrt(EXACT_COST n)``, the fewer."""
    n = int(n_rows)
    return max(1, math.ceil(min(EXACT_FRACTION * n, math.sqrt(EXACT_COST * n))))


def exact_max_rows(memory: int | None = None) -> int:
    """The most rows whose exact problem fits in :data:`EXACT_MEMORY_FRACTION` of
    ``memory`` bytes (default: the machine's physical memory): :data:`EXACT_MATRICES`
    n x n float64 matrices."""
    if memory is None:
        import psutil

        memory = psutil.virtual_memory().total
    return int(math.isqrt(int(EXACT_MEMORY_FRACTION * float(memory) / (8 * EXACT_MATRICES))))


def exact_at_hand(config, n_rows: int, memory: int | None = None) -> bool:
    """Whether the exact problem may replace the greedy one for this fit: a fit by ``tol``
    with the greedy selection, on at most :func:`exact_max_rows` rows and at most
    ``max_dictionary_size`` (the exact path holds every row as its own dictionary point,
    so the user's cap on the dictionary bounds it too)."""
    return (config.dictionary_size is None and config.dictionary_selection == "greedy"
            and int(n_rows) <= min(exact_max_rows(memory), config.max_dictionary_size))


def capped_exact(config, n_rows: int, memory: int | None = None) -> bool:
    """Whether only ``max_dictionary_size`` keeps the exact problem from this fit: it would
    be at hand (:func:`exact_at_hand`) with the cap at the number of rows. A dictionary
    heading for every row is then refused with one advice, checked by the path itself: a
    cap of ``n_rows`` solves it exactly (:func:`~ooc_spectral.pipeline.advice.with_advice`)."""
    return (config.dictionary_size is None and config.dictionary_selection == "greedy"
            and int(config.max_dictionary_size) < int(n_rows) <= exact_max_rows(memory))


def exact_interval(kernel: Kernel, X: np.ndarray, smap: SpectralMap) -> np.ndarray:
    """The exact path's eigenvalue interval (p, 2): the computed n x n Gram matrix is within
    ``n eta`` of the exact one in the 2-norm (every entry within ``eta``,
    :func:`~ooc_spectral.core.rounding.entry_error`); its centring
    (:func:`~ooc_spectral.core.eigensolve.solve_exact`: column means summed over n rows,
    their mean, three subtractions) adds at most ``(4 gamma_n + 16 u) b`` to every entry,
    ``b = max k(x, x) + eta`` bounding ``|K_ij|`` (Cauchy-Schwarz), so ``n`` times that in
    the 2-norm: in exact arithmetic centring changes nothing, but the means' rounding
    repeats in every entry of a column and adds up across the rows. The eigensolver adds its
    backward error (``8 n u lambda_1``); each exact eigenvalue is within the sum (Weyl)."""
    n = X.shape[0]
    eta, kmax, _ = _entry_bound(kernel, X)
    centring = (4 * gamma(n) + 16 * U) * (kmax + eta)
    lam = np.asarray(smap.eigenvalues, dtype=np.float64)
    a = n * (eta + centring) + 8 * n * U * float(np.max(np.abs(lam)))
    return np.column_stack([lam - a, lam + a])


def _entry_bound(kernel: Kernel, X: np.ndarray) -> tuple[float, float, object]:
    """``(eta, max |k(x, x)|, aux)``: every computed kernel value between two rows of ``X``
    is within ``eta`` of the exact one (:func:`~ooc_spectral.core.rounding.entry_error`);
    ``aux``, the kernel's per-row values of ``X``, for the caller's own kernel products."""
    aux = kernel.aux(X)
    kx = kernel.diag(X, aux)
    c = kernel_center(kernel)
    P = X if c is None else X - np.asarray(c, dtype=np.float64)
    radius = float(np.sqrt(np.max(np.einsum("ij,ij->i", P, P)))) * (1 + 1e-14)
    kmax = float(np.max(np.abs(kx)))
    return float(np.max(entry_error(kernel, X, aux, kx, radius, kmax))), kmax, aux


def divisive_allowance(kernel: Kernel, X: np.ndarray) -> float:
    """How far rounding may move an eigenvalue of the exact ``D^-1/2 K D^-1/2``
    (:func:`~ooc_spectral.core.eigensolve.solve_exact_divisive`) for a kernel with values
    >= 0, an estimate by first-order perturbation (no certified interval: the divisive
    normalization reports none): every entry of K within ``eta``, each degree ``d_i``
    within ``delta = n eta + gamma_n (d_max + n eta)``, so every entry of the normalized
    matrix within ``eta / d_min + M_max (delta / d_min + 4u)``, ``M_max = (k_max + eta) /
    d_min``, n times that in the 2-norm, plus the eigensolver's ``8 n u`` (its largest
    eigenvalue is 1). inf where it cannot be told (a degree not above 0, a kernel whose
    rounding is not bounded)."""
    n = X.shape[0]
    try:
        eta, kmax, aux = _entry_bound(kernel, X)
        deg = kernel.pairwise_dot(X, X, np.ones((n, 1)), aux, aux).ravel()
    except Exception:  # a kernel without a rounding bound: nothing is resolved
        return math.inf
    dmin, dmax = float(np.min(deg)), float(np.max(deg))
    if not dmin > 0:
        return math.inf
    delta = n * eta + gamma(n) * (dmax + n * eta)
    entry = eta / dmin + (kmax + eta) / dmin * (delta / dmin + 4 * U)
    return n * entry + 8 * n * U


def unresolved(err, smap: SpectralMap, interval, kernel: Kernel, X: np.ndarray):
    """``err`` (a :class:`~ooc_spectral.exceptions.DictionaryError` of kind ``"constant"``,
    a kernel nearly constant over the data) where even the exact problem resolves fewer
    directions than asked for: kernel PCA's ``n_components`` intervals not all above 0, the
    divisive normalization's smallest eigenvalue kept not above
    :func:`divisive_allowance` (the kernel so wide, gamma 1e-15 on data of unit scale, that
    its directions are rounding); else None."""
    lam = np.asarray(smap.eigenvalues, dtype=np.float64)
    if interval is not None:
        if np.all(interval[:, 0] > 0):
            return None
    elif lam.size and float(np.min(lam)) > divisive_allowance(kernel, X):
        return None
    diagnosis = (f"{err.diagnosis}, and even the exact problem on all {X.shape[0]} rows "
                 f"resolves no {lam.size} directions above its rounding")
    new = type(err)(f"{diagnosis}; lower n_components to at most {err.limit}")
    new.__dict__.update(err.__dict__)
    new.diagnosis = diagnosis
    return new


def exact_reason(c, n_rows: int, gamma, *, breakdown=None, early=None, short=None) -> str:
    """Why the fit solves the exact problem (the :class:`DictionaryWarning`'s text).

    ``breakdown``: the :class:`~ooc_spectral.exceptions.NumericalBreakdownError` of a tol
    below what float64 certifies with a dictionary; ``early``: ``(points, start, stop)``
    when the dictionary took that many of those rows; ``short``: the dictionary's size, too
    small for ``n_components``; else half of all rows entered."""
    what = ("kernel PCA" if c.normalization == "additive" else "the spectral embedding")
    exact = f"{what} is solved exactly on the {n_rows} x {n_rows} Gram matrix instead"
    if short is not None:
        return (f"n_components={c.n_components} needs more directions than the {short} points "
                f"the dictionary holds at tol={c.tol:g}: {exact}")
    if breakdown is not None:
        if c.tol is not None and c.tol <= 0:
            return (f"tol={c.tol:g} asks for every direction of the data, more than a "
                    f"dictionary's Cholesky factor separates in float64: {exact}; a positive "
                    "tol keeps the dictionary small")
        return (f"tol={c.tol:g} is below what float64 arithmetic certifies with a dictionary on "
                f"these rows: {exact} (its rows have no residual; a larger tol keeps the "
                "dictionary small)")
    width = f" (gamma={gamma:.3g})" if gamma is not None else ""
    if early is not None:
        took = (f"the dictionary took {early[0]} of the {early[2] - early[1]} rows "
                f"{early[1]} to {early[2]} of the visiting order{width}")
    elif exact_limit(n_rows) < EXACT_FRACTION * n_rows:  # the greedy problem costs more
        msg = (f"{exact_limit(n_rows)} of the {n_rows} rows entered the dictionary{width} "
               "before the scan was done, past the size at which the exact problem is the "
               f"cheaper one (sqrt({EXACT_COST} n) points), so {exact}")
        return msg + _way_out(c, gamma)
    else:
        took = f"half of the {n_rows} rows entered the dictionary{width}"
    msg = f"{took} before the scan was done: no row is near the span of the others, so {exact}"
    return msg + _way_out(c, gamma)


def _way_out(c, gamma) -> str:
    """The advice closing :func:`exact_reason`'s text for a dictionary that grew large."""
    if gamma is not None and c.kernel in ("rbf", "laplacian"):
        return (f"; for a small dictionary use a smaller gamma (try gamma={gamma / 10:.3g}) "
                "or a larger tol")
    return ""


def solve_exactly(run, kernel: Kernel, gamma, *, breakdown=None, early=None, short=None,
                  refusal=None):
    """The exact problem of the :class:`~ooc_spectral.pipeline.fit.FitRun` ``run``
    (:func:`~ooc_spectral.core.eigensolve.solve_exact` or
    :func:`~ooc_spectral.core.eigensolve.solve_exact_divisive`), with the
    :class:`DictionaryWarning` saying why (:func:`exact_reason`).

    Returns ``(smap, interval, bound, preimage)``: the map, for kernel PCA the eigenvalues'
    rounding interval and its width above them (None for the divisive normalization), and
    the pre-image map (``fit_inverse_transform``). ``refusal``: the dictionary's error,
    raised where even the exact problem does not resolve the directions (:func:`unresolved`)."""
    from .certification import keep_certified

    c, s = run.config, run.source
    additive = c.normalization == "additive"
    check_n_components(s.n_rows, c.n_components or 1, 0 if additive else int(c.drop_first))
    interval, bound = None, None
    with run.stage("solve"):
        Xall = s.read_index(np.arange(s.n_rows))
        check_finite(Xall, 0, chunk_starts=s.chunk_starts)
        if additive:
            smap, _, _ = solve_exact(kernel, Xall, c.n_components, affine=c.affine)
            smap, interval = keep_certified(smap, exact_interval(kernel, Xall, smap),
                                            c.n_components)
            # every row is its own dictionary point: the width is the rounding alone
            bound = float(np.max(interval[:, 1] - smap.eigenvalues))
        else:
            smap = solve_exact_divisive(kernel, Xall, c.n_components, affine=c.affine,
                                        drop_first=c.drop_first,
                                        subset=c.degree_estimate == "subset",
                                        negative_values=c.negative_values)
    check_exact_finite(smap, interval)
    if refusal is not None and (err := unresolved(refusal, smap, interval, kernel, Xall)):
        raise err
    warn_once(exact_reason(c, s.n_rows, gamma, breakdown=breakdown, early=early, short=short),
              DictionaryWarning, stacklevel=5)
    preimage = None
    if c.fit_inverse_transform:  # scikit-learn's regression on every row
        with run.stage("preimage"):
            from ..core.preimage import exact_preimage

            # the training embedding sqrt(lambda) v (= components * lambda), not the
            # Nystrom map of the rows, which amplifies rounding in the smallest components
            E = smap.components * smap.eigenvalues
            preimage = exact_preimage(kernel.without_center(), E, Xall, c.alpha)
    return smap, interval, bound, preimage


def check_exact_finite(smap: SpectralMap, interval) -> None:
    """The exact path returns nothing that is not finite: kernel parameters past float64's
    range (gamma or coef0 near 1e308, a huge degree) overflow the kernel's values or their
    rounding bound, and the eigenproblem on them is no answer (a NaN spectrum, before this
    check, was returned with no error)."""
    from ..exceptions import NumericalBreakdownError

    parts = [smap.eigenvalues, smap.components] + ([] if interval is None else [interval])
    if all(np.isfinite(np.asarray(a, dtype=np.float64)).all() for a in parts):
        return
    err = NumericalBreakdownError(
        "the exact problem overflows float64 (its kernel values or their rounding bound: "
        "the spectrum is not finite): the kernel's parameters are past the range float64 "
        "computes it in for these rows (a gamma or coef0 near 1e308, a huge degree, or rows "
        "near float64's limits); use parameters of ordinary size (gamma=None picks the "
        "median heuristic) or rescale the rows")
    err.suggested_tol = None
    raise err


def divisive_volume(smap: SpectralMap) -> float:
    """``sum_t d_t``, the volume of the graph of a ``divisive-exact`` map: ``|s|^2`` with
    ``s = sum_t y_t`` the map's ``center`` (the rows' degrees are ``d_t = y_t . s``); on the
    exact path (no factor: ``s`` sums a kernel row into its degree) ``1' K 1`` over its
    rows, one product with the kernel."""
    d = smap.dictionary
    if d.L is not None:
        return float(smap.center @ smap.center)
    ones = np.ones((d.size, 1))
    return float(d.kernel.pairwise_dot(d.points, d.points, ones, d.aux, d.aux).sum())

