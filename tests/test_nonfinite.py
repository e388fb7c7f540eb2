"""Non-finite outputs or codes never decode to a valid class (issue 8, item 3).

`nearest_codeword` gives -1 and `label_rank` gives n for a row with a NaN or
infinite z (or when a codeword is not finite); metrics never count such a row
as a hit. Runs through `keras_ecoc.ops` (the fused op on TensorFlow when it
is loaded, the pure-Keras path elsewhere) and through `keras_ecoc.decoding`.
"""

import numpy as np
import pytest
from conftest import reference_logits
from keras import ops

import keras_ecoc
from keras_ecoc import decoding
from keras_ecoc import ops as ecoc_ops

PATHS = {
    "dispatch": (ecoc_ops.nearest_codeword, ecoc_ops.label_rank),
    "pure_keras": (decoding.nearest_codeword, decoding.label_rank),
}


def _problem(rng, batch=21, n=37, k=6):
    codes = rng.normal(size=(n, k)).astype("float32")
    z = rng.normal(size=(batch, k)).astype("float32")
    y = rng.integers(0, n, size=batch)
    return codes, z, y


@pytest.mark.parametrize("path", sorted(PATHS))
def test_rows_with_non_finite_z_decode_to_minus_one(rng, path):
    nearest, rank = PATHS[path]
    codes, z, y = _problem(rng)
    bad = np.array([2, 5, 6, 20])
    z[2] = np.nan
    z[5, 1] = np.inf
    z[6, 0] = -np.inf
    z[20, 3] = np.nan
    logits = reference_logits(np.where(np.isfinite(z), z, 0.0), codes)
    expected = np.argmax(logits, -1)
    expected[bad] = -1
    np.testing.assert_array_equal(ops.convert_to_numpy(nearest(z, codes)), expected)
    label_logit = logits[np.arange(len(y)), y][:, None]
    expected_rank = np.sum(logits > label_logit, -1)
    expected_rank[bad] = len(codes)
    np.testing.assert_array_equal(ops.convert_to_numpy(rank(y, z, codes)), expected_rank)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_non_finite_codeword_leaves_no_valid_class(rng, path, value):
    nearest, rank = PATHS[path]
    codes, z, y = _problem(rng)
    codes[11, 2] = value
    np.testing.assert_array_equal(ops.convert_to_numpy(nearest(z, codes)), -1)
    np.testing.assert_array_equal(ops.convert_to_numpy(rank(y, z, codes)), len(codes))


def test_metrics_never_count_non_finite_rows(rng):
    codes, _, _ = _problem(rng, n=10, k=5)
    codes = keras_ecoc.codes.normalize_rows(codes)
    y = np.arange(6) % 10
    z = codes[y].copy()  # every row exactly on its label's codeword
    z[1] = np.nan
    z[4, 0] = np.inf
    for metric in (keras_ecoc.ECOCAccuracy(codes), keras_ecoc.ECOCTopKAccuracy(codes, k=10)):
        metric.update_state(y, z)
        assert float(metric.result()) == pytest.approx(4 / 6)


def test_decoder_decode_and_classifier_predict_classes_give_minus_one(rng):
    import keras

    codes = keras_ecoc.codes.normalize_rows(keras_ecoc.codes.gaussian(6, 4, seed=1))
    decoder = keras_ecoc.ECOCDecoder(codes)
    z = rng.normal(size=(4, 4)).astype("float32")
    z[0] = np.nan
    decoded = ops.convert_to_numpy(decoder.decode(z))
    assert decoded[0] == -1 and np.all(decoded[1:] >= 0)

    inputs = keras.Input((3,))
    backbone = keras.Model(inputs, keras.layers.Dense(5)(inputs))
    model = keras_ecoc.ECOCClassifier(backbone, codes)
    x = rng.normal(size=(3, 3)).astype("float32")
    x[1] = np.nan
    classes = model.predict_classes(x, verbose=0)
    assert classes[1] == -1 and classes[0] >= 0 and classes[2] >= 0
