"""Streaming ECOC cross-entropy, label rank and decoding in PyTorch.

The algorithm of kernels/ecoc_cpu_math.cc and of cut cross-entropy: the forward
walks the classes in tiles of C codewords with an online log-sum-exp and
accumulates the softmax-expected codeword E = sum_i p_i M_i and
Q = sum_i p_i ||M_i||^2; the backward gets dz and dscale from E and Q in closed
form and recomputes each tile's probabilities for dcodes (only when the codes
need a gradient). At most a B x C tile of logits exists at any time, never
B x n.

How the tile loop runs (measured: docs/benchmarks.md):
* On the CPU the two loops (forward, codes gradient) are `torch._higher_order_ops.scan`
  over the n // C full tiles, compiled once with `torch.compile(dynamic=True)`
  (one graph for every B, k, n and C), plus one call for the remainder tile.
  A Python loop pays a dispatch per op per tile; the compiled scan costs about
  as little per tile as one fused kernel, so small tiles (low memory) stay fast.
  On a GPU the loops run uncompiled over large tiles: there each tile costs
  its launches either way, the compiled scan was slower at n <= 10^5 and
  1.2-1.7x faster only at n = 10^6, and its first call compiled for 55 s.
* Each loop is a `torch.library.custom_op` (`keras_ecoc::stream_forward`,
  `keras_ecoc::stream_codes_grad`): when a user's model is compiled with
  `torch.compile`, the loss is one opaque node of that graph (no graph break,
  and inductor never unrolls the n / C tiles).
* Where `torch.compile` cannot run (no C++ compiler for inductor, an old
  PyTorch without scan, `KERAS_ECOC_TORCH_COMPILE=0`), the same step functions
  run in a Python loop: same numbers, slower for small tiles. A failed compile
  warns once and falls back; it never raises.

Shapes: z (B, k) any float dtype (math in float32), codes (n, k), labels (B,)
int64 already made safe (invalid rows replaced by 0), valid (B,) bool,
scale () float32.
"""

from __future__ import annotations

import os
import warnings

import torch

from keras_ecoc.ops._constants import EPSILON
from keras_ecoc.ops._torch_first_order import first_order_only

ENV_COMPILE = "KERAS_ECOC_TORCH_COMPILE"

try:  # A prototype API of PyTorch (2.6 on); without it the Python loop runs.
    from torch._higher_order_ops.scan import scan as _scan
except ImportError:  # pragma: no cover - depends on the installed PyTorch
    _scan = None


def _normalize(z):
    z = z.float()
    sq = torch.sum(z * z, dim=-1, keepdim=True)
    r = torch.rsqrt(torch.maximum(sq, torch.full_like(sq, EPSILON)))  # keeps a NaN
    return z * r, r, sq


# ---------------------------------------------------------------------------
# One tile. `su` = scale * u (B, k); `hs` = -scale / 2 (0-d); `mt` (C, k).
# Logits are shifted by the per-row constant -s ||u||^2 / 2 (it does not change
# the softmax; it is added back to the log-sum-exp at the end).

def _forward_step(su, hs, carry, mt):
    """Online log-sum-exp update: carry = (m (B,), l (B,), e (B, k), q (B,))."""
    m, l, e, q = carry
    # ||M_i||^2 per tile, as a norm: mt * mt would be a C x k temporary (32 MiB
    # at C = 65,536, k = 128: the whole 32 MiB peak measured on an H200).
    ct = torch.square(torch.linalg.vector_norm(mt, dim=-1))
    logits = su @ mt.T + hs * ct[None, :]
    m_new = torch.maximum(m, torch.amax(logits, dim=-1))
    alpha = torch.exp(m - m_new)
    p = torch.exp(logits - m_new[:, None])
    return (m_new, l * alpha + torch.sum(p, dim=-1), e * alpha[:, None] + p @ mt,
            q * alpha + p @ ct)


def _codes_grad_step(su, hs, shift, gs, u_valid, mt):
    """(C, k) gradient of sum_b g_b lse_b w.r.t. the tile's codewords.

    shift (B,) = the shifted log-sum-exp; gs (B,) = g * scale (0 on invalid
    rows); u_valid (B, k) = u with invalid rows zeroed. With w = s g p (B, C):
    dM_i = sum_b w_bi (u_b - M_i).
    """
    ct = torch.square(torch.linalg.vector_norm(mt, dim=-1))
    w = gs[:, None] * torch.exp(su @ mt.T + hs * ct[None, :] - shift[:, None])
    return w.T @ u_valid - torch.sum(w, dim=0)[:, None] * mt


def _forward_tiles(su, hs, tiles, m, l, e, q, use_scan):
    """The online log-sum-exp carried over tiles (T, C, k)."""
    if not use_scan:
        carry = (m, l, e, q)
        for mt in tiles:
            carry = _forward_step(su, hs, carry, mt)
        return carry

    def combine(carry, mt):
        out = _forward_step(su, hs, carry, mt)
        return out, out[1].new_zeros(())  # scan wants a per-step output
    carry, _ = _scan(combine, (m, l, e, q), tiles)
    return carry


def _codes_grad_tiles(su, hs, shift, gs, u_valid, tiles, use_scan):
    """(T, C, k) codes gradient of tiles (T, C, k)."""
    if not use_scan:
        return torch.stack([_codes_grad_step(su, hs, shift, gs, u_valid, mt) for mt in tiles])

    def combine(carry, mt):
        return carry.clone(), _codes_grad_step(su, hs, shift, gs, u_valid, mt)
    _, blocks = _scan(combine, hs.new_zeros(()), tiles)
    return blocks


def _full_tiles(codes, tile):
    """(T, C, k) view of the first T = n // C full tiles (offset 0, no copy) and T."""
    n, k = codes.shape
    full = n // tile
    return codes[:full * tile].reshape(full, tile, k), full


_RECOMPILE_LIMIT_ERRORS = ("FailOnRecompileLimitHit", "FailOnCacheLimitHit")


class _Compiled:
    """`torch.compile` of the scan loops, built lazily; Python loops otherwise."""

    def __init__(self):
        self.failed = None
        self.fns = {}
        self.warned_limit = False

    def enabled(self):
        value = (os.environ.get(ENV_COMPILE) or "1").strip().lower()
        return _scan is not None and self.failed is None and value not in ("0", "false", "no")

    def call(self, fn, *args):
        """fn(*args, use_scan) compiled (dynamic shapes), or uncompiled as a Python loop."""
        # Detached inputs: requires_grad would be one more guard (a recompile).
        args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
        if not self.enabled() or args[0].device.type != "cpu":
            # On a GPU (H200) the compiled scan was slower than this loop at
            # n <= 10^5 (11.9 vs 10.2 ms for 37 tiles), 1.2-1.7x faster at
            # n = 10^6, and its first call compiled for 55 s.
            return fn(*args, False)
        compiled = self.fns.get(fn)
        if compiled is None:
            compiled = self.fns[fn] = torch.compile(fn, fullgraph=True, dynamic=True)
        try:
            return compiled(*args, True)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:  # noqa: BLE001 - any compiler failure means: fall back
            if type(err).__name__ in _RECOMPILE_LIMIT_ERRORS:
                # Too many distinct shapes for dynamo's cache: this call runs
                # uncompiled; the shapes already compiled keep their graphs.
                if not self.warned_limit:
                    self.warned_limit = True
                    warnings.warn(
                        "keras_ecoc: the streaming ECOC loss met more input shapes than "
                        "torch.compile's recompile limit; new shapes run the uncompiled tile "
                        "loop (same results, slower).", RuntimeWarning, stacklevel=2)
                return fn(*args, False)
            self.failed = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            warnings.warn(
                "keras_ecoc: torch.compile of the streaming ECOC loss failed; using the "
                f"uncompiled tile loop (same results, slower for small tiles). Reason: {self.failed}",
                RuntimeWarning, stacklevel=2)
            return fn(*args, False)


_COMPILED = _Compiled()


def compile_status() -> str:
    """One line: whether the tile loops run compiled, and why not."""
    if _scan is None:
        return "Python loop: this PyTorch has no torch._higher_order_ops.scan"
    if _COMPILED.failed is not None:
        return f"Python loop: torch.compile failed ({_COMPILED.failed})"
    if not _COMPILED.enabled():
        return f"Python loop: disabled by {ENV_COMPILE}={os.environ.get(ENV_COMPILE)!r}"
    return "compiled scan (torch.compile, dynamic shapes) on CPU tensors; Python loop on GPU tensors"


# ---------------------------------------------------------------------------
# The loops as custom ops: opaque to an enclosing torch.compile.

@torch.library.custom_op("keras_ecoc::stream_forward", mutates_args=())
def _stream_forward(su: torch.Tensor, codes: torch.Tensor, hs: torch.Tensor,
                    tile: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(shift (B,), e (B, k), q (B,)): shifted log-sum-exp, E and Q over all n codes."""
    b, k = su.shape
    carry = (torch.full((b,), float("-inf"), dtype=torch.float32, device=su.device),
             torch.zeros((b,), dtype=torch.float32, device=su.device),
             torch.zeros((b, k), dtype=torch.float32, device=su.device),
             torch.zeros((b,), dtype=torch.float32, device=su.device))
    tiles, full = _full_tiles(codes, tile)
    if full:
        carry = _COMPILED.call(_forward_tiles, su, hs, tiles, *carry)
    if codes.shape[0] > full * tile:  # the remainder tile, uncompiled (one tile)
        carry = _forward_step(su, hs, carry, codes[full * tile:])
    m, l, e, q = carry
    return m + torch.log(l), e / l[:, None], q / l


@_stream_forward.register_fake
def _(su, codes, hs, tile):
    b, k = su.shape
    return su.new_empty((b,)), su.new_empty((b, k)), su.new_empty((b,))


@torch.library.custom_op("keras_ecoc::stream_codes_grad", mutates_args=())
def _stream_codes_grad(su: torch.Tensor, codes: torch.Tensor, hs: torch.Tensor,
                       shift: torch.Tensor, gs: torch.Tensor, u_valid: torch.Tensor,
                       tile: int) -> torch.Tensor:
    """(n, k) gradient of sum_b g_b lse_b w.r.t. the codes."""
    n, k = codes.shape
    tiles, full = _full_tiles(codes, tile)
    blocks = []
    if full:
        blocks.append(_COMPILED.call(_codes_grad_tiles, su, hs, shift, gs, u_valid,
                                     tiles).reshape(full * tile, k))
    if n > full * tile:
        blocks.append(_codes_grad_step(su, hs, shift, gs, u_valid, codes[full * tile:]))
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=0)


@_stream_codes_grad.register_fake
def _(su, codes, hs, shift, gs, u_valid, tile):
    return codes.new_empty(codes.shape)


class _StreamingCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, codes, labels, valid, scale, tile):
        codes32 = codes.float()
        u, r, sq = _normalize(z)
        usq = torch.sum(u * u, dim=-1)
        hs = -0.5 * scale
        shift, e, q = torch.ops.keras_ecoc.stream_forward(scale * u, codes32, hs, tile)
        lse = shift + hs * usq
        m_y = codes32[labels]
        label_logit = hs * (torch.sum(m_y * m_y, -1) - 2.0 * torch.sum(u * m_y, -1) + usq)
        loss = torch.where(valid, lse - label_logit, torch.full_like(lse, float("nan")))
        ctx.save_for_backward(z, codes32, labels, valid, scale, u, r, sq, shift, e, q)
        ctx.tile = tile
        ctx.codes_dtype = codes.dtype
        return loss

    @staticmethod
    def backward(ctx, g):
        z, codes, labels, valid, scale, u, r, sq, shift, e, q = ctx.saved_tensors
        zero = torch.zeros((), dtype=torch.float32, device=u.device)
        # Invalid labels (NaN loss) contribute nothing, even through NaN rows.
        g = torch.where(valid, g.float(), zero)
        m_y = codes[labels]
        diff = e - m_y
        dz = dscale = dcodes = None
        if ctx.needs_input_grad[0]:
            du = (g * scale)[:, None] * diff
            # At ||z||^2 <= EPSILON the direction is undefined: gradient 0
            # (see keras_ecoc.decoding.normalize).
            tangent = r * (du - torch.sum(u * du, -1, keepdim=True) * u)
            dz = torch.where(valid[:, None] & (sq > EPSILON), tangent, zero).to(z.dtype)
        if ctx.needs_input_grad[4]:
            per_row = g * (-0.5 * (q - torch.sum(m_y * m_y, -1)) + torch.sum(diff * u, -1))
            dscale = torch.sum(torch.where(valid, per_row, zero)).reshape(scale.shape)
        if ctx.needs_input_grad[1]:
            u_valid = torch.where(valid[:, None], u, zero)
            dcodes = torch.ops.keras_ecoc.stream_codes_grad(
                scale * u, codes, -0.5 * scale, shift, g * scale, u_valid, ctx.tile)
            dcodes = dcodes.index_add(0, labels, (g * scale)[:, None] * (m_y - u_valid))
            dcodes = dcodes.to(ctx.codes_dtype)
        dz, dcodes, dscale = first_order_only("streaming", (z, codes, scale), dz, dcodes, dscale)
        return dz, dcodes, None, None, dscale, None


def cross_entropy(z, codes, labels, valid, scale, tile):
    """(B,) float32 loss; NaN where `valid` is False or z is not finite."""
    scale = torch.reshape(scale, ()).float()
    return _StreamingCrossEntropy.apply(z, codes, labels, valid, scale, int(tile))


@torch.library.custom_op("keras_ecoc::stream_decode", mutates_args=())
def _stream_decode(z: torch.Tensor, codes: torch.Tensor, labels: torch.Tensor,
                   with_labels: bool, tile: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(arg (B,) int64, bad (B,) bool, count (B,) int64) over all n codewords.

    Prediction-time only (no gradient, no memory target): a Python loop over
    tiles, inside a custom op so an enclosing torch.compile neither breaks the
    graph nor unrolls the loop.
    """
    with torch.no_grad():
        codes = codes.float()
        n = codes.shape[0]
        u, _, _ = _normalize(z)
        usq = torch.sum(u * u, dim=-1, keepdim=True)
        b = u.shape[0]
        best = torch.full((b,), float("-inf"), device=u.device)
        arg = torch.zeros((b,), dtype=torch.int64, device=u.device)
        bad = torch.zeros((b,), dtype=torch.bool, device=u.device)
        count = torch.zeros((b,), dtype=torch.int64, device=u.device)
        ref = None
        if with_labels:
            m_y = codes[labels]
            ref = -0.5 * (torch.sum(m_y * m_y, -1) - 2.0 * torch.sum(u * m_y, -1) + usq[:, 0])
        for start in range(0, n, tile):
            mt = codes[start:start + tile]
            ct = torch.square(torch.linalg.vector_norm(mt, dim=-1))
            logits = -0.5 * (ct[None, :] - 2.0 * (u @ mt.T) + usq)
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


@_stream_decode.register_fake
def _(z, codes, labels, with_labels, tile):
    b = z.shape[0]
    return (z.new_empty((b,), dtype=torch.int64), z.new_empty((b,), dtype=torch.bool),
            z.new_empty((b,), dtype=torch.int64))


def _decode(z, codes, tile, labels=None):
    with_labels = labels is not None
    if labels is None:
        labels = torch.zeros((z.shape[0],), dtype=torch.int64, device=z.device)
    return torch.ops.keras_ecoc.stream_decode(z.detach(), codes.detach(), labels.long(),
                                              with_labels, int(tile))


def nearest_codeword(z, codes, tile):
    """(B,) int32; -1 for rows with a non-finite logit (non-finite z or codeword)."""
    arg, bad, _ = _decode(z, codes, int(tile))
    return torch.where(bad, -1, arg).to(torch.int32)


def label_rank(z, codes, labels, valid, tile):
    """(B,) int32 rank of the label; n for invalid labels and non-finite rows."""
    n = codes.shape[0]
    _, bad, count = _decode(z, codes, int(tile), labels)
    return torch.where(bad | ~valid, n, count).to(torch.int32)
