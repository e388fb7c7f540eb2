"""`ECOCClassifier`: a backbone plus a k-unit ECOC head, ready to compile."""

import warnings

import keras
import numpy as np
from keras import ops

from keras_ecoc import ops as ecoc_ops
from keras_ecoc.layers import ECOCDecoder
from keras_ecoc.losses import ECOCLoss
from keras_ecoc.metrics import ECOCAccuracy

POOLING_MODES = ("avg", "max", "flatten", None)

# Defaults chosen by measurement (README, "Codeword norms and the scale"):
# Omniglot (292 labels, before the loader merged its 50 repeated classes),
# 32-bit Gaussian codes with equal row norms, batch 16, 3 epochs. Test accuracy: fixed scale 1 (the paper's decoding) 18.0%,
# learnable from 1 17.7%, learnable from 2 15.3%, fixed 4 9.6%; learnable
# scales drifted down (8 -> 4.5, 3 -> 1.8). Scale 1 is kept, learnable so it
# adapts to codes whose norms differ from sqrt(k).
DEFAULT_SCALE = 1.0
DEFAULT_LEARNABLE_SCALE = True


@keras.saving.register_keras_serializable(package="keras_ecoc")
class ECOCClassifier(keras.Model):
    """An image (or any-input) classifier trained through ECOC output codes.

    Mirrors keras-hub's `ImageClassifier(backbone=..., num_classes=...)`: the
    backbone's features are pooled, passed through optional dropout and a
    Dense layer with `code_length` units that emits z. Training uses
    `ECOCLoss` on z, so with the fused TensorFlow op the (batch, num_classes)
    logits never exist; `predict` returns class probabilities and
    `predict_classes` the nearest-codeword class ids.

    Example:

    ```python
    codes = keras_ecoc.codes.gaussian(num_classes=200, code_length=50, seed=0)
    backbone = keras.applications.ResNet50(include_top=False, weights=None,
                                           input_shape=(224, 224, 3))
    model = keras_ecoc.ECOCClassifier(backbone, codes)
    model.compile()          # Adam, ECOCLoss, ECOCAccuracy
    model.fit(train_ds, validation_data=val_ds, epochs=10)
    probabilities = model.predict(images)      # (batch, 200)
    ```

    Args:
        backbone: a Keras model with defined inputs (Functional or built
            Sequential) returning features of shape (batch, d) or
            (batch, ..., d).
        codes: array-like (num_classes, code_length) code matrix.
        scale: positive float, initial inverse temperature of the decoding.
        learnable_scale: bool, learn log(scale) jointly with the network.
        pooling: `"avg"` (default), `"max"` or `"flatten"` for backbones
            with spatial outputs, or None to require 2-D features.
        dropout: dropout rate before the projection, in [0, 1).
        head_dtype: dtype policy of the projection; float32 by default, so
            the k outputs keep full precision under mixed precision.
        **kwargs: `keras.Model` keyword arguments (`name`, ...).
    """

    def __init__(
        self,
        backbone,
        codes,
        scale=DEFAULT_SCALE,
        learnable_scale=DEFAULT_LEARNABLE_SCALE,
        pooling="avg",
        dropout=0.0,
        head_dtype="float32",
        **kwargs,
    ):
        if not isinstance(backbone, keras.Model) or not getattr(
            backbone, "inputs", None
        ):
            raise ValueError(
                "Argument `backbone` must be a Keras model with defined "
                "inputs (a Functional model or a Sequential model that "
                f"starts with `keras.Input`). Received: backbone={backbone!r}"
            )
        if pooling not in POOLING_MODES:
            raise ValueError(
                f"Argument `pooling` must be one of {POOLING_MODES}. "
                f"Received: pooling={pooling!r}"
            )
        if not (isinstance(dropout, (int, float)) and 0 <= dropout < 1):
            raise ValueError(
                "Argument `dropout` must be a float in [0, 1). "
                f"Received: dropout={dropout!r}"
            )
        # === Layers ===
        decoder = ECOCDecoder(
            codes,
            scale=scale,
            learnable_scale=learnable_scale,
            name="ecoc_decoder",
        )
        decoder.build((None, decoder.code_length))
        projection = keras.layers.Dense(
            decoder.code_length, dtype=head_dtype, name="ecoc_projection"
        )
        # === Functional model ===
        inputs = backbone.inputs
        features = backbone(inputs[0] if len(inputs) == 1 else inputs)
        if len(features.shape) > 2:
            if pooling is None:
                raise ValueError(
                    "The backbone returns features of shape "
                    f"{tuple(features.shape)}; pass `pooling='avg'`, 'max' or "
                    "'flatten' to reduce them to (batch, d). Received: "
                    "pooling=None"
                )
            features = _pooling_layer(pooling, len(features.shape))(features)
        if dropout:
            features = keras.layers.Dropout(dropout, name="ecoc_dropout")(
                features
            )
        z = projection(features)
        super().__init__(inputs=inputs, outputs=z, **kwargs)
        self.backbone = backbone
        self.decoder = decoder
        self.projection = projection
        # === Config ===
        self.pooling = pooling
        self.dropout = dropout
        self.head_dtype = head_dtype

    @property
    def codes(self):
        """The (num_classes, code_length) code matrix (a non-trainable weight)."""
        return self.decoder.codes

    @property
    def num_classes(self):
        return self.decoder.num_classes

    @property
    def code_length(self):
        return self.decoder.code_length

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        *,
        metrics="auto",
        **kwargs,
    ):
        """Compiles with ECOC defaults.

        Args:
            optimizer: `"auto"` = Adam with learning rate 1e-3.
            loss: `"auto"` = `ECOCLoss.from_decoder(self.decoder)`, which
                trains the learnable scale too.
            metrics: `"auto"` = `[ECOCAccuracy(codes)]`.
            **kwargs: the rest of `keras.Model.compile` (`jit_compile`, ...).
        """
        if optimizer == "auto":
            optimizer = keras.optimizers.Adam(1e-3)
        if loss == "auto":
            loss = ECOCLoss.from_decoder(self.decoder)
        if metrics == "auto":
            metrics = [ECOCAccuracy(self.decoder._current_codes())]
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def compile_from_config(self, config):
        # Called when a saved model is loaded. The loss is re-attached to the
        # decoder so that a learnable scale keeps training.
        config = keras.saving.deserialize_keras_object(config)
        loss = config.get("loss")
        if isinstance(loss, ECOCLoss):
            config["loss"] = ECOCLoss.from_decoder(
                self.decoder, reduction=loss.reduction, name=loss.name
            )
        self.compile(**config)
        if self.optimizer is not None and self.built:
            self.optimizer.build(self.trainable_variables)

    def decode(self, z, output="probabilities"):
        """Decodes z (batch, code_length) into probabilities or logits."""
        logits = self.decoder(z)
        if output == "logits":
            return logits
        if output == "probabilities":
            return ops.softmax(logits, axis=-1)
        raise ValueError(
            "Argument `output` must be 'probabilities' or 'logits'. "
            f"Received: output={output!r}"
        )

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
        """Class probabilities of shape (num_samples, num_classes).

        The network's raw k outputs come from `predict_codes`.
        """
        z = self.predict_codes(x, batch_size, verbose, steps, callbacks)
        return self._decode_in_chunks(z, lambda chunk: self.decode(chunk))

    def predict_codes(
        self, x, batch_size=None, verbose="auto", steps=None, callbacks=None
    ):
        """The network outputs z, shape (num_samples, code_length)."""
        return super().predict(
            x, batch_size=batch_size, verbose=verbose, steps=steps,
            callbacks=callbacks,
        )

    def predict_classes(
        self, x, batch_size=None, verbose="auto", steps=None, callbacks=None
    ):
        """Nearest-codeword class ids, shape (num_samples,), int."""
        z = self.predict_codes(x, batch_size, verbose, steps, callbacks)
        return self._decode_in_chunks(
            z, lambda chunk: ecoc_ops.nearest_codeword(chunk, self.decoder.codes)
        )

    def _decode_in_chunks(self, z, fn, chunk=1024):
        # Decoding all of z at once would form (num_samples, num_classes)
        # intermediates on the device; chunks bound that.
        parts = [
            ops.convert_to_numpy(fn(ops.convert_to_tensor(z[i : i + chunk])))
            for i in range(0, len(z), chunk)
        ]
        return np.concatenate(parts, axis=0)

    def get_config(self):
        decoder_config = self.decoder.get_config()
        config = {
            "name": self.name,
            "trainable": self.trainable,
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "scale": decoder_config["scale"],
            "learnable_scale": self.decoder.learnable_scale,
            "pooling": self.pooling,
            "dropout": self.dropout,
            "head_dtype": self.head_dtype,
        }
        if "codes" in decoder_config:
            config["codes"] = decoder_config["codes"]
        else:
            config["codes"] = {
                "num_classes": self.num_classes,
                "code_length": self.code_length,
            }
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(
            config["backbone"]
        )
        codes = config["codes"]
        if isinstance(codes, dict) and "num_classes" in codes:
            # Too large for the config: a NaN placeholder of the right shape
            # that the saved weights overwrite (see layers.ECOCDecoder).
            config["codes"] = np.full(
                (codes["num_classes"], codes["code_length"]), np.nan, "float32"
            )
            return cls._from_placeholder(config)
        return cls(**config)

    @classmethod
    def _from_placeholder(cls, config):
        placeholder = config.pop("codes")
        # Distinct rows so validation passes; the weights replace them.
        config["codes"] = np.arange(placeholder.size, dtype="float32").reshape(
            placeholder.shape
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the placeholder's own norms
            model = cls(**config)
        model.decoder.codes.assign(placeholder)
        return model


def _pooling_layer(pooling, rank):
    if pooling == "flatten":
        return keras.layers.Flatten(name="ecoc_pooling")
    spatial = {3: "1D", 4: "2D", 5: "3D"}.get(rank)
    if spatial is None:
        raise ValueError(
            f"Cannot pool backbone features of rank {rank}; expected rank "
            f"3, 4 or 5. Received: pooling={pooling!r}"
        )
    prefix = "GlobalAveragePooling" if pooling == "avg" else "GlobalMaxPooling"
    return getattr(keras.layers, prefix + spatial)(name="ecoc_pooling")
