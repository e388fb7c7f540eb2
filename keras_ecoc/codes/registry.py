"""Code matrices by name: the registry behind `keras_ecoc.codes.make_codes`.

One name per (generator, threshold) pair, so that a configuration file or a
command line can ask for "spectral_median" instead of calling `spectral` and
`binarize` by hand. "one_hot" is listed because it is an encoding choice, but
it has no code matrix: a one-hot model is a plain Dense(n) + softmax head.
"""

import numpy as np

from keras_ecoc.codes.random_codes import dense_random
from keras_ecoc.codes.random_codes import gaussian
from keras_ecoc.codes.random_codes import hadamard
from keras_ecoc.codes.spectral import binarize
from keras_ecoc.codes.spectral import spectral
from keras_ecoc.codes.spectral import warn_if_binarized_rows_repeat
from keras_ecoc.codes.transforms import normalize_rows as _normalize_rows

# Encoding name -> (generator family, binarization threshold). The
# "spectral*" encodings are data-based: they need a class similarity.
ENCODINGS = {
    "one_hot": None,
    "dense_random": ("dense_random", None),
    "hadamard": ("hadamard", None),
    "gaussian": ("gaussian", None),
    "gaussian_zero": ("gaussian", "zero"),
    "gaussian_median": ("gaussian", "median"),
    "spectral": ("spectral", None),
    "spectral_zero": ("spectral", "zero"),
    "spectral_median": ("spectral", "median"),
}

# The names `make_codes` accepts, sorted.
CODE_NAMES = tuple(sorted(name for name in ENCODINGS if name != "one_hot"))


def make_codes(
    encoding, num_classes, code_length, similarity=None, seed=0,
    normalize_rows=True,
):
    """Code matrix (num_classes, code_length) for an encoding name.

    Raw Gaussian and raw spectral codewords have unequal norms, which biases
    decoding against z / ||z|| (see `keras_ecoc.codes.normalize_rows`); by
    default they are rescaled to the common norm sqrt(code_length) of ±1
    codes. Thresholded and ±1 codes are unchanged by this.

    Args:
        encoding: one of `CODE_NAMES`: "dense_random", "hadamard",
            "gaussian", "gaussian_zero", "gaussian_median" (data-independent)
            or "spectral", "spectral_zero", "spectral_median" (data-based).
            The suffix names the binarization threshold (`binarize`).
        num_classes: n.
        code_length: k.
        similarity: (n, n) class similarity, required by "spectral*"
            (`class_similarity`, `similarity_from_confusion`).
        seed: random seed of the random encodings.
        normalize_rows: rescale every codeword to norm sqrt(code_length).

    Returns:
        float32 ndarray (num_classes, code_length).
    """
    if encoding not in CODE_NAMES:
        raise ValueError(
            f"Argument `encoding` must be one of {list(CODE_NAMES)}. "
            f"Received: encoding={encoding!r}"
        )
    family, threshold = ENCODINGS[encoding]
    if family == "spectral":
        if similarity is None:
            raise ValueError(
                f"Encoding {encoding!r} is data-based and needs a class "
                "similarity matrix of shape (num_classes, num_classes). "
                "Received: similarity=None"
            )
        # A dense or scipy.sparse matrix, or nested lists.
        shape = tuple(getattr(similarity, "shape", None) or np.shape(similarity))
        if shape != (num_classes, num_classes):
            raise ValueError(
                f"Argument `similarity` must be a (num_classes, num_classes) "
                f"= ({num_classes}, {num_classes}) matrix for encoding "
                f"{encoding!r}. Received: similarity with shape {shape}")
        codes = spectral(similarity, code_length, threshold=threshold)
    elif family == "gaussian":
        codes = gaussian(num_classes, code_length, seed=seed)
        if threshold is not None:
            codes = binarize(codes, threshold)
            warn_if_binarized_rows_repeat(codes, threshold, stacklevel=3)
    elif family == "hadamard":
        codes = hadamard(num_classes, code_length)
    else:
        codes = dense_random(num_classes, code_length, seed=seed)
    return _normalize_rows(codes) if normalize_rows else codes
