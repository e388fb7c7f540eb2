"""Streaming ECOC cross-entropy, label rank and decoding in TensorFlow.

The fallback for when the fused op library is missing or disabled
(``KERAS_ECOC_DISABLE_FUSED=1``): the same tiled algorithm as the fused CPU
kernel (online log-sum-exp over tiles of C classes in a `tf.while_loop`; the
softmax-expected codeword E and Q = sum_i p_i ||M_i||^2 accumulated in the
forward; `tf.custom_gradient` recomputes the tiles for dcodes), so a failed
build costs speed but not memory: at most a B x C tile of logits exists. Works
eagerly, in `tf.function` and under `jit_compile=True`.

Shapes: z (B, k) any float dtype (math in float32), codes (n, k), labels (B,)
int32 already made safe (invalid rows replaced by 0), valid (B,) bool,
scale () float32.
"""

from __future__ import annotations

import tensorflow as tf

from keras_ecoc.ops._constants import EPSILON


def _normalize(z):
    z = tf.cast(z, tf.float32)
    sq = tf.reduce_sum(z * z, axis=-1, keepdims=True)
    r = tf.math.rsqrt(tf.maximum(sq, EPSILON))
    return z * r, r, sq


def _tile(codes, i, tile, n):
    """Tile i: `tile` codewords from min(i C, n - C) (no padding, no copy of
    the codes: the last tile overlaps the previous one) and the mask of the
    classes it adds (index >= i C)."""
    start = tf.minimum(i * tile, n - tile)
    # tf.slice with a constant size (XLA needs static shapes).
    mt = tf.slice(codes, tf.stack([start, 0]), [tile, -1])
    # Norms per tile: over all n, codes * codes would be an n x k temporary
    # outside XLA.
    ct = tf.reduce_sum(mt * mt, axis=-1)
    idx = start + tf.range(tile)
    return mt, ct, idx, start, idx >= i * tile


def _tile_logits(u, usq, mt, ct, new, scale):
    dots = tf.matmul(u, mt, transpose_b=True)
    logits = -0.5 * scale * (ct[None, :] - 2.0 * dots + usq)
    return tf.where(new[None, :], logits, tf.constant(-float("inf")))


def _label_logit(u, usq, codes, labels, scale):
    m_y = tf.gather(codes, labels)
    return m_y, -0.5 * scale * (tf.reduce_sum(m_y * m_y, -1) - 2.0 * tf.reduce_sum(u * m_y, -1)
                                + usq[:, 0])


def cross_entropy(z, codes, labels, valid, scale, tile):
    """(B,) float32 loss; NaN where `valid` is False or z is not finite."""
    tile = _clip_tile(codes, tile)
    scale = tf.reshape(tf.cast(scale, tf.float32), [])
    z_dtype = z.dtype
    codes_dtype = codes.dtype

    @tf.custom_gradient
    def _ce(z, codes, scale):
        codes32 = tf.cast(codes, tf.float32)
        n = tf.shape(codes32)[0]
        u, r, sq = _normalize(z)
        usq = tf.reduce_sum(u * u, axis=-1, keepdims=True)
        t = (n + tile - 1) // tile
        b = tf.shape(u)[0]
        k = tf.shape(u)[1]

        def body(i, m, l, e, q):
            mt, ct, _, _, new = _tile(codes32, i, tile, n)
            logits = _tile_logits(u, usq, mt, ct, new, scale)
            m_new = tf.maximum(m, tf.reduce_max(logits, axis=-1))
            alpha = tf.exp(m - m_new)
            p = tf.exp(logits - m_new[:, None])
            return (i + 1, m_new, l * alpha + tf.reduce_sum(p, -1),
                    e * alpha[:, None] + tf.matmul(p, mt),
                    q * alpha + tf.linalg.matvec(p, ct))

        init = (tf.constant(0), tf.fill([b], -float("inf")), tf.zeros([b]),
                tf.zeros(tf.stack([b, k])), tf.zeros([b]))
        _, m, l, e, q = tf.while_loop(lambda i, *_: i < t, body, init,
                                      parallel_iterations=1)
        lse = m + tf.math.log(l)
        e = e / l[:, None]
        q = q / l
        m_y, label_logit = _label_logit(u, usq, codes32, labels, scale)
        loss = tf.where(valid, lse - label_logit, tf.constant(float("nan")))

        def grad(g):
            # Invalid labels (NaN loss) contribute nothing, even through NaN rows.
            g = tf.where(valid, tf.cast(g, tf.float32), 0.0)
            diff = e - m_y
            du = (g * scale)[:, None] * diff
            # At ||z||^2 <= EPSILON the direction is undefined: gradient 0
            # (see keras_ecoc.decoding.normalize).
            tangent = r * (du - tf.reduce_sum(u * du, -1, keepdims=True) * u)
            dz = tf.where(tf.logical_and(valid[:, None], sq > EPSILON), tangent,
                          tf.zeros_like(u))
            per_row = g * (-0.5 * (q - tf.reduce_sum(m_y * m_y, -1)) + tf.reduce_sum(diff * u, -1))
            dscale = tf.reduce_sum(tf.where(valid, per_row, tf.zeros_like(per_row)))
            u_valid = tf.where(valid[:, None], u, tf.zeros_like(u))

            def dbody(i, dcodes):
                mt, ct, idx, _, new = _tile(codes32, i, tile, n)
                logits = _tile_logits(u, usq, mt, ct, new, scale)
                # exp(-inf) = 0 on the overlapped classes: they add nothing twice.
                w = tf.where(valid[:, None], g[:, None] * tf.exp(logits - lse[:, None]),
                             tf.zeros_like(logits))
                d = -scale * (tf.reduce_sum(w, 0)[:, None] * mt
                              - tf.matmul(w, u_valid, transpose_a=True))
                return i + 1, tf.tensor_scatter_nd_add(dcodes, idx[:, None], d)

            _, dcodes = tf.while_loop(lambda i, *_: i < t, dbody,
                                      (tf.constant(0), tf.zeros_like(codes32)),
                                      parallel_iterations=1)
            dcodes = tf.tensor_scatter_nd_add(dcodes, labels[:, None],
                                              (g * scale)[:, None] * (m_y - u_valid))
            return tf.cast(dz, z_dtype), tf.cast(dcodes, codes_dtype), dscale

        return loss, grad

    return _ce(z, codes, scale)


def _clip_tile(codes, tile):
    n = codes.shape[0]
    return max(1, min(int(tile), int(n))) if n is not None else int(tile)


def _decode(z, codes, tile, labels=None):
    tile = _clip_tile(codes, tile)
    z = tf.stop_gradient(z)
    codes = tf.stop_gradient(tf.cast(codes, tf.float32))
    n = tf.shape(codes)[0]
    u, _, _ = _normalize(z)
    usq = tf.reduce_sum(u * u, axis=-1, keepdims=True)
    t = (n + tile - 1) // tile
    b = tf.shape(u)[0]
    ref = None
    if labels is not None:
        _, ref = _label_logit(u, usq, codes, labels, 1.0)

    def body(i, best, arg, bad, count):
        mt, ct, idx, start, new = _tile(codes, i, tile, n)
        logits = _tile_logits(u, usq, mt, ct, new, 1.0)
        # Overlapped classes are -inf by construction; any other non-finite logit
        # means a non-finite z or codeword.
        real = tf.logical_and(tf.logical_not(tf.math.is_finite(logits)), new[None, :])
        bad = tf.logical_or(bad, tf.reduce_any(real, -1))
        tmax = tf.reduce_max(logits, -1)
        targ = start + tf.argmax(logits, -1, output_type=tf.int32)
        better = tmax > best  # strict: ties keep the smaller index
        if ref is not None:
            above = tf.logical_and(logits > ref[:, None], idx[None, :] != labels[:, None])
            count = count + tf.reduce_sum(tf.cast(above, tf.int32), -1)
        return (i + 1, tf.where(better, tmax, best), tf.where(better, targ, arg), bad, count)

    init = (tf.constant(0), tf.fill([b], -float("inf")), tf.zeros([b], tf.int32),
            tf.zeros([b], tf.bool), tf.zeros([b], tf.int32))
    _, _, arg, bad, count = tf.while_loop(lambda i, *_: i < t, body, init, parallel_iterations=1)
    return arg, bad, count


def nearest_codeword(z, codes, tile):
    """(B,) int32; -1 for rows with a non-finite logit (non-finite z or codeword)."""
    arg, bad, _ = _decode(z, codes, tile)
    return tf.where(bad, -1, arg)


def label_rank(z, codes, labels, valid, tile):
    """(B,) int32 rank of the label; n for invalid labels and non-finite rows."""
    n = tf.shape(codes)[0]
    _, bad, count = _decode(z, codes, tile, labels)
    return tf.where(tf.logical_or(bad, tf.logical_not(valid)), n, count)
