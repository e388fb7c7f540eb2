"""Fused ECOC ops (TensorFlow) with a pure-Keras fallback.

The ECOC softmax cross-entropy over n classes with k-dimensional codes,

    u_b      = z_b * rsqrt(max(||z_b||^2, 1e-12))
    logit_bi = -0.5 * scale * ||M_i - u_b||^2
    loss_b   = logsumexp_i(logit_bi) - logit_{b, y_b},

is computed by a custom TensorFlow op that streams over the classes in tiles
with an online log-sum-exp (like flash attention / cut cross-entropy): it
never materialises the B x n logits, neither in the forward nor in the
backward pass, so its peak memory is O(B k + n k) instead of O(B n). The
forward also accumulates the softmax-expected code sum_i p_bi M_i and
sum_i p_bi ||M_i||^2, so the gradients with respect to z and scale need no
second pass over the classes; the gradient with respect to the codes (only
computed when requested) streams over the batch per class tile.

Kernels: CPU (multi-threaded, AVX2/FMA when the CPU has it, baseline x86-64
otherwise), CUDA (when the library was built with nvcc), and XLA lowerings so
that ``tf.function(jit_compile=True)`` and Keras ``jit_compile=True`` work. The
XLA lowering is tiled too: above 4M logits (B x n) it processes the classes in
tiles inside an XLA while loop carrying the same online log-sum-exp state;
below that it emits the dense computation (one tile). Under XLA an
out-of-range label gives a NaN loss instead of an error.

Dispatch: every function here uses the fused op when `fused_available()`
(the Keras backend is TensorFlow, the library loaded, and
``KERAS_ECOC_DISABLE_FUSED`` is not set), and otherwise the pure-Keras path of
:mod:`keras_ecoc.decoding`, which runs on every backend. When the backend is
TensorFlow but the library is missing, a warning is issued once.
`fused_status()` says which path is used and why.
"""

from __future__ import annotations

import warnings

from keras_ecoc.ops._loader import fused_available
from keras_ecoc.ops._loader import fused_status
from keras_ecoc.ops._loader import library_path
from keras_ecoc.ops._loader import load_library

__all__ = [
    "ecoc_cross_entropy",
    "label_rank",
    "nearest_codeword",
    "fused_available",
    "fused_status",
    "library_path",
    "load_library",
]

EPSILON = 1e-12
_warned = [False]


def _use_fused() -> bool:
    from keras_ecoc.ops import _loader  # noqa: PLC0415

    if fused_available():
        return True
    if (not _loader.disabled() and _loader.backend() == "tensorflow"
            and not _warned[0]):
        _warned[0] = True
        warnings.warn(
            "keras_ecoc.ops: the fused ECOC op is unavailable, falling back to the "
            f"pure-Keras path (B x n logits in memory): {fused_status()}",
            RuntimeWarning,
            stacklevel=3,
        )
    return False


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
        if labels.dtype not in (tf.int32, tf.int64):
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


def ecoc_cross_entropy(labels, z, codes, scale=1.0):
    """Per-example ECOC softmax cross-entropy, float32 of shape z.shape[:-1].

    Labels come first, as in `keras.ops.sparse_categorical_crossentropy(
    target, output)` and every Keras loss.

    Args:
        labels: (...,) integer class indices in [0, n).
        z: (..., k) network outputs (float32, float16 or bfloat16).
        codes: (n, k) code matrix (cast to float32); may be trainable.
        scale: positive Python float, scalar tensor or Keras variable (the
            logits are multiplied by it; differentiable).

    The fused op raises InvalidArgumentError for labels outside [0, n) when
    run eagerly or in a graph; under XLA such labels give a NaN loss (as the
    pure-Keras path does everywhere).
    """
    if not _use_fused():
        from keras_ecoc import decoding  # noqa: PLC0415

        return decoding.cross_entropy(labels, z, codes, scale)
    import tensorflow as tf  # noqa: PLC0415

    lib = load_library()
    z2, codes, batch_shape, flat, labels, scale = _prepare(tf, z, codes, labels, scale)
    loss = lib.ecoc_cross_entropy(z2, codes, labels, scale, epsilon=EPSILON)[0]
    return tf.reshape(loss, batch_shape) if flat else loss


def label_rank(labels, z, codes):
    """int32 (...,): how many classes have a strictly larger logit than the label.

    0 means a correct top-1 prediction; ``rank < K`` is top-K correctness.
    Rows whose label logit is NaN (NaN in z) get rank n, i.e. never correct.
    The scale does not change the order, so it is not an argument.
    """
    if not _use_fused():
        from keras_ecoc import decoding  # noqa: PLC0415

        return decoding.label_rank(labels, z, codes)
    import tensorflow as tf  # noqa: PLC0415

    lib = load_library()
    z2, codes, batch_shape, flat, labels = _prepare(tf, z, codes, labels)
    rank = lib.ecoc_label_rank(z2, codes, labels, epsilon=EPSILON)
    return tf.reshape(rank, batch_shape) if flat else rank


def nearest_codeword(z, codes):
    """int32 (...,): index of the nearest codeword (the argmax logit; ties go
    to the smallest index), like `keras_ecoc.decoding.nearest_codeword`."""
    if not _use_fused():
        from keras_ecoc import decoding  # noqa: PLC0415

        return decoding.nearest_codeword(z, codes)
    import tensorflow as tf  # noqa: PLC0415

    lib = load_library()
    z2, codes, batch_shape, flat = _prepare(tf, z, codes)
    index = tf.cast(lib.ecoc_nearest_codeword(z2, codes, epsilon=EPSILON), tf.int32)
    return tf.reshape(index, batch_shape) if flat else index
