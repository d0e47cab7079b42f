"""The exceptions ooc_spectral raises.

A small hierarchy in the manner of zarr-python: every class derives from
:class:`OocSpectralError` and also from the built-in exception a caller would
naturally catch (``ValueError`` for bad input and parameters, as scikit-learn
does, ``FileNotFoundError`` for a missing store, ``RuntimeError`` for a run that
cannot go on). Messages say what was expected, what was found and how to fix it.

The command line maps :class:`UsageError` (and its subclasses) to exit code 2 and
every other failure to exit code 1.
"""

from __future__ import annotations

import threading

#: The exceptions the package re-exports at its top level (``ooc_spectral.__all__``).
PUBLIC = [
    "OocSpectralError",
    "UsageError",
    "InvalidParameterError",
    "ModelNotSavableError",
    "InvalidInputError",
    "NonFiniteInputError",
    "StoreNotFoundError",
    "StoreReadError",
    "OutputNotWritableError",
    "DictionaryError",
    "DictionarySizeError",
    "DictionaryWarning",
    "DegeneratePartitionWarning",
    "FarRowsWarning",
    "NotFittedError",
    "ConfigurationMismatchError",
    "LockedError",
    "WorkflowError",
    "WorkerMemoryError",
    "WorkersLostError",
    "SchedulerError",
    "StorageBackendError",
    "InterruptedRun",
]

__all__ = PUBLIC + [
    "warn_once",
    "NumericalBreakdownError",
    "IncompleteInputError",
    "InvalidInputTypeError",
    "MissingChunkError",
    "TransientReadError",
    "DamagedDataError",
    "DamagedFileError",
    "OutputDamagedError",
    "OutputIncompleteError",
    "StalledRunError",
]


class OocSpectralError(Exception):
    """Base class of every exception raised by ooc_spectral."""


class UsageError(OocSpectralError):
    """A problem with what the caller asked for: input, parameters, configuration.

    The command line exits with code 2 on these.
    """


class InvalidParameterError(UsageError, ValueError):
    """A parameter is out of range, of the wrong type, or inconsistent with another."""


class ModelNotSavableError(InvalidParameterError):
    """The fitted model cannot be saved as data: its kernel is a Python callable.

    Models are zarr arrays and JSON, never pickle; a callable would need pickle.
    """


class InvalidInputError(UsageError, ValueError):
    """The data matrix cannot be used: wrong shape, dtype, or content."""


class InvalidInputTypeError(InvalidInputError, TypeError):
    """The data matrix is of a type that cannot be used (an object array of
    non-numbers, ``np.matrix``): also a ``TypeError``, as scikit-learn raises there."""


class NonFiniteInputError(InvalidInputError):
    """The data matrix holds NaN or infinity; the message names the chunk and row."""

    def __init__(self, message: str, *, row: int | None = None, chunk: int | None = None):
        super().__init__(message)
        self.row = row
        self.chunk = chunk


class StoreNotFoundError(UsageError, FileNotFoundError):
    """A zarr store, array or model that was named does not exist."""


class StoreReadError(UsageError, OSError):
    """A chunk of the input store could not be read or decoded; the message names it.

    An input error (exit code 2): the data must be repaired before a rerun helps.
    """


class OutputNotWritableError(UsageError, PermissionError):
    """The output location cannot be written; raised before any work starts."""


class DictionaryError(UsageError, ValueError):
    """The dictionary found by the scan cannot support the requested embedding.

    For example ``n_components`` is not below the dictionary size, or the scan
    grew the dictionary past ``max_dictionary_size``.
    """


class DictionarySizeError(DictionaryError):
    """The scan grew the dictionary past ``max_dictionary_size``."""


class NumericalBreakdownError(UsageError, ArithmeticError):
    """The eigensolve's statistics fail a run-time check of the arithmetic.

    Pass 2's m x m statistic must be positive semi-definite, its trace must equal
    the rows' squared centred norms summed one by one, and no eigenvalue may
    exceed ``sum k(x, x)``. When one of these fails the spectrum would be wrong,
    so it is never returned; the message says which check failed, by how much,
    and what to change.
    """


def _define_not_fitted_error():
    from sklearn.exceptions import NotFittedError as _SklearnNotFittedError

    class NotFittedError(OocSpectralError, _SklearnNotFittedError):
        """The estimator is used before ``fit``; a subclass of scikit-learn's
        :class:`sklearn.exceptions.NotFittedError` (so also ``ValueError`` and
        ``AttributeError``), so ``except sklearn.exceptions.NotFittedError`` catches it."""

    NotFittedError.__qualname__ = "NotFittedError"
    return NotFittedError


_LAZY_LOCK = threading.Lock()


def __getattr__(name):
    # NotFittedError subclasses scikit-learn's, whose import takes most of the
    # package's import time (docs/measurements.md, "Start-up and resident costs"); the
    # command line and the worker processes never raise it, so it is defined on first
    # use (once: under a lock).
    if name == "NotFittedError":
        with _LAZY_LOCK:
            if "NotFittedError" not in globals():
                globals()["NotFittedError"] = _define_not_fitted_error()
        return globals()["NotFittedError"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ConfigurationMismatchError(UsageError, ValueError):
    """An output directory holds a run with a different configuration."""


class LockedError(UsageError, RuntimeError):
    """Another live run holds the lock on an output directory."""


class WorkflowError(UsageError, ValueError):
    """A workflow file is malformed; the message names the file, step and key."""


class WorkerMemoryError(UsageError, MemoryError):
    """The dask workers' memory limit is too small for this run; the message names the
    limit and the smallest that works (exit code 2: a configuration error)."""


class WorkersLostError(OocSpectralError, RuntimeError):
    """No dask worker was left for a bounded time, or workers kept dying on one task.

    A runtime failure (exit code 1): rerun the same command once workers are back.
    """


class SchedulerError(UsageError, ConnectionError):
    """The scheduler address does not answer as a dask scheduler (exit code 2).

    A scheduler that speaks dask but cannot be reached in time is a
    :class:`ConnectionError` of the runtime kind instead (exit code 1).
    """


def interrupt_signals() -> tuple:
    """The signals that interrupt a command (marked ``interrupted``, exit 1, resumable)
    rather than end the process by their default action: SIGTERM (systemd, SLURM,
    Kubernetes), SIGINT (Ctrl-C), SIGHUP (the terminal or SSH session closed) and SIGUSR1,
    SIGUSR2 (whose default action is also to terminate; batch systems send them as a
    warning before the end of a job's time)."""
    import signal

    names = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
    return tuple(getattr(signal, n) for n in names if hasattr(signal, n))


class InterruptedRun(KeyboardInterrupt):
    """The run received one of :func:`interrupt_signals` (SIGTERM, SIGINT, ...); it is
    marked ``interrupted`` and resumable."""

    def __init__(self, signum: int = 2):
        super().__init__(signum)
        self.signum = signum


#: The signal whose :class:`InterruptedRun` has not reached the command line yet.
_PENDING_INTERRUPT: list[int] = []


def note_interrupt(signum: int) -> None:
    """Record a signal whose handler is about to raise :class:`InterruptedRun`.

    A signal handler runs between two bytecodes of the main thread, wherever they
    are: inside a weakref callback or a ``__del__`` the interpreter prints the
    exception and drops it ("Exception ignored in ..."), and the run would go on to
    the end as if no signal had come. :func:`raise_if_interrupted`, called where a
    run moves on (each finished part of a pass, each window of the scan), raises it
    again there.
    """
    _PENDING_INTERRUPT[:] = [int(signum)]


def take_interrupt() -> int | None:
    """The noted signal whose :class:`InterruptedRun` was dropped, now taken (or None)."""
    return _PENDING_INTERRUPT.pop() if _PENDING_INTERRUPT else None


def raise_if_interrupted() -> None:
    """Raise the :class:`InterruptedRun` of a noted signal that was dropped (once)."""
    signum = take_interrupt()
    if signum is not None:
        raise InterruptedRun(signum)


def note_signals_while_starting() -> None:
    """Note the interrupt signals (instead of dying by them) while the command line's modules
    are imported; its ``main`` then exits 1, "nothing was done". Called first by the console
    script and ``python -m ooc_spectral`` (never by an import of the library)."""
    import signal

    if threading.current_thread() is threading.main_thread():
        for sig in interrupt_signals():
            signal.signal(sig, lambda signum, frame: note_interrupt(signum))


def clear_interrupt() -> None:
    """The :class:`InterruptedRun` reached its handler: nothing left to raise."""
    _PENDING_INTERRUPT.clear()


class IncompleteInputError(InvalidInputError):
    """The input's writer marked it incomplete (``make-data``'s ``complete: false``)."""


class MissingChunkError(StoreReadError):
    """A chunk of the input store has no object (zarr would read it as fill values)."""


class TransientReadError(OocSpectralError, OSError):
    """Reads of the input kept failing with I/O or network errors after the retries.

    A runtime failure (exit code 1): rerun the same command to resume.
    """


class InputChangedError(OocSpectralError, RuntimeError):
    """The input changed while a run read it, so its result would mix two inputs.

    A runtime failure (exit code 1): the run is left unfinished, and the same command
    run again starts clean on the input as it then is.
    """


class DamagedDataError(UsageError, ValueError):
    """Saved data (a model's arrays, an output chunk) fails its checksum or digest."""


class DamagedFileError(DamagedDataError):
    """A JSON file a command reads (a ``zarr.json``, ``report.json``, a model's
    attributes) is garbled; the message names the file and the repair (exit code 2:
    rerunning alone would fail the same way)."""


class OutputIncompleteError(UsageError, FileNotFoundError):
    """A fit OUTDIR given as the model to apply (``ooc-spectral transform OUTDIR``) holds no
    whole result: its fit did not finish, or a member a complete OUTDIR holds is missing or
    another run's (``embedding``, ``model``, ``report.json``, an array's metadata); exit
    code 2, the message names the fit command to rerun. (``verify`` reports the same as
    :class:`OutputDamagedError`, exit 1.)"""


class StalledRunError(OocSpectralError, RuntimeError):
    """The workers stopped making progress (paused at their memory limit, or stuck) for
    longer than the watchdog allows; exit code 1, the message names the memory limit."""


class OutputDamagedError(OocSpectralError, RuntimeError):
    """``ooc-spectral verify`` found damage: missing or damaged chunks, a member missing or
    another run's, a garbled ``zarr.json``, an unfinished data set (exit code 1 for every
    kind; the message names the command that repairs it)."""


class StorageBackendError(UsageError, ValueError):
    """A URL whose scheme fsspec does not know, or whose file system is not installed;
    the message names the package to install (``pip install s3fs``). Exit code 2."""


class DictionaryWarning(UserWarning):
    """The dictionary is degenerate in a way that still allows a result (e.g. m = n)."""


class DegeneratePartitionWarning(UserWarning):
    """A clustering or a divisive (Laplacian) embedding that says little about the data:
    one cluster holds almost every row and the others a handful, leading coordinates
    carried by a handful of rows, or a graph in pieces (several leading eigenvalues equal
    to 1). The message names what to change (:mod:`ooc_spectral.core.degenerate`)."""


class FarRowsWarning(UserWarning):
    """Rows so far from every representative of a clustering that their graph weights
    underflow: each is placed by its nearest representatives alone (the limit of its
    weights). Often missing-value codes (such as -9999) or rows in other units."""


def warn_once(message: str, category: type[Warning], *, stacklevel: int = 2,
              logger: str = "ooc_spectral") -> None:
    """Say ``message`` once (issue 38): as a log line where the package's logger has a
    handler of its own (the command line's, or one the user attached to
    ``logging.getLogger("ooc_spectral")``), else as a ``warnings.warn`` of ``category``,
    which users filter with ``warnings.simplefilter`` and tests catch with
    ``pytest.warns``. Never both: a filtered warning is not printed again by logging's
    last-resort handler. ``stacklevel`` counts from the caller, as ``warnings.warn``'s."""
    import logging
    import warnings

    log = logging.getLogger(logger)
    if log.handlers:
        log.warning(message)
    else:
        warnings.warn(message, category, stacklevel=stacklevel + 1)
