"""The fused TensorFlow op: non-finite rows, scale checks, invalid labels.

Issue 8, items 3 to 5, on the CPU kernel and the XLA lowering (the CUDA
kernel needs a GPU TensorFlow, which no machine here has). Skipped unless
the backend is TensorFlow and the op library loads.
"""

import keras
import numpy as np
import pytest
from conftest import reference_logits

if keras.backend.backend() != "tensorflow":
    pytest.skip("the fused op runs on the TensorFlow backend", allow_module_level=True)

import tensorflow as tf

from keras_ecoc import decoding
from keras_ecoc import ops as ecoc_ops

if not ecoc_ops.fused_available():
    pytest.skip(f"fused op unavailable: {ecoc_ops.fused_status()}", allow_module_level=True)

LIB = ecoc_ops.load_library()


def _nearest(jit):
    return tf.function(lambda z, c: ecoc_ops.nearest_codeword(z, c), jit_compile=jit)


def _rank(jit):
    return tf.function(lambda y, z, c: ecoc_ops.label_rank(y, z, c), jit_compile=jit)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("batch, n", [(13, 37), (33, 130_000)])  # one tile / tiled
def test_non_finite_z_gives_minus_one_and_rank_n_on_cpu_and_xla(rng, jit, batch, n):
    k = 4
    codes = rng.normal(size=(n, k)).astype("float32")
    z = rng.normal(size=(batch, k)).astype("float32")
    y = rng.integers(0, n, size=batch)
    bad = np.array([0, 3, batch - 1])
    z[0] = np.nan
    z[3, 2] = np.inf
    z[batch - 1, 1] = -np.inf
    good = np.setdiff1d(np.arange(batch), bad)
    logits = reference_logits(np.where(np.isfinite(z), z, 0.0), codes)
    index = _nearest(jit)(z, codes).numpy()
    np.testing.assert_array_equal(index[bad], -1)
    # float32 against float64: near-ties among 130,000 classes may differ.
    np.testing.assert_allclose(logits[good, index[good]], logits[good].max(-1), atol=1e-5)
    rank = _rank(jit)(y, z, codes).numpy()
    np.testing.assert_array_equal(rank[bad], n)
    expected_rank = np.sum(logits > logits[np.arange(batch), y][:, None], -1)
    np.testing.assert_allclose(rank[good], expected_rank[good], atol=2)


@pytest.mark.parametrize("jit", [False, True])
def test_a_nan_codeword_leaves_no_valid_class_on_cpu_and_xla(rng, jit):
    codes = rng.normal(size=(50, 5)).astype("float32")
    codes[7, 3] = np.nan
    z = rng.normal(size=(9, 5)).astype("float32")
    y = rng.integers(0, 50, size=9)
    np.testing.assert_array_equal(_nearest(jit)(z, codes).numpy(), -1)
    np.testing.assert_array_equal(_rank(jit)(y, z, codes).numpy(), 50)


@pytest.mark.parametrize("scale", [-1.0, 0.0, float("nan"), float("inf")])
@pytest.mark.parametrize("batch", [5, 8, 16, 19])
def test_the_op_rejects_non_finite_or_non_positive_scale(rng, scale, batch):
    # With a negative scale the codes gradient used to be all NaN whenever
    # the batch was not a multiple of the kernel's row block (padding rows
    # computed 0 * inf); such scales are now refused by the op itself.
    codes = rng.normal(size=(11, 4)).astype("float32")
    z = rng.normal(size=(batch, 4)).astype("float32")
    y = rng.integers(0, 11, size=batch).astype("int64")
    with pytest.raises(tf.errors.InvalidArgumentError, match="scale"):
        LIB.ecoc_cross_entropy(z, codes, y, scale, epsilon=1e-12)
    lse = np.zeros(batch, "float32")
    g = np.ones(batch, "float32")
    with pytest.raises(tf.errors.InvalidArgumentError, match="scale"):
        LIB.ecoc_cross_entropy_codes_grad(z, codes, y, scale, lse, g, epsilon=1e-12)


@pytest.mark.parametrize("batch", [5, 8, 16, 19])
def test_codes_gradient_is_finite_for_every_batch_size_and_a_large_scale(rng, batch):
    # Padding rows of the last row block must contribute exactly 0.
    codes = 3.0 * rng.normal(size=(11, 4)).astype("float32")
    z = rng.normal(size=(batch, 4)).astype("float32")
    y = rng.integers(0, 11, size=batch)
    variable = tf.Variable(codes)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(ecoc_ops.ecoc_cross_entropy(y, z, variable, 20.0))
    fused = tape.gradient(loss, variable).numpy()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(decoding.cross_entropy(y, z, variable, 20.0))
    reference = tape.gradient(loss, variable).numpy()
    assert np.all(np.isfinite(fused))
    np.testing.assert_allclose(fused, reference, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype, bad", [
    ("int32", (23 + 3, -2)),
    # 2^32 + 1 converted to int32 before the range test would be class 1.
    ("int64", (2**32 + 1, -2)),
    ("uint64", (2**32 + 1, 2**63 + 5)),
    ("uint32", (2**31 + 1, 23)),
])
def test_out_of_range_labels_give_zero_gradient_under_xla(rng, dtype, bad):
    n, k, batch = 23, 5, 10
    codes = tf.Variable(rng.normal(size=(n, k)).astype("float32"))
    scale = tf.Variable(2.0)
    z = tf.constant(rng.normal(size=(batch, k)).astype("float32"))
    y = rng.integers(0, n, size=batch).astype(dtype)
    y[0], y[4] = (np.array(v).astype(dtype) for v in bad)
    invalid = np.array([0, 4])
    valid = np.setdiff1d(np.arange(batch), invalid)

    @tf.function(jit_compile=True)
    def grads(z, y):
        with tf.GradientTape() as tape:
            tape.watch(z)
            loss = ecoc_ops.ecoc_cross_entropy(y, z, codes, scale)
            # Every row gets an upstream gradient of 1, the invalid ones too
            # (their NaN loss must not leak into the gradient as a number).
            total = tf.reduce_sum(loss)
        return (loss,) + tuple(tape.gradient(total, [z, codes, scale]))

    loss, g_z, g_codes, g_scale = grads(z, tf.constant(y))
    assert np.all(np.isnan(loss.numpy()[invalid]))
    rank = tf.function(lambda yy: ecoc_ops.label_rank(yy, z, codes), jit_compile=True)(
        tf.constant(y)).numpy()
    np.testing.assert_array_equal(rank[invalid], n)
    np.testing.assert_array_equal(g_z.numpy()[invalid], 0.0)
    # The valid rows alone give the same codes and scale gradients.
    _, g_z_valid, g_codes_valid, g_scale_valid = grads(
        tf.gather(z, valid), tf.constant(y[valid]))
    np.testing.assert_allclose(g_z.numpy()[valid], g_z_valid.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_codes.numpy(), g_codes_valid.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_scale.numpy(), g_scale_valid.numpy(), rtol=1e-5, atol=1e-6)
