"""`ECOCLoss`: softmax cross-entropy of ECOC-decoded outputs.

The code-matrix handling it shares with the metrics is `CodesSource`
(`_codes_source.py`); the conversion of labels and z, `_loss_inputs.py`.
"""

import warnings

import keras
from keras import ops

# `Loss.__call__` converts y_true to the loss dtype before `call`, which
# would turn integer labels into bfloat16/float16 values (777 -> 776 in
# bfloat16); `ECOCLoss.__call__` replaces it and reuses Keras' own mask
# lookup and reduction (both private, both in Keras since 3.10, the oldest
# release this package supports).
from keras.src.backend import get_keras_mask
from keras.src.losses.loss import reduce_weighted_values

from keras_ecoc import _validation
from keras_ecoc import ops as ecoc_ops
from keras_ecoc._codes_source import CodesSource
from keras_ecoc._codes_source import codes_from_config
from keras_ecoc._codes_source import codes_in_program
from keras_ecoc._loss_inputs import float_outputs
from keras_ecoc._loss_inputs import labels_for
from keras_ecoc._loss_inputs import labels_tensor


def ecoc_cross_entropy(y_true, y_pred, codes, scale=1.0):
    """Per-example ECOC cross-entropy, Keras loss-function style.

    Exactly -log softmax(-1/2 * scale * ||M_i - u||^2)_y with u = z / ||z||.
    On the TensorFlow backend this runs the fused op when it is available
    (see `keras_ecoc.ops.fused_status()`), which never forms the
    (batch, num_classes) logits; elsewhere the pure-Keras math.

    Args:
        y_true: integer class ids of shape (batch,) or (batch, 1). Integer
            labels never pass through a float dtype; float labels must hold
            whole numbers.
        y_pred: z, the network's k outputs, of shape (batch, k).
        codes: (num_classes, k) code matrix: a nested list, an array or a
            tensor (validated: 2-D, finite, distinct rows), or a variable such
            as `ECOCDecoder.codes` (checked for rank only).
        scale: positive finite float, or a scalar tensor, multiplying the
            logits.

    Returns:
        float32 tensor of shape (batch,).
    """
    codes = _validation.function_codes(codes)
    scale = _validation.function_scale(scale)
    return _cross_entropy(y_true, y_pred, codes, scale)


def _cross_entropy(y_true, y_pred, codes, scale):
    # Codes and scale already validated (by the caller or by their layer):
    # this is the unchecked path every call of the loss takes.
    num_classes, code_length = (int(d) for d in codes.shape)
    y_true = labels_tensor(y_true, num_classes)
    y_pred = float_outputs(y_pred)
    _validation.check_code_length(tuple(y_pred.shape), code_length, "y_pred")
    labels = labels_for(y_true, y_pred)
    return ecoc_ops._cross_entropy_checked(
        labels, y_pred, codes_in_program(codes, y_pred), scale,
        num_classes, code_length,
    )


@keras.saving.register_keras_serializable(package="keras_ecoc")
class ECOCLoss(CodesSource, keras.losses.Loss):
    """Cross-entropy of ECOC outputs against integer class labels.

    The model's last layer emits z with k = code_length units (no decoder
    layer needed); the loss decodes z against the codes and applies softmax
    cross-entropy. This is the memory-efficient way to train with many
    classes: on TensorFlow with the fused op, the (batch, num_classes) logits
    are never materialized, in the forward or the backward pass.

    Labels stay integers whatever `dtype` is: unlike other Keras losses,
    `y_true` is not converted to the loss dtype (float16 is exact only up to
    2,048, bfloat16 up to 256). The ECOC math is float32; `dtype` applies to
    the reduced loss.

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
        dtype: dtype of the reduced loss (float32 by default).
        decoder: an `ECOCDecoder` to follow instead of `codes` (see
            `from_decoder`), or, in a config, the name of that layer.

    Call arguments:
        y_true: integer class ids of shape (batch,) or (batch, 1).
        y_pred: z of shape (batch, code_length).
    """

    def __init__(
        self,
        codes=None,
        scale=1.0,
        reduction="sum_over_batch_size",
        name="ecoc_loss",
        dtype=None,
        decoder=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self._init_codes(codes, decoder)
        self._fixed_scale = _validation.positive_scale(scale)

    @classmethod
    def from_decoder(cls, decoder, **kwargs):
        """An `ECOCLoss` that reads codes and scale from an `ECOCDecoder`.

        The loss follows the decoder's weights, so a learnable scale is
        trained through this loss, and the codes are stored once, in the
        decoder's weights.
        """
        return cls(scale=float(decoder.initial_scale), decoder=decoder, **kwargs)

    @property
    def scale(self):
        """The decoder's (possibly learned) scale, or the fixed one."""
        if self._decoder is not None:
            return self._decoder.scale
        return self._fixed_scale

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Keras' Loss.__call__ minus its conversion of y_true (and z) to the
        # loss dtype: labels stay integers, z keeps its float dtype. The mask
        # is looked up as Keras does: a JAX array holds no attribute, and its
        # mask sits in Keras' table (a `_keras_mask` attribute is not there).
        in_mask = get_keras_mask(y_pred)
        with keras.name_scope(self.name):
            losses = self.call(y_true, y_pred)
            return reduce_weighted_values(
                losses,
                sample_weight=sample_weight,
                mask=in_mask,
                reduction=self.reduction,
                dtype=self.dtype,
            )

    # Restored from the config of a loss that followed a decoder's learnable
    # scale and not bound again: it trains with a frozen copy of that scale.
    _follows_learnable_scale = False
    _warned_unbound = False

    def call(self, y_true, y_pred):
        if self._decoder is None and self._follows_learnable_scale:
            self._warn_unbound_scale()
        return _cross_entropy(y_true, y_pred, self.codes, self.scale)

    def _warn_unbound_scale(self):
        if self._warned_unbound:
            return
        self._warned_unbound = True
        warnings.warn(
            f"This ECOCLoss ({self.name!r}) was saved following the learnable "
            f"scale of the ECOCDecoder {self.decoder_name!r}. Reloaded outside "
            "`ECOCClassifier` it is not bound to that layer: it uses the scale "
            f"it was saved with ({self._fixed_scale:.6g}) as a constant, and "
            "the decoder's scale no longer trains. Bind it with "
            f"`loss.bind(model.get_layer({self.decoder_name!r}))`.",
            stacklevel=3,
        )

    def get_config(self):
        config = super().get_config()
        scale = self._fixed_scale
        follows = self._follows_learnable_scale
        if self._decoder is not None:
            scale = float(ops.convert_to_numpy(self._decoder.scale))
            follows = bool(self._decoder.learnable_scale)
        config.update(self._codes_config())
        config["scale"] = scale
        if follows:
            config["follows_learnable_scale"] = True
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        follows = bool(config.pop("follows_learnable_scale", False))
        loss = cls(**codes_from_config(config))
        loss._follows_learnable_scale = follows and loss.decoder_name is not None
        return loss
