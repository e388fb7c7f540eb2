"""Argument checks shared by the code generators, the similarity builders and
the Keras layers.

Every check raises in the Keras style: it names the argument, states the
expected form and ends with `Received: name=value`, with arrays abbreviated to
their shape so that messages stay readable for large inputs.
"""

import numbers

import numpy as np
import scipy.sparse

# How many offending items (class ids, pairs) an error message lists before it
# switches to "... (N in total)".
_MAX_LISTED = 10


def describe(value):
    """Returns a short description of `value` for error messages.

    Arrays, tensors and sparse matrices are abbreviated to their type, shape
    and dtype; long reprs are truncated.

    Args:
        value: Any object.

    Returns:
        A string.
    """
    if scipy.sparse.issparse(value):
        return (
            f"{type(value).__name__} of shape {value.shape} "
            f"and dtype {value.dtype}"
        )
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return repr(value.item())
        return f"array of shape {value.shape} and dtype {value.dtype}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        # Tensors and variables of any framework, without importing them.
        return (
            f"{type(value).__name__} of shape {tuple(value.shape)} "
            f"and dtype {value.dtype}"
        )
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"{type(value).__name__} of length {len(value)}"
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return text


def format_list(items, limit=_MAX_LISTED):
    """Formats the first `limit` items of a sequence for an error message.

    Args:
        items: A sequence.
        limit: How many items to show.

    Returns:
        A string such as `"[3, 7]"` or `"[0, 1, ..., 9] (12 in total)"`.
    """
    items = list(items)
    shown = ", ".join(str(item) for item in items[:limit])
    if len(items) > limit:
        return f"[{shown}, ...] ({len(items)} in total)"
    return f"[{shown}]"


def check_int(value, name, minimum=None, maximum=None, reason=""):
    """Checks that `value` is an integer in `[minimum, maximum]`.

    Args:
        value: The argument to check.
        name: The argument name, for the error message.
        minimum: Smallest allowed value, or `None` for no bound.
        maximum: Largest allowed value, or `None` for no bound.
        reason: Optional text appended to the expected form, e.g.
            `" for spectral codes"`.

    Returns:
        The value as a Python `int`.

    Raises:
        TypeError: If `value` is not an integer (booleans are rejected).
        ValueError: If `value` is out of range.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, numbers.Integral
    ):
        raise TypeError(
            f"Argument `{name}` must be an integer{reason}. "
            f"Received: {name}={describe(value)} "
            f"(of type {type(value).__name__})"
        )
    value = int(value)
    if (minimum is not None and value < minimum) or (
        maximum is not None and value > maximum
    ):
        if maximum is None:
            expected = f"an integer >= {minimum}"
        elif minimum is None:
            expected = f"an integer <= {maximum}"
        else:
            expected = f"an integer in [{minimum}, {maximum}]"
        raise ValueError(
            f"Argument `{name}` must be {expected}{reason}. "
            f"Received: {name}={value}"
        )
    return value


def check_choice(value, name, choices):
    """Checks that `value` is one of `choices` (compared with `==`).

    Args:
        value: The argument to check.
        name: The argument name, for the error message.
        choices: The allowed values.

    Returns:
        `value`.

    Raises:
        ValueError: If `value` is not one of `choices`.
    """
    for choice in choices:
        if (choice is None and value is None) or (
            choice is not None
            and isinstance(value, type(choice))
            and value == choice
        ):
            return value
    raise ValueError(
        f"Argument `{name}` must be one of "
        f"{', '.join(repr(c) for c in choices)}. "
        f"Received: {name}={describe(value)}"
    )


def make_rng(seed, name="seed"):
    """Returns `numpy.random.default_rng(seed)` after checking `seed`.

    Args:
        seed: `None` (fresh OS entropy), a non-negative integer, a
            `numpy.random.SeedSequence` or a `numpy.random.Generator`.
        name: The argument name, for the error message.

    Returns:
        A `numpy.random.Generator`.

    Raises:
        TypeError: If `seed` has another type.
        ValueError: If `seed` is a negative integer.
    """
    if seed is None or isinstance(
        seed, (np.random.Generator, np.random.SeedSequence)
    ):
        return np.random.default_rng(seed)
    check_int(seed, name, minimum=0, reason=" or None")
    return np.random.default_rng(int(seed))


def as_float_matrix(value, name, allow_empty=False, keep_float32=False):
    """Converts `value` to a finite 2-D float64 array.

    Args:
        value: Array-like.
        name: The argument name, for the error message.
        allow_empty: Whether a dimension of size 0 is allowed.
        keep_float32: Whether a float32 array stays float32 (no copy), for
            callers that compute in float32 anyway.

    Returns:
        A float64 (or, with `keep_float32`, float32) `np.ndarray` of rank 2.

    Raises:
        TypeError: If `value` is sparse or not numeric.
        ValueError: If `value` is not 2-D, is empty, or holds NaN or inf.
    """
    if scipy.sparse.issparse(value):
        raise TypeError(
            f"Argument `{name}` must be a dense array. "
            f"Received: {name}={describe(value)}"
        )
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise TypeError(
            f"Argument `{name}` must be a numeric array. "
            f"Received: {name}={describe(value)}"
        )
    if array.ndim != 2:
        raise ValueError(
            f"Argument `{name}` must be a 2-D array. "
            f"Received: {name}={describe(array)}"
        )
    if not allow_empty and 0 in array.shape:
        raise ValueError(
            f"Argument `{name}` must have at least one row and one column. "
            f"Received: {name}={describe(array)}"
        )
    if not (keep_float32 and array.dtype == np.float32):
        array = array.astype(np.float64, copy=False)
    check_finite(array, name)
    return array


def check_finite(array, name):
    """Raises if a float array holds NaN or inf.

    Args:
        array: A float `np.ndarray`.
        name: The argument name, for the error message.

    Raises:
        ValueError: If some entry is not finite; the message gives the count
            and the position of the first one.
    """
    finite = np.isfinite(array)
    if not finite.all():
        bad = np.argwhere(~finite)
        first = tuple(int(i) for i in bad[0])
        raise ValueError(
            f"Argument `{name}` must contain only finite values, but "
            f"{len(bad)} entries are NaN or inf (the first at index "
            f"{first}). Received: {name}={describe(array)}"
        )


# Rows per block of the block-wise checks: about 2 MB of row bytes, so a
# check of a million-class matrix adds a few tens of MB, never a full copy.
_BLOCK_BYTES = 1 << 21


def _row_blocks(n, row_bytes):
    step = max(1, _BLOCK_BYTES // max(1, row_bytes))
    for start in range(0, n, step):
        yield start, min(n, start + step)


def _row_hashes(array):
    """(n,) uint64 hash of each row's bytes (-0.0 counted as 0.0).

    A random linear hash of the row's 32-bit words modulo 2^64, computed in
    blocks. Equal rows always hash equal; unequal rows collide rarely, and
    `duplicate_row_pairs` compares candidate rows exactly.
    """
    n = array.shape[0]
    row_bytes = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    words = -(-row_bytes // 4)
    multipliers = np.random.default_rng(0x5EED).integers(
        1, 2**63, size=words, dtype=np.uint64
    ) * np.uint64(2) + np.uint64(1)
    hashes = np.empty(n, np.uint64)
    for start, stop in _row_blocks(n, row_bytes):
        block = array[start:stop]
        if block.dtype.kind == "f":
            block = block + block.dtype.type(0)  # Turns -0.0 into 0.0.
        raw = np.ascontiguousarray(block).view(np.uint8).reshape(stop - start, row_bytes)
        if row_bytes % 4:
            raw = np.pad(raw, ((0, 0), (0, 4 - row_bytes % 4)))
        block_words = raw.view(np.uint32).astype(np.uint64)
        with np.errstate(over="ignore"):
            hashes[start:stop] = (block_words * multipliers).sum(axis=1, dtype=np.uint64)
    return hashes


def duplicate_row_pairs(array, max_pairs=None):
    """Finds the pairs of identical rows of a 2-D array.

    Hashes each row (in blocks), sorts the n hashes and compares only rows
    whose hashes are equal, so it needs O(n) extra memory (16 bytes a row)
    whatever the row length, and no copy of the array. `-0.0` and `0.0`
    count as equal.

    Args:
        array: `np.ndarray` of shape `(n, k)`.
        max_pairs: Stop listing after this many pairs (`None`: list all).

    Returns:
        A tuple `(pairs, total)`: `pairs` is a list of `(i, j)` tuples with
        `i < j`, in increasing order of `i` then `j`, and `total` is the
        number of duplicate pairs (which may exceed `len(pairs)`).
    """
    array = np.asarray(array)
    if array.shape[0] < 2:
        return [], 0
    hashes = _row_hashes(array)
    order = np.argsort(hashes, kind="stable")
    sorted_hashes = hashes[order]
    same = sorted_hashes[1:] == sorted_hashes[:-1]
    if not same.any():
        return [], 0
    # Runs of equal hashes: candidate groups, compared exactly.
    edges = np.flatnonzero(np.diff(np.concatenate([[False], same, [False]]).astype(np.int8)))
    groups = []
    for first, last in zip(edges[::2], edges[1::2]):
        members = np.sort(order[first : last + 1])
        rows = array[members]
        if rows.dtype.kind == "f":
            rows = rows + rows.dtype.type(0)
        _, inverse = np.unique(rows, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        for value in np.unique(inverse):
            group = members[inverse == value]
            if len(group) > 1:
                groups.append(group)
    if not groups:
        return [], 0
    total = int(sum(len(g) * (len(g) - 1) // 2 for g in groups))
    pairs = [
        (int(members[a]), int(members[b]))
        for members in groups
        for a in range(len(members))
        for b in range(a + 1, len(members))
    ]
    pairs.sort()
    if max_pairs is not None:
        pairs = pairs[:max_pairs]
    return pairs, total


def _check_finite_blocks(array, name):
    """`check_finite` over blocks of rows (no full-size boolean mask)."""
    row_bytes = array.dtype.itemsize * array.shape[1]
    for start, stop in _row_blocks(array.shape[0], row_bytes):
        if not np.isfinite(array[start:stop]).all():
            bad = np.argwhere(~np.isfinite(array))
            first = tuple(int(i) for i in bad[0])
            raise ValueError(
                f"Argument `{name}` must contain only finite values, but "
                f"{len(bad)} entries are NaN or inf (the first at index "
                f"{first}). Received: {name}={describe(array)}"
            )


def validate_codes(codes, name="codes"):
    """Checks a code matrix and returns it as float32.

    A code matrix holds one codeword (row) per class. It must be 2-D, finite,
    with at least one row and one column, and no two classes may share a
    codeword, since a decoder could not tell them apart.

    Args:
        codes: Array-like of shape `(num_classes, code_length)`, e.g. a NumPy
            array, a nested list or an eager tensor.
        name: The argument name used in error messages.

    Returns:
        A C-contiguous float32 `np.ndarray` of shape
        `(num_classes, code_length)`.

    Raises:
        TypeError: If `codes` is sparse or not numeric.
        ValueError: If `codes` is not 2-D, is empty, holds NaN or inf, or has
            duplicate rows (the message lists the first few class pairs).
    """
    if scipy.sparse.issparse(codes):
        raise TypeError(
            f"Argument `{name}` must be a dense array. "
            f"Received: {name}={describe(codes)}"
        )
    array = np.asarray(codes)
    if array.dtype.kind not in "biuf":
        raise TypeError(
            f"Argument `{name}` must be a numeric array of shape "
            f"(num_classes, code_length). Received: {name}={describe(codes)}"
        )
    if array.ndim != 2 or 0 in array.shape:
        raise ValueError(
            f"Argument `{name}` must be a 2-D array of shape "
            f"(num_classes, code_length) with at least one row and one "
            f"column. Received: {name}={describe(array)}"
        )
    # Duplicates are checked after the cast: rows that differ only beyond
    # float32 precision are identical for the float32 model.
    # Converted once (no copy when it already is C-contiguous float32);
    # the checks below work block by block on this one array.
    array = np.ascontiguousarray(array, dtype=np.float32)
    _check_finite_blocks(array, name)
    pairs, total = duplicate_row_pairs(array, max_pairs=5)
    if total:
        listed = ", ".join(f"{i} and {j}" for i, j in pairs)
        more = f" ({total} duplicate pairs in total)" if total > len(pairs) else ""
        raise ValueError(
            f"Argument `{name}` must give every class a distinct codeword "
            f"(row), but classes {listed} have identical codewords and "
            f"cannot be told apart{more}. "
            f"Received: {name}={describe(array)}"
        )
    return array
