"""Tests of `class_similarity` and `similarity_from_confusion`.

The references loop over classes and pairs in float64, computing means by
boolean masks and distances by explicit differences, rather than by the
sparse indicator products and expanded distances the library uses.
"""

import numpy as np
import pytest
import scipy.sparse

from keras_ecoc import codes
from keras_ecoc.codes import _neighbors


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
