"""t-SNE of penultimate features (scikit-learn) and a neighbourhood score.

`tsne` wraps `sklearn.decomposition.PCA` + `sklearn.manifold.TSNE` (exact
method below 5,000 points is not needed: Barnes-Hut is the default) with the
settings the pictures experiment uses; `neighbour_agreement` uses
`sklearn.neighbors.NearestNeighbors`. scikit-learn is in the `experiments`
extra (`pip install "keras-ecoc[research]"`).
"""

import numpy as np

# scikit-learn's TSNE refuses fewer than 250 iterations.
MIN_ITERATIONS = 250


def tsne(x, dims=2, perplexity=30.0, pca_dims=50, n_iter=750, seed=0):
    """Embeds x (N, D) into (N, dims).

    Args:
        x: (N, D) features.
        dims: output dimension.
        perplexity: effective number of neighbours (capped at (N - 1) / 3,
            as TSNE needs perplexity < N).
        pca_dims: PCA to at most this many dimensions first (and PCA
            initialisation of the embedding).
        n_iter: optimisation iterations (at least 250, scikit-learn's
            minimum).
        seed: random state.

    Returns:
        float (N, dims) embedding.
    """
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    x = np.asarray(x, np.float64)
    n = len(x)
    if n < 4:
        raise ValueError(f"t-SNE needs at least 4 points. Received: {n}")
    dims_pca = int(min(pca_dims, x.shape[1], n))
    if dims_pca < x.shape[1]:
        x = PCA(dims_pca, random_state=seed).fit_transform(x)
    perplexity = float(min(perplexity, max(1.0, (n - 1) / 3)))
    model = TSNE(dims, perplexity=perplexity, init="pca",
                 learning_rate="auto", max_iter=max(MIN_ITERATIONS,
                                                    int(n_iter)),
                 random_state=seed)
    return model.fit_transform(x)


def neighbour_agreement(points, labels, k=5):
    """Fraction of the k nearest neighbours (self excluded) sharing the label."""
    from sklearn.neighbors import NearestNeighbors

    points = np.asarray(points, np.float64)
    labels = np.asarray(labels)
    k = int(min(k, len(points) - 1))
    index = NearestNeighbors(n_neighbors=k + 1).fit(points)
    _, neighbours = index.kneighbors(points)
    return float(np.mean(labels[neighbours[:, 1:]] == labels[:, None]))
