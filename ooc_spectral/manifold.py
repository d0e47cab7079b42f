"""The spectral family of Bengio et al. (2003), each with its out-of-sample extension:
Laplacian eigenmaps, diffusion maps, metric MDS, Isomap, landmark Isomap, LLE.

The public path of :mod:`ooc_spectral.estimators.manifold`, where the estimators and
their out-of-sample formulas are documented.
"""

from .estimators.manifold import (DiffusionMap, Isomap, LandmarkIsomap, LaplacianEigenmaps,
                                  LocallyLinearEmbedding, MetricMDS)

__all__ = ["LaplacianEigenmaps", "DiffusionMap", "MetricMDS", "Isomap", "LandmarkIsomap",
           "LocallyLinearEmbedding"]
