"""
Fitting from a zarr array on disk
=================================

Data larger than memory lives in zarr: ``fit`` takes a zarr array, or its path or URL, and
reads it chunk by chunk. The embedding is then a lazy dask array (nothing n x m is held);
``output=`` writes it to a zarr group region by region. The same runs on a dask cluster when
a ``distributed.Client`` is active.
"""

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import zarr
from sklearn.datasets import make_swiss_roll

from ooc_spectral import GreedySpectralEmbedding

X, t = make_swiss_roll(20_000, noise=0.05, random_state=0)
# sphinx_gallery_start_ignore
# not on the page: tests/test_docs.py builds the gallery on a fraction of the rows
import os

FRACTION = float(os.environ.get("OOC_SPECTRAL_GALLERY_FRACTION", "1"))
X, t = X[: round(len(X) * FRACTION)], t[: round(len(t) * FRACTION)]
# sphinx_gallery_end_ignore
with tempfile.TemporaryDirectory() as tmp:
    data = Path(tmp) / "roll.zarr"
    arr = zarr.create_array(data, shape=X.shape, chunks=(5000, 3), dtype="f8")
    arr[...] = X  # in practice written by the producer, chunk by chunk

    est = GreedySpectralEmbedding(n_components=5, normalization="divisive", gamma=0.15,
                                  tol=3e-2, random_state=0)
    est.fit(str(data), output=str(Path(tmp) / "embedding.zarr"))
    print(type(est.embedding_).__name__, est.embedding_.shape, est.embedding_.chunks)
    E = zarr.open_array(Path(tmp) / "embedding.zarr" / "embedding", mode="r")[...]
    print("dictionary:", len(est.dictionary_indices_), "rows")

assert np.isfinite(E).all()
fig, ax = plt.subplots(figsize=(5, 4))
ax.scatter(E[::4, 0], E[::4, 4], c=t[::4], s=2, cmap="viridis")
ax.set(title="20,000 rows read from zarr: eigenmap coordinates 0 and 4", xticks=[], yticks=[])
plt.show()
