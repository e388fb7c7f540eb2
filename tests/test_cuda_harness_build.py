"""Builds the stand-alone CUDA harness (kernels/cuda/harness.cu) with nvcc and runs it,
and checks what of kernels/cuda/device_check.sh can run without a GPU.

The harness is built for every architecture the op library is built for
(kernels/build.py: SASS sm_75/80/86/89/90 + compute_90 PTX), with OpenMP as
device_check.sh builds it; skipped where nvcc is not on the PATH. Without a GPU
every mode must say so and exit with code 2; with one, every check must pass
(exit 0). The build takes minutes on 2 cores, hence ``slow``; the
device_check.sh tests are fast and need no nvcc.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CUDA_DIR = REPO / "kernels" / "cuda"
DEVICE_CHECK = CUDA_DIR / "device_check.sh"
NVCC = shutil.which("nvcc")

def _build_module():
    spec = importlib.util.spec_from_file_location("_ecoc_build_for_tests", REPO / "kernels" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _gpu_present() -> bool:
    """Whether this machine has an NVIDIA GPU, decided without the harness."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("ecoc_harness") / "ecoc_harness"
    build = _build_module()
    archs = build.cuda_archs()
    cmd = [
        NVCC,
        "-O2",
        "-std=c++17",
        "--expt-relaxed-constexpr",
        *build.nvcc_thread_flags(len(archs)),
        *build.cuda_gencode_flags(archs),
        "-Xcompiler",
        "-fopenmp",
        f"-I{REPO / 'kernels'}",
        # The kernels live in a .cu.cc file; without -x cu nvcc would hand it
        # to the host compiler.
        "-x",
        "cu",
        str(CUDA_DIR / "harness.cu"),
        str(CUDA_DIR / "ecoc_kernels.cu.cc"),
        "-o",
        str(exe),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stdout}\n{proc.stderr}"
    assert exe.exists()
    return exe


def _assert_no_gpu_or_pass(proc, min_passes):
    output = proc.stdout + proc.stderr
    if _gpu_present():
        assert proc.returncode == 0, output
        assert not [line for line in proc.stdout.splitlines() if line.startswith("FAIL ")], output
        assert len([line for line in proc.stdout.splitlines() if line.startswith("PASS ")]) >= min_passes
        assert " 0 failed" in proc.stdout, output
    else:
        assert proc.returncode == 2, output
        assert "no CUDA device available" in proc.stdout, output
        assert "PASS" not in proc.stdout and "FAIL" not in proc.stdout, output


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_harness_checks(harness):
    proc = subprocess.run(
        [str(harness), "--check-only"], capture_output=True, text=True, timeout=900
    )
    output = proc.stdout + proc.stderr
    if _gpu_present():
        assert proc.returncode == 0, output
        pass_lines = [line for line in proc.stdout.splitlines() if line.startswith("PASS ")]
        fail_lines = [line for line in proc.stdout.splitlines() if line.startswith("FAIL ")]
        assert not fail_lines, output
        assert len(pass_lines) >= 100, output
        assert "0 failed" in proc.stdout, output
    else:
        assert proc.returncode == 2, output
        assert "no CUDA device available" in proc.stdout, output
        assert "PASS" not in proc.stdout and "FAIL" not in proc.stdout, output


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_harness_holds_every_architecture_of_the_library(harness):
    build = _build_module()
    home = build.find_cuda()[1]
    listing = shutil.which("cuobjdump") or (home and os.path.join(home, "bin", "cuobjdump"))
    if not listing or not Path(listing).exists():
        pytest.skip("cuobjdump is not installed with this CUDA toolkit: the build above used "
                    "every -gencode flag, but what the fatbinary holds cannot be listed")
    elf = subprocess.run([str(listing), "--list-elf", str(harness)], capture_output=True, text=True)
    ptx = subprocess.run([str(listing), "--list-ptx", str(harness)], capture_output=True, text=True)
    for arch in build.cuda_archs():
        assert f"sm_{arch}" in elf.stdout, elf.stdout
    assert f"sm_{build.cuda_archs()[-1]}" in ptx.stdout, ptx.stdout


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("mode, min_passes", [("--small", 50), ("--smem-limit", 4)])
def test_harness_grid_modes(harness, mode, min_passes):
    proc = subprocess.run([str(harness), mode], capture_output=True, text=True, timeout=900)
    _assert_no_gpu_or_pass(proc, min_passes)


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH")
def test_harness_rejects_unknown_flags(harness):
    proc = subprocess.run(
        [str(harness), "--no-such-flag"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3
    assert "usage:" in proc.stderr
    proc = subprocess.run([str(harness), "--grid", "--small"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "at most one of" in proc.stderr


# ---------------------------------------------------------------------------
# kernels/cuda/device_check.sh without a GPU (fast, no nvcc needed).

def test_device_check_script_parses_and_dry_runs_every_step(tmp_path):
    assert os.access(DEVICE_CHECK, os.X_OK), "device_check.sh must be executable"
    assert subprocess.run(["bash", "-n", str(DEVICE_CHECK)]).returncode == 0
    proc = subprocess.run(["bash", str(DEVICE_CHECK), "--dry-run"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, OUT=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    steps = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert steps == ["build", "checks", "grid", "smem-limit", "memcheck", "racecheck", "bench"]
    limits = [int(line.split("(<= ")[1].split(" s)")[0]) for line in proc.stdout.splitlines()
              if line.startswith("step ")]
    assert sum(limits) <= 480, limits  # one run of at most 8 minutes
    assert str(tmp_path / "device_check.md") in proc.stdout
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


def test_device_check_without_gpu_says_so_and_runs_nothing(tmp_path):
    if _gpu_present():
        pytest.skip("this machine has a GPU: run kernels/cuda/device_check.sh itself")
    proc = subprocess.run(["bash", str(DEVICE_CHECK)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, OUT=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    assert "no GPU" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_device_check_rejects_unknown_arguments():
    proc = subprocess.run(["bash", str(DEVICE_CHECK), "--frobnicate"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 3 and "unknown argument" in proc.stderr
