"""k-nearest-neighbour search between class means.

Exact search: the full (n, n) score matrix is never formed: rows are
processed in blocks of `block_size`, each block scored against all n points
with one matrix product, and the top-k of each row selected. Memory is
O(block_size * n), time O(n^2 d).

Approximate search (`approximate_nearest_neighbors`) uses a faiss inverted
file index, time about O(n^1.5 d), for a million classes; faiss is the
optional extra "scale".
"""

import numpy as np

# Width of the column chunks whose maxima give a cheap lower bound on each
# row's k-th largest score (see `top_k_per_row`).
_CHUNK = 64


def top_k_per_row(scores, k):
    """Returns the k largest entries of every row, largest first.

    Ties are broken by the lower column index, so the result is
    deterministic. A full `argpartition` of every row costs O(n) per row
    with a large constant; instead, the k-th largest of the maxima of
    `_CHUNK`-wide column chunks is a lower bound `tau` on the k-th largest
    entry (at least k chunks hold an entry >= tau), so only entries >= tau,
    typically about k per row, need sorting. Two streaming passes replace
    the partition, which is several times faster for n in the thousands.

    Args:
        scores: float `np.ndarray` of shape `(rows, n)`, C-contiguous, with
            `-inf` where a column must never be chosen.
        k: Number of entries per row, `1 <= k <= n`.

    Returns:
        A tuple `(indices, values)` of arrays of shape `(rows, k)`.
    """
    rows, n = scores.shape
    num_chunks = n // _CHUNK
    if num_chunks < 4 * k:
        # Few columns: the exact k-th largest value is cheap to get.
        tau = -np.partition(-scores, k - 1, axis=1)[:, k - 1]
    else:
        full = num_chunks * _CHUNK
        chunk_max = (
            scores[:, :full].reshape(rows, num_chunks, _CHUNK).max(axis=2)
        )
        if full < n:
            chunk_max = np.concatenate(
                [chunk_max, scores[:, full:].max(axis=1, keepdims=True)],
                axis=1,
            )
        tau = -np.partition(-chunk_max, k - 1, axis=1)[:, k - 1]
    flat = np.flatnonzero(scores >= tau[:, None])
    if len(flat) > 64 * k * rows + rows * _CHUNK:
        # Massive ties (e.g. many identical points): a stable sort of the
        # rows is cheaper than sorting a huge candidate set.
        indices = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return indices, np.take_along_axis(scores, indices, axis=1)
    cand_rows, cand_cols = np.divmod(flat, n)
    cand_values = scores.ravel()[flat]
    order = np.lexsort((cand_cols, -cand_values, cand_rows))
    # Every row has at least k candidates (all entries >= tau), so the
    # first k after its start are its top-k.
    starts = np.searchsorted(cand_rows[order], np.arange(rows))
    picks = order[starts[:, None] + np.arange(k)]
    return cand_cols[picks], cand_values[picks]


def nearest_neighbors(queries, points, k, block_size=1024):
    """Finds, for every point, its k most similar other points.

    Similarity is the inner product `<queries[i], points[j]>`; for
    Euclidean neighbours pass `queries = [x, 1]` and
    `points = [x, -|x|^2 / 2]`, whose product ranks neighbours like
    `-|x_i - x_j|^2 / 2` up to a per-row constant. Each point's own column
    is excluded.

    Args:
        queries: float `np.ndarray` of shape `(n, d)`.
        points: float `np.ndarray` of shape `(n, d)`.
        k: Number of neighbours, `1 <= k <= n - 1`.
        block_size: Rows scored at once; memory is about
            `8 * block_size * n` bytes.

    Returns:
        int64 `np.ndarray` of shape `(n, k)`: neighbour indices, most
        similar first (ties: lower index).
    """
    n = queries.shape[0]
    points_t = np.ascontiguousarray(points.T)
    neighbors = np.empty((n, k), dtype=np.int64)
    for start in range(0, n, block_size):
        stop = min(start + block_size, n)
        block = queries[start:stop] @ points_t
        block[np.arange(stop - start), np.arange(start, stop)] = -np.inf
        neighbors[start:stop], _ = top_k_per_row(block, k)
    return neighbors


# Approximate search (faiss, the optional extra "scale").

# Inverted lists per sqrt(n) points: the coarse assignment (a matrix product,
# n * nlist * d) and the list scans (n * nprobe * n / nlist * d, slower per
# operation) cost about the same at 4 sqrt(n) lists.
_LISTS_PER_SQRT_N = 4

# Lists scanned per query. benchmarks/bench_spectral_scale.py measured a
# recall@10 of 0.81 at 10^5 and 0.75 at 10^6 classes of noisy 256-dimensional
# means (1.0 on well-separated clusters); 16 or 32 lists would reach about
# 0.85 or 0.94 at 10^5 for 1.8x or 3.3x the search time.
_NPROBE = 8

# K-means points per list and iterations of the coarse quantizer's training:
# it only has to split the points into balanced cells, not converge.
_TRAIN_POINTS_PER_LIST = 32
_TRAIN_ITERATIONS = 10

EXTRA = "scale"


def import_faiss(argument):
    """Imports faiss, or raises an ImportError naming the extra.

    Args:
        argument: The argument and value that asked for the approximate
            search, e.g. `"neighbor_search='approximate'"`, for the message.

    Returns:
        The `faiss` module.

    Raises:
        ImportError: If faiss is not installed.
    """
    try:
        import faiss  # noqa: PLC0415 - an optional dependency
    except ImportError as error:
        raise ImportError(
            f"The approximate nearest-neighbour search ({argument}) needs "
            f"faiss, which keras-ecoc installs with its optional extra "
            f"{EXTRA!r}: pip install 'keras-ecoc[{EXTRA}]' (or pip install "
            f"faiss-cpu). Without it, pass neighbor_search='exact', whose "
            f"time grows as num_classes^2."
        ) from error
    return faiss


def approximate_nearest_neighbors(points, k, metric, faiss):
    """Finds, for every point, k near other points with a faiss IVF index.

    The points are clustered into about `4 sqrt(n)` cells by k-means (on a
    sample of 32 points per cell); each point is then compared with the
    points of the 8 cells nearest to it. A point whose 8 cells hold fewer
    than `k` other points (tiny cells at small n) gets its neighbours from
    an exact search.

    Args:
        points: float `np.ndarray` of shape `(n, d)`.
        k: Number of neighbours, `1 <= k <= n - 1`.
        metric: `"inner_product"` (largest `<x_i, x_j>` first) or `"l2"`
            (smallest `|x_i - x_j|` first).
        faiss: The module returned by `import_faiss`.

    Returns:
        int64 `np.ndarray` of shape `(n, k)`: neighbour indices, the point
        itself excluded, nearest first.
    """
    n, d = points.shape
    # faiss computes in float32.
    data = np.ascontiguousarray(points, dtype=np.float32)
    num_lists = int(
        max(1, min(_LISTS_PER_SQRT_N * np.sqrt(n), n // _TRAIN_POINTS_PER_LIST))
    )
    if metric == "l2":
        quantizer = faiss.IndexFlatL2(d)
        index = faiss.IndexIVFFlat(quantizer, d, num_lists, faiss.METRIC_L2)
    else:
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(
            quantizer, d, num_lists, faiss.METRIC_INNER_PRODUCT
        )
    index.cp.niter = _TRAIN_ITERATIONS
    index.cp.seed = 1234
    index.cp.min_points_per_centroid = 1
    index.cp.max_points_per_centroid = _TRAIN_POINTS_PER_LIST
    # faiss subsamples max_points_per_centroid * num_lists training points
    # itself, with cp.seed.
    index.train(data)
    index.add(data)
    index.nprobe = min(num_lists, _NPROBE)
    _, found = index.search(data, k + 1)
    del index, quantizer, data

    own = found == np.arange(n)[:, None]
    # A point is normally its own nearest hit; where ties or the float32
    # round-off hide it, the last hit goes instead.
    missing_self = ~own.any(axis=1)
    own[missing_self, -1] = True
    neighbors = found[~own].reshape(n, k).astype(np.int64)
    short = np.flatnonzero((neighbors < 0).any(axis=1))
    if len(short):
        neighbors[short] = _exact_rows(points, short, k, metric)
    return neighbors


def _exact_rows(points, rows, k, metric, block_size=1024):
    """Exact neighbours of `points[rows]` among all points (self excluded).

    Scores in the dtype of `points` (float32 from the approximate search,
    which ranks in float32 too): a float64 copy would double the memory.
    """
    if metric == "l2":
        squared = np.einsum("ij,ij->i", points, points)
        targets = points.T
        bias = -squared / 2.0
    else:
        targets = points.T
        bias = None
    out = np.empty((len(rows), k), dtype=np.int64)
    for start in range(0, len(rows), block_size):
        block_rows = rows[start : start + block_size]
        scores = points[block_rows] @ targets
        if bias is not None:
            # <x, y> - |y|^2 / 2 ranks y like -|x - y|^2 / 2.
            scores += bias
        scores[np.arange(len(block_rows)), block_rows] = -np.inf
        out[start : start + len(block_rows)], _ = top_k_per_row(
            np.ascontiguousarray(scores), k
        )
    return out
