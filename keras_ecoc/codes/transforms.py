"""Transformations of existing code matrices."""

import numbers

import numpy as np

from keras_ecoc.codes._validation import as_float_matrix
from keras_ecoc.codes._validation import describe
from keras_ecoc.codes._validation import format_list


def normalize_rows(codes, norm=None):
    """Rescales every codeword (row) to the same Euclidean norm.

    The decoders compare codewords with `z / |z|` on the unit sphere, where
    a codeword with a larger norm pays a larger constant penalty; equal row
    norms remove that bias. Each row keeps its direction.

    Args:
        codes: float array of shape `(num_classes, code_length)`.
        norm: Target norm, a positive float. Defaults to
            `sqrt(code_length)`, the norm of a +-1 codeword, so that entries
            keep unit mean square.

    Returns:
        float32 `np.ndarray` of shape `(num_classes, code_length)` whose
        rows all have norm `norm`.

    Raises:
        TypeError: If `codes` is not numeric.
        ValueError: If `codes` is not 2-D or holds NaN or inf, if a row is
            all zeros (no direction to keep; the message names the classes),
            or if `norm` is not a positive finite number.
    """
    codes = as_float_matrix(codes, "codes")
    if norm is None:
        norm = np.sqrt(codes.shape[1])
    elif (
        isinstance(norm, (bool, np.bool_))
        or not isinstance(norm, numbers.Real)
        or not np.isfinite(norm)
        or norm <= 0
    ):
        raise ValueError(
            f"Argument `norm` must be a positive finite float or None. "
            f"Received: norm={describe(norm)}"
        )
    lengths = np.linalg.norm(codes, axis=1)
    zero = np.flatnonzero(lengths == 0)
    if len(zero):
        raise ValueError(
            f"Argument `codes` has all-zero codewords for classes "
            f"{format_list(zero)}, which cannot be rescaled to a norm. "
            f"Received: codes={describe(codes)}"
        )
    return (codes * (float(norm) / lengths)[:, None]).astype(np.float32)
