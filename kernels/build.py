#!/usr/bin/env python
"""Builds the kernel library and the TensorFlow op library of keras-ecoc.

Two shared libraries, in ``keras_ecoc/_lib/``:

``_ecoc_kernels.so`` (:func:`build_kernels`; g++, no framework needed): the
CPU math core (both ISA copies), XLA FFI handlers over it for the "Host"
platform and C entry points (kernels/ffi/ecoc_ffi_cpu.cc), compiled against the
vendored XLA FFI headers (kernels/third_party/xla); plus, when nvcc is present
and the CUDA kernels implement the v2 contract, the "CUDA" FFI handlers and C
entry points (kernels/ffi/ecoc_ffi_cuda.cc) with the kernels and the static
CUDA runtime. JAX and PyTorch use it directly; TensorFlow's XLA kernels emit
custom calls to its handlers.

``_ecoc_ops.so`` (:func:`build_library`; only when TensorFlow is installed),
the TensorFlow op library. It holds every part that could be built:

* the op registrations and the CPU kernels (required; the math core
  ``ecoc_cpu_math.cc`` is compiled twice, for baseline x86-64 and for
  AVX2+FMA, and picked at run time, so the library runs on any x86-64);
* the XLA lowerings (``ecoc_xla.cc``, linked with ``libtensorflow_cc.so.2``),
  needed for ``jit_compile=True``;
* the CUDA kernels (``cuda/ecoc_kernels.cu.cc`` with nvcc and
  ``ecoc_ops_gpu.cc`` with g++ -DGOOGLE_CUDA=1), linked with the static CUDA
  runtime so that the library also loads on machines without CUDA.

The XLA and CUDA parts are optional: when their sources are missing or fail
to compile, a warning says so and the library is built without them. Only a
failure of the CPU part raises :class:`BuildError`.

All flags come from ``tf.sysconfig`` (never hard-coded ABI flags). Objects are
cached in ``build/ecoc_ops/`` under a content hash, and the library carries a
stamp (sources, TensorFlow version, flags, compilers), so running this again
with nothing changed does nothing. The cache key of every object includes the
TensorFlow, g++ and nvcc versions (and the CUDA architectures), and the library
embeds the TensorFlow version it was built against: the loader refuses it
under another TensorFlow.

CUDA: SASS for sm_75, sm_80, sm_86, sm_89 and sm_90 plus compute_90 PTX (later
GPUs JIT it); the architecture of a GPU that nvidia-smi lists at build time is
always added; $KERAS_ECOC_CUDA_ARCHS="80,90" replaces the default list.

Usage (developers)::

    python kernels/build.py [--no-cuda] [--no-xla] [--out DIR] [--force] [-j N]

``setup.py`` imports this file by path and calls :func:`build_all` (the kernel
library, then the op library when TensorFlow imports; a failure of either
only warns).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

KERNELS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(KERNELS_DIR)
LIB_NAME = "_ecoc_ops.so"
KERNELS_LIB_NAME = "_ecoc_kernels.so"
DEFAULT_OUT_DIR = os.path.join(REPO_ROOT, "keras_ecoc", "_lib")
DEFAULT_BUILD_DIR = os.path.join(REPO_ROOT, "build", "ecoc_ops")

# Sources (relative to kernels/).
OPS_SRC = "ecoc_ops.cc"
CPU_SRC = "ecoc_kernels_cpu.cc"
MATH_SRC = "ecoc_cpu_math.cc"
XLA_SRC = "ecoc_xla.cc"
GPU_OPS_SRC = "ecoc_ops_gpu.cc"
CUDA_SRC = os.path.join("cuda", "ecoc_kernels.cu.cc")
# Local headers whose content goes into the hash of the objects of a part.
CPU_HEADERS = ("ecoc_cpu_math.h", "ecoc_validation.h")
# Shared with the CPU kernels by the GPU OpKernels.
SHARED_HEADERS = ("ecoc_validation.h",)
CUDA_HEADER_DIR = "cuda"
# The framework-free kernel library (kernels/ffi/).
FFI_CPU_SRC = os.path.join("ffi", "ecoc_ffi_cpu.cc")
FFI_CUDA_SRC = os.path.join("ffi", "ecoc_ffi_cuda.cc")
FFI_INCLUDE = os.path.join(KERNELS_DIR, "third_party", "xla")
FFI_HEADERS = tuple(os.path.join("third_party", "xla", "xla", "ffi", "api", h)
                    for h in ("api.h", "c_api.h", "ffi.h"))

# The CUDA handlers' workspace alignment (header-only, ours).
FFI_WORKSPACE_HEADER = os.path.join("ffi", "ecoc_ffi_workspace.h")

CXX_WARNINGS = [
    "-Wno-deprecated-declarations",
    "-Wno-interference-size",
    "-Wno-psabi",
    "-Wno-sign-compare",
]
# SASS for every architecture of common cards (T4 = 7.5, A100 = 8.0,
# RTX 30xx/A10 = 8.6, RTX 40xx/L4 = 8.9, H100/H200 = 9.0) plus PTX of the newest,
# which later GPUs JIT-compile. A GPU visible at build time is always added.
# KERAS_ECOC_CUDA_ARCHS="80,90" overrides the list (e.g. for a quick build).
DEFAULT_CUDA_ARCHS = ("75", "80", "86", "89", "90")
MIN_CUDA_ARCH = 75  # the oldest architecture nvcc 13 compiles for
PROBE_SRC = os.path.join("cuda", "ecoc_probe.cu.cc")
BUILD_INFO_MARKER = "KERAS_ECOC_BUILD_INFO="


class BuildError(RuntimeError):
    """The required (CPU) part of the library could not be built."""


@dataclasses.dataclass
class BuildResult:
    path: str
    parts: list  # e.g. ["cpu", "xla", "cuda"]
    skipped: dict  # part -> reason
    up_to_date: bool
    cuda_archs: str | None = None  # e.g. "sm_75,...,sm_90,compute_90" when "cuda" in parts

    def summary(self) -> str:
        s = f"{self.path} [{', '.join(self.parts)}]"
        if self.cuda_archs:
            s += f"; CUDA kernels for {self.cuda_archs}"
        if self.skipped:
            s += "; without " + "; ".join(f"{k} ({v})" for k, v in self.skipped.items())
        return s


def _log(msg: str, verbose: bool = True) -> None:
    if verbose:
        print(f"[keras-ecoc build] {msg}", file=sys.stderr, flush=True)


def _warn(msg: str) -> None:
    bar = "!" * 78
    print(f"\n{bar}\n[keras-ecoc build] WARNING: {msg}\n{bar}\n", file=sys.stderr, flush=True)


def _run(cmd: list, cwd: str | None = None) -> tuple[int, str]:
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc.returncode, proc.stdout


def _tool_version(tool: str, first: bool = False) -> str:
    try:
        rc, out = _run([tool, "--version"])
    except OSError:
        return "missing"
    lines = out.strip().splitlines()
    return (lines[0] if first else lines[-1]) if lines else f"rc={rc}"


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _sha(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def visible_gpu_archs() -> list:
    """Compute capabilities of the GPUs nvidia-smi lists, as ["86", ...]."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode != 0:
        return []
    found = []
    for line in proc.stdout.split():
        m = re.fullmatch(r"(\d+)\.(\d+)", line.strip())
        if m and m.group(1) + m.group(2) not in found:
            found.append(m.group(1) + m.group(2))
    return found


def cuda_archs(visible: list | None = None) -> list:
    """SASS architectures to build, as ["75", "80", ...] (sorted numerically).

    The default list, or $KERAS_ECOC_CUDA_ARCHS, plus every GPU visible now.
    """
    override = os.environ.get("KERAS_ECOC_CUDA_ARCHS", "").strip()
    if override:
        archs = [a.strip().replace("sm_", "").replace(".", "") for a in override.split(",") if a.strip()]
        bad = [a for a in archs if not re.fullmatch(r"\d{2,3}", a)]
        if bad:
            raise BuildError("KERAS_ECOC_CUDA_ARCHS must be a comma-separated list of compute "
                             f"capabilities such as \"75,80,90\". Received: {override!r}")
    else:
        archs = list(DEFAULT_CUDA_ARCHS)
    # nvcc 13 cannot compile for anything older than sm_75: such a visible GPU
    # is left out (the runtime guard then keeps the op off it) rather than
    # failing the whole CUDA part.
    seen = visible_gpu_archs() if visible is None else visible
    archs += [a for a in seen if int(a) >= MIN_CUDA_ARCH]
    return sorted(set(archs), key=int)


def cuda_gencode_flags(archs: list) -> list:
    """-gencode flags: SASS for each arch, PTX of the newest (for later GPUs)."""
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs[:-1]]
    newest = archs[-1]
    flags.append(f"-gencode=arch=compute_{newest},code=[sm_{newest},compute_{newest}]")
    return flags


def cuda_arch_names(archs: list) -> str:
    """What the library holds, e.g. "sm_75,sm_80,sm_86,sm_89,sm_90,compute_90"."""
    return ",".join([f"sm_{a}" for a in archs] + [f"compute_{archs[-1]}"])


def tf_config() -> dict:
    """TensorFlow's version, include dir and compile/link flags."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf  # noqa: PLC0415
    except Exception as e:  # pragma: no cover - depends on the environment
        raise BuildError(f"cannot import tensorflow ({e!r}); install tensorflow-cpu==2.21.* first") from e
    return {
        "version": tf.__version__,
        "include": tf.sysconfig.get_include(),
        "lib": tf.sysconfig.get_lib(),
        "cflags": list(tf.sysconfig.get_compile_flags()),
        "lflags": list(tf.sysconfig.get_link_flags()),
    }


def find_cuda() -> tuple[str | None, str | None, str]:
    """Returns (nvcc, cuda_home, reason-if-not-found)."""
    nvcc = None
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    for h in homes:
        if h and os.path.exists(os.path.join(h, "bin", "nvcc")):
            nvcc = os.path.join(h, "bin", "nvcc")
            break
    if nvcc is None:
        nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None, None, "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    candidates = [h for h in homes if h]
    candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates.append("/usr/local/cuda")
    # /usr/local/bin/nvcc may be a wrapper script: ask nvcc where it lives.
    try:
        rc, out = _run([nvcc, "-v", "--dryrun", "-x", "cu", "-c", os.devnull])
        for line in out.splitlines():
            if "TOP=" in line:
                candidates.insert(0, line.split("TOP=", 1)[1].strip())
    except OSError:
        pass
    for home in candidates:
        if os.path.exists(os.path.join(home, "include", "cuda_runtime.h")) and _cudart_dir(home):
            return nvcc, home, ""
    return nvcc, None, f"found {nvcc} but no CUDA toolkit with include/cuda_runtime.h and libcudart_static.a"


def _cudart_dir(home: str) -> str | None:
    for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
        if os.path.exists(os.path.join(home, sub, "libcudart_static.a")):
            return os.path.join(home, sub)
    return None


@dataclasses.dataclass
class _Unit:
    name: str  # object base name
    src: str  # absolute path
    cmd: list  # compiler command without -c/-o
    part: str  # "cpu" | "xla" | "cuda"
    compiler: str = "g++"
    # Headers (relative to kernels/) hashed instead of the part's default set.
    deps: tuple | None = None
    # Versions that change the object without changing the command line
    # (TensorFlow's headers live at the same path after an upgrade; a new g++
    # or nvcc has the same name): part of the cache key.
    toolchain: str = ""

    def headers(self) -> list:
        if self.deps is not None:
            return [os.path.join(KERNELS_DIR, h) for h in self.deps]
        if self.part == "cpu":
            return [os.path.join(KERNELS_DIR, h) for h in CPU_HEADERS]
        if self.part == "cuda":
            d = os.path.join(KERNELS_DIR, CUDA_HEADER_DIR)
            return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith((".h", ".cuh"))) + [
                os.path.join(KERNELS_DIR, h) for h in SHARED_HEADERS
            ]
        return []

    def key(self) -> str:
        deps = [_read(self.src)]
        for h in self.headers():
            if os.path.exists(h):
                deps.append(h.encode() + b"\0" + _read(h))
        return _sha(*deps, " ".join(self.cmd), self.toolchain)[:20]


def toolchain_versions(tf_version: str, cxx: str, nvcc: str | None) -> dict:
    """The versions that go into every object's cache key and the library's stamp."""
    return {"tf": tf_version, "cxx": _tool_version(cxx, first=True),
            "nvcc": _tool_version(nvcc) if nvcc else None}


def write_build_info(build_dir: str, info: dict) -> str:
    """Writes the C++ source that embeds `info` (JSON) in the library.

    The loader reads the marker string straight from the file (no dlopen, so a
    library built against another TensorFlow is refused before it is loaded);
    KerasEcocBuildInfo() returns the same text to C callers. Rewritten only when
    the content changes, so the object stays cached.
    """
    text = json.dumps(info, sort_keys=True, separators=(",", ":"))
    if ";" in text or "\n" in text:
        raise BuildError(f"build info must not contain ';' or newlines: {text}")
    literal = (BUILD_INFO_MARKER + text + ";").replace("\\", "\\\\").replace('"', '\\"')
    src = ("// Generated by kernels/build.py: what this library was built with.\n"
           f'__attribute__((used)) static const char kKerasEcocBuildInfo[] = "{literal}";\n'
           'extern "C" __attribute__((visibility("default"))) const char* KerasEcocBuildInfo() {\n'
           f"  return kKerasEcocBuildInfo + {len(BUILD_INFO_MARKER)};\n}}\n")
    path = os.path.join(build_dir, "gen", "ecoc_build_info.cc")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path) or _read(path).decode() != src:
        with open(path, "w") as f:
            f.write(src)
    return path


def _units(tf: dict, cxx: str, nvcc: str | None, cuda_home: str | None, with_xla: bool,
           with_cuda: bool, shim_dir: str, skipped: dict, toolchain: dict | None = None,
           archs: list | None = None, build_info_src: str | None = None) -> list:
    toolchain = toolchain or {}
    host_tc = f"tf={toolchain.get('tf')} cxx={toolchain.get('cxx')}"
    base = [cxx, "-std=c++17", "-fPIC", "-O3", "-DNDEBUG", *CXX_WARNINGS, f"-I{KERNELS_DIR}", *tf["cflags"]]
    src = lambda rel: os.path.join(KERNELS_DIR, rel)  # noqa: E731
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")

    def unit(*args, **kw):
        kw.setdefault("toolchain", host_tc)
        return _Unit(*args, **kw)

    units = [
        unit("ecoc_ops", src(OPS_SRC), base, "cpu"),
        unit("ecoc_kernels_cpu", src(CPU_SRC), base + (["-DECOC_HAVE_AVX2_VARIANT"] if x86 else []), "cpu"),
    ]
    if build_info_src:
        units.append(unit("ecoc_build_info", build_info_src, [cxx, "-std=c++17", "-fPIC", "-O2"], "cpu"))
    math = [*base, "-fno-math-errno", "-ffp-contract=fast", "-fno-exceptions"]
    units.append(unit("ecoc_cpu_math_base", src(MATH_SRC),
                      math + ["-DECOC_CPU_GETTER=GetKernelsBase", '-DECOC_CPU_ISA_NAME="base"'], "cpu"))
    if x86:
        units.append(unit("ecoc_cpu_math_avx2", src(MATH_SRC),
                          math + ["-mavx2", "-mfma", "-DECOC_CPU_GETTER=GetKernelsAvx2",
                                  '-DECOC_CPU_ISA_NAME="avx2"'], "cpu"))
    if with_xla:
        if os.path.exists(src(XLA_SRC)):
            inc = tf["include"]
            units.append(unit("ecoc_xla", src(XLA_SRC), base + [
                f"-I{os.path.join(inc, 'external', 'highwayhash')}",
                f"-I{os.path.join(inc, 'external', 'farmhash_archive', 'src')}",
            ], "xla"))
        else:
            skipped["xla"] = f"kernels/{XLA_SRC} does not exist yet"
    if with_cuda:
        missing = [rel for rel in (GPU_OPS_SRC, CUDA_SRC, PROBE_SRC) if not os.path.exists(src(rel))]
        if missing:
            skipped["cuda"] = "missing " + ", ".join(f"kernels/{m}" for m in missing)
        else:
            archs = archs or list(DEFAULT_CUDA_ARCHS)
            cuda_tc = f"{host_tc} nvcc={toolchain.get('nvcc')}"
            cuda_inc = os.path.join(cuda_home, "include")
            units.append(unit("ecoc_ops_gpu", src(GPU_OPS_SRC), [
                cxx, "-std=c++17", "-fPIC", "-O3", "-DNDEBUG", *CXX_WARNINGS, "-DGOOGLE_CUDA=1", "-DEIGEN_USE_GPU",
                f"-I{shim_dir}", f"-I{cuda_inc}", f"-I{KERNELS_DIR}", *tf["cflags"]], "cuda", toolchain=cuda_tc))
            nvcc_cmd = [nvcc, "-std=c++17", "-x", "cu", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
                        "-Xcompiler", "-fPIC", "-Xcompiler", "-Wno-deprecated-declarations",
                        *nvcc_thread_flags(len(archs)), *cuda_gencode_flags(archs), f"-I{KERNELS_DIR}"]
            # The same object as the kernel library's: one nvcc run over every
            # architecture serves both libraries (the kernels need no TensorFlow flag).
            units.append(_cuda_kernels_unit(nvcc, archs, toolchain))
            units.append(unit("ecoc_probe_cu", src(PROBE_SRC), [
                *nvcc_cmd, f'-DECOC_CUDA_ARCHS="{cuda_arch_names(archs)}"'],
                "cuda", compiler="nvcc", toolchain=cuda_tc))
    return units


def nvcc_thread_flags(num_archs: int) -> list:
    """nvcc's own parallelism over the -gencode targets (see kernels/cuda/README.md)."""
    threads = int(os.environ.get("KERAS_ECOC_NVCC_THREADS", "0")) or min(num_archs + 1, os.cpu_count() or 1)
    return ["--threads", str(threads)] if threads > 1 else []


def _make_shim(build_dir: str, cuda_home: str) -> str:
    """build/.../shim/third_party/gpus/cuda/include -> $CUDA_HOME/include."""
    shim = os.path.join(build_dir, "shim")
    link = os.path.join(shim, "third_party", "gpus", "cuda", "include")
    target = os.path.join(cuda_home, "include")
    if os.path.islink(link) and os.readlink(link) == target:
        return shim
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(target, link)
    return shim


def _compile(unit: _Unit, obj_dir: str, verbose: bool) -> tuple[_Unit, str | None, str]:
    obj = os.path.join(obj_dir, f"{unit.name}-{unit.key()}.o")
    if os.path.exists(obj):
        return unit, obj, "cached"
    tmp = obj + f".tmp{os.getpid()}"
    t0 = time.time()
    rc, out = _run(unit.cmd + ["-c", unit.src, "-o", tmp])
    if rc != 0:
        if os.path.exists(tmp):
            os.remove(tmp)
        return unit, None, out
    os.replace(tmp, obj)
    _log(f"compiled {os.path.relpath(unit.src, REPO_ROOT)} -> {os.path.basename(obj)} "
         f"({time.time() - t0:.0f} s)", verbose)
    return unit, obj, ""


def _check_loads(path: str) -> tuple[int, str]:
    """Loads the library with tf.load_op_library in a fresh interpreter.

    Catches undefined symbols (a shared library links with them) before the
    library is installed. A fresh process, because an op library must be
    loaded only once per process.
    """
    code = ("import sys, tensorflow as tf; lib = tf.load_op_library(sys.argv[1]); "
            "assert hasattr(lib, 'ecoc_cross_entropy'), dir(lib)")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    try:
        proc = subprocess.run([sys.executable, "-c", code, path], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired:
        return 1, "timed out loading the library"
    return proc.returncode, proc.stdout


def _stamp_path(out: str, build_dir: str) -> str:
    # Kept in the (git-ignored) build dir, one per output path.
    return os.path.join(build_dir, "stamps", hashlib.sha256(out.encode()).hexdigest()[:16] + ".json")


def _up_to_date(out: str, build_dir: str, stamp: dict) -> "BuildResult | None":
    """The earlier build's result when `out` exists and was built from `stamp`."""
    path = _stamp_path(out, build_dir)
    if not (os.path.exists(out) and os.path.exists(path)):
        return None
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return None
    if old.get("stamp") != stamp:
        return None
    return BuildResult(out, old.get("parts", []), old.get("skipped_reasons", {}), True,
                       old.get("cuda_archs"))


def build_library(out_dir: str | None = None, *, cuda: bool | None = None, xla: bool = True,
                  force: bool = False, verbose: bool = True, jobs: int | None = None,
                  build_dir: str | None = None) -> BuildResult:
    """Builds (or reuses) the library; returns where it is and what it holds.

    cuda: None = when nvcc and the CUDA sources are present; False = never;
    True = try (a failure still only skips the CUDA part, with a warning).
    Raises BuildError when the CPU part cannot be built.
    """
    out_dir = os.path.abspath(out_dir or DEFAULT_OUT_DIR)
    build_dir = os.path.abspath(build_dir or DEFAULT_BUILD_DIR)
    out = os.path.join(out_dir, LIB_NAME)
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise BuildError(f"C++ compiler {cxx!r} not found")
    tf = tf_config()
    skipped: dict = {}

    nvcc = cuda_home = None
    if cuda is False or os.environ.get("KERAS_ECOC_NO_CUDA", "").lower() in ("1", "true", "yes"):
        skipped["cuda"] = "disabled (--no-cuda / KERAS_ECOC_NO_CUDA)"
        with_cuda = False
    else:
        nvcc, cuda_home, reason = find_cuda()
        with_cuda = cuda_home is not None
        if not with_cuda:
            skipped["cuda"] = reason
    shim_dir = _make_shim(build_dir, cuda_home) if with_cuda else ""
    archs = cuda_archs() if with_cuda else []
    versions = toolchain_versions(tf["version"], cxx, nvcc if with_cuda else None)
    # Embedded in the library: the loader refuses it under another TensorFlow.
    # (The CUDA architectures are embedded by the CUDA probe object itself, so
    # that they are in the library only when its CUDA part was linked.)
    info = {"tensorflow": tf["version"], "cxx": versions["cxx"], "nvcc": versions["nvcc"]}
    build_info_src = write_build_info(build_dir, info)
    units = _units(tf, cxx, nvcc, cuda_home, xla, with_cuda, shim_dir, skipped, toolchain=versions,
                   archs=archs, build_info_src=build_info_src)

    toolchain = {**versions, "lflags": tf["lflags"], "archs": archs,
                 "python": sys.version.split()[0], "build.py": _sha(_read(__file__))[:16]}
    stamp = {"units": {u.name: u.key() for u in units}, "toolchain": toolchain,
             "skipped": sorted(skipped)}
    cached = None if force else _up_to_date(out, build_dir, stamp)
    if cached is not None:
        _log(f"{out} is up to date (TensorFlow {tf['version']})", verbose)
        return cached

    obj_dir = os.path.join(build_dir, "obj")
    os.makedirs(obj_dir, exist_ok=True)
    jobs = jobs or int(os.environ.get("KERAS_ECOC_BUILD_JOBS", "0")) or min(4, os.cpu_count() or 1)
    _log(f"building {LIB_NAME} for TensorFlow {tf['version']} with {jobs} job(s): "
         + ", ".join(os.path.basename(u.src) + ("" if u.part == "cpu" else f" [{u.part}]") for u in units),
         verbose)
    objs: dict = {}
    failed: dict = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        for unit, obj, msg in ex.map(lambda u: _compile(u, obj_dir, verbose), units):
            if obj is None:
                failed.setdefault(unit.part, []).append((unit, msg))
            else:
                objs[unit.name] = (unit, obj)
    if "cpu" in failed:
        details = "\n".join(f"--- {os.path.basename(u.src)}:\n{m[-6000:]}" for u, m in failed["cpu"])
        raise BuildError(f"the CPU kernels failed to compile:\n{details}")
    for part in ("xla", "cuda"):
        if part in failed:
            # Drop every object of a failed part (e.g. the GPU OpKernels when
            # the nvcc object is missing), or the library would not load.
            objs = {name: (u, obj) for name, (u, obj) in objs.items() if u.part != part}
            names = ", ".join(os.path.basename(u.src) for u, _ in failed[part])
            last = failed[part][0][1].strip().splitlines()
            errors = [line for line in last if "error" in line.lower()][:5] or last[-5:]
            skipped[part] = f"{names} failed to compile: " + " | ".join(errors)
            _warn(f"building without the {part.upper()} part: {skipped[part]}")
            for u, m in failed[part]:
                _log(f"{os.path.basename(u.src)} compiler output:\n{m[-4000:]}", verbose)

    def link(parts: set) -> tuple[int, str, str]:
        chosen = [obj for (u, obj) in objs.values() if u.part in parts]
        cmd = [cxx, "-shared", "-o", None, *chosen, *tf["lflags"]]
        if "xla" in parts:
            cmd.append("-l:libtensorflow_cc.so.2")
        if "cuda" in parts:
            cmd += [f"-L{_cudart_dir(cuda_home)}", "-l:libcudart_static.a", "-ldl", "-lrt", "-lpthread"]
        os.makedirs(out_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=".so", dir=out_dir)
        os.close(fd)
        cmd[3] = tmp
        rc, msg = _run(cmd)
        return rc, msg, tmp

    parts = {u.part for (u, _) in objs.values()}
    while True:
        rc, msg, tmp = link(parts)
        what = "link failed"
        if rc == 0:
            rc, msg = _check_loads(tmp)
            what = "the linked library does not load"
            if rc == 0:
                break
        os.remove(tmp)
        optional = [p for p in ("cuda", "xla") if p in parts]
        if not optional:
            raise BuildError(f"{what}:\n{msg[-6000:]}")
        drop = optional[0]
        skipped[drop] = f"{what}: " + " | ".join(msg.strip().splitlines()[-3:])
        _warn(f"building without the {drop.upper()} part: {skipped[drop]}")
        parts.discard(drop)
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    ordered = [p for p in ("cpu", "xla", "cuda") if p in parts]
    os.makedirs(os.path.dirname(_stamp_path(out, build_dir)), exist_ok=True)
    held_archs = cuda_arch_names(archs) if "cuda" in parts else None
    with open(_stamp_path(out, build_dir), "w") as f:
        json.dump({"stamp": stamp, "parts": ordered, "skipped_reasons": skipped,
                   "tensorflow": tf["version"], "out": out, "cuda_archs": held_archs}, f, indent=1)
    result = BuildResult(out, ordered, skipped, False, held_archs)
    _log("built " + result.summary(), verbose)
    return result


def _kernel_units(cxx: str, nvcc: str | None, cuda_home: str | None, with_cuda: bool, toolchain: dict,
                  archs: list) -> list:
    """Compile units of the framework-free kernel library (no TensorFlow flags)."""
    host_tc = f"cxx={toolchain.get('cxx')}"
    src = lambda rel: os.path.join(KERNELS_DIR, rel)  # noqa: E731
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")
    base = [cxx, "-std=c++17", "-fPIC", "-O3", "-DNDEBUG", *CXX_WARNINGS, f"-I{KERNELS_DIR}",
            "-isystem", FFI_INCLUDE]
    math = [*base, "-fno-math-errno", "-ffp-contract=fast", "-fno-exceptions"]
    units = [
        _Unit("ffi_cpu", src(FFI_CPU_SRC), base + (["-DECOC_HAVE_AVX2_VARIANT"] if x86 else []), "cpu",
              deps=CPU_HEADERS + FFI_HEADERS, toolchain=host_tc),
        _Unit("kmath_base", src(MATH_SRC),
              math + ["-DECOC_CPU_GETTER=GetKernelsBase", '-DECOC_CPU_ISA_NAME="base"'], "cpu",
              deps=CPU_HEADERS, toolchain=host_tc),
    ]
    if x86:
        units.append(_Unit("kmath_avx2", src(MATH_SRC),
                           math + ["-mavx2", "-mfma", "-DECOC_CPU_GETTER=GetKernelsAvx2",
                                   '-DECOC_CPU_ISA_NAME="avx2"'], "cpu", deps=CPU_HEADERS, toolchain=host_tc))
    if with_cuda:
        cuda_tc = f"{host_tc} nvcc={toolchain.get('nvcc')}"
        units.append(_Unit("ffi_cuda", src(FFI_CUDA_SRC), base + [f"-I{os.path.join(cuda_home, 'include')}"],
                           "cuda", deps=_cuda_headers() + FFI_HEADERS + (FFI_WORKSPACE_HEADER,),
                           toolchain=cuda_tc))
        units.append(_cuda_kernels_unit(nvcc, archs, toolchain))
    return units


def _cuda_headers() -> tuple:
    """The CUDA headers (relative to kernels/) whose contents key the CUDA objects."""
    return tuple(os.path.join(CUDA_HEADER_DIR, f)
                 for f in sorted(os.listdir(os.path.join(KERNELS_DIR, CUDA_HEADER_DIR)))
                 if f.endswith((".h", ".cuh")))


def _cuda_kernels_unit(nvcc: str, archs: list, toolchain: dict) -> _Unit:
    """cuda/ecoc_kernels.cu.cc, compiled once for both libraries.

    The command, headers and toolchain string are identical for the kernel
    library and the TensorFlow op library, so the second build finds the first
    one's object in build/obj: nvcc over every architecture is the slowest
    step of an install (it ran twice before).
    """
    return _Unit("kcuda", os.path.join(KERNELS_DIR, CUDA_SRC), [
        nvcc, "-std=c++17", "-x", "cu", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
        "-Xcompiler", "-fPIC", *nvcc_thread_flags(len(archs)), *cuda_gencode_flags(archs),
        f"-I{KERNELS_DIR}"], "cuda", compiler="nvcc", deps=_cuda_headers(),
        toolchain=f"cxx={toolchain.get('cxx')} nvcc={toolchain.get('nvcc')}")


def cuda_kernels_object(build_dir: str | None = None) -> str | None:
    """The object of cuda/ecoc_kernels.cu.cc (every architecture of
    :func:`cuda_archs`) that a build left for today's sources and toolchain,
    or None: tests that link the kernels into a program (the harness) take it
    instead of running nvcc over the kernels again."""
    nvcc, cuda_home, _ = find_cuda()
    if cuda_home is None:
        return None
    versions = toolchain_versions("", os.environ.get("CXX", "g++"), nvcc)  # "tf" is unused here
    unit = _cuda_kernels_unit(nvcc, cuda_archs(), versions)
    obj = os.path.join(os.path.abspath(build_dir or DEFAULT_BUILD_DIR), "obj",
                       f"{unit.name}-{unit.key()}.o")
    return obj if os.path.exists(obj) else None


def _check_kernels_load(path: str) -> tuple[int, str]:
    """Loads the kernel library with ctypes in a fresh interpreter."""
    code = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
            "[getattr(lib, s) for s in ('KerasEcocFfiForward', 'KerasEcocFfiCodesGrad', "
            "'KerasEcocFfiLabelRank', 'KerasEcocFfiNearest', 'KerasEcocCpuForward')]")
    try:
        proc = subprocess.run([sys.executable, "-c", code, path], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return 1, "timed out loading the library"
    return proc.returncode, proc.stdout


def build_kernels(out_dir: str | None = None, *, cuda: bool | None = None, force: bool = False,
                  verbose: bool = True, jobs: int | None = None,
                  build_dir: str | None = None) -> BuildResult:
    """Builds (or reuses) the framework-free kernel library ``_ecoc_kernels.so``.

    Needs g++ only (no TensorFlow, JAX or PyTorch). cuda: as in
    :func:`build_library`; the CUDA part is linked only when the CUDA kernels
    compile without TensorFlow and define every v2 entry point the FFI
    handlers call (the link uses --no-undefined), else it is skipped with a
    warning. Raises BuildError when the CPU part cannot be built.
    """
    out_dir = os.path.abspath(out_dir or DEFAULT_OUT_DIR)
    build_dir = os.path.abspath(build_dir or DEFAULT_BUILD_DIR)
    out = os.path.join(out_dir, KERNELS_LIB_NAME)
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise BuildError(f"C++ compiler {cxx!r} not found")
    skipped: dict = {}
    nvcc = cuda_home = None
    if cuda is False or os.environ.get("KERAS_ECOC_NO_CUDA", "").lower() in ("1", "true", "yes"):
        skipped["cuda"] = "disabled (--no-cuda / KERAS_ECOC_NO_CUDA)"
    else:
        nvcc, cuda_home, reason = find_cuda()
        if cuda_home is None:
            skipped["cuda"] = reason
    with_cuda = cuda_home is not None and "cuda" not in skipped
    archs = cuda_archs() if with_cuda else []
    versions = {"cxx": _tool_version(cxx, first=True), "nvcc": _tool_version(nvcc) if with_cuda else None}
    units = _kernel_units(cxx, nvcc, cuda_home, with_cuda, versions, archs)
    stamp = {"units": {u.name: u.key() for u in units}, "toolchain": {**versions, "archs": archs},
             "skipped": sorted(skipped), "build.py": _sha(_read(__file__))[:16]}
    stamp_path = _stamp_path(out, build_dir)
    cached = None if force else _up_to_date(out, build_dir, stamp)
    if cached is not None:
        _log(f"{out} is up to date", verbose)
        return cached
    obj_dir = os.path.join(build_dir, "obj")
    os.makedirs(obj_dir, exist_ok=True)
    jobs = jobs or int(os.environ.get("KERAS_ECOC_BUILD_JOBS", "0")) or min(4, os.cpu_count() or 1)
    _log(f"building {KERNELS_LIB_NAME} with {jobs} job(s): "
         + ", ".join(os.path.basename(u.src) + ("" if u.part == "cpu" else f" [{u.part}]") for u in units),
         verbose)
    objs, failed = {}, {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        for unit, obj, msg in ex.map(lambda u: _compile(u, obj_dir, verbose), units):
            if obj is None:
                failed.setdefault(unit.part, []).append((unit, msg))
            else:
                objs[unit.name] = (unit, obj)
    if "cpu" in failed:
        details = "\n".join(f"--- {os.path.basename(u.src)}:\n{m[-6000:]}" for u, m in failed["cpu"])
        raise BuildError(f"the CPU kernels (kernel library) failed to compile:\n{details}")
    if "cuda" in failed:
        objs = {name: (u, obj) for name, (u, obj) in objs.items() if u.part != "cuda"}
        lines = failed["cuda"][0][1].strip().splitlines()
        errors = [line for line in lines if "error" in line.lower()][:5] or lines[-5:]
        skipped["cuda"] = (", ".join(os.path.basename(u.src) for u, _ in failed["cuda"])
                           + " failed to compile: " + " | ".join(errors))
        _warn(f"building {KERNELS_LIB_NAME} without the CUDA part: {skipped['cuda']}")

    def link(parts: set) -> tuple[int, str, str]:
        chosen = [obj for (u, obj) in objs.values() if u.part in parts]
        cmd = [cxx, "-shared", "-o", None, *chosen, "-Wl,--no-undefined", "-lpthread"]
        if "cuda" in parts:
            cmd += [f"-L{_cudart_dir(cuda_home)}", "-l:libcudart_static.a", "-ldl", "-lrt"]
        os.makedirs(out_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=".so", dir=out_dir)
        os.close(fd)
        cmd[3] = tmp
        rc, msg = _run(cmd)
        if rc == 0:
            rc, msg = _check_kernels_load(tmp)
        return rc, msg, tmp

    parts = {u.part for (u, _) in objs.values()}
    while True:
        rc, msg, tmp = link(parts)
        if rc == 0:
            break
        if os.path.exists(tmp):  # g++ removes its output when the link fails
            os.remove(tmp)
        if "cuda" not in parts:
            raise BuildError(f"the kernel library does not link or load:\n{msg[-6000:]}")
        undefined = sorted(set(re.findall(r"undefined reference to `([^']+)'", msg)))
        skipped["cuda"] = ("link failed" + (": the CUDA kernels do not define " + ", ".join(undefined[:4])
                                            if undefined else ": " + " | ".join(msg.strip().splitlines()[-3:])))
        _warn(f"building {KERNELS_LIB_NAME} without the CUDA part: {skipped['cuda']}")
        parts.discard("cuda")
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    ordered = [p for p in ("cpu", "cuda") if p in parts]
    held_archs = cuda_arch_names(archs) if "cuda" in parts else None
    os.makedirs(os.path.dirname(stamp_path), exist_ok=True)
    with open(stamp_path, "w") as f:
        json.dump({"stamp": stamp, "parts": ordered, "skipped_reasons": skipped, "out": out,
                   "cuda_archs": held_archs}, f, indent=1)
    result = BuildResult(out, ordered, skipped, False, held_archs)
    _log("built " + result.summary(), verbose)
    return result


def build_all(out_dir: str | None = None, *, cuda: bool | None = None, xla: bool = True,
              force: bool = False, verbose: bool = True, jobs: int | None = None,
              build_dir: str | None = None) -> dict:
    """The kernel library, then the TensorFlow op library when TensorFlow imports.

    Returns {"kernels": BuildResult | BuildError, "ops": BuildResult |
    BuildError | None (no TensorFlow)}; never raises for a failed build (the
    package falls back at import), so each failure is also warned about.
    """
    results: dict = {}
    kw = dict(cuda=cuda, force=force, verbose=verbose, jobs=jobs, build_dir=build_dir)
    try:
        results["kernels"] = build_kernels(out_dir, **kw)
    except BuildError as e:
        _warn(f"{KERNELS_LIB_NAME} not built: {e}")
        results["kernels"] = e
    try:
        import tensorflow  # noqa: F401, PLC0415
    except Exception:  # noqa: BLE001 - no (working) TensorFlow: no op library
        results["ops"] = None
        _log(f"TensorFlow does not import: {LIB_NAME} (the TensorFlow op library) is not built", verbose)
        return results
    try:
        results["ops"] = build_library(out_dir, xla=xla, **kw)
    except BuildError as e:
        _warn(f"{LIB_NAME} not built: {e}")
        results["ops"] = e
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help=f"output directory (default {DEFAULT_OUT_DIR})")
    p.add_argument("--build-dir", default=None, help=f"object cache (default {DEFAULT_BUILD_DIR})")
    p.add_argument("--no-cuda", action="store_true", help="do not build the CUDA kernels")
    p.add_argument("--no-xla", action="store_true", help="do not build the XLA lowerings")
    p.add_argument("--force", action="store_true", help="relink even when up to date")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel compile jobs")
    p.add_argument("-q", "--quiet", action="store_true")
    a = p.parse_args(argv)
    results = build_all(a.out, cuda=False if a.no_cuda else None, xla=not a.no_xla, force=a.force,
                        verbose=not a.quiet, jobs=a.jobs, build_dir=a.build_dir)
    rc = 0
    for name, r in results.items():
        if isinstance(r, BuildError):
            print(f"[keras-ecoc build] FAILED ({name}): {r}", file=sys.stderr)
            rc = 1
        elif r is not None:
            print(r.summary())
    return rc


if __name__ == "__main__":
    sys.exit(main())
