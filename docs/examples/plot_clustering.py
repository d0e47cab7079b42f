"""
Spectral clustering of circles and moons
========================================

:class:`~ooc_spectral.GreedySpectralClustering` embeds the rows with the divisive
normalization (Ng, Jordan & Weiss), scales each to unit length and runs k-means on the
embedding. Where k-means on the raw coordinates cuts the shapes in half, the spectral
embedding separates them; ``predict`` labels new rows with the same model.
"""

import matplotlib.pyplot as plt
from sklearn.cluster import KMeans
from sklearn.datasets import make_circles, make_moons
from sklearn.metrics import adjusted_rand_score

from ooc_spectral import GreedySpectralClustering

data = {
    "circles": (make_circles(1000, factor=0.4, noise=0.04, random_state=0), 20.0),
    "moons": (make_moons(1000, noise=0.05, random_state=0), 20.0),
}
fig, axes = plt.subplots(2, 2, figsize=(8, 7))
for row, (name, ((X, y), gamma)) in zip(axes, data.items()):
    sc = GreedySpectralClustering(n_clusters=2, gamma=gamma, tol=1e-3, random_state=0).fit(X)
    km = KMeans(2, n_init=10, random_state=0).fit(X)
    ari, ari_km = adjusted_rand_score(y, sc.labels_), adjusted_rand_score(y, km.labels_)
    print(f"{name}: ARI {ari:.3f} (k-means on the raw rows: {ari_km:.3f})")
    row[0].scatter(*X.T, c=km.labels_, s=4, cmap="coolwarm")
    row[0].set_title(f"{name}: k-means, ARI {ari_km:.2f}", fontsize=10)
    row[1].scatter(*X.T, c=sc.labels_, s=4, cmap="coolwarm")
    row[1].set_title(f"{name}: GreedySpectralClustering, ARI {ari:.2f}", fontsize=10)
fig.tight_layout()
plt.show()

# %%
# New rows get the label of the nearest centre in the same embedding:
X_new, y_new = make_moons(200, noise=0.05, random_state=1)
sc = GreedySpectralClustering(n_clusters=2, gamma=20.0, random_state=0).fit(data["moons"][0][0])
print("ARI on new rows:", round(adjusted_rand_score(y_new, sc.predict(X_new)), 3))
