"""Labels never pass through a float dtype; float32 math under mixed precision.

Issue 8, items 1 and 2, against float64 NumPy references.
"""

import keras
import numpy as np
import pytest
from conftest import reference_logits
from keras import ops

import keras_ecoc


def _reference_loss(y, z, codes, scale=1.0):
    logits = reference_logits(z, codes, scale)
    top = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(-1)) + top[:, 0]
    return lse - logits[np.arange(len(y)), y]


@pytest.fixture
def mixed_float16():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("label_dtype", ["int32", "int64"])
def test_loss_dtype_never_touches_the_labels(rng, dtype, label_dtype):
    # 3,000 classes: bfloat16 turns 777 into 776 and 2999 into 3008 (out of
    # range); float16 turns 2049 into 2048.
    n, k = 3000, 16
    codes = keras_ecoc.codes.normalize_rows(rng.normal(size=(n, k)).astype("float32"))
    y = np.array([777, 513, 999, 2049, 2999, 0], label_dtype)
    z = codes[y] + 0.05 * rng.normal(size=(len(y), k)).astype("float32")
    expected = _reference_loss(y, z, codes, 4.0)
    loss = keras_ecoc.ECOCLoss(codes, scale=4.0, dtype=dtype, reduction="none")
    got = ops.convert_to_numpy(ops.cast(loss(y, z), "float32"))
    # Only the final result is rounded to the loss dtype.
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2)
    mean = keras_ecoc.ECOCLoss(codes, scale=4.0, dtype=dtype)
    np.testing.assert_allclose(float(ops.cast(mean(y, z), "float32")),
                               expected.mean(), rtol=1e-2)
    # (batch, 1) labels and a sample weight go the same way.
    weighted = ops.convert_to_numpy(ops.cast(
        mean(y[:, None], z, sample_weight=np.arange(len(y), dtype="float32")), "float32"))
    np.testing.assert_allclose(weighted, np.sum(expected * np.arange(len(y))) / len(y),
                               rtol=2e-2)


def test_metrics_with_a_low_precision_dtype_keep_the_labels(rng):
    n, k = 3000, 16
    codes = keras_ecoc.codes.normalize_rows(rng.normal(size=(n, k)).astype("float32"))
    y = np.array([777, 513, 999, 2049], "int64")
    z = codes[y]  # exactly on the label's codeword: every row is a hit
    metric = keras_ecoc.ECOCAccuracy(codes, dtype="float16")
    metric.update_state(y, z)
    assert float(metric.result()) == 1.0


def test_decoder_is_float32_under_mixed_float16(rng, mixed_float16):
    n, k = 1000, 64
    codes = keras_ecoc.codes.normalize_rows(rng.normal(size=(n, k)).astype("float32"))
    z = rng.normal(size=(8, k)).astype("float32")
    mixed = keras_ecoc.ECOCDecoder(codes, scale=3.0, learnable_scale=True)
    got = ops.convert_to_numpy(mixed(z))
    assert mixed.compute_dtype == "float16" and got.dtype == np.float32
    reference = keras_ecoc.ECOCDecoder(codes, scale=3.0, learnable_scale=True,
                                       dtype="float32")
    np.testing.assert_allclose(got, ops.convert_to_numpy(reference(z)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, reference_logits(z, codes, 3.0), rtol=1e-5, atol=1e-4)


def test_classifier_predictions_agree_under_mixed_float16(rng, mixed_float16):
    n, k = 1000, 64
    codes = keras_ecoc.codes.normalize_rows(rng.normal(size=(n, k)).astype("float32"))
    inputs = keras.Input((20,))
    backbone = keras.Model(inputs, keras.layers.Dense(32, activation="relu")(inputs))
    model = keras_ecoc.ECOCClassifier(backbone, codes, scale=4.0)
    x = rng.normal(size=(64, 20)).astype("float32")
    z = model.predict(x, verbose=0)
    assert z.dtype == np.float32
    probabilities = model.predict_proba(x, verbose=0)
    logits = reference_logits(z, codes, 4.0)
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(probabilities, expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(model.predict_classes(x, verbose=0),
                                  np.argmax(probabilities, -1))
    np.testing.assert_array_equal(model.predict_classes(x, verbose=0), np.argmax(logits, -1))
