"""Eigensolvers for the bottom of a normalized graph Laplacian.

All solvers compute the `k` smallest eigenpairs of `L = I - A`, where
`A = D^-1/2 S D^-1/2`, restricted to the orthogonal complement of the
trivial eigenvector `u0 = D^1/2 1 / |D^1/2 1|` (eigenvalue 0). Deflating
`u0` explicitly, instead of computing `k + 1` pairs and dropping the first,
keeps the codes orthogonal to `u0` even when the graph is disconnected and
the null space has several dimensions.

The spectrum of `L` lies in `[0, 2]`.
"""

import warnings

import numpy as np
import scipy.linalg
import scipy.sparse.linalg


def dense_eigenpairs(adjacency, u0, k):
    """Smallest `k` eigenpairs of `L` on `u0^perp` with LAPACK.

    Args:
        adjacency: `A`, a float64 `np.ndarray` or sparse matrix `(n, n)`.
        u0: float64 `(n,)`, unit norm.
        k: Number of pairs, `1 <= k <= n - 1`.

    Returns:
        `(eigenvalues (k,), vectors (n, k))`, eigenvalues ascending.
    """
    if scipy.sparse.issparse(adjacency):
        adjacency = adjacency.toarray()
    n = adjacency.shape[0]
    # Moving u0 from eigenvalue 0 to 3 (above the spectrum, which ends at
    # 2) leaves exactly the eigenpairs orthogonal to it at the bottom.
    laplacian = np.eye(n) - adjacency + 3.0 * np.outer(u0, u0)
    return scipy.linalg.eigh(laplacian, subset_by_index=[0, k - 1])


def arpack_eigenpairs(adjacency, u0, k, rng, tol=1e-10):
    """Smallest `k` eigenpairs of `L` on `u0^perp` with ARPACK (`eigsh`).

    The smallest eigenvalues of `L` are the largest of `I + A`, and ARPACK
    converges far faster for the largest algebraic eigenvalues than in
    smallest-magnitude mode (which would need a factorization). `u0` is
    mapped to eigenvalue 0 so it is never returned.

    Args:
        adjacency: `A`, a float64 sparse matrix or `np.ndarray` `(n, n)`.
        u0: float64 `(n,)`, unit norm.
        k: Number of pairs, `1 <= k <= n - 2`.
        rng: `numpy.random.Generator` for the start vector.
        tol: ARPACK relative tolerance on the Ritz values.

    Returns:
        `(eigenvalues (k,), vectors (n, k))`, eigenvalues ascending.
    """
    n = adjacency.shape[0]

    def matvec(x):
        x = np.asarray(x).reshape(-1)
        return x + adjacency @ x - 2.0 * u0 * (u0 @ x)

    operator = scipy.sparse.linalg.LinearOperator(
        (n, n), matvec=matvec, dtype=np.float64
    )
    start = rng.standard_normal(n)
    start -= u0 * (u0 @ start)
    values, vectors = scipy.sparse.linalg.eigsh(
        operator,
        k=k,
        which="LA",
        v0=start,
        tol=tol,
        ncv=min(n, max(2 * k + 1, 20)),
    )
    order = np.argsort(2.0 - values, kind="stable")
    return 2.0 - values[order], vectors[:, order]


def chebyshev_eigenpairs(
    adjacency, u0, k, rng, tol=1e-8, degree=20, max_iterations=50
):
    """Smallest `k` eigenpairs of `L` on `u0^perp` by filtered iteration.

    Chebyshev-filtered subspace iteration (Zhou and Saad, 2007). On kNN
    class graphs the bottom eigenvalues are tightly packed (100,000 classes:
    128 eigenvalues within about 0.15 of each other), which makes
    unaccelerated Lanczos restart many times. Here a block of
    `k + buffer` vectors is multiplied by a degree-`degree` Chebyshev
    polynomial of `L` that is bounded by 1 on `[cut, upper]` and grows fast
    below `cut`, then orthonormalized and Rayleigh-Ritz projected. `upper`
    bounds the spectrum (from a short Lanczos run) and `cut`, the damping
    threshold, starts at an estimate of the `k + buffer`-th eigenvalue from
    the Lanczos quadrature weights and then follows the largest Ritz value of
    the block, which is always above the `k` wanted eigenvalues. Converged
    leading vectors are locked and no longer filtered. The work is block
    sparse products and BLAS-3 on `(n, k + buffer)` arrays.

    Args:
        adjacency: `A`, a float64 sparse matrix or `np.ndarray` `(n, n)`.
        u0: float64 `(n,)`, unit norm.
        k: Number of pairs, `1 <= k <= n - 2`.
        rng: `numpy.random.Generator` for the start block.
        tol: Convergence threshold on the residual norms
            `|L v - theta v|` of the unit Ritz vectors.
        degree: Degree of the Chebyshev filter.
        max_iterations: Most filter applications before giving up with a
            warning.

    Returns:
        `(eigenvalues (k,), vectors (n, k))`, eigenvalues ascending.
    """
    n = adjacency.shape[0]
    block = min(n - 1, k + max(16, k // 4))

    def apply_laplacian(x):
        return x - adjacency @ x

    def deflate(x):
        x -= np.outer(u0, u0 @ x)
        return x

    upper, cut = _lanczos_bounds(
        apply_laplacian, deflate, u0, block, rng, steps=min(n - 1, 80)
    )
    x = deflate(rng.standard_normal((n, block)))
    x, _ = np.linalg.qr(x)
    values = np.zeros(block)
    residuals = np.full(block, np.inf)
    locked = 0
    low = 0.0
    for _ in range(max_iterations):
        active = _chebyshev_filter(
            adjacency, x[:, locked:], degree, cut, upper, low
        )
        deflate(active)
        if locked:
            # Twice: the filter amplified the round-off in these directions.
            for _ in range(2):
                active -= x[:, :locked] @ (x[:, :locked].T @ active)
        active, _ = np.linalg.qr(active)
        l_active = apply_laplacian(active)
        projected = active.T @ l_active
        theta, rotation = np.linalg.eigh((projected + projected.T) / 2.0)
        active = active @ rotation
        l_active = l_active @ rotation
        x[:, locked:] = active
        values[locked:] = theta
        residuals[locked:] = np.linalg.norm(l_active - active * theta, axis=0)
        while locked < k and residuals[locked] <= tol:
            locked += 1
        if locked >= k:
            break
        # The largest Ritz value of the block bounds the (block)-th
        # eigenvalue from above, so everything wanted stays below the cut.
        cut = min(theta[-1], upper - 1e-3 * (upper - theta[0]))
        low = theta[0]
    else:
        warnings.warn(
            f"The Chebyshev eigensolver did not reach tol={tol} in "
            f"{max_iterations} iterations (largest residual "
            f"{residuals[:k].max():.2e}); the codes are approximate. Try "
            f"solver='arpack'.",
            RuntimeWarning,
            stacklevel=3,
        )
    # A last Rayleigh-Ritz pass over the wanted vectors makes them exactly
    # L-orthogonal, whatever iteration each was locked in.
    x = x[:, :k]
    projected = x.T @ apply_laplacian(x)
    theta, rotation = np.linalg.eigh((projected + projected.T) / 2.0)
    return theta, x @ rotation


def _chebyshev_filter(adjacency, x, degree, cut, upper, low):
    """Returns `p(L) x` for the scaled Chebyshev filter of Zhou and Saad.

    `p` has degree `degree`, is bounded by `|p(low)|`-relative 1 on
    `[cut, upper]`, grows fast below `cut`, and is scaled so that
    `p(low) = 1`, which avoids overflow.

    Args:
        adjacency: `A` with `L = I - A`.
        x: float64 `(n, b)`.
        degree: Polynomial degree, >= 1.
        cut: Lower end of the damped interval.
        upper: Upper end of the damped interval (bounds the spectrum).
        low: Scaling point, below `cut`.

    Returns:
        float64 `(n, b)`, C-contiguous.
    """
    half_width = (upper - cut) / 2.0
    center = (upper + cut) / 2.0
    sigma = half_width / (low - center)
    tau = 2.0 / sigma
    previous = np.ascontiguousarray(x)
    # (L - c) y = (1 - c) y - A y.
    current = adjacency @ previous
    current *= -sigma / half_width
    _axpy(previous, current, (1.0 - center) * sigma / half_width)
    for _ in range(2, degree + 1):
        sigma_next = 1.0 / (tau - sigma)
        scale = 2.0 * sigma_next / half_width
        following = adjacency @ current
        following *= -scale
        _axpy(current, following, (1.0 - center) * scale)
        _axpy(previous, following, -sigma * sigma_next)
        previous, current = current, following
        sigma = sigma_next
    return np.ascontiguousarray(current)


def _axpy(x, y, a):
    """`y += a * x` in place, without a temporary; both C-contiguous."""
    axpy = scipy.linalg.blas.get_blas_funcs("axpy", (x, y))
    axpy(x.reshape(-1), y.reshape(-1), a=a)


def _lanczos_bounds(apply_laplacian, deflate, u0, count, rng, steps):
    """Estimates spectral bounds of `L` on `u0^perp` with Lanczos.

    Gauss quadrature from a random start vector spreads its unit weight
    over the Ritz values; since the start has an expected weight of
    `1 / (n - 1)` on each eigenvector, `(n - 1)` times the cumulative weight
    estimates how many eigenvalues lie below each Ritz value.

    Args:
        apply_laplacian: `x -> L x`.
        deflate: Projects `u0` out of a 2-D array in place.
        u0: float64 `(n,)`.
        count: The eigenvalue index whose value is wanted as the cut.
        rng: `numpy.random.Generator`.
        steps: Number of Lanczos steps.

    Returns:
        `(upper, cut)`: an upper bound of the spectrum and an estimate of
        the `count`-th eigenvalue.
    """
    n = u0.shape[0]
    basis = np.zeros((steps + 1, n))
    start = deflate(rng.standard_normal((n, 1)))[:, 0]
    basis[0] = start / np.linalg.norm(start)
    alphas, betas = [], []
    for j in range(steps):
        w = apply_laplacian(basis[j])
        alphas.append(basis[j] @ w)
        # Full reorthogonalization (twice is enough) keeps the quadrature
        # free of spurious copies; the basis is small.
        for _ in range(2):
            w -= basis[: j + 1].T @ (basis[: j + 1] @ w)
        w -= u0 * (u0 @ w)
        beta = np.linalg.norm(w)
        if beta <= 1e-10:
            break
        betas.append(beta)
        basis[j + 1] = w / beta
    m = len(alphas)
    tridiagonal = np.diag(alphas)
    off = np.asarray(betas[: m - 1])
    tridiagonal += np.diag(off, 1) + np.diag(off, -1)
    ritz, vectors = np.linalg.eigh(tridiagonal)
    last_beta = betas[m - 1] if len(betas) >= m else 0.0
    upper = min(2.0, ritz[-1] + last_beta * abs(vectors[-1, -1]) + 1e-3)
    estimated = (n - 1) * np.cumsum(vectors[0] ** 2)
    index = min(int(np.searchsorted(estimated, count)), m - 1)
    cut = ritz[index]
    if cut >= upper:
        cut = (ritz[0] + upper) / 2.0
    return upper, cut
