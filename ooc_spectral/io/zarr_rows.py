"""Reading rows of a zarr array where a task runs: retried on I/O errors, named on damage.

:class:`ZarrRows` is a zarr array as a task argument (the rows of a
:class:`~ooc_spectral.io.row_blocks.RowBlocks`): it reads a range of rows, retrying I/O and network errors with exponential backoff
(:class:`ReadRetry`), and names the storage chunk that cannot be decoded. Split from
:mod:`ooc_spectral.io.source`, which opens and validates the input.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..exceptions import StoreReadError, TransientReadError

log = logging.getLogger("ooc_spectral")

__all__ = ["ReadRetry", "is_transient", "ZarrRows", "read_zarr_block", "ChunkDigests"]


@dataclass(frozen=True)
class ReadRetry:
    """How reads of input chunks are retried when they fail with an I/O or network error.

    Attributes
    ----------
    attempts : int
        Tries per read, the first included (``$OOC_SPECTRAL_READ_ATTEMPTS``, default 5).
    backoff : float
        Seconds before the second try; doubled each time, capped at 30 s
        (``$OOC_SPECTRAL_READ_BACKOFF``, default 0.5).
    """

    attempts: int = 5
    backoff: float = 0.5

    @classmethod
    def from_env(cls) -> "ReadRetry":
        try:
            attempts = int(os.environ.get("OOC_SPECTRAL_READ_ATTEMPTS", cls.attempts))
            backoff = float(os.environ.get("OOC_SPECTRAL_READ_BACKOFF", cls.backoff))
        except ValueError:
            return cls()
        return cls(max(1, attempts), max(0.0, backoff))


def is_transient(exc: BaseException) -> bool:
    """True for failures a later try can cure: I/O, connection and time-out errors.

    A chunk that is read but fails to decode (checksum, codec, shape: ``ValueError``
    and zarr's own errors) is permanent, and so is a missing file or a denied
    permission. Classified by exception types, never by names.
    """
    if isinstance(exc, StoreReadError):
        return False
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    return isinstance(exc, (OSError, TimeoutError, ConnectionError))


@dataclass(frozen=True, eq=False)
class ChunkDigests:
    """The per-chunk digests the writer of a data set recorded (``make-data``, ``import``:
    :func:`~ooc_spectral.io.integrity.chunk_digest`, keyed by its run id and the chunk's
    index), checked on every read of the input: a chunk changed since, or copied over
    another, is refused where it is read, naming it and the command that writes the data
    set again, instead of being fitted.

    ``verified``: the chunks already found intact by this process (each is digested once
    per process and run, not once per read of part of it).
    """

    run_id: str
    chunk_rows: int
    digests: tuple[int, ...]
    repair: str
    verified: set = field(default_factory=set, repr=False)

    def check(self, rows: "ZarrRows", start: int, stop: int, values: np.ndarray) -> None:
        from ..exceptions import DamagedDataError
        from .integrity import chunk_digest

        step, n = self.chunk_rows, rows.array.shape[0]
        for c in range(start // step, (stop - 1) // step + 1):
            if c in self.verified:
                continue
            a, b = c * step, min((c + 1) * step, n)
            whole = values[a - start:b - start] if a >= start and b <= stop else \
                rows.read_stored(a, b)
            if c >= len(self.digests) or chunk_digest(self.run_id, c, whole) != self.digests[c]:
                raise DamagedDataError(
                    f"chunk {c} (rows {a}-{b - 1}) of the input {rows.url} does not match the "
                    "digest its writer recorded (changed since, or copied from another chunk), "
                    f"so it is not read; {self.repair}")
            self.verified.add(c)


@dataclass(frozen=True, eq=False)
class ZarrRows:
    """A zarr array as a task argument: it reads rows, naming the chunks on failure.

    Reads that fail with I/O or network errors are retried with exponential
    backoff (:class:`ReadRetry`); if they keep failing the read raises
    :class:`TransientReadError` (exit code 1: rerun to resume). A chunk that
    fails to decode raises :class:`StoreReadError` naming it (exit code 2).
    """

    array: Any
    url: str
    chunk_rows: int
    retry: ReadRetry | None = None
    digests: ChunkDigests | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.array.dtype)

    def __getitem__(self, rows: slice) -> np.ndarray:
        """Rows ``rows.start:rows.stop`` (a task of :class:`RowBlocks`): :meth:`read`."""
        return self.read(int(rows.start), int(rows.stop))

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as stored, checked against the writer's digests (if any:
        the read then takes in whole the chunks it cuts that are not yet found intact,
        which zarr decodes whole anyway)."""
        digests = self.digests
        if digests is None or stop <= start:
            return self.read_stored(start, stop)
        step, n = digests.chunk_rows, self.array.shape[0]
        first, last = start // step, (stop - 1) // step
        a = start if first in digests.verified else first * step
        b = stop if last in digests.verified else min((last + 1) * step, n)
        values = self.read_stored(a, b)
        digests.check(self, a, b, values)
        return values[start - a:stop - a]

    def read_stored(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as the store gives them, retried on I/O errors."""
        retry = self.retry or ReadRetry.from_env()
        delay = retry.backoff
        for attempt in range(1, retry.attempts + 1):
            try:
                return self.array[start:stop]
            except Exception as exc:  # decoding or I/O error inside zarr
                if is_transient(exc):
                    if attempt < retry.attempts:
                        log.warning("reading rows %d-%d of %s failed (%s: %s); retry %d of %d "
                                    "in %.3g s", start, stop - 1, self.url, type(exc).__name__,
                                    exc, attempt, retry.attempts - 1, delay)
                        time.sleep(delay)
                        delay = min(2 * delay, 30.0)
                        continue
                    raise TransientReadError(
                        f"could not read rows {start}-{stop - 1} of {self.url} after "
                        f"{retry.attempts} tries: {type(exc).__name__}: "
                        f"{' '.join(str(exc).split())}; the store did not answer: rerun the same "
                        "command to resume (retries: $OOC_SPECTRAL_READ_ATTEMPTS, "
                        "$OOC_SPECTRAL_READ_BACKOFF)"
                    ) from exc
                c, _, _, cause = self._culprit(start, stop, exc)
                # the chunk's own rows, whatever part of it was asked for: what to restore
                a, b = c * self.chunk_rows, min((c + 1) * self.chunk_rows, self.array.shape[0])
                raise StoreReadError(
                    f"could not read rows {a}-{b - 1} (chunk {c} of {self.url}): "
                    f"{type(cause).__name__}: {' '.join(str(cause).split())}; the store is "
                    "damaged or incomplete: restore or regenerate that chunk"
                ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _culprit(self, start: int, stop: int, exc: Exception):
        """The first storage chunk of ``[start, stop)`` that fails to read on its own."""
        for c in range(start // self.chunk_rows, (stop - 1) // self.chunk_rows + 1):
            a, b = max(start, c * self.chunk_rows), min(stop, (c + 1) * self.chunk_rows)
            try:
                self.array[a:b]
            except Exception as err:
                return c, a, b, err
        return start // self.chunk_rows, start, stop, exc  # pragma: no cover - transient


def read_zarr_block(ref: ZarrRows, block_info=None) -> np.ndarray:
    (a, b), _ = block_info[None]["array-location"]
    return ref.read(a, b)
