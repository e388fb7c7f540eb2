"""The GPU guard: when the fused op's CUDA kernels cannot run, they are not used.

No GPU is needed: `$KERAS_ECOC_SIMULATE_GPU` makes the loader pretend a GPU
with the given compute capability, driver version and shared memory, and the
decision, the `fused_status()` message, the single warning and the numbers
(pure-Keras path against a float64 NumPy reference) are checked in a fresh
interpreter per case (the loader decides once per process).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import keras

from keras_ecoc.ops import _gpu_guard as guard

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = keras.backend.backend()
ARCHS = "sm_75,sm_80,sm_86,sm_89,sm_90,compute_90"


# ---------------------------------------------------------------------------
# Pure decision logic (every backend: no TensorFlow involved).

@pytest.mark.parametrize("cc, how", [
    ((7, 5), "sass"), ((8, 0), "sass"), ((8, 6), "sass"), ((8, 7), "sass"),  # 8.7 runs sm_86
    ((8, 9), "sass"), ((9, 0), "sass"), ((10, 0), "ptx"), ((12, 0), "ptx"),
    ((7, 0), None), ((6, 1), None), ((7, 2), None),
])
def test_arch_coverage_follows_cuda_compatibility_rules(cc, how):
    assert guard.arch_coverage(ARCHS, cc)[0] == how


def test_sass_of_another_major_does_not_cover():
    # sm_80 SASS does not run on 9.0, and without PTX nothing covers it.
    assert guard.arch_coverage("sm_80,sm_86", (9, 0))[0] is None
    assert guard.arch_coverage("sm_80,compute_80", (9, 0))[0] == "ptx"


def test_shared_memory_formula_matches_the_kernels_layout():
    # The smallest launch of ChooseChunks in kernels/cuda/ecoc_kernels.cu.cc:
    # ForwardSmemFloats(16, kc=8, acc in global) = 2*(16+32)*(8+4) + 16*36 + 2*16
    # floats; DecodeSmemFloats(16, 8) = 2*(16+32)*(8+4) + 16*36 (the codes
    # gradient's is the same as decode's, below the forward's).
    assert guard.shared_memory_bytes(128) == 4 * (2 * 48 * 12 + 16 * 36 + 32) == 7040
    assert guard.shared_memory_bytes(1000, "decode") == 4 * (2 * 48 * 12 + 16 * 36) == 6912
    # Longer codes take more column stages, not more shared memory.
    for k in (0, 1, 7000, guard.MAX_CODE_LENGTH):
        assert guard.shared_memory_bytes(k) == 7040
    for smem in (48 * 1024, 99 * 1024, 232448):
        assert guard.max_code_length(smem) == guard.MAX_CODE_LENGTH == 2**24
    assert guard.max_code_length(7039) == -1
    assert guard.max_code_length(7039, "decode") == 2**24
    with pytest.raises(ValueError, match="Argument `op`"):
        guard.shared_memory_bytes(8, "backward")


@pytest.mark.parametrize("spec, expected", [
    ("cc=7.0", "no kernel image"),
    ("driver=11000", "driver too old"),
    ("driver=12080", "driver too old"),
    ("cc=10.0,driver=13000", None),  # 13.0 runtime, PTX JIT with a 13.0 driver
    ("cc=8.6", None),
])
def test_device_problem_names_the_failure(spec, expected):
    dev = guard.parse_simulation(spec, runtime_version=13000)
    problem = guard.device_problem(dev, ARCHS, 13000)
    if expected is None:
        assert problem is None
    else:
        assert problem.startswith(expected), problem


def test_ptx_jit_needs_a_driver_as_new_as_the_runtime():
    dev = guard.parse_simulation("cc=10.0,driver=13000", runtime_version=13010)
    assert "JIT-compiling the PTX" in guard.device_problem(dev, ARCHS, 13010)
    # SASS only needs the same major version (minor-version compatibility).
    dev = guard.parse_simulation("cc=9.0,driver=13000", runtime_version=13010)
    assert guard.device_problem(dev, ARCHS, 13010) is None


def test_code_length_problem_uses_the_cards_shared_memory():
    dev = guard.parse_simulation("smem=7000", runtime_version=13000)
    for k in (1, 32):
        assert guard.code_length_problem(dev, k).startswith("shared memory too small")
        assert guard.code_length_problem(dev, k, "decode") is None  # 6912 bytes
    h100 = guard.parse_simulation("", runtime_version=13000)
    assert guard.code_length_problem(h100, 7000) is None
    assert guard.code_length_problem(h100, 2**24) is None
    problem = guard.code_length_problem(h100, 2**24 + 1)
    assert problem.startswith("code length too large") and "code_length=16777217" in problem


def test_bad_simulation_spec_names_the_variable():
    with pytest.raises(ValueError, match="KERAS_ECOC_SIMULATE_GPU"):
        guard.parse_simulation("cc=seven", 13000)
    with pytest.raises(ValueError, match="KERAS_ECOC_SIMULATE_GPU"):
        guard.parse_simulation("memory=3", 13000)


# ---------------------------------------------------------------------------
# Through the loader, with the built library (TensorFlow backend).


def _reference_loss(z, codes, labels, scale):
    z, codes = np.asarray(z, np.float64), np.asarray(codes, np.float64)
    u = z / np.sqrt(np.maximum((z * z).sum(-1, keepdims=True), 1e-12))
    logits = -0.5 * scale * ((u[:, None, :] - codes[None]) ** 2).sum(-1)
    m = logits.max(-1)
    lse = m + np.log(np.exp(logits - m[:, None]).sum(-1))
    return lse - logits[np.arange(len(labels)), labels]


def _loaded_cuda_library():
    if BACKEND != "tensorflow":
        pytest.skip(f"backend is {BACKEND}: the fused op is TensorFlow-only")
    from keras_ecoc.ops import _loader

    if _loader.load_library() is None:
        pytest.skip(f"fused op library not available: {_loader.load_error()}")
    if _loader.library_info()["cuda_archs"] is None:
        pytest.skip("the op library was built without CUDA (nvcc is optional): no GPU kernels to guard")
    return _loader


@pytest.fixture
def simulate(monkeypatch):
    """Re-runs the loader's GPU probe under $KERAS_ECOC_SIMULATE_GPU=spec, in process."""
    loader = _loaded_cuda_library()
    import tensorflow as tf

    saved = loader._state["gpu"]
    # The ops layer warns once per process when the fused op is unavailable;
    # keep that flag as it was so later tests still see their warning.
    import keras_ecoc.ops as ops_module

    saved_warned = list(getattr(ops_module, "_warned", []))

    def apply(spec):
        monkeypatch.setenv("KERAS_ECOC_SIMULATE_GPU", spec)
        loader._state["gpu"] = loader._probe_gpus(tf, loader._state["path"])
        loader._warned_reasons.clear()
        return loader

    yield apply
    loader._state["gpu"] = saved
    loader._warned_reasons.clear()
    if hasattr(ops_module, "_warned"):
        ops_module._warned[:] = saved_warned


def _inputs(k, seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(6, k)).astype(np.float32)
    codes = rng.normal(size=(9, k)).astype(np.float32)
    labels = rng.integers(0, 9, size=6).astype(np.int32)
    return z, codes, labels


@pytest.mark.parametrize("spec, k, message", [
    ("cc=7.0", 8, "no kernel image"),
    ("driver=11000", 8, "driver too old"),
    ("cc=12.0,driver=13000", 8, None),  # PTX JIT: fine only if the runtime is 13.0 itself
    ("smem=7000", 32, "shared memory too small"),
])
def test_simulated_gpu_failure_is_detected_and_reported(simulate, spec, k, message):
    import warnings

    from keras_ecoc import ops

    loader = simulate(spec)
    status = loader.gpu_status()
    assert status["simulated"] is True
    assert status["cuda_archs"] == ARCHS
    if message is None:  # depends on the runtime the library was linked with
        message = "driver too old" if status["runtime"] > 13000 else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok, reason = loader.gpu_kernels_usable(k)
        assert loader.gpu_kernels_usable(k) == (ok, reason)
    mine = [w for w in caught if "keras_ecoc" in str(w.message)]
    if message is None:
        assert ok and ops.fused_available() and mine == [], reason
        return
    assert not ok and reason.startswith(message), reason
    if message == "shared memory too small":
        # 7000 bytes: too little for the cross-entropy kernels (7040) at any
        # code length, enough for the decode kernels (6912). The device stays
        # usable for what fits, with one warning however often it is asked.
        assert ops.fused_available()
        assert loader.gpu_kernels_usable(1)[0] is False
        assert len(mine) == 1 and message in str(mine[0].message)
        assert loader.gpu_kernels_usable(k, op="decode")[0] is True
    else:
        # The whole GPU is unusable: the fused op is off, the status says why
        # (the ops layer gives the one warning, see the next test).
        assert not ops.fused_available()
        assert mine == []
        assert message in ops.fused_status() and "using the non-fused path" in ops.fused_status()
    z, codes, labels = _inputs(k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the ops layer's fallback warning
        loss = np.asarray(ops.ecoc_cross_entropy(labels, z, codes, 3.0), np.float64)
    np.testing.assert_allclose(loss, _reference_loss(z, codes, labels, 3.0), rtol=1e-5, atol=1e-5)


def test_code_length_usable_reads_k_from_the_codes(simulate):
    import types
    import warnings

    import tensorflow as tf

    loader = simulate("cc=9.0")  # an H100: every code length up to 2^24 runs
    small = np.zeros((5, 4), np.float32)
    # k = 2^24 + 1 without allocating it: a zero-stride view, and a shape-only object.
    big = np.broadcast_to(np.zeros((), np.float32), (5, 2**24 + 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert loader.code_length_usable(small)
        assert loader.code_length_usable(tf.constant(small))
        assert loader.code_length_usable(tf.Variable(small))
        assert loader.code_length_usable(small.tolist())
        assert not loader.code_length_usable(big)
        assert not loader.code_length_usable(types.SimpleNamespace(shape=(5, 2**24 + 1)))
    assert len([w for w in caught if "code length too large" in str(w.message)]) == 1

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def unknown_k(codes):
        assert loader.code_length_usable(codes)  # k unknown: the guard cannot decide
        return codes

    unknown_k(tf.constant(small))


def test_simulated_supported_gpu_keeps_the_fused_op(simulate):
    from keras_ecoc import ops

    loader = simulate("cc=8.6,smem=101376")
    ok, reason = loader.gpu_kernels_usable(64)
    assert ok and "SASS sm_86" in reason and "code lengths up to 16777216" in reason, reason
    assert ops.fused_available()
    assert ops.fused_status().startswith("fused op loaded from"), ops.fused_status()
    assert f"CUDA kernels for {ARCHS}" in ops.fused_status()


def test_gpu_kernels_usable_rejects_a_bad_code_length():
    loader = _loaded_cuda_library()
    for bad in (-1, 2.5, True, "8"):
        with pytest.raises(ValueError, match="Argument `code_length`"):
            loader.gpu_kernels_usable(bad)


_WARN_ONCE = r"""
import json, warnings
import numpy as np
from keras_ecoc import ops
from keras_ecoc.ops import _loader
rng = np.random.default_rng(0)
z = rng.normal(size=(6, 8)).astype(np.float32)
codes = rng.normal(size=(9, 8)).astype(np.float32)
labels = rng.integers(0, 9, size=6).astype(np.int32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    losses = [np.asarray(ops.ecoc_cross_entropy(labels, z, codes, 3.0)).tolist() for _ in range(3)]
    ops.nearest_codeword(z, codes)
print(json.dumps({"warnings": [str(w.message) for w in caught if "keras_ecoc" in str(w.message)],
                  "available": ops.fused_available(), "losses": losses,
                  "z": z.tolist(), "codes": codes.tolist(), "labels": labels.tolist()}))
"""


def test_unusable_gpu_warns_once_in_a_fresh_process():
    _loaded_cuda_library()
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3",
               KERAS_ECOC_SIMULATE_GPU="cc=7.0",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("KERAS_ECOC_DISABLE_FUSED", None)
    proc = subprocess.run([sys.executable, "-c", _WARN_ONCE], capture_output=True, text=True,
                          env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["available"] is False
    assert len(r["warnings"]) == 1 and "no kernel image" in r["warnings"][0], r["warnings"]
    want = _reference_loss(r["z"], r["codes"], r["labels"], 3.0)
    for loss in r["losses"]:
        np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-5)
