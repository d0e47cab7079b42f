"""Worker and task memory: what one worker process uses, the smallest limit that runs the
passes, and the budget of one task.

A dask worker holds its own resident memory (:data:`WORKER_BASELINE`) plus its
tasks; dask pauses a worker past a fraction of its limit and restarts it past
another. :func:`smallest_memory_limit` and :func:`check_memory_limit` refuse a
``--memory-limit`` under which no task could run; :func:`task_memory_budget` is the
budget :func:`~ooc_spectral.core.planning.plan_tasks` plans one task with.
"""

from __future__ import annotations

__all__ = ["WORKER_BASELINE", "format_bytes", "smallest_memory_limit", "check_memory_limit",
           "TASK_MEMORY_FRACTION", "task_memory_budget", "cache_block_bytes"]


#: Resident memory of a worker process with ooc_spectral imported, before its tasks' own
#: arrays, rounded up (docs/measurements.md, "Start-up and resident costs").
WORKER_BASELINE = 224 * 2**20


def format_bytes(n: int) -> str:
    """``n`` bytes as a ``--memory-limit`` value (MiB, rounded up)."""
    return f"{-(-int(n) // 2**20)}MiB"


def _fraction(key: str, default: float) -> float:
    import dask

    value = dask.config.get(f"distributed.worker.memory.{key}", default)
    return float(value) if value else 1.0


def smallest_memory_limit(task_bytes: int | None = None) -> int:
    """The smallest per-worker memory limit that runs one task of the passes.

    A worker's resident memory (:data:`WORKER_BASELINE`) plus one task's budget
    must stay under dask's terminate fraction of the limit, and the idle worker
    under its pause fraction; rounded up to 32 MiB.
    """
    from ..core.planning import DEFAULT_TASK_MEMORY

    task = DEFAULT_TASK_MEMORY if task_bytes is None else int(task_bytes)
    need = max((WORKER_BASELINE + task) / _fraction("terminate", 0.95),
               WORKER_BASELINE / _fraction("pause", 0.8))
    step = 32 * 2**20
    return int(-(-need // step) * step)


def check_memory_limit(value) -> int | None:
    """``--memory-limit`` in bytes (None for ``auto``), or :class:`InvalidParameterError`.

    A limit under which an idle worker process cannot even stay alive (dask
    restarts it forever) is refused before any cluster starts.
    """
    from dask.utils import parse_bytes

    from ..exceptions import InvalidParameterError

    if value is None or str(value).strip().lower() == "auto":
        return None
    try:
        limit = int(parse_bytes(value))
    except (ValueError, TypeError):
        raise InvalidParameterError(
            f"--memory-limit {value!r} is not a size; write it like 4GiB or 800MB, or 'auto'"
        ) from None
    if limit <= 0:
        raise InvalidParameterError(f"--memory-limit {value!r} must be positive (or 'auto')")
    floor = WORKER_BASELINE / _fraction("pause", 0.8)
    if limit < floor:
        raise InvalidParameterError(
            f"--memory-limit {value} is too small: a dask worker process uses about "
            f"{format_bytes(WORKER_BASELINE)} before any task and is paused or restarted "
            f"forever below {format_bytes(floor)}; the smallest limit that runs the passes is "
            f"about {format_bytes(smallest_memory_limit())}: pass --memory-limit "
            f"{format_bytes(smallest_memory_limit())} or more"
        )
    return limit


#: Share of a worker's memory limit the tasks of a worker may use together (the rest:
#: the worker process itself and dask's margins before it pauses or restarts a worker).
TASK_MEMORY_FRACTION = 0.6


def task_memory_budget(memory_limit: int | None, threads_per_worker: int = 1) -> int:
    """Memory budget of one task: :data:`~ooc_spectral.core.planning.DEFAULT_TASK_MEMORY`,
    or less when a worker's ``memory_limit`` (shared by its ``threads_per_worker``
    tasks) needs it: ``(0.6 limit - worker baseline) / threads``, at least 32 MiB.

    The dask config ``ooc-spectral.task-memory`` (env
    ``DASK_OOC_SPECTRAL__TASK_MEMORY``, e.g. ``512MiB``) sets it instead.
    """
    import dask
    from dask.utils import parse_bytes

    from ..core.planning import DEFAULT_TASK_MEMORY

    given = dask.config.get("ooc-spectral.task-memory", None)
    if given:
        return int(parse_bytes(given) if isinstance(given, str) else given)
    if not memory_limit:
        return DEFAULT_TASK_MEMORY
    share = (TASK_MEMORY_FRACTION * int(memory_limit) - WORKER_BASELINE) // max(1, int(threads_per_worker))
    return int(max(32 * 2**20, min(DEFAULT_TASK_MEMORY, share)))


def cache_block_bytes() -> int:
    """Largest kernel block of a task's sub-block, bytes:
    :data:`~ooc_spectral.core.planning.CACHE_BLOCK_BYTES`, or the dask config
    ``ooc-spectral.cache-block`` (env ``DASK_OOC_SPECTRAL__CACHE_BLOCK``, e.g.
    ``32MiB`` on a machine with a larger cache per core)."""
    import dask
    from dask.utils import parse_bytes

    from ..core.planning import CACHE_BLOCK_BYTES

    given = dask.config.get("ooc-spectral.cache-block", None)
    if given:
        return int(parse_bytes(given) if isinstance(given, str) else given)
    return CACHE_BLOCK_BYTES
