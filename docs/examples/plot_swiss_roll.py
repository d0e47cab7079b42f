"""
Unrolling a swiss roll with Laplacian eigenmaps
===============================================

The divisive normalization (``normalization="divisive"``) gives the eigenvectors of
``D^-1/2 K D^-1/2``: spectral clustering's and Laplacian eigenmaps' embedding. The first
coordinate follows the roll's angle ``t``; the roll's height appears in a later coordinate
(here the fifth), after the harmonics along the roll, which is about four times longer than
it is high.

The kernel's width decides whether the sheet comes out flat. The roll's turns are 2π apart:
with ``gamma=0.05`` the kernel between neighbouring turns is ``exp(-0.05 * 39.5) = 0.14``,
the turns are joined and the first coordinate goes round in a loop; with ``gamma=0.15`` it is
``0.003`` and the sheet is unrolled.
"""

import matplotlib.pyplot as plt
from sklearn.datasets import make_swiss_roll

from ooc_spectral import GreedySpectralEmbedding

X, t = make_swiss_roll(5000, noise=0.05, random_state=0)

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
    ax.set(title=f"gamma={gamma}: coordinates 1 and 5", xticks=[], yticks=[])
fig.tight_layout()
plt.show()
