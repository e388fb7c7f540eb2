"""Data-independent output codes: one-hot, random and Hadamard.

Every generator returns a float32 `np.ndarray` of shape
`(num_classes, code_length)` with one codeword (row) per class, and is
deterministic for a given `seed`.
"""

import numpy as np

from keras_ecoc.codes._validation import check_int
from keras_ecoc.codes._validation import describe
from keras_ecoc.codes._validation import make_rng

# Candidate matrices are scored in batches whose float32 work arrays hold
# about this many elements (16 MiB each), to bound memory for many classes.
_BATCH_ELEMENTS = 1 << 22

# Up to this many classes, dense_random draws columns without replacement
# from an enumeration of all admissible columns (2**(n - 1) - 1 of them), so
# the column rules can never fail; above it, collisions are negligible and
# plain rejection is used.
_ENUMERATE_MAX_CLASSES = 16


def one_hot(num_classes):
    """Returns the one-hot code: the identity matrix.

    Args:
        num_classes: Number of classes, a positive integer.

    Returns:
        float32 `np.ndarray` of shape `(num_classes, num_classes)`.

    Raises:
        TypeError: If `num_classes` is not an integer.
        ValueError: If `num_classes < 1`.
    """
    n = check_int(num_classes, "num_classes", minimum=1)
    return np.eye(n, dtype=np.float32)


def gaussian(num_classes, code_length, seed=None):
    """Returns random Gaussian codes, the random codes of Rodriguez et al.

    Entries are drawn i.i.d. from N(0, 1), so each has unit mean square, like
    +-1 codes and `spectral(..., normalization="sqrt_n")` codes.

    Args:
        num_classes: Number of classes, a positive integer.
        code_length: Length of each codeword, a positive integer.
        seed: `None` for fresh randomness, or an integer (or
            `numpy.random.Generator`) for a reproducible draw.

    Returns:
        float32 `np.ndarray` of shape `(num_classes, code_length)`.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If `num_classes` or `code_length` is smaller than 1.
    """
    n = check_int(num_classes, "num_classes", minimum=1)
    k = check_int(code_length, "code_length", minimum=1)
    rng = make_rng(seed)
    return rng.standard_normal((n, k), dtype=np.float32)


def hadamard(num_classes, code_length):
    """Returns codes cut from a Sylvester Hadamard matrix.

    The Sylvester matrix of order `N = 2**m` has entries
    `H[i, j] = (-1) ** popcount(i & j)`. This function uses the smallest
    `N >= max(num_classes, code_length + 1)` and returns **rows
    `0 .. num_classes - 1` and columns `1 .. code_length`**: column 0 is the
    constant all-ones column, which carries no information. Because of the
    Sylvester structure the entries do not depend on `N`, so the code for a
    given `code_length` is a prefix (in rows) of the code for more classes.

    Properties: the entries are +-1; with `num_classes == N` the columns are
    balanced (as many +1 as -1) and mutually orthogonal; with
    `code_length == N - 1` as well, every pair of rows is at Hamming
    distance `N / 2` (rows of `H` are orthogonal, and dropping column 0
    leaves a pairwise inner product of -1).

    Args:
        num_classes: Number of classes, a positive integer.
        code_length: Length of each codeword, a positive integer. Rows
            repeat with period `2 ** code_length.bit_length()`, so at most
            that many classes get distinct codewords.

    Returns:
        float32 `np.ndarray` of shape `(num_classes, code_length)` with
        entries +-1.

    Raises:
        TypeError: If an argument is not an integer.
        ValueError: If an argument is smaller than 1, or if
            `num_classes > 2 ** code_length.bit_length()` (two classes would
            share a codeword).
    """
    n = check_int(num_classes, "num_classes", minimum=1)
    k = check_int(code_length, "code_length", minimum=1)
    # Rows i and l agree on columns 1..k iff every bit set in i ^ l is worth
    # more than k, i.e. iff i and l agree on their low k.bit_length() bits.
    capacity = 1 << k.bit_length()
    if n > capacity:
        needed = 1 << ((n - 1).bit_length() - 1)
        raise ValueError(
            f"Argument `num_classes` must be at most {capacity} for Hadamard "
            f"codes with code_length={k}: rows of the Sylvester matrix "
            f"restricted to columns 1..{k} repeat with period {capacity}, so "
            f"more classes would share codewords. Use code_length >= "
            f"{needed} for {n} classes. Received: num_classes={n}"
        )
    rows = np.arange(n, dtype=np.uint64)[:, None]
    cols = np.arange(1, k + 1, dtype=np.uint64)[None, :]
    bits = rows & cols
    # Parity of the popcount by xor-folding (np.bitwise_count needs
    # NumPy >= 2).
    for shift in (32, 16, 8, 4, 2, 1):
        bits ^= bits >> np.uint64(shift)
    parity = (bits & np.uint64(1)).astype(np.float32)
    return 1.0 - 2.0 * parity


def dense_random(num_classes, code_length, seed=None, trials=1000):
    """Returns dense random +-1 codes (Allwein, Schapire and Singer, 2000).

    Draws `trials` random +-1 matrices and keeps the best admissible one.
    A candidate is admissible if no column is constant (it would not split
    the classes), no two columns are identical or complementary
    (`c_j == -c_l`, the same binary problem), and no two rows are identical.
    The best candidate has the largest minimum Hamming distance between rows,
    ties broken by the larger mean distance, then by the earlier draw.

    For up to 16 classes the columns are drawn without replacement from all
    admissible columns; this is the same distribution as rejection sampling
    but never runs out of trials.

    The cost is O(trials * num_classes**2 * code_length) time, so lower
    `trials` for thousands of classes. Memory is O(num_classes *
    code_length): the pairwise distances are formed in row blocks of about
    16 MiB (one trial at 10^5 classes, k = 48: 59 s and +121 MiB peak on 2
    CPU cores).

    Args:
        num_classes: Number of classes, an integer >= 2.
        code_length: Length of each codeword, an integer in
            `[1, 2 ** (num_classes - 1) - 1]` (the number of distinct
            non-constant, non-complementary columns), with
            `num_classes <= 2 ** code_length`.
        seed: `None` for fresh randomness, or an integer (or
            `numpy.random.Generator`) for a reproducible draw.
        trials: Number of candidate matrices, a positive integer.

    Returns:
        float32 `np.ndarray` of shape `(num_classes, code_length)` with
        entries +-1.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If the requested shape is impossible, or if no candidate
            was admissible within `trials` draws.
    """
    n = check_int(
        num_classes,
        "num_classes",
        minimum=2,
        reason=" for dense random codes (a column must split the classes)",
    )
    k = check_int(code_length, "code_length", minimum=1)
    trials = check_int(trials, "trials", minimum=1)
    rng = make_rng(seed)
    max_columns = 2 ** (n - 1) - 1
    if k > max_columns:
        raise ValueError(
            f"Argument `code_length` must be at most 2 ** (num_classes - 1) "
            f"- 1 = {max_columns} for dense random codes with "
            f"num_classes={n}: there are only that many distinct +-1 columns "
            f"that are neither constant nor complementary to another. "
            f"Received: code_length={k}"
        )
    _check_row_capacity(n, k, 2, "dense random")

    if n <= _ENUMERATE_MAX_CLASSES:
        # Column ids 1 .. 2**(n-1) - 1 with the last row's bit fixed to 0:
        # each id is a non-constant column, and no two are equal or
        # complementary (a complement would set the last bit).
        row_bits = np.arange(n, dtype=np.int64)[None, :, None]

        def draw(count):
            ids = np.stack(
                [
                    rng.choice(max_columns, size=k, replace=False) + 1
                    for _ in range(count)
                ]
            )
            bits = (ids[:, None, :] >> row_bits) & 1
            signs = rng.integers(0, 2, size=(count, 1, k), dtype=np.int8)
            return ((2 * bits - 1) * (2 * signs - 1)).astype(np.float32)

    else:

        def draw(count):
            bits = rng.integers(0, 2, size=(count, n, k), dtype=np.int8)
            return (2 * bits - 1).astype(np.float32)

    return _select_best(
        draw, n, k, trials, kind="dense random", zero_probability=None
    )


def sparse_random(
    num_classes, code_length, seed=None, trials=1000, zero_probability=0.5
):
    """Returns sparse random ternary codes (Allwein, Schapire and Singer).

    Entries are 0 with probability `zero_probability` and +1 or -1 otherwise,
    with equal probability; a 0 means the class is left out of that binary
    problem. Draws `trials` candidates and keeps the best admissible one. A
    candidate is admissible if every column holds at least one +1 and one -1,
    no two columns are identical or complementary, no two rows are
    identical, and no row is all zeros (that class would take part in no
    binary problem, yet sit at distance `code_length / 2` from every other
    class). The best candidate has the largest minimum Allwein distance
    between rows, `d(i, l) = sum_j (1 - m_ij * m_lj) / 2` (a shared 0 counts
    1/2), ties broken by the larger mean distance, then by the earlier draw.

    The cost is O(trials * num_classes**2 * code_length) time and
    O(num_classes * code_length) memory (as `dense_random`).

    Args:
        num_classes: Number of classes, an integer >= 2.
        code_length: Length of each codeword, a positive integer, at most
            the number of admissible column pairs
            `(3 ** n - 2 ** (n + 1) + 1) / 2`, with
            `num_classes <= 3 ** code_length`.
        seed: `None` for fresh randomness, or an integer (or
            `numpy.random.Generator`) for a reproducible draw.
        trials: Number of candidate matrices, a positive integer.
        zero_probability: Probability of a 0 entry, a float in `[0, 1)`.

    Returns:
        float32 `np.ndarray` of shape `(num_classes, code_length)` with
        entries in {-1, 0, +1}.

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If the requested shape is impossible, if
            `zero_probability` is outside `[0, 1)`, or if no candidate was
            admissible within `trials` draws.
    """
    n = check_int(
        num_classes,
        "num_classes",
        minimum=2,
        reason=" for sparse random codes (a column needs a +1 and a -1)",
    )
    k = check_int(code_length, "code_length", minimum=1)
    trials = check_int(trials, "trials", minimum=1)
    if isinstance(zero_probability, (bool, np.bool_)) or not isinstance(
        zero_probability, (int, float, np.integer, np.floating)
    ):
        raise TypeError(
            f"Argument `zero_probability` must be a float in [0, 1). "
            f"Received: zero_probability={describe(zero_probability)}"
        )
    zero_probability = float(zero_probability)
    if not 0.0 <= zero_probability < 1.0:
        raise ValueError(
            f"Argument `zero_probability` must be a float in [0, 1). "
            f"Received: zero_probability={zero_probability}"
        )
    rng = make_rng(seed)
    # Columns with at least one +1 and one -1, counted by inclusion-exclusion
    # and halved because a column and its complement are the same problem.
    max_columns = (3**n - 2 ** (n + 1) + 1) // 2
    if k > max_columns:
        raise ValueError(
            f"Argument `code_length` must be at most (3 ** num_classes - "
            f"2 ** (num_classes + 1) + 1) / 2 = {max_columns} for sparse "
            f"random codes with num_classes={n}: there are only that many "
            f"distinct non-complementary ternary columns holding both a +1 "
            f"and a -1. Received: code_length={k}"
        )
    _check_row_capacity(n, k, 3, "sparse random")

    def draw(count):
        nonzero = rng.random((count, n, k)) >= zero_probability
        signs = 2 * rng.integers(0, 2, size=(count, n, k), dtype=np.int8) - 1
        return (signs * nonzero).astype(np.float32)

    return _select_best(
        draw,
        n,
        k,
        trials,
        kind="sparse random",
        zero_probability=zero_probability,
    )


def _check_row_capacity(n, k, alphabet, kind):
    if n > alphabet**k:
        raise ValueError(
            f"Argument `num_classes` must be at most {alphabet} ** "
            f"code_length = {alphabet ** k} for {kind} codes with "
            f"code_length={k}, otherwise two classes would share a codeword. "
            f"Received: num_classes={n}"
        )


def _row_statistics(m, k, block_rows=None):
    """Row rules and scores of candidates `m` (count, n, k), entries in {-1, 0, 1}.

    With such entries, (k - <r_i, r_l>) / 2 is the Hamming distance for +-1
    rows and the Allwein distance for ternary rows, and rows are identical
    iff |r_i - r_l|^2 == 0. Every product is a small integer, exact in
    float32, and the mean sums exact half-integers in float64, so the result
    does not depend on `block_rows`.

    Args:
        m: float32 candidates (count, n, k).
        k: code length.
        block_rows: rows whose distances to all n rows are formed at once
            (default: all n while n * n fits `_BATCH_ELEMENTS`, else a block
            of about `_BATCH_ELEMENTS` elements), so that memory stays
            O(block_rows * n) and no (n, n) matrix is formed for many classes.

    Returns:
        (rows_ok (count,) bool: no two identical rows and no all-zero row,
        min_distance (count,) float32 over pairs of distinct classes,
        mean_distance (count,) float64 over them).
    """
    count, n, _ = m.shape
    if block_rows is None:
        block_rows = n if n * n <= _BATCH_ELEMENTS else max(1, _BATCH_ELEMENTS // n)
    block_rows = min(block_rows, n)
    row_norms = np.einsum("cnk,cnk->cn", m, m)  # exact: small integers
    # A ternary class whose codeword is all zeros takes part in no binary
    # problem.
    rows_ok = (row_norms > 0).all(axis=1)
    min_distance = np.full(count, np.inf, dtype=np.float32)
    total = np.zeros(count, dtype=np.float64)
    for start in range(0, n, block_rows):
        stop = min(n, start + block_rows)
        gram = np.matmul(m[:, start:stop], m.transpose(0, 2, 1))  # (count, b, n)
        off_diagonal = np.ones((stop - start, n), dtype=bool)
        off_diagonal[np.arange(stop - start), np.arange(start, stop)] = False
        squared_gaps = (
            row_norms[:, start:stop, None] + row_norms[:, None, :] - 2.0 * gram
        )
        rows_ok &= ~((squared_gaps == 0) & off_diagonal).any(axis=(1, 2))
        distances = (k - gram) / 2.0
        min_distance = np.minimum(
            min_distance,
            np.where(off_diagonal, distances, np.inf).min(axis=(1, 2)),
        )
        total += (distances * off_diagonal).sum(axis=(1, 2), dtype=np.float64)
    return rows_ok, min_distance, total / (n * (n - 1))


def _select_best(draw, n, k, trials, kind, zero_probability):
    """Draws `trials` candidates in batches and keeps the best admissible.

    Args:
        draw: Callable `count -> float32 array (count, n, k)` of candidates.
        n: Number of classes.
        k: Code length.
        trials: Number of candidates.
        kind: Name of the code family, for error messages.
        zero_probability: `None` for dense codes, else the ternary zero rate.

    Returns:
        The best candidate, float32 `(n, k)`.
    """
    batch = max(1, min(trials, _BATCH_ELEMENTS // (n * n + k * k + n * k)))
    off_diagonal_cols = ~np.eye(k, dtype=bool)
    best, best_score = None, None
    num_column_rejects = num_row_rejects = 0
    done = 0
    while done < trials:
        count = min(batch, trials - done)
        done += count
        m = draw(count)  # (count, n, k)

        # Column rules. For ternary columns, c_j == +-c_l iff equality holds
        # in Cauchy-Schwarz with equal norms: |<c_j, c_l>| == |c_j|^2 ==
        # |c_l|^2. For +-1 columns all norms are n, and "constant" is
        # |sum| == n.
        gram_cols = np.matmul(m.transpose(0, 2, 1), m)  # (count, k, k)
        norms = np.diagonal(gram_cols, axis1=1, axis2=2)  # (count, k)
        parallel = (np.abs(gram_cols) == norms[:, :, None]) & (
            norms[:, :, None] == norms[:, None, :]
        )
        column_ok = ~(parallel & off_diagonal_cols).any(axis=(1, 2))
        if zero_probability is None:
            column_ok &= (np.abs(m.sum(axis=1)) < n).all(axis=1)
        else:
            column_ok &= ((m > 0).any(axis=1) & (m < 0).any(axis=1)).all(
                axis=1
            )

        rows_ok, min_distance, mean_distance = _row_statistics(m, k)

        num_column_rejects += int((~column_ok).sum())
        num_row_rejects += int((column_ok & ~rows_ok).sum())
        for index in np.flatnonzero(column_ok & rows_ok):
            score = (float(min_distance[index]), float(mean_distance[index]))
            if best_score is None or score > best_score:
                best, best_score = m[index], score

    if best is None:
        raise ValueError(
            f"Could not draw {kind} codes with num_classes={n} and "
            f"code_length={k}: none of the trials={trials} candidates was "
            f"admissible ({num_column_rejects} had a column that is constant "
            f"(or lacks a +1 or a -1), or two identical or complementary "
            f"columns; {num_row_rejects} had two classes with identical "
            f"codewords or an all-zero codeword). Increase `trials`, or "
            f"change `code_length`"
            + (" or `zero_probability`" if zero_probability else "")
            + f". Received: trials={trials}"
        )
    return np.ascontiguousarray(best, dtype=np.float32)
