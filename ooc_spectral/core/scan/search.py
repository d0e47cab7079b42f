"""Algorithm 2 of the main paper: a dictionary of a requested size, on in-memory rows.

The search keeps small dictionaries and only adds points (each trial is a blocked
scan, :func:`~ooc_spectral.core.scan.blocked.scan_rows`). Out of core it runs on a
seeded sample of the rows; one scan of the whole data with the tolerance found
follows in the pipeline.
"""

from __future__ import annotations

import math

import numpy as np

from ...exceptions import DictionaryError, NumericalBreakdownError
from ..kernels import Kernel
from .blocked import scan_rows
from .state import DictionaryState

__all__ = ["search_dictionary"]


def search_dictionary(kernel: Kernel, X: np.ndarray, rows: np.ndarray, size: int, *,
                      affine: bool = True, iterations: int = 40,
                      block_rows: int | None = None) -> tuple[DictionaryState, float]:
    """The paper's Algorithm 2 on in-memory rows (in visiting order).

    Searches the tolerance while keeping small dictionaries and only adding
    points: ``eps_minus`` always gives at most ``size`` points and its dictionary
    is the base of the next trial; ``eps_plus`` gives too many. The search is
    geometric once both ends are positive (the paper bisects arithmetically; on
    a tolerance spanning decades the geometric step reaches the same bracket in
    fewer trials). It ends with a scan at ``eps_plus`` stopped at ``size``
    points (step 25), so it returns exactly ``size`` points.

    Returns
    -------
    state : DictionaryState
        Exactly ``size`` points.
    tol : float
        A tolerance every row of ``X`` meets with that dictionary: the trial's
        tolerance when a trial hits ``size`` exactly, else ``eps_minus`` (the
        step-25 scan stops at ``size`` points, before the end of the rows, but
        its dictionary contains the ``eps_minus`` one).

    Raises
    ------
    DictionaryError
        The rows hold fewer than ``size`` points that are not in the span of the
        others.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    rows = np.asarray(rows)
    empty = DictionaryState(kernel, X.shape[1], affine)

    def trial(base: DictionaryState, eps: float) -> tuple[DictionaryState, bool]:
        st = base.copy()
        try:
            over = scan_rows(st, X, rows, eps, limit=size, block_rows=block_rows)
        except NumericalBreakdownError:  # eps below what float64 resolves: too small a tol
            return base, True
        return st, over

    diag = kernel.diag(X[: min(len(X), 4096)])
    eps_minus = 2.0 * float(np.max(np.abs(diag))) + 1.0
    eps_plus = 0.0
    # steps 4-13: find an eps_minus that gives a small enough dictionary
    while True:
        st, over = trial(empty, eps_minus)
        if not over and st.size == size:
            return st, eps_minus
        if not over:
            base = st
            break
        eps_plus, eps_minus = eps_minus, eps_minus * 10.0
    # steps 14-24: search, keeping the smaller dictionary as the base
    for _ in range(iterations):
        eps = math.sqrt(eps_plus * eps_minus) if eps_plus > 0 else eps_minus / 10.0
        st, over = trial(base, eps)
        if not over and st.size == size:
            return st, eps
        if over:
            eps_plus = eps
        else:
            eps_minus, base = eps, st
    if eps_plus == 0.0:
        raise DictionaryError(
            f"dictionary_size={size} cannot be reached: even with tol={eps_minus:.1e} only "
            f"{base.size} of the {len(X)} sampled rows are outside the span of the others; "
            f"ask for dictionary_size <= {base.size}"
        )
    # step 25: from the base, scan with eps_plus, stopping when the size is reached.
    # The base held every row within eps_minus and the result contains the base,
    # so eps_minus is the tolerance the result guarantees on these rows.
    st = base.copy()
    eps = eps_plus
    for _ in range(60):  # filling up to size: eps_minus is the tol claimed, not eps
        if (scan_rows(st, X, rows, eps, limit=size, block_rows=block_rows, certify=False)
                or st.size == size):
            return st, eps_minus
        eps /= 10.0  # the last step is not monotone in rare cases: keep adding
    raise DictionaryError(
        f"dictionary_size={size} cannot be reached: only {st.size} of the {len(X)} sampled "
        f"rows are outside the span of the others; ask for dictionary_size <= {st.size}"
    )
