"""Spectral output codes: eigenvectors of the class graph Laplacian.

Rodriguez et al. embed the classes with the leading non-trivial eigenvectors
of the normalized Laplacian of a class similarity graph (a relaxation of the
normalized cut), so that similar classes get nearby codewords.
"""

import warnings

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph

from keras_ecoc.codes import _eigen
from keras_ecoc.codes._validation import as_float_matrix
from keras_ecoc.codes._validation import check_choice
from keras_ecoc.codes._validation import check_finite
from keras_ecoc.codes._validation import check_int
from keras_ecoc.codes._validation import describe
from keras_ecoc.codes._validation import duplicate_row_pairs
from keras_ecoc.codes._validation import format_list
from keras_ecoc.codes._validation import make_rng
from keras_ecoc.codes.similarity import check_dense_fits

THRESHOLDS = (None, "zero", "median")
NORMALIZATIONS = ("sqrt_n", None)
SOLVERS = ("auto", "dense", "chebyshev", "arpack")

# With solver="auto", sparse graphs up to this many classes are densified:
# LAPACK is exact and faster than an iterative solver at this size.
_DENSE_MAX_CLASSES = 2000

# Dense (n, n) float64 arrays alive at once in the dense solver: the dense
# adjacency, the null-space projector, the Laplacian and LAPACK's copy.
_DENSE_SOLVER_COPIES = 4

# Relative asymmetry |S - S^T| / max|S| tolerated (float32 round-off).
_SYMMETRY_RTOL = 1e-6

# Entries within this relative margin of a column's largest magnitude are
# ties for the sign convention, so that round-off cannot flip a column.
_SIGN_TIE_RTOL = 1e-6


def spectral(
    similarity,
    code_length,
    threshold=None,
    normalization="sqrt_n",
    solver="auto",
    seed=0,
    return_eigenvalues=False,
):
    """Returns spectral codes: Laplacian eigenvectors of a class graph.

    With `S` the `(n, n)` class similarity and `D` its diagonal degree
    matrix, the codes are the eigenvectors `1 .. code_length` of the
    symmetric normalized Laplacian `L = I - D^-1/2 S D^-1/2`, ordered by
    ascending eigenvalue (the normalized-cut cost of the split each column
    encodes). Eigenvector 0, the trivial `D^1/2 1` with eigenvalue 0, is
    skipped: the codes are orthogonal to it.

    **Scaling.** With `normalization="sqrt_n"` (the default) the
    orthonormal eigenvectors are multiplied by `sqrt(n)`, so that
    `M^T M = n I`: the entries then have unit mean square, like +-1 codes
    and N(0, 1) Gaussian codes, and one decoder temperature suits every code
    family. Only whole columns are rescaled (all by the same factor); the
    rows are *not* normalized individually, so the relative geometry of the
    class codewords is preserved. `normalization=None` returns the raw
    orthonormal eigenvectors (`M^T M = I`).

    **Signs.** An eigenvector's sign is arbitrary, so each column is flipped
    to make its entry of largest magnitude positive (entries within a
    relative 1e-6 of the largest count as ties; the first one wins). Dense
    and sparse solvers therefore return the same codes.

    The diagonal of `S` is used as given (a self-loop adds to its class's
    degree); `class_similarity` returns a zero diagonal.

    **Disconnected graphs** trigger a warning. With `c` connected
    components the null space of `L` has `c` dimensions, spanned by the
    vectors `D^1/2 1_C` of the components `C`; the first `min(c - 1, k)`
    codes are then a fixed orthonormal basis of that null space orthogonal
    to `D^1/2 1` (eigenvalue 0, constant up to `D^1/2` on each component),
    and the rest are the eigenvectors of the smallest positive eigenvalues.
    All solvers compute the same basis.

    **Solvers.** `"dense"` is LAPACK `eigh` on the dense Laplacian,
    O(n^3). `"chebyshev"` runs block Lanczos on a Chebyshev polynomial of
    the sparse Laplacian that damps all but the bottom of the spectrum; it
    needs only sparse products and a basis of 2 to 4 times `code_length`
    vectors.
    On 2 CPU cores, 100,000 classes on a 10-neighbour kNN graph with
    `code_length=128` take about 20 to 30 seconds. `"arpack"` is
    `scipy.sparse.linalg.eigsh` on `I + A` (largest eigenvalues, no
    factorization), a slower reference.

    Args:
        similarity: Symmetric non-negative `(n, n)` matrix, a NumPy array or
            a `scipy.sparse` matrix (e.g. from `class_similarity`). Every
            class needs a positive similarity to some class.
        code_length: Number of eigenvectors `k`, an integer in
            `[1, n - 1]`.
        threshold: `None` for the real-valued eigenvectors (the best codes
            in the paper), or `"zero"` / `"median"` to binarize them to +-1
            with `binarize`.
        normalization: `"sqrt_n"` or `None`, see above. Ignored for the
            values when `threshold` is set (binary codes are +-1).
        solver: `"dense"`, `"chebyshev"`, `"arpack"` (see above), or
            `"auto"`: `"dense"` for dense input and for sparse input with at
            most 2000 classes, else `"chebyshev"`. The iterative solvers
            defer to `"dense"` when fewer than `code_length + 17`
            eigenvectors exist outside the null space. The dense solver
            needs about `32 n^2` bytes (320 GB for 100,000 classes); when
            that exceeds the available memory it is refused before any
            work.
        seed: Seed of the iterative solvers' random start (an integer or
            `None`); results agree across seeds to about 1e-8.
        return_eigenvalues: Whether to also return the eigenvalues.

    Returns:
        float32 `np.ndarray` of shape `(n, code_length)`; with
        `return_eigenvalues=True`, a tuple `(codes, eigenvalues)` where
        `eigenvalues` is float64 of shape `(code_length,)`, ascending, in
        `[0, 2]`.

    Raises:
        TypeError: If `similarity` is not numeric or an argument has the
            wrong type.
        ValueError: If `similarity` is not square, not symmetric, has
            negative, NaN or inf entries, or has classes with zero degree
            (named in the message); if `code_length` is not in `[1, n - 1]`;
            if `threshold`, `normalization` or `solver` is unknown; or if
            the dense solver (`solver="dense"`, or `"auto"` with a dense
            `similarity`) needs more memory than is available.
    """
    threshold = check_choice(threshold, "threshold", THRESHOLDS)
    normalization = check_choice(normalization, "normalization", NORMALIZATIONS)
    solver = check_choice(solver, "solver", SOLVERS)
    if not isinstance(return_eigenvalues, (bool, np.bool_)):
        raise TypeError(
            f"Argument `return_eigenvalues` must be a bool. "
            f"Received: return_eigenvalues={describe(return_eigenvalues)}"
        )
    rng = make_rng(seed)
    _check_dense_solver_fits(similarity, solver)
    similarity = _as_similarity(similarity)
    n = similarity.shape[0]
    k = check_int(
        code_length,
        "code_length",
        minimum=1,
        maximum=n - 1,
        reason=(
            " for spectral codes (eigenvectors 1..n-1 of the Laplacian of "
            f"n={n} classes)"
        ),
    )

    degrees = np.asarray(similarity.sum(axis=1)).reshape(-1)
    isolated = np.flatnonzero(degrees <= 0)
    if len(isolated):
        raise ValueError(
            f"Argument `similarity` gives classes {format_list(isolated)} "
            f"no positive similarity to any class (zero degree), so the "
            f"normalized Laplacian is undefined. Connect every class, e.g. "
            f"with a larger `n_neighbors` or another kernel. "
            f"Received: similarity={describe(similarity)}"
        )
    num_components, component = scipy.sparse.csgraph.connected_components(
        similarity, directed=False
    )
    if num_components > 1:
        warnings.warn(
            f"The similarity graph has {num_components} connected "
            f"components, so the trivial eigenvector of the Laplacian is not "
            f"unique and the first {min(num_components - 1, k)} code columns "
            f"(eigenvalue 0) only tell the components apart. Connect the "
            f"graph (e.g. a larger `n_neighbors`) for informative codes.",
            UserWarning,
            stacklevel=2,
        )

    inv_sqrt = 1.0 / np.sqrt(degrees)
    # `similarity` is this function's own copy (`_as_similarity`), so
    # D^-1/2 S D^-1/2 is formed in place, in the order (s_ij d_i) d_j of the
    # product: at a million classes each copy of the graph is 200 MB, and
    # every one alive during the eigensolve adds to its peak.
    adjacency = similarity
    del similarity
    if scipy.sparse.issparse(adjacency):
        _scale_rows_and_columns(adjacency, inv_sqrt)
    else:
        adjacency *= inv_sqrt[:, None]
        adjacency *= inv_sqrt[None, :]
    null, null_codes = _null_space(degrees, component, num_components, k)
    k_rest = k - null_codes.shape[1]

    if solver == "auto":
        dense = not scipy.sparse.issparse(adjacency) or n <= _DENSE_MAX_CLASSES
        solver = "dense" if dense else "chebyshev"
    if solver != "dense" and n - num_components <= k_rest + 16:
        solver = "dense"
    if k_rest == 0:
        eigenvalues, vectors = np.zeros(0), np.zeros((n, 0))
    elif solver == "dense":
        eigenvalues, vectors = _eigen.dense_eigenpairs(adjacency, null, k_rest)
    else:
        solve = (
            _eigen.arpack_eigenpairs
            if solver == "arpack"
            else _eigen.chebyshev_eigenpairs
        )
        eigenvalues, vectors = _eigen.with_locality_order(
            solve, adjacency, null, k_rest, rng
        )
    # Round-off can leave an eigenvalue a hair outside [0, 2].
    eigenvalues = np.clip(eigenvalues, 0.0, 2.0)
    eigenvalues = np.concatenate([np.zeros(null_codes.shape[1]), eigenvalues])
    vectors = np.hstack([null_codes, vectors])

    vectors = fix_signs(vectors)
    if normalization == "sqrt_n":
        vectors = vectors * np.sqrt(n)
    codes = vectors.astype(np.float32)
    if threshold is not None:
        codes = binarize(codes, threshold)
        warn_if_binarized_rows_repeat(codes, threshold, stacklevel=3)
    if return_eigenvalues:
        return codes, eigenvalues
    return codes


def warn_if_binarized_rows_repeat(codes, threshold, stacklevel=2):
    """Warns when thresholding gave two or more classes the same codeword.

    `stacklevel` counts from this function (2: its caller)."""
    _, total = duplicate_row_pairs(codes, max_pairs=0)
    if total:
        warnings.warn(
            f"Binarizing with threshold={threshold!r} gave identical "
            f"codewords to {total} pairs of classes, which a decoder "
            f"cannot tell apart; use a larger `code_length` or "
            f"threshold=None.",
            UserWarning,
            stacklevel=stacklevel,
        )


def binarize(codes, threshold):
    """Turns real-valued codes into +-1 codes, column by column.

    Args:
        codes: float array of shape `(num_classes, code_length)`.
        threshold: `"zero"`: +1 where the entry is >= 0, else -1.
            `"median"`: +1 where the entry is >= the median of its column,
            else -1, which balances each column.

    Returns:
        float32 `np.ndarray` of shape `(num_classes, code_length)` with
        entries +-1. Rows may coincide; check with `report` or
        `validate_codes`.

    Raises:
        TypeError: If `codes` is not numeric.
        ValueError: If `codes` is not 2-D or holds NaN or inf, or if
            `threshold` is not `"zero"` or `"median"`.
    """
    threshold = check_choice(threshold, "threshold", ("zero", "median"))
    codes = as_float_matrix(codes, "codes")
    if threshold == "zero":
        cut = 0.0
    else:
        cut = np.median(codes, axis=0)
    return np.where(codes >= cut, 1.0, -1.0).astype(np.float32)


def _scale_rows_and_columns(matrix, scale, rows=1 << 16):
    """`matrix.data` of a CSR matrix times `scale[i] * scale[j]`, in place.

    Row blocks bound the (block nnz,) index temporaries.
    """
    indptr, indices, data = matrix.indptr, matrix.indices, matrix.data
    n = matrix.shape[0]
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        lo, hi = indptr[start], indptr[stop]
        row_of = np.repeat(scale[start:stop], np.diff(indptr[start : stop + 1]))
        data[lo:hi] *= row_of
        data[lo:hi] *= scale[indices[lo:hi]]


def fix_signs(vectors):
    """Flips columns so that each one's largest-magnitude entry is positive.

    Args:
        vectors: float `np.ndarray` of shape `(n, k)`.

    Returns:
        float `np.ndarray` of shape `(n, k)`.
    """
    magnitude = np.abs(vectors)
    peak = magnitude.max(axis=0)
    first = np.argmax(magnitude >= peak * (1.0 - _SIGN_TIE_RTOL), axis=0)
    signs = np.where(vectors[first, np.arange(vectors.shape[1])] < 0, -1.0, 1.0)
    return vectors * signs


def _null_space(degrees, component, num_components, k):
    """The null space of the normalized Laplacian, and its code columns.

    `L` has one null vector per connected component `C`,
    `D^1/2 1_C / |D^1/2 1_C|`; these columns are orthonormal (disjoint
    supports). The trivial eigenvector `u0 = D^1/2 1 / |D^1/2 1|` is the
    combination `null @ a` with `a_C = |D^1/2 1_C| / |D^1/2 1|`. The code
    columns for eigenvalue 0 are the rest of the null space,
    `null @ H[:, 1:]` with `H` the Householder reflection that maps `a` to
    the first unit vector: orthonormal, orthogonal to `u0`, and
    deterministic.

    Args:
        degrees: float64 `(n,)`, all positive.
        component: int `(n,)`, the component label of each class.
        num_components: Number of components `c`.
        k: Code length.

    Returns:
        `(null, null_codes)`: a sparse CSC `(n, c)` matrix with orthonormal
        columns, and float64 `(n, min(c - 1, k))` code columns.
    """
    n = len(degrees)
    root = np.sqrt(degrees)
    component_norms = np.sqrt(np.bincount(component, weights=degrees))
    null = scipy.sparse.csc_matrix(
        (root / component_norms[component], (np.arange(n), component)),
        shape=(n, num_components),
    )
    count = min(num_components - 1, k)
    if count == 0:
        return null, np.zeros((n, 0))
    a = component_norms / np.linalg.norm(component_norms)
    reflector = a.copy()
    reflector[0] -= 1.0
    norm = np.linalg.norm(reflector)
    if norm > 0:
        reflector /= norm
    columns = np.eye(num_components, count + 1)[:, 1:]
    columns -= 2.0 * np.outer(reflector, reflector[1 : count + 1])
    return null, np.asarray(null @ columns)


def _check_dense_solver_fits(similarity, solver):
    """Refuses, before any work, a dense solve that cannot fit in memory."""
    sparse = scipy.sparse.issparse(similarity)
    shape = similarity.shape if sparse else np.shape(similarity)
    if len(shape) != 2:
        return  # _as_similarity names the problem
    n = shape[0]
    automatic = solver == "auto" and (not sparse or n <= _DENSE_MAX_CLASSES)
    if solver == "dense" or automatic:
        check_dense_fits(
            _DENSE_SOLVER_COPIES * 8 * n**2,
            what=f"the dense eigensolver (solver={solver!r}) on num_classes={n}",
            advice=(
                "Pass a sparse similarity, e.g. class_similarity(..., "
                "n_neighbors=10), with solver='auto' or 'chebyshev'. "
                f"Received: solver={solver!r} and "
                f"similarity={describe(similarity)}"
            ),
        )


def _as_similarity(similarity):
    """Checks a similarity matrix; returns float64 ndarray or CSR."""
    if scipy.sparse.issparse(similarity):
        matrix = scipy.sparse.csr_matrix(similarity, dtype=np.float64, copy=True)
        matrix.sum_duplicates()
        if matrix.ndim != 2:
            raise ValueError(
                f"Argument `similarity` must be 2-D. "
                f"Received: similarity={describe(similarity)}"
            )
        values = matrix.data
    else:
        matrix = as_float_matrix(similarity, "similarity")
        values = matrix
    rows, cols = matrix.shape
    if rows != cols or rows < 2:
        raise ValueError(
            f"Argument `similarity` must be a square matrix of shape "
            f"(num_classes, num_classes) with num_classes >= 2. "
            f"Received: similarity={describe(similarity)}"
        )
    check_finite(values, "similarity")
    if (values < 0).any():
        if scipy.sparse.issparse(matrix):
            coo = matrix.tocoo()
            where = np.flatnonzero(coo.data < 0)[0]
            first = (int(coo.row[where]), int(coo.col[where]))
        else:
            first = tuple(int(i) for i in np.argwhere(matrix < 0)[0])
        raise ValueError(
            f"Argument `similarity` must be non-negative (the Laplacian "
            f"needs non-negative edge weights), but "
            f"{int((values < 0).sum())} entries are negative, the first at "
            f"{first}. Clip them, e.g. np.maximum(similarity, 0). "
            f"Received: similarity={describe(similarity)}"
        )
    scale = abs(values).max() if values.size else 0.0
    asymmetry = abs(matrix - matrix.T).max()
    if asymmetry > _SYMMETRY_RTOL * scale:
        raise ValueError(
            f"Argument `similarity` must be symmetric, but "
            f"max|S - S^T| = {asymmetry:.3g} exceeds {_SYMMETRY_RTOL:g} "
            f"times max|S| = {scale:.3g}. Symmetrize it, e.g. "
            f"(S + S.T) / 2. Received: similarity={describe(similarity)}"
        )
    matrix = (matrix + matrix.T) / 2.0
    if scipy.sparse.issparse(matrix):
        matrix = matrix.tocsr()
        matrix.eliminate_zeros()
    return matrix
