"""
Embedding new rows (out of sample)
==================================

``transform`` embeds rows that were not in the fit with the Nyström formula of Bengio et al.
(2003): their kernel values against the dictionary, projected with the fitted map. On
training rows it gives back ``embedding_``; on new rows of the same distribution it lands
where a fit on all the rows would put them.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import make_s_curve

from ooc_spectral import GreedySpectralEmbedding

X, t = make_s_curve(4000, noise=0.02, random_state=0)
train, new = X[:3000], X[3000:]
est = GreedySpectralEmbedding(n_components=2, gamma=0.5, tol=1e-4, random_state=0).fit(train)

# on the training rows, transform is the training embedding
print("training rows:", np.abs(est.transform(train) - est.embedding_).max())

E_new = est.transform(new)
fig, ax = plt.subplots(figsize=(5, 4.5))
ax.scatter(*est.embedding_.T, c=t[:3000], s=3, cmap="viridis", alpha=0.3, label="training")
ax.scatter(*E_new.T, c=t[3000:], s=12, cmap="viridis", marker="x", label="new rows")
ax.legend()
ax.set(title="S-curve: new rows embedded by transform", xticks=[], yticks=[])
plt.show()
