"""Streaming ECOC cross-entropy, label rank and decoding in JAX.

The same algorithm as the fused CPU kernel (kernels/ecoc_cpu_math.cc) and cut
cross-entropy: the classes are processed in tiles of C codewords inside a
`lax.scan`, so that under `jit` XLA only ever holds a B x C tile of logits,
never B x n.

Forward (per row b, over the tiles): running max m, l = sum exp(logit - m),
the softmax-expected codeword E = sum_i p_i M_i and Q = sum_i p_i ||M_i||^2,
rescaled by exp(m_old - m_new) when the max moves (online log-sum-exp).
Backward (`jax.custom_vjp`): dz and dscale come from E and Q in closed form;
dcodes recomputes the tiles' probabilities p = exp(logit - lse) and emits one
C x k block per tile.

Shapes: z (B, k) any float dtype (math in float32), codes (n, k) float32,
labels (B,) int32 already made safe (invalid rows replaced by 0), valid (B,)
bool, scale () float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from keras_ecoc.ops._constants import EPSILON

_HI = lax.Precision.HIGHEST  # float32 products also on GPU/TPU (no TF32/bf16 passes)


def _normalize(z):
    z = z.astype(jnp.float32)
    sq = jnp.sum(z * z, axis=-1, keepdims=True)
    r = lax.rsqrt(jnp.maximum(sq, EPSILON))
    return z * r, r, sq


def _num_tiles(n, tile):
    return -(-n // tile)


def _tile(codes, csq, i, tile):
    """Tile i: C = tile codewords starting at min(i C, n - C) (no padding, no
    copy of the codes: the last tile overlaps the previous one instead) and
    the mask of the classes it adds (index >= i C)."""
    n = codes.shape[0]
    start = jnp.minimum(i * tile, n - tile)
    mt = lax.dynamic_slice_in_dim(codes, start, tile, axis=0)
    ct = lax.dynamic_slice_in_dim(csq, start, tile, axis=0)
    idx = start + jnp.arange(tile, dtype=jnp.int32)
    return mt, ct, idx, start, idx >= i * tile


def _tile_logits(u, usq, mt, ct, new, scale):
    dots = jnp.matmul(u, mt.T, precision=_HI)  # (B, C)
    logits = -0.5 * scale * (ct[None, :] - 2.0 * dots + usq)
    return jnp.where(new[None, :], logits, -jnp.inf)


def _label_logit(u, usq, codes, labels, scale):
    m_y = codes[labels]
    return m_y, -0.5 * scale * (jnp.sum(m_y * m_y, -1) - 2.0 * jnp.sum(u * m_y, -1) + usq[:, 0])


def _forward(z, codes, labels, valid, scale, tile):
    n = codes.shape[0]
    u, r, sq = _normalize(z)
    usq = jnp.sum(u * u, axis=-1, keepdims=True)
    csq = jnp.sum(codes * codes, axis=-1)
    b, k = u.shape

    def step(carry, i):
        m, l, e, q = carry
        mt, ct, _, _, new = _tile(codes, csq, i, tile)
        logits = _tile_logits(u, usq, mt, ct, new, scale)
        m_new = jnp.maximum(m, jnp.max(logits, axis=-1))
        alpha = jnp.exp(m - m_new)
        p = jnp.exp(logits - m_new[:, None])
        l = l * alpha + jnp.sum(p, axis=-1)
        e = e * alpha[:, None] + jnp.matmul(p, mt, precision=_HI)
        q = q * alpha + jnp.matmul(p, ct, precision=_HI)
        return (m_new, l, e, q), None

    init = (jnp.full((b,), -jnp.inf, jnp.float32), jnp.zeros((b,), jnp.float32),
            jnp.zeros((b, k), jnp.float32), jnp.zeros((b,), jnp.float32))
    (m, l, e, q), _ = lax.scan(step, init, jnp.arange(_num_tiles(n, tile), dtype=jnp.int32))
    lse = m + jnp.log(l)
    e = e / l[:, None]
    q = q / l
    _, label_logit = _label_logit(u, usq, codes, labels, scale)
    loss = jnp.where(valid, lse - label_logit, jnp.nan)
    return loss, (u, r, sq, lse, e, q)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _cross_entropy(z, codes, labels, valid, scale, tile):
    return _forward(z, codes, labels, valid, scale, tile)[0]


def _ce_fwd(z, codes, labels, valid, scale, tile):
    loss, (u, r, sq, lse, e, q) = _forward(z, codes, labels, valid, scale, tile)
    return loss, (z, codes, labels, valid, scale, u, r, sq, lse, e, q)


def _ce_bwd(tile, res, g):
    z, codes, labels, valid, scale, u, r, sq, lse, e, q = res
    n, k = codes.shape
    # Invalid labels (NaN loss) contribute nothing, even through NaN rows.
    g = jnp.where(valid, g.astype(jnp.float32), 0.0)
    usq = jnp.sum(u * u, axis=-1, keepdims=True)
    m_y, _ = _label_logit(u, usq, codes, labels, scale)
    diff = e - m_y
    du = (g * scale)[:, None] * diff
    # At ||z||^2 <= EPSILON the direction is undefined: gradient 0 (see
    # keras_ecoc.decoding.normalize).
    tangent = r * (du - jnp.sum(u * du, -1, keepdims=True) * u)
    dz = jnp.where(valid[:, None] & (sq > EPSILON), tangent, 0.0).astype(z.dtype)
    per_row = g * (-0.5 * (q - jnp.sum(m_y * m_y, -1)) + jnp.sum(diff * u, -1))
    dscale = jnp.sum(jnp.where(valid, per_row, 0.0)).astype(scale.dtype)

    csq = jnp.sum(codes * codes, axis=-1)
    u_valid = jnp.where(valid[:, None], u, 0.0)

    def step(i, dcodes):
        mt, ct, _, start, new = _tile(codes, csq, i, tile)
        logits = _tile_logits(u, usq, mt, ct, new, scale)
        # exp(-inf) = 0 on the overlapped classes: they add nothing twice.
        w = jnp.where(valid[:, None], g[:, None] * jnp.exp(logits - lse[:, None]), 0.0)
        d = -scale * (jnp.sum(w, axis=0)[:, None] * mt - jnp.matmul(w.T, u_valid, precision=_HI))
        old = lax.dynamic_slice_in_dim(dcodes, start, tile, axis=0)
        return lax.dynamic_update_slice_in_dim(dcodes, old + d, start, axis=0)

    dcodes = lax.fori_loop(0, _num_tiles(n, tile), step, jnp.zeros((n, k), jnp.float32))
    dcodes = dcodes.at[labels].add((g * scale)[:, None] * (m_y - u_valid))
    return dz, dcodes.astype(codes.dtype), None, None, dscale


_cross_entropy.defvjp(_ce_fwd, _ce_bwd)


def cross_entropy(z, codes, labels, valid, scale, tile):
    """(B,) float32 loss; NaN where `valid` is False or z is not finite."""
    return _cross_entropy(z, codes.astype(jnp.float32), labels, valid,
                          jnp.reshape(scale, ()).astype(jnp.float32),
                          max(1, min(int(tile), codes.shape[0])))


def _decode_scan(z, codes, tile, labels=None):
    """One pass over the tiles: (best index, any non-finite logit, rank counts)."""
    n = codes.shape[0]
    tile = max(1, min(tile, n))
    u, _, _ = _normalize(lax.stop_gradient(z))
    codes = lax.stop_gradient(codes.astype(jnp.float32))
    usq = jnp.sum(u * u, axis=-1, keepdims=True)
    csq = jnp.sum(codes * codes, axis=-1)
    b = u.shape[0]
    ref = None
    if labels is not None:
        _, ref = _label_logit(u, usq, codes, labels, 1.0)

    def step(carry, i):
        best, arg, bad, count = carry
        mt, ct, idx, start, new = _tile(codes, csq, i, tile)
        logits = _tile_logits(u, usq, mt, ct, new, 1.0)
        # Overlapped classes are -inf by construction; any other non-finite logit
        # means a non-finite z or codeword.
        bad = bad | jnp.any(~jnp.isfinite(logits) & new[None, :], axis=-1)
        tmax = jnp.max(logits, axis=-1)
        targ = start + jnp.argmax(logits, axis=-1).astype(jnp.int32)
        better = tmax > best  # strict: ties keep the smaller index
        if ref is not None:
            above = (logits > ref[:, None]) & (idx[None, :] != labels[:, None])
            count = count + jnp.sum(above, axis=-1, dtype=jnp.int32)
        return (jnp.where(better, tmax, best), jnp.where(better, targ, arg), bad, count), None

    init = (jnp.full((b,), -jnp.inf, jnp.float32), jnp.zeros((b,), jnp.int32),
            jnp.zeros((b,), bool), jnp.zeros((b,), jnp.int32))
    (_, arg, bad, count), _ = lax.scan(step, init,
                                       jnp.arange(_num_tiles(n, tile), dtype=jnp.int32))
    return arg, bad, count


def nearest_codeword(z, codes, tile):
    """(B,) int32; -1 for rows with a non-finite logit (non-finite z or codeword)."""
    arg, bad, _ = _decode_scan(z, codes, int(tile))
    return jnp.where(bad, -1, arg)


def label_rank(z, codes, labels, valid, tile):
    """(B,) int32 rank of the label; n for invalid labels and non-finite rows."""
    n = codes.shape[0]
    _, bad, count = _decode_scan(z, codes, int(tile), labels)
    return jnp.where(bad | ~valid, n, count).astype(jnp.int32)
