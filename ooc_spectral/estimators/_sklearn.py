"""scikit-learn integration shared by the public transformers.

Output feature names (``<classname>0``, ``<classname>1``, ... as scikit-learn's
decompositions and manifold learners name theirs) make ``set_output(transform="pandas")``
work, alone and in a :class:`~sklearn.pipeline.Pipeline`; ``feature_names_in_`` is
recorded in ``fit`` when X has string column names (a pandas DataFrame) and new rows'
names are checked against it.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin
from sklearn.utils.validation import validate_data

from .._validation import check_fitted

__all__ = ["FeatureNamesMixin", "FeatureNamesInMixin", "SparseInputMixin"]


class SparseInputMixin:
    """Declares sparse input accepted: ``scipy.sparse`` (and dask arrays of sparse
    chunks) are densified block by block as the passes read them
    (:func:`~ooc_spectral.io.source.open_source`)."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


class FeatureNamesInMixin:
    """``feature_names_in_`` recorded by ``fit`` and checked by ``transform``/``predict``,
    as scikit-learn's estimators do (its ``validate_data`` without the array checks, which
    the passes make block by block).

    ``fit`` on a DataFrame with string column names records them (a refit on an array
    forgets them); new rows whose names differ from those, or come in another order, are
    refused with scikit-learn's ValueError naming them, since their columns would be
    matched by position to the wrong features. An array after a DataFrame (or the
    reverse) is a UserWarning, as in scikit-learn.
    """

    def _check_feature_names(self, X, *, reset: bool) -> None:
        validate_data(self, _names_of(X), reset=reset, skip_check_array=True, ensure_2d=False)


def _names_of(X):
    """X itself for scikit-learn's check, or, for a data frame it does not read (a dask
    DataFrame: scikit-learn reads pandas' and the dataframe interchange protocol's), an
    empty pandas frame with its columns."""
    columns = getattr(X, "columns", None)
    if columns is None or type(X).__module__.split(".")[0] == "pandas":
        return X
    import pandas as pd

    return pd.DataFrame(columns=list(columns))


class FeatureNamesMixin(SparseInputMixin, FeatureNamesInMixin, ClassNamePrefixFeaturesOutMixin):
    """``get_feature_names_out`` from the width of the fitted embedding."""

    @property
    def _n_features_out(self) -> int:
        # every fitted transformer keeps one eigenvalue per output coordinate
        return int(len(check_fitted(self, "eigenvalues_")))
