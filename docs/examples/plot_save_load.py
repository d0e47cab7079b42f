"""
Saving and loading a model
==========================

A fitted model is saved as a zarr group of arrays with JSON attributes, never a pickle:
loading it runs no code. The loaded model embeds new rows exactly as the one in memory.
"""

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import make_swiss_roll

from ooc_spectral import GreedySpectralEmbedding

X, t = make_swiss_roll(2000, random_state=0)
# sphinx_gallery_start_ignore
# not on the page: tests/test_docs.py builds the gallery on a fraction of the rows
import os

FRACTION = float(os.environ.get("OOC_SPECTRAL_GALLERY_FRACTION", "1"))
X, t = X[: round(len(X) * FRACTION)], t[: round(len(t) * FRACTION)]
# sphinx_gallery_end_ignore
est = GreedySpectralEmbedding(n_components=2, gamma=0.05, tol=1e-3, random_state=0).fit(X)

with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "model.zarr"
    est.save(path)
    print("saved:", sorted(p.name for p in path.iterdir()))
    back = GreedySpectralEmbedding.load(path)

X_new, t_new = make_swiss_roll(500, random_state=1)
print("largest difference:", np.abs(back.transform(X_new) - est.transform(X_new)).max())
print("same eigenvalues:", np.array_equal(back.eigenvalues_, est.eigenvalues_))

fig, ax = plt.subplots(figsize=(5, 4))
ax.scatter(*back.transform(X_new).T, c=t_new, s=6, cmap="viridis")
ax.set(title="new rows embedded by the loaded model", xticks=[], yticks=[])
plt.show()
