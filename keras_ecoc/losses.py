"""`ECOCLoss`: softmax cross-entropy of ECOC-decoded outputs.

Also home of `CodesSource`, the code-matrix handling shared by the loss and
the metrics: a loss or metric either owns a (small) code matrix or follows an
`ECOCDecoder` layer, whose `codes` weight is then the only copy (see
"Saving" in the README).
"""

import weakref

import keras
import numpy as np
from keras import ops

# `Loss.__call__` converts y_true to the loss dtype before `call`, which
# would turn integer labels into bfloat16/float16 values (777 -> 776 in
# bfloat16); `ECOCLoss.__call__` replaces it and reuses Keras' own reduction.
from keras.src.losses.loss import reduce_weighted_values

from keras_ecoc import _validation
from keras_ecoc import ops as ecoc_ops


def _labels_for(y_true, y_pred):
    """Integer labels of shape y_pred.shape[:-1] from (...,) or (..., 1).

    Shapes only: values were checked where they entered (`_labels_tensor`
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
        y_true = ops.squeeze(y_true, axis=-1)
    return y_true


def _labels_tensor(y_true, num_classes):
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


def _float_outputs(y_pred):
    y_pred = ops.convert_to_tensor(y_pred)
    if not keras.backend.is_float_dtype(y_pred.dtype):
        y_pred = ops.cast(y_pred, "float32")
    return y_pred


class _CodesHolder:
    """Holds one code matrix's `keras.Variable` out of Keras' tracking.

    Losses are not tracked by Keras, and a metric must not track a variable
    that a model or another metric already tracks (JAX donates each state
    buffer once), so the variable sits in this plain object. `tracked_by` is
    the metric that put it into its own variables (JAX only), if any.
    """

    __slots__ = ("variable", "tracked_by", "__weakref__")

    def __init__(self, variable):
        self.variable = variable
        self.tracked_by = None


# id(source array) -> (weak ref to the array, weak ref to its holder): losses
# and metrics made from the same NumPy array share one device copy.
_SHARED_CODES = {}


def _new_codes_variable(array):
    # A callable initializer hands the validated array to the backend once
    # (no zeros first); float32 whatever the dtype policy, never autocast.
    return keras.Variable(
        initializer=lambda shape, dtype: array,
        shape=array.shape,
        dtype="float32",
        trainable=False,
        autocast=False,
        name="ecoc_codes",
    )


def shared_codes(codes, name="codes"):
    """A `_CodesHolder` for `codes`, validated and converted once.

    The same NumPy array passed to several losses and metrics gives them one
    variable: one check, one device copy.
    """
    key = id(codes) if isinstance(codes, np.ndarray) else None
    if key is not None:
        entry = _SHARED_CODES.get(key)
        if entry is not None and entry[0]() is codes:
            holder = entry[1]()
            if holder is not None:
                return holder
    array = _validation.codes_array(codes, name)
    _validation.warn_if_unequal_row_norms(array, stacklevel=5)
    holder = _CodesHolder(_new_codes_variable(array))
    if key is not None:
        _SHARED_CODES[key] = (weakref.ref(codes), weakref.ref(holder))
        weakref.finalize(codes, _SHARED_CODES.pop, key, None)
    return holder


def _backend():
    return keras.backend.backend()


def codes_in_program(codes, like):
    """The value of a codes variable (or tensor) to compute with now.

    TensorFlow captures a variable by handle and PyTorch runs eagerly, so the
    variable itself is returned. Under a JAX trace a variable that the
    trainer maps (a model weight, a metric variable) is a tracer: an argument
    of the program. One it does not map (a loss's own codes) would be
    captured as a constant, which XLA embeds in the program (a 244 MiB
    matrix: +2.3 GB and 20 s per compile); it is read at run time through a
    host callback instead (one copy per step, none in the program).
    """
    if _backend() != "jax":
        return codes
    import jax  # noqa: PLC0415

    value = codes.value if isinstance(codes, keras.Variable) else codes
    if isinstance(like, jax.core.Tracer) and not isinstance(value, jax.core.Tracer):
        concrete = value
        spec = jax.ShapeDtypeStruct(concrete.shape, concrete.dtype)
        value = jax.lax.stop_gradient(jax.pure_callback(lambda: concrete, spec))
    return value


class CodesSource:
    """Where a loss or metric takes its codes (and scale) from.

    Either its own code matrix, held once as a non-trainable float32
    `keras.Variable` (shared with any other loss or metric made from the
    same array), or an `ECOCDecoder` it is bound to (`from_decoder`), whose
    `codes` weight is then used directly and is the only stored copy; the
    config then refers to the decoder by name. Either way the codes enter
    every traced function as state, never as a constant (`codes_in_program`).

    On JAX a metric must hold its codes as one of its own variables: the
    trainer updates metrics in a scope that maps only metric variables (and
    purges the model's values during `fit`). A metric bound to a decoder
    there keeps a device copy of the decoder's codes, refreshed whenever the
    decoder's weights are loaded. Restored from a config that refers to a
    decoder, the object is bound again by `ECOCClassifier` (or by
    `bind(layer)`); until then it uses the codes the config carried when they
    were small enough to be written (`_validation.MAX_CONFIG_CODE_ENTRIES`),
    and raises a clear error otherwise.
    """

    _is_metric = False

    def _init_codes(self, codes, decoder):
        self._holder = None
        self._decoder = None
        self._decoder_name = None
        if isinstance(decoder, str):
            self._decoder_name = decoder
            if codes is not None:
                self._set_holder(shared_codes(codes))
        elif decoder is not None:
            self.bind(decoder)
        else:
            self._set_holder(shared_codes(codes))

    def _set_holder(self, holder):
        self._holder = holder
        if self._is_metric and _backend() == "jax" and holder.tracked_by is None:
            # JAX: the codes must be a metric variable to enter the metric
            # update as state; exactly one metric tracks a shared variable.
            self._tracker.add_to_store("variables", holder.variable)
            holder.tracked_by = weakref.ref(self)

    def bind(self, decoder, share_until_used=False):
        """Follows `decoder`'s codes (and scale) from now on.

        Args:
            decoder: the `ECOCDecoder` to follow.
            share_until_used: JAX metrics only. Instead of a device copy of
                the decoder's codes now, the metric's codes variable holds
                the decoder's own array until `_own_codes()` makes the copy
                (a model that loads its weights calls it before its first
                train or test function: a JAX step donates every state
                buffer, so two variables may not share one there). A load
                then holds two code matrices, the decoder's and Keras' read
                of the weights file, instead of three.
        """
        from keras_ecoc.layers import ECOCDecoder  # noqa: PLC0415

        if not isinstance(decoder, ECOCDecoder):
            raise ValueError(
                "Argument `decoder` must be an `ECOCDecoder` layer. "
                f"Received: decoder={decoder!r}"
            )
        if not decoder.built:
            decoder.build((None, decoder.code_length))
        self._decoder = decoder
        self._decoder_name = decoder.name
        if self._is_metric and _backend() == "jax":
            if self._holder is None or self._holder.tracked_by is None or (
                self._holder.tracked_by() is not self
            ):
                value = decoder.codes.value
                if not share_until_used:
                    value = _copy_of(decoder.codes)
                self._holder = None
                self._set_holder(_CodesHolder(_new_codes_variable(value)))
                self._codes_shared = share_until_used
            decoder._add_codes_follower(self)
        return self

    # JAX metrics: whether the codes variable holds the decoder's own array
    # (see `bind(share_until_used=True)`), not a copy.
    _codes_shared = False

    def _refresh_codes(self):
        """Called by the bound decoder (JAX metrics) when its codes were loaded.

        A metric that shares the decoder's array takes the new one (a load
        replaces it). Otherwise the decoder's codes are copied into this
        metric's own buffer (donated), so a load holds no third matrix next
        to the two.
        """
        variable = self._holder.variable
        if self._codes_shared:
            variable.assign(self._decoder.codes.value)
            return
        variable.assign(_copy_into(variable.value, self._decoder.codes.value))

    def _own_codes(self):
        """Ends `bind(share_until_used=True)`: the metric's own device copy.

        Made when the codes first enter a compiled step, after a load has
        dropped its read of the weights file.
        """
        if self._codes_shared:
            self._holder.variable.assign(_copy_of(self._decoder.codes))
            self._codes_shared = False

    @property
    def decoder_name(self):
        """Name of the `ECOCDecoder` this object follows, or None."""
        return self._decoder_name

    @property
    def codes(self):
        """The (num_classes, code_length) codes variable."""
        if self._decoder is not None and not (self._is_metric and _backend() == "jax"):
            return self._decoder.codes
        if self._holder is None:
            raise ValueError(
                f"This {type(self).__name__} was restored from a config that "
                f"refers to the `ECOCDecoder` layer {self._decoder_name!r} "
                "for its codes (too large to be written into the config). "
                "Bind it to that layer with `.bind(model.get_layer("
                f"{self._decoder_name!r}))`; `ECOCClassifier` does it when "
                "it is loaded."
            )
        return self._holder.variable

    @property
    def num_classes(self):
        return int(self.codes.shape[0])

    @property
    def code_length(self):
        return int(self.codes.shape[1])

    def _codes_config(self):
        """{"codes": ..., "decoder": ...} for `get_config`.

        Own codes are always written. Codes of a decoder are written only
        when small; the decoder's weights are their one stored copy.
        """
        if self._decoder is None and self._decoder_name is None:
            return {"codes": _validation.codes_to_config(_host_codes(self.codes))}
        config = {"decoder": self._decoder_name, "codes": None}
        codes = self.codes if (self._decoder is not None or self._holder is not None) else None
        if codes is not None and int(np.prod(codes.shape)) <= _validation.MAX_CONFIG_CODE_ENTRIES:
            codes = _host_codes(codes)
            # An unloaded decoder's NaN placeholder is not worth writing.
            if np.all(np.isfinite(codes)):
                config["codes"] = _validation.codes_to_config(codes)
        return config


def _host_codes(codes):
    return np.asarray(ops.convert_to_numpy(codes), dtype="float32")


def _copy_of(variable):
    """A device copy of a variable's value (JAX arrays are shared otherwise)."""
    import jax.numpy as jnp  # noqa: PLC0415

    return jnp.array(variable.value, dtype="float32", copy=True)


_COPY_INTO = []


def _copy_into(target, source):
    """A JAX array equal to `source` written into `target`'s (donated) buffer."""
    if not _COPY_INTO:
        import jax  # noqa: PLC0415

        def copy(target, source):
            return jax.lax.dynamic_update_slice(target, source.astype(target.dtype), (0, 0))

        _COPY_INTO.append(jax.jit(copy, donate_argnums=0))
    return _COPY_INTO[0](target, source)


def _codes_from_config(config):
    config = dict(config)
    if config.get("codes") is not None:
        config["codes"] = _validation.codes_from_config(config["codes"])
    return config


def ecoc_cross_entropy(y_true, y_pred, codes, scale=1.0):
    """Per-example ECOC cross-entropy, Keras loss-function style.

    Exactly -log softmax(-1/2 * scale * ||M_i - u||^2)_y with u = z / ||z||.
    On the TensorFlow backend this runs the fused op when it is available
    (see `keras_ecoc.ops.fused_status()`), which never forms the
    (batch, num_classes) logits; elsewhere the pure-Keras math.

    Args:
        y_true: integer class ids of shape (batch,) or (batch, 1). Integer
            labels never pass through a float dtype; float labels must hold
            whole numbers.
        y_pred: z, the network's k outputs, of shape (batch, k).
        codes: (num_classes, k) code matrix: a nested list, an array or a
            tensor (validated: 2-D, finite, distinct rows), or a variable such
            as `ECOCDecoder.codes` (checked for rank only).
        scale: positive finite float, or a scalar tensor, multiplying the
            logits.

    Returns:
        float32 tensor of shape (batch,).
    """
    codes = _validation.function_codes(codes)
    scale = _validation.function_scale(scale)
    return _cross_entropy(y_true, y_pred, codes, scale)


def _cross_entropy(y_true, y_pred, codes, scale):
    # Codes and scale already validated (by the caller or by their layer):
    # this is the unchecked path every call of the loss takes.
    num_classes, code_length = (int(d) for d in codes.shape)
    y_true = _labels_tensor(y_true, num_classes)
    y_pred = _float_outputs(y_pred)
    _validation.check_code_length(tuple(y_pred.shape), code_length, "y_pred")
    labels = _labels_for(y_true, y_pred)
    return ecoc_ops._cross_entropy_checked(
        labels, y_pred, codes_in_program(codes, y_pred), scale,
        num_classes, code_length,
    )


@keras.saving.register_keras_serializable(package="keras_ecoc")
class ECOCLoss(CodesSource, keras.losses.Loss):
    """Cross-entropy of ECOC outputs against integer class labels.

    The model's last layer emits z with k = code_length units (no decoder
    layer needed); the loss decodes z against the codes and applies softmax
    cross-entropy. This is the memory-efficient way to train with many
    classes: on TensorFlow with the fused op, the (batch, num_classes) logits
    are never materialized, in the forward or the backward pass.

    Labels stay integers whatever `dtype` is: unlike other Keras losses,
    `y_true` is not converted to the loss dtype (float16 is exact only up to
    2,048, bfloat16 up to 256). The ECOC math is float32; `dtype` applies to
    the reduced loss.

    Example:

    ```python
    codes = keras_ecoc.codes.gaussian(num_classes=10_000, code_length=128)
    model.compile(optimizer="adam",
                  loss=keras_ecoc.ECOCLoss(codes, scale=8.0),
                  metrics=[keras_ecoc.ECOCAccuracy(codes)])
    ```

    Args:
        codes: array-like of shape (num_classes, code_length).
        scale: positive float, the inverse temperature multiplying the logits.
        reduction: as for every Keras loss: `"sum_over_batch_size"`
            (default), `"sum"`, `"mean"`, `"mean_with_sample_weight"`,
            `"none"` or `None`.
        name: optional name of the loss instance.
        dtype: dtype of the reduced loss (float32 by default).
        decoder: an `ECOCDecoder` to follow instead of `codes` (see
            `from_decoder`), or, in a config, the name of that layer.

    Call arguments:
        y_true: integer class ids of shape (batch,) or (batch, 1).
        y_pred: z of shape (batch, code_length).
    """

    def __init__(
        self,
        codes=None,
        scale=1.0,
        reduction="sum_over_batch_size",
        name="ecoc_loss",
        dtype=None,
        decoder=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self._init_codes(codes, decoder)
        self._fixed_scale = _validation.positive_scale(scale)

    @classmethod
    def from_decoder(cls, decoder, **kwargs):
        """An `ECOCLoss` that reads codes and scale from an `ECOCDecoder`.

        The loss follows the decoder's weights, so a learnable scale is
        trained through this loss, and the codes are stored once, in the
        decoder's weights.
        """
        return cls(scale=float(decoder.initial_scale), decoder=decoder, **kwargs)

    @property
    def scale(self):
        """The decoder's (possibly learned) scale, or the fixed one."""
        if self._decoder is not None:
            return self._decoder.scale
        return self._fixed_scale

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Keras' Loss.__call__ minus its conversion of y_true (and z) to the
        # loss dtype: labels stay integers, z keeps its float dtype.
        in_mask = getattr(y_pred, "_keras_mask", None)
        with keras.name_scope(self.name):
            losses = self.call(y_true, y_pred)
            return reduce_weighted_values(
                losses,
                sample_weight=sample_weight,
                mask=in_mask,
                reduction=self.reduction,
                dtype=self.dtype,
            )

    def call(self, y_true, y_pred):
        return _cross_entropy(y_true, y_pred, self.codes, self.scale)

    def get_config(self):
        config = super().get_config()
        scale = self._fixed_scale
        if self._decoder is not None:
            scale = float(ops.convert_to_numpy(self._decoder.scale))
        config.update(self._codes_config())
        config["scale"] = scale
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**_codes_from_config(config))
