"""`ECOCLoss`: softmax cross-entropy of ECOC-decoded outputs."""

import keras
from keras import ops

from keras_ecoc import _validation
from keras_ecoc import ops as ecoc_ops


def _labels_for(y_true, y_pred, num_classes):
    """Integer labels of shape y_pred.shape[:-1] from (...,) or (..., 1)."""
    if len(y_true.shape) == len(y_pred.shape):
        if y_true.shape[-1] not in (1, None):
            raise ValueError(
                "ECOC losses and metrics take integer class ids of shape "
                "(batch,) or (batch, 1), not one-hot targets. Received: "
                f"y_true.shape={tuple(y_true.shape)}, "
                f"y_pred.shape={tuple(y_pred.shape)}"
            )
        y_true = ops.squeeze(y_true, axis=-1)
    _validation.concrete_labels_in_range(y_true, num_classes, name="y_true")
    return ops.cast(y_true, "int32")


def ecoc_cross_entropy(y_true, y_pred, codes, scale=1.0):
    """Per-example ECOC cross-entropy, Keras loss-function style.

    Exactly -log softmax(-1/2 * scale * ||M_i - u||^2)_y with u = z / ||z||.
    On the TensorFlow backend this runs the fused op when it is available
    (see `keras_ecoc.ops.fused_status()`), which never forms the
    (batch, num_classes) logits; elsewhere the pure-Keras math.

    Args:
        y_true: integer class ids of shape (batch,) or (batch, 1).
        y_pred: z, the network's k outputs, of shape (batch, k).
        codes: (num_classes, k) code matrix (array or tensor/variable).
        scale: positive float or scalar tensor multiplying the logits.

    Returns:
        float32 tensor of shape (batch,).
    """
    num_classes, code_length = codes.shape
    _validation.check_code_length(tuple(y_pred.shape), code_length, "y_pred")
    labels = _labels_for(y_true, y_pred, num_classes)
    return ecoc_ops.ecoc_cross_entropy(labels, y_pred, codes, scale)


@keras.saving.register_keras_serializable(package="keras_ecoc")
class ECOCLoss(keras.losses.Loss):
    """Cross-entropy of ECOC outputs against integer class labels.

    The model's last layer emits z with k = code_length units (no decoder
    layer needed); the loss decodes z against the codes and applies softmax
    cross-entropy. This is the memory-efficient way to train with many
    classes: on TensorFlow with the fused op, the (batch, num_classes) logits
    are never materialized, in the forward or the backward pass.

    Example:

    ```python
    codes = keras_ecoc.codes.gaussian(num_classes=10_000, code_length=128)
    model.compile(optimizer="adam",
                  loss=keras_ecoc.ECOCLoss(codes, scale=8.0),
                  metrics=[keras_ecoc.ECOCAccuracy(codes)])
    ```

    Args:
        codes: array-like of shape (num_classes, code_length).
        scale: positive float, the inverse temperature multiplying the logits.
        reduction: as for every Keras loss: `"sum_over_batch_size"`
            (default), `"sum"`, `"mean"`, `"mean_with_sample_weight"`,
            `"none"` or `None`.
        name: optional name of the loss instance.
        dtype: dtype of the loss's computations (float32 by default; the ECOC
            math itself is always float32).

    Call arguments:
        y_true: integer class ids of shape (batch,) or (batch, 1).
        y_pred: z of shape (batch, code_length).
    """

    def __init__(
        self,
        codes,
        scale=1.0,
        reduction="sum_over_batch_size",
        name="ecoc_loss",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.codes = _validation.codes_array(codes)
        _validation.warn_if_unequal_row_norms(self.codes)
        self.scale = _validation.positive_scale(scale)
        self._decoder = None

    @classmethod
    def from_decoder(cls, decoder, **kwargs):
        """An `ECOCLoss` that reads codes and scale from an `ECOCDecoder`.

        The loss follows the decoder's weights, so a learnable scale is
        trained through this loss.
        """
        loss = cls(
            decoder._current_codes(), scale=float(decoder.initial_scale), **kwargs
        )
        loss._decoder = decoder
        return loss

    def call(self, y_true, y_pred):
        if self._decoder is not None:
            return ecoc_cross_entropy(
                y_true, y_pred, self._decoder.codes, self._decoder.scale
            )
        return ecoc_cross_entropy(y_true, y_pred, self.codes, self.scale)

    def get_config(self):
        config = super().get_config()
        scale = self.scale
        if self._decoder is not None:
            scale = float(ops.convert_to_numpy(self._decoder.scale))
        config.update({"codes": _validation.codes_to_config(self.codes), "scale": scale})
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["codes"] = _validation.codes_from_config(config["codes"])
        return cls(**config)
