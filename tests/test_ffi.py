"""The fused path of every backend: one kernel library, XLA FFI custom calls, torch custom ops.

Runs once per KERAS_BACKEND. On JAX the loss is `jax.ffi.ffi_call` under a
`custom_vjp` (keras_ecoc/ops/_fused_jax.py), on PyTorch `torch.library` custom
ops (_fused_torch.py), on TensorFlow the op library, whose XLA kernels emit
custom calls to the same FFI handlers (kernels/ecoc_xla.cc). Everything is
compared with the float64 NumPy references of tests/test_streaming.py.
"""

import numpy as np
import pytest

import keras

from keras_ecoc import ops as eops
from keras_ecoc.ops import _dispatch
from keras_ecoc.ops import _loader

from conftest import count_calls
from test_streaming import assert_close_grad
from test_streaming import loss_and_grads
from test_streaming import random_problem
from test_streaming import ref_logits
from test_streaming import ref_loss_and_grads

BACKEND = keras.backend.backend()


@pytest.fixture(autouse=True)
def _needs_fused():
    if BACKEND not in ("jax", "torch", "tensorflow"):
        pytest.skip(f"no fused path on backend {BACKEND}")
    if _loader.disabled():
        pytest.skip("KERAS_ECOC_DISABLE_FUSED is set")
    if _loader.load_kernels() is None:
        pytest.skip(f"kernel library not available: {_loader.kernels_status()}")
    if BACKEND == "tensorflow" and not eops.fused_available():
        pytest.skip(f"TensorFlow op library not available: {eops.fused_status()}")


def _weights(b):
    return np.linspace(0.5, 1.5, b).astype(np.float32)


# Odd shapes: a single row, a single class, k not a multiple of 8, n across
# the kernels' class tiles.
SHAPES = [(1, 1, 3), (5, 13, 7), (33, 1000, 17), (3, 2049, 130)]


@pytest.mark.parametrize("b,n,k", SHAPES)
def test_fused_loss_and_gradients_match_float64_reference(b, n, k):
    rng = np.random.default_rng(b * 1000 + n + k)
    z, codes, labels, scale = random_problem(rng, b, n, k)
    w = _weights(b)
    assert _dispatch.choose(n, k, fused=True)[0] == "fused"
    out = loss_and_grads(lambda z, c, s: eops.ecoc_cross_entropy(labels, z, c, s, fused=True),
                         z, codes, scale, w)
    want = ref_loss_and_grads(z, codes, labels, scale, w)
    np.testing.assert_allclose(out[0], want[0], rtol=1e-5, atol=1e-5)
    for got, ref, name in zip(out[1:], want[1:], ("dz", "dcodes", "dscale")):
        assert_close_grad(got, ref, name)


@pytest.mark.parametrize("b,n,k", [(1, 1, 3), (7, 300, 9), (4, 2500, 33)])
def test_fused_rank_and_nearest_match_numpy(b, n, k):
    rng = np.random.default_rng(n + k)
    z, codes, labels, _ = random_problem(rng, b, n, k)
    logits, _ = ref_logits(z, codes)
    want_rank = (logits > logits[np.arange(b), labels][:, None]).sum(-1)
    np.testing.assert_array_equal(np.asarray(eops.label_rank(labels, z, codes, fused=True)), want_rank)
    np.testing.assert_array_equal(np.asarray(eops.nearest_codeword(z, codes, fused=True)),
                                  logits.argmax(-1))


def test_fused_nan_rows_get_nan_loss_minus_one_and_rank_n():
    rng = np.random.default_rng(3)
    b, n, k = 6, 57, 11
    z, codes, labels, scale = random_problem(rng, b, n, k)
    z[2] = np.nan
    z[4, 3] = np.inf
    loss = np.asarray(eops.ecoc_cross_entropy(labels, z, codes, scale, fused=True))
    ok = np.array([0, 1, 3, 5])
    assert np.all(np.isnan(loss[[2, 4]]))
    want = ref_loss_and_grads(z[ok], codes, labels[ok], scale, np.ones(len(ok)))[0]
    np.testing.assert_allclose(loss[ok], want, rtol=1e-5, atol=1e-5)
    nearest = np.asarray(eops.nearest_codeword(z, codes, fused=True))
    rank = np.asarray(eops.label_rank(labels, z, codes, fused=True))
    assert list(nearest[[2, 4]]) == [-1, -1] and list(rank[[2, 4]]) == [n, n]
    logits, _ = ref_logits(z[ok], codes)
    np.testing.assert_array_equal(nearest[ok], logits.argmax(-1))


def _compiled_loss_and_grads(z, codes, labels, scale, w):
    """Loss and gradients of sum(w * loss) (NaN losses excluded) under the
    backend's compiler: jax.jit, tf.function(jit_compile=True), and on PyTorch
    the fused module itself (eagerly the public op raises for a bad label)."""
    if BACKEND == "jax":
        import jax
        import jax.numpy as jnp

        def total(z, c, s, y):
            loss = eops.ecoc_cross_entropy(y, z, c, s, fused=True)
            return jnp.sum(jnp.where(jnp.isnan(loss), 0.0, loss) * w), loss

        (_, loss), g = jax.jit(jax.value_and_grad(total, argnums=(0, 1, 2), has_aux=True))(
            jnp.asarray(z), jnp.asarray(codes), jnp.float32(scale), jnp.asarray(labels))
        return (np.asarray(loss),) + tuple(np.asarray(t) for t in g)
    if BACKEND == "torch":
        import torch

        from keras_ecoc.ops import _fused_torch

        n = codes.shape[0]
        valid = (labels >= 0) & (labels < n)
        safe = np.where(valid, labels, 0)
        zt = torch.tensor(z, requires_grad=True)
        ct = torch.tensor(codes, requires_grad=True)
        st = torch.tensor(float(scale), requires_grad=True)
        loss = _fused_torch.cross_entropy(zt, ct, torch.tensor(safe), torch.tensor(valid), st)
        torch.sum(torch.where(torch.isnan(loss), 0.0, loss) * torch.tensor(w)).backward()
        return (loss.detach().numpy(), zt.grad.numpy(), ct.grad.numpy(), st.grad.numpy())
    import tensorflow as tf

    @tf.function(jit_compile=True)
    def run(z, c, s, y):
        with tf.GradientTape() as tape:
            tape.watch([z, c, s])
            loss = eops.ecoc_cross_entropy(y, z, c, s, fused=True)
            total = tf.reduce_sum(tf.where(tf.math.is_nan(loss), 0.0, loss) * w)
        return (loss,) + tuple(tape.gradient(total, [z, c, s]))

    out = run(tf.constant(z), tf.constant(codes), tf.constant(scale, tf.float32), tf.constant(labels))
    return tuple(np.asarray(t) for t in out)


def test_invalid_label_under_the_compiler_gives_nan_loss_and_zero_gradient():
    rng = np.random.default_rng(5)
    b, n, k = 5, 301, 13
    z, codes, labels, scale = random_problem(rng, b, n, k)
    labels[1], labels[3] = n + 4, -2
    w = _weights(b)
    loss, dz, dcodes, dscale = _compiled_loss_and_grads(z, codes, labels, scale, w)
    assert np.isnan(loss[1]) and np.isnan(loss[3])
    assert not np.any(dz[[1, 3]])
    ok = np.array([0, 2, 4])
    w_ok = np.where(np.isin(np.arange(b), ok), w, 0.0)
    safe = np.where((labels >= 0) & (labels < n), labels, 0)
    want = ref_loss_and_grads(z, codes, safe, scale, w_ok)
    np.testing.assert_allclose(loss[ok], want[0][ok], rtol=1e-5, atol=1e-5)
    assert_close_grad(dz, want[1], "dz")
    assert_close_grad(dcodes, want[2], "dcodes")
    assert_close_grad(dscale, want[3], "dscale")


def test_fused_is_the_default_path_for_loss_and_decoding_at_1e5_classes():
    assert eops.loss_path(10**5) == "fused"
    assert eops.loss_path(10**5, op="decode") == "fused"
    status = eops.backend_status(10**5)
    assert status.startswith("fused:") and "decoding: fused:" in status


def test_fused_switch_false_avoids_and_true_demands_the_kernels(monkeypatch):
    assert _dispatch.choose(10**5, 16, fused=False)[0] == "streaming"
    assert _dispatch.choose(10, 16, fused=False)[0] == "dense"
    with pytest.raises(ValueError, match="fused"):
        _dispatch.choose(10**5, 16, fused="yes")
    monkeypatch.setenv("KERAS_ECOC_DISABLE_FUSED", "1")
    with pytest.raises(ValueError, match="fused=True"):
        eops.ecoc_cross_entropy(np.zeros(2, np.int32), np.ones((2, 4), np.float32),
                                np.eye(4, dtype=np.float32), fused=True)


def test_compiled_program_contains_the_custom_call():
    rng = np.random.default_rng(9)
    z, codes, labels, scale = random_problem(rng, 4, 37, 6)
    if BACKEND == "jax":
        import jax

        def f(z, c):
            loss = eops.ecoc_cross_entropy(labels, z, c, scale).sum()
            return loss, (eops.label_rank(labels, z, c), eops.nearest_codeword(z, c))

        text = jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True)).lower(z, codes).as_text()
        for target in ("keras_ecoc_forward", "keras_ecoc_codes_grad", "keras_ecoc_label_rank",
                       "keras_ecoc_nearest"):
            assert f"@{target}" in text or f'"{target}"' in text, target
        assert "while" not in text  # no streaming scan
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=True)
        def f(z, c):
            with tf.GradientTape() as tape:
                tape.watch([z, c])
                loss = tf.reduce_sum(eops.ecoc_cross_entropy(labels, z, c, scale))
            return tape.gradient(loss, [z, c]), eops.label_rank(labels, z, c), eops.nearest_codeword(z, c)

        hlo = f.experimental_get_compiler_ir(tf.constant(z), tf.constant(codes))(stage="hlo")
        assert "Host" in _loader.ffi_platforms(), _loader.fused_status()
        for target in ("keras_ecoc_forward", "keras_ecoc_codes_grad", "keras_ecoc_label_rank",
                       "keras_ecoc_nearest"):
            assert f'custom_call_target="{target}"' in hlo, target
    else:
        import torch

        from keras_ecoc.ops import _fused_torch as mod

        graphs = []

        def capture(gm, example_inputs):
            graphs.append(str(gm.graph))
            return gm

        y = torch.tensor(labels).long()
        valid = torch.ones(len(labels), dtype=torch.bool)

        def f(z, c, s):
            return mod.cross_entropy(z, c, y, valid, s), mod.label_rank(z, c, y, valid), \
                mod.nearest_codeword(z, c)

        torch._dynamo.reset()
        out = torch.compile(f, backend=capture, fullgraph=True)(
            torch.tensor(z), torch.tensor(codes), torch.tensor(scale))
        text = "\n".join(graphs)
        for op in ("fused_forward", "fused_label_rank", "fused_nearest"):
            assert f"keras_ecoc.{op}" in text, (op, text)
        logits, _ = ref_logits(z, codes)
        np.testing.assert_array_equal(out[2].numpy(), logits.argmax(-1))
        # Gradients through the compiled graph (fullgraph: no break at the custom ops).
        w = _weights(len(labels))
        compiled = torch.compile(lambda z, c, s: mod.cross_entropy(z, c, y, valid, s),
                                 backend="aot_eager", fullgraph=True)
        got = loss_and_grads(compiled, z, codes, scale, w)
        want = ref_loss_and_grads(z, codes, labels, scale, w)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
        for g, r, name in zip(got[1:], want[1:], ("dz", "dcodes", "dscale")):
            assert_close_grad(g, r, name)


def test_torch_public_loss_and_ecocloss_trace_in_one_graph_on_the_fused_path(rng):
    """The entry points users call, not only the custom ops: the dispatch and
    the checks run under torch.compile(fullgraph=True) without a graph break
    (a ctypes call for the kernel status and np.asarray on a float scale
    used to break it)."""
    if BACKEND != "torch":
        pytest.skip("torch.compile")
    import torch

    import keras_ecoc

    if keras_ecoc.ops.loss_path(7) != "fused":
        pytest.skip(keras_ecoc.ops.backend_status(7))
    codes = rng.normal(size=(7, 4)).astype(np.float32)
    y = torch.tensor([0, 3, 6])
    z = torch.tensor(rng.normal(size=(3, 4)).astype(np.float32))
    loss = keras_ecoc.ECOCLoss(codes)
    for fn in (lambda a: keras_ecoc.ops.ecoc_cross_entropy(y, a, torch.tensor(codes), 2.0).sum(),
               lambda a: loss(y, a)):
        torch._dynamo.reset()
        eager = fn(z)
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(z)
        np.testing.assert_allclose(float(compiled), float(eager), rtol=1e-6)


def test_jax_fixed_codes_never_run_the_codes_gradient_pass(monkeypatch):
    """Eager `jax.grad`: the codes-gradient custom call runs only when a
    gradient flows into the codes (symbolic zeros), and then matches float64."""
    if BACKEND != "jax":
        pytest.skip("JAX custom_vjp")
    import jax
    import jax.numpy as jnp

    from keras_ecoc.ops import _fused_jax

    calls = count_calls(monkeypatch, _fused_jax, "_codes_grad_call")
    rng = np.random.default_rng(17)
    z, codes, labels, scale = random_problem(rng, 6, 41, 9)
    w = _weights(6)

    def total(z, c, s):
        return jnp.sum(eops.ecoc_cross_entropy(labels, z, c, s, fused=True) * w)

    want = ref_loss_and_grads(z, codes, labels, scale, w)
    dz, dscale = jax.grad(total, argnums=(0, 2))(jnp.asarray(z), jnp.asarray(codes), scale)
    assert calls == []
    assert_close_grad(dz, want[1], "dz")
    assert_close_grad(dscale, want[3], "dscale")
    dcodes = jax.grad(total, argnums=1)(jnp.asarray(z), jnp.asarray(codes), scale)
    assert len(calls) == 1
    assert_close_grad(dcodes, want[2], "dcodes")


def test_jax_eager_backward_is_one_compiled_program_with_the_codes_gradient_call():
    """The custom_vjp backward is a jitted function: under an eager `jax.grad`
    it runs compiled, and its program holds the codes-gradient custom call."""
    if BACKEND != "jax":
        pytest.skip("JAX custom_vjp")
    import jax
    import jax.numpy as jnp

    from keras_ecoc.ops import _fused_jax

    rng = np.random.default_rng(18)
    z, codes, labels, scale = random_problem(rng, 3, 19, 5)
    before = _fused_jax._ce_bwd_math._cache_size()
    jax.grad(lambda c: jnp.sum(eops.ecoc_cross_entropy(labels, z, c, scale, fused=True)))(
        jnp.asarray(codes))
    assert _fused_jax._ce_bwd_math._cache_size() == before + 1
    b = len(labels)
    args = (jnp.asarray(z), jnp.asarray(codes), jnp.asarray(labels), jnp.ones(b, bool),
            jnp.float32(scale), jnp.zeros(b), jnp.zeros((b, 5)), jnp.zeros(b), jnp.ones(b))
    with_codes = _fused_jax._ce_bwd_math.lower(*args, True).as_text()
    without = _fused_jax._ce_bwd_math.lower(*args, False).as_text()
    assert "keras_ecoc_codes_grad" in with_codes
    assert "keras_ecoc_codes_grad" not in without


def test_kernel_library_loads_without_any_framework():
    """The kernel library needs no framework: a fresh interpreter loads it with
    ctypes alone and calls the CPU forward entry point."""
    import subprocess
    import sys

    code = f"""
import ctypes, sys
import numpy as np
lib = ctypes.CDLL({_loader.kernels_path()!r})
z = np.array([[3.0, 4.0]], np.float32); m = np.array([[0.6, 0.8], [-0.6, -0.8]], np.float32)
y = np.zeros(1, np.int64); out = [np.zeros(1, np.float32), np.zeros(1, np.float32),
                                  np.zeros((1, 2), np.float32), np.zeros(1, np.float32)]
p = lambda a: a.ctypes.data_as(ctypes.c_void_p)
rc = lib.KerasEcocCpuForward(p(z), p(y), p(m), ctypes.c_float(2.0), ctypes.c_float(1e-12),
                             ctypes.c_int64(1), ctypes.c_int64(2), ctypes.c_int64(2), ctypes.c_int(1),
                             *[p(o) for o in out])
assert rc == 0
assert not any(mod in sys.modules for mod in ("tensorflow", "jax", "torch")), sys.modules.keys()
print(float(out[0][0]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # logits: 0 for the label's codeword, -0.5 * 2 * ||(1.2, 1.6)||^2 = -4 for the other.
    np.testing.assert_allclose(float(proc.stdout), np.log1p(np.exp(-4.0)), rtol=1e-5)


def test_tensorflow_keeps_the_hlo_lowering_when_custom_calls_are_off():
    """KERAS_ECOC_XLA_CUSTOM_CALL=0: the op's XLA kernels emit the HLO lowering
    (no custom call), with the same numbers; fused_status() says so."""
    if BACKEND != "tensorflow":
        pytest.skip("the HLO lowering is TensorFlow's")
    import os
    import subprocess
    import sys

    code = """
import numpy as np, tensorflow as tf
from keras_ecoc import ops
rng = np.random.default_rng(0)
z = rng.normal(size=(6, 5)).astype("float32"); codes = rng.normal(size=(40, 5)).astype("float32")
y = np.array([0, 3, 39, 7, 41, 2], np.int32)
f = tf.function(lambda zz, yy: ops.ecoc_cross_entropy(yy, zz, codes, 2.0), jit_compile=True)
hlo = f.experimental_get_compiler_ir(tf.constant(z), tf.constant(y))(stage="hlo")
assert "keras_ecoc_forward" not in hlo, hlo
loss = f(tf.constant(z), tf.constant(y)).numpy()
assert np.isnan(loss[4])
ok = [0, 1, 2, 3, 5]
np.testing.assert_allclose(loss[ok], ops.ecoc_cross_entropy(y[ok], z[ok], codes, 2.0).numpy(), rtol=1e-5)
# 2^32 + 1 in int64 labels is outside [0, 40), not class 1 after a narrowing cast.
wide = f(tf.constant(z), tf.constant(np.array([0, 3, 2**32 + 1, 7, 1, 2], np.int64))).numpy()
assert np.isnan(wide[2]) and np.isfinite(wide[4]), wide
print("STATUS", ops.fused_status())
"""
    env = dict(os.environ, KERAS_BACKEND="tensorflow", KERAS_ECOC_XLA_CUSTOM_CALL="0",
               TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the HLO lowering (no custom call: custom calls turned off" in proc.stdout, proc.stdout


# ---------------------------------------------------------------------------
# PyTorch: the C entry points run on PyTorch's own OpenMP team.

def test_torch_cpu_kernels_run_on_pytorchs_openmp_team_with_the_same_bits():
    """With PyTorch's OpenMP runtime registered (the default) the CPU kernels'
    loops run as regions of PyTorch's intra-op team; every output has the bits
    of the per-call std::thread pool and matches float64."""
    if BACKEND != "torch":
        pytest.skip("PyTorch C entry points")
    import torch

    from keras_ecoc.ops import _fused_torch

    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this PyTorch build does not use OpenMP")
    assert _fused_torch.cpu_pool().startswith("OpenMP (libgomp")
    lib = _loader.load_kernels()
    rng = np.random.default_rng(21)
    # 300 rows and 5000 classes: several work items per thread in every pass.
    z, codes, labels, scale = random_problem(rng, 300, 5000, 33)
    tz, tc, ty = torch.tensor(z), torch.tensor(codes), torch.tensor(labels).long()
    ts, g = torch.tensor(scale, dtype=torch.float32), torch.tensor(_weights(300))

    def run():
        loss, lse, e, q = _fused_torch._forward(tz, tc, ty, ts)
        dcodes = _fused_torch._codes_grad(tz, tc, ty, ts, lse, g)
        rank = _fused_torch._label_rank(tz, tc, ty)
        nearest = _fused_torch._nearest(tz, tc)
        return [t.numpy().copy() for t in (loss, lse, e, q, dcodes, rank, nearest)]

    team = run()
    try:
        lib.KerasEcocCpuSetOpenMP(None)
        threads = run()
    finally:
        _fused_torch._openmp["done"] = False
        _fused_torch._lib()  # registers PyTorch's GOMP_parallel again
    assert _fused_torch.cpu_pool().startswith("OpenMP")
    for a, b, name in zip(team, threads, ("loss", "lse", "E", "Q", "dcodes", "rank", "nearest")):
        assert a.tobytes() == b.tobytes(), name
    want = ref_loss_and_grads(z, codes, labels, scale, _weights(300))
    np.testing.assert_allclose(team[0], want[0], rtol=1e-5, atol=1e-5)
    assert_close_grad(team[4], want[2], "dcodes")
    logits, _ = ref_logits(z, codes)
    np.testing.assert_array_equal(team[6], logits.argmax(-1))


def test_torch_cpu_kernels_from_a_second_thread_give_the_main_threads_bits():
    """Called from one of PyTorch's inter-op threads, whose OpenMP regions get
    a team of their own next to the main thread's, the kernels compute every
    row and give the main thread's bits."""
    if BACKEND != "torch":
        pytest.skip("PyTorch C entry points")
    import torch

    from keras_ecoc.ops import _fused_torch

    rng = np.random.default_rng(22)
    z, codes, labels, scale = random_problem(rng, 64, 3000, 16)
    want = ref_loss_and_grads(z, codes, labels, scale, np.ones(64, np.float32))[0]
    tz, tc, ty = torch.tensor(z), torch.tensor(codes), torch.tensor(labels).long()
    ts = torch.tensor(scale, dtype=torch.float32)
    # torch.jit.fork runs on the inter-op pool, whose threads start their own
    # OpenMP teams: a second team next to the main thread's.
    fut = torch.jit._fork(lambda: _fused_torch._forward(tz, tc, ty, ts)[0])
    main = _fused_torch._forward(tz, tc, ty, ts)[0]
    other = torch.jit._wait(fut)
    np.testing.assert_allclose(main.numpy(), want, rtol=1e-5, atol=1e-5)
    assert main.numpy().tobytes() == other.numpy().tobytes()


# ---------------------------------------------------------------------------
# JAX: vmap of the fused loss and decoding ops.

def _jax_or_skip():
    if BACKEND != "jax":
        pytest.skip("jax.vmap")
    import jax
    import jax.numpy as jnp

    return jax, jnp


def test_jax_vmap_of_the_fused_loss_equals_each_slice_and_folds_into_one_call():
    jax, jnp = _jax_or_skip()
    rng = np.random.default_rng(31)
    v, b, n, k = 3, 5, 301, 9
    z = rng.normal(size=(v, b, k)).astype(np.float32)
    codes = rng.normal(size=(n, k)).astype(np.float32)
    labels = rng.integers(0, n, size=(v, b)).astype(np.int32)

    def loss(z, y):
        return eops.ecoc_cross_entropy(y, z, codes, 3.0, fused=True)

    got = np.asarray(jax.vmap(loss)(z, labels))
    for i in range(v):
        assert got[i].tobytes() == np.asarray(loss(z[i], labels[i])).tobytes()
        want = ref_loss_and_grads(z[i], codes, labels[i], 3.0, np.ones(b, np.float32))[0]
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)
    # The mapped axis is folded into the rows: one forward call on (v * b) rows.
    hlo = jax.jit(jax.vmap(loss)).lower(z, labels).as_text()
    assert hlo.count("keras_ecoc_forward") == 1
    assert f"tensor<{v * b}x{k}xf32>" in hlo
    # Nested vmap folds both axes; labels mapped over z not: z broadcast.
    zz = np.stack([z, 2 * z])
    got2 = np.asarray(jax.vmap(jax.vmap(loss))(zz, np.stack([labels, labels])))
    np.testing.assert_array_equal(got2[0], got)
    got3 = np.asarray(jax.vmap(loss, in_axes=(None, 0))(z[0], labels))
    for i in range(v):
        assert got3[i].tobytes() == np.asarray(loss(z[0], labels[i])).tobytes()


def test_jax_grad_under_vmap_matches_float64_per_slice():
    jax, jnp = _jax_or_skip()
    rng = np.random.default_rng(32)
    v, b, n, k = 2, 6, 257, 11
    z = rng.normal(size=(v, b, k)).astype(np.float32)
    codes = rng.normal(size=(n, k)).astype(np.float32)
    labels = rng.integers(0, n, size=(v, b)).astype(np.int32)
    w = _weights(b)

    def total(z, c, s, y):
        return jnp.sum(eops.ecoc_cross_entropy(y, z, c, s, fused=True) * w)

    grads = jax.jit(jax.vmap(jax.grad(total, argnums=(0, 1, 2)), in_axes=(0, None, None, 0)))(
        z, codes, jnp.float32(3.0), labels)
    for i in range(v):
        want = ref_loss_and_grads(z[i], codes, labels[i], 3.0, w)
        for got, ref, name in zip(grads, want[1:], ("dz", "dcodes", "dscale")):
            assert_close_grad(np.asarray(got)[i], ref, name)
    # vmap of the loss under grad: the codes gradient sums over the slices.
    dcodes = jax.grad(lambda c: jnp.sum(jax.vmap(total, in_axes=(0, None, None, 0))(
        z, c, jnp.float32(3.0), labels)))(codes)
    want = sum(ref_loss_and_grads(z[i], codes, labels[i], 3.0, w)[2] for i in range(v))
    assert_close_grad(dcodes, want, "dcodes summed over slices")


def test_jax_vmap_over_codes_and_scale_runs_one_call_per_slice():
    jax, jnp = _jax_or_skip()
    rng = np.random.default_rng(33)
    v, b, n, k = 3, 4, 50, 6
    z = rng.normal(size=(b, k)).astype(np.float32)
    codes = rng.normal(size=(v, n, k)).astype(np.float32)
    labels = rng.integers(0, n, size=b).astype(np.int32)
    scales = np.array([1.0, 3.0, 8.0], np.float32)
    w = np.ones(b, np.float32)

    def loss(c, s):
        return eops.ecoc_cross_entropy(labels, z, c, s, fused=True)

    got = np.asarray(jax.jit(jax.vmap(loss))(codes, scales))
    for i in range(v):
        want = ref_loss_and_grads(z, codes[i], labels, float(scales[i]), w)[0]
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)
    dz = jax.vmap(jax.grad(lambda z, c, s: jnp.sum(eops.ecoc_cross_entropy(
        labels, z, c, s, fused=True))), in_axes=(None, 0, 0))(z, codes, scales)
    for i in range(v):
        assert_close_grad(np.asarray(dz)[i],
                          ref_loss_and_grads(z, codes[i], labels, float(scales[i]), w)[1], "dz")


def test_jax_vmap_of_label_rank_and_nearest_matches_numpy():
    jax, jnp = _jax_or_skip()
    rng = np.random.default_rng(34)
    v, b, n, k = 3, 7, 300, 9
    z = rng.normal(size=(v, b, k)).astype(np.float32)
    codes = rng.normal(size=(n, k)).astype(np.float32)
    labels = rng.integers(0, n, size=(v, b)).astype(np.int32)
    rank = np.asarray(jax.vmap(lambda z, y: eops.label_rank(y, z, codes, fused=True))(z, labels))
    near = np.asarray(jax.vmap(lambda z: eops.nearest_codeword(z, codes, fused=True))(z))
    for i in range(v):
        logits, _ = ref_logits(z[i], codes)
        want_rank = (logits > logits[np.arange(b), labels[i]][:, None]).sum(-1)
        np.testing.assert_array_equal(rank[i], want_rank)
        np.testing.assert_array_equal(near[i], logits.argmax(-1))
    # A batched code matrix: one call per slice, each against its own codes.
    codes_v = rng.normal(size=(v, n, k)).astype(np.float32)
    near_c = np.asarray(jax.vmap(lambda c: eops.nearest_codeword(z[0], c, fused=True))(codes_v))
    for i in range(v):
        np.testing.assert_array_equal(near_c[i], ref_logits(z[0], codes_v[i])[0].argmax(-1))
