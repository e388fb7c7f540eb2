"""`ECOCDecoder`: turns k network outputs into n class logits."""

import math
import weakref

import keras
import numpy as np
from keras import ops

from keras_ecoc import _validation
from keras_ecoc import decoding

# Codes up to this many entries (4,096: about 22 KB of base64) are written into
# the layer config, so `from_config` alone rebuilds a working layer. Larger
# code matrices live only in the weights (they always travel with a saved
# model), so a config.json stays small whatever the number of classes; a layer
# rebuilt from such a config without its weights outputs NaN (and decodes to
# -1) until the weights are loaded, rather than silently decoding against
# wrong codes.
MAX_CONFIG_CODE_ENTRIES = _validation.MAX_CONFIG_CODE_ENTRIES

OUTPUT_MODES = ("logits", "probabilities", "log_probabilities")


@keras.saving.register_keras_serializable(package="keras_ecoc")
class ECOCDecoder(keras.layers.Layer):
    """Decodes ECOC outputs z (..., k) into class logits (..., n).

    logits_i = -1/2 * scale * ||M_i - z/||z||||^2, the decoding of
    "Beyond One-hot Encoding" (Rodríguez et al.), with the code matrix M held
    as a non-trainable float32 weight so it saves with the model. The largest
    logit is the nearest codeword, so `argmax` of the output is the predicted
    class and a plain `SparseCategoricalCrossentropy(from_logits=True)` trains
    through it. The math is float32 under mixed precision (the inputs, the
    codes and the scale are never cast to the compute dtype) and finite at
    z = 0. `decode` returns -1 for rows with a non-finite z.

    Example:

    ```python
    codes = keras_ecoc.codes.gaussian(num_classes=1000, code_length=64, seed=0)
    model = keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(64),                # k = 64 outputs, not 1000
        keras_ecoc.ECOCDecoder(codes, scale=8.0),
    ])
    model.compile("adam",
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    ```

    Args:
        codes: array-like of shape (num_classes, code_length), the code
            matrix, one distinct codeword per class (see `keras_ecoc.codes`).
        scale: positive float, the inverse temperature multiplying the logits.
            The paper uses 1.0; codes whose rows are far apart (or learnable
            scales) train faster with larger values. With
            `learnable_scale=True` this is the initial value.
        learnable_scale: bool. If True, log(scale) is a trainable weight.
        output: one of `"logits"` (default), `"probabilities"` (softmax) or
            `"log_probabilities"` (log-softmax).
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Input shape:
        (..., code_length).

    Output shape:
        (..., num_classes), float32.
    """

    def __init__(
        self,
        codes=None,
        scale=1.0,
        learnable_scale=False,
        output="logits",
        num_classes=None,
        code_length=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if codes is None and num_classes is not None and code_length is not None:
            # Rebuilt from a config too large to carry the codes: the
            # weights hold them (see MAX_CONFIG_CODE_ENTRIES).
            self._initial_codes = None
            self.num_classes = _positive_int(num_classes, "num_classes")
            self.code_length = _positive_int(code_length, "code_length")
        else:
            self._initial_codes = _validation.codes_array(codes)
            self.num_classes, self.code_length = self._initial_codes.shape
            _validation.warn_if_unequal_row_norms(self._initial_codes)
        self.initial_scale = _validation.positive_scale(scale)
        if not isinstance(learnable_scale, bool):
            raise ValueError(
                "Argument `learnable_scale` must be a bool. "
                f"Received: learnable_scale={learnable_scale!r}"
            )
        self.learnable_scale = learnable_scale
        if output not in OUTPUT_MODES:
            raise ValueError(
                f"Argument `output` must be one of {OUTPUT_MODES}. "
                f"Received: output={output!r}"
            )
        self.output_mode = output
        self.supports_masking = True
        # Metrics bound to this layer on JAX keep a device copy of the codes
        # as a metric variable (the JAX trainer maps only metric variables
        # when it updates metrics); they are told of every load.
        self._codes_followers = weakref.WeakSet()

    @property
    def input_dtype(self):
        # Inputs are converted to float32, never to a float16 compute dtype
        # (mixed precision): the decoding math is float32 throughout.
        return "float32"

    def build(self, input_shape=None):
        if input_shape is not None:
            _validation.check_code_length(
                tuple(input_shape), self.code_length, name="inputs"
            )
        # float32 whatever the dtype policy: codes such as normalized
        # eigenvectors lose their structure in float16.
        # The validated array is handed to the backend once, as the
        # initializer (no zeros first); the layer then drops its host
        # reference, so the weight is the only copy it keeps. The
        # initializer's own reference must stay: built inside a stateless
        # scope (a parent layer traced without a `build`) the weight is
        # initialized later, from it; Keras drops it once it has run.
        initial = self._initial_codes
        if initial is None:
            # A read-only broadcast view: no host copy of the placeholder.
            initial = np.broadcast_to(
                np.float32(np.nan), (self.num_classes, self.code_length)
            )
        self.codes = self.add_weight(
            name="codes",
            shape=(self.num_classes, self.code_length),
            initializer=lambda shape, dtype: initial,
            trainable=False,
            dtype="float32",
            autocast=False,
        )
        self._initial_codes = None
        if self.learnable_scale:
            self.log_scale = self.add_weight(
                name="log_scale",
                shape=(),
                initializer=keras.initializers.Constant(
                    math.log(self.initial_scale)
                ),
                trainable=True,
                dtype="float32",
                autocast=False,
            )
        else:
            self.log_scale = None
        self.built = True

    @property
    def scale(self):
        """The current scale: a float32 scalar tensor (or a float if fixed)."""
        if self.log_scale is None:
            return self.initial_scale
        return ops.exp(self.log_scale)

    def call(self, inputs):
        _validation.check_code_length(
            tuple(inputs.shape), self.code_length, name="inputs"
        )
        logits = decoding.decode_logits(inputs, self.codes, self.scale)
        if self.output_mode == "probabilities":
            return ops.softmax(logits, axis=-1)
        if self.output_mode == "log_probabilities":
            return ops.log_softmax(logits, axis=-1)
        return logits

    def decode(self, z):
        """Predicted class ids: the nearest codeword to each z / ||z||.

        Uses the fused op when available (no (batch, n) logits are formed).

        Args:
            z: float tensor of shape (batch, code_length).

        Returns:
            int tensor of shape (batch,); -1 for rows with a non-finite z
            (or when the codes hold NaN, e.g. before the weights of a layer
            rebuilt from a large config are loaded).
        """
        from keras_ecoc import ops as ecoc_ops

        if not self.built:
            self.build(tuple(z.shape))
        return ecoc_ops.nearest_codeword(z, self.codes)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.num_classes,)

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(
            self.compute_output_shape(inputs.shape), dtype="float32"
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "scale": self.initial_scale,
                "learnable_scale": self.learnable_scale,
                "output": self.output_mode,
            }
        )
        if self.num_classes * self.code_length <= MAX_CONFIG_CODE_ENTRIES:
            # Small by construction: the host copy is a few KB.
            config["codes"] = _validation.codes_to_config(self._current_codes())
        else:
            config["num_classes"] = self.num_classes
            config["code_length"] = self.code_length
        return config

    def _add_codes_follower(self, follower):
        self._codes_followers.add(follower)

    def load_own_variables(self, store):
        self._check_load_own_variables(store)
        all_vars = self._trainable_variables + self._non_trainable_variables
        for i, variable in enumerate(all_vars):
            if variable is self.codes:
                # Row blocks read from the file straight into the existing
                # variable: `store[key]` would read the whole matrix into
                # NumPy, and a whole-matrix assign would then hold a tensor
                # copy of it next to the variable (4x the codes at load).
                load_rows(variable, _stored_dataset(store, f"{i}"))
            else:
                variable.assign(store[f"{i}"])
        for follower in list(self._codes_followers):
            follower._refresh_codes()

    def _current_codes(self):
        if self.built:
            return ops.convert_to_numpy(self.codes).astype("float32")
        return self._initial_codes


# Rows per block of `load_rows`: 4 MiB of float32 at a time, the only
# transient memory of a load besides what the backend keeps.
_LOAD_BLOCK_BYTES = 1 << 22


def _stored_dataset(store, key):
    """The h5py dataset behind `store[key]`, unread, or `store[key]` itself.

    `H5IOStore.__getitem__` returns `np.array(dataset)`: the whole matrix.
    Its entry group is read here through Keras' own `safe_get_h5_dataset`
    (the same link and external-file checks) so that `load_rows` reads row
    blocks; any other store (NumPy archives, a shard that holds the key
    elsewhere, bfloat16 data) gives `store[key]`.
    """
    group = getattr(store, "_h5_entry_group", None)
    try:
        from keras.src.saving.saving_lib import safe_get_h5_dataset  # noqa: PLC0415

        if group is not None and not isinstance(group, dict) and key in group:
            dataset = safe_get_h5_dataset(group, key)
            if dataset.attrs.get("dtype") != "bfloat16" and dataset.ndim == 2:
                return dataset
    except (ImportError, AttributeError, TypeError):
        pass
    return store[key]


def load_rows(variable, source, block_bytes=None):
    """variable[i:j] = source[i:j] over row blocks, in place on every backend.

    `source` is an h5py dataset or an array of the variable's shape (n, k).
    Nothing of size n x k is allocated: TensorFlow writes each block with
    `ResourceStridedSliceAssign` (slicing the variable first would read it
    and make the write copy the whole buffer), PyTorch copies into the
    tensor, JAX updates a donated buffer (`dynamic_update_slice`).
    """
    rows, cols = (int(d) for d in variable.shape)
    if tuple(int(d) for d in source.shape) != (rows, cols):
        raise ValueError(
            f"The stored codes have shape {tuple(source.shape)}; the layer's "
            f"codes weight has shape {(rows, cols)}. They must be equal."
        )
    if rows == 0:
        return
    block_bytes = _LOAD_BLOCK_BYTES if block_bytes is None else block_bytes
    step = min(rows, max(1, block_bytes // (4 * max(1, cols))))
    backend = keras.backend.backend()
    if backend == "jax":
        import jax.numpy as jnp  # noqa: PLC0415

        value = jnp.asarray(variable.value, dtype="float32")
        for start in range(0, rows, step):
            # Every block has `step` rows (one compiled update): the last
            # one starts earlier and rewrites a few rows with equal values.
            start = min(start, rows - step)
            block = np.asarray(source[start:start + step], "float32")
            value = _jax_put_rows(value, block, start)
        variable.assign(value)
        return
    if backend == "tensorflow":
        import tensorflow as tf  # noqa: PLC0415

        tf_variable = variable.value
        if isinstance(tf_variable, tf.distribute.DistributedValues):
            # A mirrored variable has no single handle: write each replica's
            # copy, block by block, on its own device.
            copies = tuple(tf_variable.values)
        else:
            copies = (tf_variable,)
        for copy in copies:
            with tf.device(copy.device):
                for start in range(0, rows, step):
                    stop = min(rows, start + step)
                    tf.raw_ops.ResourceStridedSliceAssign(
                        ref=copy.handle, begin=[start, 0], end=[stop, cols], strides=[1, 1],
                        value=np.asarray(source[start:stop], "float32"))
        return
    if backend == "torch":
        import torch  # noqa: PLC0415

        target = variable.value
        with torch.no_grad():
            for start in range(0, rows, step):
                stop = min(rows, start + step)
                block = torch.from_numpy(np.ascontiguousarray(source[start:stop], "float32"))
                target[start:stop].copy_(block)
        return
    variable.assign(np.asarray(source, "float32"))


_JAX_PUT_ROWS = []


def _jax_put_rows(value, block, start):
    """value[start:start + len(block)] = block in `value`'s own (donated) buffer."""
    if not _JAX_PUT_ROWS:
        import jax  # noqa: PLC0415

        def put(value, block, start):
            return jax.lax.dynamic_update_slice(value, block, (start, 0))

        _JAX_PUT_ROWS.append(jax.jit(put, donate_argnums=0))
    return _JAX_PUT_ROWS[0](value, block, np.int32(start))


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(
            f"Argument `{name}` must be a positive integer. "
            f"Received: {name}={value!r}"
        )
    if value < 1:
        raise ValueError(
            f"Argument `{name}` must be a positive integer. "
            f"Received: {name}={value}"
        )
    return int(value)
