"""Class similarity graphs, the input of `spectral`.

`class_similarity` compares the mean feature vector of each class;
`similarity_from_confusion` turns a confusion matrix into a similarity.
Both return symmetric, non-negative matrices with a zero diagonal.
"""

import numbers

import numpy as np
import scipy.sparse

from keras_ecoc.codes import _neighbors
from keras_ecoc.codes._validation import as_float_matrix
from keras_ecoc.codes._validation import check_choice
from keras_ecoc.codes._validation import check_int
from keras_ecoc.codes._validation import describe
from keras_ecoc.codes._validation import format_list

KERNELS = ("cosine", "rbf", "linear")


def class_similarity(
    features,
    labels,
    num_classes=None,
    kernel="cosine",
    gamma=None,
    n_neighbors=None,
    block_size=1024,
):
    """Builds a class similarity graph from the class mean features.

    Each class `c` is represented by the mean `mu_c` of the feature vectors
    of its samples (e.g. penultimate-layer activations of a trained network,
    or one embedding per class with `labels = np.arange(num_classes)`).
    Pairs of classes are then compared with a kernel:

    - `"cosine"`: `max(0, cos(mu_a, mu_b))`.
    - `"rbf"`: `exp(-gamma * |mu_a - mu_b|^2)`.
    - `"linear"`: `max(0, <mu_a, mu_b>)`.

    Negative similarities are clipped to 0 because `spectral` builds a
    normalized graph Laplacian, which needs non-negative edge weights
    (a negative weight can make degrees vanish or turn negative, and the
    Ncut interpretation is lost). The diagonal is set to 0: a self-loop
    says nothing about which classes resemble each other, and would only
    inflate the degrees in the normalized cut.

    With `n_neighbors`, each class is linked to its `n_neighbors` most
    similar classes (largest cosine, smallest distance for `"rbf"`, largest
    inner product for `"linear"`; ties go to the lower class id), and the
    graph is made symmetric by union, keeping the larger of the two weights.
    The neighbours are found in blocks of `block_size` classes, so the dense
    `(n, n)` matrix is never formed and 100,000 classes fit in memory.
    Edges whose weight is 0 (clipped, or underflowed for `"rbf"`) are
    dropped.

    Args:
        features: float array of shape `(N, d)`: one feature vector per
            sample.
        labels: int array of shape `(N,)`: the class of each sample, in
            `[0, num_classes)`.
        num_classes: Number of classes `n`; defaults to `max(labels) + 1`.
            Every class needs at least one sample.
        kernel: One of `"cosine"`, `"rbf"`, `"linear"`.
        gamma: Positive float, the `"rbf"` inverse length scale. Defaults to
            `1 / median` of the non-zero squared distances between class
            means: over all pairs for the dense matrix, and over the kNN
            edges with `n_neighbors` (so pass `gamma` explicitly to get the
            same weights from both). Only valid with `kernel="rbf"`.
        n_neighbors: `None` for the dense matrix, or an integer in
            `[1, n - 1]` for a sparse kNN graph.
        block_size: Classes scored at once in the kNN search; memory is
            about `8 * block_size * n` bytes.

    Returns:
        Without `n_neighbors`: a float64 `np.ndarray` of shape `(n, n)`.
        With `n_neighbors`: a float64 `scipy.sparse.csr_matrix` of shape
        `(n, n)` in which every row has at least `n_neighbors` entries
        (unless some weights are 0). Both are symmetric, non-negative and
        have a zero diagonal.

    Raises:
        TypeError: If `features` or `labels` has the wrong type.
        ValueError: If `features` is not 2-D or holds NaN or inf, if `labels`
            is not 1-D or has values outside `[0, num_classes)`, if the
            lengths differ, if a class has no sample (the message names the
            class ids), if `kernel` is unknown, if `gamma` is given for
            another kernel or is not positive, if a cosine class mean is the
            zero vector, or if `n_neighbors` is out of range.
    """
    features = as_float_matrix(features, "features")
    labels = _as_labels(labels, len(features))
    kernel = check_choice(kernel, "kernel", KERNELS)
    if num_classes is None:
        num_classes = int(labels.max()) + 1
    else:
        num_classes = check_int(num_classes, "num_classes", minimum=1)
    if gamma is not None:
        if kernel != "rbf":
            raise ValueError(
                f"Argument `gamma` is only used by kernel='rbf'; leave it "
                f"None for kernel={kernel!r}. Received: gamma={describe(gamma)}"
            )
        if (
            isinstance(gamma, (bool, np.bool_))
            or not isinstance(gamma, numbers.Real)
            or not np.isfinite(gamma)
            or gamma <= 0
        ):
            raise ValueError(
                f"Argument `gamma` must be a positive finite float or None. "
                f"Received: gamma={describe(gamma)}"
            )
        gamma = float(gamma)
    if n_neighbors is not None:
        n_neighbors = check_int(
            n_neighbors,
            "n_neighbors",
            minimum=1,
            maximum=max(1, num_classes - 1),
            reason=f" (fewer than num_classes={num_classes})",
        )
        if num_classes < 2:
            raise ValueError(
                f"Argument `n_neighbors` needs at least 2 classes. "
                f"Received: n_neighbors={n_neighbors} with "
                f"num_classes={num_classes}"
            )
    block_size = check_int(block_size, "block_size", minimum=1)

    means = _class_means(features, labels, num_classes)
    if kernel == "cosine":
        norms = np.linalg.norm(means, axis=1)
        zero = np.flatnonzero(norms == 0)
        if len(zero):
            raise ValueError(
                f"Argument `features` gives a zero mean feature vector to "
                f"classes {format_list(zero)}, so their cosine similarity is "
                f"undefined. Use kernel='rbf' or shift the features. "
                f"Received: features={describe(features)}"
            )
        means = means / norms[:, None]
    elif kernel == "rbf":
        # Distances are shift-invariant; centering reduces the cancellation
        # in |a|^2 + |b|^2 - 2<a, b>.
        means = means - means.mean(axis=0)

    if n_neighbors is None:
        return _dense_similarity(means, kernel, gamma)
    return _knn_similarity(means, kernel, gamma, n_neighbors, block_size)


def similarity_from_confusion(confusion, normalize=True):
    """Builds a class similarity from a confusion matrix.

    Classes that a model confuses are similar. With `normalize=True` each
    row is divided by its sum, so `P[i, j]` is the fraction of class `i`
    predicted as `j`, which keeps frequent classes from dominating. The
    similarity is the symmetric part `(P + P^T) / 2` with the diagonal (the
    correct predictions) set to 0.

    A class that is never confused with any other gets an all-zero row,
    which `spectral` rejects as isolated; combine with `class_similarity`
    or add a small constant to the confusion matrix in that case.

    Args:
        confusion: Non-negative array of shape `(n, n)`: `confusion[i, j]`
            counts samples of true class `i` predicted as class `j`.
        normalize: Whether to normalize each row by its sum.

    Returns:
        A float64 `np.ndarray` of shape `(n, n)`: symmetric, non-negative,
        zero diagonal.

    Raises:
        TypeError: If `confusion` is not a numeric array.
        ValueError: If `confusion` is not square, holds negative, NaN or inf
            entries, or (with `normalize=True`) has a class whose row sums
            to 0 (the message names the class ids).
    """
    confusion = as_float_matrix(confusion, "confusion")
    n_rows, n_cols = confusion.shape
    if n_rows != n_cols:
        raise ValueError(
            f"Argument `confusion` must be a square matrix of shape "
            f"(num_classes, num_classes). "
            f"Received: confusion={describe(confusion)}"
        )
    if (confusion < 0).any():
        first = tuple(int(i) for i in np.argwhere(confusion < 0)[0])
        raise ValueError(
            f"Argument `confusion` must hold non-negative counts, but entry "
            f"{first} is {confusion[first]}. "
            f"Received: confusion={describe(confusion)}"
        )
    if normalize:
        totals = confusion.sum(axis=1)
        empty = np.flatnonzero(totals == 0)
        if len(empty):
            raise ValueError(
                f"Argument `confusion` has no samples for classes "
                f"{format_list(empty)} (all-zero rows), so their rows "
                f"cannot be normalized. Pass normalize=False or add the "
                f"missing samples. Received: confusion={describe(confusion)}"
            )
        confusion = confusion / totals[:, None]
    similarity = (confusion + confusion.T) / 2.0
    np.fill_diagonal(similarity, 0.0)
    return similarity


def _as_labels(labels, num_samples):
    if scipy.sparse.issparse(labels):
        raise TypeError(
            f"Argument `labels` must be a dense 1-D integer array. "
            f"Received: labels={describe(labels)}"
        )
    array = np.asarray(labels)
    if array.dtype.kind not in "iu":
        # Integral floats (e.g. labels loaded as float) are accepted.
        if array.dtype.kind == "f" and np.all(np.isfinite(array)):
            if np.all(array == np.round(array)):
                array = array.astype(np.int64)
        if array.dtype.kind not in "iu":
            raise TypeError(
                f"Argument `labels` must be an array of integer class ids. "
                f"Received: labels={describe(labels)}"
            )
    if array.ndim != 1:
        raise ValueError(
            f"Argument `labels` must be a 1-D array of shape (num_samples,) "
            f"holding integer class ids (not one-hot). "
            f"Received: labels={describe(array)}"
        )
    if len(array) != num_samples:
        raise ValueError(
            f"Arguments `features` and `labels` must have the same length "
            f"(one label per feature row). Received: {num_samples} feature "
            f"rows and labels={describe(array)}"
        )
    return array.astype(np.int64, copy=False)


def _class_means(features, labels, num_classes):
    """Returns the float64 class means, shape `(num_classes, d)`."""
    outside = (labels < 0) | (labels >= num_classes)
    if outside.any():
        bad = np.unique(labels[outside])
        raise ValueError(
            f"Argument `labels` must hold class ids in [0, {num_classes}) "
            f"(num_classes={num_classes}), but holds {format_list(bad)}. "
            f"Received: labels={describe(labels)}"
        )
    counts = np.bincount(labels, minlength=num_classes)
    missing = np.flatnonzero(counts == 0)
    if len(missing):
        raise ValueError(
            f"Argument `labels` has no samples of classes "
            f"{format_list(missing)}, so their mean features are undefined. "
            f"Every class in [0, {num_classes}) needs at least one sample. "
            f"Received: labels={describe(labels)}"
        )
    # A sparse indicator matrix sums each class's rows in one product.
    indicator = scipy.sparse.csr_matrix(
        (np.ones(len(labels)), (labels, np.arange(len(labels)))),
        shape=(num_classes, len(labels)),
    )
    return np.asarray(indicator @ features) / counts[:, None]


def _dense_similarity(means, kernel, gamma):
    gram = means @ means.T
    if kernel == "rbf":
        squared = np.diagonal(gram)
        distances = np.maximum(squared[:, None] + squared[None, :] - 2 * gram, 0)
        if gamma is None:
            off_diagonal = distances[np.triu_indices(len(means), k=1)]
            gamma = _default_gamma(off_diagonal)
        similarity = np.exp(-gamma * distances)
    elif kernel == "cosine":
        similarity = np.clip(gram, 0.0, 1.0)
    else:
        similarity = np.maximum(gram, 0.0)
    # Round-off in the products can leave the matrix asymmetric by an ulp.
    similarity = (similarity + similarity.T) / 2.0
    np.fill_diagonal(similarity, 0.0)
    return similarity


def _default_gamma(squared_distances):
    positive = squared_distances[squared_distances > 0]
    if len(positive) == 0:
        # All means coincide: every weight is exp(0) = 1 whatever gamma is.
        return 1.0
    return 1.0 / float(np.median(positive))


def _knn_similarity(means, kernel, gamma, n_neighbors, block_size):
    n = len(means)
    if kernel == "rbf":
        # <[x, 1], [y, -|y|^2 / 2]> = <x, y> - |y|^2 / 2 ranks the y's of a
        # fixed x like -|x - y|^2 / 2.
        squared = np.einsum("ij,ij->i", means, means)
        queries = np.hstack([means, np.ones((n, 1))])
        points = np.hstack([means, -squared[:, None] / 2.0])
    else:
        queries = points = means
    neighbors = _neighbors.nearest_neighbors(
        queries, points, n_neighbors, block_size=block_size
    )
    rows = np.repeat(np.arange(n), n_neighbors)
    cols = neighbors.ravel()
    # Exact kernel values of the selected pairs, gathered in chunks so that
    # the (edges, d) temporaries stay small.
    values = np.empty(len(rows))
    chunk = max(1, (1 << 22) // means.shape[1])
    for start in range(0, len(rows), chunk):
        a = means[rows[start : start + chunk]]
        b = means[cols[start : start + chunk]]
        if kernel == "rbf":
            a = a - b
            b = a
        values[start : start + chunk] = np.einsum("ij,ij->i", a, b)
    if kernel == "rbf":
        if gamma is None:
            gamma = _default_gamma(values)
        weights = np.exp(-gamma * values)
    else:
        weights = np.clip(values, 0.0, 1.0 if kernel == "cosine" else None)
    graph = scipy.sparse.csr_matrix((weights, (rows, cols)), shape=(n, n))
    graph = graph.maximum(graph.T).tocsr()
    graph.eliminate_zeros()
    graph.sort_indices()
    return graph
