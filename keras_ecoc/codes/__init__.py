"""Output code utilities: generators, class similarities and diagnostics.

A code matrix `M` of shape `(num_classes, code_length)` gives each class a
codeword (row) that replaces its one-hot target. This package needs only
NumPy and SciPy.

Generators (float32 arrays, deterministic for a given `seed`):

- `one_hot`, `gaussian`, `hadamard`, `dense_random`, `sparse_random`:
  data-independent codes.
- `spectral`: eigenvectors of the normalized Laplacian of a class
  similarity graph built with `class_similarity` or
  `similarity_from_confusion`.
- `binarize` turns real codes into +-1; `normalize_rows` gives every
  codeword the same norm.

By name: `make_codes("spectral_median", n, k, similarity=S)` builds any of
the above from one string (`CODE_NAMES` lists them), with rows rescaled to
norm sqrt(k) by default.

Diagnostics: `report` summarizes distances, duplicates, balance and
correlation; `validate_codes` checks a code matrix (used by the layers).
"""

from keras_ecoc.codes._validation import validate_codes
from keras_ecoc.codes.random_codes import dense_random
from keras_ecoc.codes.random_codes import gaussian
from keras_ecoc.codes.random_codes import hadamard
from keras_ecoc.codes.random_codes import one_hot
from keras_ecoc.codes.random_codes import sparse_random
from keras_ecoc.codes.registry import CODE_NAMES
from keras_ecoc.codes.registry import make_codes
from keras_ecoc.codes.report import CodeReport
from keras_ecoc.codes.report import report
from keras_ecoc.codes.similarity import class_similarity
from keras_ecoc.codes.similarity import similarity_from_confusion
from keras_ecoc.codes.spectral import binarize
from keras_ecoc.codes.spectral import spectral
from keras_ecoc.codes.transforms import normalize_rows

__all__ = [
    "CODE_NAMES",
    "CodeReport",
    "binarize",
    "class_similarity",
    "dense_random",
    "gaussian",
    "hadamard",
    "make_codes",
    "normalize_rows",
    "one_hot",
    "report",
    "similarity_from_confusion",
    "sparse_random",
    "spectral",
    "validate_codes",
]
