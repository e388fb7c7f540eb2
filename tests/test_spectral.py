"""Tests of `spectral` and `binarize`.

The reference Laplacian is formed with explicit diagonal matrices and its
spectrum computed by `numpy.linalg.eigvalsh` over all eigenvalues; the
library uses broadcasting and a partial LAPACK or iterative solver.
"""

import importlib
import time

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse
import scipy.spatial

from keras_ecoc import codes
from keras_ecoc.codes import similarity as similarity_module

# `keras_ecoc.codes.spectral` is also the name of the function.
spectral_module = importlib.import_module("keras_ecoc.codes.spectral")


def _random_similarity(rng, n):
    weights = rng.random((n, n))
    similarity = (weights + weights.T) / 2
    np.fill_diagonal(similarity, 0)
    return similarity


def _reference_laplacian(similarity):
    similarity = np.asarray(
        similarity.toarray() if scipy.sparse.issparse(similarity) else similarity,
        dtype=np.float64,
    )
    inv_sqrt = np.diag(1 / np.sqrt(similarity.sum(axis=1)))
    return np.eye(len(similarity)) - inv_sqrt @ similarity @ inv_sqrt


def _trivial_vector(similarity):
    degrees = np.asarray(similarity.sum(axis=1)).ravel()
    return np.sqrt(degrees) / np.linalg.norm(np.sqrt(degrees))


def _knn_graph(rng, n, n_neighbors=8):
    means = rng.standard_normal((n, 4))
    return codes.class_similarity(
        means, np.arange(n), kernel="rbf", n_neighbors=n_neighbors
    )


@pytest.mark.parametrize("normalization, scale", [("sqrt_n", 60.0), (None, 1.0)])
def test_spectral_columns_are_orthonormal_laplacian_eigenvectors(normalization, scale):
    rng = np.random.default_rng(0)
    similarity = _random_similarity(rng, 60)
    out, eigenvalues = codes.spectral(
        similarity, 10, normalization=normalization, return_eigenvalues=True
    )
    assert out.dtype == np.float32 and out.shape == (60, 10)
    assert eigenvalues.dtype == np.float64 and eigenvalues.shape == (10,)
    m = out.astype(np.float64)
    np.testing.assert_allclose(m.T @ m, scale * np.eye(10), atol=1e-5 * scale)
    laplacian = _reference_laplacian(similarity)
    np.testing.assert_allclose(
        m.T @ laplacian @ m, scale * np.diag(eigenvalues), atol=1e-5 * scale
    )
    expected = np.linalg.eigvalsh(laplacian)[1:11]
    np.testing.assert_allclose(eigenvalues, expected, rtol=1e-10, atol=1e-12)
    assert (np.diff(eigenvalues) >= 0).all()
    assert ((eigenvalues >= 0) & (eigenvalues <= 2)).all()


def test_spectral_codes_are_orthogonal_to_the_trivial_eigenvector():
    rng = np.random.default_rng(1)
    similarity = _random_similarity(rng, 40)
    out = codes.spectral(similarity, 39)  # all non-trivial eigenvectors
    np.testing.assert_allclose(
        _trivial_vector(similarity) @ out.astype(np.float64), 0, atol=1e-5
    )
    np.testing.assert_allclose(
        out.astype(np.float64).T @ out, 40 * np.eye(39), atol=1e-4
    )


def test_spectral_normalizations_differ_by_sqrt_n_only():
    similarity = _random_similarity(np.random.default_rng(2), 30)
    raw = codes.spectral(similarity, 5, normalization=None)
    scaled = codes.spectral(similarity, 5)
    np.testing.assert_allclose(scaled, raw * np.sqrt(30), rtol=1e-5, atol=1e-6)
    # Unit mean square entries, like +-1 codes.
    assert np.mean(scaled.astype(np.float64) ** 2) == pytest.approx(1.0, rel=1e-5)


def test_spectral_sign_convention_makes_the_largest_entry_positive():
    similarity = _random_similarity(np.random.default_rng(3), 50)
    out = codes.spectral(similarity, 8)
    peaks = out[np.argmax(np.abs(out), axis=0), np.arange(8)]
    assert (peaks > 0).all()
    np.testing.assert_array_equal(out, codes.spectral(similarity, 8))


@pytest.mark.parametrize("solver", ["chebyshev", "arpack"])
def test_sparse_solvers_agree_with_the_dense_solver(solver):
    graph = _knn_graph(np.random.default_rng(4), 400)
    dense, dense_values = codes.spectral(
        graph, 12, solver="dense", return_eigenvalues=True
    )
    # The comparison is meaningful only for distinct eigenvalues.
    assert np.diff(dense_values).min() > 1e-4
    for seed in (0, 1):
        out, values = codes.spectral(
            graph, 12, solver=solver, seed=seed, return_eigenvalues=True
        )
        np.testing.assert_allclose(values, dense_values, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(out, dense, atol=1e-4)


def test_spectral_auto_solver_densifies_small_sparse_graphs():
    graph = _knn_graph(np.random.default_rng(5), 200)
    np.testing.assert_array_equal(
        codes.spectral(graph, 6), codes.spectral(graph.toarray(), 6, solver="dense")
    )


def test_spectral_first_eigenvector_separates_two_blocks():
    # Two groups of classes, similar within (1.0) and barely across (0.01).
    groups = np.array([0] * 6 + [1] * 9)
    rng = np.random.default_rng(6)
    order = rng.permutation(15)
    groups = groups[order]
    similarity = np.where(groups[:, None] == groups[None, :], 1.0, 0.01)
    np.fill_diagonal(similarity, 0)
    out, eigenvalues = codes.spectral(similarity, 3, return_eigenvalues=True)
    first = np.sign(out[:, 0])
    assert len(set(first[groups == 0])) == 1 and len(set(first[groups == 1])) == 1
    assert first[groups == 0][0] != first[groups == 1][0]
    # The Ncut of the split is small; the next eigenvalues split a block.
    assert eigenvalues[0] < 0.1 < eigenvalues[1]


def test_spectral_warns_for_a_disconnected_graph_and_stays_orthogonal():
    block = np.ones((5, 5)) - np.eye(5)
    similarity = scipy.linalg.block_diag(block, block, block)
    with pytest.warns(UserWarning, match="3 connected components"):
        out, eigenvalues = codes.spectral(similarity, 4, return_eigenvalues=True)
    np.testing.assert_allclose(eigenvalues[:2], 0, atol=1e-10)
    np.testing.assert_allclose(_trivial_vector(similarity) @ out, 0, atol=1e-5)


@pytest.mark.parametrize("solver", ["chebyshev", "arpack"])
def test_sparse_solvers_agree_with_the_dense_solver_on_a_disconnected_graph(solver):
    # Three separate clusters of classes: eigenvalue 0 has multiplicity 3,
    # which single-vector Lanczos would not resolve without the explicit
    # deflation of the null space.
    rng = np.random.default_rng(17)
    means = np.concatenate([rng.standard_normal((150, 3)) + 50 * c for c in range(3)])
    graph = codes.class_similarity(means, np.arange(450), kernel="rbf", n_neighbors=6)
    with pytest.warns(UserWarning, match="3 connected components"):
        dense, dense_values = codes.spectral(
            graph, 10, solver="dense", return_eigenvalues=True
        )
    with pytest.warns(UserWarning, match="3 connected components"):
        out, values = codes.spectral(graph, 10, solver=solver, return_eigenvalues=True)
    np.testing.assert_allclose(values, dense_values, atol=1e-10)
    np.testing.assert_array_equal(values[:2], 0)
    assert np.diff(dense_values[2:]).min() > 1e-4
    np.testing.assert_allclose(out, dense, atol=1e-4)
    # The eigenvalue-0 columns are D^1/2 times a per-cluster constant.
    degrees = np.asarray(graph.sum(axis=1)).ravel()
    per_cluster = (out[:, :2] / np.sqrt(degrees)[:, None]).reshape(3, 150, 2)
    np.testing.assert_allclose(
        per_cluster, np.broadcast_to(per_cluster[:, :1], per_cluster.shape), rtol=1e-5
    )


@pytest.mark.parametrize("threshold", ["zero", "median"])
def test_spectral_thresholds_give_the_binarized_codes(threshold):
    similarity = _random_similarity(np.random.default_rng(7), 16)
    raw = codes.spectral(similarity, 10)
    out = codes.spectral(similarity, 10, threshold=threshold)
    assert out.dtype == np.float32
    assert set(np.unique(out)) == {-1.0, 1.0}
    np.testing.assert_array_equal(out, codes.binarize(raw, threshold))


def test_binarize_matches_a_column_loop_reference():
    m = np.random.default_rng(8).standard_normal((11, 5))
    m[3, 2] = 0.0
    zero = codes.binarize(m, "zero")
    median = codes.binarize(m, "median")
    for j in range(5):
        cut = sorted(m[:, j])[5]  # the median of 11 values
        for i in range(11):
            assert zero[i, j] == (1.0 if m[i, j] >= 0 else -1.0)
            assert median[i, j] == (1.0 if m[i, j] >= cut else -1.0)
    # A median cut balances each column (6 of 11 at or above).
    np.testing.assert_array_equal((median > 0).sum(axis=0), 6)


def test_binarize_rejects_bad_arguments():
    with pytest.raises(ValueError, match="threshold"):
        codes.binarize(np.ones((2, 2)), "mean")
    with pytest.raises(ValueError, match="threshold"):
        codes.binarize(np.ones((2, 2)), None)
    with pytest.raises(ValueError, match="codes"):
        codes.binarize(np.ones(3), "zero")


def test_spectral_warns_when_binary_codes_collide():
    similarity = _random_similarity(np.random.default_rng(9), 40)
    with pytest.warns(UserWarning, match="identical codewords"):
        codes.spectral(similarity, 1, threshold="zero")


# Errors


@pytest.mark.parametrize("bad", [0, 20, -1])
def test_spectral_rejects_code_length_out_of_range(bad):
    similarity = _random_similarity(np.random.default_rng(10), 20)
    with pytest.raises(ValueError, match=r"code_length.*\[1, 19\]"):
        codes.spectral(similarity, bad)


def test_spectral_rejects_a_non_integer_code_length():
    with pytest.raises(TypeError, match="code_length"):
        codes.spectral(_random_similarity(np.random.default_rng(0), 5), 2.0)


@pytest.mark.parametrize("sparse", [False, True])
def test_spectral_rejects_non_square_asymmetric_and_negative_matrices(sparse):
    def convert(m):
        return scipy.sparse.csr_matrix(m) if sparse else m

    similarity = _random_similarity(np.random.default_rng(11), 6)
    with pytest.raises(ValueError, match="similarity.*square"):
        codes.spectral(convert(similarity[:, :5]), 2)
    asymmetric = similarity.copy()
    asymmetric[0, 1] += 0.1
    with pytest.raises(ValueError, match="similarity.*symmetric"):
        codes.spectral(convert(asymmetric), 2)
    negative = similarity.copy()
    negative[0, 1] = negative[1, 0] = -0.5
    with pytest.raises(ValueError, match=r"similarity.*negative.*\(0, 1\)"):
        codes.spectral(convert(negative), 2)


def test_spectral_tolerates_float32_round_off_asymmetry():
    similarity = _random_similarity(np.random.default_rng(12), 8)
    noisy = similarity * (1 + 1e-8 * np.random.default_rng(0).random((8, 8)))
    np.testing.assert_allclose(
        codes.spectral(noisy, 3), codes.spectral(similarity, 3), atol=1e-5
    )


def test_spectral_rejects_non_finite_entries():
    similarity = _random_similarity(np.random.default_rng(13), 5)
    similarity[2, 3] = similarity[3, 2] = np.nan
    with pytest.raises(ValueError, match="similarity.*finite"):
        codes.spectral(similarity, 2)
    similarity[2, 3] = similarity[3, 2] = np.inf
    with pytest.raises(ValueError, match="similarity.*finite"):
        codes.spectral(similarity, 2)


def test_spectral_names_isolated_classes():
    similarity = _random_similarity(np.random.default_rng(14), 7)
    similarity[[2, 5], :] = 0
    similarity[:, [2, 5]] = 0
    with pytest.raises(ValueError, match=r"similarity.*\[2, 5\].*zero degree"):
        codes.spectral(similarity, 2)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"threshold": "sign"}, "threshold"),
        ({"normalization": "l2"}, "normalization"),
        ({"solver": "lobpcg"}, "solver"),
    ],
)
def test_spectral_rejects_unknown_options(kwargs, name):
    similarity = _random_similarity(np.random.default_rng(15), 5)
    with pytest.raises(ValueError, match=name):
        codes.spectral(similarity, 2, **kwargs)


def test_spectral_rejects_a_single_class():
    with pytest.raises(ValueError, match="similarity"):
        codes.spectral(np.ones((1, 1)), 1)


@pytest.mark.slow
def test_spectral_100k_classes_on_a_10_neighbour_graph():
    # An exact 10-nearest-neighbour graph of 100,000 random class means,
    # RBF weights, union-symmetrized. The means are 5-dimensional so that a
    # KD-tree builds the graph in seconds; the spectrum is harder than for
    # high-dimensional means (more eigenvalues crowd the bottom).
    n, k = 100_000, 128
    rng = np.random.default_rng(16)
    means = rng.standard_normal((n, 5))
    distances, neighbors = scipy.spatial.cKDTree(means).query(means, 11)
    distances, neighbors = distances[:, 1:], neighbors[:, 1:]
    weights = np.exp(-(distances**2) / np.median(distances**2))
    graph = scipy.sparse.csr_matrix(
        (weights.ravel(), (np.repeat(np.arange(n), 10), neighbors.ravel())),
        shape=(n, n),
    )
    graph = graph.maximum(graph.T).tocsr()

    start = time.perf_counter()
    out, eigenvalues = codes.spectral(graph, k, return_eigenvalues=True)
    elapsed = time.perf_counter() - start
    print(f"spectral(100,000 classes, k={k}): {elapsed:.1f} s")

    assert out.shape == (n, k) and out.dtype == np.float32
    m = out.astype(np.float64)
    np.testing.assert_allclose(m.T @ m / n, np.eye(k), atol=1e-5)
    assert (np.diff(eigenvalues) >= 0).all()
    assert 0 <= eigenvalues[0] and eigenvalues[-1] < 1
    # Columns are eigenvectors: L M = M diag(eigenvalues), up to float32.
    inv_sqrt = scipy.sparse.diags(1 / np.sqrt(np.asarray(graph.sum(axis=1)).ravel()))
    laplacian_m = m - inv_sqrt @ (graph @ (inv_sqrt @ m))
    residuals = np.linalg.norm(laplacian_m - m * eigenvalues, axis=0) / np.sqrt(n)
    assert residuals.max() < 1e-5
    np.testing.assert_allclose(_trivial_vector(graph) @ m / np.sqrt(n), 0, atol=1e-5)


# Scale: sparse kNN graphs from the approximate search, refusals


def _subspace_distance(a, b):
    """Spectral norm of the difference of the orthogonal projectors."""
    qa, _ = np.linalg.qr(np.asarray(a, np.float64))
    qb, _ = np.linalg.qr(np.asarray(b, np.float64))
    return np.linalg.norm(qa @ qa.T - qb @ qb.T, 2)


def test_iterative_codes_of_an_approximate_knn_graph_span_the_dense_eigenspace():
    pytest.importorskip("faiss")
    # 800 classes (25 cells, 8 probed): the Chebyshev solver on the sparse
    # graph against the dense solver on the same graph. Eigenvectors have
    # sign and rotation freedom, so subspaces and Laplacian quadratic forms
    # are compared, not columns.
    n, k = 800, 10
    rng = np.random.default_rng(31)
    latent = rng.standard_normal((n, 3))
    means = latent @ rng.standard_normal((3, 24)) + 0.3 * rng.standard_normal((n, 24))
    graph = codes.class_similarity(
        means, np.arange(n), kernel="rbf", n_neighbors=8, neighbor_search="approximate"
    )
    sparse, sparse_values = codes.spectral(
        graph, k, solver="chebyshev", return_eigenvalues=True
    )
    dense, dense_values = codes.spectral(
        graph, k + 1, solver="dense", return_eigenvalues=True
    )
    # The k-dimensional eigenspace is well defined: a gap follows it.
    assert dense_values[k] - dense_values[k - 1] > 1e-4
    np.testing.assert_allclose(sparse_values, dense_values[:k], rtol=1e-8, atol=1e-12)
    assert _subspace_distance(sparse, dense[:, :k]) < 1e-4
    laplacian = _reference_laplacian(graph)
    m = sparse.astype(np.float64)
    quadratic = np.einsum("ij,ij->j", m, laplacian @ m) / n
    np.testing.assert_allclose(quadratic, dense_values[:k], rtol=1e-5, atol=1e-7)


def test_spectral_refuses_a_dense_solve_that_cannot_fit(monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("the similarity was checked before the refusal")

    monkeypatch.setattr(spectral_module, "_as_similarity", no_work)
    # A ring of 300,000 classes: the dense solver needs 32 * n^2 = 2.9 TB.
    n = 300_000
    ring = scipy.sparse.diags([np.ones(n - 1), np.ones(n - 1)], [-1, 1], format="csr")
    with pytest.raises(ValueError, match=r"solver='dense'.*num_classes=300000.*GiB.*n_neighbors=10"):
        codes.spectral(ring, 4, solver="dense")


def test_spectral_dense_refusal_follows_the_available_memory(monkeypatch):
    similarity = _random_similarity(np.random.default_rng(32), 30)
    # 30 classes need 4 * 8 * 900 = 28,800 bytes in the dense solver.
    monkeypatch.setattr(similarity_module, "available_memory", lambda: 28_000)
    with pytest.raises(ValueError, match="solver='auto'"):
        codes.spectral(similarity, 3)
    with pytest.raises(ValueError, match="solver='dense'"):
        codes.spectral(scipy.sparse.csr_matrix(similarity), 3, solver="dense")
    monkeypatch.setattr(similarity_module, "available_memory", lambda: 29_000)
    expected = codes.spectral(similarity, 3)
    monkeypatch.setattr(similarity_module, "available_memory", lambda: None)
    np.testing.assert_array_equal(codes.spectral(similarity, 3), expected)


@pytest.mark.slow
def test_spectral_codes_of_20k_classes_from_256_features():
    pytest.importorskip("faiss")
    # The whole scale path at moderate size: approximate 10-neighbour cosine
    # graph of 20,000 class means (256 features near a 16-dimensional
    # subspace), then 32 Chebyshev-filtered Lanczos eigenvectors.
    n, k = 20_000, 32
    rng = np.random.default_rng(33)
    latent = rng.standard_normal((n, 16))
    means = latent @ rng.standard_normal((16, 256)) + 2.0 * rng.standard_normal((n, 256))
    start = time.perf_counter()
    graph = codes.class_similarity(
        means, np.arange(n), n_neighbors=10, neighbor_search="approximate"
    )
    middle = time.perf_counter()
    out, eigenvalues = codes.spectral(graph, k, return_eigenvalues=True)
    end = time.perf_counter()
    print(
        f"20,000 classes: similarity {middle - start:.1f} s, "
        f"spectral(k={k}) {end - middle:.1f} s"
    )
    assert out.shape == (n, k) and out.dtype == np.float32
    m = out.astype(np.float64)
    np.testing.assert_allclose(m.T @ m / n, np.eye(k), atol=1e-5)
    inv_sqrt = scipy.sparse.diags(1 / np.sqrt(np.asarray(graph.sum(axis=1)).ravel()))
    laplacian_m = m - inv_sqrt @ (graph @ (inv_sqrt @ m))
    residuals = np.linalg.norm(laplacian_m - m * eigenvalues, axis=0) / np.sqrt(n)
    assert residuals.max() < 1e-5
    np.testing.assert_allclose(_trivial_vector(graph) @ m / np.sqrt(n), 0, atol=1e-5)


# Threaded sparse products (codes/_eigen.py RowBlockProduct)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_row_block_product_equals_the_float64_product(threads, monkeypatch):
    from keras_ecoc.codes import _eigen

    monkeypatch.setattr(_eigen, "_PARALLEL_MIN_NNZ", 0)
    rng = np.random.default_rng(31)
    # Uneven rows (some empty) so that the blocks split by stored entries.
    matrix = scipy.sparse.random(
        500, 500, density=0.02, random_state=31, format="csr"
    )
    matrix = scipy.sparse.vstack(
        [matrix[:200], scipy.sparse.csr_matrix((50, 500)), matrix[200:450]]
    ).tocsr()
    x = rng.standard_normal((500, 5))
    with _eigen.RowBlockProduct(matrix, threads=threads) as product:
        assert len(product.bounds) == threads
        out = product @ x
        vector_out = product @ x[:, 0]
    reference = matrix.toarray() @ x
    np.testing.assert_allclose(out, reference, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(vector_out, reference[:, 0], rtol=1e-12, atol=1e-12)


def test_chebyshev_solver_on_threaded_products_matches_the_dense_reference(
    monkeypatch,
):
    from keras_ecoc.codes import _eigen

    # Force the row-block threads on a small graph.
    monkeypatch.setattr(_eigen, "_PARALLEL_MIN_NNZ", 0)
    graph = _knn_graph(np.random.default_rng(32), 600)
    out, values = codes.spectral(
        graph, 16, solver="chebyshev", normalization=None, return_eigenvalues=True
    )
    laplacian = _reference_laplacian(graph)
    reference_values, reference_vectors = scipy.linalg.eigh(laplacian)
    np.testing.assert_allclose(values, reference_values[1:17], rtol=1e-9, atol=1e-12)
    # Largest principal angle between the code space and the reference
    # eigenspace (the values are distinct, see the assertion).
    assert np.diff(reference_values[:18]).min() > 1e-4
    angles = scipy.linalg.subspace_angles(
        out.astype(np.float64), reference_vectors[:, 1:17]
    )
    assert angles.max() < 1e-5


def test_row_block_product_blocks_share_the_matrix_arrays(monkeypatch):
    from keras_ecoc.codes import _eigen

    # Row slices of a CSR matrix are copies; the blocks must be views, so
    # that a product over a million-class graph holds no second graph.
    monkeypatch.setattr(_eigen, "_PARALLEL_MIN_NNZ", 0)
    matrix = scipy.sparse.random(400, 400, density=0.03, random_state=33, format="csr")
    x = np.random.default_rng(33).standard_normal((400, 3))
    with _eigen.RowBlockProduct(matrix, threads=3) as product:
        assert len(product.blocks) == 3
        for block in product.blocks:
            assert np.shares_memory(block.data, matrix.data)
            assert np.shares_memory(block.indices, matrix.indices)
        out = product @ x
    np.testing.assert_allclose(out, matrix.toarray() @ x, rtol=1e-12, atol=1e-12)


def test_in_place_normalization_equals_the_diagonal_product():
    spectral_module = importlib.import_module("keras_ecoc.codes.spectral")
    rng = np.random.default_rng(34)
    graph = _knn_graph(rng, 300)
    scale = 1.0 / np.sqrt(np.asarray(graph.sum(axis=1)).ravel())
    # The product's order of multiplication, (s_ij d_i) d_j, in float64.
    reference = (scipy.sparse.diags(scale) @ graph @ scipy.sparse.diags(scale)).toarray()
    scaled = graph.copy()
    spectral_module._scale_rows_and_columns(scaled, scale, rows=37)
    np.testing.assert_array_equal(scaled.toarray(), reference)
