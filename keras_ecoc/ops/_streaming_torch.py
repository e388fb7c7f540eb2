"""Streaming ECOC cross-entropy, label rank and decoding in PyTorch.

The algorithm of kernels/ecoc_cpu_math.cc and of cut cross-entropy, as a
`torch.autograd.Function`: the forward walks the classes in tiles of C
codewords with an online log-sum-exp and accumulates the softmax-expected
codeword E = sum_i p_i M_i and Q = sum_i p_i ||M_i||^2; the backward gets dz and
dscale from E and Q in closed form and recomputes each tile's probabilities
for dcodes (only when the codes need a gradient). At most a B x C tile of
logits exists at any time, never B x n.

Under `torch.compile` the three entry points run eagerly (a deliberate graph
break, `torch.compiler.disable`): inductor would unroll the loop over the
T = ceil(n / C) tiles, so compiling would take minutes at n = 10^5 (measured:
docs/benchmarks.md), while the tiles are GEMM-bound and gain little from
fusion. The rest of the model still compiles.

Shapes: z (B, k) any float dtype (math in float32), codes (n, k), labels (B,)
int64 already made safe (invalid rows replaced by 0), valid (B,) bool,
scale () float32.
"""

from __future__ import annotations

import torch

EPSILON = 1e-12


def _normalize(z):
    z = z.float()
    sq = torch.sum(z * z, dim=-1, keepdim=True)
    r = torch.rsqrt(torch.maximum(sq, torch.full_like(sq, EPSILON)))  # keeps a NaN
    return z * r, r, sq


def _tile_logits(u, usq, mt, ct, scale):
    dots = u @ mt.T  # (B, C)
    return -0.5 * scale * (ct[None, :] - 2.0 * dots + usq)


class _StreamingCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, codes, labels, valid, scale, tile):
        codes32 = codes.float()
        n, k = codes32.shape
        u, r, sq = _normalize(z)
        usq = torch.sum(u * u, dim=-1, keepdim=True)
        su = scale * u
        b = u.shape[0]
        m = torch.full((b,), float("-inf"), dtype=torch.float32, device=u.device)
        l = torch.zeros((b,), dtype=torch.float32, device=u.device)
        e = torch.zeros((b, k), dtype=torch.float32, device=u.device)
        q = torch.zeros((b,), dtype=torch.float32, device=u.device)
        for start in range(0, n, tile):
            mt = codes32[start:start + tile]
            # Norms per tile: over all n, codes * codes would be an n x k temporary.
            ct = torch.linalg.vecdot(mt, mt)
            # logit - (-1/2 s ||u||^2): the per-row constant is added to lse at
            # the end (it does not change the softmax), saving a pass per tile.
            logits = torch.addmm((-0.5 * scale) * ct[None, :], su, mt.T)
            m_new = torch.maximum(m, torch.amax(logits, dim=-1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(logits - m_new[:, None])
            l = l * alpha + torch.sum(p, dim=-1)
            # No [M | ||M||^2] concatenation: that would copy the n x k codes.
            e = torch.addmm(e * alpha[:, None], p, mt)
            q = q * alpha + p @ ct
            m = m_new
        m = m - 0.5 * scale * usq[:, 0]
        lse = m + torch.log(l)
        e = e / l[:, None]
        q = q / l
        m_y = codes32[labels]
        label_logit = -0.5 * scale * (torch.sum(m_y * m_y, -1) - 2.0 * torch.sum(u * m_y, -1)
                                      + usq[:, 0])
        loss = torch.where(valid, lse - label_logit, torch.full_like(lse, float("nan")))
        ctx.save_for_backward(z, codes32, labels, valid, scale, u, r, sq, lse, e, q)
        ctx.tile = tile
        ctx.codes_dtype = codes.dtype
        return loss

    @staticmethod
    def backward(ctx, g):
        z, codes, labels, valid, scale, u, r, sq, lse, e, q = ctx.saved_tensors
        tile = ctx.tile
        n, k = codes.shape
        zero = torch.zeros((), dtype=torch.float32, device=u.device)
        # Invalid labels (NaN loss) contribute nothing, even through NaN rows.
        g = torch.where(valid, g.float(), zero)
        m_y = codes[labels]
        diff = e - m_y
        dz = dscale = dcodes = None
        if ctx.needs_input_grad[0]:
            du = (g * scale)[:, None] * diff
            radial = torch.where(sq > EPSILON, torch.sum(u * du, -1, keepdim=True) * u, zero)
            dz = torch.where(valid[:, None], r * (du - radial), zero).to(z.dtype)
        if ctx.needs_input_grad[4]:
            per_row = g * (-0.5 * (q - torch.sum(m_y * m_y, -1)) + torch.sum(diff * u, -1))
            dscale = torch.sum(torch.where(valid, per_row, zero)).reshape(scale.shape)
        if ctx.needs_input_grad[1]:
            usq = torch.sum(u * u, dim=-1, keepdim=True)
            u_valid = torch.where(valid[:, None], u, zero)
            blocks = []
            for start in range(0, n, tile):
                mt = codes[start:start + tile]
                logits = _tile_logits(u, usq, mt, torch.linalg.vecdot(mt, mt), scale)
                w = torch.where(valid[:, None], g[:, None] * torch.exp(logits - lse[:, None]), zero)
                blocks.append(-scale * (torch.sum(w, dim=0)[:, None] * mt - w.T @ u_valid))
            dcodes = torch.cat(blocks, dim=0)
            dcodes = dcodes.index_add(0, labels, (g * scale)[:, None] * (m_y - u_valid))
            dcodes = dcodes.to(ctx.codes_dtype)
        return dz, dcodes, None, None, dscale, None


@torch.compiler.disable
def cross_entropy(z, codes, labels, valid, scale, tile):
    """(B,) float32 loss; NaN where `valid` is False or z is not finite."""
    scale = torch.reshape(scale, ()).float()
    return _StreamingCrossEntropy.apply(z, codes, labels, valid, scale, int(tile))


@torch.compiler.disable
@torch.no_grad()
def _decode(z, codes, tile, labels=None):
    codes = codes.detach().float()
    n = codes.shape[0]
    u, _, _ = _normalize(z.detach())
    usq = torch.sum(u * u, dim=-1, keepdim=True)
    b = u.shape[0]
    best = torch.full((b,), float("-inf"), device=u.device)
    arg = torch.zeros((b,), dtype=torch.int64, device=u.device)
    bad = torch.zeros((b,), dtype=torch.bool, device=u.device)
    count = torch.zeros((b,), dtype=torch.int64, device=u.device)
    ref = None
    if labels is not None:
        m_y = codes[labels]
        ref = -0.5 * (torch.sum(m_y * m_y, -1) - 2.0 * torch.sum(u * m_y, -1) + usq[:, 0])
    for start in range(0, n, tile):
        mt = codes[start:start + tile]
        logits = _tile_logits(u, usq, mt, torch.linalg.vecdot(mt, mt), 1.0)
        bad = bad | torch.any(~torch.isfinite(logits), dim=-1)  # no padding here
        tmax, targ = torch.max(logits, dim=-1)
        better = tmax > best  # strict: ties keep the smaller index
        best = torch.where(better, tmax, best)
        arg = torch.where(better, targ + start, arg)
        if ref is not None:
            idx = torch.arange(start, start + logits.shape[1], device=u.device)
            above = (logits > ref[:, None]) & (idx[None, :] != labels[:, None])
            count = count + torch.sum(above, dim=-1)
    return arg, bad, count


def nearest_codeword(z, codes, tile):
    """(B,) int32; -1 for rows with a non-finite logit (non-finite z or codeword)."""
    arg, bad, _ = _decode(z, codes, int(tile))
    return torch.where(bad, -1, arg).to(torch.int32)


def label_rank(z, codes, labels, valid, tile):
    """(B,) int32 rank of the label; n for invalid labels and non-finite rows."""
    n = codes.shape[0]
    _, bad, count = _decode(z, codes, int(tile), labels)
    return torch.where(bad | ~valid, n, count).to(torch.int32)
