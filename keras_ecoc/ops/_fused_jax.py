"""Fused ECOC cross-entropy, label rank and decoding in JAX: XLA FFI custom calls.

The kernel library (``keras_ecoc/_lib/_ecoc_kernels.so``, kernels/ffi/) exports
XLA FFI handlers over the CPU kernels (and over the CUDA kernels when it was
built with them); they are registered once per process with
`jax.ffi.register_ffi_target` and called with `jax.ffi.ffi_call`, so a
`jax.jit` program contains ``custom_call @keras_ecoc_forward`` instead of a
`lax.scan` over class tiles. No TensorFlow import anywhere on this path.

Loss (`jax.custom_vjp`): the forward handler returns the loss and the
residuals lse (B,), expected code E = sum_i p_i M_i (B, k) and expected squared
norm Q = sum_i p_i ||M_i||^2 (B,); dz and dscale follow from them in closed form
(as in `_streaming_jax`), dcodes comes from the codes-gradient handler, only
when a gradient flows into the codes (`symbolic_zeros`: fixed codes never run
it, eagerly or under `jax.jit`). The backward is one jitted function, so an
eager `jax.grad` runs it as a compiled program too.

Invalid labels: the handlers take labels already made safe (invalid ones
replaced by 0); the loss of such rows is NaN and their gradient zero, the
rank n, as on every path.

`jax.vmap`: each custom call has a batching rule (`_rowwise`). When only
per-row operands are batched (z, labels, lse, the cotangent), the mapped axis
is folded into the batch B and the kernel runs once on (V * B) rows: the
kernels treat rows independently, so each slice gets the bits of its own
un-vmapped call. A batched code matrix or scale cannot be folded, and neither
can the codes gradient (a sum over the rows of each slice): those run one
call per slice (`vmap_method="sequential"`).

Shapes: z (B, k) any float dtype (cast to float32), codes (n, k), labels (B,)
int32 (safe), valid (B,) bool, scale () float32.
"""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np

from keras_ecoc.ops import _loader
from keras_ecoc.ops._constants import EPSILON

_lock = threading.Lock()
_state = {"registered": None, "error": None, "platforms": ()}


def _register() -> bool:
    """Registers the handlers with JAX once; False (reason in `error()`) when impossible."""
    if _state["registered"] is not None:
        return _state["registered"]
    with _lock:
        if _state["registered"] is not None:
            return _state["registered"]
        lib = _loader.load_kernels()
        if lib is None:
            _state["error"] = _loader.kernels_status()
            _state["registered"] = False
            return False
        platforms = [("cpu", "")] + ([("CUDA", "Cuda")] if _loader.kernels_have_cuda() else [])
        try:
            for platform, suffix in platforms:
                for target, symbol in _loader.FFI_TARGETS.items():
                    jax.ffi.register_ffi_target(
                        target, jax.ffi.pycapsule(getattr(lib, symbol + suffix)),
                        platform=platform)
            _state["platforms"] = tuple(p for p, _ in platforms)
            _state["registered"] = True
        except Exception as e:  # noqa: BLE001 - fall back to the streaming path
            _state["error"] = f"registering the XLA FFI targets with JAX failed: {type(e).__name__}: {e}"
            _state["registered"] = False
    return _state["registered"]


def available(on_gpu: bool = False) -> tuple[bool, str]:
    """(usable, reason) for the fused JAX path on the CPU (or on a GPU)."""
    if not _register():
        return False, _state["error"]
    if on_gpu and "CUDA" not in _state["platforms"]:
        return False, (f"{_loader.kernels_status()}: the kernel library was built without its CUDA "
                       "part, so there is no CUDA FFI handler")
    where = "CPU and CUDA" if "CUDA" in _state["platforms"] else "CPU"
    return True, f"XLA FFI custom calls ({where}) of the {_loader.kernels_status()}"


def _eps():
    return np.float32(EPSILON)


def _rowwise(call, row_args, rows_out=True):
    """`call` with a `jax.vmap` rule that folds the mapped axis into the rows.

    call: a function of arrays whose positions `row_args` have the batch B as
    their leading axis (z, labels, ...) and whose other arguments (codes,
    scale) are shared by all rows. rows_out: whether every output has B as
    its leading axis and depends on its own row only. Under `jax.vmap`, when
    no shared argument is batched and rows_out holds, the per-row arguments
    (V, B, ...) become (V * B, ...) (an unbatched one is broadcast first), the
    kernel runs once, and the outputs are split back into (V, B, ...).
    Otherwise the call runs once per slice (`call` must then take a
    ``vmap_method`` keyword for its `ffi_call`).
    """
    # Positional arguments only: custom_vmap would pass `call`'s defaulted
    # vmap_method keyword to the rule as one more argument.
    folded = jax.custom_batching.custom_vmap(lambda *args: call(*args))

    @folded.def_vmap
    def _rule(axis_size, in_batched, *args):
        shared_batched = any(b for i, b in enumerate(in_batched) if i not in row_args)
        if shared_batched or not rows_out:
            axes = [0 if b else None for b in in_batched]
            out = jax.vmap(functools.partial(call, vmap_method="sequential"), in_axes=axes)(*args)
            return out, jax.tree_util.tree_map(lambda _: True, out)
        flat = []
        for i, (a, b) in enumerate(zip(args, in_batched)):
            if i in row_args:
                a = a if b else jnp.broadcast_to(a, (axis_size, *a.shape))
                a = a.reshape((-1, *a.shape[2:]))
            flat.append(a)
        # Through `folded` again, so that a nested vmap folds its axis too.
        out = folded(*flat)
        out = jax.tree_util.tree_map(lambda o: o.reshape((axis_size, -1, *o.shape[1:])), out)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return folded


def _forward_raw(z, codes, labels, scale, vmap_method=None):
    b, k = z.shape
    f32 = jnp.float32
    out = (jax.ShapeDtypeStruct((b,), f32), jax.ShapeDtypeStruct((b,), f32),
           jax.ShapeDtypeStruct((b, k), f32), jax.ShapeDtypeStruct((b,), f32))
    return tuple(jax.ffi.ffi_call("keras_ecoc_forward", out, vmap_method=vmap_method)(
        z, codes, labels, scale, epsilon=_eps()))


def _codes_grad_raw(z, codes, labels, scale, lse, g, vmap_method=None):
    out = jax.ShapeDtypeStruct(codes.shape, jnp.float32)
    return jax.ffi.ffi_call("keras_ecoc_codes_grad", out, vmap_method=vmap_method)(
        z, codes, labels, scale, lse, g, epsilon=_eps())


def _label_rank_raw(z, codes, labels, vmap_method=None):
    out = jax.ShapeDtypeStruct((z.shape[0],), jnp.int32)
    return jax.ffi.ffi_call("keras_ecoc_label_rank", out, vmap_method=vmap_method)(
        z, codes, labels, epsilon=_eps())


def _nearest_raw(z, codes, vmap_method=None):
    # int64 indices as (low, high) int32 words (the kernels write int64; JAX
    # runs without 64-bit types by default): the low word is the index.
    out = jax.ShapeDtypeStruct((z.shape[0], 2), jnp.int32)
    return jax.ffi.ffi_call("keras_ecoc_nearest", out, vmap_method=vmap_method)(
        z, codes, epsilon=_eps())


# Row arguments: z (0), labels (2), and for the codes gradient lse (4), g (5).
_forward_call = _rowwise(_forward_raw, row_args=(0, 2))
# The codes gradient sums over the rows of each slice: never folded.
_codes_grad_call = _rowwise(_codes_grad_raw, row_args=(0, 2, 4, 5), rows_out=False)
_label_rank_call = _rowwise(_label_rank_raw, row_args=(0, 2))
_nearest_call = _rowwise(_nearest_raw, row_args=(0,))


@jax.custom_vjp
def _cross_entropy(z, codes, labels, valid, scale):
    loss = _forward_call(z, codes, labels, scale)[0]
    return jnp.where(valid, loss, jnp.nan)


def _ce_fwd(z, codes, labels, valid, scale):
    # symbolic_zeros=True: each argument is a CustomVJPPrimal whose
    # `perturbed` says whether a gradient flows into it. Whether the codes
    # need one is carried to the backward in the (static) length of an empty
    # residual, so that an eager `jax.grad` with fixed codes never runs the
    # codes-gradient pass (under `jax.jit` XLA would drop it anyway).
    want_dcodes = jnp.zeros((1 if codes.perturbed else 0,), jnp.float32)
    z, codes, labels, valid, scale = (a.value for a in (z, codes, labels, valid, scale))
    loss, lse, e, q = _forward_call(z, codes, labels, scale)
    loss = jnp.where(valid, loss, jnp.nan)
    return loss, (z, codes, labels, valid, scale, lse, e, q, want_dcodes)


@functools.partial(jax.jit, static_argnums=(9,), inline=True)
def _ce_bwd_math(z, codes, labels, valid, scale, lse, e, q, g, want_dcodes):
    """(dz (B, k), dscale (), dcodes (n, k) or None): one traced program, so
    that an eager `jax.grad` runs it compiled rather than op by op."""
    # Invalid labels (NaN loss) contribute nothing, even through NaN rows.
    g = jnp.where(valid, g.astype(jnp.float32), 0.0)
    sq = jnp.sum(z * z, axis=-1, keepdims=True)
    r = jax.lax.rsqrt(jnp.maximum(sq, EPSILON))
    u = z * r
    m_y = codes[labels]
    diff = e - m_y
    du = (g * scale)[:, None] * diff
    # At ||z||^2 <= EPSILON the direction is undefined: gradient 0 (see
    # keras_ecoc.decoding.normalize for why not r * du = 10^6 du).
    tangent = r * (du - jnp.sum(u * du, -1, keepdims=True) * u)
    dz = jnp.where(valid[:, None] & (sq > EPSILON), tangent, 0.0)
    per_row = g * (-0.5 * (q - jnp.sum(m_y * m_y, -1)) + jnp.sum(diff * u, -1))
    dscale = jnp.sum(jnp.where(valid, per_row, 0.0))
    dcodes = _codes_grad_call(z, codes, labels, scale, lse, g) if want_dcodes else None
    return dz, dscale, dcodes


def _ce_bwd(res, g):
    z, codes, labels, valid, scale, lse, e, q, want_dcodes = res
    if isinstance(g, jax.custom_derivatives.SymbolicZero):
        g = jnp.zeros(z.shape[:1], jnp.float32)
    dz, dscale, dcodes = _ce_bwd_math(z, codes, labels, valid, scale, lse, e, q, g,
                                      want_dcodes.shape[0] == 1)
    return dz, dcodes, None, None, dscale


_cross_entropy.defvjp(_ce_fwd, _ce_bwd, symbolic_zeros=True)


def cross_entropy(z, codes, labels, valid, scale):
    """(B,) float32 loss; NaN where `valid` is False or z is not finite."""
    return _cross_entropy(jnp.asarray(z).astype(jnp.float32), jnp.asarray(codes).astype(jnp.float32),
                          jnp.asarray(labels).astype(jnp.int32), jnp.asarray(valid, bool),
                          jnp.reshape(scale, ()).astype(jnp.float32))


@functools.partial(jax.jit, inline=True)
def _label_rank(z, codes, labels, valid):
    n = codes.shape[0]
    rank = _label_rank_call(z, codes, labels)
    return jnp.where(valid, rank, n).astype(jnp.int32)


def label_rank(z, codes, labels, valid):
    """(B,) int32 rank of the label; n for invalid labels and non-finite rows."""
    z = jax.lax.stop_gradient(jnp.asarray(z).astype(jnp.float32))
    codes = jax.lax.stop_gradient(jnp.asarray(codes).astype(jnp.float32))
    return _label_rank(z, codes, jnp.asarray(labels).astype(jnp.int32), jnp.asarray(valid, bool))


def nearest_codeword(z, codes):
    """(B,) int32; -1 for rows with a non-finite logit (non-finite z or codeword)."""
    z = jax.lax.stop_gradient(jnp.asarray(z).astype(jnp.float32))
    codes = jax.lax.stop_gradient(jnp.asarray(codes).astype(jnp.float32))
    return _nearest_call(z, codes)[:, 0]
