"""Exact t-SNE in NumPy (van der Maaten & Hinton, 2008).

O(N^2) memory and time per iteration: meant for the <= 1,500 points of the
experiments' pictures (about 20-40 s on 2 CPU cores for 1,500 points).
"""

import numpy as np


def pca(x, dims=50):
    """Projects x (N, D) on its first `dims` principal axes -> (N, min(dims, D, N))."""
    x = np.asarray(x, np.float64)
    x = x - x.mean(axis=0)
    dims = min(dims, x.shape[1], x.shape[0])
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    return x @ vt[:dims].T


def _squared_distances(x):
    sq = np.sum(x * x, axis=1)
    d = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)
    np.fill_diagonal(d, 0.0)
    return np.maximum(d, 0.0)


def joint_probabilities(x, perplexity=30.0, tol=1e-5, max_iter=100):
    """Symmetric input affinities P (N, N) with per-point bandwidths.

    Each conditional distribution p(j|i) has the given perplexity (binary
    search on its precision beta = 1 / (2 sigma^2)).
    """
    distances = _squared_distances(np.asarray(x, np.float64))
    n = len(distances)
    perplexity = min(float(perplexity), (n - 1) / 3.0)
    target = np.log(perplexity)
    p = np.zeros((n, n))
    for i in range(n):
        d = np.delete(distances[i], i)
        d = d - d.min()
        beta, low, high = 1.0, 0.0, np.inf
        for _ in range(max_iter):
            w = np.exp(-d * beta)
            total = max(w.sum(), 1e-300)
            entropy = np.log(total) + beta * np.sum(d * w) / total
            diff = entropy - target
            if abs(diff) < tol:
                break
            if diff > 0:  # too flat: increase precision
                low = beta
                beta = beta * 2.0 if high == np.inf else (beta + high) / 2.0
            else:
                high = beta
                beta = (beta + low) / 2.0
        p[i, np.arange(n) != i] = w / total
    p = (p + p.T) / (2.0 * n)
    return np.maximum(p, 1e-12)


def tsne(x, dims=2, perplexity=30.0, pca_dims=50, n_iter=750,
         learning_rate=None, early_exaggeration=12.0, seed=0):
    """Embeds x (N, D) into (N, dims) with exact t-SNE.

    Args:
        x: (N, D) features.
        dims: output dimension.
        perplexity: effective number of neighbours (capped at (N - 1) / 3).
        pca_dims: PCA to this many dimensions first (also the initialisation:
            the first `dims` principal components, scaled to std 1e-4).
        n_iter: gradient iterations (the first 250 with early exaggeration).
        learning_rate: default max(N / early_exaggeration / 4, 50).
        seed: unused by the deterministic PCA initialisation; kept for the
            tie-breaking jitter.

    Returns:
        float64 (N, dims) embedding.
    """
    x = np.asarray(x, np.float64)
    n = len(x)
    if n < 4:
        raise ValueError(f"t-SNE needs at least 4 points. Received: {n}")
    reduced = pca(x, pca_dims)
    p = joint_probabilities(reduced, perplexity)
    init = reduced[:, :dims]
    if init.shape[1] < dims:
        init = np.pad(init, ((0, 0), (0, dims - init.shape[1])))
    rng = np.random.default_rng(seed)
    init = init + 1e-6 * rng.standard_normal(init.shape) * (init.std() + 1e-12)
    y = init / (init[:, 0].std() + 1e-12) * 1e-4
    if learning_rate is None:
        learning_rate = max(n / early_exaggeration / 4.0, 50.0)
    velocity = np.zeros_like(y)
    gains = np.ones_like(y)
    exaggeration_iters = min(250, n_iter // 3)
    for it in range(n_iter):
        exaggeration = early_exaggeration if it < exaggeration_iters else 1.0
        momentum = 0.5 if it < exaggeration_iters else 0.8
        num = 1.0 / (1.0 + _squared_distances(y))
        np.fill_diagonal(num, 0.0)
        q = np.maximum(num / num.sum(), 1e-12)
        pq = (exaggeration * p - q) * num
        grad = 4.0 * (pq.sum(axis=1)[:, None] * y - pq @ y)
        same_sign = np.sign(grad) == np.sign(velocity)
        gains = np.where(same_sign, gains * 0.8, gains + 0.2)
        gains = np.maximum(gains, 0.01)
        velocity = momentum * velocity - learning_rate * gains * grad
        y = y + velocity
        y = y - y.mean(axis=0)
    return y


def neighbour_agreement(points, labels, k=5):
    """Fraction of each point's k nearest neighbours sharing its label."""
    d = _squared_distances(np.asarray(points, np.float64))
    np.fill_diagonal(d, np.inf)
    neighbours = np.argsort(d, axis=1)[:, :k]
    labels = np.asarray(labels)
    return float(np.mean(labels[neighbours] == labels[:, None]))
