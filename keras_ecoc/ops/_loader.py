"""Finds, loads and checks the two libraries of keras-ecoc (once per process).

* ``keras_ecoc/_lib/_ecoc_kernels.so``, the framework-free kernel library
  (kernels/ffi/): loaded with ctypes by `load_kernels()` on any backend; JAX
  registers its XLA FFI handlers, PyTorch calls its C entry points, and the
  TensorFlow op library registers its handlers with TensorFlow's XLA.
* ``keras_ecoc/_lib/_ecoc_ops.so``, the TensorFlow op library, described below.
  (The fused TensorFlow calls and their gradient live in
  :mod:`keras_ecoc.ops._fused_tf`.)

This is the only place that calls ``tf.load_op_library`` on
``keras_ecoc/_lib/_ecoc_ops.so`` (loading an op library twice gives a module
without the op wrappers). TensorFlow is imported lazily, and only when the
Keras backend is TensorFlow, so that importing :mod:`keras_ecoc.ops` under the
JAX or PyTorch backends never imports TensorFlow.

Before loading, the TensorFlow version embedded in the library by
kernels/build.py is compared with the running one (a library built against
another TensorFlow is refused, not loaded). After loading, when TensorFlow
sees a GPU and the library holds CUDA kernels, the probe in the library says
whether they can run there (see :mod:`keras_ecoc.ops._gpu_guard`):
`gpu_status()` and `gpu_kernels_usable(code_length)` give the verdict.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import warnings

from keras_ecoc.ops import _gpu_guard

_ENV_DISABLE = "KERAS_ECOC_DISABLE_FUSED"
# What runs instead of the fused op: the streaming implementation of the
# backend, or the dense pure-Keras math for small n (keras_ecoc.ops._dispatch).
FALLBACK = "using the non-fused path (keras_ecoc.ops.backend_status(n) says which: streaming or dense)"
_ENV_LIBRARY = "KERAS_ECOC_OPS_LIBRARY"
_LIB_NAME = "_ecoc_ops.so"
_ENV_KERNELS = "KERAS_ECOC_KERNELS_LIBRARY"
# "0": the TF op's XLA kernels keep the HLO lowering (tests of the lowering).
_ENV_CUSTOM_CALL = "KERAS_ECOC_XLA_CUSTOM_CALL"
_KERNELS_NAME = "_ecoc_kernels.so"
# The XLA FFI handlers of the kernel library: custom-call target name ->
# exported symbol (suffix "Cuda" for the CUDA platform's handler).
FFI_TARGETS = {
    "keras_ecoc_forward": "KerasEcocFfiForward",
    "keras_ecoc_codes_grad": "KerasEcocFfiCodesGrad",
    "keras_ecoc_label_rank": "KerasEcocFfiLabelRank",
    "keras_ecoc_nearest": "KerasEcocFfiNearest",
}
OP_NAMES = (
    "EcocCrossEntropy",
    "EcocCrossEntropyCodesGrad",
    "EcocLabelRank",
    "EcocNearestCodeword",
)

_lock = threading.Lock()
# Its own lock: load_library() (holding _lock) loads the kernel library too.
_kernels_lock = threading.Lock()
_kernels = {"attempted": False, "lib": None, "error": None, "path": None, "cuda": False,
            "isa": None}
_state = {"attempted": False, "lib": None, "error": None, "path": None, "xla": None, "gpu": None,
          "ffi": None}
_warned_reasons: set = set()
_info_cache: dict = {}
_BUILD_INFO_RE = re.compile(rb"KERAS_ECOC_BUILD_INFO=(\{[^;\n]*\});")
_CUDA_ARCHS_RE = re.compile(rb"KERAS_ECOC_CUDA_ARCHS=([a-z0-9_,]*);")
REBUILD_HINT = "rebuild with `python kernels/build.py --force`"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def library_path() -> str:
    """Where the library is looked for (``$KERAS_ECOC_OPS_LIBRARY`` overrides)."""
    override = os.environ.get(_ENV_LIBRARY)
    if override:
        return override
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(package_dir, "_lib", _LIB_NAME)


def kernels_path() -> str:
    """Where the kernel library is looked for (``$KERAS_ECOC_KERNELS_LIBRARY`` overrides)."""
    override = os.environ.get(_ENV_KERNELS)
    if override:
        return override
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(package_dir, "_lib", _KERNELS_NAME)


def _check_whole_elf(path: str) -> None:
    """Raises ImportError unless `path` is a whole 64-bit little-endian ELF file.

    dlopen maps a truncated library and the process dies of SIGBUS when the
    loader touches a page past the end of the file: no exception a fallback
    could catch. So every segment and the section table must lie inside the
    file before it is loaded.
    """
    import struct  # noqa: PLC0415

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header = f.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise ImportError(f"{path} is not a 64-bit little-endian ELF shared library")
        phoff, shoff = struct.unpack_from("<QQ", header, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 0x36)
        ends = [phoff + phentsize * phnum, shoff + shentsize * shnum]
        if ends[0] <= size:
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(phnum):
                offset, = struct.unpack_from("<Q", table, i * phentsize + 8)
                filesz, = struct.unpack_from("<Q", table, i * phentsize + 32)
                ends.append(offset + filesz)
    if max(ends) > size:
        raise ImportError(
            f"{path} is truncated ({size} bytes; its ELF headers need {max(ends)}): "
            f"not loaded ({REBUILD_HINT}, or reinstall)")


def load_kernels():
    """The kernel library as a ctypes.CDLL, or None (the reason: `kernels_error()`).

    Never raises; tries once per process; imports no framework. Checks that
    the library exports every FFI handler and C entry point used here.
    """
    if _kernels["attempted"]:
        return _kernels["lib"]
    import ctypes  # noqa: PLC0415

    with _kernels_lock:
        if _kernels["attempted"]:
            return _kernels["lib"]
        path = kernels_path()
        _kernels["path"] = path
        try:
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"{path} does not exist (build it with `python kernels/build.py` "
                    "or reinstall with `pip install --no-build-isolation -e .`)")
            _check_whole_elf(path)
            lib = ctypes.CDLL(path)
            for name in (*FFI_TARGETS.values(), "KerasEcocCpuForward", "KerasEcocCpuCodesGrad",
                         "KerasEcocCpuLabelRank", "KerasEcocCpuNearest", "KerasEcocCpuIsa"):
                getattr(lib, name)  # AttributeError names the missing symbol
            lib.KerasEcocCpuIsa.restype = ctypes.c_char_p
            _kernels["cuda"] = hasattr(lib, "KerasEcocHasCuda")
            # Read once: the dispatch asks for the status on every call, and
            # a ctypes call there would stop torch.compile(fullgraph=True).
            _kernels["isa"] = lib.KerasEcocCpuIsa().decode()
            _kernels["lib"] = lib
        except Exception as e:  # noqa: BLE001 - a failed load must never break import
            _kernels["error"] = f"{type(e).__name__}: {e}".strip()
        finally:
            _kernels["attempted"] = True
    return _kernels["lib"]


def kernels_error() -> str | None:
    return _kernels["error"]


def kernels_have_cuda() -> bool:
    """Whether the loaded kernel library holds the CUDA handlers and entry points."""
    return load_kernels() is not None and _kernels["cuda"]


def kernels_status() -> str:
    """One line: the kernel library, where it was loaded from and what it holds."""
    lib = load_kernels()
    if lib is None:
        return f"kernel library not built or not loadable: {kernels_error()}"
    cuda = "and CUDA kernels" if _kernels["cuda"] else "no CUDA kernels"
    return f"kernel library {_kernels['path']} (CPU kernels, {_kernels['isa']}; {cuda})"


def backend() -> str:
    import keras  # noqa: PLC0415

    return keras.backend.backend()


def disabled() -> bool:
    return _truthy(os.environ.get(_ENV_DISABLE))


def load_library():
    """Returns the loaded op module, or None (the reason is in `load_error()`).

    Never raises; only tries once per process. Does not import TensorFlow
    unless the Keras backend is TensorFlow.
    """
    if _state["attempted"]:
        return _state["lib"]
    if backend() != "tensorflow":
        return None
    with _lock:
        if _state["attempted"]:
            return _state["lib"]
        path = library_path()
        _state["path"] = path
        try:
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"{path} does not exist (build it with `python kernels/build.py` "
                    "or reinstall with `pip install --no-build-isolation -e .`)"
                )
            import tensorflow as tf  # noqa: PLC0415

            # Before dlopen: an ABI-mismatched or truncated library may
            # crash the process on load.
            _check_built_for(path, tf.__version__)
            _check_whole_elf(path)
            lib = tf.load_op_library(path)
            missing = [
                name
                for name in ("ecoc_cross_entropy", "ecoc_cross_entropy_codes_grad",
                             "ecoc_label_rank", "ecoc_nearest_codeword")
                if not hasattr(lib, name)
            ]
            if missing:
                raise ImportError(
                    f"{path} loaded but lacks the op wrappers {missing} (was an op "
                    "library with the same op names loaded before?)"
                )
            from keras_ecoc.ops import _fused_tf  # noqa: PLC0415 - the op's gradient lives there

            _fused_tf.register_gradients(tf, lib)
            _state["xla"] = _ensure_xla_kernels(path)
            _state["ffi"] = _register_ffi_targets(path) if _state["xla"] else "no XLA kernels"
            _state["gpu"] = _probe_gpus(tf, path)
            _state["lib"] = lib
        except Exception as e:  # noqa: BLE001 - a failed load must never break import
            _state["error"] = f"{type(e).__name__}: {e}".strip()
            _state["lib"] = None
        finally:
            _state["attempted"] = True
    return _state["lib"]


def _ensure_xla_kernels(path: str) -> bool:
    """Registers the XLA kernels if TensorFlow's device context predates the load.

    TensorFlow turns XLA op registrations into XLA_*_JIT kernels once, when its
    device context is created; a library loaded later (lazily, on first use)
    would otherwise fail under jit_compile=True. Returns whether the library
    has XLA lowerings at all.
    """
    import ctypes  # noqa: PLC0415

    try:
        fn = ctypes.CDLL(path).KerasEcocEnsureXlaKernels
    except (OSError, AttributeError):
        return False  # built without the XLA part
    fn.restype = ctypes.c_int
    fn()
    return True


def _register_ffi_targets(path: str) -> str:
    """Registers the kernel library's FFI handlers with TensorFlow's XLA.

    After this the op library's XLA kernels emit custom calls to them (on the
    platforms registered) instead of the HLO lowering. Returns "" on success,
    else why the HLO lowering stays (no kernel library, an op library without
    the registration entry point, or XLA refused the handlers).
    """
    import ctypes  # noqa: PLC0415

    if os.environ.get(_ENV_CUSTOM_CALL, "").strip().lower() in ("0", "false", "no", "off"):
        return f"custom calls turned off by {_ENV_CUSTOM_CALL}=0"
    kernels = load_kernels()
    if kernels is None:
        return kernels_error() or "kernel library not loaded"
    try:
        register = ctypes.CDLL(path).KerasEcocRegisterFfiTargets
    except (OSError, AttributeError):
        return f"{path} has no KerasEcocRegisterFfiTargets ({REBUILD_HINT})"
    register.restype = ctypes.c_int
    platforms = [("Host", "")] + ([("CUDA", "Cuda")] if _kernels["cuda"] else [])
    for platform, suffix in platforms:
        handlers = [ctypes.cast(getattr(kernels, symbol + suffix), ctypes.c_void_p)
                    for symbol in FFI_TARGETS.values()]
        error = ctypes.create_string_buffer(512)
        if register(platform.encode(), *handlers, error, ctypes.c_int(len(error))) != 0:
            return f"XLA refused the {platform} FFI handlers: {error.value.decode(errors='replace')}"
    return ""


def ffi_platforms() -> list[str]:
    """The XLA platforms on which the TensorFlow op's XLA kernels emit custom calls."""
    import ctypes  # noqa: PLC0415

    if load_library() is None or _state["ffi"] != "":
        return []
    bits = int(ctypes.CDLL(_state["path"]).KerasEcocFfiPlatforms())
    return [name for bit, name in ((1, "Host"), (2, "CUDA")) if bits & bit]


def library_info(path: str | None = None) -> dict:
    """What a library file was built with, read from the file (not loaded).

    Returns {"tensorflow", "cxx", "nvcc", "cuda_archs"}; "cuda_archs" (e.g.
    "sm_75,...,sm_90,compute_90") is None when the library has no CUDA part,
    and every key is None for a library built before the versions were
    embedded.
    """
    path = path or library_path()
    try:
        st = os.stat(path)
    except OSError:
        return {"tensorflow": None, "cxx": None, "nvcc": None, "cuda_archs": None}
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _info_cache:
        with open(path, "rb") as f:
            data = f.read()
        info = {"tensorflow": None, "cxx": None, "nvcc": None}
        m = _BUILD_INFO_RE.search(data)
        if m:
            try:
                info.update(json.loads(m.group(1).decode()))
            except ValueError:
                pass
        m = _CUDA_ARCHS_RE.search(data)
        info["cuda_archs"] = m.group(1).decode() if m else None
        _info_cache.clear()
        _info_cache[key] = info
    return dict(_info_cache[key])


def _check_built_for(path: str, tf_version: str) -> None:
    built = library_info(path)["tensorflow"]
    if built is None:
        raise ImportError(f"{path} does not say which TensorFlow it was built against (built by an "
                          f"older kernels/build.py): {REBUILD_HINT}")
    # TensorFlow keeps its C++ ABI within a minor version (2.21.0 and 2.21.1
    # load the same library); anything else must be rebuilt.
    if built.split(".")[:2] != tf_version.split(".")[:2]:
        raise ImportError(f"{path} was built against TensorFlow {built}, running TensorFlow "
                          f"{tf_version}: {REBUILD_HINT}")


def _cuda_probe(path: str, device: int) -> tuple:
    """Calls KerasEcocCudaProbe in the library: (runtime_version, Device or error str)."""
    import ctypes  # noqa: PLC0415

    lib = ctypes.CDLL(path)
    runtime = int(lib.KerasEcocCudaRuntimeVersion())
    out = [ctypes.c_int(0) for _ in range(8)]
    name = ctypes.create_string_buffer(128)
    lib.KerasEcocCudaProbe.restype = ctypes.c_int
    rc = lib.KerasEcocCudaProbe(ctypes.c_int(device), *[ctypes.byref(o) for o in out], name,
                                ctypes.c_int(len(name)))
    driver, count, major, minor, smem, image, _, _ = (o.value for o in out)
    err = name.value.decode(errors="replace")
    if rc != 0:
        if err == "cudaErrorInsufficientDriver":
            return runtime, (f"driver too old: the CUDA runtime reports {err} (driver supports CUDA "
                             f"{driver // 1000}.{driver % 1000 // 10}, the kernels were built with CUDA "
                             f"{runtime // 1000}.{runtime % 1000 // 10}); update the NVIDIA driver")
        return runtime, f"the CUDA probe failed on GPU {device} with {err or rc}"
    return runtime, _gpu_guard.Device(cc=(major, minor), driver=driver, smem_optin=smem,
                                      name=f"GPU {device} (compute capability {major}.{minor})",
                                      image_error=err if image != 0 else "")


def _probe_gpus(tf, path: str) -> dict:
    """The GPU guard's verdict for this process (see `gpu_status`)."""
    archs = library_info(path)["cuda_archs"]
    simulate = os.environ.get(_gpu_guard.SIMULATE_ENV, "").strip()
    status = {"cuda_archs": archs, "runtime": None, "devices": [], "simulated": bool(simulate),
              "usable": True, "reason": "", "smem_optin": None}
    if archs is None:
        status["reason"] = ("the library has no CUDA kernels (built without nvcc); "
                            "TensorFlow runs the CPU kernels")
        return status
    import ctypes  # noqa: PLC0415

    try:
        status["runtime"] = int(ctypes.CDLL(path).KerasEcocCudaRuntimeVersion())
    except (OSError, AttributeError) as e:
        status.update(usable=False, reason=f"the library's CUDA probe is missing ({e}): {REBUILD_HINT}")
        return status
    if simulate:
        devices = [_gpu_guard.parse_simulation(simulate, status["runtime"])]
    else:
        try:
            count = len(tf.config.list_physical_devices("GPU"))
        except Exception:  # noqa: BLE001 - no GPU support in this TensorFlow
            count = 0
        if count == 0:
            status["reason"] = "no GPU visible to TensorFlow; the CPU kernels are used"
            return status
        devices = []
        for i in range(count):
            try:
                _, dev = _cuda_probe(path, i)
            except (OSError, AttributeError) as e:
                dev = f"the CUDA probe could not be called ({e})"
            if isinstance(dev, str):
                status.update(usable=False, reason=dev)
                return status
            devices.append(dev)
    status["devices"] = [dataclasses.asdict(d) for d in devices]
    status["smem_optin"] = min(d.smem_optin for d in devices)
    for d in devices:
        problem = _gpu_guard.device_problem(d, archs, status["runtime"])
        if problem:
            status.update(usable=False, reason=problem)
            return status
    how = _gpu_guard.arch_coverage(archs, devices[0].cc)[1]
    status["reason"] = (f"the CUDA kernels run on {', '.join(d.name for d in devices)} ({how}) for "
                        f"code lengths up to {_gpu_guard.max_code_length(status['smem_optin'])}")
    return status


def gpu_status() -> dict:
    """The GPU guard's state: a dict (empty before the library is loaded).

    Keys: cuda_archs (what the loaded library holds, or None), runtime
    (CUDART_VERSION linked in), devices (what the probe found), simulated,
    smem_optin (bytes, the smallest of the devices), usable (False when the
    CUDA kernels cannot run on a visible GPU for any code length) and reason.
    """
    if load_library() is None or _state["gpu"] is None:
        return {}
    return dict(_state["gpu"])


def gpu_kernels_usable(code_length: int, op: str = "cross_entropy") -> tuple:
    """(ok, reason): may an op with this code length run with the fused op?

    False when a GPU is visible and the library's CUDA kernels cannot run
    there: no kernel image for its compute capability, a driver older than
    the linked CUDA runtime, or `code_length` beyond its shared memory. The
    caller then uses the non-fused path (same numbers). True, with the
    reason, when they can run or are never used (no GPU, no CUDA part, fused
    op not loaded). op: "cross_entropy" or "decode" (label rank and nearest
    codeword need about half the shared memory). A shared-memory refusal is
    warned about once per reason; the device-level refusals already make
    `fused_available()` False, and the ops layer warns once with
    `fused_status()`.
    """
    if isinstance(code_length, bool) or not isinstance(code_length, int) or code_length < 0:
        raise ValueError("Argument `code_length` must be a non-negative integer. "
                         f"Received: code_length={code_length!r}")
    status = gpu_status()
    if not status:
        return True, "fused op not loaded; nothing runs on the GPU kernels"
    if not status["usable"]:
        return False, status["reason"]
    if not status["devices"]:
        return True, status["reason"]
    problems = [_gpu_guard.code_length_problem(_gpu_guard.Device(**d), code_length, op)
                for d in status["devices"]]
    problem = next((p for p in problems if p), None)
    if problem is None:
        return True, status["reason"]
    if problem not in _warned_reasons:
        _warned_reasons.add(problem)
        warnings.warn(f"keras_ecoc.ops: not using the fused op's CUDA kernels ({problem}); "
                      f"{FALLBACK}, which gives the same numbers", RuntimeWarning,
                      stacklevel=2)
    return False, problem


def code_length_usable(codes, op: str = "cross_entropy") -> bool:
    """The ops dispatcher's GPU-guard call: may the fused op run with these codes?

    codes: the (n, k) code matrix (array, tensor or variable). When k is not
    known statically, True (the guard cannot decide; a kernel that does not
    fit then fails with its own error). Otherwise `gpu_kernels_usable(k, op)[0]`,
    which warns once per reason when it refuses.
    """
    shape = getattr(codes, "shape", None)
    if shape is None:
        import numpy as np  # noqa: PLC0415

        shape = np.shape(codes)
    dims = tuple(shape)
    if len(dims) != 2 or dims[-1] is None:
        return True
    return gpu_kernels_usable(int(dims[-1]), op)[0]


def load_error() -> str | None:
    return _state["error"]


def registered_devices(op_name: str = "EcocCrossEntropy") -> list[str]:
    """Device types with a registered kernel for `op_name` (after loading)."""
    if load_library() is None:
        return []
    from tensorflow.python.framework import kernels  # noqa: PLC0415

    found = {k.device_type for k in kernels.get_registered_kernels_for_op(op_name).kernel}
    return sorted(found)


def fused_available() -> bool:
    """True when the fused op is used: TF backend, library loaded, not disabled."""
    if disabled():
        return False
    if backend() != "tensorflow":
        return False
    if load_library() is None:
        return False
    # A visible GPU where the CUDA kernels cannot run at all: TensorFlow would
    # still place the op there, so use the non-fused path instead.
    return _state["gpu"] is None or _state["gpu"]["usable"]


def fused_status() -> str:
    """One line saying whether the fused op is in use and, if not, why."""
    if disabled():
        return f"fused op disabled by {_ENV_DISABLE}; {FALLBACK}"
    b = backend()
    if b in ("jax", "torch"):
        from keras_ecoc.ops import _dispatch  # noqa: PLC0415

        ok, why = _dispatch._fused_here(b, None, "loss", _dispatch._on_gpu_for(b, None))
        return f"backend is {b}: " + (f"fused kernels in use ({why})" if ok else f"{why}; {FALLBACK}")
    if b != "tensorflow":
        return f"backend is {b}: {FALLBACK} (no fused implementation)"
    if load_library() is None:
        return f"library not built or not loadable: {load_error()}; {FALLBACK}"
    devices = ", ".join(registered_devices()) or "no"
    if not _state["xla"]:
        xla = "WITHOUT XLA kernels (jit_compile=True will fail)"
    elif _state["ffi"] == "":
        xla = ("under XLA: custom calls to the kernel library's FFI handlers on "
               + " and ".join(ffi_platforms()) + ", HLO lowering elsewhere")
    else:
        xla = f"under XLA: the HLO lowering (no custom call: {_state['ffi']})"
    gpu = _state["gpu"] or {}
    archs = f"; CUDA kernels for {gpu['cuda_archs']}" if gpu.get("cuda_archs") else ""
    if not gpu.get("usable", True):
        return (f"fused op loaded from {_state['path']} but its CUDA kernels cannot run here: "
                f"{gpu['reason']}{archs}; {FALLBACK}")
    return f"fused op loaded from {_state['path']} ({devices} kernels, {xla}{archs})"
