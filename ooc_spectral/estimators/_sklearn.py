"""scikit-learn's estimator protocol, implemented without importing scikit-learn.

scikit-learn's own base classes cannot be imported cheaply: ``sklearn.base`` brings
``sklearn.utils``, which imports ``scipy.stats`` and, wherever it is installed, pandas
(about 2 s of a fresh process, where a fit of 20,000 rows takes 0.3 s). The public
estimators therefore implement the protocol scikit-learn documents for third-party
estimators ("Developing scikit-learn estimators": ``get_params``/``set_params`` from
the ``__init__`` signature, ``__sklearn_tags__``, ``fit_transform``, ``fit_predict``,
``set_output``, ``get_feature_names_out``) with the same behaviour as
``sklearn.base.BaseEstimator`` and its mixins, and reach scikit-learn only from methods
that scikit-learn itself calls (the tags, a configured output container, the HTML
display), when it is already imported. ``clone``, ``Pipeline``, ``GridSearchCV`` and
``check_estimator`` treat them as they treat scikit-learn's own
(``tests/test_sklearn_checks.py``).

Output feature names (``<classname>0``, ``<classname>1``, ... as scikit-learn's
decompositions and manifold learners name theirs) make ``set_output(transform="pandas")``
work, alone and in a :class:`~sklearn.pipeline.Pipeline`; ``feature_names_in_`` is
recorded in ``fit`` when X has string column names (a pandas DataFrame).
"""

from __future__ import annotations

import functools
import inspect
import sys
from types import MethodType

import numpy as np

from .._validation import check_fitted

__all__ = ["BaseEstimator", "TransformerMixin", "ClusterMixin", "FeatureNamesMixin",
           "SparseInputMixin", "available_if"]


class BaseEstimator:
    """Parameters from the ``__init__`` signature, tags, a short repr.

    As ``sklearn.base.BaseEstimator``: ``__init__`` stores each parameter under its own
    name, ``get_params(deep=True)`` adds ``<param>__<name>`` for parameters that are
    estimators, and ``set_params`` sets either kind.
    """

    @classmethod
    def _get_param_names(cls) -> list[str]:
        init = cls.__init__
        if init is object.__init__:
            return []
        params = inspect.signature(init).parameters.values()
        for p in params:
            if p.kind == p.VAR_POSITIONAL:
                raise RuntimeError(f"{cls.__name__}.__init__ takes *args; scikit-learn "
                                   "estimators name every parameter")
        return sorted(p.name for p in params if p.name != "self" and p.kind != p.VAR_KEYWORD)

    def get_params(self, deep: bool = True) -> dict:
        """The estimator's parameters (and, with ``deep``, those of estimator-valued ones).

        Parameters
        ----------
        deep : bool, default=True

        Returns
        -------
        dict
        """
        out = {}
        for name in self._get_param_names():
            value = getattr(self, name)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                out.update((f"{name}__{k}", v) for k, v in value.get_params().items())
            out[name] = value
        return out

    def set_params(self, **params):
        """Set parameters (``name`` or ``<param>__<name>`` of an estimator-valued one).

        Returns
        -------
        self
        """
        if not params:
            return self
        valid = self.get_params(deep=True)
        nested: dict[str, dict] = {}
        for key, value in params.items():
            name, sep, sub = key.partition("__")
            if name not in valid:
                raise ValueError(
                    f"Invalid parameter {name!r} for estimator {self}. Valid parameters "
                    f"are: {self._get_param_names()!r}.")
            if sep:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
                valid[name] = value
        for name, sub_params in nested.items():
            valid[name].set_params(**sub_params)
        return self

    def __repr__(self) -> str:
        # scikit-learn's print_changed_only: the parameters that differ from the defaults
        defaults = inspect.signature(type(self).__init__).parameters
        shown = []
        for name in self._get_param_names():
            value = getattr(self, name, None)
            default = defaults[name].default
            if not _same_value(value, default):
                shown.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    def __sklearn_tags__(self):
        # called by scikit-learn's get_tags, so scikit-learn is imported already
        from sklearn.utils import InputTags, Tags, TargetTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=False),
                    transformer_tags=None, regressor_tags=None, classifier_tags=None,
                    input_tags=InputTags())

    def _repr_html_(self) -> str:
        """The diagram a notebook shows for scikit-learn's estimators."""
        from sklearn.utils import estimator_html_repr

        return estimator_html_repr(self)


def _same_value(value, default) -> bool:
    if value is default:
        return True
    if isinstance(value, np.ndarray) or isinstance(default, np.ndarray):
        return False
    try:
        return bool(type(value) is type(default) and value == default)
    except Exception:  # noqa: BLE001 - a value without a truth value is not the default
        return False


class _AvailableIf:
    """A method offered only where ``check(self)`` is true (else AttributeError, so
    ``hasattr`` is False), as ``sklearn.utils.metaestimators.available_if``."""

    def __init__(self, fn, check):
        self.fn, self.check = fn, check
        functools.update_wrapper(self, fn)

    def __get__(self, obj, owner=None):
        if obj is None:
            # the class attribute: the function itself (documentation, introspection)
            return self.fn
        if not self.check(obj):
            raise AttributeError(f"This {type(obj).__name__!r} has no attribute "
                                 f"{self.fn.__name__!r}")
        return MethodType(self.fn, obj)


def available_if(check):
    """Decorator: the method exists on an instance only where ``check(instance)`` is true
    (``check`` may raise AttributeError itself to say why not)."""
    return lambda fn: _AvailableIf(fn, check)


def _wrap_output(estimator, data, X):
    """``data`` in the container ``set_output`` (or scikit-learn's global
    ``transform_output``) asks for; unchanged when nothing asks."""
    if "transform" not in getattr(estimator, "_sklearn_output_config", {}) \
            and "sklearn" not in sys.modules:
        return data  # scikit-learn never imported: its global configuration is the default
    # the function scikit-learn's own set_output wrapper calls (scikit-learn >= 1.2), so
    # the containers, their index and the configuration's precedence are scikit-learn's
    from sklearn.utils._set_output import _wrap_data_with_container

    return _wrap_data_with_container("transform", data, X, estimator)


def _wrapping_output(method):
    @functools.wraps(method)
    def wrapped(self, X, *args, **kwargs):
        return _wrap_output(self, method(self, X, *args, **kwargs), X)

    wrapped._ooc_wraps_output = True
    return wrapped


class TransformerMixin:
    """``fit_transform`` and ``set_output``, as scikit-learn's ``TransformerMixin``.

    ``transform`` and ``fit_transform`` of every subclass return the container that
    ``set_output(transform=...)`` or ``sklearn.set_config(transform_output=...)`` asks
    for ("pandas", "polars"; "default" leaves the array as it is).
    """

    #: what scikit-learn's set_output machinery reads to know transform is wrapped
    _sklearn_auto_wrap_output_keys = frozenset({"transform"})

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in ("transform", "fit_transform"):
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "_ooc_wraps_output", False):
                setattr(cls, name, _wrapping_output(method))

    def fit_transform(self, X, y=None, **fit_params):
        """``fit(X).transform(X)``."""
        return self.fit(X, y, **fit_params).transform(X)

    def set_output(self, *, transform=None):
        """Choose the container of ``transform`` and ``fit_transform``'s output.

        Parameters
        ----------
        transform : {"default", "pandas", "polars"} or None
            None leaves the choice as it is.

        Returns
        -------
        self
        """
        if transform is None:
            return self
        if transform not in ("default", "pandas", "polars"):
            raise ValueError(f"set_output(transform={transform!r}): expected 'default', "
                             "'pandas', 'polars' or None")
        config = dict(getattr(self, "_sklearn_output_config", {}))
        config["transform"] = transform
        self._sklearn_output_config = config
        return self

    def __sklearn_tags__(self):
        from sklearn.utils import TransformerTags

        tags = super().__sklearn_tags__()
        tags.transformer_tags = TransformerTags()
        return tags


TransformerMixin.fit_transform = _wrapping_output(TransformerMixin.fit_transform)


class ClusterMixin:
    """``fit_predict``, as scikit-learn's ``ClusterMixin``."""

    def fit_predict(self, X, y=None, **kwargs):
        """Fit on X and return ``labels_``."""
        self.fit(X, **kwargs)
        return self.labels_

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.estimator_type = "clusterer"
        if tags.transformer_tags is not None:
            tags.transformer_tags.preserves_dtype = []
        return tags


class SparseInputMixin:
    """Declares sparse input accepted: ``scipy.sparse`` (and dask arrays of sparse
    chunks) are densified block by block as the passes read them
    (:func:`~ooc_spectral.io.source.open_source`)."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


class FeatureNamesMixin(SparseInputMixin):
    """``get_feature_names_out`` from the width of the fitted embedding."""

    @property
    def _n_features_out(self) -> int:
        # every fitted transformer keeps one eigenvalue per output coordinate
        return int(len(check_fitted(self, "eigenvalues_")))

    def get_feature_names_out(self, input_features=None):
        """Names of the output columns: ``<classname>0``, ``<classname>1``, ...

        Parameters
        ----------
        input_features : array-like of str or None
            Checked against the fitted input (``feature_names_in_`` or
            ``n_features_in_``), as scikit-learn checks it; not used otherwise.

        Returns
        -------
        ndarray of str objects, shape (n_components,)
        """
        n_out = self._n_features_out
        if input_features is not None:
            names = np.asarray(input_features, dtype=object)
            fitted = getattr(self, "feature_names_in_", None)
            if fitted is not None and not np.array_equal(fitted, names):
                raise ValueError("input_features is not equal to feature_names_in_")
            if fitted is None and len(names) != self.n_features_in_:
                raise ValueError(f"input_features should have length equal to number of "
                                 f"features ({self.n_features_in_}), got {len(names)}")
        prefix = type(self).__name__.lower()
        return np.asarray([f"{prefix}{i}" for i in range(n_out)], dtype=object)

    def _record_feature_names(self, X) -> None:
        """Set ``feature_names_in_`` from X's string column names, as scikit-learn does
        (removed when X has none, so a refit on an array forgets old names)."""
        columns = getattr(X, "columns", None)
        if columns is not None and len(columns) and all(isinstance(c, str) for c in columns):
            self.feature_names_in_ = np.asarray(list(columns), dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
