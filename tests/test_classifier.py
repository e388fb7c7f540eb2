"""ECOCClassifier: compile defaults, predict, saving, scale learning."""

import os

import keras
import numpy as np
import pytest
from conftest import reference_logits
from keras import ops

import keras_ecoc


def _problem(rng, num_samples=320, num_classes=8, width=10):
    x = rng.normal(size=(num_samples, width)).astype("float32")
    y = rng.integers(0, num_classes, size=num_samples)
    x[np.arange(num_samples), y] += 4.0  # linearly separable classes
    return x, y


def _backbone(width=10):
    inputs = keras.Input((width,))
    return keras.Model(inputs, keras.layers.Dense(16, activation="relu")(inputs))


def _classifier(num_classes=8, code_length=6, **kwargs):
    codes = keras_ecoc.codes.normalize_rows(keras_ecoc.codes.gaussian(num_classes, code_length, seed=0))
    return keras_ecoc.ECOCClassifier(_backbone(), codes, **kwargs)


def test_classifier_compiles_with_defaults_and_learns(rng):
    x, y = _problem(rng)
    model = _classifier()
    model.compile(optimizer=keras.optimizers.Adam(0.02))
    history = model.fit(x, y, epochs=12, batch_size=32, verbose=0)
    assert history.history["ecoc_accuracy"][-1] > 0.9
    assert isinstance(model.loss, keras_ecoc.ECOCLoss)


def test_learnable_scale_is_trained_through_the_loss(rng):
    x, y = _problem(rng)
    model = _classifier(scale=2.0, learnable_scale=True)
    model.compile(optimizer=keras.optimizers.Adam(0.05))
    assert any(v.name == "log_scale" for v in model.trainable_variables)
    model.fit(x, y, epochs=3, batch_size=32, verbose=0)
    assert abs(float(ops.convert_to_numpy(model.decoder.scale)) - 2.0) > 1e-3


def test_predict_proba_returns_probabilities_of_the_decoded_outputs(rng):
    x, _ = _problem(rng, num_samples=20)
    model = _classifier(scale=3.0, learnable_scale=False)
    probabilities = model.predict_proba(x, verbose=0)
    z = model.predict_codes(x, verbose=0)
    assert probabilities.shape == (20, 8) and z.shape == (20, 6)
    expected = np.exp(reference_logits(z, ops.convert_to_numpy(model.codes), 3.0))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(probabilities, expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(model.predict_classes(x, verbose=0),
                                  np.argmax(probabilities, -1))


def test_spatial_backbone_is_pooled(rng):
    inputs = keras.Input((8, 8, 3))
    backbone = keras.Model(inputs, keras.layers.Conv2D(4, 3)(inputs))
    codes = keras_ecoc.codes.normalize_rows(keras_ecoc.codes.gaussian(5, 3, seed=0))
    model = keras_ecoc.ECOCClassifier(backbone, codes, pooling="max")
    assert model.predict_proba(np.ones((2, 8, 8, 3), "float32"), verbose=0).shape == (2, 5)
    with pytest.raises(ValueError, match="pooling"):
        keras_ecoc.ECOCClassifier(backbone, codes, pooling=None)


def test_saved_classifier_reloads_with_identical_predictions(rng, tmp_path):
    x, y = _problem(rng, num_samples=64)
    model = _classifier(dropout=0.2)
    model.compile()
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    path = os.path.join(tmp_path, "classifier.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    assert isinstance(restored, keras_ecoc.ECOCClassifier)
    np.testing.assert_array_equal(model.predict(x, verbose=0),
                                  restored.predict(x, verbose=0))
    restored.fit(x, y, epochs=1, batch_size=16, verbose=0)  # still trainable


def test_saved_classifier_with_large_codes_restores_them_from_weights(rng, tmp_path):
    codes = rng.normal(size=(3000, 100)).astype("float32")
    model = keras_ecoc.ECOCClassifier(_backbone(), codes)
    path = os.path.join(tmp_path, "large.keras")
    model.save(path)
    restored = keras.models.load_model(path, compile=False)
    np.testing.assert_array_equal(ops.convert_to_numpy(restored.codes), codes)


def test_fit_under_jit_compile(rng):
    x, y = _problem(rng)
    model = _classifier()
    model.compile(optimizer=keras.optimizers.Adam(0.02), jit_compile=True)
    history = model.fit(x, y, epochs=6, batch_size=32, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"backbone": "resnet"}, "backbone"),
        ({"pooling": "mean"}, "pooling"),
        ({"dropout": 1.5}, "dropout"),
        ({"scale": -2.0}, "scale"),
        ({"codes": np.ones((4, 2))}, "codes"),
    ],
)
def test_bad_classifier_arguments_raise_value_error(kwargs, match):
    arguments = {"backbone": _backbone(),
                 "codes": keras_ecoc.codes.normalize_rows(keras_ecoc.codes.gaussian(8, 6, seed=0))}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=match):
        keras_ecoc.ECOCClassifier(**arguments)
