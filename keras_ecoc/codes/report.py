"""A quality summary of a code matrix."""

import numpy as np

from keras_ecoc.codes._validation import as_float_matrix
from keras_ecoc.codes._validation import check_int
from keras_ecoc.codes._validation import duplicate_row_pairs

# Rows per block in the pairwise computations; bounds the (block, n) work
# arrays to a few tens of MiB for n in the thousands.
_BLOCK_ROWS = 512


class CodeReport(dict):
    """The result of `report`: a plain `dict` with a readable `str()`.

    Keys are described in `report`. `to_dict()` returns a plain `dict` with
    only built-in types (lists instead of arrays), ready for JSON.
    """

    def to_dict(self):
        """Returns a plain `dict` of built-in types (JSON-serializable)."""
        out = {}
        for key, value in self.items():
            if isinstance(value, np.ndarray):
                value = value.tolist()
            elif isinstance(value, list):
                value = [list(pair) for pair in value]
            out[key] = value
        return out

    def __str__(self):
        def number(value, digits=4):
            return "n/a" if value is None else f"{value:.{digits}g}"

        balance = self["column_balance"]
        if self["num_duplicate_pairs"]:
            shown = ", ".join(f"{i}-{j}" for i, j in self["duplicate_pairs"][:5])
            duplicates = f"{self['num_duplicate_pairs']} ({shown}"
            duplicates += ", ...)" if self["num_duplicate_pairs"] > 5 else ")"
        else:
            duplicates = "none"
        lines = [
            f"CodeReport: {self['num_classes']} classes x "
            f"{self['code_length']} columns",
            f"  row distance (Euclidean): min {number(self['min_distance'])}, "
            f"mean {number(self['mean_distance'])}",
            f"  min row Hamming distance: "
            f"{number(self['min_hamming_distance'])}",
            f"  duplicate row pairs:      {duplicates}",
            f"  column balance (> 0):     min {balance.min():.3f}, "
            f"mean {balance.mean():.3f}, max {balance.max():.3f}",
            f"  constant columns:         {self['num_constant_columns']}",
            f"  max |column correlation|: "
            f"{number(self['max_column_correlation'], 3)}",
        ]
        return "\n".join(lines)

    def __repr__(self):
        return f"CodeReport({dict.__repr__(self)})"


def report(codes, max_pairs=100):
    """Summarizes how well a code matrix separates the classes.

    All pairwise quantities are computed in row blocks with matrix products,
    so a few thousand classes take well under a second of arithmetic.

    Args:
        codes: float array of shape `(num_classes, code_length)`.
        max_pairs: Most duplicate pairs to list, a non-negative integer.

    Returns:
        A `CodeReport` (a `dict`) with keys:

        - `"num_classes"`, `"code_length"`: the shape.
        - `"min_distance"`, `"mean_distance"`: minimum and mean Euclidean
          distance over all pairs of rows (`None` for a single class).
        - `"min_hamming_distance"`: minimum number of differing entries over
          pairs of rows, for codes whose entries are all in {-1, 0, 1}
          (binary, +-1 or ternary codes); `None` otherwise.
        - `"duplicate_pairs"`: list of up to `max_pairs` `(i, j)` tuples
          (`i < j`) of classes with identical rows;
          `"num_duplicate_pairs"`: their total number.
        - `"column_balance"`: float64 array `(code_length,)`, the fraction of
          positive entries in each column.
        - `"num_constant_columns"`: columns with a single value.
        - `"max_column_correlation"`: the largest absolute Pearson
          correlation between two non-constant columns (`None` if there are
          fewer than two).

    Raises:
        TypeError: If `codes` is not numeric.
        ValueError: If `codes` is not 2-D, is empty, or holds NaN or inf.
    """
    codes = as_float_matrix(codes, "codes")
    max_pairs = check_int(max_pairs, "max_pairs", minimum=0)
    n, k = codes.shape
    pairs, num_pairs = duplicate_row_pairs(codes, max_pairs=max_pairs)

    min_distance = mean_distance = min_hamming = None
    if n > 1:
        min_squared, sum_distance = _euclidean_summary(codes)
        # Identical rows give exact zeros, not the expansion's round-off.
        min_distance = 0.0 if num_pairs else float(np.sqrt(min_squared))
        mean_distance = float(sum_distance / (n * (n - 1) / 2))
        if np.isin(codes, (-1.0, 0.0, 1.0)).all():
            min_hamming = int(_min_hamming(codes))

    spread = codes.max(axis=0) - codes.min(axis=0)
    varying = spread > 0
    max_correlation = None
    if varying.sum() >= 2:
        centered = codes[:, varying] - codes[:, varying].mean(axis=0)
        unit = centered / np.linalg.norm(centered, axis=0)
        correlation = np.abs(unit.T @ unit)
        np.fill_diagonal(correlation, 0.0)
        max_correlation = float(min(correlation.max(), 1.0))

    return CodeReport(
        num_classes=n,
        code_length=k,
        min_distance=min_distance,
        mean_distance=mean_distance,
        min_hamming_distance=min_hamming,
        duplicate_pairs=pairs,
        num_duplicate_pairs=num_pairs,
        column_balance=(codes > 0).mean(axis=0),
        num_constant_columns=int((~varying).sum()),
        max_column_correlation=max_correlation,
    )


def _upper_blocks(n):
    """Yields `(start, stop, mask)`: row blocks and their `j > i` masks."""
    columns = np.arange(n)
    for start in range(0, n - 1, _BLOCK_ROWS):
        stop = min(start + _BLOCK_ROWS, n)
        yield start, stop, columns[None, :] > np.arange(start, stop)[:, None]


def _euclidean_summary(codes):
    """Returns (min squared distance, sum of distances) over pairs i < j."""
    squared = np.einsum("ij,ij->i", codes, codes)
    minimum, total = np.inf, 0.0
    for start, stop, upper in _upper_blocks(len(codes)):
        gram = codes[start:stop] @ codes.T
        distance2 = squared[start:stop, None] + squared[None, :] - 2.0 * gram
        distance2 = np.maximum(distance2, 0.0)[upper]
        minimum = min(minimum, distance2.min())
        total += np.sqrt(distance2).sum()
    return minimum, total


def _min_hamming(codes):
    """Minimum number of differing entries over pairs, entries in {-1,0,1}."""
    k = codes.shape[1]
    indicators = [(codes == value).astype(np.float64) for value in (-1, 0, 1)]
    minimum = np.inf
    for start, stop, upper in _upper_blocks(len(codes)):
        agreements = sum(ind[start:stop] @ ind.T for ind in indicators)
        minimum = min(minimum, (k - agreements)[upper].min())
    return round(minimum)
