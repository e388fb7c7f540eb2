"""Argument checks shared by the layer, the loss, the metrics and the model.

Each check raises a `ValueError` that names the argument, the expected form
and what was received, in the style of Keras' own errors.
"""

import base64
import numbers
import warnings
import weakref

import numpy as np
from keras import ops

from keras_ecoc.codes import validate_codes


def codes_array(codes, name="codes"):
    """Returns `codes` as a validated float32 (n, k) NumPy array.

    Accepts anything array-like, including a tensor of any backend.
    """
    if codes is None:
        raise ValueError(
            f"Argument `{name}` is required: a (num_classes, code_length) code "
            f"matrix, e.g. from `keras_ecoc.codes`. Received: {name}=None"
        )
    if isinstance(codes, dict):
        codes = codes_from_config(codes)
    elif not isinstance(codes, np.ndarray):
        codes = ops.convert_to_numpy(codes)
    return validate_codes(codes, name=name)


def positive_scale(scale):
    """Returns `scale` (a Keras object's constructor argument) as a finite
    Python float > 0; the rule and wording are `ops._checks.host_scale`'s.
    A concrete (eager) scalar tensor is read once, here."""
    from keras_ecoc.ops import _checks  # noqa: PLC0415

    if getattr(scale, "dtype", None) is not None and not isinstance(scale, (np.ndarray, np.generic)):
        _checks.check_scale(scale)  # dtype and shape, with the rule's wording
        try:
            scale = ops.convert_to_numpy(scale)
        except Exception:  # noqa: BLE001 - symbolic: no value to check here
            raise ValueError(
                "Argument `scale` must be a finite number > 0 or a concrete scalar "
                f"tensor when the object is constructed. Received: scale={scale!r}"
            ) from None
    return _checks.host_scale(scale)


def _is_variable(value):
    import keras  # noqa: PLC0415

    if isinstance(value, keras.Variable):
        return True
    # Backend variables (tf.Variable, ...) hold weights that may be replaced
    # later (a NaN placeholder before a load): never inspect their values.
    return "Variable" in type(value).__name__


def function_codes(codes, name="codes"):
    """Codes passed to the function API, checked as far as they are known.

    Lists and NumPy arrays are converted to a validated float32 (n, k) array
    (rank 2, finite, distinct rows). A concrete (eager) tensor is checked the
    same way the first time it is passed and returned as it is (see
    `_validated_before`: the same tensor is not read again). Variables
    (a layer's `codes` weight) and symbolic tensors are returned unchanged
    after a check of their static rank, since their values are either not
    known yet or owned by a layer that validated them.
    """
    if codes is None or isinstance(codes, (list, tuple, np.ndarray, dict)):
        return codes_array(codes, name)
    shape = getattr(codes, "shape", None)
    if shape is None:
        return codes_array(codes, name)
    if len(shape) != 2:
        raise ValueError(
            f"Argument `{name}` must be a 2-D (num_classes, code_length) code "
            f"matrix. Received: {name} of shape {tuple(shape)}"
        )
    if _is_variable(codes) or _validated_before(codes):
        return codes
    try:
        values = ops.convert_to_numpy(codes)
    except Exception:  # Symbolic / traced: values unknown.
        return codes
    codes_array(values, name)  # raises for bad codes
    _remember_validated(codes)
    # The tensor itself, not its host copy: it stays where it is, and the
    # next call with the same tensor skips the device-to-host copy and the
    # check (`_validated_before`).
    return codes


# Concrete code tensors that passed `function_codes`, by id: a weak reference
# (so a dead tensor's id is never mistaken for a new one) and PyTorch's
# in-place version counter (a tensor changed in place is checked again; JAX
# and TensorFlow tensors are immutable).
_VALIDATED = {}


def _validated_before(codes):
    entry = _VALIDATED.get(id(codes))
    return (entry is not None and entry[0]() is codes
            and entry[1] == getattr(codes, "_version", None))


def _remember_validated(codes):
    key = id(codes)
    try:
        ref = weakref.ref(codes, lambda _: _VALIDATED.pop(key, None))
    except TypeError:  # not weak-referenceable: checked on every call
        return
    _VALIDATED[key] = (ref, getattr(codes, "_version", None))


def function_scale(scale):
    """`scale` of the function API: a finite number > 0 (returned as a
    float) or a scalar numeric tensor or variable (returned as it is, checked
    for dtype and shape only: its value is never read, which would copy it
    from the device on every call). The rule is `ops._checks.check_scale`'s."""
    from keras_ecoc.ops import _checks  # noqa: PLC0415

    if isinstance(scale, (numbers.Number, np.ndarray, np.generic)):
        return _checks.host_scale(scale)
    _checks.check_scale(scale)
    return scale


def check_code_length(z_shape, code_length, name="z"):
    """Raises if the last dimension of `z_shape` is known and is not k."""
    if not z_shape:
        raise ValueError(
            f"`{name}` must have shape (..., {code_length}): one value per "
            f"code bit. Received: {name}.shape={tuple(z_shape)}"
        )
    last = z_shape[-1]
    if last is not None and int(last) != int(code_length):
        raise ValueError(
            f"The last dimension of `{name}` must equal the code length "
            f"{code_length} of the codes. Received: {name}.shape="
            f"{tuple(z_shape)}"
        )


def concrete_labels_in_range(labels, num_classes, name="labels"):
    """Raises if host labels (NumPy / Python data) fall outside [0, n).

    Only host data is checked: a tensor's values are never read (a
    device-to-host copy per call); for tensors the math itself yields a NaN
    loss (rank n for the metrics).
    """
    if not isinstance(labels, (np.ndarray, np.generic, list, tuple, int)):
        return
    values = np.asarray(labels)
    if values.dtype == np.bool_ or not (np.issubdtype(values.dtype, np.integer)
                                        or np.issubdtype(values.dtype, np.floating)):
        # np.array([False, True]) would otherwise be read as classes 0 and 1.
        raise ValueError(
            f"`{name}` must hold integer class ids in [0, {num_classes}). "
            f"Received: {name} with dtype {values.dtype}")
    if values.size == 0:
        return
    if np.issubdtype(values.dtype, np.floating):
        if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
            raise ValueError(
                f"`{name}` must hold integer class ids in [0, {num_classes}). "
                f"Received non-integer values, e.g. {name}="
                f"{values[values != np.round(values)][:5]}"
            )
    if values.min() >= 0 and values.max() < num_classes:
        return
    bad = (values < 0) | (values >= num_classes)
    raise ValueError(
        f"`{name}` must hold integer class ids in [0, {num_classes}). "
        f"Received out-of-range values {np.unique(values[bad])[:10]} "
        f"(first at flat position {int(np.flatnonzero(bad)[0])})."
    )


# Code matrices up to this many entries go into configs as nested lists
# (readable JSON); larger ones as base64 float32 bytes, 3x more compact.
MAX_LIST_CODE_ENTRIES = 1_024

# The largest code matrix (in entries) written into a layer, loss or metric
# config: 4,096 float32 values are about 22 KB of base64, so a config.json
# stays well under 100 KB. Larger codes live only in the weights of an
# `ECOCDecoder` (README, "Saving").
MAX_CONFIG_CODE_ENTRIES = 4_096


def codes_to_config(codes):
    """JSON-friendly form of a (n, k) float32 code matrix."""
    codes = np.ascontiguousarray(codes, dtype="float32")
    if codes.size <= MAX_LIST_CODE_ENTRIES:
        return codes.tolist()
    return {
        "shape": list(codes.shape),
        "float32_base64": base64.b64encode(codes.tobytes()).decode("ascii"),
    }


def codes_from_config(value):
    """Inverse of `codes_to_config`."""
    if isinstance(value, dict) and "float32_base64" in value:
        raw = base64.b64decode(value["float32_base64"])
        return np.frombuffer(raw, dtype="float32").reshape(value["shape"]).copy()
    return np.asarray(value, dtype="float32")


# Relative spread of codeword norms above which decoding is warned about.
ROW_NORM_TOLERANCE = 0.05


def warn_if_unequal_row_norms(codes, name="codes", stacklevel=3):
    """Warns when codewords have clearly different norms.

    u = z / ||z|| lives on the unit sphere, so the logit of class i is
    scale * (M_i . u - ||M_i||^2 / 2) + const: a codeword with a larger norm
    pays a larger constant penalty, and one far from the others' norms can be
    impossible to predict. Raw Gaussian and raw spectral codes have this
    property; ±1 codes do not. `keras_ecoc.codes.normalize_rows` fixes it.

    The norms are computed in float64 over blocks of rows, so a million-class
    matrix needs no float64 copy.
    """
    codes = np.asarray(codes)
    norms = np.empty(codes.shape[0], np.float64)
    step = max(1, (1 << 22) // max(1, codes.shape[1]))
    for i in range(0, codes.shape[0], step):
        norms[i : i + step] = np.linalg.norm(
            codes[i : i + step].astype(np.float64), axis=1
        )
    mean = norms.mean()
    if mean > 0 and (norms.max() - norms.min()) / mean > ROW_NORM_TOLERANCE:
        warnings.warn(
            f"The codewords in `{name}` have unequal norms (from "
            f"{norms.min():.3g} to {norms.max():.3g}). Decoding compares them "
            "with z / ||z|| on the unit sphere, so classes whose codeword "
            "norm is far from the others' are hard or impossible to predict. "
            "Use `keras_ecoc.codes.normalize_rows(codes)` unless this is "
            "intended.",
            stacklevel=stacklevel,
        )
