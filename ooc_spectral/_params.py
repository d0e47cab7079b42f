"""Estimator parameters stored and passed on in one place.

scikit-learn reads an estimator's parameters from the signature of its
``__init__``, which must store each one unchanged under its own name; the
signatures stay written out (they are the documentation), and
:func:`store_params` does the storing. The estimators built on
:class:`~ooc_spectral.GreedySpectralEmbedding` hand it the parameters it shares
with them by name (:data:`EMBEDDING_PARAMS`, :func:`params_of`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["EMBEDDING_PARAMS", "store_params", "params_of"]

#: Parameters of :class:`~ooc_spectral.GreedySpectralEmbedding` that the
#: estimators of the spectral family built on it take under the same name.
EMBEDDING_PARAMS = ("kernel", "gamma", "degree", "coef0", "tol", "dictionary_size", "selection",
                    "max_dictionary_size", "affine", "sample_size", "chunk_rows")


def store_params(estimator: Any, params: Mapping[str, Any]) -> None:
    """Set each of ``params`` (``locals()`` of an ``__init__``) on ``estimator``, unchanged.

    ``self`` and the ``__class__`` cell that ``super()`` adds are left out.

    Examples
    --------
    >>> class Est:
    ...     def __init__(self, a=1, *, b=None):
    ...         store_params(self, locals())
    >>> vars(Est(2, b="x"))
    {'a': 2, 'b': 'x'}
    """
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(estimator, name, value)


def params_of(estimator: Any, names: Iterable[str]) -> dict[str, Any]:
    """``{name: getattr(estimator, name)}`` for each of ``names`` (keyword arguments)."""
    return {name: getattr(estimator, name) for name in names}
