"""Backend-neutral ECOC decoding math: the pure-Keras path.

Everything here is written with `keras.ops`, so it runs on the TensorFlow, JAX
and PyTorch backends and under XLA. It is the reference the fused TensorFlow
op (`keras_ecoc.ops`) must agree with, and the fallback whenever that op is not
available.

Notation used in every docstring:
    z:      (..., k) network outputs (any float dtype; math is float32).
    codes:  (n, k) code matrix M, one codeword per class.
    u:      z / ||z||, with ||z||^2 floored at `EPSILON` so z = 0 gives u = 0
            (and, there, a zero gradient: see `normalize`).
    logits: (..., n) with logits_i = -1/2 * scale * ||M_i - u||^2.
"""

from keras import ops

from keras_ecoc.ops._constants import EPSILON


def normalize(z, epsilon=EPSILON):
    """Projects `z` onto the unit sphere, safely at z = 0.

    The direction of z = 0 is undefined, and the derivative of z / ||z||
    grows as 1 / ||z||. With the floor alone a row with ||z||^2 <= epsilon
    (a zero-padded input, features of a dead ReLU layer with zero biases)
    would get 1 / sqrt(epsilon) = 10^6 times the gradient with respect to u:
    one SGD step then moved a zero-initialised head bias to 5,000, and under
    mixed_float16 the gradient overflowed to inf, so the loss-scale
    optimizer skipped every step. Such a row keeps its value (u = z /
    sqrt(epsilon), about 0) and gets a zero gradient instead, on every path
    of the package (the fused and streaming backward passes apply the same
    rule). A head whose every output starts at exactly 0 therefore does not
    move: initialise the projection randomly (Keras' default).

    Args:
        z: float tensor of shape (..., k).
        epsilon: floor on the squared norm.

    Returns:
        float32 tensor u of shape (..., k): z * rsqrt(max(||z||^2, epsilon)).
    """
    z = ops.cast(z, "float32")
    squared_norm = ops.sum(ops.square(z), axis=-1, keepdims=True)
    u = z * ops.rsqrt(ops.maximum(squared_norm, epsilon))
    return ops.where(squared_norm > epsilon, u, ops.stop_gradient(u))


def decode_logits(z, codes, scale=1.0):
    """Class logits of ECOC outputs: -1/2 * scale * ||M_i - z/||z||||^2.

    Expands the squared distance as ||M_i||^2 - 2 M_i.u + ||u||^2 so the work
    is one (.., k) x (k, n) matrix product instead of a (..., n, k) difference.

    Args:
        z: float tensor of shape (..., k).
        codes: float tensor of shape (n, k).
        scale: positive float or scalar tensor (a temperature: logits are
            multiplied by it).

    Returns:
        float32 tensor of shape (..., n).
    """
    u = normalize(z)
    codes = ops.cast(codes, "float32")
    code_sqnorm = ops.sum(ops.square(codes), axis=-1)
    u_sqnorm = ops.sum(ops.square(u), axis=-1, keepdims=True)
    dots = ops.matmul(u, ops.transpose(codes))
    squared_distance = code_sqnorm - 2.0 * dots + u_sqnorm
    return -0.5 * ops.cast(scale, "float32") * squared_distance


def cross_entropy(labels, z, codes, scale=1.0):
    """Per-example softmax cross-entropy of the decoded logits.

    loss = logsumexp_i(logits_i) - logits_label, the same value as
    `sparse_categorical_crossentropy(labels, decode_logits(z, codes, scale),
    from_logits=True)`.

    Labels outside [0, n) cannot raise inside a compiled function, so they give
    a NaN loss rather than a silently wrong number.

    Args:
        labels: integer tensor of shape (...,).
        z: float tensor of shape (..., k).
        codes: float tensor of shape (n, k).
        scale: positive float or scalar tensor.

    Returns:
        float32 tensor of shape (...,).
    """
    logits = decode_logits(z, codes, scale)
    valid, safe_labels = _checked_labels(labels, ops.shape(logits)[-1])
    label_logit = ops.take_along_axis(
        logits, ops.expand_dims(safe_labels, -1), axis=-1
    )[..., 0]
    loss = ops.logsumexp(logits, axis=-1) - label_logit
    return ops.where(valid, loss, ops.full_like(loss, float("nan")))


def nearest_codeword(z, codes):
    """Index of the nearest codeword to z / ||z||, i.e. the predicted class.

    Args:
        z: float tensor of shape (..., k).
        codes: float tensor of shape (n, k).

    Returns:
        int32 tensor of shape (...,); ties go to the smallest index. Rows
        with a non-finite logit (a NaN or infinite z, or a non-finite
        codeword) get -1: they never decode to a valid class.
    """
    logits = decode_logits(z, codes)
    index = ops.cast(ops.argmax(logits, axis=-1), "int32")
    return ops.where(_row_non_finite(logits), -1, index)


def label_rank(labels, z, codes):
    """How many classes decode strictly closer to z than the label's codeword.

    0 means a correct top-1 prediction; `rank < k` is top-k correctness.

    Args:
        labels: integer tensor of shape (...,), values in [0, n).
        z: float tensor of shape (..., k).
        codes: float tensor of shape (n, k).

    Returns:
        int32 tensor of shape (...,); n for rows with a non-finite logit (a
        NaN or infinite z, or a non-finite codeword) or whose label is
        outside [0, n), so they never count as correct.
    """
    logits = decode_logits(z, codes)
    num_classes = ops.shape(logits)[-1]
    valid, safe_labels = _checked_labels(labels, num_classes)
    label_logit = ops.take_along_axis(
        logits, ops.expand_dims(safe_labels, -1), axis=-1
    )
    rank = ops.sum(ops.cast(logits > label_logit, "int32"), -1)
    never = ops.logical_or(ops.logical_not(valid), _row_non_finite(logits))
    return ops.cast(ops.where(never, num_classes, rank), "int32")


def _checked_labels(labels, num_classes):
    """(valid, safe_labels): validity of integer labels and int32 ids.

    The range check runs in the labels' own integer dtype, before any
    narrowing, so an int64 label at or above 2^31 cannot wrap into range.
    Invalid labels are replaced by 0 in `safe_labels` (used only to gather).
    """
    labels = ops.convert_to_tensor(labels)
    valid = ops.logical_and(labels >= 0, labels < num_classes)
    safe_labels = ops.where(valid, labels, ops.zeros_like(labels))
    return valid, ops.cast(safe_labels, "int32")


def _row_non_finite(logits):
    """(...,) bool: whether a row of logits holds a NaN or an infinity.

    With finite z and codes every logit is finite (u is on the unit sphere),
    so a non-finite one means a non-finite z or codeword.
    """
    return ops.logical_not(ops.all(ops.isfinite(logits), axis=-1))
