"""scikit-learn integration shared by the public transformers.

Output feature names (``<classname>0``, ``<classname>1``, ... as scikit-learn's
decompositions and manifold learners name theirs) make ``set_output(transform="pandas")``
work, alone and in a :class:`~sklearn.pipeline.Pipeline`; ``feature_names_in_`` is
recorded in ``fit`` when X has string column names (a pandas DataFrame).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin

from .._validation import check_fitted

__all__ = ["FeatureNamesMixin", "SparseInputMixin"]


class SparseInputMixin:
    """Declares sparse input accepted: ``scipy.sparse`` (and dask arrays of sparse
    chunks) are densified block by block as the passes read them
    (:func:`~ooc_spectral.io.source.open_source`)."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


class FeatureNamesMixin(SparseInputMixin, ClassNamePrefixFeaturesOutMixin):
    """``get_feature_names_out`` from the width of the fitted embedding."""

    @property
    def _n_features_out(self) -> int:
        # every fitted transformer keeps one eigenvalue per output coordinate
        return int(len(check_fitted(self, "eigenvalues_")))

    def _record_feature_names(self, X) -> None:
        """Set ``feature_names_in_`` from X's string column names, as scikit-learn does
        (removed when X has none, so a refit on an array forgets old names)."""
        columns = getattr(X, "columns", None)
        if columns is not None and len(columns) and all(isinstance(c, str) for c in columns):
            self.feature_names_in_ = np.asarray(list(columns), dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
