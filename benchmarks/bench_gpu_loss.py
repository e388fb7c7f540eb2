#!/usr/bin/env python
"""One GPU timing table of the ECOC loss: JAX, PyTorch, cut cross-entropy, Liger, keras-ecoc CUDA.

The loss (issue 16), for z of shape (B, k), codes M of shape (n, k), integer
labels y of shape (B,) and scale s (default 16):

    u = z / ||z||                                   (B, k)
    logits = s * u.M^T - s/2 ||M||^2 - s/2          (B, n)  = -s/2 ||M_j - u||^2
    loss = mean_i (logsumexp_j logits_ij - logits_i,y_i)

Methods (rows), each timed forward (loss only, no gradient) and forward +
backward (loss and the gradients for z and for the codes):

  jax_default         JAX dense `jax.jit`, `jnp.dot(precision=DEFAULT)` (TF32
                      tensor cores on sm_80 and later)
  jax_highest         the same at `precision=HIGHEST` (FP32)
  torch_compile       PyTorch dense under `torch.compile` (inductor, dynamic
                      shapes), `torch.set_float32_matmul_precision("highest")`
  torch_compile_tf32  the same at "high" (TF32)
  cce_exact           cut cross-entropy (apple/ml-cross-entropy, git version:
                      its PyPI release has no `bias` and no float32 backward)
                      `linear_cross_entropy(e=s*u, c=M, y, bias=-s/2 ||M||^2,
                      impl="cce_exact")` at matmul precision "highest" (its
                      Triton dots then use "ieee"), with its default fixed
                      block configurations (CCE_AUTOTUNE unset)
  cce_tf32            the same at "high" (its dots use "tf32")
  liger               Liger's fused linear cross-entropy (linkedin/Liger-Kernel,
                      `LigerFusedLinearCrossEntropyFunction`) on the same
                      e, M, y and bias, precision "highest": it computes the
                      same loss (CE of e.M^T + bias; the normalisation and the
                      bias are PyTorch eager ops around it, as for CCE), with
                      its default chunking (chunk = next power of two of
                      B / ceil(n / k) rows), so it runs only where that gives
                      at most 256 chunks ("skipped" names the others)
  ecoc_cuda[MODE]     the keras-ecoc CUDA kernels, one row per precision mode,
                      read from the harness's JSON (--harness-json, below)

The constant -s/2 does not change the loss: CCE and Liger get the bias
without it. The normalisation u = z/||z|| is part of every timed step.

Inputs: z ~ N(0, 1) float32, M ~ N(0, 1/k) float32 (rows of about unit norm),
y uniform int64, from NumPy's PCG64 seeded by (B, k, n): every framework gets
the same numbers. Accuracy: a float64 PyTorch reference (method "ref", on
the same device, chunked over the classes, gradients by hand) gives the loss
and, for each gradient g in (dz, dM), ||g|| and <g, P> with P the input
flipped along k; "loss err" is |loss - ref| / |ref|, "grad err" the largest
of |.| differences of those over ||g_ref|| (a mis-wired gradient shows).

Timing: CUDA events around R back-to-back calls (`torch.cuda.Event`), R
chosen from one call so that a block lasts about --block-ms; the median over
--reps blocks of block time / R. JAX exposes no CUDA events for its own
stream: its rows use the host clock around R back-to-back calls and one
`block_until_ready` (dispatch is asynchronous, so this measures the device
time as long as one call lasts longer than its dispatch, i.e. all but the
smallest cells). The first call of each (method, cell), compilation and
autotuning included, is reported apart ("first s", JSON only). The
keras-ecoc CUDA rows (--harness-json) are timed by the harness (forward +
codes gradient, its own scale): its "+auto" rows, the library's choice and
the rows the targets score, in blocks of back-to-back calls as here (CUDA
events, R calls of about 20 ms in all, median of 3 blocks: "fwd_block_ms",
"fwdbwd_block_ms"); the other variants' rows around single calls (median of
3 after a warm-up), labelled "(single calls)": small cells then carry launch
latency the other rows amortise.

Correctness: a row whose loss or gradient error exceeds TOLERANCE for its
precision is marked WRONG, never scores a target, and makes the status say
so; a row without a float64 reference (the harness's) is "unchecked" here
(its checks are device_check.md's, and --device-check-md leaves its rows out
unless they passed).

Memory ("peak MiB", forward + backward): device memory the step needed above
its inputs. PyTorch: `max_memory_allocated()` after
`reset_peak_memory_stats()` minus `memory_allocated()` before one call
(gradients and temporaries). JAX: XLA's buffer assignment for the compiled
step, `memory_analysis()` temp + output bytes. Harness rows: its
`peak_bytes`.

Throughput: FLOPs counted are the three B x n x k matrix products, 2Bnk for
the forward and 6Bnk for forward + backward (normalisation, ||M||^2 and the
softmax not counted). "% FP32" and "% TF32" are fractions of the card's
peaks from NVIDIA's datasheets (H100: "NVIDIA H100 Tensor Core GPU"
datasheet; H200: "NVIDIA H200 Tensor Core GPU" datasheet; TF32 dense = half
the "with sparsity" figure): H100 SXM and H200 SXM 67 TFLOP/s FP32 and 495
TF32; H100 NVL and H200 NVL 60 and 418; H100 PCIe 51 and 378. "codes once
ms" = n*k*4 bytes / the card's memory bandwidth from the same datasheets
(H100 SXM 3.35 TB/s, H100 NVL 3.9, H100 PCIe 2.0, H200 4.8): the B = 16
target is at most 3x that. The card is looked up from
`torch.cuda.get_device_name(0)`; an unknown card gets "n/a".

Harness JSON (--harness-json PATH): a JSON list of objects, one per (cell,
precision mode) of the CUDA kernels' timing mode (kernels/cuda/harness.cu):

    [{"B": 16, "k": 32, "n": 10000, "mode": "3xtf32",
      "fwd_ms": 0.05, "fwdbwd_ms": 0.12, "peak_bytes": 4096}, ...]

B, k, n: positive integers; mode: a non-empty string ("fp32", "3xtf32",
"tf32", ...; the harness's launch variants add "+" and the variant's name
(kVariants in kernels/cuda/harness.cu: "+rows64", "+regsoftmax+warps8",
"+gradpersistent", ...) to the math mode; no suffix is the v2 kernels, and
"+auto" what the library runs, the only rows the targets score when the file
has any; a mode whose
lower-cased name contains "tf32" but not "3x" is compared with the TF32
rows, every other with the FP32 rows); fwd_ms,
fwdbwd_ms: milliseconds (forward; forward + codes gradient) or null;
peak_bytes: device bytes beyond the inputs (workspace and outputs) or null.
Optional: "loss_err" and "grad_err" (relative to float64, as above),
"note", "fwd_from": the mode of the row (same cell) whose fwd_ms this row
repeats because it runs the same forward launch (the harness times that once:
"+gradmma" and "+gradpersistent" rows take the plain rows', "+auto" rows the
variant auto ran), "fwd_host_us", "fwdbwd_host_us": the host's
wall-clock microseconds to make the call (the harness's table has them), and
"launch_ms" (with "launch_ms_unstable"): the auto rows' forward + codes
gradient split into its launches ({"forward prep": ms, ...}, the harness's
per-launch table); this script ignores those. "fwd_block_ms",
"fwdbwd_block_ms" (non-negative numbers or null; with "fwd_block_calls",
"fwdbwd_block_calls", the calls per block): the same calls timed in blocks
of back-to-back calls; where fwdbwd_block_ms is given, the table shows these
times and fwd_ms, fwdbwd_ms stay in the JSON as single_fwd_ms,
single_fwdbwd_ms. A file that breaks this is refused with a ValueError naming
the entry.

Order and time: a JAX worker (jax_default, jax_highest), then a PyTorch
worker (ref, cce_exact, cce_tf32, torch_compile, torch_compile_tf32, liger);
each walks the cells issue 16's targets name first (n >= 1e5 with B in
{16, 256}, both k; then n = 1e4; B = 4096 last; see cell_priority) with every
one of its methods per cell, prints one JSON line per result, and is restarted
past a (method, cell) that crashes or runs longer than --item-timeout. A slow
method is capped: the timed blocks of one step take at most --step-budget
seconds (4; fewer than --reps blocks, at least one, listed under 'Not
measured'), judged from the call that sizes the blocks.
`--time-limit` is hard: the JAX worker gets 35% of it (what it leaves goes
on), a worker still running at the deadline is killed, and what did not run
is listed as skipped. (For the tests, the environment variable
BENCH_GPU_LOSS_FAULT=crash:METHOD[:B] or hang:METHOD[:B] makes a worker
exit or hang when it starts METHOD, on every cell or on those with batch B.)
After every result the Markdown table (--out) and the
JSON (--out with .json) are rewritten, so a killed run leaves what it had.

Usage:
    python benchmarks/bench_gpu_loss.py --out build/gpu_loss.md [--time-limit 240]
        [--harness-json harness.json] [--methods jax_default,cce_exact] [--quick]
    python benchmarks/bench_gpu_loss.py --render build/gpu_loss.json
        [--harness-json harness.json] --out table.md     (re-render, no GPU)
    python benchmarks/bench_gpu_loss.py --check-harness-json harness.json
Exit codes: 0 rows measured (or rendered); 1 a GPU but nothing measured;
2 bad arguments, a bad harness file, or no GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import queue
import statistics
import subprocess
import sys
import threading
import time

SCALE = 16.0
GRID = [(b, k, n) for b in (16, 256, 4096) for k in (32, 128)
        for n in (10_000, 100_000, 1_000_000)]
# --quick (and --simulate-gpu): tiny shapes, including a class count that is
# no multiple of any tile, for the plumbing.
QUICK_GRID = [(4, 8, 100), (5, 3, 37), (16, 32, 1000)]
# name: (framework, precision class, table label)
METHODS = {
    "jax_default": ("jax", "tf32", "JAX jit, DEFAULT"),
    "jax_highest": ("jax", "fp32", "JAX jit, HIGHEST"),
    "torch_compile": ("torch", "fp32", "torch.compile, highest"),
    "cce_exact": ("torch", "fp32", "CCE cce_exact, highest"),
    "cce_tf32": ("torch", "tf32", "CCE cce_exact, high (TF32)"),
    "liger": ("torch", "fp32", "Liger FLCE, highest"),
    "torch_compile_tf32": ("torch", "tf32", "torch.compile, high (TF32)"),
}
# Within a cell, in this order: the float64 reference first (the error
# columns need it), then the baselines issue 16's targets name (JAX DEFAULT and
# HIGHEST; CCE at both precisions), then torch.compile and Liger.
WORKERS = {"jax": ["jax_default", "jax_highest"],
           "torch": ["ref", "cce_exact", "cce_tf32", "torch_compile", "torch_compile_tf32",
                     "liger"]}
JAX_SHARE = 0.35
LIGER_MAX_CHUNKS = 256
# (substrings of torch.cuda.get_device_name, all required; label, FP32 TFLOP/s,
# TF32 dense TFLOP/s, memory TB/s). First match wins: NVL/PCIe before SXM.
CARDS = [
    (("H200", "NVL"), "H200 NVL", 60.0, 418.0, 4.8),
    (("H200",), "H200 SXM", 67.0, 495.0, 4.8),
    (("H100", "NVL"), "H100 NVL", 60.0, 418.0, 3.9),
    (("H100", "PCIe"), "H100 PCIe", 51.0, 378.0, 2.0),
    (("H100",), "H100 SXM", 67.0, 495.0, 3.35),
]
HARNESS_KEYS = ("B", "k", "n", "mode", "fwd_ms", "fwdbwd_ms", "peak_bytes")
BEGIN = "<!-- bench_gpu_loss:begin -->"
END = "<!-- bench_gpu_loss:end -->"


def card_peaks(name):
    """(label, fp32 TFLOP/s, tf32 TFLOP/s, TB/s) for a device name, or None if unknown."""
    for subs, label, fp32, tf32, bw in CARDS:
        if name and all(s in name for s in subs):
            return label, fp32, tf32, bw
    return None


def cell_seed(b, k, n):
    return (b * 1_000_003 + k) * 1_000_033 + n


_PROBLEM = {}


def problem(b, k, n):
    """z (B, k) float32, codes (n, k) float32, labels (B,) int64: the same for every method.

    The last cell's arrays are kept: a worker measures all its methods on one
    cell before the next (generating 10^8 normals takes about a second).
    """
    import numpy as np

    if (b, k, n) in _PROBLEM:
        return _PROBLEM[(b, k, n)]
    _PROBLEM.clear()

    rng = np.random.default_rng(cell_seed(b, k, n))
    z = rng.standard_normal((b, k), dtype=np.float32)
    codes = rng.standard_normal((n, k), dtype=np.float32)
    codes *= np.float32(1.0 / math.sqrt(k))
    labels = rng.integers(0, n, size=b, dtype=np.int64)
    _PROBLEM[(b, k, n)] = z, codes, labels
    return z, codes, labels


def liger_chunks(b, k, n):
    """Chunks Liger's default (chunk_mem_const=1) splits B rows into."""
    inc = -(-n // k)
    chunk = min(b, 1 << max(0, (-(-b // inc) - 1).bit_length()))
    return -(-b // chunk)


# --------------------------------------------------------------------------
# Harness JSON
# --------------------------------------------------------------------------

def load_harness_json(path):
    """Reads the CUDA harness's timing rows; raises ValueError naming the bad entry."""
    form = ("a JSON list of {B, k, n, mode, fwd_ms, fwdbwd_ms, peak_bytes} objects "
            "(see the docstring of benchmarks/bench_gpu_loss.py)")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"Argument `--harness-json` must name {form}. "
                         f"Received: --harness-json={path} ({type(e).__name__}: {e})") from None
    if not isinstance(data, list):
        raise ValueError(f"Argument `--harness-json` must name {form}. Received: "
                         f"--harness-json={path} (a JSON {type(data).__name__})")
    rows = []
    for i, e in enumerate(data):
        why = None
        if not isinstance(e, dict):
            why = f"entry {i} is a {type(e).__name__}"
        else:
            missing = [key for key in HARNESS_KEYS if key not in e]
            if missing:
                why = f"entry {i} lacks {', '.join(missing)}"
            elif not all(isinstance(e[key], int) and not isinstance(e[key], bool)
                         and e[key] > 0 for key in ("B", "k", "n")):
                why = f"entry {i}: B, k, n must be positive integers, got {e['B']!r}, " \
                      f"{e['k']!r}, {e['n']!r}"
            elif not isinstance(e["mode"], str) or not e["mode"]:
                why = f"entry {i}: mode must be a non-empty string, got {e['mode']!r}"
            else:
                for key in ("fwd_ms", "fwdbwd_ms", "peak_bytes", "loss_err", "grad_err",
                            "fwd_block_ms", "fwdbwd_block_ms"):
                    v = e.get(key)
                    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                          or not math.isfinite(v) or v < 0):
                        why = f"entry {i}: {key} must be a non-negative number or null, got {v!r}"
                        break
        if why:
            raise ValueError(f"Argument `--harness-json` must name {form}. "
                             f"Received: --harness-json={path} ({why})")
        # Rows the harness also timed in blocks of back-to-back calls (its
        # traced columns: auto's) are shown with those times, the way this
        # script times every other method; the single-call times stay in
        # the JSON.
        blocks = e.get("fwdbwd_block_ms") is not None
        rows.append({"method": f"ecoc_cuda[{e['mode']}]", "mode": e["mode"], "B": e["B"],
                     "k": e["k"], "n": e["n"],
                     "fwd_ms": e["fwd_block_ms"] if blocks else e["fwd_ms"],
                     "fwdbwd_ms": e["fwdbwd_block_ms"] if blocks else e["fwdbwd_ms"],
                     "single_fwd_ms": e["fwd_ms"], "single_fwdbwd_ms": e["fwdbwd_ms"],
                     "timing": "blocks" if blocks else "single calls",
                     "peak_bytes": e["peak_bytes"],
                     "loss_err": e.get("loss_err"), "grad_err": e.get("grad_err"),
                     "note": e.get("note"), "source": "harness"})
    return rows


def harness_precision(mode):
    m = mode.lower()
    return "tf32" if "tf32" in m and "3x" not in m else "fp32"


# --------------------------------------------------------------------------
# Worker side: builders, timers, measurement
# --------------------------------------------------------------------------

class _TorchEnv:
    def __init__(self, simulate, compile_backend):
        import torch

        self.torch = torch
        self.simulate = simulate
        self.compile_backend = compile_backend
        self.device = torch.device("cpu" if simulate else "cuda")
        self._compiled = None
        self._cell = self._tensors = None
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)

    def sync(self):
        if not self.simulate:
            self.torch.cuda.synchronize()

    def block_ms(self, call, reps):
        """Milliseconds for `reps` back-to-back calls (CUDA events; host clock when simulated)."""
        torch = self.torch
        if self.simulate:
            t = time.perf_counter()
            for _ in range(reps):
                out = call()
            del out
            return 1e3 * (time.perf_counter() - t)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            out = call()
        end.record()
        end.synchronize()
        del out
        return start.elapsed_time(end)

    def peak_bytes(self, call):
        if self.simulate:
            return None
        torch = self.torch
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = call()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        return peak

    def inputs(self, cell):
        """z, codes, labels of `cell` on the device (kept for the cell's other methods)."""
        if self._cell != cell:
            self._tensors = None  # frees the last cell's arrays before the next upload
            self._tensors = tuple(self.torch.from_numpy(a).to(self.device) for a in problem(*cell))
            self._cell = cell
        return self._tensors

    def compiled_dense(self):
        if self._compiled is None:
            self._compiled = self.torch.compile(_torch_dense_loss, dynamic=True,
                                                backend=self.compile_backend)
        return self._compiled

    def cleanup(self):
        if not self.simulate:
            self.torch.cuda.empty_cache()


def _torch_dense_loss(z, codes, labels, scale):
    """Mean ECOC cross-entropy: z (B, k), codes (n, k), labels (B,) int64 -> scalar.

    Dense: materialises the (B, n) logits (torch.compile fuses what it can).
    """
    import torch.nn.functional as F

    u = z / z.norm(dim=1, keepdim=True)
    logits = scale * (u @ codes.T) - (0.5 * scale) * (codes * codes).sum(1) - 0.5 * scale
    return F.cross_entropy(logits, labels)


def _torch_linear_inputs(z, codes, scale):
    """(e, bias) for a linear cross-entropy CE(e.codes^T + bias) equal to the ECOC loss.

    e = s * z/||z|| (B, k); bias = -s/2 ||codes_j||^2 (n,). The ECOC logits'
    -s/2 ||u||^2 = -s/2 is the same in every class, so CE does not see it.
    """
    u = z / z.norm(dim=1, keepdim=True)
    return scale * u, -(0.5 * scale) * (codes * codes).sum(1)


def torch_builder(env, method, z, codes, labels, scale):
    """Returns (loss_fn(z, codes) -> scalar, precision): the step to differentiate."""
    if method in ("torch_compile", "torch_compile_tf32"):
        compiled = env.compiled_dense()
        return (lambda zz, cc: compiled(zz, cc, labels, scale),
                "highest" if method == "torch_compile" else "high")
    if method in ("cce_exact", "cce_tf32"):
        from cut_cross_entropy import linear_cross_entropy

        def cce(zz, cc):
            e, bias = _torch_linear_inputs(zz, cc, scale)
            return linear_cross_entropy(e, cc, labels, bias=bias, impl="cce_exact",
                                        reduction="mean")
        return cce, "highest" if method == "cce_exact" else "high"
    if method == "liger":
        from liger_kernel.ops.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyFunction)

        def liger(zz, cc):
            e, bias = _torch_linear_inputs(zz, cc, scale)
            # Positional, as liger_kernel.transformers.functional passes them:
            # input, weight, target, bias, ce_weight, ignore_index,
            # lse_square_scale, label_smoothing, reduction.
            return LigerFusedLinearCrossEntropyFunction.apply(
                e, cc, labels, bias, None, -100, 0.0, 0.0, "mean")[0]
        return liger, "highest"
    raise ValueError(f"unknown PyTorch method {method!r}")


def torch_reference(env, z, codes, labels, scale):
    """Float64 loss, dz, dM on the device, chunked over the classes (by hand, no autograd)."""
    torch = env.torch
    z64, m64 = z.double(), codes.double()
    b, n = z64.shape[0], m64.shape[0]
    nz = z64.norm(dim=1, keepdim=True)
    u = z64 / nz
    sqn = (m64 * m64).sum(1)
    chunk = max(1, min(n, (1 << 27) // max(b, 1)))

    def logits(lo, hi):
        return scale * (u @ m64[lo:hi].T) - 0.5 * scale * sqn[lo:hi] - 0.5 * scale

    lse = torch.full((b,), -math.inf, dtype=torch.float64, device=z.device)
    for lo in range(0, n, chunk):
        lse = torch.logaddexp(lse, torch.logsumexp(logits(lo, lo + chunk), dim=1))
    my = m64[labels]
    label_logit = scale * (u * my).sum(1) - 0.5 * scale * (my * my).sum(1) - 0.5 * scale
    loss = (lse - label_logit).mean()
    du = torch.zeros_like(u)
    dm = torch.empty_like(m64)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        p = torch.exp(logits(lo, hi) - lse[:, None]) / b
        du += scale * (p @ m64[lo:hi])
        dm[lo:hi] = scale * (p.T @ u) - scale * p.sum(0)[:, None] * m64[lo:hi]
    # The label term of d loss / d logits is -1/B at (i, y_i).
    du -= scale * my / b
    dm.index_add_(0, labels, -(scale * u - scale * my) / b)
    dz = (du - (du * u).sum(1, keepdim=True) * u) / nz
    return loss, dz, dm


def checks(loss, dz, dm, z, codes):
    """Scalars that pin the loss and both gradients down (float64 on the host)."""
    def dot(a, b):
        return float((a.double() * b.double()).sum())

    def norm(a):
        return float(a.double().norm())

    pz, pm = z.flip(1), codes.flip(1)
    return {"loss": float(loss.detach()), "dz_norm": norm(dz), "dm_norm": norm(dm),
            "dz_proj": dot(dz, pz), "dm_proj": dot(dm, pm),
            "pz_norm": norm(pz), "pm_norm": norm(pm)}


def _time_step(block_ms, call, args):
    """(median ms per call, R, blocks): `blocks` blocks of R back-to-back calls;
    R from one call. Blocks is args.reps, cut so that the timed blocks take at
    most --step-budget seconds when one call is slow (at least 1): CCE's
    float32 backward took 1.7 s per call at n = 1e6 on the H100, and 5 blocks
    of it (twice, fwd+bwd and its peak) ate a third of the run's budget."""
    one = block_ms(call, 1)
    r = max(1, min(args.max_calls, int(args.block_ms / max(one, 1e-3))))
    blocks = max(1, min(args.reps, int(1e3 * args.step_budget / max(one * r, 1e-3))))
    samples = [block_ms(call, r) / r for _ in range(blocks)]
    return statistics.median(samples), r, blocks


def _timed(row, key, block_ms, call, args):
    """Sets row[key + "_ms"] and row[key + "_calls"]; row[key + "_blocks"]
    (and a note in row["cut"]) where --step-budget cut the blocks."""
    ms, calls, blocks = _time_step(block_ms, call, args)
    row[f"{key}_ms"], row[f"{key}_calls"] = ms, calls
    if blocks < args.reps:
        row[f"{key}_blocks"] = blocks
        row.setdefault("cut", []).append(f"{key}: {blocks} of {args.reps} blocks")


def torch_measure(env, method, cell, args):
    torch = env.torch
    b, k, n = cell
    z, codes, labels = env.inputs(cell)
    row = {"method": method}
    try:
        if method == "ref":
            t = time.perf_counter()
            loss, dz, dm = torch_reference(env, z, codes, labels, args.scale)
            row.update(checks(loss, dz, dm, z, codes), first_s=time.perf_counter() - t)
            return row
        if method == "liger" and liger_chunks(b, k, n) > LIGER_MAX_CHUNKS:
            row["skipped"] = (f"Liger's default chunking splits B={b} into {liger_chunks(b, k, n)} "
                              f"chunks at n/k={n / k:.0f} (> {LIGER_MAX_CHUNKS})")
            return row
        loss_fn, precision = torch_builder(env, method, z, codes, labels, args.scale)
        torch.set_float32_matmul_precision(precision)
        zg = z.clone().requires_grad_(True)
        cg = codes.clone().requires_grad_(True)

        def fwd():
            with torch.no_grad():
                return loss_fn(z, codes)

        def fwdbwd():
            loss = loss_fn(zg, cg)
            dz, dm = torch.autograd.grad(loss, (zg, cg))
            return loss, dz, dm

        t = time.perf_counter()
        fwd()
        env.sync()
        row["first_s"] = time.perf_counter() - t
        t = time.perf_counter()
        loss, dz, dm = fwdbwd()
        env.sync()
        row["first_bwd_s"] = time.perf_counter() - t
        row.update(checks(loss, dz, dm, z, codes))
        del loss, dz, dm
        _timed(row, "fwd", env.block_ms, fwd, args)
        _timed(row, "fwdbwd", env.block_ms, fwdbwd, args)
        row["peak_bytes"] = env.peak_bytes(fwdbwd)
        row["fwd_peak_bytes"] = env.peak_bytes(fwd)
        if method == "liger":
            row["liger_chunks"] = liger_chunks(b, k, n)
    except ImportError as e:  # cut cross-entropy or Liger not installed (or no Triton)
        row["skipped"] = f"not importable ({type(e).__name__}: {e})"[:300]
    except Exception as e:  # noqa: BLE001 - reported in the row (OOM, a kernel error, ...)
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    finally:
        torch.set_float32_matmul_precision("highest")
        env.cleanup()
    return row


def jax_loss(z, codes, labels, scale, precision):
    """_torch_dense_loss in JAX: z (B, k), codes (n, k), labels (B,) int32 -> scalar."""
    import jax
    import jax.numpy as jnp

    u = z / jnp.linalg.norm(z, axis=1, keepdims=True)
    logits = (scale * jnp.dot(u, codes.T, precision=precision)
              - (0.5 * scale) * jnp.sum(codes * codes, axis=1) - 0.5 * scale)
    lse = jax.nn.logsumexp(logits, axis=1)
    return jnp.mean(lse - jnp.take_along_axis(logits, labels[:, None], axis=1)[:, 0])


def jax_measure(method, cell, args):
    import functools

    import jax

    b, k, n = cell
    row = {"method": method}
    try:
        z_np, c_np, y_np = problem(b, k, n)
        dev = jax.devices()[0]
        z, codes = jax.device_put(z_np, dev), jax.device_put(c_np, dev)
        labels = jax.device_put(y_np.astype("int32"), dev)
        prec = (jax.lax.Precision.DEFAULT if method == "jax_default"
                else jax.lax.Precision.HIGHEST)
        loss_fn = functools.partial(jax_loss, scale=args.scale, precision=prec)
        # Compiled ahead of time: the same executables are timed and asked
        # for their buffer sizes (a second lower().compile() would compile again).
        t = time.perf_counter()
        fwd_c = jax.jit(loss_fn).lower(z, codes, labels).compile()
        row["compile_s"] = time.perf_counter() - t
        fb_c = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1))).lower(
            z, codes, labels).compile()
        row["compile_bwd_s"] = time.perf_counter() - t - row["compile_s"]

        def fwd():
            return fwd_c(z, codes, labels)

        def fwdbwd():
            return fb_c(z, codes, labels)

        def block_ms(call, reps):
            t = time.perf_counter()
            for _ in range(reps):
                out = call()
            jax.block_until_ready(out)
            return 1e3 * (time.perf_counter() - t)

        t = time.perf_counter()
        jax.block_until_ready(fwd())
        row["first_s"] = time.perf_counter() - t
        t = time.perf_counter()
        loss, (dz, dm) = jax.block_until_ready(fwdbwd())
        row["first_bwd_s"] = time.perf_counter() - t
        row.update(checks_jax(loss, dz, dm, z, codes))
        del loss, dz, dm
        _timed(row, "fwd", block_ms, fwd, args)
        _timed(row, "fwdbwd", block_ms, fwdbwd, args)
        for key, fn in (("peak_bytes", fb_c), ("fwd_peak_bytes", fwd_c)):
            try:
                ma = fn.memory_analysis()
                row[key] = int(ma.temp_size_in_bytes + ma.output_size_in_bytes)
            except Exception:  # noqa: BLE001 - a backend without buffer statistics
                row[key] = None
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    return row


def checks_jax(loss, dz, dm, z, codes):
    """checks() on the device: float32 reductions (XLA's are pairwise; about 1e-7 relative),
    so that n x k gradients do not travel to the host."""
    import jax.numpy as jnp
    import numpy as np

    pz, pm = z[:, ::-1], codes[:, ::-1]
    vals = np.asarray(jnp.stack([loss, jnp.linalg.norm(dz), jnp.linalg.norm(dm),
                                 jnp.sum(dz * pz), jnp.sum(dm * pm), jnp.linalg.norm(pz),
                                 jnp.linalg.norm(pm)]), dtype=np.float64)
    return dict(zip(("loss", "dz_norm", "dm_norm", "dz_proj", "dm_proj", "pz_norm", "pm_norm"),
                    map(float, vals)))


def probe(framework, simulate):
    """One dict: what this worker's framework sees (device name, versions)."""
    info = {"python": platform.python_version()}
    if framework == "jax":
        import jax

        info.update(jax=jax.__version__, backend=jax.default_backend(),
                    device=str(jax.devices()[0].device_kind))
        info["gpu"] = jax.default_backend() == "gpu"
    else:
        import torch

        info.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                    gpu=torch.cuda.is_available())
        if info["gpu"]:
            p = torch.cuda.get_device_properties(0)
            info.update(device=torch.cuda.get_device_name(0), cc=f"{p.major}.{p.minor}",
                        sms=p.multi_processor_count, mem_gib=round(p.total_memory / 2**30, 1))
        for mod in ("triton", "cut_cross_entropy", "liger_kernel"):
            try:
                m = __import__(mod)
                info[mod] = getattr(m, "__version__", "?")
            except Exception as e:  # noqa: BLE001
                info[mod] = f"not importable ({type(e).__name__}: {e})"[:200]
    if simulate:
        info["gpu"] = False
        info["simulated"] = True
    return info


def worker_main(args):
    framework = args.worker
    items = json.loads(args.items)
    info = probe(framework, args.simulate_gpu)
    print(json.dumps({"event": "probe", "framework": framework, **info}), flush=True)
    if not (info["gpu"] or args.simulate_gpu):
        print(f"bench_gpu_loss worker {framework}: no GPU "
              f"({info.get('backend', 'torch.cuda.is_available() is False')})", file=sys.stderr)
        return 2
    if framework == "jax":
        import jax

        if args.simulate_gpu:
            jax.config.update("jax_platforms", "cpu")
        measure = jax_measure
    else:
        env = _TorchEnv(args.simulate_gpu, args.compile_backend)

        def measure(method, cell, a):
            return torch_measure(env, method, cell, a)
    fault = os.environ.get("BENCH_GPU_LOSS_FAULT", "")
    for cell, method in items:
        print(json.dumps({"event": "start", "method": method, "cell": cell}), flush=True)
        if fault in (f"crash:{method}", f"crash:{method}:{cell[0]}"):
            print(f"BENCH_GPU_LOSS_FAULT: exiting at {method}", file=sys.stderr, flush=True)
            os._exit(3)
        if fault in (f"hang:{method}", f"hang:{method}:{cell[0]}"):
            time.sleep(3600)
        row = measure(method, tuple(cell), args)
        row.update(B=cell[0], k=cell[1], n=cell[2], framework=framework)
        print(json.dumps({"event": "row", **row}), flush=True)
    return 0


# --------------------------------------------------------------------------
# Parent side: workers under a deadline, state, rendering
# --------------------------------------------------------------------------

def _reader(stream, q, tag):
    for line in iter(stream.readline, ""):
        q.put((tag, line))
    q.put((tag, None))


def run_worker(framework, items, deadline, args, state, save):
    """Runs `items` [(cell, method)] in worker subprocesses until done or the deadline.

    A (method, cell) that crashes its worker or runs past --item-timeout is
    recorded as an error row and the worker restarts past it.
    """
    script = os.path.abspath(__file__)
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               TF_CPP_MIN_LOG_LEVEL="3")
    flags = ["--scale", str(args.scale), "--reps", str(args.reps), "--block-ms",
             str(args.block_ms), "--max-calls", str(args.max_calls), "--step-budget",
             str(args.step_budget), "--compile-backend", args.compile_backend]
    if args.simulate_gpu:
        env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
        flags.append("--simulate-gpu")
    todo = list(items)
    while todo:
        if time.time() >= deadline - 2:
            break
        cmd = [sys.executable, script, "--worker", framework, "--items", json.dumps(todo), *flags]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=os.path.dirname(script))
        q = queue.Queue()
        threads = [threading.Thread(target=_reader, args=(proc.stdout, q, "out"), daemon=True),
                   threading.Thread(target=_reader, args=(proc.stderr, q, "err"), daemon=True)]
        for t in threads:
            t.start()
        current, started, open_streams, err_tail = None, time.time(), 2, []
        killed, begun = None, False
        while open_streams:
            now = time.time()
            # Until its first item starts, a worker is importing its framework.
            limit = min(deadline, started + (args.item_timeout if begun else
                                             args.startup_timeout))
            try:
                tag, line = q.get(timeout=max(0.05, min(1.0, limit - now)))
            except queue.Empty:
                if time.time() >= limit:
                    killed = "deadline" if time.time() >= deadline else "item"
                    proc.kill()
                    break
                continue
            if line is None:
                open_streams -= 1
                continue
            if tag == "err":
                sys.stderr.write(f"[{framework} worker] {line}")
                err_tail = (err_tail + [line.rstrip()])[-5:]
                continue
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                sys.stdout.write(f"[{framework} worker] {line}")
                continue
            ev = msg.pop("event", None)
            if ev == "probe":
                state["probe"][framework] = msg
                save()
            elif ev == "start":
                current, started = (tuple(msg["cell"]), msg["method"]), time.time()
                begun = True
            elif ev == "row":
                state["rows"].append(msg)
                key = (tuple((msg["B"], msg["k"], msg["n"])), msg["method"])
                todo = [it for it in todo if (tuple(it[0]), it[1]) != key]
                current = None
                print(f"[{time.time() - state['t0']:.0f} s] {summary_line(msg)}", flush=True)
                save()
        proc.wait()
        rc = proc.returncode
        if killed == "deadline":
            break
        if current is not None:
            cell, method = current
            why = (f"ran past --item-timeout={args.item_timeout:.0f} s" if killed == "item"
                   else f"worker exited with code {rc}: " + " / ".join(err_tail)[-300:])
            state["rows"].append({"method": method, "B": cell[0], "k": cell[1], "n": cell[2],
                                  "framework": framework, "error": why})
            todo = [it for it in todo if (tuple(it[0]), it[1]) != current]
            save()
            continue
        if todo:  # exited before starting anything (no GPU, import error)
            why = (f"start-up ran past --startup-timeout={args.startup_timeout:.0f} s"
                   if killed else " / ".join(err_tail)[-300:] or f"exit code {rc}")
            state["notes"].append(f"{framework} worker: {why}; not run: "
                                  f"{len(todo)} (method, cell) pairs")
            return rc
    for cell, method in todo:
        state["skipped"].append(f"{method} B={cell[0]} k={cell[1]} n={cell[2]}")
    return 0


def summary_line(r):
    head = f"{r['method']} B={r['B']} k={r['k']} n={r['n']}:"
    if r.get("error"):
        return f"{head} ERROR {r['error']}"
    if r.get("skipped"):
        return f"{head} skipped, {r['skipped']}"
    if r["method"] == "ref":
        return f"{head} float64 loss {r['loss']:.6f}"
    return f"{head} fwd {fmt_ms(r.get('fwd_ms'))} ms, fwd+bwd {fmt_ms(r.get('fwdbwd_ms'))} ms"


def fmt_ms(v):
    if v is None:
        return "n/a"
    if v < 1:
        return f"{v:.3g}"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def fmt_num(v, digits=1):
    if v is None:
        return "n/a"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}f}" if v >= 0.1 else f"{v:.2g}"


def errors_vs_ref(row, ref):
    """(loss err, grad err) relative to the float64 reference row, or (None, None)."""
    if ref is None or row.get("loss") is None or ref.get("loss") is None:
        return row.get("loss_err"), row.get("grad_err")
    loss_err = abs(row["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-30)
    grad_err = 0.0
    for g, p in (("dz", "pz"), ("dm", "pm")):
        scale = max(ref[f"{g}_norm"], 1e-30)
        grad_err = max(grad_err, abs(row[f"{g}_norm"] - ref[f"{g}_norm"]) / scale,
                       abs(row[f"{g}_proj"] - ref[f"{g}_proj"]) / (scale * max(ref[f"{p}_norm"],
                                                                               1e-30)))
    return loss_err, grad_err


# Largest relative error (loss, gradients) against the float64 reference that a
# correct row of each precision reaches, with a margin: the worst of five
# device runs (docs/device_runs/2026-11-26* to 2026-11-28*) was 2.0e-7 / 5.2e-6
# for FP32 rows (CCE exact at n = 10^6) and 2.9e-4 / 2.8e-3 for TF32 rows
# (CCE at TF32). A row above its tolerance is WRONG: shown, never used for a
# target. A row without a reference is "unchecked".
TOLERANCE = {"fp32": (1e-5, 1e-4), "tf32": (1e-2, 5e-2)}


def references(rows):
    """{(B, k, n): the float64 reference row} of the cells whose reference ran."""
    return {(r["B"], r["k"], r["n"]): r for r in rows
            if r["method"] == "ref" and not r.get("error")}


def check_row(row, ref):
    """("ok" | "WRONG" | "unchecked", loss err, grad err) of a timed row."""
    le, ge = errors_vs_ref(row, ref)
    if le is None or ge is None:
        return "unchecked", le, ge
    loss_tol, grad_tol = TOLERANCE.get(precision_of(row), TOLERANCE["tf32"])
    return ("ok" if le <= loss_tol and ge <= grad_tol else "WRONG"), le, ge


def machine_line(state):
    parts = []
    tp, jp = state["probe"].get("torch", {}), state["probe"].get("jax", {})
    if state.get("simulated"):
        parts.append("SIMULATED (--simulate-gpu: the GPU code path on the CPU, tiny shapes; "
                     "no GPU numbers)")
    parts.append(f"card: {state.get('card') or 'unknown'}")
    if tp:
        parts.append(f"PyTorch {tp.get('torch', '?')} (CUDA {tp.get('torch_cuda', '?')}), "
                     f"Triton {tp.get('triton', '?')}, cut-cross-entropy "
                     f"{tp.get('cut_cross_entropy', '?')}, liger-kernel "
                     f"{tp.get('liger_kernel', '?')}")
    if jp:
        parts.append(f"JAX {jp.get('jax', '?')} ({jp.get('backend', '?')}: "
                     f"{jp.get('device', '?')})")
    if tp.get("cc"):
        parts.append(f"compute capability {tp['cc']}, {tp['sms']} SMs, {tp['mem_gib']} GiB")
    return "; ".join(parts)


ORDER = ["jax_default", "jax_highest", "torch_compile", "torch_compile_tf32", "cce_exact",
         "cce_tf32", "liger"]


def method_rank(m):
    if m.startswith("ecoc_cuda"):
        return (0, m)
    return (1, ORDER.index(m) if m in ORDER else len(ORDER), m)


def precision_of(row):
    m = row["method"]
    if m.startswith("ecoc_cuda"):
        return harness_precision(row["mode"])
    return METHODS[m][1]


def harness_mode_label(row):
    """The harness row's mode, with "(single calls)" where it was timed so."""
    return row["mode"] + (" (single calls)" if row.get("timing") == "single calls" else "")


def label_of(row):
    m = row["method"]
    if m.startswith("ecoc_cuda"):
        return f"keras-ecoc CUDA, {harness_mode_label(row)}"
    return METHODS[m][2]


def render(state, harness_rows=()):
    """The Markdown section (table, targets, notes) from the rows gathered so far."""
    peaks = card_peaks(state.get("card") or "")
    rows = [r for r in state["rows"] if r["method"] != "ref"] + list(harness_rows)
    refs = references(state["rows"])
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [BEGIN, "", "## The ECOC loss on one GPU: keras-ecoc CUDA kernels against JAX, "
             "PyTorch, cut cross-entropy and Liger", "",
             f"Generated by `python benchmarks/bench_gpu_loss.py` on {now} "
             f"({state.get('elapsed_s', 0) / 60:.1f} min, {state['status']}).", "",
             f"- Machine: {machine_line(state)}.",
             f"- Peaks: {_peaks_line(peaks)}.", "",
             "Loss: u = z/||z||, logits = s·u·Mᵀ − s/2·||M||² − s/2, mean softmax "
             f"cross-entropy, s = {state['scale']:g}; z (B, k), M (n, k), float32. fwd: loss "
             "only; fwd+bwd: loss and the gradients for z and M. Time: median over "
             f"{state['reps']} blocks of back-to-back calls (CUDA events; JAX: host clock "
             "around the block and one `block_until_ready`), first call (compilation, "
             "autotuning) excluded. Peak: device memory above the inputs for fwd+bwd "
             "(PyTorch: measured, `max_memory_allocated`; JAX: XLA's buffer assignment "
             "at compile time; keras-ecoc CUDA rows: the harness's workspace and outputs, "
             "computed). TFLOP/s and % of peak for fwd+bwd, counting 6·B·n·k. codes once: "
             "n·k·4 bytes at the card's bandwidth (B = 16 target: fwd+bwd ≤ 3x that). "
             "Errors against a float64 reference (see the script's docstring); WRONG: above "
             f"the tolerance of its precision (loss, gradients: FP32 {TOLERANCE['fp32']}, "
             f"TF32 {TOLERANCE['tf32']}), never used for a target. keras-ecoc CUDA rows "
             "come from the harness (kernels/cuda/harness.cu): forward + codes gradient "
             "(the z gradient is elementwise framework code, not timed there), the "
             "harness's scale, its own float64 checks in device_check.md (no reference "
             "here: n/a); timed as the rows above (CUDA events around blocks of "
             "back-to-back calls, about 20 ms a block, median of 3) where the harness "
             "did so (its +auto rows), else around single calls (median of 3 after a "
             "warm-up; marked '(single calls)': small cells then carry launch latency "
             "the other rows amortise). "
             "torch.compile rows use dynamic shapes.", ""]
    lines += ["| B | k | n | method | precision | fwd ms | fwd+bwd ms | peak MiB | "
              "TFLOP/s | % FP32 peak | % TF32 peak | codes once ms | loss err | grad err |",
              "|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    cells = sorted({(r["B"], r["k"], r["n"]) for r in rows}, key=lambda c: (c[2], c[0], c[1]))
    for cell in cells:
        b, k, n = cell
        codes_ms = None if peaks is None else n * k * 4 / (peaks[3] * 1e12) * 1e3
        for r in sorted((r for r in rows if (r["B"], r["k"], r["n"]) == cell),
                        key=lambda r: method_rank(r["method"])):
            head = f"| {b} | {k} | {n:,} | {label_of(r)} | {precision_of(r)} |"
            if r.get("error") or r.get("skipped"):
                why = (r.get("error") and f"error: {r['error']}") or f"skipped: {r['skipped']}"
                lines.append(head + f" {why.replace('|', '/')} | | | | | | "
                             f"{fmt_ms(codes_ms)} | | |")
                continue
            fb = r.get("fwdbwd_ms")
            tflops = None if not fb else 6 * b * n * k / (fb * 1e-3) / 1e12
            pct = ((None, None) if tflops is None or peaks is None
                   else (100 * tflops / peaks[1], 100 * tflops / peaks[2]))
            verdict, le, ge = check_row(r, refs.get(cell))
            wrong = " WRONG" if verdict == "WRONG" else ""
            peak = r.get("peak_bytes")
            lines.append(head + f" {fmt_ms(r.get('fwd_ms'))} | {fmt_ms(fb)} | "
                         f"{fmt_num(None if peak is None else peak / 2**20)} | "
                         f"{fmt_num(tflops)} | {fmt_num(pct[0])} | {fmt_num(pct[1])} | "
                         f"{fmt_ms(codes_ms)} | {_fmt_err(le)}{wrong} | {_fmt_err(ge)}{wrong} |")
    if not cells:
        lines.append("| | | | (nothing measured) | | | | | | | | | | |")
    trusted = [r for r in rows if check_row(r, refs.get((r["B"], r["k"], r["n"])))[0] != "WRONG"]
    targets = target_lines(trusted, peaks)
    if targets:
        lines += ["", "### Issue 16's targets (keras-ecoc CUDA rows)", "",
                  "| B | k | n | mode | fwd+bwd ms | / JAX DEFAULT (target) | / CCE same precision "
                  "(≤ 1) | / codes once (B = 16: ≤ 3) |",
                  "|---:|---:|---:|---|---:|---|---|---|"]
        lines += targets
    notes = list(state["notes"])
    cut = [f"{r['method']} B={r['B']} k={r['k']} n={r['n']} ({', '.join(r['cut'])})"
           for r in state["rows"] if r.get("cut")]
    if cut:
        notes.append(f"fewer timed blocks (--step-budget: one call too slow for {state['reps']} "
                     f"blocks; the median is over the blocks run): " + "; ".join(cut))
    if state["skipped"]:
        notes.append(f"not run, --time-limit reached ({len(state['skipped'])}): "
                     + ", ".join(state["skipped"]))
    if notes:
        lines += ["", "### Not measured", ""] + [f"- {x}" for x in notes]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def _peaks_line(peaks):
    if peaks is None:
        return "n/a (card not in the script's datasheet table)"
    label, fp32, tf32, bw = peaks
    return (f"{label}: FP32 {fp32:g} TFLOP/s, TF32 dense {tf32:g} TFLOP/s, memory {bw:g} TB/s "
            "(NVIDIA datasheets)")


def _fmt_err(v):
    return "n/a" if v is None else f"{v:.1e}"


def _best(rows, cell, methods):
    times = [r["fwdbwd_ms"] for r in rows if (r["B"], r["k"], r["n"]) == cell
             and r["method"] in methods and r.get("fwdbwd_ms")]
    return min(times) if times else None


def target_lines(rows, peaks):
    """Target rows for the library's own kernels: the harness's "+auto" rows
    (what the library runs) when there are any, every keras-ecoc row
    otherwise (older harness files name no variant)."""
    out = []
    ecoc = [r for r in rows if r["method"].startswith("ecoc_cuda") and r.get("fwdbwd_ms")]
    auto = [r for r in ecoc if r["mode"].endswith("+auto")]
    for r in sorted(auto or ecoc, key=lambda r: (r["n"], r["B"], r["k"], r["mode"])):
        cell = (r["B"], r["k"], r["n"])
        fb = r["fwdbwd_ms"]
        jax_ms = _best(rows, cell, ("jax_default",))
        need = 0.5 if (r["n"] >= 100_000 and r["B"] >= 256) else 1.0
        if jax_ms is None:
            vs_jax = "n/a"
        else:
            ratio = fb / jax_ms
            vs_jax = (f"{ratio:.2f} (≤ {need:g}: {'met' if ratio <= need else 'MISSED'})"
                      if r["n"] >= 10_000 else f"{ratio:.2f} (no target at n < 10^4)")
        cce = "cce_tf32" if harness_precision(r["mode"]) == "tf32" else "cce_exact"
        cce_ms = _best(rows, cell, (cce,))
        vs_cce = ("n/a" if cce_ms is None else
                  f"{fb / cce_ms:.2f} vs {cce}: {'met' if fb <= cce_ms else 'MISSED'}")
        if r["B"] == 16 and peaks is not None:
            codes_ms = r["n"] * r["k"] * 4 / (peaks[3] * 1e12) * 1e3
            ratio = fb / codes_ms
            vs_codes = f"{ratio:.1f} ({'met' if ratio <= 3 else 'MISSED'})"
        else:
            vs_codes = "n/a" if r["B"] == 16 else "(B = 16 only)"
        out.append(f"| {r['B']} | {r['k']} | {r['n']:,} | {harness_mode_label(r)} | {fmt_ms(fb)} | "
                   f"{vs_jax} | "
                   f"{vs_cce} | {vs_codes} |")
    return out


def write_outputs(state, out, harness_rows=()):
    if not out:
        return
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    text = render(state, harness_rows)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out)
    js = os.path.splitext(out)[0] + ".json"
    with open(js + ".tmp", "w") as f:
        json.dump({**state, "harness_rows": list(harness_rows)}, f, indent=1)
    os.replace(js + ".tmp", js)


def cell_priority(cell):
    """Sort key: the cells issue 16's targets name first, so that a time limit
    cuts the least useful ones (the H100 run of 2026-11-26, in ascending
    B*n*k, left JAX HIGHEST at B = 256, n = 1e5 and every JAX cell at B = 256,
    n = 1e6 unmeasured). n >= 1e5 with B <= 256 (both k), then n = 1e4 with
    B <= 256, then B = 4096; ascending B*n*k within each group."""
    b, k, n = cell
    group = 2 if b > 256 else (0 if n >= 100_000 else 1)
    return (group, b * k * n, cell)


def plan(args):
    """[(framework, [(cell, method)])]: each worker's cells in `cell_priority` order."""
    grid = QUICK_GRID if (args.quick or args.simulate_gpu) else GRID
    grid = sorted(grid, key=lambda c: cell_priority(tuple(c)))
    chosen = args.methods.split(",")
    out = []
    for framework, methods in WORKERS.items():
        ms = [m for m in methods if m in chosen or (m == "ref" and args.reference)]
        if ms:  # the PyTorch worker runs the float64 reference for JAX-only runs too
            out.append((framework, [(list(c), m) for c in grid for m in ms]))
    return out


# The device_check.sh steps whose pass the harness's timing rows need: the
# float64 checks and the shape grid (the harness's own correctness).
HARNESS_GATE_STEPS = ("checks", "grid")


def harness_checks_failed(md_path):
    """None when device_check.md says every HARNESS_GATE_STEPS step passed,
    else why the harness rows are left out (one line)."""
    try:
        with open(md_path) as f:
            text = f.read()
    except OSError as e:
        return f"keras-ecoc CUDA rows left out: {md_path} not readable ({e})"
    status = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0] in HARNESS_GATE_STEPS:
            status[cells[0]] = cells[1]
    bad = [f"{s}: {status.get(s, 'not run')}" for s in HARNESS_GATE_STEPS
           if status.get(s) != "pass"]
    if not bad:
        return None
    return ("keras-ecoc CUDA rows left out: the harness's own float64 checks did not all pass "
            f"({', '.join(bad)}; {md_path})")


def main_run(args, harness_rows, harness_note=None):
    t0 = time.time()
    deadline = t0 + (args.time_limit if args.time_limit else 1e9)
    state = {"t0": t0, "status": "PARTIAL: still running, or stopped", "simulated":
             args.simulate_gpu, "scale": args.scale, "reps": args.reps, "probe": {},
             "card": args.assume_card, "rows": [], "skipped": [],
             "notes": [harness_note] if harness_note else []}

    def save():
        state["elapsed_s"] = time.time() - t0
        tp = state["probe"].get("torch", {})
        if not args.assume_card and tp.get("device"):
            state["card"] = tp["device"]
        write_outputs(state, args.out, harness_rows)

    save()
    work = plan(args)
    gpu_seen = False
    for i, (framework, items) in enumerate(work):
        left = deadline - time.time()
        share = left * JAX_SHARE if (framework == "jax" and i < len(work) - 1) else left
        run_worker(framework, items, time.time() + share, args, state, save)
        gpu_seen |= bool(state["probe"].get(framework, {}).get("gpu"))
    measured = [r for r in state["rows"] if r.get("fwdbwd_ms") is not None]
    if not (gpu_seen or args.simulate_gpu):
        state["status"] = "no GPU: nothing measured"
        save()
        print("bench_gpu_loss: no GPU: neither PyTorch nor JAX sees one; nothing was measured. "
              + " ".join(state["notes"]), file=sys.stderr)
        return 2
    refs = references(state["rows"])
    wrong = [r for r in state["rows"] if r["method"] != "ref" and r.get("fwdbwd_ms") is not None
             and check_row(r, refs.get((r["B"], r["k"], r["n"])))[0] == "WRONG"]
    row_skips = [r for r in state["rows"] if r.get("skipped")]
    if wrong:
        state["status"] = (f"finished with {len(wrong)} WRONG row(s) (above the float64 "
                           "tolerance); see the table")
    elif state["notes"] or state["skipped"] or row_skips:
        state["status"] = "finished; see 'Not measured' and the skipped rows"
    elif any(r.get("error") for r in state["rows"]):
        state["status"] = "finished with errors; see the table"
    else:
        state["status"] = "complete"
    save()
    print(render(state, harness_rows))
    if args.out:
        print(f"wrote {args.out} and {os.path.splitext(args.out)[0]}.json")
    return 0 if measured else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="Markdown file to write (and <out>.json beside it)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out (and <out>.json)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds for the whole run")
    p.add_argument("--harness-json", default=None,
                   help="the CUDA harness's timing rows (format in the docstring)")
    p.add_argument("--check-harness-json", default=None, metavar="PATH",
                   help="validate a harness JSON file and exit (0 valid, 2 not)")
    p.add_argument("--render", default=None, metavar="JSON",
                   help="re-render --out from a saved run's JSON (no GPU needed)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma-separated subset of {','.join(METHODS)}")
    p.add_argument("--no-reference", dest="reference", action="store_false",
                   help="skip the float64 reference (no error columns)")
    p.add_argument("--quick", action="store_true", help="tiny shapes")
    p.add_argument("--device-check-md", default=None,
                   help="kernels/cuda/device_check.sh's device_check.md: the --harness-json "
                        "rows are left out unless its checks and grid steps passed")
    p.add_argument("--scale", type=float, default=SCALE)
    p.add_argument("--reps", type=int, default=5, help="timed blocks per step")
    p.add_argument("--block-ms", type=float, default=40.0, help="target length of a timed block")
    p.add_argument("--max-calls", type=int, default=100, help="calls per timed block at most")
    p.add_argument("--step-budget", type=float, default=4.0,
                   help="seconds the timed blocks of one step (fwd, or fwd+bwd) may take: a slow "
                        "method gets fewer than --reps blocks (at least one), said in the table")
    p.add_argument("--item-timeout", type=float, default=120.0,
                   help="seconds one (method, cell) may take, compilation included")
    p.add_argument("--startup-timeout", type=float, default=120.0,
                   help="seconds a worker may take to import its framework")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--items", default=None, help=argparse.SUPPRESS)
    # The GPU code path on the CPU with tiny shapes (tests without a GPU).
    p.add_argument("--simulate-gpu", action="store_true", help=argparse.SUPPRESS)
    # torch.compile's backend ("eager" makes the CPU tests fast; the GPU run
    # uses inductor).
    p.add_argument("--compile-backend", default="inductor", help=argparse.SUPPRESS)
    # Look the peaks up for this card name instead of the one PyTorch reports.
    p.add_argument("--assume-card", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main(args)
    for m in args.methods.split(","):
        if m not in METHODS:
            p.error(f"Argument `--methods` must be a comma-separated subset of "
                    f"{','.join(METHODS)}. Received: --methods={args.methods}")
    if args.time_limit is not None and not args.time_limit > 0:
        p.error(f"Argument `--time-limit` must be a positive number of seconds. "
                f"Received: --time-limit={args.time_limit}")
    if not args.step_budget > 0:
        p.error(f"Argument `--step-budget` must be a positive number of seconds. "
                f"Received: --step-budget={args.step_budget}")
    for name in ("reps", "max_calls"):
        if getattr(args, name) < 1:
            p.error(f"Argument `--{name.replace('_', '-')}` must be a positive integer. "
                    f"Received: --{name.replace('_', '-')}={getattr(args, name)}")
    if args.out and not args.overwrite:
        existing = [path for path in (args.out, os.path.splitext(args.out)[0] + ".json")
                    if os.path.exists(path)]
        if existing:
            p.error(f"{' and '.join(existing)} exist(s); pass --overwrite to replace")
    if args.check_harness_json:
        try:
            rows = load_harness_json(args.check_harness_json)
        except ValueError as e:
            print(f"bench_gpu_loss: {e}", file=sys.stderr)
            return 2
        print(f"{args.check_harness_json}: {len(rows)} valid harness rows")
        return 0
    harness_rows = []
    harness_note = None
    if args.harness_json:
        try:
            harness_rows = load_harness_json(args.harness_json)
        except ValueError as e:
            p.error(str(e))
        if args.device_check_md:
            harness_note = harness_checks_failed(args.device_check_md)
            if harness_note:
                harness_rows = []
    if args.render:
        with open(args.render) as f:
            state = json.load(f)
        if not args.harness_json:
            harness_rows = state.get("harness_rows", [])
        text = render(state, harness_rows)
        if args.out:
            write_outputs(state, args.out, harness_rows)
        else:
            print(text)
        return 0
    return main_run(args, harness_rows, harness_note)


if __name__ == "__main__":
    sys.exit(main())
