"""The pure-Keras ECOC math against float64 NumPy references."""

import keras
import numpy as np
import pytest
from conftest import backend_grad
from conftest import numeric_grad
from conftest import reference_grad_z
from conftest import reference_logits
from conftest import reference_loss
from keras import ops

from keras_ecoc import decoding


def _inputs(rng, batch=7, num_classes=13, code_length=5):
    z = rng.normal(size=(batch, code_length)).astype("float32")
    codes = rng.normal(size=(num_classes, code_length)).astype("float32")
    labels = rng.integers(0, num_classes, size=batch)
    return z, codes, labels


@pytest.mark.parametrize("scale", [1.0, 0.25, 7.5])
def test_decoded_logits_match_float64_reference(rng, scale):
    z, codes, _ = _inputs(rng)
    logits = ops.convert_to_numpy(decoding.decode_logits(z, codes, scale))
    np.testing.assert_allclose(
        logits, reference_logits(z, codes, scale), rtol=1e-5, atol=1e-5
    )


def test_decoded_logits_keep_leading_dimensions(rng):
    z = rng.normal(size=(2, 3, 4)).astype("float32")
    codes = rng.normal(size=(6, 4)).astype("float32")
    logits = ops.convert_to_numpy(decoding.decode_logits(z, codes))
    assert logits.shape == (2, 3, 6)
    np.testing.assert_allclose(
        logits.reshape(6, 6),
        reference_logits(z.reshape(6, 4), codes),
        rtol=1e-5, atol=1e-5,
    )


@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_cross_entropy_matches_float64_reference(rng, scale):
    z, codes, labels = _inputs(rng)
    loss = ops.convert_to_numpy(decoding.cross_entropy(labels, z, codes, scale))
    np.testing.assert_allclose(
        loss, reference_loss(labels, z, codes, scale), rtol=1e-5, atol=1e-6
    )


def test_cross_entropy_equals_sparse_categorical_crossentropy(rng):
    z, codes, labels = _inputs(rng)
    ours = decoding.cross_entropy(labels, z, codes, 2.0)
    keras_loss = keras.losses.sparse_categorical_crossentropy(
        labels, decoding.decode_logits(z, codes, 2.0), from_logits=True
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(ours), ops.convert_to_numpy(keras_loss), rtol=1e-5
    )


def test_gradient_wrt_z_matches_analytic_and_finite_differences(rng):
    z, codes, labels = _inputs(rng, batch=4, num_classes=9, code_length=6)
    scale = 2.0

    def summed(t):
        return ops.sum(decoding.cross_entropy(labels, t, codes, scale))

    grad = backend_grad(summed, z)
    analytic = reference_grad_z(labels, z, codes, scale)
    numeric = numeric_grad(
        lambda x: reference_loss(labels, x, codes, scale).sum(), z
    )
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, analytic, rtol=1e-4, atol=1e-5)


def test_zero_output_decodes_to_finite_logits_and_gradient(rng):
    _, codes, labels = _inputs(rng, batch=3)
    z = np.zeros((3, codes.shape[1]), "float32")
    logits = ops.convert_to_numpy(decoding.decode_logits(z, codes))
    np.testing.assert_allclose(logits, -0.5 * np.sum(codes**2, -1)[None].repeat(3, 0),
                               rtol=1e-6)
    grad = backend_grad(
        lambda t: ops.sum(decoding.cross_entropy(labels, t, codes)), z
    )
    assert np.all(np.isfinite(grad))


def test_nearest_codeword_is_the_closest_row_to_the_unit_output(rng):
    z, codes, _ = _inputs(rng, batch=50, num_classes=20, code_length=8)
    predicted = ops.convert_to_numpy(decoding.nearest_codeword(z, codes))
    u = z / np.linalg.norm(z, axis=-1, keepdims=True)
    distances = np.linalg.norm(codes[None] - u[:, None], axis=-1)
    np.testing.assert_array_equal(predicted, np.argmin(distances, axis=-1))


def test_label_rank_counts_strictly_closer_codewords(rng):
    z, codes, labels = _inputs(rng, batch=40, num_classes=15, code_length=4)
    rank = ops.convert_to_numpy(decoding.label_rank(labels, z, codes))
    logits = reference_logits(z, codes)
    expected = np.sum(logits > logits[np.arange(40), labels][:, None], axis=-1)
    np.testing.assert_array_equal(rank, expected)


def test_out_of_range_labels_give_nan_not_a_number(rng):
    z, codes, _ = _inputs(rng, batch=3, num_classes=5)
    loss = ops.convert_to_numpy(
        decoding.cross_entropy(np.array([0, 5, -1]), z, codes)
    )
    assert np.isfinite(loss[0])
    assert np.isnan(loss[1]) and np.isnan(loss[2])


def test_label_rank_never_counts_nan_outputs_or_invalid_labels_as_hits(rng):
    z, codes, _ = _inputs(rng, batch=3, num_classes=6)
    z[1] = np.nan
    rank = ops.convert_to_numpy(decoding.label_rank(np.array([0, 1, 6]), z, codes))
    assert rank[1] == 6 and rank[2] == 6
    assert 0 <= rank[0] < 6
