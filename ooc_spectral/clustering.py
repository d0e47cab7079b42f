"""Spectral clustering on the greedy spectral embedding: :class:`GreedySpectralClustering`.

The public path of :mod:`ooc_spectral.estimators.clustering` (the package's own
``docs/manifold.md`` imports from here).
"""

from .estimators.clustering import GreedySpectralClustering, unit_rows

__all__ = ["GreedySpectralClustering", "unit_rows"]
