"""Loads the fused-op library once and registers its gradients.

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
OP_NAMES = (
    "EcocCrossEntropy",
    "EcocCrossEntropyCodesGrad",
    "EcocLabelRank",
    "EcocNearestCodeword",
)

_lock = threading.Lock()
_state = {"attempted": False, "lib": None, "error": None, "path": None, "xla": None, "gpu": None}
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

            # Before dlopen: an ABI-mismatched library may crash on load.
            _check_built_for(path, tf.__version__)
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
            _register_gradients(tf, lib)
            _state["xla"] = _ensure_xla_kernels(path)
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
    if b != "tensorflow":
        return f"backend is {b}: {FALLBACK} (the fused op is TensorFlow-only)"
    if load_library() is None:
        return f"library not built or not loadable: {load_error()}; {FALLBACK}"
    devices = ", ".join(registered_devices()) or "no"
    xla = "with XLA lowerings" if _state["xla"] else "WITHOUT XLA lowerings (jit_compile=True will fail)"
    gpu = _state["gpu"] or {}
    archs = f"; CUDA kernels for {gpu['cuda_archs']}" if gpu.get("cuda_archs") else ""
    if not gpu.get("usable", True):
        return (f"fused op loaded from {_state['path']} but its CUDA kernels cannot run here: "
                f"{gpu['reason']}{archs}; {FALLBACK}")
    return f"fused op loaded from {_state['path']} ({devices} kernels, {xla}{archs})"


# ---------------------------------------------------------------------------
# Gradients.

def _register_gradients(tf, lib) -> None:
    def register(name, fn):
        try:
            tf.RegisterGradient(name)(fn)
        except KeyError:  # already registered (e.g. module reloaded)
            pass

    def cross_entropy_grad(op, g_loss, g_lse, g_ec, g_esq):
        # Gradients of the auxiliary outputs expected_code / expected_sqnorm
        # are not propagated (they are inputs to this very gradient).
        del g_ec, g_esq
        return _cross_entropy_grad(tf, lib, op, g_loss, g_lse)

    register("EcocCrossEntropy", cross_entropy_grad)
    for name in ("EcocLabelRank", "EcocNearestCodeword"):
        try:
            tf.no_gradient(name)
        except KeyError:
            pass


def _is_all_zero_eager(tf, x) -> bool:
    return tf.executing_eagerly() and not bool(tf.reduce_any(tf.not_equal(x, 0.0)))


def _cross_entropy_grad(tf, lib, op, g_loss, g_lse):
    """Gradient of EcocCrossEntropy (see kernels/ecoc_ops.cc for the math).

    With u = z r, r = rsqrt(max(||z||^2, eps)), p = softmax of the logits,
    E = sum_i p_i M_i (expected_code), Q = sum_i p_i ||M_i||^2:
      dloss/du = s (E - M_y)              dlse/du = s (E - u)
      dloss/ds = -0.5 (Q - ||M_y||^2) + (E - M_y).u
      dlse/ds  = -0.5 Q + E.u - 0.5 ||u||^2
      dz = r (du - (u.du) u) if ||z||^2 > eps else r du
      dcodes via the EcocCrossEntropyCodesGrad op (streams over the batch).
    """
    z, codes, labels, scale = op.inputs
    _, lse, expected_code, expected_sqnorm = op.outputs
    eps = op.get_attr("epsilon")
    skip = set(getattr(op, "skip_input_indices", None) or ())
    if g_lse is not None and _is_all_zero_eager(tf, g_lse):
        g_lse = None
    if g_loss is None:
        g_loss = tf.zeros_like(lse)
    # A label outside [0, n) has a NaN loss (under XLA; it raises elsewhere)
    # and must give a zero gradient, as on the pure-Keras path; tf.gather
    # below would otherwise clamp it to class 0 or n - 1 under XLA.
    n = tf.shape(codes, out_type=labels.dtype)[0]
    label_ok = tf.logical_and(labels >= 0, labels < n)
    g_loss = tf.where(label_ok, g_loss, tf.zeros_like(g_loss))
    if g_lse is not None:
        g_lse = tf.where(label_ok, g_lse, tf.zeros_like(g_lse))

    zf = tf.cast(z, tf.float32)
    sqnorm = tf.reduce_sum(tf.square(zf), axis=-1, keepdims=True)
    r = tf.math.rsqrt(tf.maximum(sqnorm, eps))
    u = zf * r
    m_y = tf.gather(codes, labels)
    diff = expected_code - m_y
    g_s = g_loss * scale

    grad_z = grad_scale = grad_codes = None
    if 0 not in skip:
        du = g_s[:, None] * diff
        if g_lse is not None:
            du += (g_lse * scale)[:, None] * (expected_code - u)
        radial = tf.reduce_sum(u * du, axis=-1, keepdims=True) * u
        radial = tf.where(sqnorm > eps, radial, tf.zeros_like(radial))
        grad_z = tf.cast(r * (du - radial), z.dtype)
    if 3 not in skip:
        per_example = g_loss * (
            -0.5 * (expected_sqnorm - tf.reduce_sum(tf.square(m_y), axis=-1))
            + tf.reduce_sum(diff * u, axis=-1)
        )
        if g_lse is not None:
            per_example += g_lse * (
                -0.5 * expected_sqnorm
                + tf.reduce_sum(expected_code * u, axis=-1)
                - 0.5 * tf.reduce_sum(tf.square(u), axis=-1)
            )
        grad_scale = tf.reshape(tf.reduce_sum(per_example), tf.shape(scale))
    if 1 not in skip:
        weights = g_loss if g_lse is None else g_loss + g_lse
        grad_codes = lib.ecoc_cross_entropy_codes_grad(
            z, codes, labels, scale, lse, weights, epsilon=eps
        )
        if g_lse is not None:
            # The op subtracts weights_b at the label; the lse part must not.
            grad_codes += tf.math.unsorted_segment_sum(
                (g_lse * scale)[:, None] * (u - m_y), labels, tf.shape(codes)[0]
            )
    return grad_z, grad_codes, None, grad_scale
