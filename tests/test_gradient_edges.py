"""Gradients at the edges: a row with z = 0, and gradients of gradients.

On every path (fused, streaming, dense) of the active backend:

* a row with ||z||^2 <= 1e-12 gets a zero gradient with respect to z (its
  direction is undefined; the floor alone gave 10^6 times dL/du, which blew
  up a zero-initialised bias and overflowed mixed_float16), the other rows
  the float64 reference's;
* a second derivative is either right (float64 central differences of the
  analytic gradient) or an error: never a silently wrong Hessian (the fused
  backward passes read residuals they do not differentiate again).
"""

import keras
import numpy as np
import pytest
from conftest import backend_grad, reference_grad_z

from keras_ecoc import ops as ecoc_ops

BACKEND = keras.backend.backend()
PATHS = ("fused", "streaming", "dense")


def _use_path(monkeypatch, path):
    """The `fused` argument for `path`, after setting the non-fused choice."""
    if path == "fused":
        monkeypatch.delenv("KERAS_ECOC_LOSS_PATH", raising=False)
        if ecoc_ops.loss_path(9) != "fused":
            pytest.skip(f"fused kernels unavailable: {ecoc_ops.backend_status(9)}")
        return True
    monkeypatch.setenv("KERAS_ECOC_LOSS_PATH", path)
    return False


def _problem(rng, batch=5, n=9, k=4):
    z = rng.normal(size=(batch, k)).astype("float32")
    codes = rng.normal(size=(n, k)).astype("float32")
    labels = rng.integers(0, n, size=batch).astype("int32")
    return z, codes, labels


@pytest.mark.parametrize("path", PATHS)
def test_a_row_with_z_zero_gets_a_zero_gradient_and_the_others_are_exact(rng, monkeypatch, path):
    fused = _use_path(monkeypatch, path)
    z, codes, labels = _problem(rng)
    z[1] = 0.0
    z[3] = 1e-8  # ||z||^2 = 4e-16 <= 1e-12: below the floor too
    scale = 2.0

    def total(t):
        return keras.ops.sum(ecoc_ops.ecoc_cross_entropy(labels, t, codes, scale, fused=fused))

    got = backend_grad(total, z)
    np.testing.assert_array_equal(got[[1, 3]], 0.0)
    expected = reference_grad_z(labels, z, codes, scale)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)


def _reference_hessian(labels, z, codes, scale, step=1e-5):
    """d/dz of the analytic float64 gradient, by central differences:
    (B, k, B, k)."""
    z = np.asarray(z, np.float64)
    out = np.zeros(z.shape + z.shape)
    for index in np.ndindex(z.shape):
        up, down = z.copy(), z.copy()
        up[index] += step
        down[index] -= step
        diff = reference_grad_z(labels, up, codes, scale) - reference_grad_z(labels, down, codes, scale)
        out[(slice(None), slice(None)) + index] = diff / (2 * step)
    return out


def _hessian(fn, z):
    """(B, k, B, k) Hessian of scalar fn at z on the active backend."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        t = tf.constant(z)
        with tf.GradientTape(persistent=True) as outer:
            outer.watch(t)
            with tf.GradientTape() as inner:
                inner.watch(t)
                value = fn(t)
            grad = inner.gradient(value, t)
        return outer.jacobian(grad, t, experimental_use_pfor=False).numpy()
    if BACKEND == "jax":
        import jax

        return np.asarray(jax.hessian(fn)(jax.numpy.asarray(z)))
    import torch

    return torch.autograd.functional.hessian(fn, torch.tensor(z)).numpy()


# Which paths give a second derivative on each backend; the others raise.
TWICE_DIFFERENTIABLE = {
    "tensorflow": {"streaming", "dense"},
    "jax": {"streaming", "dense"},
    "torch": {"dense"},
}


@pytest.mark.parametrize("path", PATHS)
def test_a_second_derivative_is_right_or_an_error(rng, monkeypatch, path):
    fused = _use_path(monkeypatch, path)
    z, codes, labels = _problem(rng, batch=3, n=7, k=3)
    scale = 1.5

    def total(t):
        return keras.ops.sum(ecoc_ops.ecoc_cross_entropy(labels, t, codes, scale, fused=fused))

    if path in TWICE_DIFFERENTIABLE[BACKEND]:
        np.testing.assert_allclose(
            _hessian(total, z), _reference_hessian(labels, z, codes, scale), rtol=1e-3, atol=1e-4)
        return
    # JAX's own error for an FFI call without a JVP rule; ours elsewhere.
    match = "cannot be differentiated" if BACKEND == "jax" else "no second derivative"
    with pytest.raises(Exception, match=match):
        _hessian(total, z)
