"""Smoke test of benchmarks/bench_fused_op.py --quick.

One worker subprocess: about 25 s of CPU (TensorFlow import, one XLA compile,
two tiny model.fit runs); the wall time depends on the load of the machine.
"""

import os
import subprocess
import sys

import pytest

import keras

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_benchmark_quick_runs(tmp_path):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the benchmark is TensorFlow-only")
    from keras_ecoc import ops as eops

    methods = "fused,eager,xla,onehot" if eops.fused_available() else "eager,xla,onehot"
    out = tmp_path / "bench.md"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_fused_op.py"), "--quick",
         "--methods", methods, "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = out.read_text()
    assert "| B | k | n |" in text and "| 16 | 32 | 1000 |" in text
    assert "model.fit" in text and "error" not in text.split("## Forward")[1]
