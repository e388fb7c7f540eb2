"""Eigensolvers for the bottom of a normalized graph Laplacian.

All solvers compute the `k` smallest eigenpairs of `L = I - A`, where
`A = D^-1/2 S D^-1/2`, restricted to the orthogonal complement of the null
space of `L`. The null space is known in closed form: one vector
`D^1/2 1_C / |D^1/2 1_C|` per connected component `C`, given to the solvers
as `null`, a sparse `(n, c)` matrix with orthonormal columns (disjoint
supports). Deflating it explicitly, instead of computing `k + c` pairs and
dropping the first `c`, avoids asking Lanczos for an eigenvalue of
multiplicity `c`, which single-vector Krylov methods can miss.

The spectrum of `L` lies in `[0, 2]`.
"""

import os
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.csgraph
import scipy.sparse.linalg

# The Chebyshev filter's value at the k-th eigenvalue, relative to its bound
# 1 on the damped interval (see `_filter_degree`).
_FILTER_GAIN = 8.0

# Lanczos steps of the spectrum estimate that places the filter.
_ESTIMATE_STEPS = 100

# Float64 entries the filtered Lanczos basis may hold (1.5 GiB). At a
# million classes and code_length 64 this allows about 200 vectors; the
# former 512 MiB allowed 96, below the basis of about 2 k that the filtered
# run needs, so it fell back to ARPACK on the filter.
_BASIS_ENTRIES = 3 << 26

# Below this many stored entries a sparse product is not split over threads:
# the thread hand-off would cost more than it saves.
_PARALLEL_MIN_NNZ = 1 << 18


def cpu_threads():
    """Number of CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class RowBlockProduct:
    """`X -> A @ X` for a CSR matrix, with row blocks on a thread pool.

    SciPy's sparse-dense product runs on one thread but releases the GIL
    inside its C++ loop, so products of row blocks of `A` on Python threads
    run in parallel. The blocks hold about equal numbers of stored entries.
    Use as a context manager, which shuts the pool down.

    Args:
        matrix: float64 `scipy.sparse.csr_matrix` `(n, n)`.
        threads: Number of row blocks and threads; defaults to the cores
            this process may use.
        pool: A `ThreadPoolExecutor` to share (with another product of the
            same shape); a new pool, closed by `close`, by default.
    """

    def __init__(self, matrix, threads=None, pool=None):
        self.matrix = matrix
        self.shape = matrix.shape
        threads = cpu_threads() if threads is None else threads
        if threads < 2 or matrix.nnz < _PARALLEL_MIN_NNZ:
            self.bounds = [(0, matrix.shape[0])]
        else:
            cuts = np.searchsorted(
                matrix.indptr, np.linspace(0, matrix.nnz, threads + 1)[1:-1]
            )
            edges = np.concatenate([[0], cuts, [matrix.shape[0]]])
            self.bounds = [
                (int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a
            ]
        # Views of the matrix's arrays, not copies (slicing a CSR matrix
        # copies its rows: one more matrix alive for the whole solve).
        self.blocks = [_row_block(matrix, a, b) for a, b in self.bounds]
        self.owned = pool is None and len(self.blocks) > 1
        if len(self.blocks) < 2:
            pool = None
        elif pool is None:
            pool = ThreadPoolExecutor(len(self.blocks))
        self.pool = pool

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.pool is not None and self.owned:
            self.pool.shutdown()
        self.pool = None

    def __matmul__(self, x):
        if self.pool is None:
            return self.matrix @ x
        dtype = np.result_type(self.matrix.dtype, x.dtype)
        out = np.empty((self.shape[0],) + x.shape[1:], dtype=dtype)

        def run(index):
            start, stop = self.bounds[index]
            out[start:stop] = self.blocks[index] @ x

        list(self.pool.map(run, range(len(self.blocks))))
        return out


def _row_block(matrix, start, stop):
    """Rows `start:stop` of a CSR matrix sharing its data and indices."""
    if start == 0 and stop == matrix.shape[0]:
        return matrix
    lo, hi = matrix.indptr[start], matrix.indptr[stop]
    # The (data, indices, indptr) constructor copies its arrays even with
    # copy=False (SciPy 1.17), so the views are set on an empty matrix.
    block = scipy.sparse.csr_matrix(
        (stop - start, matrix.shape[1]), dtype=matrix.dtype
    )
    block.data = matrix.data[lo:hi]
    block.indices = matrix.indices[lo:hi]
    block.indptr = matrix.indptr[start : stop + 1] - lo
    block.has_sorted_indices = matrix.has_sorted_indices
    return block


def project_out(null, x, overwrite=False):
    """Returns `x - null null^T x`: a new array, or `x` itself updated in
    place with `overwrite=True` (one (n, b) temporary fewer).

    Args:
        null: `(n, c)` matrix, sparse or dense, with orthonormal columns.
        x: float64 `(n,)` or `(n, b)`.
        overwrite: Whether `x` may be overwritten.
    """
    if overwrite:
        x -= null @ (null.T @ x)
        return x
    return x - null @ (null.T @ x)


def _residual_norms(l_vectors, rotation, vectors, values, rows=1 << 16):
    """Column norms of `l_vectors @ rotation - vectors * values`, `(k,)`.

    Row blocks: the (n, k) difference and its two products would each be
    another (n, k) float64 matrix (512 MiB at a million classes, k = 64).
    """
    squares = np.zeros(vectors.shape[1])
    for start in range(0, vectors.shape[0], rows):
        block = l_vectors[start : start + rows] @ rotation
        block -= vectors[start : start + rows] * values
        squares += np.einsum("ij,ij->j", block, block)
    return np.sqrt(squares)


def with_locality_order(solve, adjacency, null, k, rng):
    """Runs an iterative solver on the graph in reverse Cuthill-McKee order.

    Sparse products are bound by the scattered reads of the vector; the
    bandwidth-reducing order keeps neighbours close in memory (about 15% to
    40% faster products on kNN class graphs), at the cost of one
    permutation.

    Args:
        solve: `(adjacency, null, k, rng) -> (eigenvalues, vectors)`.
        adjacency: `A`, a float64 sparse matrix or `np.ndarray` `(n, n)`.
        null: `(n, c)` null space basis.
        k: Number of pairs.
        rng: `numpy.random.Generator`.

    Returns:
        `solve`'s result, with the vectors back in the original order.
    """
    if not scipy.sparse.issparse(adjacency):
        return solve(adjacency, null, k, rng)
    order = scipy.sparse.csgraph.reverse_cuthill_mckee(
        adjacency.tocsr(), symmetric_mode=True
    )
    permuted = adjacency.tocsr()[order][:, order].tocsr()
    values, vectors = solve(permuted, null[order], k, rng)
    restored = np.empty_like(vectors)
    restored[order] = vectors
    return values, restored


def dense_eigenpairs(adjacency, null, k):
    """Smallest `k` eigenpairs of `L` off its null space, with LAPACK.

    Args:
        adjacency: `A`, a float64 `np.ndarray` or sparse matrix `(n, n)`.
        null: `(n, c)` null space basis.
        k: Number of pairs, `1 <= k <= n - c`.

    Returns:
        `(eigenvalues (k,), vectors (n, k))`, eigenvalues ascending.
    """
    if scipy.sparse.issparse(adjacency):
        adjacency = adjacency.toarray()
    null = null.toarray() if scipy.sparse.issparse(null) else null
    n = adjacency.shape[0]
    # Moving the null space from eigenvalue 0 to 3 (above the spectrum,
    # which ends at 2) leaves exactly the wanted eigenpairs at the bottom.
    laplacian = np.eye(n) - adjacency + 3.0 * (null @ null.T)
    return scipy.linalg.eigh(laplacian, subset_by_index=[0, k - 1])


def arpack_eigenpairs(adjacency, null, k, rng, tol=1e-10):
    """Smallest `k` eigenpairs of `L` off its null space, with ARPACK.

    The smallest eigenvalues of `L` are the largest of `I + A`, and ARPACK
    converges far faster for the largest algebraic eigenvalues than in
    smallest-magnitude mode (which would need a factorization). The null
    space, eigenvalue 2 of `I + A`, is mapped to 0 so it is never returned.

    Args:
        adjacency: `A`, a float64 sparse matrix or `np.ndarray` `(n, n)`.
        null: `(n, c)` null space basis.
        k: Number of pairs, `1 <= k < n - c`.
        rng: `numpy.random.Generator` for the start vector.
        tol: ARPACK relative tolerance on the Ritz values.

    Returns:
        `(eigenvalues (k,), vectors (n, k))`, eigenvalues ascending.
    """
    n = adjacency.shape[0]

    def matvec(x):
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        return x + adjacency @ x - 2.0 * (null @ (null.T @ x))

    operator = scipy.sparse.linalg.LinearOperator(
        (n, n), matvec=matvec, dtype=np.float64
    )
    values, vectors = scipy.sparse.linalg.eigsh(
        operator,
        k=k,
        which="LA",
        v0=project_out(null, rng.standard_normal(n)),
        tol=tol,
        ncv=min(n, max(2 * k + 1, 20)),
    )
    order = np.argsort(2.0 - values, kind="stable")
    return 2.0 - values[order], vectors[:, order]


def chebyshev_eigenpairs(adjacency, null, k, rng, tol=1e-8, block=4):
    """Smallest `k` eigenpairs of `L` off its null space: filtered Lanczos.

    On kNN class graphs the bottom eigenvalues are tightly packed (100,000
    classes: 128 eigenvalues within 0.1 to 0.2 of each other, out of a
    spectrum up to 2 wide). Plain Lanczos (`arpack_eigenpairs`) then needs a
    long basis and many restarts, and its cost is dominated by
    re-orthogonalizing that basis one vector at a time, not by the sparse
    products.

    Here block Lanczos runs on `p(L)`, where `p` is a Chebyshev polynomial
    (of degree `m`, typically 5 to 20) that is at most 1 in magnitude on
    `[cut, upper]` and grows monotonically below `cut`. The wanted
    eigenvalues then stand apart from a bulk squeezed into `[-1, 1]`, so
    the basis needs only about `2 k` vectors (k = 128 on 100,000 classes:
    about 270 vectors and 4,500 sparse products, against some 1,200 Lanczos
    steps re-orthogonalized one by one in a restarted basis of 300 for
    ARPACK), and the work is sparse products with blocks of `block`
    vectors and BLAS-3 re-orthogonalization.

    `upper` bounds the spectrum and `cut` estimates the eigenvalue of index
    `k + buffer`, both from a short Lanczos run on `L` (Gauss
    quadrature weights count the eigenvalues below each Ritz value). Since
    `p` is monotone below `cut`, the largest eigenvalues of `p(L)` are the
    smallest of `L` provided they all lie below `cut`; this is verified
    and `cut` raised if needed. A final Rayleigh-Ritz step with `L` itself
    gives the eigenvalues and makes the vectors exactly `L`-orthogonal.
    Should the basis outgrow its memory budget, the filtered operator is
    handed to ARPACK instead, which restarts in a fixed basis.

    Args:
        adjacency: `A`, a float64 sparse matrix or `np.ndarray` `(n, n)`.
        null: `(n, c)` null space basis.
        k: Number of pairs, `1 <= k <= n - c - 16`.
        rng: `numpy.random.Generator` for the start vectors.
        tol: Residual norm `|L v - theta v|` of the unit vectors above which
            a warning is issued.
        block: Block size of the Lanczos runs.

    Returns:
        `(eigenvalues (k,), vectors (n, k))`, eigenvalues ascending.
    """
    if scipy.sparse.issparse(adjacency):
        with RowBlockProduct(adjacency.tocsr()) as product:
            return _chebyshev_eigenpairs(product, null, k, rng, tol, block)
    return _chebyshev_eigenpairs(adjacency, null, k, rng, tol, block)


def _chebyshev_eigenpairs(adjacency, null, k, rng, tol, block):
    """`chebyshev_eigenpairs` on `adjacency`, a dense array or a
    `RowBlockProduct`."""
    n = adjacency.shape[0]
    dim = n - null.shape[1]  # dimension of the space searched
    block = max(1, min(block, (dim - k) // 4))
    buffer = max(16, k // 4)

    def apply_laplacian(x):
        image = adjacency @ x  # a new array
        np.subtract(x, image, out=image)
        return image

    # A single-vector run: for the same basis size it reaches a higher
    # polynomial degree than a block run, which resolves the crowded bottom
    # of the spectrum far better.
    estimate = _block_lanczos(
        apply_laplacian, null, rng, 1, max_dim=min(dim - 1, _ESTIMATE_STEPS)
    )
    upper, cut, kth = _spectrum_bounds(estimate, dim, k, k + buffer, 1)
    # The basis may hold about 1.5 GiB, and at least k + 8 blocks.
    max_dim = min(
        dim - block,
        max(k + 8 * block, min(4 * k + 8 * block, _BASIS_ENTRIES // n)),
    )
    for _ in range(3):
        degree = _filter_degree(kth, cut, upper)
        apply_filter = _chebyshev_filter(adjacency, null, degree, cut, upper)
        run = _block_lanczos(
            apply_filter, null, rng, block, max_dim, wanted=k, tol=1e-10
        )
        if run["converged"]:
            vectors = run["basis"] @ run["ritz_vectors"][:, -k:]
        else:
            vectors = _arpack_top(apply_filter, null, k, buffer, rng)
        # The basis (up to 1.5 GiB at a million classes) is not needed for
        # the Rayleigh-Ritz step, whose (n, k) temporaries would otherwise
        # sit on top of it at the solver's memory peak.
        del run
        # Rayleigh-Ritz with L: the values of L, exactly L-orthogonal vectors.
        vectors = _orthonormalize(project_out(null, vectors, overwrite=True))
        l_vectors = apply_laplacian(vectors)
        projected = vectors.T @ l_vectors
        values, rotation = np.linalg.eigh((projected + projected.T) / 2.0)
        if values[-1] < cut:
            vectors = vectors @ rotation
            residuals = _residual_norms(l_vectors, rotation, vectors, values)
            del l_vectors
            if residuals.max() > tol:
                warnings.warn(
                    f"The Chebyshev-filtered Lanczos solver reached a "
                    f"largest residual of {residuals.max():.2e} (tol={tol}); "
                    f"the codes are approximate. Compare with "
                    f"solver='arpack'.",
                    RuntimeWarning,
                    stacklevel=4,
                )
            return values, vectors
        # Fewer than k eigenvalues lie below the cut, so the filter damped
        # some wanted ones. The k-th Ritz value bounds the k-th eigenvalue
        # from above: move the cut past it.
        kth = values[-1]
        cut = min(kth + 0.25 * (kth - values[0]), kth + 0.5 * (upper - kth))
    warnings.warn(
        "The Chebyshev-filtered Lanczos solver could not place its filter; "
        "falling back to plain Lanczos (slower).",
        RuntimeWarning,
        stacklevel=4,
    )
    if isinstance(adjacency, RowBlockProduct):
        adjacency = adjacency.matrix
    return arpack_eigenpairs(adjacency, null, k, rng)


def _block_lanczos(apply, null, rng, block, max_dim, wanted=0, tol=0.0):
    """Block Lanczos with full re-orthogonalization off a null space.

    Builds an orthonormal basis `V` of the block Krylov space of `apply`
    from a random start block, and the projection `T = V^T apply(V)`. Runs
    until the `wanted` largest Ritz pairs have residuals at most
    `tol * |theta|`, or until the basis has `max_dim` columns.

    Args:
        apply: Symmetric operator on `(n, b)` arrays that maps the
            complement of `null` to itself.
        null: `(n, c)` basis kept out of the Krylov basis.
        rng: `numpy.random.Generator` for the start block.
        block: Block size `b`.
        max_dim: Largest basis size.
        wanted: Number of largest Ritz pairs to converge (0: run to
            `max_dim`).
        tol: Relative residual tolerance for `wanted`.

    Returns:
        A dict with `"ritz_values"` (J,) ascending, `"ritz_vectors"`
        (J, J) in the basis, `"residuals"` (J,) Ritz residual norms,
        `"basis"` (n, J) and `"converged"` (bool).
    """
    n = null.shape[0]
    basis = np.empty((n, max_dim + block), order="F")
    projected = np.zeros((max_dim + block, max_dim + block))
    start = project_out(null, rng.standard_normal((n, block)))
    basis[:, :block], _ = np.linalg.qr(start)
    size = 0
    while True:
        image = apply(basis[:, size : size + block])
        known = basis[:, : size + block]
        # Classical Gram-Schmidt twice is enough for orthogonality to
        # round-off; the coefficients are the projected matrix's entries.
        coefficients = known.T @ image
        image -= known @ coefficients
        correction = known.T @ image
        image -= known @ correction
        projected[: size + block, size : size + block] = coefficients + correction
        image = project_out(null, image, overwrite=True)
        following, coupling = _next_block(image, known, null, rng)
        size += block
        projected[size : size + block, size - block : size] = coupling
        basis[:, size : size + block] = following
        # Convergence is checked every other block: each check is an
        # O(size^3) eigendecomposition.
        ready = wanted and size >= wanted + block and (size // block) % 2 == 0
        if size + block > max_dim or ready:
            matrix = projected[:size, :size]
            values, vectors = np.linalg.eigh((matrix + matrix.T) / 2.0)
            residuals = np.linalg.norm(
                coupling @ vectors[size - block :], axis=0
            )
            converged = bool(wanted) and bool(
                np.all(residuals[-wanted:] <= tol * np.abs(values[-wanted:]))
            )
            if converged or size + block > max_dim:
                return {
                    "ritz_values": values,
                    "ritz_vectors": vectors,
                    "residuals": residuals,
                    "basis": basis[:, :size],
                    "converged": converged,
                }


def _next_block(image, known, null, rng):
    """QR of the re-orthogonalized image, replacing lost directions.

    Columns of the image that vanished (the Krylov space became invariant
    along them) are replaced by fresh random directions orthogonal to the
    basis, with zero coupling, so the iteration continues.

    Returns:
        `(next_block (n, b), coupling (b, b))`.
    """
    following, coupling = np.linalg.qr(image)
    scale = max(np.abs(coupling).max(), 1e-300)
    lost = np.abs(np.diag(coupling)) <= 1e-12 * scale
    if lost.any():
        fresh = rng.standard_normal((image.shape[0], int(lost.sum())))
        kept = np.hstack([known, following[:, ~lost]])
        for _ in range(2):
            fresh -= kept @ (kept.T @ fresh)
            fresh = project_out(null, fresh)
        following[:, lost], _ = np.linalg.qr(fresh)
        coupling[lost, :] = 0.0
    return following, coupling


def _arpack_top(apply, null, k, buffer, rng):
    """Largest `k` eigenvectors of a block operator with ARPACK."""
    n = null.shape[0]
    operator = scipy.sparse.linalg.LinearOperator(
        (n, n),
        matvec=lambda x: apply(np.asarray(x, np.float64).reshape(-1, 1))[:, 0],
        dtype=np.float64,
    )
    _, vectors = scipy.sparse.linalg.eigsh(
        operator,
        k=k,
        which="LA",
        v0=project_out(null, rng.standard_normal(n)),
        ncv=min(n - 1, k + 2 * buffer + 8),
        tol=1e-10,
    )
    return vectors


def _orthonormalize(vectors):
    """Orthonormalizes nearly orthonormal columns (Cholesky QR).

    Ritz vectors are orthonormal to round-off, so the Gram matrix is well
    conditioned and Cholesky QR is stable; it is several times faster than
    Householder QR on tall matrices.
    """
    gram = vectors.T @ vectors
    factor = np.linalg.cholesky((gram + gram.T) / 2.0)
    # V L^-T as one matrix product: a triangular solve with the n columns of
    # V^T as right-hand sides copied V twice and ran several times slower.
    inverse = scipy.linalg.solve_triangular(
        factor, np.eye(len(factor)), lower=True, check_finite=False
    )
    return vectors @ inverse.T


def _filter_degree(kth, cut, upper):
    """Degree making the filter worth about `_FILTER_GAIN` at the k-th
    eigenvalue.

    Block Lanczos on `p(L)` needs few vectors beyond `k` once the wanted
    values of `p` exceed the bulk bound 1 by a fair margin; a larger degree
    buys little and multiplies the cost of every block.
    """
    t = abs((2.0 * kth - cut - upper) / (upper - cut))
    if t <= 1.0 + 1e-6:
        return 40
    return int(np.clip(np.ceil(np.arccosh(_FILTER_GAIN) / np.arccosh(t)), 2, 40))


def _chebyshev_filter(adjacency, null, degree, cut, upper):
    """Returns `X -> p(L) X` off the null space, for `(n, b)` blocks.

    `p = (-1)^m T_m((2 L - cut - upper) / (upper - cut))`: at most 1 in
    magnitude on `[cut, upper]`, above 1 and decreasing on `[0, cut)`.
    """
    n = adjacency.shape[0]
    center = (upper + cut) / 2.0
    half_width = (upper - cut) / 2.0
    # Z = (L - center) / half_width = ((1 - center) I - A) / half_width,
    # formed once so that each step is a single sparse product.
    threaded = isinstance(adjacency, RowBlockProduct)
    if threaded:
        pool = adjacency.pool
        adjacency = adjacency.matrix
    if scipy.sparse.issparse(adjacency):
        identity = scipy.sparse.identity(n, format="csr")
    else:
        identity = np.eye(n)
    shifted = (identity * (1.0 - center) - adjacency) / half_width
    if scipy.sparse.issparse(shifted):
        shifted = shifted.tocsr()
    if threaded:
        shifted = RowBlockProduct(shifted, pool=pool)
    sign = -1.0 if degree % 2 else 1.0

    def apply(x):
        previous = np.ascontiguousarray(x)
        current = shifted @ previous
        for _ in range(degree - 1):
            following = shifted @ current
            following *= 2.0
            following -= previous
            previous, current = current, following
        current *= sign
        # The filter is largest at eigenvalue 0, so it amplifies round-off
        # along the null space: project it out again.
        return project_out(null, current, overwrite=True)

    return apply


def _spectrum_bounds(estimate, dim, k, count, block):
    """Filter parameters from a block Lanczos run on `L`.

    With `b` random start vectors in a space of dimension `dim`, each has an
    expected weight of `1 / dim` on every eigenvector, so `dim / b` times the
    cumulative Gauss quadrature weight (the squared first-block components
    of the Ritz vectors) estimates how many eigenvalues lie below each Ritz
    value.

    Args:
        estimate: `_block_lanczos` result for `L`.
        dim: Dimension of the space searched.
        k: Index of the last wanted eigenvalue.
        count: Index of the eigenvalue to use as the filter cut.
        block: Block size of the run.

    Returns:
        `(upper, cut, kth)`: an upper bound of the spectrum, an estimate of
        eigenvalue `count` and one of eigenvalue `k`.
    """
    ritz = estimate["ritz_values"]
    m = len(ritz)
    # The top Ritz value converges fast; its residual plus a margin covers
    # the largest eigenvalue, and 2 bounds every normalized Laplacian.
    upper = ritz[-1] + estimate["residuals"][-1]
    upper = min(2.0, upper + 0.01 * (upper - ritz[0]))
    weights = np.sum(estimate["ritz_vectors"][:block] ** 2, axis=0) / block
    counts = dim * np.cumsum(weights)

    def node(index):
        return min(int(np.searchsorted(counts, index)), m - 1)

    kth_node = node(k)
    # The nodes are coarse: if one node covers both indices, cut at the
    # next one, which certainly lies above the k-th eigenvalue estimate.
    cut_node = max(node(count), min(kth_node + 1, m - 1))
    kth, cut = ritz[kth_node], ritz[cut_node]
    if not kth < cut < upper:
        cut = kth + 0.1 * (upper - kth)
    return upper, cut, kth
