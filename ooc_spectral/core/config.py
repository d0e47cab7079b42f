"""The estimator's parameters, declared once, validated in ``fit``.

:class:`FitConfig` is the typed, validated form of the parameters of
:class:`~ooc_spectral.GreedySpectralEmbedding`. Each field carries its
constraint and its help text in ``metadata``; the estimator's ``__init__``
mirrors the fields (scikit-learn reads parameters from the signature; a test
keeps the two equal) and the command line builds its ``fit`` options from them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .._validation import check_bool, check_choice, check_float, check_int, check_str
from ..exceptions import InvalidParameterError
from .kernel_names import KERNEL_ALIASES, KERNELS, canonical_kernel

__all__ = ["FitConfig", "parameter_fields", "resolve_seed"]


def _param(default, help: str, *, type, low=None, high=None, low_open=False,
           choices=None, none=False, cli=True):
    return field(default=default, metadata={
        "help": help, "type": type, "low": low, "high": high, "low_open": low_open,
        "choices": choices, "none": none, "cli": cli,
    })


@dataclass(frozen=True)
class FitConfig:
    """Validated parameters of a fit (see the estimator's docstring for each)."""

    n_components: int | None = _param(
        2, "number of embedding coordinates p (None, in Python: every direction the "
        "dictionary supports, as KernelPCA keeps every non-zero eigenvalue)", type=int, low=1,
        none=True)
    kernel: str = _param("rbf", "kernel: " + ", ".join(KERNELS) + " ('poly' is polynomial, "
                         "as in KernelPCA; in Python also a callable k(x, y, **kernel_params) "
                         "on two rows or on two blocks of rows)", type=str,
                         choices=KERNELS + tuple(KERNEL_ALIASES))
    gamma: float | None = _param(
        None, "kernel width (rbf, laplacian) or scale (polynomial); default: the "
        "median-distance heuristic on a seeded sample", type=float, low=0.0, low_open=True,
        none=True)
    degree: int = _param(3, "degree of the polynomial kernel", type=int, low=1)
    coef0: float = _param(1.0, "constant term of the polynomial kernel", type=float)
    kernel_params: dict | None = _param(
        None, "keyword arguments of a callable kernel", type=dict, none=True, cli=False)
    tol: float | None = _param(1e-3, "the paper's epsilon: largest squared feature-space residual "
                        "of a row left out of the dictionary", type=float, low=0.0)
    dictionary_size: int | None = _param(
        None, "ask for a dictionary of exactly this size (chosen by selection on the seeded "
        "sample) instead of tol",
        type=int, low=2, none=True)
    scan: str = _param(
        "full", "full: scan every row sequentially; prefix: stop the sequential scan once "
        "the dictionary stops growing, let pass 2 find the rows beyond tol and scan only "
        "those (same dictionary, same guarantee)", type=str, choices=("full", "prefix"))
    prefix_patience: int = _param(
        2, "prefix scan: stop after this many windows of 65536 rows that each added at most "
        "0.1% of the dictionary", type=int, low=1)
    selection: str = _param(
        "auto", "dictionary selection: greedy (the paper's scan), random (a seeded random "
        "subset of dictionary_size rows, all rows projected: Harmeling et al.), rpcholesky "
        "(blocked randomly pivoted Cholesky on the seeded sample, with tol or dictionary_size; "
        "the whole data certified by pass 2) or auto (rpcholesky with dictionary_size, greedy "
        "with tol)", type=str,
        choices=("auto", "greedy", "random", "rpcholesky"))
    max_dictionary_size: int = _param(
        5000, "stop with an error when the dictionary grows past this size", type=int, low=2)
    affine: bool = _param(True, "the paper's affine constraint sum_i a_ti = 1", type=bool)
    normalization: str = _param(
        "additive", "additive (kernel PCA) or divisive (spectral clustering, Laplacian "
        "eigenmaps)", type=str, choices=("additive", "divisive"))
    degree_estimate: str = _param(
        "exact", "divisive degrees: exact (Proposition 2, one more pass) or subset (kernel "
        "normalized before the scan with degrees from a random subset)", type=str,
        choices=("exact", "subset"))
    degree_subset_size: int = _param(
        1000, "rows of the random subset for degree_estimate=subset", type=int, low=1)
    drop_first: bool = _param(
        True, "divisive: drop the trivial first eigenvector", type=bool)
    sample_size: int = _param(
        20000, "rows of the seeded in-memory sample from which dictionary_size (and "
        "rpcholesky) select the dictionary", type=int, low=2)
    solver: str = _param(
        "gemm", "write-back and transform: gemm (the inverse factor, centring and "
        "eigenvectors folded into one m x p matrix: a kernel block and one product per "
        "chunk) or trsm (a triangular solve per chunk, then the eigenvectors)", type=str,
        choices=("gemm", "trsm"))
    chunk_rows: int | None = _param(
        None, "rows per task of the parallel passes, used as given (a task may read a row "
        "range of a storage chunk); default: whole storage chunks, split so that every thread "
        "has at least two tasks; kernel blocks stay within the task memory budget either way",
        type=int, low=1, none=True)
    fit_inverse_transform: bool = _param(
        False, "learn the pre-image map of inverse_transform (kernel ridge regression from "
        "the embedding back to the rows, as KernelPCA; one more parallel pass)", type=bool)
    alpha: float = _param(
        1.0, "ridge penalty of the pre-image map (fit_inverse_transform)", type=float, low=0.0)
    output_dtype: str | None = _param(
        None, "dtype of the embedding: float64, or float32 (half the write-back and the "
        "disk; values computed in float64, then rounded); in Python None, the default there: "
        "float32 for float32 input, float64 otherwise, as scikit-learn's transformers keep "
        "float32", type=str,
        choices=("float64", "float32"), none=True)
    random_state: int | None = _param(
        None, "seed of the visiting order and of every sample", type=int, low=0, none=True)

    # ------------------------------------------------------------------ #
    @classmethod
    def from_params(cls, params: Mapping[str, Any], *, saved: bool = False) -> "FitConfig":
        """Validate estimator parameters; ``random_state`` is resolved to an int seed.

        ``saved``: the parameters of a saved model, read to use it: the checks that only
        guard a new fit (:meth:`_check_new_fit`) are not applied, so a model fitted before
        a check existed still loads and transforms."""
        values = {}
        for f in dataclasses.fields(cls):
            value = params.get(f.name, f.default)
            if f.name == "random_state":
                value = resolve_seed(value)
            if f.name == "kernel" and callable(value):
                values[f.name] = value  # a user's kernel function (Python only, never saved)
                continue
            if f.name == "kernel" and not isinstance(value, str):
                raise InvalidParameterError(
                    f"kernel={value!r} has type {type(value).__name__}: expected one of "
                    f"{', '.join(repr(k) for k in f.metadata['choices'])} or a callable "
                    "k(x, y, **kernel_params)")
            if f.name == "kernel_params":
                values[f.name] = _check_kernel_params(value, params.get("kernel", f.default))
                continue
            if f.name == "tol" and value is None and params.get("dictionary_size") is not None:
                # dictionary_size replaces tol (scikit-learn style: None = not used)
                values[f.name] = None
                continue
            values[f.name] = _check(f, value)
            if f.name == "kernel":
                values[f.name] = canonical_kernel(values[f.name])
        config = cls(**values)
        config._check_together()
        if not saved:
            config._check_new_fit()
        return config

    @property
    def dictionary_selection(self) -> str:
        """``selection`` with ``auto`` resolved: ``rpcholesky`` when ``dictionary_size``
        is given (the most accurate at equal m in every case measured, RESULTS.md),
        else ``greedy`` (one sequential pass certifies every row)."""
        if self.selection != "auto":
            return self.selection
        return "rpcholesky" if self.dictionary_size is not None else "greedy"

    def _check_together(self) -> None:
        if self.selection == "random" and self.dictionary_size is None:
            raise InvalidParameterError(
                "selection='random' needs dictionary_size (the number of random rows); "
                "set dictionary_size, or use selection='greedy' with tol"
            )
        if self.dictionary_size is not None:
            if self.dictionary_size > self.max_dictionary_size:
                raise InvalidParameterError(
                    f"dictionary_size={self.dictionary_size} exceeds "
                    f"max_dictionary_size={self.max_dictionary_size}; raise max_dictionary_size"
                )
            if self.n_components is not None and self.n_components >= self.dictionary_size:
                raise InvalidParameterError(
                    f"n_components={self.n_components} is not below "
                    f"dictionary_size={self.dictionary_size}; ask for a dictionary_size of at "
                    f"least {self.n_components + 1}"
                )
            if self.dictionary_size > self.sample_size:
                raise InvalidParameterError(
                    f"dictionary_size={self.dictionary_size} exceeds sample_size="
                    f"{self.sample_size}, the rows Algorithm 2 searches; raise sample_size"
                )

        if self.fit_inverse_transform and self.normalization != "additive":
            raise InvalidParameterError(
                "fit_inverse_transform=True needs normalization='additive' (kernel PCA, as "
                "scikit-learn's KernelPCA); the divisive embedding has no pre-image map here"
            )

    def _check_new_fit(self) -> None:
        """Checks of a new fit's parameters that a saved model's need not pass."""
        if self.scan == "prefix" and self.dictionary_size is None and self.tol <= 0:
            raise InvalidParameterError(
                f"scan='prefix' with tol={self.tol!r}: the prefix scan stops early and then "
                "scans the rows pass 2 finds beyond tol, and at tol 0 every row is beyond it "
                "(each row's certified residual includes its rounding); use scan='full' (the "
                "default), or a positive tol"
            )
        if self.kernel_name == "polynomial" and self.coef0 < 0:
            raise InvalidParameterError(
                f"kernel='polynomial' with coef0={self.coef0!r}: (gamma x.y + coef0)^degree is "
                "an inner product in a feature space only for coef0 >= 0, and the greedy "
                "method projects rows on a span in that space; use coef0 >= 0 "
                "(scikit-learn's KernelPCA, which drops negative eigenvalues, or "
                "ooc_spectral.baselines.ExactKernelEmbedding take any coef0)"
            )

    @property
    def negative_values(self) -> str | None:
        """Why the kernel can take negative values (None where it cannot): such a kernel
        can give rows negative degrees, which the divisive normalization cannot take."""
        name = self.kernel_name
        if name in ("linear", "cosine"):
            return f"kernel={name!r} is negative for rows at an obtuse angle"
        if name == "polynomial" and self.degree % 2 == 1:
            return (f"kernel='polynomial' with the odd degree={self.degree} is negative "
                    "where gamma x.y + coef0 is")
        return None

    @property
    def kernel_name(self) -> str:
        """The kernel's name, ``"callable"`` for a user's function."""
        return "callable" if callable(self.kernel) else self.kernel

    def with_output_dtype(self, input_dtype) -> "FitConfig":
        """This config with ``output_dtype=None`` resolved for an input of ``input_dtype``:
        float32 for float32 input, float64 otherwise."""
        if self.output_dtype is not None:
            return self
        keep = np.dtype(input_dtype) == np.float32
        return dataclasses.replace(self, output_dtype="float32" if keep else "float64")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def parameter_fields() -> tuple[dataclasses.Field, ...]:
    """The declared parameters, in order (for the command line and the docs)."""
    return dataclasses.fields(FitConfig)


def fresh_seed() -> int:
    """A fresh seed from the operating system's entropy: what ``random_state=None`` means."""
    return int(np.random.SeedSequence().generate_state(1)[0] >> 1)


def resolve_seed(random_state) -> int:
    """An int seed from None (a fresh one, :func:`fresh_seed`), an int, or a
    ``numpy.random`` generator."""
    if random_state is None:
        return fresh_seed()
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**31 - 1))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**31 - 1))
    return random_state


def _check_kernel_params(value, kernel):
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidParameterError(
            f"kernel_params={value!r} is not a dict of keyword arguments; pass e.g. "
            "kernel_params={'scale': 2.0}")
    if not callable(kernel):
        raise InvalidParameterError(
            f"kernel_params is only used by a callable kernel, and kernel={kernel!r}; pass the "
            "built-in kernel's parameters as gamma, degree and coef0, or drop kernel_params")
    return dict(value)


def _check(f: dataclasses.Field, value):
    """Check one declared field (see :mod:`ooc_spectral._validation`)."""
    meta = f.metadata
    t = meta["type"]
    if value is None:
        if meta["none"]:
            return None
        kind = {int: "an integer", float: "a number", bool: "True or False", str: "a string"}[t]
        raise InvalidParameterError(f"{f.name}=None is not allowed: expected {kind}")
    if meta["choices"]:
        return check_choice(None, f.name, value, meta["choices"])
    if t is int:
        return check_int(None, f.name, value, low=meta["low"], high=meta["high"], none=meta["none"])
    if t is float:
        return check_float(None, f.name, value, low=meta["low"], low_open=meta["low_open"],
                           none=meta["none"])
    if t is bool:
        return check_bool(None, f.name, value)
    return check_str(None, f.name, value)
