"""Can the library's CUDA kernels run on this GPU? (pure decision logic)

The fused op registers CUDA kernels for ``DEVICE_GPU``, so TensorFlow sends
every non-XLA call on a visible GPU to them. Three things make such a launch
fail with an ``InternalError`` that can be predicted before the first call:

* no kernel image: the library holds SASS for some architectures and PTX for
  the newest; SASS sm_XY runs on compute capability X.Y' with Y' >= Y (same
  major), PTX compute_XY is JIT-compiled by the driver for any capability
  >= X.Y;
* driver too old: the static CUDA runtime linked into the library needs a
  driver of at least its major version (CUDA's minor-version compatibility),
  and JIT-compiling PTX needs a driver at least as new as the runtime;
* shared memory too small: the split kernels stream the code length in
  column stages sized to the card (see kernels/cuda/README.md), so every k up
  to 2^24 runs once the smallest stage (8 columns) fits the card's opt-in
  shared memory per block, about 7 KB; every CUDA card has at least 48 KiB.
  Longer codes than 2^24 are refused by the kernels' contract.

This module has no TensorFlow or CUDA dependency: `_loader.py` feeds it what
the probe in the library (kernels/cuda/ecoc_probe.cu.cc) reports, or what
``$KERAS_ECOC_SIMULATE_GPU`` pretends, so that every failure can be tested on
a machine without a GPU.
"""

from __future__ import annotations

import dataclasses
import re

SIMULATE_ENV = "KERAS_ECOC_SIMULATE_GPU"

# Mirrors kernels/cuda/ecoc_kernels.cu.cc (ChooseChunks) and the *SmemFloats
# formulas of ecoc_forward.cuh / ecoc_codes_grad.cuh / ecoc_decode.cuh at their
# smallest launch: one 8-column stage, double-buffered, for a tile of 16 rows
# and 32 classes (row pitch 8 + 4 floats), the 16 x 36 logit tile, and 32
# floats more (forward: 2 x 16 row scalars; codes gradient: the class tile's
# 32 logit terms), so both cross-entropy passes need the same.
# kernels/cuda/harness.cu --smem-limit checks these numbers against the real
# launchers on a GPU.
_ROW_TILE = 16
_CLASS_TILE = 32
_MIN_STAGE_COLUMNS = 8
_S_PITCH = _CLASS_TILE + 4
MAX_CODE_LENGTH = 1 << 24  # ecoc_kernels.h: larger code lengths are refused

# Used by the simulation for anything the spec does not set: an H100.
_SIM_DEFAULTS = {"cc": (9, 0), "smem": 232448, "name": "simulated GPU"}


def shared_memory_bytes(code_length: int, op: str = "cross_entropy") -> int:
    """Bytes of shared memory the smallest launch of `op`'s kernels needs.

    The same for every code length up to MAX_CODE_LENGTH (longer codes run in
    more column stages, not in more shared memory). op: "cross_entropy"
    (forward and codes gradient, the larger need) or "decode" (label rank and
    nearest codeword).
    """
    if op not in ("cross_entropy", "decode"):
        raise ValueError(f"Argument `op` must be 'cross_entropy' or 'decode'. Received: op={op!r}")
    del code_length  # the launchers pick the stage width from the card
    stage = 2 * (_ROW_TILE + _CLASS_TILE) * (_MIN_STAGE_COLUMNS + 4)
    floats = stage + _ROW_TILE * _S_PITCH + (2 * _ROW_TILE if op == "cross_entropy" else 0)
    return 4 * floats


def max_code_length(smem_bytes: int, op: str = "cross_entropy") -> int:
    """Largest code length the kernels run with `smem_bytes` per block (-1: none)."""
    return MAX_CODE_LENGTH if shared_memory_bytes(0, op) <= smem_bytes else -1


def parse_archs(text: str | None) -> tuple[list, list]:
    """"sm_75,sm_90,compute_90" -> ([(7, 5), (9, 0)], [(9, 0)])."""
    sass, ptx = [], []
    for item in (text or "").split(","):
        m = re.fullmatch(r"(sm|compute)_(\d+)(\d)a?", item.strip())
        if m:
            (sass if m.group(1) == "sm" else ptx).append((int(m.group(2)), int(m.group(3))))
    return sass, ptx


def arch_coverage(archs: str | None, cc: tuple) -> tuple[str | None, str]:
    """How the library runs on compute capability `cc`: ("sass"|"ptx"|None, detail)."""
    sass, ptx = parse_archs(archs)
    fits = [a for a in sass if a[0] == cc[0] and a[1] <= cc[1]]
    if fits:
        return "sass", f"SASS sm_{fits[-1][0]}{fits[-1][1]}"
    jit = [a for a in ptx if a <= tuple(cc)]
    if jit:
        return "ptx", f"PTX compute_{jit[-1][0]}{jit[-1][1]}, JIT-compiled by the driver"
    return None, ""


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


@dataclasses.dataclass
class Device:
    """What the probe (or the simulation) says about one GPU."""

    cc: tuple  # (major, minor)
    driver: int  # cudaDriverGetVersion, e.g. 12040; 0 = no driver
    smem_optin: int  # bytes per block
    name: str = "GPU 0"
    # cudaFuncGetAttributes on the probe kernel: None when not asked (the
    # simulation), "" when an image loads, else the CUDA error name.
    image_error: str | None = None
    simulated: bool = False


def parse_simulation(spec: str, runtime_version: int) -> Device:
    """$KERAS_ECOC_SIMULATE_GPU, e.g. "cc=7.0", "driver=11000", "smem=1024".

    Keys may be combined with commas; unset keys describe an H100 whose driver
    matches the runtime.
    """
    values = {"cc": _SIM_DEFAULTS["cc"], "driver": runtime_version, "smem": _SIM_DEFAULTS["smem"]}
    for part in spec.split(","):
        part = part.strip()
        if not part or part in ("1", "true", "yes", "on"):
            continue
        key, _, value = part.partition("=")
        key = key.strip().lower()
        try:
            if key == "cc":
                major, _, minor = value.strip().partition(".")
                values["cc"] = (int(major), int(minor or 0))
            elif key in ("driver", "smem"):
                values[key] = int(value)
            else:
                raise ValueError(key)
        except ValueError:
            raise ValueError(
                f"Environment variable `{SIMULATE_ENV}` must be comma-separated key=value pairs "
                "with keys cc (e.g. 7.5), driver (e.g. 12040) and smem (bytes, e.g. 101376). "
                f"Received: {SIMULATE_ENV}={spec!r}"
            ) from None
    return Device(cc=values["cc"], driver=values["driver"], smem_optin=values["smem"],
                  name=f"{_SIM_DEFAULTS['name']} (cc {values['cc'][0]}.{values['cc'][1]})",
                  simulated=True)


def device_problem(device: Device, archs: str | None, runtime_version: int) -> str | None:
    """Why the kernels cannot run on `device` at all (None: they can)."""
    cc = f"{device.cc[0]}.{device.cc[1]}"
    how, _ = arch_coverage(archs, device.cc)
    if how is None or device.image_error:
        got = f" ({device.image_error})" if device.image_error else ""
        hint = ("CUDA 13 cannot compile for it" if tuple(device.cc) < (7, 5) else
                "rebuild on this machine with `python kernels/build.py --force`, which adds the "
                "visible GPU's architecture")
        return (f"no kernel image for {device.name}{got}: compute capability {cc} is not covered by "
                f"the library's CUDA architectures {archs} ({hint})")
    need_major = runtime_version // 1000 * 1000
    need = runtime_version if how == "ptx" else need_major
    if device.driver < need:
        why = ("JIT-compiling the PTX needs a driver at least as new as the runtime"
               if how == "ptx" and device.driver >= need_major else
               "the static CUDA runtime needs a driver of at least its major version")
        return (f"driver too old on {device.name}: it supports CUDA {_cuda_version(device.driver)} "
                f"(cudaDriverGetVersion = {device.driver}) but the kernels were built with the CUDA "
                f"{_cuda_version(runtime_version)} runtime; {why} (CUDA {_cuda_version(need)}), "
                "so update the NVIDIA driver")
    return None


def code_length_too_large(code_length: int) -> str | None:
    """Why no card runs code length k (None: within the kernels' limit)."""
    if code_length > MAX_CODE_LENGTH:
        return (f"code length too large: code_length={code_length} exceeds the CUDA kernels' "
                f"limit of {MAX_CODE_LENGTH} (2^24)")
    return None


def code_length_problem(device: Device, code_length: int, op: str = "cross_entropy") -> str | None:
    """Why the kernels cannot run code length k on `device` (None: they can)."""
    too_large = code_length_too_large(code_length)
    if too_large:
        return too_large
    need = shared_memory_bytes(code_length, op)
    if need <= device.smem_optin:
        return None
    return (f"shared memory too small on {device.name}: the kernels need {need} bytes per "
            f"block for any code length but the card allows {device.smem_optin}")
