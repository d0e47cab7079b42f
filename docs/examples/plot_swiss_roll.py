"""
Unrolling a swiss roll with Laplacian eigenmaps
===============================================

The divisive normalization (``normalization="divisive"``) gives the eigenvectors of
``D^-1/2 K D^-1/2``: spectral clustering's and Laplacian eigenmaps' embedding (the trivial
first one dropped).

**Which coordinates show the unrolled sheet: 0 and 4.** Every swiss roll of this
documentation (the README, the quickstart workflow, the command-line examples) is fitted with
``gamma=0.15, tol=3e-2`` and drawn from coordinates 0 and 4 (``E[:, 0]``, ``E[:, 4]``,
``ooc-spectral plot --dims 0,4``), for this reason. Unrolled, the roll is a rectangle: a
length ``L = 89`` along the spiral (its arc length from ``t = 1.5π`` to ``4.5π``) by a
height ``H = 21``. Laplacian eigenmaps approximate the Laplacian's eigenfunctions on it,
``cos(kπs/L) cos(lπh/H)`` with eigenvalues ``(k/L)² + (l/H)²``, in increasing order. Since
``(L/H)² = 18`` lies between ``4² = 16`` and ``5²``, the first four modes vary along the roll
only (``k = 1`` to ``4``) and the fifth across it (``l = 1``): coordinate 0, ``cos(πs/L)``,
is monotone along the roll, coordinates 1 to 3 are its harmonics, and coordinate 4,
``cos(πh/H)``, is monotone in the height. Plotted against each other, 0 and 4 are the sheet.

The kernel's width decides whether the sheet comes out flat. The roll's turns are 2π apart:
with ``gamma=0.05`` the kernel between neighbouring turns is ``exp(-0.05 * 39.5) = 0.14``,
the turns are joined and the first coordinates go round the roll in a loop; with
``gamma=0.15`` it is ``0.003`` and the sheet is unrolled.

The narrower kernel needs a larger dictionary: at ``gamma=0.15`` more than ``sqrt(80 n)``
points of this 5,000-row roll, past the size at which the exact problem is the cheaper one,
so that fit solves the exact problem on the 5000 x 5000 Gram matrix and says so in a
``DictionaryWarning`` (below). The dictionary's size follows the kernel's width and the roll's
extent and grows little with ``n``, so on the quickstart's million rows it is a small fraction
of them.
"""

import matplotlib.pyplot as plt
from sklearn.datasets import make_swiss_roll

from ooc_spectral import GreedySpectralEmbedding

X, t = make_swiss_roll(5000, noise=0.05, random_state=0)
# sphinx_gallery_start_ignore
# not on the page: tests/test_docs.py builds the gallery on a fraction of the rows
import os

FRACTION = float(os.environ.get("OOC_SPECTRAL_GALLERY_FRACTION", "1"))
X, t = X[: round(len(X) * FRACTION)], t[: round(len(t) * FRACTION)]
# sphinx_gallery_end_ignore

fig = plt.figure(figsize=(12, 3.8))
ax = fig.add_subplot(1, 3, 1, projection="3d")
ax.scatter(X[:, 0], X[:, 1], X[:, 2], c=t, s=3, cmap="viridis")
ax.set_title("the roll, coloured by its angle t")
for k, gamma in enumerate([0.05, 0.15]):
    est = GreedySpectralEmbedding(n_components=5, normalization="divisive", gamma=gamma,
                                  tol=3e-2, random_state=0).fit(X)
    print(f"gamma={gamma}: dictionary of {len(est.dictionary_indices_)} rows, "
          f"max_residual_ = {est.max_residual_:.1e}")
    E = est.embedding_
    ax = fig.add_subplot(1, 3, 2 + k)
    ax.scatter(E[:, 0], E[:, 4], c=t, s=3, cmap="viridis")
    ax.set(title=f"gamma={gamma}: coordinates 0 and 4", xticks=[], yticks=[])
fig.tight_layout()
plt.show()
