"""`CodesSource`: where a loss or metric takes its code matrix from.

Shared by `ECOCLoss` and the accuracy metrics. A loss or metric either owns a
(small) code matrix, held once as a variable that every loss and metric made
from the same array shares, or follows an `ECOCDecoder` layer, whose `codes`
weight is then the only copy (see "Saving" in the README). Either way the
codes enter every traced function as state, never as a constant
(`codes_in_program`).
"""

import weakref

import keras
import numpy as np
from keras import ops

from keras_ecoc import _validation
from keras_ecoc.layers import ECOCDecoder


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

    The callback reads the variable when the step runs, not the array it
    held at trace time: another model's trainer may track the same variable
    (losses and metrics made from one array share it) and donate, so
    delete, that array in its own steps.
    """
    if _backend() != "jax":
        return codes
    import jax  # noqa: PLC0415

    value = codes.value if isinstance(codes, keras.Variable) else codes
    if isinstance(like, jax.core.Tracer) and not isinstance(value, jax.core.Tracer):
        spec = jax.ShapeDtypeStruct(value.shape, value.dtype)
        if isinstance(codes, keras.Variable):
            def read():
                return codes.value
        else:
            concrete = value

            def read():
                return concrete
        value = jax.lax.stop_gradient(jax.pure_callback(read, spec))
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


def codes_from_config(config):
    config = dict(config)
    if config.get("codes") is not None:
        config["codes"] = _validation.codes_from_config(config["codes"])
    return config
