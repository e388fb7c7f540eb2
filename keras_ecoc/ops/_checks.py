"""Argument checks shared by every path of :mod:`keras_ecoc.ops`.

The rules (the same on the fused op, the streaming JAX / PyTorch / TensorFlow
implementations and the dense path):

* ``scale`` must be a finite number > 0. A bool is rejected (``True`` is not a
  temperature). The value is checked when it is a host value (a Python or
  NumPy number); a tensor or variable is checked for dtype and shape only,
  never read (that would copy it from the device on every call).
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


def _scale_error(detail: str, received: str) -> ValueError:
    return ValueError(f"Argument `scale` must be {detail}. Received: {received}")


def host_scale(scale) -> float:
    """`scale` given as a Python or NumPy number (or a one-element NumPy
    array) as a Python float; raises unless it is finite and > 0. A bool is
    rejected: ``True`` is not a temperature."""
    if isinstance(scale, (bool, np.bool_)):
        raise _scale_error("a finite number > 0 (a bool is not accepted)", f"scale={scale!r}")
    if isinstance(scale, (int, float)):
        # Plain Python, without NumPy: torch.compile(fullgraph=True) traces
        # this check, and cannot trace np.asarray.
        value = float(scale)
    elif isinstance(scale, (numbers.Number, np.ndarray, np.generic)):
        arr = np.asarray(scale)
        if arr.dtype == np.bool_:
            raise _scale_error("a finite number > 0, not a boolean array", f"scale={scale!r}")
        if arr.size != 1:
            raise _scale_error("a scalar", f"scale with shape {arr.shape}")
        try:
            value = float(arr.reshape(()))
        except (TypeError, ValueError):  # complex, object arrays
            raise _scale_error("a finite number > 0", f"scale={scale!r}") from None
    else:
        raise _scale_error("a finite number > 0", f"scale={scale!r}")
    if not (math.isfinite(value) and value > 0):
        raise _scale_error("a finite number > 0", f"scale={value}")
    return value


def check_scale(scale) -> None:
    """Raises ValueError unless `scale` is a finite number > 0 (host values)
    or a scalar numeric tensor. The one rule for `scale` in the package: the
    Keras objects apply `host_scale` when they are constructed, the function
    APIs apply this on every call.

    Python and NumPy numbers are checked by value. A tensor or variable is
    checked for dtype and shape only: reading its value would copy it from
    the device on every call (a sync per step on eager PyTorch).
    """
    if isinstance(scale, (bool, np.bool_, numbers.Number, np.ndarray, np.generic)):
        host_scale(scale)
        return
    dtype = getattr(scale, "dtype", None)
    if dtype is None:  # None, a string, a list: nothing that is a number
        raise _scale_error("a finite number > 0 or a scalar float tensor", f"scale={scale!r}")
    if "bool" in str(dtype):
        raise _scale_error("a finite number > 0, not a boolean tensor", f"scale with dtype {dtype}")
    if not any(kind in str(dtype) for kind in ("float", "int")):
        raise _scale_error("a finite number > 0 or a scalar float tensor", f"scale with dtype {dtype}")
    shape = tuple(getattr(scale, "shape", ()) or ())
    n_elems = int(np.prod(shape)) if shape and None not in shape else 1
    if n_elems != 1:
        raise _scale_error("a scalar", f"scale with shape {shape}")


def _static_shape(x):
    """A tuple of ints / None, or None when even the rank is unknown."""
    shape = getattr(x, "shape", None)
    if shape is None:  # Python data: a number, a (nested) list
        return tuple(np.shape(x))
    try:
        return tuple(None if d is None else int(d) for d in shape)
    except (TypeError, ValueError):  # a TensorShape of unknown rank
        return None


def labels_with_batch_shape(labels, z):
    """`labels` of shape z.shape[:-1]: one class id per row of z.

    The one rule for the shape of labels, on every path and backend: z's
    batch shape, or that shape + (1,) (Keras-style sparse targets), whose
    last axis is squeezed here. Anything else raises, where a flatten would
    silently pair a (1, B) or (B, 1, 1) tensor with the rows of z on some
    paths, and a broadcast would compare every label with every row on
    others. Dimensions unknown at trace time are not compared.
    """
    batch = _static_shape(z)
    got = original = _static_shape(labels)
    if batch is None or got is None:
        return labels
    batch = batch[:-1]
    if len(got) == len(batch) + 1 and got[-1] in (1, None):
        if isinstance(labels, np.ndarray):
            labels = labels.reshape(labels.shape[:-1])
        else:
            from keras import ops as kops  # noqa: PLC0415

            if got[-1] == 1:
                labels = kops.squeeze(labels, axis=-1)
            else:  # unknown until run time (TF's squeeze refuses a None axis)
                labels = kops.reshape(labels, kops.shape(labels)[:-1])
        got = got[:-1]
    if len(got) != len(batch):
        raise ValueError(
            f"Argument `labels` must have z's batch shape {batch} (one class id per "
            f"row of z), or {batch + (1,)}. Received: labels with shape {original}"
        )
    for a, b in zip(got, batch):
        if a is not None and b is not None and a != b:
            if len(batch) == 1:
                raise ValueError(
                    f"z has batch size {b} but labels has {a} elements; they must be equal")
            raise ValueError(
                f"Argument `labels` must have z's batch shape {batch}. Received: labels "
                f"with shape {got}")
    return labels


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
    classes, and that is an error. Bool and other dtypes are rejected. A
    value that is not a whole number in [0, n) (NaN, an infinity, 2.5)
    becomes -1, an invalid label: a NaN loss, rank n, never a hit, as for an
    integer label out of range (a cast alone made NaN class 0 under XLA).
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
    ops = keras.ops
    whole = ops.round(labels)
    valid = ops.logical_and(
        ops.equal(whole, labels),  # False for NaN; +-inf fail the range test
        ops.logical_and(ops.greater_equal(labels, 0), ops.less(labels, num_classes)),
    )
    # -1 replaces the invalid values before the cast, which NaN must not reach.
    return ops.cast(ops.where(valid, whole, -1), "int32")


def check_label_values(labels, num_classes: int, backend: str) -> None:
    """Raises for host labels (NumPy / Python data) outside [0, n).

    A backend tensor's values are not read (that would be a device-to-host
    copy on every call): its invalid labels give a NaN loss and a zero
    gradient in the program, on every path.
    """
    if num_classes is None or not isinstance(
        labels, (np.ndarray, np.generic, numbers.Number, list, tuple)
    ):
        return
    arr = np.asarray(labels)
    if arr.size == 0:
        return
    lo, hi = arr.min(), arr.max()
    if lo < 0 or hi >= num_classes:
        _range_error(arr, num_classes)
