"""Layer 6, the scikit-learn estimators (with :mod:`ooc_spectral.baselines` beside them).

``embedding`` (``GreedySpectralEmbedding``), ``clustering``
(``GreedySpectralClustering``), ``manifold`` (Laplacian eigenmaps, diffusion maps,
metric MDS, and the rest of the family re-exported), ``isomap``, ``lle``, and what
they share: ``_manifold`` (maps applied block by block, in-memory reads, the
eigenproblems) and ``_sklearn`` (feature names, sparse input). Public paths:
``from ooc_spectral import GreedySpectralEmbedding``, :mod:`ooc_spectral.manifold`,
:mod:`ooc_spectral.clustering`. Nothing is imported here: importing the package does
not import scikit-learn.

May import: :mod:`ooc_spectral.pipeline` and every layer below it.
"""
