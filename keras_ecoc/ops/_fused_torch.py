"""Fused ECOC cross-entropy, label rank and decoding in PyTorch: `torch.library` custom ops.

Each op (`keras_ecoc::fused_forward`, `keras_ecoc::fused_codes_grad`,
`keras_ecoc::fused_label_rank`, `keras_ecoc::fused_nearest`) calls the C entry
points of the kernel library (``keras_ecoc/_lib/_ecoc_kernels.so``, kernels/ffi/)
through ctypes on the tensors' data pointers: the CPU kernels for CPU tensors
(on `torch.get_num_threads()` threads of PyTorch's own OpenMP team, see
`_join_openmp`), the CUDA kernels for CUDA tensors, on
the current CUDA stream with a workspace allocated by PyTorch's caching
allocator. Fake (meta) kernels give the output shapes, so the ops stay single
graph nodes under `torch.compile(fullgraph=True)`; the loss's gradient is
registered with `register_autograd`.

Loss: the forward op returns the loss and the residuals lse (B,), expected code
E = sum_i p_i M_i (B, k) and Q = sum_i p_i ||M_i||^2 (B,); dz and dscale follow
in closed form (as in `_streaming_torch`), dcodes from the codes-gradient op,
only when the codes need a gradient.

Shapes: z (B, k) any float dtype (cast to float32), codes (n, k), labels (B,)
made safe by the caller (invalid ones replaced by 0), valid (B,) bool,
scale () float32.
"""

from __future__ import annotations

import ctypes
import os
import threading

import torch

from keras_ecoc.ops import _loader
from keras_ecoc.ops._constants import EPSILON
from keras_ecoc.ops._torch_first_order import first_order_only

_c_int64 = ctypes.c_int64
_c_float = ctypes.c_float
_ptr = ctypes.c_void_p


def available(on_gpu: bool = False) -> tuple[bool, str]:
    """(usable, reason) for the fused PyTorch ops on the CPU (or on a CUDA device)."""
    if _loader.load_kernels() is None:
        return False, _loader.kernels_status()
    if on_gpu and not _loader.kernels_have_cuda():
        return False, (f"{_loader.kernels_status()}: built without its CUDA part, so CUDA tensors "
                       "cannot use it")
    return True, f"torch.library custom ops over the {_loader.kernels_status()}"


def _lib():
    lib = _loader.load_kernels()
    if lib is None:
        raise RuntimeError(f"keras_ecoc: {_loader.kernels_status()}")
    if not _openmp["done"]:
        _join_openmp(lib)
    return lib


_openmp = {"done": False, "pool": "std::thread"}
_openmp_lock = threading.Lock()


def _torch_libgomp():
    """Path of the libgomp that PyTorch's intra-op pool runs on, or None.

    PyTorch's wheel ships its own copy (torch/lib/libgomp*.so*); the one
    mapped from there is PyTorch's. Else a single libgomp mapped into the
    process is the one PyTorch linked. None when the parallel backend is not
    OpenMP or when the choice is ambiguous.
    """
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        with open("/proc/self/maps") as f:
            mapped = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError:
        return None
    gomp = sorted(p for p in mapped if os.path.basename(p).startswith("libgomp"))
    torch_lib = os.path.join(os.path.dirname(os.path.realpath(torch.__file__)), "lib")
    own = [p for p in gomp if os.path.dirname(os.path.realpath(p)) == torch_lib]
    if own:
        return own[0]
    return gomp[0] if len(gomp) == 1 else None


def _join_openmp(lib):
    """Points the C entry points' parallel loops at PyTorch's OpenMP team.

    PyTorch's intra-op workers are libgomp threads that spin for a while after
    each parallel region. Helper threads of the kernel's own (std::thread)
    competed with them for the cores: at B = 256, k = 128, n = 10^4 on 2
    cores the fused step took 31.6 ms against 23.1 for the streaming loss
    (docs/benchmarks.md). Running the kernel's loop as a region of the same
    libgomp team hands its chunks to those very workers. The work split still
    follows `torch.get_num_threads()`, so the results are the same bits.
    ``KERAS_ECOC_TORCH_CPU_POOL=threads`` keeps the per-call std::threads.
    """
    with _openmp_lock:
        if _openmp["done"]:
            return
        _openmp["done"] = True
        if os.environ.get("KERAS_ECOC_TORCH_CPU_POOL", "openmp") == "threads":
            return
        setter = getattr(lib, "KerasEcocCpuSetOpenMP", None)
        path = _torch_libgomp() if setter is not None else None
        if path is None:
            return
        try:
            # RTLD_NOLOAD: the copy already in the process, never a second one.
            gomp = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
            address = ctypes.cast(gomp.GOMP_parallel, _ptr).value
        except (OSError, AttributeError):
            return
        setter.argtypes = [_ptr]
        setter.restype = None
        setter(_ptr(address))
        _openmp["pool"] = f"OpenMP ({os.path.basename(path)})"


def cpu_pool() -> str:
    """Where the CPU kernels' parallel loops run: "OpenMP (libgomp...)" or "std::thread"."""
    _lib()
    return _openmp["pool"]


def _p(t):
    return _ptr(t.data_ptr())


def _check(rc, what):
    if rc != 0:
        if what.startswith("CUDA"):
            raise RuntimeError(f"keras_ecoc: the {what} pass failed with cudaError_t {rc}")
        raise MemoryError(f"keras_ecoc: the {what} pass could not allocate its CPU scratch memory")


def _z_type(z):
    return {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[z.dtype]


def _cuda_call(fn, args, what):
    """Workspace query, then the pass on the current stream with a PyTorch workspace."""
    device = args[0].device
    size = ctypes.c_size_t(0)
    stream = torch.cuda.current_stream(device).cuda_stream
    with torch.cuda.device(device):
        _check(fn(*[a for a in args[1:]], None, ctypes.c_size_t(0), _ptr(stream), ctypes.byref(size)),
               f"CUDA {what} workspace query")
        ws = torch.empty(max(1, size.value) + 256, dtype=torch.uint8, device=device)
        # 256-byte alignment, as the contract asks (the caching allocator
        # gives 512-byte blocks; the offset is a guard).
        addr = (ws.data_ptr() + 255) // 256 * 256
        _check(fn(*[a for a in args[1:]], _ptr(addr), ctypes.c_size_t(size.value), _ptr(stream), None),
               f"CUDA {what}")


def _scale_value(scale):
    """The scale as a C float for the kernel library's entry points.

    A CPU tensor is read straight from its buffer: it is already host memory,
    and going through `float(tensor)` would be a tensor read that the
    no-host-sync checks (tests/test_scale_state.py) cannot tell from a
    device-to-host copy. A CUDA tensor needs one copy to the host per pass:
    contract v2 takes the scale as a host float (a device-pointer field would
    remove this synchronisation; not built yet).
    """
    if scale.is_cuda:
        return _c_float(float(scale))
    scale = scale.detach().reshape(()).to(torch.float32).contiguous()
    return _c_float(ctypes.c_float.from_address(scale.data_ptr()).value)


@torch.library.custom_op("keras_ecoc::fused_forward", mutates_args=())
def _forward(z: torch.Tensor, codes: torch.Tensor, labels: torch.Tensor,
             scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    z, codes, labels = z.contiguous(), codes.contiguous(), labels.contiguous()
    b, k = z.shape
    n = codes.shape[0]
    loss = z.new_empty((b,), dtype=torch.float32)
    lse = torch.empty_like(loss)
    e = z.new_empty((b, k), dtype=torch.float32)
    q = torch.empty_like(loss)
    s = _scale_value(scale)
    if z.is_cuda:
        _cuda_call(_lib().KerasEcocCudaForward,
                   (z, _p(z), ctypes.c_int(_z_type(z)), _p(labels), _p(codes), s, _c_float(EPSILON),
                    _c_int64(b), _c_int64(n), _c_int64(k), _p(loss), _p(lse), _p(e), _p(q)), "forward")
    else:
        _check(_lib().KerasEcocCpuForward(
            _p(z), _p(labels), _p(codes), s, _c_float(EPSILON), _c_int64(b), _c_int64(n),
            _c_int64(k), ctypes.c_int(torch.get_num_threads()), _p(loss), _p(lse), _p(e), _p(q)),
            "forward")
    return loss, lse, e, q


@_forward.register_fake
def _(z, codes, labels, scale):
    b, k = z.shape
    vec = z.new_empty((b,), dtype=torch.float32)
    return vec, torch.empty_like(vec), z.new_empty((b, k), dtype=torch.float32), torch.empty_like(vec)


@torch.library.custom_op("keras_ecoc::fused_codes_grad", mutates_args=())
def _codes_grad(z: torch.Tensor, codes: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor,
                lse: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    z, codes, labels = z.contiguous(), codes.contiguous(), labels.contiguous()
    lse, g = lse.contiguous(), g.contiguous()
    b, k = z.shape
    n = codes.shape[0]
    out = codes.new_empty((n, k), dtype=torch.float32)
    s = _scale_value(scale)
    if z.is_cuda:
        _cuda_call(_lib().KerasEcocCudaCodesGrad,
                   (z, _p(z), ctypes.c_int(_z_type(z)), _p(labels), _p(codes), s, _c_float(EPSILON),
                    _p(lse), _p(g), _c_int64(b), _c_int64(n), _c_int64(k), _p(out)), "codes gradient")
    else:
        _check(_lib().KerasEcocCpuCodesGrad(
            _p(z), _p(labels), _p(codes), s, _c_float(EPSILON), _p(lse), _p(g), _c_int64(b),
            _c_int64(n), _c_int64(k), ctypes.c_int(torch.get_num_threads()), _p(out)),
            "codes gradient")
    return out


@_codes_grad.register_fake
def _(z, codes, labels, scale, lse, g):
    return codes.new_empty(codes.shape, dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    z, codes, labels, scale = inputs
    _, lse, e, q = output
    ctx.save_for_backward(z, codes, labels, scale, lse, e, q)
    ctx.needs = ctx.needs_input_grad


def _backward(ctx, g_loss, g_lse, g_e, g_q):
    # Only the loss output is differentiated (lse, E and Q are residuals that
    # the public wrapper never exposes).
    z, codes, labels, scale, lse, e, q = ctx.saved_tensors
    g = g_loss.float()
    sq = torch.sum(z * z, -1, keepdim=True)
    r = torch.rsqrt(torch.clamp(sq, min=EPSILON))
    u = z * r
    m_y = codes[labels]
    diff = e - m_y
    dz = dcodes = dscale = None
    if ctx.needs[0]:
        du = (g * scale)[:, None] * diff
        # At ||z||^2 <= EPSILON the direction is undefined: gradient 0 (see
        # keras_ecoc.decoding.normalize).
        tangent = r * (du - torch.sum(u * du, -1, keepdim=True) * u)
        dz = torch.where(sq > EPSILON, tangent, torch.zeros_like(u))
    if ctx.needs[3]:
        per_row = g * (-0.5 * (q - torch.sum(m_y * m_y, -1)) + torch.sum(diff * u, -1))
        dscale = torch.sum(per_row).reshape(scale.shape)
    if ctx.needs[1]:
        dcodes = _codes_grad(z, codes, labels, scale, lse, g)
    dz, dcodes, dscale = first_order_only("fused", (z, codes, scale), dz, dcodes, dscale)
    return dz, dcodes, None, dscale


_forward.register_autograd(_backward, setup_context=_setup_context)


def cross_entropy(z, codes, labels, valid, scale):
    """(B,) float32 loss; NaN where `valid` is False or z is not finite."""
    z = z.float()
    valid = valid.to(torch.bool)
    # Invalid rows: no gradient flows into the kernel's loss (NaN through `where`).
    loss = _forward(z, codes.float(), labels.to(torch.int64), torch.reshape(scale, ()).float())[0]
    return torch.where(valid, loss, torch.full_like(loss, float("nan")))


@torch.library.custom_op("keras_ecoc::fused_label_rank", mutates_args=())
def _label_rank(z: torch.Tensor, codes: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    z, codes, labels = z.contiguous(), codes.contiguous(), labels.contiguous()
    b, k = z.shape
    n = codes.shape[0]
    out = z.new_empty((b,), dtype=torch.int32)
    if z.is_cuda:
        _cuda_call(_lib().KerasEcocCudaLabelRank,
                   (z, _p(z), ctypes.c_int(_z_type(z)), _p(labels), _p(codes), _c_float(EPSILON),
                    _c_int64(b), _c_int64(n), _c_int64(k), _p(out)), "label rank")
    else:
        _check(_lib().KerasEcocCpuLabelRank(
            _p(z), _p(labels), _p(codes), _c_float(EPSILON), _c_int64(b), _c_int64(n), _c_int64(k),
            ctypes.c_int(torch.get_num_threads()), _p(out)), "label rank")
    return out


@_label_rank.register_fake
def _(z, codes, labels):
    return z.new_empty((z.shape[0],), dtype=torch.int32)


@torch.library.custom_op("keras_ecoc::fused_nearest", mutates_args=())
def _nearest(z: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    z, codes = z.contiguous(), codes.contiguous()
    b, k = z.shape
    n = codes.shape[0]
    out = z.new_empty((b,), dtype=torch.int64)
    if z.is_cuda:
        _cuda_call(_lib().KerasEcocCudaNearest,
                   (z, _p(z), ctypes.c_int(_z_type(z)), _p(codes), _c_float(EPSILON), _c_int64(b),
                    _c_int64(n), _c_int64(k), _p(out)), "nearest codeword")
    else:
        _check(_lib().KerasEcocCpuNearest(
            _p(z), _p(codes), _c_float(EPSILON), _c_int64(b), _c_int64(n), _c_int64(k),
            ctypes.c_int(torch.get_num_threads()), _p(out)), "nearest codeword")
    return out


@_nearest.register_fake
def _(z, codes):
    return z.new_empty((z.shape[0],), dtype=torch.int64)


def label_rank(z, codes, labels, valid):
    """(B,) int32 rank of the label; n for invalid labels and non-finite rows."""
    z, codes = z.detach().float(), codes.detach().float()
    rank = _label_rank(z, codes, labels.to(torch.int64))
    return torch.where(valid.to(torch.bool), rank, torch.full_like(rank, codes.shape[0]))


def nearest_codeword(z, codes):
    """(B,) int32; -1 for rows with a non-finite logit (non-finite z or codeword)."""
    return _nearest(z.detach().float(), codes.detach().float()).to(torch.int32)


# Loaded when this module is imported (outside any trace, and at the latest
# when the dispatch first imports it): torch.compile(fullgraph=True) cannot
# enter the loader's lock, and the first fused call of a process may come
# inside a compiled function. Never raises; a failure is the loader's status.
_loader.load_kernels()
