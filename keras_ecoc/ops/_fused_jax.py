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

EPSILON = 1e-12
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


def _forward_call(z, codes, labels, scale):
    b, k = z.shape
    f32 = jnp.float32
    out = (jax.ShapeDtypeStruct((b,), f32), jax.ShapeDtypeStruct((b,), f32),
           jax.ShapeDtypeStruct((b, k), f32), jax.ShapeDtypeStruct((b,), f32))
    return jax.ffi.ffi_call("keras_ecoc_forward", out)(z, codes, labels, scale, epsilon=_eps())


def _codes_grad_call(z, codes, labels, scale, lse, g):
    out = jax.ShapeDtypeStruct(codes.shape, jnp.float32)
    return jax.ffi.ffi_call("keras_ecoc_codes_grad", out)(z, codes, labels, scale, lse, g,
                                                         epsilon=_eps())


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
    radial = jnp.where(sq > EPSILON, jnp.sum(u * du, -1, keepdims=True) * u, 0.0)
    dz = jnp.where(valid[:, None], r * (du - radial), 0.0)
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
    out = jax.ShapeDtypeStruct((z.shape[0],), jnp.int32)
    rank = jax.ffi.ffi_call("keras_ecoc_label_rank", out)(z, codes, labels, epsilon=_eps())
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
    # int64 indices as (low, high) int32 words (the kernels write int64; JAX
    # runs without 64-bit types by default): the low word is the index.
    out = jax.ShapeDtypeStruct((z.shape[0], 2), jnp.int32)
    return jax.ffi.ffi_call("keras_ecoc_nearest", out)(z, codes, epsilon=_eps())[:, 0]
