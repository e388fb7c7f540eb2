"""Tests of `class_similarity` and `similarity_from_confusion`.

The references loop over classes and pairs in float64, computing means by
boolean masks and distances by explicit differences, rather than by the
sparse indicator products and expanded distances the library uses.
"""

import sys

import numpy as np
import pytest
import scipy.sparse

from keras_ecoc import codes
from keras_ecoc.codes import _neighbors
from keras_ecoc.codes import similarity as similarity_module


def _reference_means(features, labels, num_classes):
    return np.stack(
        [features[labels == c].mean(axis=0) for c in range(num_classes)]
    )


def _reference_similarity(features, labels, num_classes, kernel, gamma=None):
    means = _reference_means(features, labels, num_classes)
    n = num_classes
    out = np.zeros((n, n))
    if kernel == "rbf" and gamma is None:
        squared = [
            np.sum((means[a] - means[b]) ** 2)
            for a in range(n)
            for b in range(a + 1, n)
        ]
        gamma = 1.0 / np.median([d for d in squared if d > 0])
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            if kernel == "cosine":
                value = means[a] @ means[b] / (
                    np.linalg.norm(means[a]) * np.linalg.norm(means[b])
                )
            elif kernel == "linear":
                value = means[a] @ means[b]
            else:
                value = np.exp(-gamma * np.sum((means[a] - means[b]) ** 2))
            out[a, b] = max(value, 0.0)
    return out


def _data(rng, num_samples=400, num_classes=15, dim=6, offset=0.0):
    # Every class appears at least once.
    extra = rng.integers(0, num_classes, num_samples - num_classes)
    labels = np.concatenate([np.arange(num_classes), extra])
    features = rng.standard_normal((num_samples, dim)) + offset
    return features, labels


@pytest.mark.parametrize("kernel", ["cosine", "rbf", "linear"])
def test_class_similarity_matches_a_per_class_loop_reference(kernel):
    rng = np.random.default_rng(1)
    features, labels = _data(rng)
    out = codes.class_similarity(features, labels, kernel=kernel)
    expected = _reference_similarity(features, labels, 15, kernel)
    assert out.dtype == np.float64 and out.shape == (15, 15)
    np.testing.assert_allclose(out, expected, rtol=1e-9, atol=1e-12)


def test_class_similarity_rbf_with_explicit_gamma_and_far_from_origin():
    rng = np.random.default_rng(2)
    # A large common offset: the expanded |a|^2 + |b|^2 - 2ab would lose
    # digits without centering.
    features, labels = _data(rng, offset=1e4)
    out = codes.class_similarity(features, labels, kernel="rbf", gamma=0.7)
    expected = _reference_similarity(features, labels, 15, "rbf", gamma=0.7)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("kernel", ["cosine", "rbf", "linear"])
def test_class_similarity_is_symmetric_non_negative_with_zero_diagonal(kernel):
    rng = np.random.default_rng(3)
    features, labels = _data(rng, num_classes=30, dim=4)
    out = codes.class_similarity(features, labels, kernel=kernel)
    np.testing.assert_array_equal(out, out.T)
    assert (out >= 0).all()
    np.testing.assert_array_equal(np.diag(out), 0)
    # Random means have negative cosines and inner products: some are
    # clipped to exactly 0.
    if kernel != "rbf":
        assert (out[~np.eye(30, dtype=bool)] == 0).any()


def test_class_similarity_counts_classes_from_num_classes_and_float_labels():
    rng = np.random.default_rng(4)
    features, labels = _data(rng, num_classes=5)
    out = codes.class_similarity(features, labels.astype(np.float32), num_classes=5)
    np.testing.assert_allclose(
        out, _reference_similarity(features, labels, 5, "cosine"), rtol=1e-9
    )


@pytest.mark.parametrize("kernel", ["cosine", "rbf", "linear"])
def test_knn_graph_is_symmetric_and_matches_the_dense_similarity(kernel):
    rng = np.random.default_rng(5)
    features, labels = _data(rng, num_samples=900, num_classes=200, dim=5, offset=0.5)
    gamma = 0.3 if kernel == "rbf" else None
    dense = codes.class_similarity(features, labels, kernel=kernel, gamma=gamma)
    graph = codes.class_similarity(
        features, labels, kernel=kernel, gamma=gamma, n_neighbors=6, block_size=37
    )
    assert isinstance(graph, scipy.sparse.csr_matrix)
    assert abs(graph - graph.T).max() == 0
    assert graph.diagonal().max() == 0
    counts = np.diff(graph.indptr)
    rows = np.repeat(np.arange(200), counts)
    np.testing.assert_allclose(graph.data, dense[rows, graph.indices], rtol=1e-9)
    # Each class keeps its 6 most similar classes (here all weights are
    # positive, so none is dropped).
    assert (counts >= 6).all()
    for a in range(200):
        top = np.argsort(-dense[a], kind="stable")
        top = top[top != a][:6]
        assert set(top) <= set(graph.indices[graph.indptr[a] : graph.indptr[a + 1]])


def test_knn_graph_of_many_classes_uses_the_exact_neighbours():
    # 3000 classes with one sample each: the chunked top-k path runs (more
    # than 4 * k chunks of 64 columns) with a ragged last chunk.
    rng = np.random.default_rng(6)
    means = rng.standard_normal((3000, 8))
    graph = codes.class_similarity(
        means, np.arange(3000), kernel="rbf", gamma=0.1, n_neighbors=10, block_size=700
    )
    diff = means[:, None, :] - means[None, :, :]
    distances = np.einsum("abi,abi->ab", diff, diff)
    np.fill_diagonal(distances, np.inf)
    nearest = np.argsort(distances, axis=1, kind="stable")[:, :10]
    for a in range(0, 3000, 7):
        row = graph.indices[graph.indptr[a] : graph.indptr[a + 1]]
        assert set(nearest[a]) <= set(row)
        np.testing.assert_allclose(
            graph[a, nearest[a]].toarray()[0],
            np.exp(-0.1 * distances[a, nearest[a]]),
            rtol=1e-9,
        )


@pytest.mark.parametrize("num_columns", [50, 5000])
def test_top_k_per_row_breaks_ties_by_lower_index(num_columns):
    rng = np.random.default_rng(num_columns)
    scores = rng.integers(0, 20, size=(40, num_columns)).astype(np.float64)
    scores[:, ::3] = -np.inf
    indices, values = _neighbors.top_k_per_row(scores, 7)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :7]
    np.testing.assert_array_equal(indices, order)
    np.testing.assert_array_equal(values, np.take_along_axis(scores, order, axis=1))


def test_knn_graph_default_gamma_is_the_median_over_the_knn_edges():
    rng = np.random.default_rng(7)
    means = rng.standard_normal((300, 3))
    graph = codes.class_similarity(means, np.arange(300), kernel="rbf", n_neighbors=4)
    diff = means[:, None, :] - means[None, :, :]
    distances = np.einsum("abi,abi->ab", diff, diff)
    np.fill_diagonal(distances, np.inf)
    nearest = np.argsort(distances, axis=1, kind="stable")[:, :4]
    # One squared distance per (class, neighbour) choice, 300 * 4 of them.
    gamma = 1.0 / np.median(np.take_along_axis(distances, nearest, axis=1))
    coo = graph.tocoo()
    np.testing.assert_allclose(
        coo.data, np.exp(-gamma * distances[coo.row, coo.col]), rtol=1e-9
    )


# similarity_from_confusion


def test_similarity_from_confusion_matches_a_loop_reference():
    rng = np.random.default_rng(8)
    confusion = rng.integers(0, 50, size=(9, 9)).astype(np.float64)
    out = codes.similarity_from_confusion(confusion)
    expected = np.zeros((9, 9))
    for i in range(9):
        for j in range(9):
            if i != j:
                expected[i, j] = (
                    confusion[i, j] / confusion[i].sum()
                    + confusion[j, i] / confusion[j].sum()
                ) / 2
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    raw = codes.similarity_from_confusion(confusion, normalize=False)
    expected_raw = (confusion + confusion.T) / 2
    np.fill_diagonal(expected_raw, 0)
    np.testing.assert_array_equal(raw, expected_raw)


def test_similarity_from_confusion_names_classes_without_samples():
    confusion = np.ones((5, 5))
    confusion[[1, 3]] = 0
    with pytest.raises(ValueError, match=r"confusion.*\[1, 3\]"):
        codes.similarity_from_confusion(confusion)


@pytest.mark.parametrize(
    "bad",
    [np.ones((3, 4)), -np.ones((3, 3)), np.full((3, 3), np.nan), np.ones(3)],
)
def test_similarity_from_confusion_rejects_bad_matrices(bad):
    with pytest.raises(ValueError, match="confusion"):
        codes.similarity_from_confusion(bad)


# Errors


def test_class_similarity_names_the_classes_without_samples():
    features = np.ones((4, 2))
    with pytest.raises(ValueError, match=r"labels.*\[1, 3\]"):
        codes.class_similarity(features, np.array([0, 2, 0, 2]), num_classes=4)


@pytest.mark.parametrize("labels", [[0, 1, 5, 1], [0, -1, 1, 1]])
def test_class_similarity_rejects_labels_outside_the_range(labels):
    with pytest.raises(ValueError, match="labels"):
        codes.class_similarity(np.ones((4, 2)), np.array(labels), num_classes=3)


def test_class_similarity_rejects_bad_features():
    labels = np.array([0, 1, 1])
    with pytest.raises(ValueError, match="features"):
        codes.class_similarity(np.ones(3), labels)
    with pytest.raises(ValueError, match="features"):
        codes.class_similarity(np.array([[1.0], [np.nan], [2.0]]), labels)
    with pytest.raises(ValueError, match="features"):
        codes.class_similarity(np.array([[1.0], [np.inf], [2.0]]), labels)


def test_class_similarity_rejects_mismatched_lengths_and_bad_labels():
    with pytest.raises(ValueError, match="features.*labels"):
        codes.class_similarity(np.ones((4, 2)), np.array([0, 1, 1]))
    with pytest.raises(ValueError, match="labels"):
        codes.class_similarity(np.ones((2, 2)), np.eye(2))  # one-hot labels
    with pytest.raises(TypeError, match="labels"):
        codes.class_similarity(np.ones((2, 2)), np.array([0.5, 1.0]))


def test_class_similarity_rejects_bad_kernel_gamma_and_neighbours():
    features, labels = np.random.default_rng(0).standard_normal((6, 2)), np.arange(6)
    with pytest.raises(ValueError, match="kernel"):
        codes.class_similarity(features, labels, kernel="laplacian")
    with pytest.raises(ValueError, match="gamma"):
        codes.class_similarity(features, labels, kernel="cosine", gamma=1.0)
    with pytest.raises(ValueError, match="gamma"):
        codes.class_similarity(features, labels, kernel="rbf", gamma=-1.0)
    for bad in (0, 6):
        with pytest.raises(ValueError, match="n_neighbors"):
            codes.class_similarity(features, labels, n_neighbors=bad)


def test_class_similarity_rejects_zero_mean_classes_for_cosine():
    features = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"features.*\[0\]"):
        codes.class_similarity(features, np.array([0, 0, 1]))


# Scale: approximate neighbour search, refusals


def _exact_neighbour_sets(means, k, metric):
    """Float64 brute force by explicit differences / products."""
    if metric == "l2":
        diff = means[:, None, :] - means[None, :, :]
        scores = -np.einsum("abi,abi->ab", diff, diff)
    else:
        scores = means @ means.T
    np.fill_diagonal(scores, -np.inf)
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


@pytest.mark.parametrize("kernel", ["cosine", "rbf", "linear"])
def test_approximate_knn_graph_probing_every_cell_equals_the_exact_graph(kernel):
    pytest.importorskip("faiss")
    # 200 classes: 6 cells, all of them probed, so the search is exhaustive
    # (in float32; continuous random means have no near ties).
    rng = np.random.default_rng(21)
    features, labels = _data(rng, num_samples=900, num_classes=200, dim=5, offset=0.5)
    gamma = 0.3 if kernel == "rbf" else None
    exact = codes.class_similarity(
        features, labels, kernel=kernel, gamma=gamma, n_neighbors=6,
        neighbor_search="exact",
    )
    approximate = codes.class_similarity(
        features, labels, kernel=kernel, gamma=gamma, n_neighbors=6,
        neighbor_search="approximate",
    )
    assert isinstance(approximate, scipy.sparse.csr_matrix)
    np.testing.assert_array_equal(approximate.indptr, exact.indptr)
    np.testing.assert_array_equal(approximate.indices, exact.indices)
    np.testing.assert_allclose(approximate.data, exact.data, rtol=1e-12)


def test_approximate_knn_graph_finds_most_neighbours_with_exact_weights():
    pytest.importorskip("faiss")
    # 2000 clustered classes in 32 dimensions: 62 cells, 8 probed.
    rng = np.random.default_rng(22)
    centres = rng.standard_normal((40, 32))
    means = centres[rng.integers(0, 40, 2000)] + 0.5 * rng.standard_normal((2000, 32))
    graph = codes.class_similarity(
        means, np.arange(2000), kernel="rbf", gamma=0.05, n_neighbors=10,
        neighbor_search="approximate",
    )
    assert abs(graph - graph.T).max() == 0
    assert graph.diagonal().max() == 0
    assert (np.diff(graph.indptr) >= 10).all()
    sample = rng.choice(2000, 300, replace=False)
    diff = means[sample, None, :] - means[None, :, :]
    distances = np.einsum("abi,abi->ab", diff, diff)
    distances[np.arange(300), sample] = np.inf
    truth = np.argsort(distances, axis=1, kind="stable")[:, :10]
    found = [
        np.isin(truth[i], graph.indices[graph.indptr[a] : graph.indptr[a + 1]]).sum()
        for i, a in enumerate(sample)
    ]
    assert np.sum(found) / truth.size >= 0.95
    # Whatever edges are kept carry the exact kernel value.
    coo = graph.tocoo()
    pair = means[coo.row] - means[coo.col]
    np.testing.assert_allclose(
        coo.data, np.exp(-0.05 * np.einsum("ij,ij->i", pair, pair)), rtol=1e-9
    )


@pytest.mark.parametrize("metric", ["l2", "inner_product"])
def test_approximate_search_falls_back_to_exact_rows_when_cells_run_short(metric):
    faiss = pytest.importorskip("faiss")
    # 400 points: 12 cells, 8 probed, about 270 points seen per query, fewer
    # than the 350 neighbours asked for: every row is completed exactly.
    rng = np.random.default_rng(23)
    points = rng.standard_normal((400, 6))
    found = _neighbors.approximate_nearest_neighbors(points, 350, metric, faiss)
    truth = _exact_neighbour_sets(points, 350, metric)
    assert found.shape == (400, 350) and found.dtype == np.int64
    for a in range(400):
        assert set(found[a]) == set(truth[a])


def test_approximate_search_excludes_each_point_but_keeps_its_duplicate():
    faiss = pytest.importorskip("faiss")
    rng = np.random.default_rng(24)
    points = rng.standard_normal((150, 4))
    points[75:] = points[:75]  # class c + 75 duplicates class c
    found = _neighbors.approximate_nearest_neighbors(points, 3, "l2", faiss)
    own = np.arange(150)
    twin = (own + 75) % 150
    assert not (found == own[:, None]).any()
    np.testing.assert_array_equal(found[:, 0], twin)


def test_class_similarity_names_the_extra_when_faiss_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss fails

    def no_work(*args, **kwargs):
        raise AssertionError("the class means were computed before the check")

    monkeypatch.setattr(similarity_module, "_class_means", no_work)
    features = np.zeros((10, 3))
    with pytest.raises(ImportError, match=r"keras-ecoc\[scale\].*neighbor_search='exact'"):
        codes.class_similarity(
            features, np.arange(10), n_neighbors=3, neighbor_search="approximate"
        )
    # "auto" picks the approximate search beyond 50,000 classes.
    n = 50_001
    with pytest.raises(ImportError, match=r"num_classes=50001.*keras-ecoc\[scale\]"):
        codes.class_similarity(np.ones((n, 2)), np.arange(n), n_neighbors=3)


def test_class_similarity_refuses_a_dense_matrix_that_cannot_fit(monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the class means were computed before the check")

    monkeypatch.setattr(similarity_module, "_class_means", no_work)
    # 300,000 classes: the dense similarity needs several times 720 GB.
    n = 300_000
    with pytest.raises(ValueError, match=r"\(300000, 300000\).*GiB.*n_neighbors=10"):
        codes.class_similarity(np.ones((n, 1)), np.arange(n))


def test_class_similarity_dense_refusal_follows_the_available_memory(monkeypatch):
    rng = np.random.default_rng(25)
    features, labels = _data(rng, num_samples=100, num_classes=20)
    # 20 classes need 3 * 8 * 400 = 9,600 bytes with the cosine kernel.
    monkeypatch.setattr(similarity_module, "available_memory", lambda: 9_000)
    with pytest.raises(ValueError, match="n_neighbors"):
        codes.class_similarity(features, labels)
    monkeypatch.setattr(similarity_module, "available_memory", lambda: 10_000)
    assert codes.class_similarity(features, labels).shape == (20, 20)
    monkeypatch.setattr(similarity_module, "available_memory", lambda: None)
    assert codes.class_similarity(features, labels).shape == (20, 20)


def test_available_memory_is_a_positive_byte_count():
    available = similarity_module.available_memory()
    assert available is None or 0 < available < 2**60


def test_class_similarity_rejects_an_unknown_neighbor_search():
    features = np.zeros((4, 2)) + 1.0
    with pytest.raises(ValueError, match="neighbor_search"):
        codes.class_similarity(features, np.arange(4), n_neighbors=2, neighbor_search="ivf")


def test_float32_means_reach_the_approximate_search_without_a_float64_copy(
    monkeypatch,
):
    pytest.importorskip("faiss")
    # 200 classes: every cell probed, so the float32 graph must equal the
    # float64 exact one, with weights to float32 round-off.
    rng = np.random.default_rng(25)
    means = rng.standard_normal((200, 8)).astype(np.float32)
    original = means.copy()
    seen = []
    search = _neighbors.approximate_nearest_neighbors

    def spy(points, *args, **kwargs):
        seen.append(points.dtype)
        return search(points, *args, **kwargs)

    monkeypatch.setattr(_neighbors, "approximate_nearest_neighbors", spy)
    approximate = codes.class_similarity(
        means, np.arange(200), n_neighbors=6, neighbor_search="approximate"
    )
    assert seen == [np.float32]
    exact = codes.class_similarity(
        means.astype(np.float64), np.arange(200), n_neighbors=6,
        neighbor_search="exact",
    )
    np.testing.assert_array_equal(approximate.indices, exact.indices)
    unit = means.astype(np.float64)
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    coo = approximate.tocoo()
    reference = np.einsum("ij,ij->i", unit[coo.row], unit[coo.col])
    assert approximate.dtype == np.float64
    np.testing.assert_allclose(coo.data, reference, rtol=1e-6)
    # The caller's array is not modified.
    np.testing.assert_array_equal(means, original)
