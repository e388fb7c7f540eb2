"""keras-ecoc: low-dimensional output codes for Keras 3 classifiers.

Replaces n-way one-hot targets with k-dimensional codewords (k << n), after
"Beyond One-hot Encoding: lower dimensional target embedding" (Rodríguez,
Bautista, Gonzàlez, Escalera). Public entry points:

- `keras_ecoc.codes`: code matrices (one-hot, dense/sparse random, Gaussian,
  Hadamard, data-based spectral codes, or any of them by name with
  `make_codes`) and class-similarity utilities.
- `ECOCDecoder`: a layer mapping z (..., k) to class logits (..., n).
- `ECOCLoss`, `ECOCAccuracy`, `ECOCTopKAccuracy`: train and score z directly.
- `ECOCClassifier`: backbone + ECOC head with compile defaults.
- `keras_ecoc.ops`: the fused TensorFlow op and its pure-Keras fallback.

This package is the library only; the demo, the experiments and their data
sets are the separate `ecoc_research` package, which this one never imports.
"""

from keras_ecoc import codes
from keras_ecoc import ops
from keras_ecoc.layers import ECOCDecoder
from keras_ecoc.losses import ECOCLoss
from keras_ecoc.losses import ecoc_cross_entropy
from keras_ecoc.metrics import ECOCAccuracy
from keras_ecoc.metrics import ECOCTopKAccuracy
from keras_ecoc.models import ECOCClassifier

__version__ = "0.1.0"

__all__ = [
    "codes",
    "ops",
    "ECOCDecoder",
    "ECOCLoss",
    "ECOCAccuracy",
    "ECOCTopKAccuracy",
    "ECOCClassifier",
    "ecoc_cross_entropy",
]
