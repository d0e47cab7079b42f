"""
Kernel PCA of the digits, with a certificate
============================================

Kernel PCA of scikit-learn's 8 x 8 digits (1797 rows, 64 pixels) with a Gaussian kernel.
The fit keeps a dictionary of rows whose span in feature space holds every row to within
``tol``; ``max_residual_`` certifies it and every exact eigenvalue lies in
``eigenvalue_interval_``: at most ``eigenvalue_error_bound_`` above ``eigenvalues_[i]``, up
to the eigensolve's rounding, which the interval adds.

With the default ``gamma`` (the median heuristic) no digit is close to the span of the
others: every row would enter the dictionary, and the fit says so and solves kernel PCA
exactly instead. A kernel ten times wider (``gamma`` ten times smaller) is smooth enough for
a dictionary of about a hundred rows at ``tol=1e-2``.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_digits
from sklearn.decomposition import KernelPCA

from ooc_spectral import GreedySpectralEmbedding

X, y = load_digits(return_X_y=True)
# sphinx_gallery_start_ignore
# not on the page: tests/test_docs.py builds the gallery on a fraction of the rows
import os

FRACTION = float(os.environ.get("OOC_SPECTRAL_GALLERY_FRACTION", "1"))
X, y = X[: round(len(X) * FRACTION)], y[: round(len(y) * FRACTION)]
# sphinx_gallery_end_ignore
est = GreedySpectralEmbedding(n_components=2, gamma=4e-5, tol=1e-2, random_state=0).fit(X)
print(f"dictionary: {len(est.dictionary_indices_)} of {len(X)} rows")
print(f"max_residual_ = {est.max_residual_:.2e} (tol = {est.tol})")
print(f"eigenvalues_ = {est.eigenvalues_}, each exact one at most "
      f"{est.eigenvalue_error_bound_:.3g} above")

# %%
# The exact answer, from the full 1797 x 1797 Gram matrix, is inside the interval:
exact = KernelPCA(n_components=2, kernel="rbf", gamma=4e-5, eigen_solver="dense").fit(X)
print("exact eigenvalues:", exact.eigenvalues_)
assert np.all(exact.eigenvalues_ >= est.eigenvalues_ - 1e-9 * exact.eigenvalues_[0])
assert np.all(exact.eigenvalues_ <= est.eigenvalues_ + est.eigenvalue_error_bound_)

# %%
# The embedding, coloured by the digit:
fig, ax = plt.subplots(figsize=(5, 4.5))
sc = ax.scatter(*est.embedding_.T, c=y, cmap="tab10", s=6)
fig.colorbar(sc, ax=ax, label="digit")
ax.set(title=f"digits, kernel PCA from {len(est.dictionary_indices_)} dictionary rows",
       xlabel="component 1", ylabel="component 2")
plt.show()
