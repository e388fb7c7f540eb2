"""Tests of the streaming (tiled, memory-efficient) ECOC loss of the active backend.

The suite runs once per KERAS_BACKEND, so these tests cover the JAX
(`jax.custom_vjp` over `lax.scan`), PyTorch (`torch.autograd.Function`) and
TensorFlow (`tf.custom_gradient` over `tf.while_loop`, the fallback without the
op library) implementations across the CI runs. Everything is compared with
float64 NumPy references written here from the formulas (dense B x n logits):

  u = z / ||z||, logit_bi = -1/2 s ||M_i - u_b||^2, loss_b = lse_b - logit_{b,y_b}

Tolerances: float32 accumulation over n classes and k dimensions; atol is a
few hundred float32 ulps of the largest reference entry (as in test_fused_op).
"""

import os

import numpy as np
import pytest

import keras

from keras_ecoc import ops as eops
from keras_ecoc.ops import _dispatch

BACKEND = keras.backend.backend()


def _module():
    if BACKEND == "jax":
        from keras_ecoc.ops import _streaming_jax as mod
    elif BACKEND == "torch":
        from keras_ecoc.ops import _streaming_torch as mod
    elif BACKEND == "tensorflow":
        from keras_ecoc.ops import _streaming_tf as mod
    else:
        pytest.skip(f"no streaming implementation for backend {BACKEND}")
    return mod


# ---------------------------------------------------------------------------
# float64 references.

def ref_logits(z, codes, scale=1.0):
    z = z.astype(np.float64)
    m = codes.astype(np.float64)
    with np.errstate(invalid="ignore"):
        u = z / np.sqrt(np.maximum((z * z).sum(-1, keepdims=True), 1e-12))
    return -0.5 * scale * ((m[None] - u[:, None]) ** 2).sum(-1), u


def ref_loss_and_grads(z, codes, labels, scale, weights):
    """Loss (B,) and gradients of sum_b weights_b loss_b w.r.t. z, codes, scale."""
    z = z.astype(np.float64)
    m = codes.astype(np.float64)
    sq = (z * z).sum(-1, keepdims=True)
    r = 1.0 / np.sqrt(np.maximum(sq, 1e-12))
    logits, u = ref_logits(z, codes, scale)
    top = logits.max(-1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(logits - top).sum(-1))
    b = len(z)
    loss = lse - logits[np.arange(b), labels]
    p = np.exp(logits - lse[:, None])
    dlogit = weights[:, None] * (p - np.eye(len(m))[labels])
    diff = m[None] - u[:, None]  # (B, n, k)
    du = scale * (dlogit[:, :, None] * diff).sum(1)
    # ||z||^2 <= 1e-12: the direction is undefined and the package's gradient is 0.
    dz = np.where(sq > 1e-12, r * (du - (u * du).sum(-1, keepdims=True) * u), 0.0)
    dcodes = -scale * (dlogit[:, :, None] * diff).sum(0)
    dscale = (dlogit * (-0.5 * (diff ** 2).sum(-1))).sum()
    return loss, dz, dcodes, dscale


def random_problem(rng, b, n, k, scale=3.0):
    z = rng.normal(size=(b, k)).astype(np.float32)
    codes = rng.normal(size=(n, k)).astype(np.float32)
    labels = rng.integers(0, n, size=b).astype(np.int32)
    return z, codes, labels, scale


def assert_close_grad(actual, expected, name):
    actual = np.asarray(actual, np.float64)
    atol = 2e-5 * max(1.0, np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=atol, err_msg=name)


# ---------------------------------------------------------------------------
# Backend glue: loss and gradients of sum(weights * loss) under each backend's
# compiler (jax.jit, torch eager, tf.function).

def loss_and_grads(fn, z, codes, scale, weights):
    """fn(z, codes, scale) -> (B,) loss, with backend tensors."""
    if BACKEND == "jax":
        import jax
        import jax.numpy as jnp

        def total(z, c, s):
            loss = fn(z, c, s)
            return jnp.sum(jnp.where(jnp.isnan(loss), 0.0, loss) * weights), loss

        (_, loss), grads = jax.jit(jax.value_and_grad(total, argnums=(0, 1, 2), has_aux=True))(
            jnp.asarray(z), jnp.asarray(codes), jnp.float32(scale))
        return (np.asarray(loss),) + tuple(np.asarray(g) for g in grads)
    if BACKEND == "torch":
        import torch

        zt = torch.tensor(z, requires_grad=True)
        ct = torch.tensor(codes, requires_grad=True)
        st = torch.tensor(float(scale), requires_grad=True)
        loss = fn(zt, ct, st)
        w = torch.tensor(weights, dtype=torch.float32)
        torch.sum(torch.where(torch.isnan(loss), 0.0, loss) * w).backward()
        return (loss.detach().numpy(), zt.grad.numpy(), ct.grad.numpy(), st.grad.numpy())
    import tensorflow as tf

    @tf.function
    def run(z, c, s):
        with tf.GradientTape() as tape:
            tape.watch([z, c, s])
            loss = fn(z, c, s)
            total = tf.reduce_sum(tf.where(tf.math.is_nan(loss), 0.0, loss) * weights)
        return (loss,) + tuple(tape.gradient(total, [z, c, s]))

    out = run(tf.constant(z), tf.constant(codes), tf.constant(scale, tf.float32))
    return tuple(np.asarray(t) for t in out)


def to_backend(x):
    return keras.ops.convert_to_tensor(x)


def all_valid(b):
    return to_backend(np.ones(b, bool))


# ---------------------------------------------------------------------------
# The streaming implementation itself.

@pytest.mark.parametrize("b,n,k,tile", [(1, 1, 1, 1), (7, 53, 5, 8), (7, 53, 5, 53),
                                        (16, 300, 12, 128), (5, 40, 3, 64)])
def test_streaming_loss_and_gradients_match_float64_reference(b, n, k, tile):
    mod = _module()
    rng = np.random.default_rng(b * 1000 + n + k + tile)
    z, codes, labels, scale = random_problem(rng, b, n, k)
    weights = rng.uniform(0.5, 2.0, size=b).astype(np.float32)
    y = to_backend(labels)
    valid = all_valid(b)
    loss, dz, dcodes, dscale = loss_and_grads(
        lambda z, c, s: mod.cross_entropy(z, c, y, valid, s, tile), z, codes, scale, weights)
    rloss, rdz, rdcodes, rdscale = ref_loss_and_grads(z, codes, labels, scale, weights)
    np.testing.assert_allclose(loss, rloss, rtol=1e-5, atol=1e-5)
    assert_close_grad(dz, rdz, "dz")
    assert_close_grad(dcodes, rdcodes, "dcodes")
    assert_close_grad(dscale, rdscale, "dscale")


def test_zero_z_gives_finite_loss_and_gradient():
    mod = _module()
    rng = np.random.default_rng(3)
    z, codes, labels, scale = random_problem(rng, 4, 30, 6)
    z[1] = 0.0
    weights = np.ones(4, np.float32)
    y = to_backend(labels)
    loss, dz, dcodes, dscale = loss_and_grads(
        lambda z, c, s: mod.cross_entropy(z, c, y, all_valid(4), s, 8), z, codes, scale, weights)
    rloss, rdz, rdcodes, _ = ref_loss_and_grads(z, codes, labels, scale, weights)
    np.testing.assert_allclose(loss, rloss, rtol=1e-5, atol=1e-5)
    assert_close_grad(dz, rdz, "dz")
    assert_close_grad(dcodes, rdcodes, "dcodes")
    assert np.isfinite(dscale)


def test_invalid_row_gives_nan_loss_and_zero_gradient():
    # What the dispatcher passes for an out-of-range label under a compiler:
    # valid = False and a safe label. The row's loss is NaN and it contributes
    # nothing to any gradient, even with a nonzero upstream weight.
    mod = _module()
    rng = np.random.default_rng(4)
    z, codes, labels, scale = random_problem(rng, 6, 40, 5)
    valid_np = np.ones(6, bool)
    valid_np[2] = False
    weights = rng.uniform(0.5, 2.0, size=6).astype(np.float32)
    y, valid = to_backend(labels), to_backend(valid_np)
    loss, dz, dcodes, dscale = loss_and_grads(
        lambda z, c, s: mod.cross_entropy(z, c, y, valid, s, 16), z, codes, scale, weights)
    assert np.isnan(loss[2]) and np.all(np.isfinite(np.delete(loss, 2)))
    np.testing.assert_array_equal(dz[2], 0.0)
    keep = np.delete(np.arange(6), 2)
    rloss, rdz, rdcodes, rdscale = ref_loss_and_grads(z[keep], codes, labels[keep], scale,
                                                      weights[keep])
    assert_close_grad(dz[keep], rdz, "dz")
    assert_close_grad(dcodes, rdcodes, "dcodes")
    assert_close_grad(dscale, rdscale, "dscale")


def test_nonfinite_rows_get_nan_loss_minus_one_and_rank_n():
    mod = _module()
    rng = np.random.default_rng(5)
    n = 70
    z, codes, labels, scale = random_problem(rng, 5, n, 4)
    z[1, 0] = np.nan
    z[3, 2] = np.inf
    y = to_backend(labels)
    loss = np.asarray(mod.cross_entropy(to_backend(z), to_backend(codes), y, all_valid(5),
                                        to_backend(np.float32(scale)), 16))
    assert np.isnan(loss[[1, 3]]).all() and np.isfinite(loss[[0, 2, 4]]).all()
    nearest = np.asarray(mod.nearest_codeword(to_backend(z), to_backend(codes), 16))
    rank = np.asarray(mod.label_rank(to_backend(z), to_backend(codes), y, all_valid(5), 16))
    logits, _ = ref_logits(z, codes)
    good = [0, 2, 4]
    np.testing.assert_array_equal(nearest[[1, 3]], -1)
    np.testing.assert_array_equal(nearest[good], np.argmax(logits[good], -1))
    np.testing.assert_array_equal(rank[[1, 3]], n)
    ref_rank = (logits > logits[np.arange(5), labels][:, None]).sum(-1)
    np.testing.assert_array_equal(rank[good], ref_rank[good])
    # A non-finite codeword: no row decodes to a valid class.
    codes[17, 1] = np.nan
    nearest = np.asarray(mod.nearest_codeword(to_backend(z), to_backend(codes), 16))
    np.testing.assert_array_equal(nearest, -1)


def test_nearest_ties_go_to_the_smallest_index_across_tiles():
    mod = _module()
    rng = np.random.default_rng(6)
    codes = rng.normal(size=(50, 3)).astype(np.float32)
    codes[41] = codes[9] = np.array([1.0, 0.0, 0.0], np.float32)  # tiles 0 and 2 (C=16)
    z = np.array([[2.0, 0.0, 0.0], [0.3, 0.1, -0.2]], np.float32)
    nearest = np.asarray(mod.nearest_codeword(to_backend(z), to_backend(codes), 16))
    assert nearest[0] == 9
    logits, _ = ref_logits(z, codes)
    assert nearest[1] == np.argmax(logits[1])


@pytest.mark.parametrize("b,n,k,tile", [(9, 130, 6, 32), (3, 7, 2, 7)])
def test_rank_and_nearest_match_numpy(b, n, k, tile):
    mod = _module()
    rng = np.random.default_rng(b + n)
    z, codes, labels, _ = random_problem(rng, b, n, k)
    logits, _ = ref_logits(z, codes)
    rank = np.asarray(mod.label_rank(to_backend(z), to_backend(codes), to_backend(labels),
                                     all_valid(b), tile))
    ref_rank = (logits > logits[np.arange(b), labels][:, None]).sum(-1)
    np.testing.assert_array_equal(rank, ref_rank)
    np.testing.assert_array_equal(
        np.asarray(mod.nearest_codeword(to_backend(z), to_backend(codes), tile)),
        np.argmax(logits, -1))


# ---------------------------------------------------------------------------
# The public API and the dispatcher.

@pytest.fixture
def non_fused(monkeypatch):
    """Makes the TensorFlow backend skip the fused op (its fallback is streaming)."""
    monkeypatch.setenv("KERAS_ECOC_DISABLE_FUSED", "1")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield monkeypatch


@pytest.mark.parametrize("path", ["streaming", "dense"])
def test_public_api_paths_match_reference(non_fused, path):
    _module()
    non_fused.setenv(_dispatch.ENV_PATH, path)
    assert eops.loss_path(10**5) == path
    rng = np.random.default_rng(7)
    z, codes, labels, scale = random_problem(rng, 2 * 3, 90, 5)
    weights = np.ones(6, np.float32)
    loss, dz, dcodes, dscale = loss_and_grads(
        lambda z, c, s: eops.ecoc_cross_entropy(labels, z, c, s), z, codes, scale, weights)
    rloss, rdz, rdcodes, rdscale = ref_loss_and_grads(z, codes, labels, scale, weights)
    np.testing.assert_allclose(loss, rloss, rtol=1e-5, atol=1e-5)
    assert_close_grad(dz, rdz, "dz")
    assert_close_grad(dcodes, rdcodes, "dcodes")
    assert_close_grad(dscale, rdscale, "dscale")
    # Leading batch dims and Keras-style (B, 1) labels.
    z3 = z.reshape(2, 3, 5)
    np.testing.assert_allclose(
        np.asarray(eops.ecoc_cross_entropy(labels.reshape(2, 3), z3, codes, scale)),
        rloss.reshape(2, 3), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(eops.ecoc_cross_entropy(labels[:, None], z, codes, scale)), rloss,
        rtol=1e-5, atol=1e-5)


def test_dispatcher_uses_dense_for_small_n_and_streaming_for_large_n(non_fused):
    _module()
    assert eops.loss_path(10) == "dense"
    assert eops.loss_path(10**5) == "streaming"
    status = eops.backend_status(10**5)
    assert status.startswith("streaming:") and "never holds the B x n logits" in status


@pytest.mark.parametrize("backend", ["jax", "torch", "tensorflow"])
def test_tile_size_bounds_the_logits_block_on_cpu_and_gpu(backend):
    for b in (1, 16, 256, 4096):
        for k in (8, 128):
            cpu = _dispatch.tile_size(b, 10**6, k, backend)
            assert 128 <= cpu <= 1024 and cpu % 128 == 0
            assert cpu * (b + k) <= 2**18 or cpu == 128
            gpu = _dispatch.tile_size(b, 10**6, k, backend, on_gpu=True)
            budget, high, low = _dispatch.GPU_TILE_BUDGET[backend]
            assert low <= gpu <= high and gpu % 128 == 0 and gpu >= cpu
            assert gpu * (b + k) <= budget or gpu == low
            assert _dispatch.tile_size(b, 50, k, backend) == 50  # never beyond n
            assert _dispatch.tile_size(b, 50, k, backend, on_gpu=True) == 50


def test_fused_op_preferred_on_tensorflow_when_loaded():
    if BACKEND != "tensorflow" or not eops.fused_available():
        pytest.skip("needs the TensorFlow backend with the op library")
    assert eops.loss_path(10**5) == "fused"
    assert eops.loss_path(10) == "fused"


def test_large_label_space_streams_through_the_public_api(non_fused):
    _module()
    rng = np.random.default_rng(8)
    z, codes, labels, scale = random_problem(rng, 4, 5000, 8)
    assert eops.loss_path(5000) == "streaming"
    loss = np.asarray(eops.ecoc_cross_entropy(labels, z, codes, scale))
    np.testing.assert_allclose(loss, ref_loss_and_grads(z, codes, labels, scale, np.ones(4))[0],
                               rtol=1e-5, atol=1e-5)
    logits, _ = ref_logits(z, codes)
    np.testing.assert_array_equal(np.asarray(eops.nearest_codeword(z, codes)),
                                  np.argmax(logits, -1))


BAD_SCALES = [True, np.bool_(False), 0.0, -1.0, float("nan"), float("inf"),
              np.array([1.0, 2.0], np.float32)]


@pytest.mark.parametrize("scale", BAD_SCALES, ids=[repr(s) for s in BAD_SCALES])
def test_scale_must_be_finite_and_positive_on_every_path(scale):
    z = np.ones((2, 3), np.float32)
    codes = np.eye(4, 3, dtype=np.float32)
    with pytest.raises(ValueError, match="Argument `scale` must be"):
        eops.ecoc_cross_entropy(np.array([0, 1]), z, codes, scale)
    # A tensor's value is not read (a device-to-host copy per call): Keras
    # objects check their scale once, when it enters (the constructor).


def test_scale_tensor_or_variable_is_checked_for_shape_and_dtype_only():
    z = np.ones((2, 3), np.float32)
    codes = np.eye(4, 3, dtype=np.float32)
    with pytest.raises(ValueError, match="Argument `scale` must be a scalar"):
        eops.ecoc_cross_entropy(np.array([0, 1]), z, codes,
                                keras.Variable([1.0, 2.0], dtype="float32"))
    with pytest.raises(ValueError, match="not a boolean tensor"):
        eops.ecoc_cross_entropy(np.array([0, 1]), z, codes, to_backend(np.array(True)))


@pytest.mark.parametrize("labels,pattern", [
    (np.array([0, 4]), r"labels\[1\] = 4 is outside the valid range \[0, 4\)"),
    (np.array([-1, 0]), r"labels\[0\] = -1 is outside the valid range"),
    (np.array([0, 2**31 + 1], np.int64), r"never narrowed"),
    (np.array([0.0, 1.5]), r"only accepted when every value is an integer"),
    (np.array([True, False]), r"must be integer class indices"),
])
def test_bad_labels_raise_with_the_argument_named(labels, pattern):
    z = np.ones((2, 3), np.float32)
    codes = np.eye(4, 3, dtype=np.float32)
    with pytest.raises(ValueError, match=pattern):
        eops.ecoc_cross_entropy(labels, z, codes)
    with pytest.raises(ValueError, match=pattern):
        eops.label_rank(labels, z, codes)


def test_float_label_tensor_is_exact_or_rejected_and_integral_numpy_floats_are_exact():
    rng = np.random.default_rng(9)
    z, codes, labels, scale = random_problem(rng, 3, 6, 4)
    b = np.asarray(eops.ecoc_cross_entropy(labels, z, codes, scale))
    # float32 holds every index < 2^24 exactly: what Keras' loss wrapper passes.
    a32 = np.asarray(eops.ecoc_cross_entropy(to_backend(labels.astype(np.float32)), z, codes, scale))
    np.testing.assert_array_equal(a32, b)
    a64 = np.asarray(eops.ecoc_cross_entropy(labels.astype(np.float64), z, codes, scale))
    np.testing.assert_array_equal(a64, b)
    # float16 is exact only up to 2048: with more classes it is refused.
    big_codes = np.tile(codes, (700, 1))[:4000] + np.arange(4000, dtype=np.float32)[:, None] * 1e-3
    with pytest.raises(ValueError, match="exactly only up to 2048"):
        eops.ecoc_cross_entropy(to_backend(labels.astype(np.float16)), z, big_codes, scale)


def test_out_of_range_label_in_host_data_raises_and_in_a_tensor_gives_nan(non_fused):
    # Host labels are checked on the host; a tensor's values are never read
    # there (a device-to-host copy per step): its invalid row gets a NaN loss
    # in the program, as under a compiler. (The fused TensorFlow CPU kernel,
    # not used here, rejects it in the kernel instead.)
    z = np.ones((2, 3), np.float32)
    codes = np.eye(4, 3, dtype=np.float32)
    with pytest.raises(ValueError, match=r"labels\[1\] = 9"):
        eops.ecoc_cross_entropy(np.array([0, 9], np.int32), z, codes)
    for path in ("streaming", "dense"):
        non_fused.setenv(_dispatch.ENV_PATH, path)
        loss = np.asarray(keras.ops.convert_to_numpy(
            eops.ecoc_cross_entropy(to_backend(np.array([0, 9], np.int32)), z, codes)))
        assert np.isnan(loss[1]) and np.isfinite(loss[0]), path


def test_out_of_range_label_under_the_compiler_gives_nan_and_zero_gradient(non_fused):
    """jax.jit / tf.function (label values unknown at trace time) on both
    non-fused paths; PyTorch runs eagerly (a label tensor gives NaN there
    too: tested above)."""
    if BACKEND == "torch":
        pytest.skip("PyTorch runs eagerly: covered by the tensor-label test above")
    _module()
    rng = np.random.default_rng(10)
    z, codes, labels, scale = random_problem(rng, 4, 1500, 5)
    labels[1] = 1500
    for path in ("streaming", "dense"):
        non_fused.setenv(_dispatch.ENV_PATH, path)
        if BACKEND == "jax":
            import jax
            import jax.numpy as jnp

            def total(z, y):
                loss = eops.ecoc_cross_entropy(y, z, codes, scale)
                return jnp.sum(jnp.where(jnp.isnan(loss), 0.0, loss)), loss

            (_, loss), dz = jax.jit(jax.value_and_grad(total, has_aux=True))(
                jnp.asarray(z), jnp.asarray(labels))
        else:
            import tensorflow as tf

            @tf.function
            def run(z, y):
                with tf.GradientTape() as tape:
                    tape.watch(z)
                    loss = eops.ecoc_cross_entropy(y, z, codes, scale)
                    total = tf.reduce_sum(tf.where(tf.math.is_nan(loss), 0.0, loss))
                return loss, tape.gradient(total, z)

            loss, dz = run(tf.constant(z), tf.constant(labels))
        loss, dz = np.asarray(loss), np.asarray(dz)
        assert np.isnan(loss[1]) and np.isfinite(np.delete(loss, 1)).all(), path
        np.testing.assert_array_equal(dz[1], 0.0, err_msg=path)
        assert np.all(np.isfinite(dz)), path


# ---------------------------------------------------------------------------
# Backend-specific: compiled memory, torch.compile, Keras training.

def test_jax_jit_never_allocates_the_batch_by_classes_logits():
    if BACKEND != "jax":
        pytest.skip("checks the JAX implementation under jax.jit")
    import jax
    import jax.numpy as jnp

    from keras_ecoc import decoding
    from keras_ecoc.ops import _streaming_jax

    b, n, k = 256, 20000, 16
    logits_bytes = b * n * 4
    z = jnp.zeros((b, k), jnp.float32)
    codes = jnp.zeros((n, k), jnp.float32)
    labels = jnp.zeros((b,), jnp.int32)
    valid = jnp.ones((b,), bool)
    tile = _dispatch.tile_size(b, n, k, "jax")

    def streaming(z, c):
        return jnp.sum(_streaming_jax.cross_entropy(z, c, labels, valid, 2.0, tile))

    def dense(z, c):
        return jnp.sum(decoding.cross_entropy(labels, z, c, 2.0))

    def temp_bytes(f):
        grad = jax.jit(jax.grad(f, argnums=(0, 1)))
        stats = grad.lower(z, codes).compile().memory_analysis()
        return stats.temp_size_in_bytes

    dense_temp = temp_bytes(dense)
    stream_temp = temp_bytes(streaming)
    assert dense_temp >= logits_bytes  # the measurement sees B x n when it is there
    # Streaming: O(B C + n k) scratch (the padded code tiles and their gradient).
    assert stream_temp < logits_bytes / 4, (stream_temp, dense_temp)
    assert stream_temp <= 4 * n * k * 4 + 8 * b * tile * 4


def _torch_module():
    if BACKEND != "torch":
        pytest.skip("checks the PyTorch implementation")
    from keras_ecoc.ops import _streaming_torch

    return _streaming_torch


def test_torch_loss_is_one_graph_node_under_torch_compile_fullgraph():
    mod = _torch_module()
    import torch

    rng = np.random.default_rng(11)
    z, codes, labels, scale = random_problem(rng, 8, 200, 6)
    y = torch.tensor(labels)
    valid = torch.ones(8, dtype=torch.bool)

    def step(z, c, s):
        return mod.cross_entropy(z, c, y, valid, s, 64)

    weights = np.ones(8, np.float32)
    # fullgraph=True raises on a graph break: the tile loops are custom ops.
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    compiled_out = loss_and_grads(compiled, z, codes, scale, weights)
    reference = ref_loss_and_grads(z, codes, labels, scale, weights)
    np.testing.assert_allclose(compiled_out[0], reference[0], rtol=1e-5, atol=1e-5)
    for got, want, name in zip(compiled_out[1:], reference[1:], ("dz", "dcodes", "dscale")):
        assert_close_grad(got, want, name)


def test_torch_rank_and_nearest_are_one_graph_node_under_torch_compile_fullgraph():
    mod = _torch_module()
    import torch

    rng = np.random.default_rng(15)
    b, n, k, tile = 9, 130, 6, 32
    z, codes, labels, _ = random_problem(rng, b, n, k)
    logits, _ = ref_logits(z, codes)

    valid = torch.ones(b, dtype=torch.bool)

    def decode(z, c, y):
        return mod.nearest_codeword(z, c, tile), mod.label_rank(z, c, y, valid, tile)

    nearest, rank = torch.compile(decode, backend="aot_eager", fullgraph=True)(
        torch.tensor(z), torch.tensor(codes), torch.tensor(labels))
    np.testing.assert_array_equal(nearest.numpy(), np.argmax(logits, -1))
    np.testing.assert_array_equal(
        rank.numpy(), (logits > logits[np.arange(b), labels][:, None]).sum(-1))


def test_public_ops_compile_fullgraph_as_the_first_call_of_a_process():
    """The first fused call of a fresh process inside torch.compile(
    fullgraph=True): the kernel library must already be loaded (Dynamo
    cannot enter the loader's lock), for the loss and for decoding."""
    _torch_module()
    import subprocess
    import sys
    import textwrap

    from keras_ecoc.ops import _loader

    if _loader.load_kernels() is None:
        pytest.skip(f"no kernel library: {_loader.kernels_status()}")
    script = textwrap.dedent("""
        import numpy as np, torch
        import keras_ecoc.ops as O
        rng = np.random.default_rng(0)
        M = torch.tensor(rng.normal(size=(50, 6)).astype("float32"))
        z = torch.tensor(rng.normal(size=(8, 6)).astype("float32"))
        y = torch.tensor(rng.integers(0, 50, 8))
        loss = torch.compile(lambda z, y: O.ecoc_cross_entropy(y, z, M),
                             fullgraph=True, backend="aot_eager")(z, y)
        nearest = torch.compile(lambda z: O.nearest_codeword(z, M),
                                fullgraph=True, backend="aot_eager")(z)
        assert O.loss_path(50) == "fused", O.fused_status()
        np.testing.assert_allclose(
            loss.numpy(), O.ecoc_cross_entropy(y, z, M).numpy(), rtol=1e-6)
        np.testing.assert_array_equal(nearest.numpy(),
                                      O.nearest_codeword(z, M).numpy())
        print("ok")
    """)
    env = dict(os.environ, KERAS_BACKEND="torch")
    done = subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_torch_tile_loop_runs_compiled_by_default():
    mod = _torch_module()
    rng = np.random.default_rng(13)
    z, codes, labels, scale = random_problem(rng, 6, 100, 4)
    y, valid = to_backend(labels), all_valid(6)
    loss_and_grads(lambda z, c, s: mod.cross_entropy(z, c, y, valid, s, 16), z, codes, scale,
                   np.ones(6, np.float32))
    assert mod.compile_status().startswith("compiled scan"), mod.compile_status()
    assert set(mod._COMPILED.fns) == {mod._forward_tiles, mod._codes_grad_tiles}


@pytest.mark.parametrize("b,n,k,tile", [(7, 53, 5, 8), (3, 40, 2, 40)])
def test_torch_uncompiled_tile_loop_matches_reference(monkeypatch, b, n, k, tile):
    mod = _torch_module()
    monkeypatch.setenv(mod.ENV_COMPILE, "0")
    assert mod.compile_status().startswith("Python loop: disabled")
    rng = np.random.default_rng(b + n + k + tile)
    z, codes, labels, scale = random_problem(rng, b, n, k)
    weights = rng.uniform(0.5, 2.0, size=b).astype(np.float32)
    y, valid = to_backend(labels), all_valid(b)
    got = loss_and_grads(lambda z, c, s: mod.cross_entropy(z, c, y, valid, s, tile), z, codes,
                         scale, weights)
    want = ref_loss_and_grads(z, codes, labels, scale, weights)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    for a, b_, name in zip(got[1:], want[1:], ("dz", "dcodes", "dscale")):
        assert_close_grad(a, b_, name)


def test_torch_compile_failure_warns_once_and_falls_back_to_the_loop(monkeypatch):
    mod = _torch_module()
    import torch

    def broken_compile(fn, **kwargs):
        def run(*args):
            raise RuntimeError("no C++ compiler (simulated)")
        return run

    monkeypatch.setattr(mod, "_COMPILED", mod._Compiled())
    monkeypatch.setattr(torch, "compile", broken_compile)
    rng = np.random.default_rng(14)
    z, codes, labels, scale = random_problem(rng, 5, 70, 3)
    weights = np.ones(5, np.float32)
    y, valid = to_backend(labels), all_valid(5)

    def fn(z, c, s):
        return mod.cross_entropy(z, c, y, valid, s, 16)

    with pytest.warns(RuntimeWarning, match="torch.compile of the streaming ECOC loss failed"):
        got = loss_and_grads(fn, z, codes, scale, weights)
    assert "no C++ compiler (simulated)" in mod.compile_status()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: the second call is silent
        again = loss_and_grads(fn, z, codes, scale, weights)
    want = ref_loss_and_grads(z, codes, labels, scale, weights)
    for out in (got, again):
        np.testing.assert_allclose(out[0], want[0], rtol=1e-5, atol=1e-5)
        for a, b_, name in zip(out[1:], want[1:], ("dz", "dcodes", "dscale")):
            assert_close_grad(a, b_, name)


def test_keras_fit_with_trainable_codes_and_scale_on_the_streaming_path(non_fused):
    _module()
    non_fused.setenv(_dispatch.ENV_PATH, "streaming")
    rng = np.random.default_rng(12)
    n, k = 40, 8
    x = rng.normal(size=(64, 10)).astype(np.float32)
    y = (np.abs(x[:, 0] * 7).astype(np.int64) % n).astype(np.int32)

    class Head(keras.layers.Layer):
        def build(self, input_shape):
            self.codes = self.add_weight(shape=(n, k), initializer="random_normal", name="codes")
            self.log_scale = self.add_weight(shape=(), initializer="zeros", name="log_scale")

        def call(self, z):
            return z

    head = Head()
    inputs = keras.Input((10,))
    outputs = head(keras.layers.Dense(k)(keras.layers.Dense(16, activation="relu")(inputs)))
    model = keras.Model(inputs, outputs)

    def loss_fn(y_true, y_pred):
        labels = keras.ops.cast(keras.ops.reshape(y_true, (-1,)), "int32")
        return eops.ecoc_cross_entropy(labels, y_pred, head.codes,
                                       keras.ops.exp(head.log_scale) * 4.0)

    codes_before = np.asarray(head.codes.numpy() if hasattr(head.codes, "numpy") else head.codes)
    model.compile(optimizer=keras.optimizers.Adam(0.02), loss=loss_fn)
    history = model.fit(x, y, batch_size=16, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert not np.allclose(keras.ops.convert_to_numpy(head.codes), codes_before)
    assert float(keras.ops.convert_to_numpy(head.log_scale)) != 0.0
