"""Accuracy metrics that score ECOC outputs z by nearest-codeword decoding."""

import keras
import numpy as np
from keras import ops

from keras_ecoc import _validation
from keras_ecoc import ops as ecoc_ops
from keras_ecoc._codes_source import CodesSource
from keras_ecoc._codes_source import codes_from_config
from keras_ecoc._codes_source import codes_in_program
from keras_ecoc._loss_inputs import float_outputs
from keras_ecoc._loss_inputs import labels_for
from keras_ecoc._loss_inputs import labels_tensor


@keras.saving.register_keras_serializable(package="keras_ecoc")
class ECOCTopKAccuracy(CodesSource, keras.metrics.Mean):
    """How often the label is among the k nearest codewords of z / ||z||.

    Computes, for each example, how many classes decode strictly closer than
    the label (the label's rank) and counts a hit when that rank is below `k`:
    classes exactly as close as the label do not push it out, as in Keras'
    `SparseTopKCategoricalAccuracy`. No (batch, num_classes) tensor is formed
    on the fused and streaming paths. A row with a non-finite z (or a
    non-finite codeword) is never a hit.

    Args:
        codes: array-like of shape (num_classes, code_length).
        k: how many nearest codewords count as a hit. Defaults to 5.
        name: metric name.
        dtype: metric dtype.
        decoder: an `ECOCDecoder` to follow instead of `codes` (see
            `from_decoder`), or, in a config, the name of that layer.

    Call arguments (`update_state`):
        y_true: integer class ids of shape (batch,) or (batch, 1).
        y_pred: z of shape (batch, code_length).
        sample_weight: optional (batch,) weights.
    """

    def __init__(
        self, codes=None, k=5, name="ecoc_top_k_accuracy", dtype=None,
        decoder=None,
    ):
        super().__init__(name=name, dtype=dtype)
        self._init_codes(codes, decoder)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(
                f"Argument `k` must be a positive integer. Received: k={k!r}"
            )
        self.k = int(k)
        self._direction = "up"

    # On JAX the codes are one of the metric's variables (see CodesSource).
    _is_metric = True

    @classmethod
    def from_decoder(cls, decoder, **kwargs):
        """A metric that scores against an `ECOCDecoder`'s codes weight.

        The codes are then stored once, in the decoder's weights.
        """
        return cls(decoder=decoder, **kwargs)

    def update_state(self, y_true, y_pred, sample_weight=None):
        # y_true is never cast to the metric dtype: labels stay integers.
        codes = self.codes
        num_classes, code_length = (int(d) for d in codes.shape)
        y_true = labels_tensor(y_true, num_classes)
        y_pred = float_outputs(y_pred)
        _validation.check_code_length(tuple(y_pred.shape), code_length, "y_pred")
        labels = labels_for(y_true, y_pred)
        hits = self._hits(
            labels, y_pred, codes_in_program(codes, y_pred), num_classes, code_length
        )
        return super().update_state(ops.cast(hits, self.dtype), sample_weight=sample_weight)

    def _hits(self, labels, z, codes, num_classes, code_length):
        rank = ecoc_ops._label_rank_checked(labels, z, codes, num_classes, code_length)
        return rank < self.k

    def get_config(self):
        config = {"k": self.k, "name": self.name, "dtype": self.dtype}
        config.update(self._codes_config())
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**codes_from_config(config))


@keras.saving.register_keras_serializable(package="keras_ecoc")
class ECOCAccuracy(ECOCTopKAccuracy):
    """How often the nearest codeword of z / ||z|| is the label's codeword.

    The nearest codeword is the one `ECOCClassifier.predict_classes` and
    `ECOCDecoder.decode` return: among codewords exactly as close, the one of
    the smallest class index, as Keras' `accuracy` takes the first argmax.
    So a z that is equally close to every codeword (z = 0, as from a dead
    network, with codewords of exactly equal norm such as +-1 codes) is a
    hit for class 0 only, not for every label as `ECOCTopKAccuracy(k=1)`
    would count it.

    Args:
        codes: array-like of shape (num_classes, code_length).
        name: metric name.
        dtype: metric dtype.
    """

    def __init__(self, codes=None, name="ecoc_accuracy", dtype=None, decoder=None):
        super().__init__(codes, k=1, name=name, dtype=dtype, decoder=decoder)

    def _hits(self, labels, z, codes, num_classes, code_length):
        return ecoc_ops._nearest_hits_checked(labels, z, codes, num_classes, code_length)

    def get_config(self):
        config = super().get_config()
        del config["k"]
        return config
