"""Accuracy metrics that score ECOC outputs z by nearest-codeword decoding."""

import keras
import numpy as np
from keras import ops

from keras_ecoc import _validation
from keras_ecoc import ops as ecoc_ops
from keras_ecoc.losses import _labels_for


@keras.saving.register_keras_serializable(package="keras_ecoc")
class ECOCTopKAccuracy(keras.metrics.Mean):
    """How often the label is among the k nearest codewords of z / ||z||.

    Computes, for each example, how many classes decode strictly closer than
    the label (the label's rank) and counts a hit when that rank is below `k`.
    On TensorFlow with the fused op no (batch, num_classes) tensor is formed.

    Args:
        codes: array-like of shape (num_classes, code_length).
        k: how many nearest codewords count as a hit. Defaults to 5.
        name: metric name.
        dtype: metric dtype.

    Call arguments (`update_state`):
        y_true: integer class ids of shape (batch,) or (batch, 1).
        y_pred: z of shape (batch, code_length).
        sample_weight: optional (batch,) weights.
    """

    def __init__(self, codes, k=5, name="ecoc_top_k_accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.codes = _validation.codes_array(codes)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(
                f"Argument `k` must be a positive integer. Received: k={k!r}"
            )
        self.k = int(k)
        self._direction = "up"

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.convert_to_tensor(y_true)
        y_pred = ops.convert_to_tensor(y_pred)
        _validation.check_code_length(
            tuple(y_pred.shape), self.codes.shape[1], "y_pred"
        )
        labels = _labels_for(y_true, y_pred, self.codes.shape[0])
        rank = ecoc_ops.label_rank(labels, y_pred, self.codes)
        hits = ops.cast(rank < self.k, self.dtype)
        return super().update_state(hits, sample_weight=sample_weight)

    def get_config(self):
        return {
            "codes": _validation.codes_to_config(self.codes),
            "k": self.k,
            "name": self.name,
            "dtype": self.dtype,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["codes"] = _validation.codes_from_config(config["codes"])
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_ecoc")
class ECOCAccuracy(ECOCTopKAccuracy):
    """How often the nearest codeword of z / ||z|| is the label's codeword.

    Args:
        codes: array-like of shape (num_classes, code_length).
        name: metric name.
        dtype: metric dtype.
    """

    def __init__(self, codes, name="ecoc_accuracy", dtype=None):
        super().__init__(codes, k=1, name=name, dtype=dtype)

    def get_config(self):
        config = super().get_config()
        del config["k"]
        return config
