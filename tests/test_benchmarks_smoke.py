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


def test_regenerated_report_keeps_the_contents_block_and_the_later_sections():
    # bench_fused_op.py rewrites only its own head of docs/benchmarks.md: the
    # hand-written contents block moves to the new head, right after the
    # title, and everything from bench_streaming.py's marker on stays as it was.
    from conftest import load_script

    bench = load_script(os.path.join(ROOT, "benchmarks", "bench_fused_op.py"), "bench_fused_op")
    begin, end = bench.CONTENTS_MARKERS
    old = (f"# Benchmarks of the fused ECOC op\n\n{begin}\n- [where](#x)\n{end}\n\n"
           "Generated on day 1.\n\n| old | table |\n\n"
           f"{bench.STREAMING_MARKER}\nstreaming section\n<!-- bench_scale:begin -->\nscale\n")
    new = bench.merge_report("# Benchmarks of the fused ECOC op\n\nGenerated on day 2.\n\n"
                             "| new | table |\n", old)
    assert new == (f"# Benchmarks of the fused ECOC op\n\n{begin}\n- [where](#x)\n{end}\n\n"
                   "Generated on day 2.\n\n| new | table |\n\n"
                   f"{bench.STREAMING_MARKER}\nstreaming section\n<!-- bench_scale:begin -->\n"
                   "scale\n")
    # A first run (no file yet) and a file without the block write the report alone.
    assert bench.merge_report("# T\n\nbody\n", None) == "# T\n\nbody\n"
    assert bench.merge_report("# T\n\nbody\n", "# T\n\nold body\n") == "# T\n\nbody\n"


@pytest.mark.parametrize("script, flag", [
    ("bench_spectral_scale.py", "--out"),
    ("bench_fused_backends.py", "--json"),
    ("bench_fused_op.py", "--out"),
    ("bench_gpu_loss.py", "--out"),
    ("bench_scale.py", "--out"),
])
def test_benchmarks_refuse_to_replace_an_existing_result_file(tmp_path, script, flag):
    # Refused before any work, with the flag that replaces it; the file kept.
    path = tmp_path / "results.md"
    path.write_text("earlier results")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", script), flag, str(path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "exist" in proc.stderr and "--overwrite" in proc.stderr
    assert path.read_text() == "earlier results"


@pytest.mark.parametrize("bad", [["--n", "0"], ["--k", "0"], ["--batch", "-1"], ["--steps", "0"]])
def test_bench_scale_names_a_bad_count_before_any_run(bad):
    # These used to be saved as "failed (rc 1)" rows with a worker traceback.
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_scale.py"), *bad],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert proc.returncode == 2 and f"`{bad[0]}`" in proc.stderr, proc.stderr[-2000:]
