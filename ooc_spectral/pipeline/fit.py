"""The fit, stage by stage: kernel, pass 1, pass 2, eigensolve, pass 3.

:class:`FitRun` strings the stages together for one validated
:class:`~ooc_spectral.core.config.FitConfig` and one
:class:`~ooc_spectral.io.source.DataSource`. Each stage is one method, timed, and
each can resume from a :class:`Checkpoint` (the command line's batch jobs give
one; the estimator's plain ``fit`` gives none):

==========  ==================================================  ====================
stage       what it does                                        survives a restart
==========  ==================================================  ====================
kernel      resolve gamma (seeded sample), build the kernel     recomputed (cheap)
scan        pass 1, sequential, in the seeded visiting order    state every k windows
pass2       parallel map + ordered tree reduction               each finished segment
rescan      prefix scan only: the rows pass 2 found beyond tol  the grown state
solve       m x m eigensolve in this process                    recomputed (cheap)
pass3       embedding, written chunk by chunk                   each written chunk
==========  ==================================================  ====================
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np
from scipy.linalg import solve_triangular

from ..core import planning
from ..core.checks import check_certificate, check_conditioning, check_dictionary
from ..core.config import FitConfig
from ..core.eigensolve import (eigenvalue_error_bound, solve_additive, summation_depth,
                               solve_divisive)
from ..core.kernel_choice import resolve_kernel
from ..core.kernels import Kernel, SubsetNormalizedKernel
from ..core.model import Dictionary, SpectralMap
from ..core.pass2 import check_degrees
from ..core.rounding import with_rounding
from ..core.planning import (SAMPLE_PURPOSE, VisitOrder, plan_block_rows, plan_sample, plan_tasks,
                             small_blas, tasks_tag)
from ..core.scan.blocked import scan_rows
from ..core.scan.search import search_dictionary
from ..core.scan.state import DictionaryState, ScanProgress
from ..core.statistics import Statistic
from ..exceptions import (DictionaryError, DictionarySizeError, InvalidInputError,
                          NumericalBreakdownError)
from ..io.source import DataSource
from ..runtime.execution import Executor
from .accumulate import PartialStore, accumulate, extension_pass
from .certification import advised, certified_spectrum, rounding_report
from .exact import (EARLY_EXACT, EARLY_STOP, SHORT_EXACT, exact_at_hand, exact_limit,
                    solve_exactly)
from .scan import GreedyScan, Rescan, Selection, capped_early_stop, probe_exact
from .writeback import EmbeddingOutput, map_rows

__all__ = ["FitRun", "FitResult", "Checkpoint"]

log = logging.getLogger("ooc_spectral")


class Checkpoint(PartialStore, Protocol):
    """What a resumable run stores between restarts (see :mod:`ooc_spectral.io.checkpoint`)."""

    #: windows of the scan between two saves of its state
    every: int

    def load_scan(self) -> dict | None:
        """``{"points", "indices", "L", "w", "windows_done", "tol"}`` or None."""

    def save_scan(self, state: DictionaryState, windows_done: int, tol: float, *,
                  prefix_done: bool = False) -> None: ...


@dataclass
class FitResult:
    """Everything a fit produced; the estimator copies it into its ``*_`` attributes."""

    config: FitConfig
    n_samples: int
    n_features: int
    kernel: Kernel
    gamma: float | None
    tol: float
    dictionary: Dictionary
    spectral_map: SpectralMap
    max_residual: float
    max_residual_row: int
    task_rows: int
    #: tasks of pass 3 (equal, whole output chunks each), and rows per sub-block inside a task
    tasks: int = 0
    #: tasks of pass 2 (its last ones re-split to balance the threads, TaskPlan.tail)
    reduce_tasks: int = 0
    block_rows: int | None = None
    eigenvalue_error_bound: float | None = None
    #: every exact eigenvalue's interval, (p, 2): ``[lambda_i - lower_i, lambda_i + b + upper_i]``
    #: (:func:`~ooc_spectral.core.eigensolve.spectrum_allowance`); None for the divisive one
    eigenvalue_interval: Any = None
    #: the certificate's rounding terms (:meth:`FitRun.rounding_report`), for report.json
    rounding: dict | None = None
    exact: bool = False
    embedding: Any = None  # numpy, a lazy dask array, or the EmbeddingOutput written to
    timings: dict = field(default_factory=dict)
    peak_memory: dict = field(default_factory=dict)
    resumed: list = field(default_factory=list)
    #: Pass 2's statistics and the scan's final state (what an update of the
    #: fit with appended rows starts from, :mod:`ooc_spectral.batch.append`).
    stats: Statistic | None = None
    scan_state: Any = None
    #: The pre-image map of ``inverse_transform`` (``fit_inverse_transform=True``).
    preimage: Any = None


class FitRun:
    """One fit of one configuration on one data source.

    Parameters
    ----------
    config : FitConfig
    source : DataSource
    executor : Executor, optional
        How parallel passes are computed (default: the active scheduler).
    checkpoint : Checkpoint, optional
        Where stage state is kept across restarts.
    resume : bool
        Continue the work recorded in ``checkpoint`` and in the output.
    memory_probe : callable, optional
        Returns the current memory use in bytes; its peak per stage is recorded.
    on_scan : callable, optional
        Called with a :class:`~ooc_spectral.core.scan.state.ScanProgress` after each window.
    """

    def __init__(self, config: FitConfig, source: DataSource, *, executor: Executor | None = None,
                 checkpoint: Checkpoint | None = None, resume: bool = False,
                 memory_probe: Callable[[], int] | None = None,
                 on_scan: Callable[[ScanProgress], None] | None = None):
        self.config = config
        self.source = source
        self.executor = executor or Executor()
        self.checkpoint = checkpoint
        self.resume = resume
        self.memory_probe = memory_probe
        self.on_scan = on_scan
        self.timings: dict[str, float] = {}
        self.peak_memory: dict[str, int] = {}
        self.resumed: list[str] = []
        #: The scan's size limit (``max_dictionary_size``, or where the exact problem is at
        #: hand :func:`~.exact.exact_limit`) and its early stop (:mod:`~.exact`, :meth:`run`).
        self._scan_limit = config.max_dictionary_size
        self._scan_early: tuple[int, int, int] | None = None
        #: Whether the scan decides in double-double what float64 cannot (where the exact
        #: problem is not at hand, :mod:`ooc_spectral.core.extended`).
        self._extended = False
        #: Pass 1's selection (:mod:`ooc_spectral.pipeline.scan`): the dictionary's
        #: state, and what completing a prefix scan after pass 2 needs.
        self.selection: Selection | None = None
        #: The tasks of the parallel passes, for the executor's threads and budget.
        self.plan = plan_tasks(source.n_rows, source.n_features, source.storage_chunk_rows,
                               threads=self.executor.threads, memory=self.executor.task_memory,
                               requested=config.chunk_rows, itemsize=source.itemsize)
        if self.plan.note:
            log.warning("chunk_rows: %s", self.plan.note)

    # ------------------------------------------------------------------ #
    @contextmanager
    def stage(self, name: str):
        t0 = time.perf_counter()
        log.info("stage %s: start", name)
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
            if self.memory_probe is not None:
                self.peak_memory[name] = int(self.memory_probe())
            log.info("stage %s: %.2f s", name, self.timings[name])

    def _sample(self, purpose: str, size: int) -> tuple[np.ndarray, np.ndarray]:
        rows = plan_sample(self.source.n_rows, size, self.config.random_state, SAMPLE_PURPOSE[purpose])
        return rows, self.source.read_index(rows)

    # ------------------------------------------------------------------ #
    # stage: kernel
    # ------------------------------------------------------------------ #
    def resolve_kernel(self) -> tuple[Kernel, float | None]:
        """The kernel with its gamma (given, or the median heuristic on a seeded sample).

        For ``normalization="divisive", degree_estimate="subset"`` the base
        kernel is wrapped in a :class:`SubsetNormalizedKernel` whose subset is a
        seeded sample of ``degree_subset_size`` rows.
        """
        c = self.config
        kernel, gamma = resolve_kernel(c, self.source)
        if c.normalization == "divisive" and c.degree_estimate == "subset":
            _, subset = self._sample("degree_subset", c.degree_subset_size)
            kernel = SubsetNormalizedKernel(kernel, subset)
        return kernel, gamma

    # ------------------------------------------------------------------ #
    # stage: scan (pass 1)
    # ------------------------------------------------------------------ #
    def build_dictionary(self, kernel: Kernel) -> tuple[Dictionary, float, bool]:
        """Pass 1 (Algorithm 1), or Algorithm 2 on a sample when ``dictionary_size`` is set.

        Returns the dictionary, the tolerance it meets, and whether every row was
        scanned. With ``scan="prefix"`` the scan stops once the dictionary stops
        growing; :meth:`complete_prefix_scan` then finishes the job from the
        rows pass 2 finds beyond ``tol``. The selection (its state, order and
        progress) is kept in :attr:`selection`.
        """
        c = self.config
        order = VisitOrder(self.source.n_rows, c.random_state, window=planning.VISIT_WINDOW_ROWS)
        if c.dictionary_selection == "rpcholesky":  # its own pass 1 (ooc_spectral.pipeline.rpcholesky)
            from . import rpcholesky

            return rpcholesky.build_dictionary(self, kernel)
        saved = self.checkpoint.load_scan() if (self.checkpoint is not None and self.resume) else None

        def greedy(state, tol, done):
            return GreedyScan(self.source, order, state, tol, windows_done=done,
                              limit=self._scan_limit, max_dictionary_size=c.max_dictionary_size,
                              checkpoint=self.checkpoint, on_scan=self.on_scan,
                              early=self._scan_early)

        if saved is not None:
            state = DictionaryState.from_arrays(kernel, c.affine, saved["points"], saved["indices"],
                                                saved["L"], saved["w"])
            state.rounding.extended_allowed = self._extended
            self.selection = greedy(state, float(saved["tol"]), int(saved["windows_done"]))
            self.resumed.append("scan")
            log.info("scan: resuming after window %d of %d with %d dictionary points",
                     self.selection.windows_done, order.n_windows, state.size)
            if self.selection.complete or saved.get("prefix_done"):
                state.refine_factor()
                return state.freeze(c.solver), self.selection.tol, self.selection.complete
        elif c.dictionary_size is not None:
            if c.dictionary_selection == "random":
                state, tol = self._random_dictionary(kernel, order)
            else:
                state, tol = self._algorithm2(kernel, order)
            if self.checkpoint is not None:
                self.checkpoint.save_scan(state, order.n_windows, tol)
            self.selection = greedy(state, tol, order.n_windows)
            return state.freeze(c.solver), tol, True
        else:
            if self._scan_early == EARLY_EXACT:  # the exact problem, told before the scan
                probe_exact(self.source, order, kernel, c.affine, c.tol, self._scan_limit)
            state = DictionaryState(kernel, self.source.n_features, c.affine)
            state.rounding.extended_allowed = self._extended
            self.selection = greedy(state, c.tol, 0)
        complete = self.selection.run(patience=c.prefix_patience if c.scan == "prefix" else None)
        self.selection.state.refine_factor()
        return self.selection.state.freeze(c.solver), self.selection.tol, complete

    def complete_prefix_scan(self, stats: Statistic, tol: float) -> Rescan:
        """Bring the rows pass 2 found beyond ``tol`` (``stats.beyond``) within it:
        :meth:`Selection.complete_from <ooc_spectral.pipeline.scan.Selection.complete_from>`
        of the selection pass 1 made."""
        return self.selection.complete_from(stats.beyond, tol)

    def _search_sample(self, order: VisitOrder) -> tuple[np.ndarray, np.ndarray]:
        """Rows (numbers, values) in random order on which ``dictionary_size`` is met."""
        c = self.config
        if self.source.n_rows <= c.sample_size:
            rows = order.global_order()
            return rows, self.source.read_index(np.arange(self.source.n_rows))[rows]
        sorted_rows, X = self._sample("dictionary_size", c.sample_size)
        rng = np.random.default_rng(np.random.SeedSequence([c.random_state, 0xA1]))
        perm = rng.permutation(len(sorted_rows))
        return sorted_rows[perm], X[perm]

    def _algorithm2(self, kernel: Kernel, order: VisitOrder) -> tuple[DictionaryState, float]:
        c = self.config
        rows, X = self._search_sample(order)
        log.info("dictionary_size=%d: Algorithm 2 on %d in-memory rows", c.dictionary_size, len(rows))
        return search_dictionary(kernel, X, rows, c.dictionary_size, affine=c.affine)

    def _random_dictionary(self, kernel: Kernel, order: VisitOrder) -> tuple[DictionaryState, float]:
        """The first ``dictionary_size`` rows of the random sample not already in the span."""
        c = self.config
        rows, X = self._search_sample(order)
        state = DictionaryState(kernel, self.source.n_features, c.affine)
        scan_rows(state, X, rows, -np.inf, limit=c.dictionary_size, certify=False)
        if state.size < c.dictionary_size:
            raise DictionaryError(
                f"dictionary_size={c.dictionary_size} cannot be reached: only {state.size} of "
                f"the {len(rows)} sampled rows are outside the span of the others; ask for "
                f"dictionary_size <= {state.size}"
            )
        _, delta = state.freeze().project(X)
        return state, float(max(delta.max(), 0.0))

    def check_dictionary(self, dictionary: Dictionary, kernel: Kernel, gamma, tol: float) -> None:
        """:func:`~ooc_spectral.core.checks.check_dictionary` for this fit's data."""
        check_dictionary(dictionary, kernel, gamma, tol, self.config, self.source.n_rows,
                         self.source.n_features)

    # ------------------------------------------------------------------ #
    # stages: pass 2 and the eigensolve
    # ------------------------------------------------------------------ #
    def task_rows(self, dictionary_size: int | None = None) -> int:
        """Rows per task of the parallel passes (:attr:`plan`; not a function of m)."""
        return self.plan.rows

    def reduce_view(self):
        """The input as the reduction passes' tasks: the plan's equal tasks, the last ones
        re-split so that the threads finish together (:attr:`TaskPlan.tail`)."""
        return self.source.task_view(self.plan.reduce_chunks(self.source.n_rows))

    def tail_of(self, X) -> int:
        """How many of X's last row chunks are :meth:`reduce_view`'s re-split tail."""
        tail = self.plan.tail
        return len(tail) if tail and tuple(X.chunks[0][-len(tail):]) == tail else 0

    def write_view(self, out: EmbeddingOutput | None):
        """The input as pass 3's tasks: equal tasks of whole output chunks (a resumed
        output keeps its chunks)."""
        rows = self.plan.rows if out is None else out.task_rows(self.plan.rows)
        return self.source.task_view(rows)

    def block_rows(self, dictionary_size: int) -> int:
        """Rows per sub-block of a task with a dictionary of ``dictionary_size`` points."""
        s = self.source
        return plan_block_rows(self.plan.rows, s.n_features, dictionary_size,
                               memory=self.executor.task_memory, itemsize=s.itemsize,
                               cache=self.executor.cache_block)

    def accumulate(self, dictionary: Dictionary, X, tol_check: float | None = None
                   ) -> tuple[Statistic, np.ndarray | None]:
        """Pass 2 (and 2b for exact divisive degrees); returns the statistic (``Moments``,
        ``Gram`` or ``Degrees``, with its certificate) and, for exact degrees, ``sum z``."""
        store = self.checkpoint
        loaded_before = getattr(store, "loaded_partials", 0)
        try:
            return self._accumulate(dictionary, X, tol_check)
        finally:
            if getattr(store, "loaded_partials", 0) > loaded_before:
                self.resumed.append("pass2")

    def _accumulate(self, dictionary: Dictionary, X, tol_check: float | None):
        c = self.config
        # partials are only valid for the same tasks and dictionary
        tag = f"{tasks_tag(X.chunks[0])}-m{dictionary.size}" + ("-check" if tol_check is not None else "")

        def run(kind, check=tol_check, **extra):
            return accumulate(X, dictionary, kind, executor=self.executor,
                              chunk_starts=self.source.chunk_starts, store=self.checkpoint,
                              stage=f"{kind}-{tag}", tol_check=check,
                              block_rows=self.block_rows(dictionary.size),
                              tail=self.tail_of(X), **extra)

        if c.normalization == "additive":
            return run("moments"), None
        if c.degree_estimate == "subset":
            return run("gram"), None
        sums = run("ksums", check=None)
        # sum_t z_t = L^-1 sum_t k_t: one small solve instead of one per row
        total = solve_triangular(dictionary.L, sums.sum, lower=True, check_finite=False)
        stats = run("degrees", total=total)
        if stats.min_degree <= 0:
            row = self.source.read_index(np.array([stats.argmin], dtype=np.int64))
            check_degrees(stats, c.negative_values if _negative_on(dictionary, row) else None)
        return stats, total

    def solve(self, dictionary: Dictionary, stats: Statistic, total,
              depth: int | None = None) -> SpectralMap:
        c = self.config
        if c.normalization == "additive":
            return solve_additive(dictionary, stats, c.n_components, depth=depth)
        return solve_divisive(dictionary, stats, c.n_components, drop_first=c.drop_first,
                              subset=c.degree_estimate == "subset", total=total)

    def with_rounding(self, dictionary: Dictionary, tol: float, cap: float = math.inf) -> Dictionary:
        """The dictionary with the constants pass 2 bounds every row's rounding with
        (:func:`~ooc_spectral.core.rounding.with_rounding`; O(m^3), BLAS): rows whose
        cheap bound exceeds ``tol`` get the sharp one; ``cap``, a bound every row's
        residual already has (the tol of a scan that certified each row it skipped; none
        at tol 0, whose scan certifies rows within ZERO_TOL_SKIP k(x, x), not within tol)."""
        state = None if self.selection is None else self.selection.state
        gram = getattr(getattr(state, "rounding", None), "extended", None)
        with self.stage("rounding"), small_blas(dictionary.size):
            return with_rounding(dictionary, target=tol, cap=cap if tol > 0 else math.inf,
                                 extended=None if gram is None else gram.copy())

    def advised(self, err: NumericalBreakdownError, kernel: Kernel) -> NumericalBreakdownError:
        """:func:`~ooc_spectral.pipeline.certification.advised` for this fit."""
        return advised(self, err, kernel)

    def broke_down(self, err: NumericalBreakdownError, kernel: Kernel, gamma, out, exact: bool):
        """The exact problem where it is at hand (:meth:`run_exact`:
        a tol below what float64 certifies with a dictionary asks for it), else ``err``
        advised."""
        if exact and self.config.tol is not None:
            return self.run_exact(kernel, gamma, out, breakdown=err)
        raise self.advised(err, kernel) from err

    def finish_prefix_scan(self, dictionary, X, stats, total, kernel, gamma, tol):
        """After a prefix scan: scan the rows beyond ``tol``, then bring pass 2 up to date.

        Kernel PCA extends its coordinate moments to the points added with one
        pass (:func:`~ooc_spectral.pipeline.accumulate.extension_pass`: kernel columns only
        when the grown factor is well conditioned, else a solve); the divisive
        normalization runs pass 2 again. Returns the updated
        ``(dictionary, X, stats, total)``; the statistic's certificate bounds
        every row's residual with the final dictionary.
        """
        c, s = self.config, self.source
        with self.stage("rescan"):
            rescan = self.complete_prefix_scan(stats, tol)
        stats = dataclasses.replace(stats, beyond=None)  # the rows are scanned: drop them
        if not rescan.grew:
            return dictionary, X, dataclasses.replace(stats, certificate=rescan.certificate), total
        self.selection.state.refine_factor()
        old_size, dictionary = dictionary.size, self.selection.state.freeze(c.solver)
        log.info("dictionary: %d points", dictionary.size)
        self.check_dictionary(dictionary, kernel, gamma, tol)
        # every row is certified within tol: by pass 2's bound or by the rescan
        dictionary = self.with_rounding(dictionary, tol, cap=tol)
        with self.stage("pass2"):
            if c.normalization == "additive" and not rescan.rescanned_all:
                grown, fresh = extension_pass(
                    X, dictionary, stats, old_size, executor=self.executor,
                    chunk_starts=s.chunk_starts, store=self.checkpoint,
                    stage=f"{tasks_tag(X.chunks[0])}-m{old_size}to{dictionary.size}",
                    block_rows=self.block_rows(dictionary.size), tail=self.tail_of(X))
                # the solved extension measures the grown dictionary's certificate; the
                # kernel-space one keeps the rescan's upper bound
                if not fresh:
                    grown = dataclasses.replace(grown, certificate=rescan.certificate)
                return dictionary, X, grown, total
            X = self.reduce_view()
            stats, total = self.accumulate(dictionary, X)
        return dictionary, X, stats, total

    def run_exact(self, kernel: Kernel, gamma, out, *, breakdown=None, early=None,
                  short=None, refusal=None) -> FitResult:
        """The exact problem (:func:`~ooc_spectral.pipeline.exact.solve_exactly`: the
        dictionary heads for every row, ``breakdown``, a tol below what float64 certifies
        with a dictionary, or ``short``, a dictionary of that many points, too few for
        ``n_components``; ``refusal`` raised where even the exact problem does not resolve
        them), then pass 3: no row has a residual."""
        c, s = self.config, self.source
        smap, interval, bound, preimage = solve_exactly(
            self, kernel, gamma, breakdown=breakdown, early=early, short=short, refusal=refusal)
        X = self.write_view(out)
        with self.stage("pass3"):
            embedding = self.write_embedding(X, smap, out)
        return FitResult(
            config=c, n_samples=s.n_rows, n_features=s.n_features, kernel=kernel, gamma=gamma,
            tol=c.tol, dictionary=smap.dictionary, spectral_map=smap, max_residual=0.0,
            max_residual_row=0, task_rows=int(X.chunks[0][0]), embedding=embedding,
            tasks=len(X.chunks[0]), reduce_tasks=0, block_rows=self.block_rows(s.n_rows),
            eigenvalue_error_bound=bound, eigenvalue_interval=interval,
            timings=dict(self.timings), peak_memory=dict(self.peak_memory),
            resumed=list(self.resumed), exact=True, preimage=preimage)

    def fit_preimage(self, X, smap: SpectralMap):
        """The pre-image map of ``inverse_transform``: one parallel pass after the solve.

        Accumulates ``sum k k'`` and ``sum k x'`` with ``k = k(e(x), E_D)`` (m x m
        and m x d) and solves the ridge system (:mod:`ooc_spectral.core.preimage`).
        """
        from ..core.preimage import PreimageProblem, solve_preimage

        d = smap.dictionary
        problem = PreimageProblem(smap, d.kernel.without_center(), smap.embed(d.points))
        stats = accumulate(X, problem, "preimage", executor=self.executor,
                           chunk_starts=self.source.chunk_starts, store=self.checkpoint,
                           stage=f"preimage-{tasks_tag(X.chunks[0])}-m{d.size}-p{smap.n_components}",
                           block_rows=self.block_rows(d.size), tail=self.tail_of(X))
        return solve_preimage(stats, problem, self.config.alpha)

    def write_embedding(self, X, smap: SpectralMap, out: EmbeddingOutput | None):
        """Pass 3: the lazy embedding (computed for numpy input), or ``out`` once written."""
        block = self.block_rows(smap.dictionary.size)
        if out is not None and out.n_components != smap.n_components:
            # n_components=None: the placeholder made before the fit becomes the real array
            out = EmbeddingOutput(out.url, out.n_rows, smap.n_components, out.chunk_rows,
                                  dtype=out.dtype).prepare(resume=False)
        if out is None:  # numpy for numpy input, else the lazy dask array
            return map_rows(X, smap, chunk_starts=self.source.chunk_starts,
                            block_rows=block, dtype=self.config.output_dtype)
        # X is write_view(out): whole output chunks per task (out.write raises otherwise)
        written = out.write(X, smap, self.executor, block_rows=block)
        if self.resume and written < self.source.n_rows:
            self.resumed.append("pass3")
        out.mark_complete()
        return out

    # ------------------------------------------------------------------ #
    # the whole fit
    # ------------------------------------------------------------------ #
    def run(self, output=None) -> FitResult:
        """Run every stage; write the embedding to ``output`` (a zarr group path) if given."""
        c, s = self.config, self.source
        if s.n_rows < 2:
            raise InvalidInputError(
                f"X has {s.n_rows} row; at least 2 samples are needed to fit an embedding")
        rows_hold = s.n_rows - (1 if c.normalization == "additive" else int(c.drop_first))
        if c.n_components is not None and c.n_components > rows_hold:  # before any work
            raise DictionaryError(
                f"n_components={c.n_components} exceeds what the {s.n_rows} rows of X hold: "
                f"at most {rows_hold} components ("
                + ("centring takes one direction" if c.normalization == "additive" else
                   "the trivial first one dropped" if c.drop_first else "one per row")
                + f"); lower n_components to at most {rows_hold}")
        out = None
        if output is not None:  # created (or checked) before any work starts
            # n_components=None: a one-column placeholder, marked incomplete, until the
            # solve knows the number of columns (write_embedding)
            out = EmbeddingOutput(output, s.n_rows, c.n_components or 1,
                                  self.plan.output_chunk_rows, dtype=c.output_dtype)
            out.prepare(resume=self.resume)
        with self.stage("kernel"):
            kernel, gamma = self.resolve_kernel()
        exact = exact_at_hand(c, s.n_rows)
        self._extended = not exact
        if exact:  # a dictionary heading for every row: the exact problem, or a stop
            self._scan_limit = min(c.max_dictionary_size, exact_limit(s.n_rows))
            self._scan_early = EARLY_EXACT
        elif s.n_rows > c.max_dictionary_size:
            self._scan_early = EARLY_STOP
            if (early := capped_early_stop(c, s, kernel)) is not None:
                raise early  # told before any costlier work: only the cap keeps exact
        try:
            with self.stage("scan"):
                dictionary, tol, complete = self.build_dictionary(kernel)
        except DictionarySizeError as err:
            if not exact:
                raise
            return self.run_exact(kernel, gamma, out, early=getattr(err, "early", None))
        except NumericalBreakdownError as err:
            return self.broke_down(err, kernel, gamma, out, exact)
        log.info("dictionary: %d points", dictionary.size)
        try:
            self.check_dictionary(dictionary, kernel, gamma, tol)
        except DictionaryError as err:  # too few points: at this tol, or a constant kernel
            if exact and (kind := getattr(err, "kind", None)) in SHORT_EXACT:
                return self.run_exact(kernel, gamma, out, short=dictionary.size,
                                      refusal=err if kind == "constant" else None)
            raise
        try:
            check_conditioning(dictionary, tol)
            # a complete greedy scan certified every row it skipped: rows are within tol
            dictionary = self.with_rounding(dictionary, tol, cap=tol if complete and c.dictionary_size
                                            is None and c.dictionary_selection == "greedy" else math.inf)
            X = self.reduce_view()
            with self.stage("pass2"):
                stats, total = self.accumulate(dictionary, X, tol_check=None if complete else tol)
            if not complete:
                dictionary, X, stats, total = self.finish_prefix_scan(
                    dictionary, X, stats, total, kernel, gamma, tol)
            cert = stats.certificate
            sums = stats.sums if c.normalization == "additive" else None
            check_conditioning(dictionary, tol)
            if c.dictionary_size is None:
                check_certificate(cert, tol, dictionary.size, kernel, dictionary,
                                  max_kx=sums.max_kx if sums is not None else 0.0, sums=sums)
            depth = summation_depth(s.n_rows, self.plan.rows, len(X.chunks[0]))
            with self.stage("solve"), small_blas(dictionary.size):
                smap = self.solve(dictionary, stats, total, depth)
                smap, interval = certified_spectrum(dictionary, stats, smap, depth, tol,
                                                    c.n_components, additive=sums is not None)
        except NumericalBreakdownError as err:
            return self.broke_down(err, kernel, gamma, out, exact)
        preimage = None
        if c.fit_inverse_transform:
            with self.stage("preimage"):
                preimage = self.fit_preimage(X, smap)
        reduce_tasks = len(X.chunks[0])
        X = self.write_view(out)
        with self.stage("pass3"):
            embedding = self.write_embedding(X, smap, out)
        return FitResult(
            config=c, n_samples=s.n_rows, n_features=s.n_features, kernel=kernel, gamma=gamma,
            tol=tol, dictionary=dictionary, spectral_map=smap,
            max_residual=max(float(cert.max_delta), 0.0),
            max_residual_row=int(cert.argmax), task_rows=int(X.chunks[0][0]), embedding=embedding,
            tasks=len(X.chunks[0]), reduce_tasks=reduce_tasks,
            block_rows=self.block_rows(dictionary.size),
            eigenvalue_error_bound=(eigenvalue_error_bound(sums, dictionary.size)
                                    if sums is not None else None),
            eigenvalue_interval=interval, rounding=rounding_report(dictionary, sums),
            timings=dict(self.timings), peak_memory=dict(self.peak_memory),
            resumed=list(self.resumed), stats=stats,
            scan_state=None if self.selection is None else self.selection.state,
            preimage=preimage,
        )


def _negative_on(dictionary: Dictionary, rows: np.ndarray) -> bool:
    """Whether the kernel is negative between the dictionary's points, or between ``rows``
    (the row of the non-positive degree) and them: then that row's exact degree can be
    negative too, the kernel's doing, not the approximation's."""
    points = np.vstack([dictionary.points, np.asarray(rows, dtype=np.float64)])
    K, _ = dictionary.kernel_block(points, dictionary.kernel.aux(points))
    return bool(np.any(K < 0))
