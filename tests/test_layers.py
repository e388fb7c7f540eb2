"""ECOCDecoder: outputs, models, serialization and argument checks."""

import os

import keras
import numpy as np
import pytest
from conftest import reference_logits
from keras import ops

import keras_ecoc


def _codes(rng, num_classes=10, code_length=4):
    return rng.normal(size=(num_classes, code_length)).astype("float32")


def test_decoder_outputs_reference_logits_and_probabilities(rng):
    codes = _codes(rng)
    z = rng.normal(size=(6, 4)).astype("float32")
    logits = ops.convert_to_numpy(keras_ecoc.ECOCDecoder(codes, scale=3.0)(z))
    np.testing.assert_allclose(logits, reference_logits(z, codes, 3.0), rtol=1e-5)
    probs = ops.convert_to_numpy(
        keras_ecoc.ECOCDecoder(codes, scale=3.0, output="probabilities")(z)
    )
    expected = np.exp(reference_logits(z, codes, 3.0))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-7)


def test_decoder_holds_codes_as_non_trainable_float32_weight(rng):
    codes = _codes(rng)
    layer = keras_ecoc.ECOCDecoder(codes)
    layer.build((None, 4))
    assert [w.name for w in layer.non_trainable_weights] == ["codes"]
    assert layer.trainable_weights == []
    assert layer.codes.dtype == "float32"
    np.testing.assert_array_equal(ops.convert_to_numpy(layer.codes), codes)


def test_learnable_scale_is_a_trainable_log_scale(rng):
    layer = keras_ecoc.ECOCDecoder(_codes(rng), scale=4.0, learnable_scale=True)
    layer.build((None, 4))
    assert [w.name for w in layer.trainable_weights] == ["log_scale"]
    np.testing.assert_allclose(ops.convert_to_numpy(layer.scale), 4.0, rtol=1e-6)


def test_decoder_in_sequential_model_trains_with_sparse_crossentropy(rng):
    # The Dense layer's initial weights and fit's shuffling come from Keras's
    # global seed: without this the result depended on the tests run before
    # (0.883 in one full JAX run).
    keras.utils.set_random_seed(0)
    num_classes, code_length = 6, 4
    codes = keras_ecoc.codes.normalize_rows(keras_ecoc.codes.gaussian(num_classes, code_length, seed=1))
    x = rng.normal(size=(240, 8)).astype("float32")
    y = rng.integers(0, num_classes, size=240)
    # A separable problem: the class is a linear function of x.
    x[np.arange(240), y] += 4.0
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(code_length),
        keras_ecoc.ECOCDecoder(codes, scale=8.0),
    ])
    model.compile(
        keras.optimizers.Adam(0.05),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(x, y, epochs=15, batch_size=32, verbose=0)
    assert history.history["accuracy"][-1] > 0.9


def test_decoder_in_functional_model_has_static_output_shape(rng):
    inputs = keras.Input((3, 5))
    outputs = keras_ecoc.ECOCDecoder(_codes(rng, 7, 5))(inputs)
    assert tuple(outputs.shape) == (None, 3, 7)
    model = keras.Model(inputs, outputs)
    assert model.predict(np.ones((2, 3, 5), "float32"), verbose=0).shape == (2, 3, 7)


def test_decoder_inside_a_layer_without_build_gets_its_codes(rng):
    # A parent layer with no `build` is built by tracing its `call` in a
    # stateless scope, where Keras defers every weight's initializer: the
    # decoder's must still hold the codes when it runs.
    codes = _codes(rng, 9, 4)

    class Head(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.project = keras.layers.Dense(4)
            self.decoder = keras_ecoc.ECOCDecoder(codes, scale=2.0)

        def call(self, x):
            return self.decoder(self.project(x))

    inputs = keras.Input((5,))
    head = Head()
    model = keras.Model(inputs, head(inputs))
    np.testing.assert_array_equal(ops.convert_to_numpy(head.decoder.codes), codes)
    x = rng.normal(size=(6, 5)).astype("float32")
    z = ops.convert_to_numpy(head.project(x))
    np.testing.assert_allclose(
        model.predict(x, verbose=0), reference_logits(z, codes, 2.0), rtol=1e-5, atol=1e-6
    )


def test_decode_returns_nearest_codeword(rng):
    codes = _codes(rng, 12, 6)
    z = rng.normal(size=(30, 6)).astype("float32")
    layer = keras_ecoc.ECOCDecoder(codes)
    decoded = ops.convert_to_numpy(layer.decode(z))
    np.testing.assert_array_equal(decoded, np.argmax(reference_logits(z, codes), -1))


def test_mixed_precision_keeps_float32_decoding(rng):
    codes = _codes(rng)
    z = rng.normal(size=(5, 4)).astype("float32")
    layer = keras_ecoc.ECOCDecoder(codes, dtype="mixed_float16")
    logits = layer(ops.cast(z, "float16"))
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    np.testing.assert_allclose(
        ops.convert_to_numpy(logits), reference_logits(z.astype("float16"), codes),
        rtol=1e-3, atol=1e-3,
    )


def test_get_config_round_trip_rebuilds_identical_layer(rng):
    codes = _codes(rng)
    layer = keras_ecoc.ECOCDecoder(codes, scale=2.5, learnable_scale=True,
                                   output="log_probabilities", name="dec")
    clone = keras_ecoc.ECOCDecoder.from_config(layer.get_config())
    z = rng.normal(size=(3, 4)).astype("float32")
    np.testing.assert_allclose(ops.convert_to_numpy(layer(z)),
                               ops.convert_to_numpy(clone(z)), rtol=1e-6)
    assert clone.name == "dec" and clone.learnable_scale


def test_large_codes_live_in_weights_not_in_config(rng):
    codes = rng.normal(size=(5000, 64)).astype("float32")
    layer = keras_ecoc.ECOCDecoder(codes)
    layer.build((None, 64))
    config = layer.get_config()
    assert "codes" not in config and config["num_classes"] == 5000
    clone = keras_ecoc.ECOCDecoder.from_config(config)
    clone.build((None, 64))
    # Unloaded weights decode to NaN rather than to wrong classes.
    assert np.all(np.isnan(ops.convert_to_numpy(clone(np.ones((1, 64), "float32")))))
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(ops.convert_to_numpy(clone.codes), codes)


def test_saved_model_reloads_with_identical_predictions(rng, tmp_path):
    codes = _codes(rng, 9, 4)
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(4),
        keras_ecoc.ECOCDecoder(codes, scale=2.0, learnable_scale=True),
    ])
    x = rng.normal(size=(5, 6)).astype("float32")
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_array_equal(model.predict(x, verbose=0),
                                  restored.predict(x, verbose=0))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"codes": None}, "codes"),
        ({"codes": np.ones((3, 2))}, "codes"),  # duplicate codewords
        ({"codes": np.zeros(4)}, "codes"),
        ({"scale": 0.0}, "scale"),
        ({"scale": -1.0}, "scale"),
        ({"scale": float("nan")}, "scale"),
        ({"output": "softmax"}, "output"),
        ({"learnable_scale": "yes"}, "learnable_scale"),
    ],
)
def test_bad_decoder_arguments_raise_value_error_naming_them(rng, kwargs, match):
    arguments = {"codes": _codes(rng)}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=match):
        keras_ecoc.ECOCDecoder(**arguments)


def test_input_width_mismatch_raises_value_error(rng):
    layer = keras_ecoc.ECOCDecoder(_codes(rng, 10, 4))
    with pytest.raises(ValueError, match="code length 4"):
        layer(np.ones((2, 5), "float32"))
    with pytest.raises(ValueError, match="code length 4"):
        keras.Sequential([keras.Input((5,)), layer])


def test_unequal_codeword_norms_warn_and_equal_norms_do_not(rng):
    raw = rng.normal(size=(20, 8)).astype("float32")
    with pytest.warns(UserWarning, match="unequal norms"):
        keras_ecoc.ECOCDecoder(raw)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keras_ecoc.ECOCDecoder(keras_ecoc.codes.normalize_rows(raw))
