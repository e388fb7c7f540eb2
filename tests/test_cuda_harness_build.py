"""Builds the stand-alone CUDA harness (kernels/cuda/harness.cu) with nvcc and runs it.

Skipped where nvcc is not on the PATH.  Without a GPU the harness must say so
and exit with code 2; with one, every check must pass (exit 0).  The build
targets sm_80 only to keep it short, but still takes 30-150 s depending on
the machine, hence ``slow``.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CUDA_DIR = REPO / "kernels" / "cuda"
NVCC = shutil.which("nvcc")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NVCC is None, reason="nvcc is not on the PATH"),
]


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
    cmd = [
        NVCC,
        "-O2",
        "-std=c++17",
        "--expt-relaxed-constexpr",
        "-gencode=arch=compute_80,code=sm_80",
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


def test_harness_rejects_unknown_flags(harness):
    proc = subprocess.run(
        [str(harness), "--no-such-flag"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3
    assert "usage:" in proc.stderr
