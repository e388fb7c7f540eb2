"""The fused TensorFlow path: the op library's ops, their gradient and input preparation.

The op library (keras_ecoc/_lib/_ecoc_ops.so) is found, loaded and checked by
:mod:`keras_ecoc.ops._loader`; this module calls its ops. Eagerly and in
graph mode they run the CPU (or CUDA) OpKernels; under XLA
(``jit_compile=True``) their XLA kernels emit a custom call to the kernel
library's FFI handlers (or, where those could not be registered, the HLO
lowering); `_loader.fused_status()` says which.

Shapes: z (..., k) float32 / float16 / bfloat16, codes (n, k), labels (...,)
int32 / int64 (or Keras-style (B, 1)), scale () float32; leading batch
dimensions are flattened and restored.
"""

from __future__ import annotations

from keras_ecoc.ops import _loader
from keras_ecoc.ops._constants import EPSILON

SECOND_ORDER_MESSAGE = (
    "keras_ecoc: the fused ECOC loss has no second derivative (its gradient "
    "reads kernel outputs that are not differentiated again). For a Hessian, "
    "a gradient penalty or any gradient of a gradient, call the loss with "
    "fused=False (or set KERAS_ECOC_DISABLE_FUSED=1): TensorFlow's streaming "
    "and dense paths are twice differentiable."
)


def _lib():
    lib = _loader.load_library()
    if lib is None:
        raise RuntimeError(f"the fused TensorFlow op is not loaded: {_loader.fused_status()}")
    return lib


def cross_entropy(z, codes, labels, scale):
    """Per-example loss, float32 of shape z.shape[:-1]."""
    import tensorflow as tf  # noqa: PLC0415

    z2, codes, batch_shape, flat, labels, scale = _prepare(tf, z, codes, labels, scale)
    loss = _lib().ecoc_cross_entropy(z2, codes, labels, scale, epsilon=EPSILON)[0]
    return tf.reshape(loss, batch_shape) if flat else loss


def label_rank(z, codes, labels):
    """int32 (...,) rank of the label."""
    import tensorflow as tf  # noqa: PLC0415

    z2, codes, batch_shape, flat, labels = _prepare(tf, z, codes, labels)
    rank = _lib().ecoc_label_rank(z2, codes, labels, epsilon=EPSILON)
    return tf.reshape(rank, batch_shape) if flat else rank


def nearest_codeword(z, codes):
    """int32 (...,) index of the nearest codeword (-1 for non-finite rows)."""
    import tensorflow as tf  # noqa: PLC0415

    z2, codes, batch_shape, flat = _prepare(tf, z, codes)
    index = tf.cast(_lib().ecoc_nearest_codeword(z2, codes, epsilon=EPSILON), tf.int32)
    return tf.reshape(index, batch_shape) if flat else index


def _prepare(tf, z, codes, labels=None, scale=None):
    """Converts the inputs for the raw ops; flattens leading batch dims."""
    z = tf.convert_to_tensor(z)
    if z.dtype not in (tf.float32, tf.float16, tf.bfloat16):
        z = tf.cast(z, tf.float32)
    codes = tf.cast(tf.convert_to_tensor(codes), tf.float32)
    if z.shape.rank is not None and z.shape.rank < 1:
        raise ValueError(f"z must have at least one dimension (the code length), got shape {z.shape}")
    if codes.shape.rank is not None and codes.shape.rank != 2:
        raise ValueError(f"codes must be a matrix [num_classes, code_length], got shape {codes.shape}")
    k_z, k_c = z.shape[-1], codes.shape[-1]
    if k_z is not None and k_c is not None and k_z != k_c:
        raise ValueError(
            f"z has code length (last dimension) {k_z} but codes has code length {k_c}; "
            "they must be equal"
        )
    batch_shape = tf.shape(z)[:-1]
    flat = z.shape.rank != 2
    if flat:
        z = tf.reshape(z, tf.stack([-1, tf.shape(z)[-1]]))
    out = [z, codes, batch_shape, flat]
    if labels is not None:
        labels = tf.convert_to_tensor(labels)
        if labels.dtype in (tf.uint32, tf.uint64):
            # int32 would wrap 2^32 + 1 into class 1. int64 holds every
            # uint32 exactly and turns uint64 values >= 2^63 negative, which
            # the op treats as invalid, like every other label outside [0, n).
            labels = tf.cast(labels, tf.int64)
        elif labels.dtype not in (tf.int32, tf.int64):
            labels = tf.cast(labels, tf.int32)
        if flat or (labels.shape.rank == 2 and labels.shape[-1] == 1):
            labels = tf.reshape(labels, [-1])  # also Keras-style (B, 1) sparse labels
        b_z = z.shape[0]
        b_y = labels.shape[0] if labels.shape.rank == 1 else None
        if b_z is not None and b_y is not None and b_z != b_y:
            raise ValueError(
                f"z has batch size {b_z} but labels has {b_y} elements; they must be equal"
            )
        out.append(labels)
    if scale is not None:
        scale = tf.reshape(tf.cast(tf.convert_to_tensor(scale), tf.float32), [])
        out.append(scale)
    return out


def register_gradients(tf, lib) -> None:
    """Registers the gradient of EcocCrossEntropy (called once, by the loader)."""
    def register(name, fn):
        try:
            tf.RegisterGradient(name)(fn)
        except KeyError:  # already registered (e.g. module reloaded)
            pass

    def cross_entropy_grad(op, g_loss, g_lse, g_ec, g_esq):
        # Gradients of the auxiliary outputs expected_code / expected_sqnorm
        # are not propagated (they are inputs to this very gradient).
        del g_ec, g_esq
        return _cross_entropy_grad(tf, lib, op, g_loss, g_lse)

    register("EcocCrossEntropy", cross_entropy_grad)
    for name in ("EcocLabelRank", "EcocNearestCodeword"):
        try:
            tf.no_gradient(name)
        except KeyError:
            pass


def _is_all_zero_eager(tf, x) -> bool:
    return tf.executing_eagerly() and not bool(tf.reduce_any(tf.not_equal(x, 0.0)))


def _cross_entropy_grad(tf, lib, op, g_loss, g_lse):
    """Gradient of EcocCrossEntropy (see kernels/ecoc_ops.cc for the math).

    With u = z r, r = rsqrt(max(||z||^2, eps)), p = softmax of the logits,
    E = sum_i p_i M_i (expected_code), Q = sum_i p_i ||M_i||^2:
      dloss/du = s (E - M_y)              dlse/du = s (E - u)
      dloss/ds = -0.5 (Q - ||M_y||^2) + (E - M_y).u
      dlse/ds  = -0.5 Q + E.u - 0.5 ||u||^2
      dz = r (du - (u.du) u) if ||z||^2 > eps else 0
      dcodes via the EcocCrossEntropyCodesGrad op (streams over the batch).
    """
    z, codes, labels, scale = op.inputs
    # The residuals are kernel outputs whose own gradients this function does
    # not propagate, so a gradient of this gradient would be silently wrong
    # (a Hessian off by 20% and more). PreventGradient makes that an error.
    lse, expected_code, expected_sqnorm = (
        tf.raw_ops.PreventGradient(input=t, message=SECOND_ORDER_MESSAGE)
        for t in op.outputs[1:])
    eps = op.get_attr("epsilon")
    skip = set(getattr(op, "skip_input_indices", None) or ())
    if g_lse is not None and _is_all_zero_eager(tf, g_lse):
        g_lse = None
    if g_loss is None:
        g_loss = tf.zeros_like(lse)
    # A label outside [0, n) has a NaN loss (under XLA; it raises elsewhere)
    # and must give a zero gradient, as on the pure-Keras path; tf.gather
    # below would otherwise clamp it to class 0 or n - 1 under XLA.
    n = tf.shape(codes, out_type=labels.dtype)[0]
    label_ok = tf.logical_and(labels >= 0, labels < n)
    g_loss = tf.where(label_ok, g_loss, tf.zeros_like(g_loss))
    if g_lse is not None:
        g_lse = tf.where(label_ok, g_lse, tf.zeros_like(g_lse))

    zf = tf.cast(z, tf.float32)
    sqnorm = tf.reduce_sum(tf.square(zf), axis=-1, keepdims=True)
    r = tf.math.rsqrt(tf.maximum(sqnorm, eps))
    u = zf * r
    m_y = tf.gather(codes, labels)
    diff = expected_code - m_y
    g_s = g_loss * scale

    grad_z = grad_scale = grad_codes = None
    if 0 not in skip:
        du = g_s[:, None] * diff
        if g_lse is not None:
            du += (g_lse * scale)[:, None] * (expected_code - u)
        # At ||z||^2 <= eps the direction is undefined: gradient 0 (see
        # keras_ecoc.decoding.normalize).
        tangent = r * (du - tf.reduce_sum(u * du, axis=-1, keepdims=True) * u)
        grad_z = tf.cast(tf.where(sqnorm > eps, tangent, tf.zeros_like(tangent)), z.dtype)
    if 3 not in skip:
        per_example = g_loss * (
            -0.5 * (expected_sqnorm - tf.reduce_sum(tf.square(m_y), axis=-1))
            + tf.reduce_sum(diff * u, axis=-1)
        )
        if g_lse is not None:
            per_example += g_lse * (
                -0.5 * expected_sqnorm
                + tf.reduce_sum(expected_code * u, axis=-1)
                - 0.5 * tf.reduce_sum(tf.square(u), axis=-1)
            )
        grad_scale = tf.reshape(tf.reduce_sum(per_example), tf.shape(scale))
    if 1 not in skip:
        weights = g_loss if g_lse is None else g_loss + g_lse
        grad_codes = lib.ecoc_cross_entropy_codes_grad(
            z, codes, labels, scale, lse, weights, epsilon=eps
        )
        if g_lse is not None:
            # The op subtracts weights_b at the label; the lse part must not.
            grad_codes += tf.math.unsorted_segment_sum(
                (g_lse * scale)[:, None] * (u - m_y), labels, tf.shape(codes)[0]
            )
    return grad_z, grad_codes, None, grad_scale
