"""Class similarity graphs, the input of `spectral`.

`class_similarity` compares the mean feature vector of each class;
`similarity_from_confusion` turns a confusion matrix into a similarity.
Both return symmetric, non-negative matrices with a zero diagonal.
"""

import numbers
import os

import numpy as np
import scipy.sparse

from keras_ecoc.codes import _neighbors
from keras_ecoc.codes._validation import as_float_matrix
from keras_ecoc.codes._validation import check_choice
from keras_ecoc.codes._validation import check_int
from keras_ecoc.codes._validation import describe
from keras_ecoc.codes._validation import format_list

KERNELS = ("cosine", "rbf", "linear")
NEIGHBOR_SEARCHES = ("auto", "exact", "approximate")

# With neighbor_search="auto", the exact search (O(n^2 d) time) serves up to
# this many classes; 20,000 classes of 256 features took 20 s on 2 shared
# CPU cores, so 50,000 take a few minutes.
_EXACT_MAX_CLASSES = 50_000

# Dense (n, n) float64 arrays alive at once while the dense similarity is
# built: the Gram matrix, the result and the temporaries of symmetrizing
# it (rbf adds the distances and the upper-triangle indices and values).
_DENSE_COPIES = {"cosine": 3, "linear": 3, "rbf": 5}


def class_similarity(
    features,
    labels,
    num_classes=None,
    kernel="cosine",
    gamma=None,
    n_neighbors=None,
    block_size=1024,
    neighbor_search="auto",
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
    The dense `(n, n)` matrix is never formed. The exact search scores
    blocks of `block_size` classes against all classes (time
    `O(n^2 d)`); the approximate search (`neighbor_search="approximate"`,
    needs the optional extra "scale": `pip install 'keras-ecoc[scale]'`,
    which installs faiss-cpu) compares each class only with the classes of
    nearby k-means cells of a faiss inverted-file index, about
    `O(n^1.5 d)`: a million classes of 256 features took 349 CPU seconds
    (`benchmarks/bench_spectral_scale.py`). It can miss a few true neighbours (replaced by the next nearest
    ones it finds); the weights of the edges it keeps are exact. Edges
    whose weight is 0 (clipped, or underflowed for `"rbf"`) are dropped.

    The dense similarity (`n_neighbors=None`) needs `n^2` float64 entries
    several times over (e.g. 240 GB for 100,000 classes); a size that
    cannot fit in the available memory is refused before any work, with a
    ValueError that suggests `n_neighbors`.

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
        block_size: Classes scored at once in the exact kNN search; memory
            is about `8 * block_size * n` bytes.
        neighbor_search: `"exact"`, `"approximate"` (faiss, see above), or
            `"auto"`: `"exact"` up to 50,000 classes, else `"approximate"`.
            Only used with `n_neighbors`.

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
            zero vector, if `n_neighbors` is out of range, if
            `neighbor_search` is unknown, or if `n_neighbors=None` asks for
            a dense similarity larger than the available memory.
        ImportError: If the approximate search is used and faiss (the
            extra "scale") is not installed; checked before any work.
    """
    original = features
    # float32 features stay float32 until the search is chosen: the faiss
    # search computes in float32, and at a million classes of 256 features a
    # float64 copy would cost 2 GB.
    features = as_float_matrix(features, "features", keep_float32=True)
    # Whether `features` may be overwritten (a fresh float64 copy).
    owned = not (
        isinstance(original, np.ndarray)
        and np.may_share_memory(features, original)
    )
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
    neighbor_search = check_choice(
        neighbor_search, "neighbor_search", NEIGHBOR_SEARCHES
    )
    faiss = None
    if n_neighbors is None:
        check_dense_fits(
            _DENSE_COPIES[kernel] * 8 * num_classes**2,
            what=(
                f"a dense ({num_classes}, {num_classes}) similarity with "
                f"kernel={kernel!r}"
            ),
            advice=(
                "Pass n_neighbors (e.g. n_neighbors=10) for a sparse "
                "k-nearest-neighbour graph. Received: n_neighbors=None"
            ),
        )
    else:
        if neighbor_search == "auto":
            neighbor_search = (
                "exact" if num_classes <= _EXACT_MAX_CLASSES else "approximate"
            )
        if neighbor_search == "approximate":
            faiss = _neighbors.import_faiss(
                f"neighbor_search='approximate' for num_classes={num_classes}"
            )
    if faiss is None and features.dtype != np.float64:
        # The dense and exact paths rank and weigh in float64.
        features, owned = features.astype(np.float64), True

    described = describe(features)
    means, owned = _class_means(features, labels, num_classes, owned)
    # The float64 copy of the features is not needed once the means exist.
    del features
    if kernel == "cosine":
        norms = np.sqrt(np.einsum("ij,ij->i", means, means, dtype=np.float64))
        zero = np.flatnonzero(norms == 0)
        if len(zero):
            raise ValueError(
                f"Argument `features` gives a zero mean feature vector to "
                f"classes {format_list(zero)}, so their cosine similarity is "
                f"undefined. Use kernel='rbf' or shift the features. "
                f"Received: features={described}"
            )
        # In place where `means` is ours: at a million classes every copy
        # of the means costs 2 GB.
        scale = (1.0 / norms[:, None]).astype(means.dtype)
        if owned:
            means *= scale
        else:
            means = means * scale
    elif kernel == "rbf":
        # Distances are shift-invariant; centering reduces the cancellation
        # in |a|^2 + |b|^2 - 2<a, b>.
        if owned:
            means -= means.mean(axis=0)
        else:
            means = means - means.mean(axis=0)

    if n_neighbors is None:
        return _dense_similarity(means, kernel, gamma)
    return _knn_similarity(means, kernel, gamma, n_neighbors, block_size, faiss)


def available_memory():
    """Bytes this process can still allocate, or None if unknown.

    The kernel's `MemAvailable` estimate (free memory plus reclaimable
    caches), lowered to the room left under a cgroup v2 memory limit.
    """
    available = None
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return None
    try:
        with open("/sys/fs/cgroup/memory.max") as file:
            limit = file.read().strip()
        with open("/sys/fs/cgroup/memory.current") as file:
            used = int(file.read().strip())
        if limit != "max":
            available = min(available, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return available


def check_dense_fits(required, what, advice):
    """Raises before any work if `required` bytes exceed the free memory.

    Args:
        required: Estimated peak bytes of the dense computation.
        what: What would be built, for the message.
        advice: The alternative, ending with the `Received: ...` part.

    Raises:
        ValueError: If the available memory is known and smaller than
            `required`.
    """
    available = available_memory()
    if available is not None and required > available:
        raise ValueError(
            f"{what[0].upper()}{what[1:]} needs about {_gib(required)} of "
            f"memory, more than the {_gib(available)} available. {advice}"
        )


def _gib(size):
    return f"{size / 2**30:,.1f} GiB"


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


def _class_means(features, labels, num_classes, owned):
    """Returns the float64 class means `(num_classes, d)` and whether they
    may be overwritten.

    With one sample per class in class order (`labels = arange(n)`, the
    usual input at a million classes) the means are `features` themselves,
    with no copy.
    """
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
    if len(labels) == num_classes and (labels == np.arange(num_classes)).all():
        return features, owned
    # A sparse indicator matrix sums each class's rows in one product.
    indicator = scipy.sparse.csr_matrix(
        (np.ones(len(labels)), (labels, np.arange(len(labels)))),
        shape=(num_classes, len(labels)),
    )
    means = np.asarray(indicator @ features)
    means /= counts[:, None]
    return means, True


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


def _knn_similarity(means, kernel, gamma, n_neighbors, block_size, faiss):
    """The symmetrized kNN graph; `faiss` is None for the exact search."""
    n = len(means)
    if faiss is not None:
        neighbors = _neighbors.approximate_nearest_neighbors(
            means,
            n_neighbors,
            metric="l2" if kernel == "rbf" else "inner_product",
            faiss=faiss,
        )
    elif kernel == "rbf":
        # <[x, 1], [y, -|y|^2 / 2]> = <x, y> - |y|^2 / 2 ranks the y's of a
        # fixed x like -|x - y|^2 / 2.
        squared = np.einsum("ij,ij->i", means, means)
        queries = np.hstack([means, np.ones((n, 1))])
        points = np.hstack([means, -squared[:, None] / 2.0])
        neighbors = _neighbors.nearest_neighbors(
            queries, points, n_neighbors, block_size=block_size
        )
    else:
        neighbors = _neighbors.nearest_neighbors(
            means, means, n_neighbors, block_size=block_size
        )
    rows = np.repeat(np.arange(n), n_neighbors)
    cols = neighbors.ravel()
    # Exact kernel values of the selected pairs, gathered in chunks so that
    # the (edges, d) temporaries stay small.
    values = np.empty(len(rows))
    chunk = max(1, (1 << 22) // means.shape[1])
    # In float64 also for float32 means, like the exact search.
    for start in range(0, len(rows), chunk):
        a = means[rows[start : start + chunk]].astype(np.float64)
        b = means[cols[start : start + chunk]].astype(np.float64)
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
