"""Fused ECOC ops on every Keras backend, with streaming and dense fallbacks.

The ECOC softmax cross-entropy over n classes with k-dimensional codes,

    u_b      = z_b * rsqrt(max(||z_b||^2, 1e-12))
    logit_bi = -0.5 * scale * ||M_i - u_b||^2
    loss_b   = logsumexp_i(logit_bi) - logit_{b, y_b},

is computed by fused kernels that stream over the classes in tiles with an
online log-sum-exp (like flash attention / cut cross-entropy): they never
materialise the B x n logits, neither in the forward nor in the backward pass,
so peak memory is O(B k + n k) instead of O(B n). The forward also accumulates
the softmax-expected code sum_i p_bi M_i and sum_i p_bi ||M_i||^2, so the
gradients with respect to z and scale need no second pass over the classes; the
gradient with respect to the codes (only computed when requested) streams over
the batch per class tile.

One kernel library, ``keras_ecoc/_lib/_ecoc_kernels.so`` (kernels/ffi/; CPU
kernels, multi-threaded, AVX2/FMA when the CPU has it; CUDA kernels when built
with nvcc), serves every backend:

* JAX: XLA FFI custom calls (`jax.ffi.ffi_call`) under a `jax.custom_vjp`
  (`_fused_jax`); no TensorFlow import.
* PyTorch: `torch.library` custom ops over its C entry points, with autograd
  and fake kernels for `torch.compile(fullgraph=True)` (`_fused_torch`).
* TensorFlow: the op library ``_ecoc_ops.so`` (`_fused_tf`): CPU / CUDA
  OpKernels eagerly; under XLA (``jit_compile=True``) a custom call to the same
  FFI handlers, or the HLO lowering where none is registered.

Under a compiler an out-of-range label gives a NaN loss and a zero gradient.

Dispatch (`keras_ecoc.ops._dispatch`, one decision for backend, device and
shape): the fused path whenever it can run (``fused=None``, the default of
every public op; ``fused=True`` raises the reason when it cannot, ``fused=False``
avoids it; ``KERAS_ECOC_DISABLE_FUSED=1`` turns it off everywhere); otherwise
the streaming implementation of the backend (`jax.custom_vjp` over `lax.scan`,
a `torch.autograd.Function`, `tf.custom_gradient` over `tf.while_loop`), which
never holds the B x n logits either, or for small n the dense pure-Keras path
of :mod:`keras_ecoc.decoding`. `loss_path(n)` names the path taken for n
classes (``op="decode"``: label rank and nearest codeword), `backend_status(n)`
says why for both, `fused_status()` describes the libraries. When the backend
is TensorFlow but the op library is missing, a warning is issued once.

Input rules shared by every path: `scale` must be a finite number > 0 (checked
when it is a host value; a tensor's value is never read); `labels` must be
integers (a float tensor is rejected unless its dtype holds every class id
exactly; integral-valued float NumPy data is converted exactly) and are never
narrowed; host labels (NumPy / Python data) outside [0, n) raise; a label
tensor is never read on the host (no device-to-host copy per step): its
invalid labels give a NaN loss and a zero gradient for their row (the fused
TensorFlow CPU kernel rejects them in the kernel instead); rows with
non-finite z (or any non-finite codeword) get a NaN loss, `nearest_codeword`
-1 and `label_rank` n.
"""

from __future__ import annotations

import warnings

import numpy as np

from keras_ecoc.ops import _checks
from keras_ecoc.ops import _dispatch
from keras_ecoc.ops._dispatch import backend_status
from keras_ecoc.ops._dispatch import loss_path
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
    "loss_path",
    "backend_status",
    "library_path",
    "load_library",
]

_warned = [False]


def _warn_if_unfused(path, fused) -> None:
    """Warns once when the fused kernels were wanted (fused=None, not
    disabled) but their library is missing or cannot be loaded: the op
    library on TensorFlow (or the GPU guard refused the card), the kernel
    library on JAX and PyTorch."""
    from keras_ecoc.ops import _loader  # noqa: PLC0415

    if path == "fused" or fused is not None or _loader.disabled() or _warned[0]:
        return
    backend = _loader.backend()
    if backend == "tensorflow":
        missing = not _loader.fused_available()
    else:
        missing = backend in ("jax", "torch") and _loader.load_kernels() is None
    if missing:
        _warned[0] = True
        warnings.warn(
            f"keras_ecoc.ops: the fused ECOC op is unavailable on {backend}, falling "
            f"back to the {path} path (backend_status(n) says which path each n "
            f"takes): {fused_status()}",
            RuntimeWarning,
            stacklevel=3,
        )


def _fused_module(backend):
    """The fused implementation of `backend` (one interface per backend)."""
    if backend == "jax":
        from keras_ecoc.ops import _fused_jax as mod  # noqa: PLC0415
    elif backend == "torch":
        from keras_ecoc.ops import _fused_torch as mod  # noqa: PLC0415
    else:
        from keras_ecoc.ops import _fused_tf as mod  # noqa: PLC0415
    return mod


def _streaming_module(backend):
    """The streaming implementation of `backend`, or None (e.g. numpy backend)."""
    if backend == "jax":
        from keras_ecoc.ops import _streaming_jax as mod  # noqa: PLC0415
    elif backend == "torch":
        from keras_ecoc.ops import _streaming_torch as mod  # noqa: PLC0415
    elif backend == "tensorflow":
        from keras_ecoc.ops import _streaming_tf as mod  # noqa: PLC0415
    else:
        return None
    return mod


def _check_codes(codes):
    """Returns (codes, n, k) with codes as given or as a float32 NumPy array."""
    if isinstance(codes, (list, tuple)):
        codes = np.asarray(codes, np.float32)
    shape = getattr(codes, "shape", None)
    if shape is None:
        raise ValueError(
            "Argument `codes` must be a matrix (num_classes, code_length) (array, tensor "
            f"or variable). Received: codes of type {type(codes).__name__}"
        )
    shape = tuple(shape)
    if len(shape) != 2:
        raise ValueError(
            "Argument `codes` must be a matrix of rank 2 (num_classes, code_length). "
            f"Received: codes with shape {shape}"
        )
    n, k = (None if d is None else int(d) for d in shape)
    if n == 0:
        raise ValueError("Argument `codes` must have at least one row (one class). "
                         f"Received: codes with shape {shape}")
    if n is not None and n >= _checks.INT32_LIMIT:
        # Class ids, ranks and nearest-codeword indices are int32 on every
        # path (as the TensorFlow op already required): 2^31 classes and more
        # would wrap them silently.
        raise ValueError("Argument `codes` must have fewer than 2^31 rows (class ids are "
                         f"int32). Received: codes with shape {shape}")
    if k == 0:
        # Every codeword would be the empty vector: no class could be told
        # from another (one path returned log n and class 0 for every row).
        raise ValueError("Argument `codes` must have at least one column (code_length "
                         f">= 1). Received: codes with shape {shape}")
    return codes, n, k


def _check_labels(labels, num_classes, backend):
    """Labels as exact integers (NumPy when given as host data); raises for
    float tensors that cannot hold every class index exactly and, for host
    data, for labels outside [0, n). A tensor's values are never read here
    (no device-to-host copy): its invalid labels give a NaN loss in the
    program."""
    host = _checks.host_labels(labels)
    if host is None:
        return _checks.integer_label_tensor(labels, num_classes)
    if num_classes is not None:
        _checks.check_label_values(host, num_classes, backend)
    if host.size == 0 or (host.min() >= -(2**31) and host.max() < 2**31):
        host = host.astype(np.int32)  # exact: values checked above
    return host


def _non_fused_inputs(z, codes, labels, scale, n, k):
    """Backend tensors: z2 (B, k), codes (n, k) float32, safe int32 labels (B,),
    valid (B,) bool, scale () float32, and z's batch shape."""
    from keras import ops as kops  # noqa: PLC0415

    z = kops.convert_to_tensor(z)
    if "float" not in str(z.dtype):
        z = kops.cast(z, "float32")
    if len(z.shape) < 1:
        raise ValueError(f"Argument `z` must have at least one dimension. Received: z with shape {z.shape}")
    k_z = z.shape[-1]
    if k_z is not None and k is not None and int(k_z) != k:
        raise ValueError(
            f"z has code length (last dimension) {k_z} but codes has code length {k}; "
            "they must be equal"
        )
    k = k if k is not None else k_z
    batch_shape = kops.shape(z)[:-1]
    z2 = kops.reshape(z, (-1, k))
    codes = kops.cast(kops.convert_to_tensor(codes), "float32")
    out = [z2, codes, batch_shape]
    if labels is not None:
        labels = kops.reshape(kops.convert_to_tensor(labels), (-1,))
        b_z, b_y = z2.shape[0], labels.shape[0]
        if b_z is not None and b_y is not None and int(b_z) != int(b_y):
            raise ValueError(
                f"z has batch size {b_z} but labels has {b_y} elements; they must be equal"
            )
        n_t = n if n is not None else kops.shape(codes)[0]
        # Validity in the labels' own dtype, before any narrowing cast.
        valid = kops.logical_and(labels >= 0, labels < n_t)
        safe = kops.cast(kops.where(valid, labels, kops.zeros_like(labels)), "int32")
        out += [safe, valid]
    if scale is not None:
        out.append(kops.reshape(kops.cast(kops.convert_to_tensor(scale), "float32"), ()))
    return out


def ecoc_cross_entropy(labels, z, codes, scale=1.0, fused=None):
    """Per-example ECOC softmax cross-entropy, float32 of shape z.shape[:-1].

    Labels come first, as in `keras.ops.sparse_categorical_crossentropy(
    target, output)` and every Keras loss.

    Args:
        labels: (...,) integer class indices in [0, n) (or Keras-style (B, 1)).
        z: (..., k) network outputs (float32, float16 or bfloat16).
        codes: (n, k) code matrix (cast to float32); may be trainable.
        scale: finite float > 0, scalar tensor or Keras variable (the logits
            are multiplied by it; differentiable).
        fused: None (default: the fused kernels whenever they can run here),
            True (the fused kernels, or a ValueError saying why they cannot
            run) or False (the streaming or dense path), like Keras's
            ``flash_attention`` switch.

    Host labels (NumPy / Python data) outside [0, n) raise a ValueError; a
    label tensor is not read on the host, and its invalid labels give a NaN
    loss and a zero gradient for their row (the fused TensorFlow CPU kernel
    rejects them in the kernel). `loss_path(n)` says which implementation
    runs.
    """
    backend = _dispatch._loader.backend()
    _checks.check_scale(scale)
    codes, n, k = _check_codes(codes)
    labels = _check_labels(labels, n, backend)
    return _cross_entropy_impl(labels, z, codes, scale, n, k, fused)


def _cross_entropy_checked(labels, z, codes, scale, n, k, fused=None):
    """`ecoc_cross_entropy` after its checks: the path `keras_ecoc.ECOCLoss`
    calls, whose codes and scale were checked when it was constructed and
    whose labels were checked where they entered (host data only). Converts a
    label tensor to integers (`_checks.integer_label_tensor`), once."""
    if not isinstance(labels, np.ndarray):
        labels = _checks.integer_label_tensor(labels, n)
    return _cross_entropy_impl(labels, z, codes, scale, n, k, fused)


def _cross_entropy_impl(labels, z, codes, scale, n, k, fused=None):
    """The loss on the chosen path; labels already integers (NumPy or tensor)."""
    labels = _checks.labels_with_batch_shape(labels, z)
    backend = _dispatch._loader.backend()
    path, _ = _dispatch.choose(n, k, fused=fused, tensor=z)
    _warn_if_unfused(path, fused)
    if path == "fused" and backend == "tensorflow":
        return _fused_module(backend).cross_entropy(z, codes, labels, scale)
    z2, codes_t, batch_shape, safe, valid, scale_t = _non_fused_inputs(z, codes, labels, scale, n, k)
    mod = _fused_module(backend) if path == "fused" else _streaming_module(backend)
    if path == "fused":
        loss = mod.cross_entropy(z2, codes_t, safe, valid, scale_t)
    elif path == "streaming" and mod is not None:
        tile = _dispatch.tile_for(z2, n, k, backend)
        loss = mod.cross_entropy(z2, codes_t, safe, valid, scale_t, tile)
    else:
        from keras import ops as kops  # noqa: PLC0415

        from keras_ecoc import decoding  # noqa: PLC0415

        loss = decoding.cross_entropy(safe, z2, codes_t, scale_t)
        # NaN loss and (through `where`) a zero gradient for invalid labels.
        loss = kops.where(valid, loss, kops.full_like(loss, float("nan")))
    from keras import ops as kops  # noqa: PLC0415

    return kops.reshape(loss, batch_shape)


def _decode(z, codes, labels, fused):
    """label_rank (labels given) or nearest_codeword (labels None): checks, then the chosen path."""
    backend = _dispatch._loader.backend()
    codes, n, k = _check_codes(codes)
    if labels is not None:
        labels = _check_labels(labels, n, backend)
    return _decode_impl(z, codes, labels, n, k, fused)


def _decode_checked(z, codes, labels, n, k, fused=None):
    """`_decode` after its checks (labels None: nearest codeword); converts a
    label tensor to integers, once (the metrics' entry)."""
    if labels is not None and not isinstance(labels, np.ndarray):
        labels = _checks.integer_label_tensor(labels, n)
    return _decode_impl(z, codes, labels, n, k, fused)


def _decode_impl(z, codes, labels, n, k, fused=None):
    """Label rank or nearest codeword on the chosen path; labels already integers."""
    from keras import ops as kops  # noqa: PLC0415

    if labels is not None:
        labels = _checks.labels_with_batch_shape(labels, z)

    backend = _dispatch._loader.backend()
    path, _ = _dispatch.choose(n, k, fused=fused, op="decode", tensor=z)
    _warn_if_unfused(path, fused)
    if path == "fused" and backend == "tensorflow":
        mod = _fused_module(backend)
        return mod.nearest_codeword(z, codes) if labels is None else mod.label_rank(z, codes, labels)
    mod = _fused_module(backend) if path == "fused" else _streaming_module(backend)
    if mod is None:  # a backend without a streaming implementation: dense math
        from keras_ecoc import decoding  # noqa: PLC0415

        if labels is None:
            return decoding.nearest_codeword(z, codes)
        return decoding.label_rank(labels, z, codes)
    tile = () if path == "fused" else None
    if labels is None:
        z2, codes_t, batch_shape = _non_fused_inputs(z, codes, None, None, n, k)
        if tile is None:
            tile = (_dispatch.tile_for(z2, n, k, backend),)
        out = mod.nearest_codeword(z2, codes_t, *tile)
    else:
        z2, codes_t, batch_shape, safe, valid = _non_fused_inputs(z, codes, labels, None, n, k)
        if tile is None:
            tile = (_dispatch.tile_for(z2, n, k, backend),)
        out = mod.label_rank(z2, codes_t, safe, valid, *tile)
    return kops.reshape(out, batch_shape)


def label_rank(labels, z, codes, fused=None):
    """int32 (...,): how many classes have a strictly larger logit than the label.

    0 means a correct top-1 prediction; ``rank < K`` is top-K correctness.
    Rows with a non-finite logit (non-finite z or codeword) and rows whose label is
    outside [0, n) (a label tensor; host labels raise) get rank n, i.e.
    never correct. The scale does not change the order, so it is not an
    argument. Streams over class tiles on every path (no B x n tensor).
    fused: as in `ecoc_cross_entropy`.
    """
    return _decode(z, codes, labels, fused)


def _label_rank_checked(labels, z, codes, n, k, fused=None):
    """`label_rank` after its checks (the metrics' path, as for the loss)."""
    return _decode_checked(z, codes, labels, n, k, fused)


def _nearest_hits_checked(labels, z, codes, n, k, fused=None):
    """bool (...,): whether the nearest codeword (ties to the smallest index,
    as in `nearest_codeword`) is the label's; `ECOCAccuracy`'s path, after
    its checks. A row with a non-finite logit or an invalid label never hits."""
    from keras import ops as kops  # noqa: PLC0415

    labels = _checks.labels_with_batch_shape(labels, z)
    if not isinstance(labels, np.ndarray):
        labels = _checks.integer_label_tensor(labels, n)
    labels = kops.convert_to_tensor(labels)
    nearest = _decode_impl(z, codes, None, n, k, fused)
    # The labels' own integer dtype: int64 labels must not wrap into range.
    nearest = kops.cast(nearest, labels.dtype)
    return kops.logical_and(kops.equal(nearest, labels), kops.greater_equal(nearest, 0))


def nearest_codeword(z, codes, fused=None):
    """int32 (...,): index of the nearest codeword (the argmax logit; ties go
    to the smallest index), like `keras_ecoc.decoding.nearest_codeword`; -1 for
    rows with a non-finite logit (non-finite z or codeword), never a valid class.
    fused: as in `ecoc_cross_entropy`."""
    return _decode(z, codes, None, fused)
