"""
Spectral clustering at its defaults: circles, moons, unequal blobs
==================================================================

:class:`~ooc_spectral.GreedySpectralClustering` with nothing set but ``n_clusters`` joins
each row to its 5 nearest of (at most) 1000 representatives, with a Gaussian weight whose
bandwidth is local on both sides of the edge; the graph's spectral embedding comes
exactly from a small eigenproblem, and k-means on it gives the clusters. Where k-means
on the raw coordinates cuts the shapes in half, or splits the large diffuse blob and
merges the small dense ones, the default separates them; ``predict`` labels new rows
with the same model. The comparison with scikit-learn on real data is in the
documentation's clustering page.
"""

import matplotlib.pyplot as plt
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs, make_circles, make_moons
from sklearn.metrics import adjusted_rand_score

from ooc_spectral import GreedySpectralClustering

data = {
    "circles": (make_circles(3000, factor=0.5, noise=0.05, random_state=0), 2),
    "moons, noise 0.1": (make_moons(3000, noise=0.1, random_state=0), 2),
    "unequal blobs": (make_blobs([2400, 480, 120], cluster_std=[1.5, 0.5, 0.3],
                                 random_state=1), 3),
}
# sphinx_gallery_start_ignore
# not on the page: tests/test_docs.py builds the gallery on a fraction of the rows
import os

FRACTION = float(os.environ.get("OOC_SPECTRAL_GALLERY_FRACTION", "1"))
data = {name: ((X[: round(len(X) * FRACTION)], y[: round(len(y) * FRACTION)]), k)
        for name, ((X, y), k) in data.items()}
# sphinx_gallery_end_ignore
fig, axes = plt.subplots(len(data), 2, figsize=(8, 10))
for row, (name, ((X, y), k)) in zip(axes, data.items()):
    sc = GreedySpectralClustering(n_clusters=k, random_state=0).fit(X)
    km = KMeans(k, random_state=0).fit(X)
    ari, ari_km = adjusted_rand_score(y, sc.labels_), adjusted_rand_score(y, km.labels_)
    print(f"{name}: ARI {ari:.3f} (k-means on the raw rows: {ari_km:.3f})")
    row[0].scatter(*X.T, c=km.labels_, s=3, cmap="tab10", vmax=9)
    row[0].set_title(f"{name}: KMeans, ARI {ari_km:.2f}", fontsize=10)
    row[1].scatter(*X.T, c=sc.labels_, s=3, cmap="tab10", vmax=9)
    row[1].set_title(f"{name}: GreedySpectralClustering, ARI {ari:.2f}", fontsize=10)
fig.tight_layout()
plt.show()

# %%
# New rows get the label of the nearest centre in the same embedding:
X_new, y_new = make_moons(500, noise=0.1, random_state=1)
sc = GreedySpectralClustering(n_clusters=2, random_state=0).fit(data["moons, noise 0.1"][0][0])
print("ARI on new rows:", round(adjusted_rand_score(y_new, sc.predict(X_new)), 3))

# %%
# ``n_clusters="auto"`` reads the number of clusters from the largest relative gap
# between the graph's Laplacian eigenvalues (``eigengaps_``):
X, y = make_blobs(3000, centers=5, cluster_std=0.8, random_state=2)
auto = GreedySpectralClustering(n_clusters="auto", random_state=0).fit(X)
print("clusters found:", auto.n_clusters_, "ARI", round(adjusted_rand_score(y, auto.labels_), 3))
