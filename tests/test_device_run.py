"""The GPU-run plumbing without a GPU: benchmarks/device_run.sh,
`bench_streaming.py --device gpu` and the DEVICE_CHECK_T_* step limits of
kernels/cuda/device_check.sh.

The numbers themselves need a GPU machine; these tests pin down what must hold
anywhere: a missing GPU is said in one clear line (no traceback), every phase
gets a summary row, the GPU run never touches docs/benchmarks.md, bad limits
are refused. Backend-independent, so they run on the TensorFlow pass only.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import keras

REPO = Path(__file__).resolve().parents[1]
DEVICE_CHECK = REPO / "kernels" / "cuda" / "device_check.sh"
DEVICE_RUN = REPO / "benchmarks" / "device_run.sh"
BENCH = REPO / "benchmarks" / "bench_streaming.py"

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="backend-independent scripts: run once, on the TF pass")


def _no_gpu_or_skip():
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine may have a GPU: run benchmarks/device_run.sh itself")


def test_device_check_takes_step_limits_from_the_environment():
    env = dict(os.environ, DEVICE_CHECK_T_GRID="60", DEVICE_CHECK_T_BUILD="45")
    proc = subprocess.run(["bash", str(DEVICE_CHECK), "--dry-run"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "step grid (<= 60 s)" in proc.stdout and "step build (<= 45 s)" in proc.stdout
    assert "step checks (<= 45 s)" in proc.stdout  # the default where none is given


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5"])
def test_device_check_rejects_a_step_limit_that_is_not_a_positive_integer(value):
    env = dict(os.environ, DEVICE_CHECK_T_MEMCHECK=value)
    proc = subprocess.run(["bash", str(DEVICE_CHECK), "--dry-run"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 3
    assert "DEVICE_CHECK_T_MEMCHECK must be a positive integer" in proc.stderr
    assert f"Received: DEVICE_CHECK_T_MEMCHECK={value}" in proc.stderr


def test_device_run_script_parses():
    assert os.access(DEVICE_RUN, os.X_OK), "device_run.sh must be executable"
    proc = subprocess.run(["bash", "-n", str(DEVICE_RUN)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_bench_gpu_mode_without_a_gpu_says_so_and_leaves_the_docs_alone(tmp_path):
    _no_gpu_or_skip()
    docs = REPO / "docs" / "benchmarks.md"
    before = docs.read_bytes()
    out = tmp_path / "gpu.md"
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "gpu", "--quick",
                           "--out", str(out)], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "bench_streaming --device gpu: no GPU for any of --backends=jax,torch" in proc.stderr
    text = out.read_text()
    assert text.startswith("<!-- bench_streaming_gpu:begin -->") and "no GPU: nothing measured" in text
    state = json.loads((tmp_path / "gpu.json").read_text())
    assert state["grid"] == [] and state["status"] == "no GPU: nothing measured"
    assert docs.read_bytes() == before


def test_bench_rejects_an_unknown_backend():
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "gpu", "--backends", "tf"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Argument `--backends` must be a comma-separated subset of jax,torch" in proc.stderr


@pytest.mark.slow
def test_device_run_without_a_gpu_reports_every_phase_and_exits_zero(tmp_path):
    # About 20 s on 2 cores: two keras imports and the benchmark's probe.
    _no_gpu_or_skip()
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable, WHEEL_DIR=str(tmp_path / "none"),
               SITE_DIR=str(tmp_path / "site"), JAX_PLATFORMS="cpu")
    proc = subprocess.run(["bash", str(DEVICE_RUN)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = (out / "summary.md").read_text()
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1]
            for line in summary.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows == {"phase": "status", "info": "pass", "wheels": "FAIL", "import-jax": "pass",
                    "import-torch": "pass", "kernels": "NO GPU", "bench": "NO GPU"}, summary
    assert "no wheels in" in (out / "device_run.log").read_text()
    assert len(list(out.iterdir())) <= 8  # what the device tool returns at most
