"""Which implementation computes the ECOC loss and decoding, and why.

The one place that decides, for a backend, a device and a shape (`choose`).

Paths:
  "fused"      the fused kernels: on TensorFlow the op library (CPU / CUDA
               kernels; under XLA a custom call to the kernel library's FFI
               handlers, or the HLO lowering), on JAX XLA FFI custom calls
               (`_fused_jax`), on PyTorch `torch.library` custom ops
               (`_fused_torch`), all over the kernel library
               keras_ecoc/_lib/_ecoc_kernels.so;
  "streaming"  the tiled implementation of the active backend
               (`_streaming_jax`, `_streaming_torch`, `_streaming_tf`), which
               never holds the B x n logits;
  "dense"      the pure-Keras B x n path (`keras_ecoc.decoding`), used for
               small n, where it is as fast or faster (thresholds below, from
               benchmarks/bench_streaming.py; see docs/benchmarks.md).

The switch, in the style of Keras's ``flash_attention=None|True|False``: the
public ops take ``fused=None`` (automatic: the fused path whenever it can run
here), ``True`` (the fused path, or a ValueError saying why it cannot run) or
``False`` (never). ``KERAS_ECOC_DISABLE_FUSED=1`` makes ``None`` mean ``False``
on every backend. Without the fused path, `KERAS_ECOC_LOSS_PATH` =
"streaming" or "dense" forces the non-fused path for every n (benchmarks and
tests use it); "auto" or unset chooses by n. It does not switch the fused
path off (``KERAS_ECOC_DISABLE_FUSED`` does), but its value is checked on
every call.
"""

from __future__ import annotations

import os

from keras_ecoc.ops import _gpu_guard
from keras_ecoc.ops import _loader

ENV_PATH = "KERAS_ECOC_LOSS_PATH"

# Largest n for which the dense path is used on each backend (non-fused).
# Measured by benchmarks/bench_streaming.py (docs/benchmarks.md): at n = 1,000
# dense and streaming are within noise of each other; from n = 10,000 on
# streaming uses >10x less memory at similar or better speed. The TensorFlow
# value (the fallback without the op library) was not measured.
DENSE_MAX_CLASSES = {"jax": 1024, "torch": 1024, "tensorflow": 1024}

# Classes per tile, chosen by measurement (the tile-size table of
# benchmarks/bench_streaming.py in docs/benchmarks.md): C = 2^18 / (B + k)
# clipped to [128, 1024] on every backend; the tile holds a B x C block of
# logits and a C x k slice of the codes (at most about 1 MiB each). JAX and
# TensorFlow run the tile loop inside XLA; PyTorch runs it as a compiled
# `scan` (keras_ecoc/ops/_streaming_torch.py), so small tiles cost no per-op
# dispatch there either.
TILE_BUDGET = {"jax": (2**18, 1024), "tensorflow": (2**18, 1024), "torch": (2**18, 1024)}
# On a GPU a tile costs launches (and on PyTorch Python dispatch) whatever its
# size, so tiles are larger there; (budget, max tile, min tile) per backend:
# * PyTorch: C = 2^24 / (B + k) clipped to [4096, 65536], at most about
#   64 MiB of logits per tile (H200: 37 tiles of 2,688 classes took 10 ms
#   where two tiles of 65,536 took 2 ms).
# * JAX / TensorFlow: C = 2^20 / (B + k) clipped to [1024, 16384]. XLA
#   copies each tile's C x k slice of the codes (a dynamic slice), so larger
#   tiles cost memory there (40 MB of XLA temporaries at C = 65,536, n = 10^5,
#   k = 128, against 4.6 MB at C = 7,168 on an H200).
# (docs/benchmarks.md, "on a GPU").
# XLA copies each tile's C x k slice of the codes, which at small n is a large
# share of the dense path's own memory: on the CPU, JAX / TensorFlow tiles are
# also capped at n / 32 (a multiple of 128). At B = 16, n = 10^4 that took
# XLA's temporaries from 7x / 3x (k = 32 / 128) below the dense path's to
# 28x / 11x, and the step from 1.3 / 5.3 ms to 0.9 / 4.2 ms (B = 256 at
# n = 10^4: within 15 %, either way).
SMALL_N_CAP = {"jax": 32, "tensorflow": 32}
GPU_TILE_BUDGET = {"torch": (2**24, 65536, 4096), "jax": (2**20, 16384, 1024),
                   "tensorflow": (2**20, 16384, 1024)}
MIN_TILE = 128


def on_gpu(backend, tensor) -> bool:
    """Whether the streaming loop for `tensor` runs on a GPU (picks the tile size)."""
    if backend == "torch":
        return getattr(getattr(tensor, "device", None), "type", "cpu") == "cuda"
    if backend == "jax":
        import jax  # noqa: PLC0415

        return jax.default_backend() == "gpu"
    return False


def forced_path() -> str:
    value = (os.environ.get(ENV_PATH) or "auto").strip().lower()
    if value not in ("auto", "streaming", "dense"):
        raise ValueError(
            f"Environment variable `{ENV_PATH}` must be 'auto', 'streaming' or 'dense'. "
            f"Received: {ENV_PATH}={value!r}"
        )
    return value


def tile_size(batch_size, num_classes, code_length=None, backend=None, on_gpu=False) -> int:
    """Classes per tile for a batch of `batch_size` rows (None: unknown)."""
    backend = backend or _loader.backend()
    if on_gpu:
        budget, max_tile, min_tile = GPU_TILE_BUDGET.get(backend, GPU_TILE_BUDGET["jax"])
    else:
        (budget, max_tile), min_tile = TILE_BUDGET.get(backend, TILE_BUDGET["jax"]), MIN_TILE
    b = batch_size if isinstance(batch_size, int) and batch_size > 0 else 256
    k = code_length if isinstance(code_length, int) and code_length > 0 else 0
    per_class = b + k
    tile = max(min_tile, min(max_tile, budget // per_class))
    tile -= tile % MIN_TILE
    if isinstance(num_classes, int) and num_classes > 0:
        if backend in SMALL_N_CAP and not on_gpu:
            tile = min(tile, max(MIN_TILE, num_classes // SMALL_N_CAP[backend] // MIN_TILE * MIN_TILE))
        tile = min(tile, num_classes)
    return int(tile)


def tile_for(z, num_classes, code_length, backend) -> int:
    """`tile_size` for the (B, k) tensor `z` on its own device."""
    return tile_size(z.shape[0], num_classes, code_length, backend, on_gpu(backend, z))


def _fused_here(backend, code_length, op, on_gpu_) -> tuple[bool, str]:
    """(can the fused path run, why / why not) on this backend and device."""
    if backend == "tensorflow":
        if not _loader.fused_available():
            return False, f"fused op not in use ({_loader.fused_status()})"
        # The GPU guard refuses a code length beyond the card's shared memory
        # (it warns once per reason); everything else runs the fused op.
        if code_length is not None:
            usable, why_gpu = _loader.gpu_kernels_usable(int(code_length),
                                                         "decode" if op == "decode" else "cross_entropy")
            if not usable:
                return False, f"fused op's CUDA kernels cannot run k = {code_length} here ({why_gpu})"
        return True, _loader.fused_status()
    if backend not in ("jax", "torch"):
        return False, f"backend is {backend}: no fused implementation"
    if _loader.disabled():
        return False, f"fused kernels disabled by {_loader._ENV_DISABLE}"
    if backend == "jax":
        from keras_ecoc.ops import _fused_jax as mod  # noqa: PLC0415
    else:
        from keras_ecoc.ops import _fused_torch as mod  # noqa: PLC0415
    ok, why = mod.available(on_gpu=on_gpu_)
    if not ok:
        return False, f"fused kernels unavailable on {backend}: {why}"
    too_large = on_gpu_ and code_length is not None and _gpu_guard.code_length_too_large(
        int(code_length))
    if too_large:
        # The CUDA kernels refuse it with a bare cudaErrorInvalidValue; the
        # streaming path runs it (TensorFlow's GPU guard decides the same).
        return False, too_large
    return True, why


def choose(num_classes=None, code_length=None, fused=None, op="loss", tensor=None) -> tuple[str, str]:
    """(path, reason) on the active backend for n = num_classes classes.

    fused: None (automatic), True (the fused path or a ValueError with the
    reason), False (never the fused path). op: "loss" or "decode" (label rank
    and nearest codeword: fused or streaming, never dense). tensor: the z of
    the call, for its device (PyTorch CPU / CUDA; JAX's default backend).
    """
    if fused not in (None, True, False):
        raise ValueError(f"Argument `fused` must be None, True or False. Received: fused={fused!r}")
    if op not in ("loss", "decode"):
        raise ValueError(f"Argument `op` must be 'loss' or 'decode'. Received: op={op!r}")
    backend = _loader.backend()
    # Checked on every call, so that a misspelt value fails on a machine with
    # the fused kernels too, not only where they are missing.
    forced = forced_path()
    why = "fused path turned off (fused=False)"
    if fused is not False:
        ok, why = _fused_here(backend, code_length, op, _on_gpu_for(backend, tensor))
        if ok:
            return "fused", why
        if fused is True:
            raise ValueError(f"The fused ECOC kernels cannot run here (fused=True): {why}. "
                             "Pass fused=None to fall back to the streaming or dense path.")
    if backend not in ("jax", "torch", "tensorflow"):
        return "dense", f"backend is {backend}: no streaming implementation, using the dense path"
    if op == "decode":
        return "streaming", f"{why}; streaming {backend} decoding (never holds the B x n logits)"
    if forced != "auto":
        note = _loop_note(backend) if forced == "streaming" else ""
        return forced, f"{why}; {forced} path forced by {ENV_PATH}{note}"
    limit = DENSE_MAX_CLASSES[backend]
    if isinstance(num_classes, int) and num_classes <= limit:
        return "dense", f"{why}; n = {num_classes} <= {limit}: dense path (faster for small n)"
    return "streaming", (f"{why}; streaming {backend} implementation for n > {limit} "
                         f"(never holds the B x n logits){_loop_note(backend)}")


def _on_gpu_for(backend, tensor) -> bool:
    """Whether the call runs on a GPU: z's device on PyTorch, the default backend on JAX."""
    if backend == "torch":
        if tensor is not None and hasattr(tensor, "device"):
            return on_gpu(backend, tensor)
        import torch  # noqa: PLC0415 - Keras puts host data on the GPU when there is one

        return torch.cuda.is_available()
    if backend == "jax":
        return on_gpu(backend, tensor)
    return False


def _loop_note(backend) -> str:
    """How the PyTorch tile loop runs (compiled scan or Python loop); '' elsewhere."""
    if backend != "torch":
        return ""
    from keras_ecoc.ops import _streaming_torch  # noqa: PLC0415 - imports torch

    return f"; tile loop: {_streaming_torch.compile_status()}"


def loss_path(num_classes=None, op="loss") -> str:
    """The path for n classes: 'fused', 'streaming' or 'dense'.

    op="loss": ``ecoc_cross_entropy``; op="decode": ``label_rank`` and
    ``nearest_codeword`` (fused or streaming).
    """
    return choose(num_classes, op=op)[0]


def backend_status(num_classes=None) -> str:
    """One line: the paths the loss and decoding take for n classes on the
    active backend, and why ("<loss path>: <why>; decoding: <path>: <why>")."""
    path, why = choose(num_classes)
    dpath, dwhy = choose(num_classes, op="decode")
    return f"{path}: {why}; decoding: {dpath}: {dwhy}"
