"""Argument checks shared by every path of :mod:`keras_ecoc.ops`.

The rules (the same on the fused op, the streaming JAX / PyTorch / TensorFlow
implementations and the dense path):

* ``scale`` must be a finite number > 0. A bool is rejected (``True`` is not a
  temperature). The value is checked whenever it is known: a Python number,
  a NumPy value, an eager tensor or a Keras variable outside a traced function.
  Inside ``jax.jit`` / ``tf.function`` / ``torch.compile`` it is not known and
  is not checked.
* ``labels`` must be integers. A float *tensor* is an error (float16 is exact
  only up to 2,048 and float32 up to 2^24, so a cast could silently change
  classes); only concrete NumPy / Python data that is float but integral-valued
  is accepted and converted exactly. Labels are never narrowed: where their
  values are known, any label outside [0, n) (including int64 values >= 2^31)
  raises; where they are not known (under a compiler) the path computes the
  validity mask in the labels' own dtype before any cast, and the row gets a
  NaN loss and a zero gradient.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

INT32_LIMIT = 2**31


def is_concrete(x, backend: str) -> bool:
    """Whether the value of a backend tensor is known now (not traced)."""
    if isinstance(x, (np.ndarray, np.generic, numbers.Number, list, tuple)):
        return True
    if backend == "jax":
        import jax  # noqa: PLC0415

        return not isinstance(x, jax.core.Tracer)
    if backend == "torch":
        import torch  # noqa: PLC0415

        if torch.compiler.is_compiling():
            return False
        return isinstance(x, torch.Tensor) and x.device.type != "meta"
    if backend == "tensorflow":
        import tensorflow as tf  # noqa: PLC0415

        if isinstance(x, tf.Variable):
            return tf.executing_eagerly()
        return isinstance(x, tf.__internal__.EagerTensor)
    return False


def _to_numpy(x):
    if hasattr(x, "detach"):  # torch
        x = x.detach().cpu()
    return np.asarray(x)


def _variable_value(x, backend):
    """A Keras variable's current value (the scoped value under stateless calls)."""
    import keras  # noqa: PLC0415

    if isinstance(x, keras.Variable):
        # Under a compiler this is a tracer / symbolic tensor (not concrete).
        if backend == "tensorflow":
            import tensorflow as tf  # noqa: PLC0415

            return tf.convert_to_tensor(x)
        return keras.ops.convert_to_tensor(x)
    return x


def check_scale(scale, backend: str) -> None:
    """Raises ValueError unless `scale` is (where known) a finite number > 0."""
    if isinstance(scale, (bool, np.bool_)):
        raise ValueError(
            "Argument `scale` must be a finite number > 0 (a bool is not accepted). "
            f"Received: scale={scale!r}"
        )
    if isinstance(scale, numbers.Number):
        value = float(scale)
    else:
        scale = _variable_value(scale, backend)
        dtype = getattr(scale, "dtype", None)
        if dtype is not None and "bool" in str(dtype):
            raise ValueError(
                "Argument `scale` must be a finite number > 0, not a boolean tensor. "
                f"Received: scale with dtype {dtype}"
            )
        shape = tuple(getattr(scale, "shape", ()) or ())
        n_elems = int(np.prod(shape)) if shape else 1
        if n_elems != 1 and None not in shape:
            raise ValueError(
                f"Argument `scale` must be a scalar. Received: scale with shape {shape}"
            )
        if not is_concrete(scale, backend):
            return
        value = float(_to_numpy(scale).reshape(()))
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"Argument `scale` must be a finite number > 0. Received: scale={value}")


def _range_error(labels_np: np.ndarray, num_classes: int) -> None:
    flat = labels_np.reshape(-1)
    bad = np.flatnonzero((flat < 0) | (flat >= num_classes))
    if bad.size:
        i = int(bad[0])
        value = int(flat[i])
        extra = " (int64 labels are never narrowed to int32)" if value >= INT32_LIMIT else ""
        raise ValueError(
            f"Argument `labels` must hold class indices in [0, {num_classes}): "
            f"labels[{i}] = {value} is outside the valid range [0, {num_classes}){extra}."
        )


def host_labels(labels):
    """Python / NumPy labels as an exact integer NumPy array (or None if `labels`
    is a backend tensor). Integral-valued float NumPy data is converted exactly;
    anything else that is not integer raises."""
    if not isinstance(labels, (np.ndarray, np.generic, numbers.Number, list, tuple)):
        return None
    arr = np.asarray(labels)
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer)
                                     or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(
            "Argument `labels` must be integer class indices. "
            f"Received: labels with dtype {arr.dtype}"
        )
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(
                "Argument `labels` must be integer class indices; a float array is only "
                "accepted when every value is an integer. Received: non-integral or "
                f"non-finite values in labels of dtype {arr.dtype}"
            )
        if arr.size and np.max(np.abs(arr)) >= 2.0**53:
            raise ValueError("Argument `labels` has float values too large to be exact class indices.")
        arr = arr.astype(np.int64)
    return arr


# Largest integer up to which every integer is exact in each float dtype: a
# float label tensor is accepted only when every class index < n is exact.
EXACT_INTEGER_LIMIT = {"float16": 2**11, "bfloat16": 2**8, "float32": 2**24, "float64": 2**53}


def integer_label_tensor(labels, num_classes):
    """A backend label tensor as integers; float tensors only where exact.

    Keras hands a plain-function loss `y_true` in float32 (its loss wrapper
    casts targets to the loss dtype), so float label tensors are common. They
    are cast to int32 when the float dtype represents every index below
    `num_classes` exactly (float32: n <= 2^24, float16: n <= 2048, bfloat16:
    n <= 256); otherwise the labels may already have been rounded into other
    classes, and that is an error. Bool and other dtypes are rejected.
    """
    import keras  # noqa: PLC0415

    dtype = keras.backend.standardize_dtype(getattr(labels, "dtype", "object"))
    if "int" in dtype and dtype != "bool":
        return labels
    limit = EXACT_INTEGER_LIMIT.get(dtype)
    if limit is None:
        raise ValueError(
            "Argument `labels` must be a tensor of integer class indices. "
            f"Received: labels with dtype {dtype}"
        )
    if num_classes is None or num_classes > limit:
        raise ValueError(
            f"Argument `labels` must be an integer tensor here: {dtype} holds integers "
            f"exactly only up to {limit}, but there are {num_classes} classes, so the "
            "labels may already have been rounded into other classes. Pass int32/int64 "
            f"labels. Received: labels with dtype {dtype}"
        )
    return keras.ops.cast(keras.ops.round(labels), "int32")


def check_label_values(labels, num_classes: int, backend: str) -> None:
    """Raises for labels outside [0, n) when their values are known."""
    if num_classes is None or not is_concrete(labels, backend):
        return
    arr = _to_numpy(labels)
    if arr.size == 0:
        return
    lo, hi = arr.min(), arr.max()
    if lo < 0 or hi >= num_classes:
        _range_error(arr, num_classes)
