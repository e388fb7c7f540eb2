"""The targets and outputs a loss or metric receives, as tensors to compute with.

Shared by `ECOCLoss` and the accuracy metrics: integer labels that never pass
through a float dtype (host data range-checked once, here), and z as a float
tensor.
"""

import keras
import numpy as np
from keras import ops

from keras_ecoc import _validation
from keras_ecoc.ops import _checks


def labels_for(y_true, y_pred):
    """Integer labels of shape y_pred.shape[:-1] from (...,) or (..., 1).

    Shapes only: values were checked where they entered (`labels_tensor`
    for host data); a tensor's out-of-range labels give a NaN loss (rank n
    for the metrics) in the program, without a device-to-host copy. Integer
    labels keep their integer dtype (int64 included): they never pass
    through a float dtype. Float label tensors are accepted where the float
    dtype holds every class id exactly (`keras_ecoc.ops` checks that).
    """
    if len(y_pred.shape) < 2:
        raise ValueError(
            "Argument `y_pred` must be the network's outputs z of shape "
            "(batch, code_length), one row per example. Received: "
            f"y_pred.shape={tuple(y_pred.shape)}"
        )
    if len(y_true.shape) == len(y_pred.shape):
        if y_true.shape[-1] not in (1, None):
            raise ValueError(
                "ECOC losses and metrics take integer class ids of shape "
                "(batch,) or (batch, 1), not one-hot targets. Received: "
                f"y_true.shape={tuple(y_true.shape)}, "
                f"y_pred.shape={tuple(y_pred.shape)}"
            )
    # The shape rule of every path: z's batch shape, or that + (1,).
    return _checks.labels_with_batch_shape(y_true, y_pred)


def labels_tensor(y_true, num_classes):
    """y_true as a tensor; host (NumPy/list) labels are range-checked first.

    The only place label values are read on the host, and only for data that
    is on the host already. The check runs before the conversion, which may
    narrow int64 to int32 (JAX without x64): a label at or above 2^31 must
    not wrap into range. Integral float host data becomes int32 here.
    """
    if isinstance(y_true, (np.ndarray, np.generic, list, tuple)):
        values = np.asarray(y_true)
        _validation.concrete_labels_in_range(values, num_classes, "y_true")
        if np.issubdtype(values.dtype, np.floating):
            values = values.astype("int64")
        if values.size == 0 or (values.min() >= -(2**31) and values.max() < 2**31):
            values = values.astype("int32", copy=False)
        return ops.convert_to_tensor(values)
    return ops.convert_to_tensor(y_true)


def float_outputs(y_pred):
    y_pred = ops.convert_to_tensor(y_pred)
    if not keras.backend.is_float_dtype(y_pred.dtype):
        y_pred = ops.cast(y_pred, "float32")
    return y_pred
