"""Shared pytest configuration and float64 NumPy references.

The references here are written independently of `keras_ecoc.decoding`:
squared distances are formed as explicit differences in float64 rather than
by the expanded matrix product the library uses.
"""

import os
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

SHARED_DATA = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data"
)



@pytest.fixture
def rng(request):
    # A distinct but reproducible stream per test, seeded by the test's name
    # (crc32, not hash(): str hashes change between processes).
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def load_script(path, name, register=False):
    """A script of the repository (kernels/, benchmarks/: not package modules)
    loaded by path as module `name`; `register` also puts it in sys.modules
    (for a script whose dataclasses or pickling look their module up)."""
    import importlib.util  # noqa: PLC0415
    import sys  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def kernels_build():
    """kernels/build.py loaded by path (it is a script, not a package module)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "kernels", "build.py")
    return load_script(path, "_ecoc_kernels_build_for_tests", register=True)


def shared_data(name):
    """Path of a file in ../shared/data, or skip when it is absent."""
    path = os.path.join(SHARED_DATA, name)
    if not os.path.exists(path):
        pytest.skip(f"{name} not found in ../shared/data")
    return path


def reference_unit(z, epsilon=1e-12):
    z = np.asarray(z, np.float64)
    sq = np.sum(z * z, axis=-1, keepdims=True)
    return z / np.sqrt(np.maximum(sq, epsilon))


def reference_logits(z, codes, scale=1.0):
    """-1/2 * scale * ||M_i - u||^2 by explicit differences, float64."""
    u = reference_unit(z)
    diff = np.asarray(codes, np.float64)[None, :, :] - u[:, None, :]
    return -0.5 * scale * np.sum(diff * diff, axis=-1)


def reference_loss(labels, z, codes, scale=1.0):
    logits = reference_logits(z, codes, scale)
    top = logits.max(axis=-1, keepdims=True)
    lse = top[:, 0] + np.log(np.sum(np.exp(logits - top), axis=-1))
    return lse - logits[np.arange(len(labels)), labels]


def reference_grad_z(labels, z, codes, scale=1.0, epsilon=1e-12):
    """The paper's analytic gradient of the summed loss w.r.t. z, float64.

    dL/du = scale * (sum_i p_i M_i - M_y); dL/dz = (I - u u^T) dL/du / ||z||,
    and 0 where ||z||^2 <= epsilon (the package's rule at z = 0).
    """
    z = np.asarray(z, np.float64)
    codes = np.asarray(codes, np.float64)
    logits = reference_logits(z, codes, scale)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    grad_u = scale * (p @ codes - codes[labels])
    norm = np.sqrt(np.maximum(np.sum(z * z, -1, keepdims=True), epsilon))
    u = z / norm
    grad = (grad_u - np.sum(u * grad_u, -1, keepdims=True) * u) / norm
    return np.where(np.sum(z * z, -1, keepdims=True) > epsilon, grad, 0.0)


def numeric_grad(fn, x, step=1e-6):
    """Central finite differences of a float64 scalar function."""
    x = np.array(x, np.float64)
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        old = x[index]
        x[index] = old + step
        up = fn(x)
        x[index] = old - step
        down = fn(x)
        x[index] = old
        grad[index] = (up - down) / (2 * step)
    return grad


def count_calls(monkeypatch, owner, name):
    """Wraps `owner.name` for the test and returns the list its calls append
    to (one entry per call), so a test can pin how often a step runs."""
    calls = []
    original = getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


def backend_grad(fn, x):
    """Gradient of scalar fn(tensor) at x (float32) on the active backend."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        t = tf.constant(x, tf.float32)
        with tf.GradientTape() as tape:
            tape.watch(t)
            value = fn(t)
        return tape.gradient(value, t).numpy()
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        return np.asarray(jax.grad(fn)(jnp.asarray(x, jnp.float32)))
    if backend == "torch":
        import torch

        t = torch.tensor(np.asarray(x, np.float32), requires_grad=True)
        fn(t).backward()
        return t.grad.numpy()
    pytest.skip(f"no gradient helper for backend {backend}")


# Files whose tests never touch a Keras backend (NumPy/SciPy code, nvcc, the
# notebook files): the TensorFlow run covers them, the JAX and PyTorch runs of
# `make test` skip them rather than repeat minutes of identical work.
BACKEND_INDEPENDENT_FILES = {
    "test_codes.py",
    "test_similarity.py",
    "test_spectral.py",
    "test_cuda_harness_build.py",
    "test_cuda_launch_shape.py",
    "test_notebooks_params.py",
    "test_benchmarks_smoke.py",
    # The TensorFlow op's loader: build cache, TF-version check, GPU guard.
    "test_build_cache.py",
    "test_gpu_guard.py",
    # The research statistics and the audit of stored runs (NumPy/SciPy).
    "test_stats.py",
    "test_audit.py",
    # The name registry of codes (NumPy).
    "test_code_registry.py",
    # The CUDA kernels on the CPU emulator (g++ binaries) and the GPU-run scripts
    # (bash, and benchmark subprocesses that pick their own backends): both files
    # also skip themselves off the TensorFlow pass; listed here so that this set
    # names every file the JAX and PyTorch passes leave out.
    "test_cuda_emulator.py",
    "test_device_run.py",
}


def pytest_collection_modifyitems(config, items):
    # Whole files above, single tests by @pytest.mark.backend_independent (the
    # research command lines: their training runs on every backend through
    # tests such as test_grid_smoke_fits_a_ten_class_data_set, the
    # orchestration around it once).
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if backend == "tensorflow":
        return
    skip = pytest.mark.skip(
        reason="backend-independent; run under KERAS_BACKEND=tensorflow"
    )
    for item in items:
        if (os.path.basename(str(item.fspath)) in BACKEND_INDEPENDENT_FILES
                or item.get_closest_marker("backend_independent") is not None):
            item.add_marker(skip)
