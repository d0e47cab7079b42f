"""Pass 2's statistics: one small type per kind, each with its ``combine``.

A pass-2 task reduces its rows to one of these (:mod:`ooc_spectral.core.pass2`
computes them, the ``chunk`` step); two partials over consecutive rows merge with
``a.combine(b)`` (``a`` before ``b`` in row order, the ``combine`` step), which is
associative and deterministic, so the ordered tree reduction gives the same
result whatever finished first; the eigensolve reads the fields (the
``aggregate`` step). They are small: at most a few m x m matrices.

=================  =====================================================================
``Moments``        additive normalization: ``n``, the mean and centred sum of squares
                   of the coordinates ``z = L^-1 k(D, x)`` (pairwise update of Chan,
                   Golub & LeVeque), ``sq = sum |z - zbar|^2`` row by row, row sums
                   and the certificate
``CrossMoments``   additive, after the dictionary grew: co-moments of the coordinates
                   (or, for the fast extension, kernel rows) on the old and new points
``KernelSums``     divisive with exact degrees, first pass: ``n`` and ``sum k``
``Gram``           divisive with subset degrees: ``n``, ``S = sum y y'``, certificate
``Degrees``        divisive with exact degrees (Proposition 2): ``S = sum y y' / d``,
                   the smallest degree, certificate
``PreimageSums``   ``fit_inverse_transform``: ``n``, ``sum k k'``, ``sum k x'``
=================  =====================================================================

Parts of several kinds: :class:`Certificate` (the largest residual ``max delta``
and its row), :class:`RowSums` (``sum k(x, x)``, ``max k(x, x)``, ``sum dhat``:
the eigensolve's run-time checks and Weyl's interval), :class:`BeyondTol` (the
rows beyond a tol that the prefix scan must still scan).

A checkpoint keeps a partial as flat scalars and arrays (:meth:`Statistic.to_flat`,
:func:`from_flat`; the key names are the stored format).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

__all__ = [
    "Certificate",
    "RowSums",
    "BeyondTol",
    "Statistic",
    "Moments",
    "CrossMoments",
    "KernelSums",
    "Gram",
    "Degrees",
    "PreimageSums",
    "from_flat",
    "VIOLATOR_CAP",
]

#: Largest number of rows beyond ``tol`` a pass collects (prefix scan); past it, the
#: scan of the rest of the data is cheaper than shipping them.
VIOLATOR_CAP = 100_000


# --------------------------------------------------------------------------- #
# parts shared by several kinds
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Certificate:
    """The largest squared residual ``max delta`` of the rows and its row number."""

    max_delta: float
    argmax: int

    @classmethod
    def of(cls, delta: np.ndarray, offset: int = 0) -> "Certificate":
        i = int(np.argmax(delta))
        return cls(float(delta[i]), int(offset + i))

    def combine(self, other: "Certificate") -> "Certificate":
        # ties go to the earlier row, so the answer does not depend on the tree
        if other.max_delta > self.max_delta or (other.max_delta == self.max_delta
                                                and other.argmax < self.argmax):
            return other
        return self

    def to_flat(self) -> dict:
        return {"max_delta": self.max_delta, "argmax": self.argmax}

    @classmethod
    def from_flat(cls, flat: dict) -> "Certificate":
        return cls(float(flat["max_delta"]), int(flat["argmax"]))


@dataclass(frozen=True)
class RowSums:
    """The scalar sums behind the eigensolve's run-time checks and its interval.

    ``sum_kx = sum k(x, x)`` bounds every eigenvalue of the centred Gram matrix;
    ``sum_dhat`` bounds the trace of the residuals' Gram matrix (Weyl's interval):
    with the rounding bounds of :mod:`~ooc_spectral.core.rounding`, the sum of every
    row's certified residual (its computed ``k(x, x) - |z|^2`` plus its rounding);
    without them, of the computed residuals. The certified sums also carry
    ``sum_sq = sum |z|^2`` (the accumulation's rounding scale), ``sum_xi2`` (the sum of
    the rows' squared coordinate perturbations ``xi``, for the eigenvalues' lower
    allowance), the largest rounding term ``max_rounding`` and the number of rows
    that needed the sharp bound (``sharp_rows``).
    """

    sum_kx: float
    max_kx: float
    sum_dhat: float
    sum_sq: float = 0.0
    sum_xi2: float = 0.0
    max_rounding: float = 0.0
    sharp_rows: int = 0
    certified: bool = False

    @classmethod
    def of(cls, Z: np.ndarray, kx: np.ndarray, dhat: np.ndarray | None = None) -> "RowSums":
        """The sums over rows with (uncentred) coordinates ``Z`` and diagonal ``kx``
        (``dhat = kx - |z|^2`` when the caller has it), without rounding bounds."""
        if dhat is None:
            dhat = kx - np.einsum("ij,ij->i", Z, Z)
        return cls(float(kx.sum()), float(np.max(np.abs(kx))), float(np.maximum(dhat, 0.0).sum()))

    @classmethod
    def bounded(cls, kx: np.ndarray, bounds: np.ndarray, sq: np.ndarray, xi: np.ndarray,
                rounding: np.ndarray, sharp: int) -> "RowSums":
        """The sums of certified residuals (:meth:`FactorRounding.certify
        <ooc_spectral.core.rounding.FactorRounding.certify>`)."""
        return cls(float(kx.sum()), float(np.max(np.abs(kx))) if kx.size else 0.0,
                   float(np.maximum(bounds, 0.0).sum()), float(sq.sum()), float(xi @ xi),
                   float(np.max(rounding)) if rounding.size else 0.0, int(sharp), True)

    def combine(self, other: "RowSums") -> "RowSums":
        return RowSums(self.sum_kx + other.sum_kx, max(self.max_kx, other.max_kx),
                       self.sum_dhat + other.sum_dhat, self.sum_sq + other.sum_sq,
                       self.sum_xi2 + other.sum_xi2, max(self.max_rounding, other.max_rounding),
                       self.sharp_rows + other.sharp_rows, self.certified and other.certified)

    def to_flat(self) -> dict:
        out = dataclasses.asdict(self)
        out["certified"] = int(self.certified)
        return out

    @classmethod
    def from_flat(cls, flat: dict) -> "RowSums":
        # partials stored before the rounding bounds have none: uncertified sums
        return cls(float(flat["sum_kx"]), float(flat["max_kx"]), float(flat["sum_dhat"]),
                   float(flat.get("sum_sq", 0.0)), float(flat.get("sum_xi2", 0.0)),
                   float(flat.get("max_rounding", 0.0)), int(flat.get("sharp_rows", 0)),
                   bool(int(flat.get("certified", 0))))


@dataclass(frozen=True, eq=False)
class BeyondTol:
    """The rows whose residual exceeds a tol (the prefix scan's check pass).

    ``rows`` and ``X`` (numbers and values, in row order, at most
    ``VIOLATOR_CAP + 1``), and :attr:`within`, the largest residual of the rows
    within the tol, which only shrinks as the dictionary grows.
    """

    max_within: float
    argmax_within: int
    rows: np.ndarray
    X: np.ndarray

    @classmethod
    def of(cls, delta: np.ndarray, offset: int, X: np.ndarray, tol: float) -> "BeyondTol":
        inside = np.flatnonzero(delta <= tol)
        j = int(inside[np.argmax(delta[inside])]) if inside.size else 0
        bad = np.flatnonzero(delta > tol)[: VIOLATOR_CAP + 1]
        return cls(float(delta[j]) if inside.size else -np.inf, int(offset + j),
                   (offset + bad).astype(np.int64), np.ascontiguousarray(X[bad]))

    @property
    def within(self) -> Certificate:
        """The certificate of the rows within the tol."""
        return Certificate(self.max_within, self.argmax_within)

    def combine(self, other: "BeyondTol") -> "BeyondTol":
        first = self if self.max_within >= other.max_within else other
        return BeyondTol(first.max_within, first.argmax_within,
                         np.concatenate([self.rows, other.rows])[: VIOLATOR_CAP + 1],
                         np.concatenate([self.X, other.X])[: VIOLATOR_CAP + 1])

    def to_flat(self) -> dict:
        return {"max_within": self.max_within, "argmax_within": self.argmax_within,
                "violator_rows": self.rows, "violator_X": self.X}

    @classmethod
    def from_flat(cls, flat: dict) -> "BeyondTol":
        return cls(float(flat["max_within"]), int(flat["argmax_within"]),
                   np.asarray(flat["violator_rows"], dtype=np.int64), np.asarray(flat["violator_X"]))


#: The version of the flat form of pass 2's partials: a checkpoint stores its partials
#: under stage names carrying it (:func:`~ooc_spectral.pipeline.accumulate.accumulate`),
#: so partials of another version are recomputed, never mixed in.
STATS_FORMAT = "c1"

_PARTS = {Certificate: "max_delta", RowSums: "sum_kx", BeyondTol: "violator_rows"}


def _combine_optional(a, b):
    return None if a is None or b is None else a.combine(b)


def _pooled(na: int, nb: int, mean_a: np.ndarray, mean_b: np.ndarray):
    """``n``, the pooled mean, the mean difference and the weight ``na nb / n`` of the
    pairwise update (Chan, Golub & LeVeque)."""
    n = na + nb
    diff = mean_b - mean_a
    return n, mean_a + diff * (nb / n), diff, na * nb / n


# --------------------------------------------------------------------------- #
# the kinds
# --------------------------------------------------------------------------- #
class Statistic:
    """What every pass-2 statistic has: a ``kind``, ``n``, ``combine`` and a flat form."""

    kind: ClassVar[str]
    n: int

    def combine(self, other):  # pragma: no cover - every kind defines it
        raise NotImplementedError

    def to_flat(self) -> dict:
        """Scalars and arrays under the stored key names (``kind`` included)."""
        out: dict = {"kind": self.kind}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple(_PARTS)):
                out.update(value.to_flat())
            elif value is not None:
                out[f.name] = value
        return out

    @classmethod
    def _from_flat(cls, flat: dict):
        values = {}
        for f in dataclasses.fields(cls):
            part = next((t for t in _PARTS if t.__name__ in str(f.type)), None)
            if part is not None:
                values[f.name] = part.from_flat(flat) if _PARTS[part] in flat else None
            elif f.name in flat:
                value = flat[f.name]
                values[f.name] = int(value) if f.name == "n" else value
        return cls(**values)


@dataclass(frozen=True, eq=False)
class Moments(Statistic):
    """``n``, mean ``(m,)``, centred sum of squares ``m2 (m, m)`` and ``sq`` (its trace,
    summed row by row) of the coordinates; the row sums and the certificate."""

    kind: ClassVar[str] = "moments"
    n: int
    mean: np.ndarray
    m2: np.ndarray
    sq: float
    sums: RowSums
    certificate: Certificate
    beyond: BeyondTol | None = None

    def combine(self, other: "Moments") -> "Moments":
        n, mean, diff, f = _pooled(self.n, other.n, self.mean, other.mean)
        m2 = self.m2 + other.m2
        m2 += np.multiply.outer(diff, diff) * f
        return Moments(n, mean, m2, self.sq + other.sq + float(diff @ diff) * f,
                       self.sums.combine(other.sums), self.certificate.combine(other.certificate),
                       _combine_optional(self.beyond, other.beyond))


@dataclass(frozen=True, eq=False)
class CrossMoments(Statistic):
    """Co-moments of the coordinates on the first ``old`` and on the new points.

    ``cross = sum (z_old - mean_old)(z_new - mean_new)'``, ``new`` the centred
    sum of squares of the new coordinates, ``sq_new`` its trace row by row. With
    ``sums`` and ``certificate`` None they are the *kernel rows'* co-moments (the
    fast extension, :func:`~ooc_spectral.core.pass2.chunk_kernel_cross`).
    """

    kind: ClassVar[str] = "cross"
    n: int
    mean_old: np.ndarray
    mean_new: np.ndarray
    cross: np.ndarray
    new: np.ndarray
    sq_new: float
    sums: RowSums | None = None
    certificate: Certificate | None = None

    @property
    def kernel_space(self) -> bool:
        return self.sums is None

    def combine(self, other: "CrossMoments") -> "CrossMoments":
        n, mean_old, d_old, f = _pooled(self.n, other.n, self.mean_old, other.mean_old)
        _, mean_new, d_new, _ = _pooled(self.n, other.n, self.mean_new, other.mean_new)
        return CrossMoments(
            n, mean_old, mean_new,
            self.cross + other.cross + np.multiply.outer(d_old, d_new) * f,
            self.new + other.new + np.multiply.outer(d_new, d_new) * f,
            self.sq_new + other.sq_new + float(d_new @ d_new) * f,
            _combine_optional(self.sums, other.sums),
            _combine_optional(self.certificate, other.certificate))

    def to_flat(self) -> dict:
        out = super().to_flat()
        if self.kernel_space:
            out["kernel_space"] = True
        return out


@dataclass(frozen=True, eq=False)
class KernelSums(Statistic):
    """``n`` and ``sum k`` ``(m,)`` of the kernel rows."""

    kind: ClassVar[str] = "ksums"
    n: int
    sum: np.ndarray

    def combine(self, other: "KernelSums") -> "KernelSums":
        return KernelSums(self.n + other.n, self.sum + other.sum)


@dataclass(frozen=True, eq=False)
class Gram(Statistic):
    """``n``, ``S = sum y y'`` ``(m, m)`` and the certificate."""

    kind: ClassVar[str] = "gram"
    n: int
    S: np.ndarray
    certificate: Certificate
    beyond: BeyondTol | None = None

    def combine(self, other: "Gram") -> "Gram":
        return Gram(self.n + other.n, self.S + other.S,
                    self.certificate.combine(other.certificate),
                    _combine_optional(self.beyond, other.beyond))


@dataclass(frozen=True, eq=False)
class Degrees(Statistic):
    """``n``, ``S = sum y y' / d`` ``(m, m)``, the smallest degree and its row, and the
    certificate."""

    kind: ClassVar[str] = "degrees"
    n: int
    S: np.ndarray
    min_degree: float
    argmin: int
    certificate: Certificate
    beyond: BeyondTol | None = None

    def combine(self, other: "Degrees") -> "Degrees":
        low = other if (other.min_degree < self.min_degree or (
            other.min_degree == self.min_degree and other.argmin < self.argmin)) else self
        return Degrees(self.n + other.n, self.S + other.S, low.min_degree, low.argmin,
                       self.certificate.combine(other.certificate),
                       _combine_optional(self.beyond, other.beyond))


@dataclass(frozen=True, eq=False)
class PreimageSums(Statistic):
    """``n``, ``ktk = sum k k'`` and ``ktx = sum k x'`` on the rows' embeddings
    (:mod:`ooc_spectral.core.preimage`)."""

    kind: ClassVar[str] = "preimage"
    n: int
    ktk: np.ndarray
    ktx: np.ndarray

    def combine(self, other: "PreimageSums") -> "PreimageSums":
        return PreimageSums(self.n + other.n, self.ktk + other.ktk, self.ktx + other.ktx)


KINDS: dict[str, type[Statistic]] = {
    cls.kind: cls for cls in (Moments, CrossMoments, KernelSums, Gram, Degrees, PreimageSums)}


def from_flat(flat: dict) -> Statistic:
    """The statistic a checkpoint kept as :meth:`Statistic.to_flat`."""
    kind = flat.get("kind")
    if kind not in KINDS:
        raise ValueError(f"unknown statistic kind {kind!r}; expected one of {sorted(KINDS)}")
    return KINDS[kind]._from_flat(flat)
