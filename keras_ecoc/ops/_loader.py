"""Loads the fused-op library once and registers its gradients.

This is the only place that calls ``tf.load_op_library`` on
``keras_ecoc/_lib/_ecoc_ops.so`` (loading an op library twice gives a module
without the op wrappers). TensorFlow is imported lazily, and only when the
Keras backend is TensorFlow, so that importing :mod:`keras_ecoc.ops` under the
JAX or PyTorch backends never imports TensorFlow.
"""

from __future__ import annotations

import os
import threading

_ENV_DISABLE = "KERAS_ECOC_DISABLE_FUSED"
_ENV_LIBRARY = "KERAS_ECOC_OPS_LIBRARY"
_LIB_NAME = "_ecoc_ops.so"
OP_NAMES = (
    "EcocCrossEntropy",
    "EcocCrossEntropyCodesGrad",
    "EcocLabelRank",
    "EcocNearestCodeword",
)

_lock = threading.Lock()
_state = {"attempted": False, "lib": None, "error": None, "path": None, "xla": None}


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def library_path() -> str:
    """Where the library is looked for (``$KERAS_ECOC_OPS_LIBRARY`` overrides)."""
    override = os.environ.get(_ENV_LIBRARY)
    if override:
        return override
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(package_dir, "_lib", _LIB_NAME)


def backend() -> str:
    import keras  # noqa: PLC0415

    return keras.backend.backend()


def disabled() -> bool:
    return _truthy(os.environ.get(_ENV_DISABLE))


def load_library():
    """Returns the loaded op module, or None (the reason is in `load_error()`).

    Never raises; only tries once per process. Does not import TensorFlow
    unless the Keras backend is TensorFlow.
    """
    if _state["attempted"]:
        return _state["lib"]
    if backend() != "tensorflow":
        return None
    with _lock:
        if _state["attempted"]:
            return _state["lib"]
        path = library_path()
        _state["path"] = path
        try:
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"{path} does not exist (build it with `python kernels/build.py` "
                    "or reinstall with `pip install --no-build-isolation -e .`)"
                )
            import tensorflow as tf  # noqa: PLC0415

            lib = tf.load_op_library(path)
            missing = [
                name
                for name in ("ecoc_cross_entropy", "ecoc_cross_entropy_codes_grad",
                             "ecoc_label_rank", "ecoc_nearest_codeword")
                if not hasattr(lib, name)
            ]
            if missing:
                raise ImportError(
                    f"{path} loaded but lacks the op wrappers {missing} (was an op "
                    "library with the same op names loaded before?)"
                )
            _register_gradients(tf, lib)
            _state["xla"] = _ensure_xla_kernels(path)
            _state["lib"] = lib
        except Exception as e:  # noqa: BLE001 - a failed load must never break import
            _state["error"] = f"{type(e).__name__}: {e}".strip()
            _state["lib"] = None
        finally:
            _state["attempted"] = True
    return _state["lib"]


def _ensure_xla_kernels(path: str) -> bool:
    """Registers the XLA kernels if TensorFlow's device context predates the load.

    TensorFlow turns XLA op registrations into XLA_*_JIT kernels once, when its
    device context is created; a library loaded later (lazily, on first use)
    would otherwise fail under jit_compile=True. Returns whether the library
    has XLA lowerings at all.
    """
    import ctypes  # noqa: PLC0415

    try:
        fn = ctypes.CDLL(path).KerasEcocEnsureXlaKernels
    except (OSError, AttributeError):
        return False  # built without the XLA part
    fn.restype = ctypes.c_int
    fn()
    return True


def load_error() -> str | None:
    return _state["error"]


def registered_devices(op_name: str = "EcocCrossEntropy") -> list[str]:
    """Device types with a registered kernel for `op_name` (after loading)."""
    if load_library() is None:
        return []
    from tensorflow.python.framework import kernels  # noqa: PLC0415

    found = {k.device_type for k in kernels.get_registered_kernels_for_op(op_name).kernel}
    return sorted(found)


def fused_available() -> bool:
    """True when the fused op is used: TF backend, library loaded, not disabled."""
    if disabled():
        return False
    if backend() != "tensorflow":
        return False
    return load_library() is not None


def fused_status() -> str:
    """One line saying whether the fused op is in use and, if not, why."""
    if disabled():
        return f"fused op disabled by {_ENV_DISABLE}; using the pure-Keras path"
    b = backend()
    if b != "tensorflow":
        return f"backend is {b}: using the pure-Keras path (the fused op is TensorFlow-only)"
    if load_library() is None:
        return f"library not built or not loadable: {load_error()}; using the pure-Keras path"
    devices = ", ".join(registered_devices()) or "no"
    xla = "with XLA lowerings" if _state["xla"] else "WITHOUT XLA lowerings (jit_compile=True will fail)"
    return f"fused op loaded from {_state['path']} ({devices} kernels, {xla})"


# ---------------------------------------------------------------------------
# Gradients.

def _register_gradients(tf, lib) -> None:
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
      dz = r (du - (u.du) u) if ||z||^2 > eps else r du
      dcodes via the EcocCrossEntropyCodesGrad op (streams over the batch).
    """
    z, codes, labels, scale = op.inputs
    _, lse, expected_code, expected_sqnorm = op.outputs
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
        radial = tf.reduce_sum(u * du, axis=-1, keepdims=True) * u
        radial = tf.where(sqnorm > eps, radial, tf.zeros_like(radial))
        grad_z = tf.cast(r * (du - radial), z.dtype)
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
