"""`ECOCClassifier`: a backbone plus a k-unit ECOC head, ready to compile."""

import keras
import numpy as np
from keras import ops

from keras_ecoc import ops as ecoc_ops
from keras_ecoc._codes_source import CodesSource
from keras_ecoc.layers import ECOCDecoder
from keras_ecoc.losses import ECOCLoss
from keras_ecoc.metrics import ECOCAccuracy

POOLING_MODES = ("avg", "max", "flatten", None)

# Defaults chosen by measurement (docs/results.md, E1, E5, E6; README,
# "Codeword norms and the scale"): under the paper's protocol (fc7 + fc8
# retrained on pretrained features, Omniglot, k = 0.16 n, 5-10 paired seeds)
# the paper's fixed scale 1 beat a learnable scale under SGD at batch 16
# (spectral codes, 112 classes: test 71.8 vs 69.6%, validation AUC 65.9 vs
# 61.1; 242 classes: 73.0 vs 70.9%), because a learned scale drifts up to
# ~10-23 under SGD, and made no difference under Adam (E5). So the scale is
# fixed at 1 unless the user asks to learn it.
DEFAULT_SCALE = 1.0
DEFAULT_LEARNABLE_SCALE = False


@keras.saving.register_keras_serializable(package="keras_ecoc")
class ECOCClassifier(keras.Model):
    """An image (or any-input) classifier trained through ECOC output codes.

    Mirrors keras-hub's `ImageClassifier(backbone=..., num_classes=...)`: the
    backbone's features are pooled, passed through optional dropout and a
    Dense layer with `code_length` units that emits z. Training uses
    `ECOCLoss` on z, so with the fused TensorFlow op the (batch, num_classes)
    logits never exist.

    The model's output is z, everywhere, as for any Keras model: `model(x)`,
    `predict` (also `predict_codes`), `fit`, `evaluate` (loss and metrics
    score z) and `export` all see the (batch, code_length) outputs.
    Decoded outputs have their own methods: `predict_proba` gives class
    probabilities, `predict_classes` nearest-codeword class ids, and
    `serving_model()` a Keras model from inputs to class probabilities (or
    logits) to export for serving.

    Example:

    ```python
    codes = keras_ecoc.codes.gaussian(num_classes=200, code_length=50, seed=0)
    backbone = keras.applications.ResNet50(include_top=False, weights=None,
                                           input_shape=(224, 224, 3))
    model = keras_ecoc.ECOCClassifier(backbone, codes)
    model.compile()          # Adam, ECOCLoss, ECOCAccuracy
    model.fit(train_ds, validation_data=val_ds, epochs=10)
    probabilities = model.predict_proba(images)   # (batch, 200)
    labels = model.predict_classes(images)        # (batch,)
    model.serving_model().export("ecoc_serving")  # x -> probabilities
    ```

    Args:
        backbone: a Keras model with defined inputs (Functional or built
            Sequential) returning features of shape (batch, d) or
            (batch, ..., d).
        codes: array-like (num_classes, code_length) code matrix (or, in a
            config too large to carry it, `{"num_classes": n,
            "code_length": k}`: the codes then come from the saved weights).
        scale: positive float, initial inverse temperature of the decoding.
        learnable_scale: bool, learn log(scale) jointly with the network
            (default False: the paper's fixed scale, which trained faster
            under SGD; docs/results.md, E5).
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
        if isinstance(codes, dict) and "num_classes" in codes:
            # Rebuilt from a config: the saved weights hold the codes (NaN
            # until they are loaded, so nothing decodes to a valid class).
            decoder = ECOCDecoder(
                num_classes=codes["num_classes"],
                code_length=codes["code_length"],
                scale=scale,
                learnable_scale=learnable_scale,
                name="ecoc_decoder",
            )
        else:
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
        # A single input is passed as a tensor, not a one-element list, so
        # that model(x), predict and exported signatures take x itself.
        super().__init__(
            inputs=inputs[0] if len(inputs) == 1 else inputs, outputs=z, **kwargs
        )
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
            metrics: `"auto"` = `[ECOCAccuracy.from_decoder(self.decoder)]`.
            **kwargs: the rest of `keras.Model.compile` (`jit_compile`, ...).

        Losses and metrics made with `from_decoder(self.decoder)` keep no copy
        of the codes: the decoder's weights are their only stored copy, so a
        saved model's config stays small whatever the number of classes.
        """
        if isinstance(optimizer, str) and optimizer == "auto":
            optimizer = keras.optimizers.Adam(1e-3)
        if isinstance(loss, str) and loss == "auto":
            loss = ECOCLoss.from_decoder(self.decoder)
        if isinstance(metrics, str) and metrics == "auto":
            metrics = [ECOCAccuracy.from_decoder(self.decoder)]
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    def compile_from_config(self, config):
        # Called when a saved model is loaded: ECOC losses and metrics that
        # followed the decoder are bound to it again (their config refers to
        # it by name), so a learnable scale keeps training and the codes come
        # from the loaded weights.
        # On JAX a bound metric shares the decoder's codes array until its
        # first train or test function (`_own_codes_for_steps`): the weights
        # load that follows then holds two code matrices (the decoder's and
        # Keras' in-memory read of the weights file), not three.
        config = keras.saving.deserialize_keras_object(config)
        for value in keras.tree.flatten(
            [config.get("loss"), config.get("metrics"),
             config.get("weighted_metrics")]
        ):
            if isinstance(value, CodesSource) and value.decoder_name is not None:
                value.bind(self.decoder, share_until_used=True)
        self.compile(**config)
        if self.optimizer is not None and self.built:
            self.optimizer.build(self.trainable_variables)

    def make_train_function(self, force=False):
        self._own_codes_for_steps()
        return super().make_train_function(force=force)

    def make_test_function(self, force=False):
        self._own_codes_for_steps()
        return super().make_test_function(force=force)

    def _own_codes_for_steps(self):
        # A compiled JAX step donates every state buffer, so no metric may
        # still share the decoder's codes array (see `compile_from_config`).
        for follower in list(self.decoder._codes_followers):
            follower._own_codes()

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
        """The network outputs z, shape (num_samples, code_length).

        As for every Keras model, `predict` batches `model(x)`. Class
        probabilities come from `predict_proba`, class ids from
        `predict_classes`. Zero samples give an empty (0, code_length) array.
        """
        if _num_samples(x) == 0:
            return np.zeros((0, self.code_length), "float32")
        return super().predict(
            x, batch_size=batch_size, verbose=verbose, steps=steps,
            callbacks=callbacks,
        )

    def predict_codes(
        self, x, batch_size=None, verbose="auto", steps=None, callbacks=None
    ):
        """The network outputs z, shape (num_samples, code_length).

        The same as `predict`, under a name that says what it returns.
        """
        return self.predict(x, batch_size, verbose, steps, callbacks)

    def predict_proba(
        self, x, batch_size=None, verbose="auto", steps=None, callbacks=None
    ):
        """Class probabilities, shape (num_samples, num_classes), float32.

        Rows with a non-finite z are NaN.
        """
        z = self.predict(x, batch_size, verbose, steps, callbacks)
        return self._decode_in_chunks(
            z, lambda chunk: self.decode(chunk), (self.num_classes,), "float32"
        )

    def predict_classes(
        self, x, batch_size=None, verbose="auto", steps=None, callbacks=None
    ):
        """Nearest-codeword class ids, shape (num_samples,), int32.

        -1 for rows with a non-finite z (never a valid class).
        """
        z = self.predict(x, batch_size, verbose, steps, callbacks)
        return self._decode_in_chunks(
            z,
            lambda chunk: ecoc_ops.nearest_codeword(chunk, self.decoder.codes),
            (),
            "int32",
        )

    def serving_model(self, output="probabilities"):
        """A Keras model from this model's inputs to decoded class scores.

        It shares this model's layers and weights (nothing is copied) and
        ends in an `ECOCDecoder` with the same codes and scale, so it is the
        model to export for serving, e.g. on TensorFlow
        `classifier.serving_model().export(path, format="tf_saved_model")`.

        Args:
            output: `"probabilities"` (default), `"logits"` or
                `"log_probabilities"`.

        Returns:
            A functional `keras.Model`: inputs -> (batch, num_classes).
        """
        from keras_ecoc import layers  # noqa: PLC0415

        if output not in layers.OUTPUT_MODES:
            raise ValueError(
                f"Argument `output` must be one of {layers.OUTPUT_MODES}. "
                f"Received: output={output!r}"
            )
        # The graph of this model's own layers (backbone, pooling, dropout,
        # projection), extended by its decoder: the same layer objects, so
        # nothing is copied, and a Functional model of registered layers
        # that saves, reloads and clones by itself (a node wrapping this
        # whole model would track the decoder twice, and a reload would
        # split it in two).
        scores = self.decoder(self.outputs[0])
        if output == "probabilities":
            scores = keras.layers.Softmax(dtype="float32", name="probabilities")(scores)
        elif output == "log_probabilities":
            scores = keras.layers.Activation(
                "log_softmax", dtype="float32", name="log_probabilities")(scores)
        inputs = self.inputs[0] if len(self.inputs) == 1 else self.inputs
        return keras.Model(inputs=inputs, outputs=scores, name=f"{self.name}_serving")

    def _decode_in_chunks(self, z, fn, tail_shape, dtype, chunk=1024):
        # Decoding all of z at once would form (num_samples, num_classes)
        # intermediates on the device; chunks bound that.
        parts = [
            ops.convert_to_numpy(fn(ops.convert_to_tensor(z[i : i + chunk])))
            for i in range(0, len(z), chunk)
        ]
        if not parts:
            return np.zeros((0,) + tuple(tail_shape), dtype)
        return np.concatenate(parts, axis=0).astype(dtype, copy=False)

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
        return cls(**config)


def _num_samples(x):
    """Number of samples of array-like inputs (None for datasets etc.)."""
    first = keras.tree.flatten(x)[0] if isinstance(x, (list, tuple, dict)) else x
    shape = getattr(first, "shape", None)
    if shape is None or len(shape) == 0 or shape[0] is None:
        return None
    return int(shape[0])


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
