"""Tests of the fused ECOC TensorFlow ops (keras_ecoc.ops and kernels/).

Everything is checked against float64 NumPy references written here from the
formulas (dense B x n logits), on fresh seeded random inputs:

* loss (relative error < 1e-5) and the auxiliary outputs lse / expected code;
* gradients w.r.t. z, scale and codes (analytic float64 references and finite
  differences via tf.test.compute_gradient);
* agreement with the pure-Keras path (keras_ecoc.decoding);
* odd shapes (B = 1, k = 1, n = 1, n not a multiple of any tile, n = 100,000),
  float16 / bfloat16 z, z = 0, NaN propagation, input validation;
* label_rank / nearest_codeword; the XLA lowerings (dense and tiled) against
  eager; a Keras model.fit under jit_compile=True.

Gradient tolerances: the op accumulates in float32 over n classes and k code
dimensions (sums of up to ~1e5 terms, pairwise over tiles), so the expected
error is a few float32 ulps times sqrt(#terms) relative to the magnitude of the
gradient; we use atol = 2e-5 * max|reference| (+ rtol 1e-4), i.e. a few
hundred ulps of the largest entry, far below any formula error (which would be
O(1) relative).

The module is skipped when the backend is not TensorFlow or the library is not
built, except `test_library_loads_and_registers_cpu_and_gpu_kernels`, which
fails when KERAS_ECOC_REQUIRE_FUSED=1 (as `make test` sets) and the library
does not load; its GPU half is skipped when the library was built without CUDA.
"""

import os
import zlib

import numpy as np
import pytest

import keras

from conftest import count_calls

BACKEND = keras.backend.backend()
REQUIRE_FUSED = os.environ.get("KERAS_ECOC_REQUIRE_FUSED", "").strip().lower() in ("1", "true", "yes")
OP_NAMES = ("EcocCrossEntropy", "EcocCrossEntropyCodesGrad", "EcocLabelRank", "EcocNearestCodeword")


def _library_or_reason():
    if BACKEND != "tensorflow":
        return None, f"backend is {BACKEND}: the fused op is TensorFlow-only"
    from keras_ecoc.ops import _loader

    lib = _loader.load_library()
    if lib is None:
        return None, f"fused op library not available: {_loader.load_error()}"
    return lib, ""


def test_library_loads_and_registers_cpu_and_gpu_kernels():
    if BACKEND != "tensorflow":
        pytest.skip(f"backend is {BACKEND}")
    lib, reason = _library_or_reason()
    if lib is None:
        if REQUIRE_FUSED:
            pytest.fail(f"KERAS_ECOC_REQUIRE_FUSED=1 but {reason}")
        pytest.skip(reason)
    from tensorflow.python.framework import kernels

    missing = []
    for name in OP_NAMES:
        devices = {k.device_type for k in kernels.get_registered_kernels_for_op(name).kernel}
        assert "CPU" in devices, f"{name} has no CPU kernel (registered: {sorted(devices)})"
        if "GPU" not in devices:
            missing.append(name)
    if missing:
        from keras_ecoc.ops import _loader

        if _loader.library_info()["cuda_archs"] is None:
            # nvcc is optional: a library built without it has CPU (and XLA)
            # kernels only, even under KERAS_ECOC_REQUIRE_FUSED=1.
            pytest.skip("the op library was built without CUDA (no nvcc, or --no-cuda): "
                        f"{missing} have CPU kernels only")
        pytest.fail(f"{missing} have no GPU kernel registered although the library holds "
                    f"CUDA kernels for {_loader.library_info()['cuda_archs']}")


@pytest.fixture
def rng(request):
    # Fresh, reproducible inputs per test: seeded by a stable hash of the test
    # id (Python's str hash is randomised per process); KERAS_ECOC_TEST_SEED
    # shifts every seed, to sweep the tests over other inputs.
    offset = int(os.environ.get("KERAS_ECOC_TEST_SEED", "0"))
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()) + offset)


@pytest.fixture(scope="module")
def lib():
    lib, reason = _library_or_reason()
    if lib is None:
        pytest.skip(reason)
    return lib


@pytest.fixture(scope="module")
def tf(lib):
    import tensorflow as tf

    return tf


# ---------------------------------------------------------------------------
# float64 references (dense).

def ref_forward(z, codes, labels, scale, eps=1e-12):
    z = np.asarray(z, np.float64)
    m = np.asarray(codes, np.float64)
    sq = np.sum(z * z, -1)
    r = 1.0 / np.sqrt(np.maximum(sq, eps))
    u = z * r[:, None]
    logits = -0.5 * scale * (np.sum(m * m, -1)[None, :] - 2.0 * u @ m.T + np.sum(u * u, -1)[:, None])
    top = logits.max(-1)
    lse = top + np.log(np.exp(logits - top[:, None]).sum(-1))
    p = np.exp(logits - lse[:, None])
    loss = lse - logits[np.arange(len(labels)), labels]
    return dict(loss=loss, lse=lse, ec=p @ m, esq=p @ np.sum(m * m, -1), logits=logits, p=p, u=u,
                r=r, sq=sq)


def ref_grads(z, codes, labels, scale, g, eps=1e-12):
    """Gradients of sum_b g_b loss_b w.r.t. z, scale and codes (float64)."""
    f = ref_forward(z, codes, labels, scale, eps)
    m = np.asarray(codes, np.float64)
    u, r, p = f["u"], f["r"], f["p"]
    m_y = m[labels]
    du = (g * scale)[:, None] * (f["ec"] - m_y)
    # ||z||^2 <= eps: the direction is undefined and the package's gradient is 0.
    dz = np.where((f["sq"] > eps)[:, None], r[:, None] * (du - np.sum(u * du, -1)[:, None] * u), 0.0)
    ds = np.sum(g * (-0.5 * (f["esq"] - np.sum(m_y * m_y, -1)) + np.sum((f["ec"] - m_y) * u, -1)))
    onehot = np.zeros_like(p)
    onehot[np.arange(len(labels)), labels] = 1.0
    w = g[:, None] * (p - onehot)
    dm = scale * (w.T @ u - w.sum(0)[:, None] * m)
    return dz, ds, dm


def random_problem(rng, B, n, k, scale=4.0, unit_codes=True):
    z = rng.normal(size=(B, k)).astype(np.float32)
    codes = rng.normal(size=(n, k)).astype(np.float32)
    if unit_codes:
        codes /= np.linalg.norm(codes, axis=1, keepdims=True)
    labels = rng.integers(0, n, size=B).astype(np.int32)
    return z, codes, labels, np.float32(scale)


def assert_close_grad(actual, expected, what, atol_rel=2e-5, rtol=1e-4):
    actual = np.asarray(actual, np.float64)
    atol = atol_rel * max(np.max(np.abs(expected)), 1e-30)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


def fused_loss_and_grads(tf, z, codes, labels, scale, g, watch_codes=True):
    from keras_ecoc import ops as eops

    zt = tf.constant(z)
    ct = tf.Variable(codes) if watch_codes else tf.constant(codes)
    st = tf.Variable(scale)
    with tf.GradientTape() as tape:
        tape.watch(zt)
        loss = eops.ecoc_cross_entropy(labels, zt, ct, st)
        total = tf.reduce_sum(loss * g)
    dz, dc, ds = tape.gradient(total, [zt, ct, st])
    return loss.numpy(), dz.numpy(), (dc.numpy() if dc is not None else None), float(ds)


# ---------------------------------------------------------------------------

# (B, n, k): B = 1, k = 1, n = 1, n not a multiple of the tiles (8/16 rows,
# 32..512 classes, 6-wide micro tiles), many row blocks (row splits in the
# codes gradient), few rows and many classes (class splits in the forward).
SHAPES = [(1, 1, 1), (1, 7, 3), (5, 1, 4), (3, 2, 1), (9, 37, 5), (16, 513, 32), (37, 1001, 13),
          (300, 10, 7), (3, 5000, 24), (64, 777, 128)]


@pytest.mark.parametrize("B,n,k", SHAPES)
@pytest.mark.parametrize("label_dtype", ["int32", "int64"])
def test_forward_matches_float64_reference(lib, tf, rng, B, n, k, label_dtype):
    z, codes, labels, scale = random_problem(rng, B, n, k)
    loss, lse, ec, esq = [t.numpy() for t in lib.ecoc_cross_entropy(
        z, codes, labels.astype(label_dtype), scale)]
    ref = ref_forward(z, codes, labels, scale)
    # loss = lse - logit_y may cancel: relative to the logit magnitude too.
    scale_of_logits = np.max(np.abs(ref["logits"]), axis=-1) + 1.0
    np.testing.assert_array_less(np.abs(loss - ref["loss"]),
                                 1e-5 * np.abs(ref["loss"]) + 1e-6 * scale_of_logits)
    np.testing.assert_allclose(lse, ref["lse"], rtol=1e-5, atol=1e-6 * scale_of_logits.max())
    np.testing.assert_allclose(ec, ref["ec"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(esq, ref["esq"], rtol=1e-5, atol=1e-6)
    if n == 1:
        np.testing.assert_array_equal(loss, 0.0)  # exactly: the label is the max


@pytest.mark.parametrize("B,n,k", [(1, 1, 1), (4, 7, 3), (16, 513, 32), (300, 10, 7), (3, 5000, 24),
                                   (40, 300, 17)])
def test_gradients_match_float64_reference(lib, tf, rng, B, n, k):
    z, codes, labels, scale = random_problem(rng, B, n, k, scale=3.0)
    g = rng.normal(size=B).astype(np.float32)
    loss, dz, dc, ds = fused_loss_and_grads(tf, z, codes, labels, scale, g)
    rdz, rds, rdm = ref_grads(z, codes, labels, scale, g)
    assert_close_grad(dz, rdz, "dL/dz")
    assert_close_grad(dc, rdm, "dL/dcodes")
    np.testing.assert_allclose(ds, rds, rtol=1e-4, atol=2e-5 * np.abs(g).sum() * (1 + np.abs(codes).max()))


def test_finite_differences(lib, tf, rng):
    from keras_ecoc import ops as eops

    z, codes, labels, _ = random_problem(rng, 3, 5, 4, unit_codes=False)
    g = rng.normal(size=3).astype(np.float32)

    def f(zz, cc, ss):
        return tf.reduce_sum(eops.ecoc_cross_entropy(labels, zz, cc, ss) * g)

    theoretical, numerical = tf.test.compute_gradient(
        f, [tf.constant(z), tf.constant(codes), tf.constant(1.7)], delta=1e-3)
    for t, nmr, name in zip(theoretical, numerical, ["z", "codes", "scale"]):
        np.testing.assert_allclose(t, nmr, atol=3e-3, rtol=3e-3, err_msg=name)


def test_lse_output_gradient(lib, tf, rng):
    """Gradients flowing into the auxiliary `lse` output are honoured."""
    z, codes, labels, scale = random_problem(rng, 6, 9, 5, scale=2.0)
    zt, ct, st = tf.constant(z), tf.Variable(codes), tf.Variable(scale)
    a, b = rng.normal(size=6), rng.normal(size=6)
    with tf.GradientTape() as tape:
        tape.watch(zt)
        loss, lse, _, _ = lib.ecoc_cross_entropy(zt, ct, labels, st)
        total = tf.reduce_sum(loss * a.astype(np.float32)) + tf.reduce_sum(lse * b.astype(np.float32))
    dz, dc, ds = tape.gradient(total, [zt, ct, st])

    def fn(zz, cc, ss):
        f = ref_forward(zz, cc, labels, ss)
        return np.sum(f["loss"] * a) + np.sum(f["lse"] * b)

    z64, c64 = z.astype(np.float64), codes.astype(np.float64)
    from conftest import numeric_grad

    nz = numeric_grad(lambda x: fn(x, c64, float(scale)), z64)
    nc = numeric_grad(lambda x: fn(z64, x, float(scale)), c64)
    nsc = (fn(z64, c64, float(scale) + 1e-6) - fn(z64, c64, float(scale) - 1e-6)) / 2e-6
    assert_close_grad(dz.numpy(), nz, "dz", atol_rel=1e-4)
    assert_close_grad(dc.numpy(), nc, "dcodes", atol_rel=1e-4)
    np.testing.assert_allclose(float(ds), nsc, rtol=1e-4)


def test_matches_pure_keras_path(lib, tf, rng):
    from keras_ecoc import decoding
    from keras_ecoc import ops as eops

    z, codes, labels, scale = random_problem(rng, 33, 257, 19, scale=6.0)
    zt, st = tf.constant(z), tf.Variable(scale)
    ct = tf.Variable(codes)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(zt)
        fused = eops.ecoc_cross_entropy(labels, zt, ct, st)
        dense = decoding.cross_entropy(labels, zt, ct, st)
        tf_, td = tf.reduce_sum(fused), tf.reduce_sum(dense)
    np.testing.assert_allclose(fused.numpy(), dense.numpy(), rtol=1e-5, atol=1e-5)
    for a, b, name in zip(tape.gradient(tf_, [zt, ct, st]), tape.gradient(td, [zt, ct, st]),
                          ["z", "codes", "scale"]):
        assert_close_grad(a.numpy(), b.numpy().astype(np.float64), name, atol_rel=5e-5)
    np.testing.assert_array_equal(eops.nearest_codeword(z, codes).numpy(),
                                  decoding.nearest_codeword(z, codes).numpy())
    np.testing.assert_array_equal(eops.label_rank(labels, z, codes).numpy(),
                                  decoding.label_rank(labels, z, codes).numpy())


def test_hundred_thousand_classes(lib, tf, rng):
    z, codes, labels, scale = random_problem(rng, 3, 100_000, 8, scale=10.0)
    g = np.ones(3, np.float32)
    loss, dz, dc, ds = fused_loss_and_grads(tf, z, codes, labels, scale, g)
    ref = ref_forward(z, codes, labels, scale)
    np.testing.assert_allclose(loss, ref["loss"], rtol=1e-5)
    rdz, rds, rdm = ref_grads(z, codes, labels, scale, g)
    assert_close_grad(dz, rdz, "dz")
    assert_close_grad(dc, rdm, "dcodes")
    np.testing.assert_allclose(ds, rds, rtol=1e-4)
    rank = lib.ecoc_label_rank(z, codes, labels).numpy()
    logits = ref["logits"]
    np.testing.assert_array_equal(rank, (logits > logits[np.arange(3), labels][:, None]).sum(-1))
    np.testing.assert_array_equal(lib.ecoc_nearest_codeword(z, codes).numpy(), logits.argmax(-1))


def test_leading_batch_dims(lib, tf, rng):
    from keras_ecoc import ops as eops

    z, codes, labels, scale = random_problem(rng, 6, 11, 4)
    loss = eops.ecoc_cross_entropy(labels.reshape(2, 3), z.reshape(2, 3, 4), codes, scale)
    assert loss.shape == (2, 3)
    np.testing.assert_allclose(loss.numpy().ravel(), ref_forward(z, codes, labels, scale)["loss"], rtol=1e-5)
    assert eops.nearest_codeword(z.reshape(3, 2, 4), codes).shape == (3, 2)
    assert eops.label_rank(labels.reshape(3, 2), z.reshape(3, 2, 4), codes).shape == (3, 2)
    # Keras-style (B, 1) labels and other integer dtypes are accepted.
    np.testing.assert_allclose(eops.ecoc_cross_entropy(labels[:, None].astype(np.uint8), z, codes, scale),
                               ref_forward(z, codes, labels, scale)["loss"], rtol=1e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_z(lib, tf, rng, dtype):
    from keras_ecoc import ops as eops

    z, codes, labels, scale = random_problem(rng, 20, 300, 16)
    zt = tf.cast(tf.constant(z), dtype)
    z_rounded = tf.cast(zt, tf.float32).numpy()  # what the op sees
    with tf.GradientTape() as tape:
        tape.watch(zt)
        loss = eops.ecoc_cross_entropy(labels, zt, codes, scale)
        total = tf.reduce_sum(loss)
    dz = tape.gradient(total, zt)
    assert loss.dtype == tf.float32 and dz.dtype == zt.dtype
    np.testing.assert_allclose(loss.numpy(), ref_forward(z_rounded, codes, labels, scale)["loss"], rtol=1e-5)
    rdz, _, _ = ref_grads(z_rounded, codes, labels, scale, np.ones(20))
    # the gradient is rounded to dtype at the end
    tol = 1e-2 if dtype == "bfloat16" else 2e-3
    assert_close_grad(tf.cast(dz, tf.float32).numpy(), rdz, "dz", atol_rel=tol, rtol=tol)


def test_zero_z_gives_finite_loss_and_gradient(lib, tf, rng):
    z, codes, labels, scale = random_problem(rng, 4, 9, 5)
    z[1] = 0.0
    g = np.ones(4, np.float32)
    loss, dz, dc, ds = fused_loss_and_grads(tf, z, codes, labels, scale, g)
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(dz)) and np.all(np.isfinite(dc))
    assert np.isfinite(ds)
    np.testing.assert_allclose(loss, ref_forward(z, codes, labels, scale)["loss"], rtol=1e-5)
    rdz, _, _ = ref_grads(z, codes, labels, scale, g)
    assert_close_grad(dz, rdz, "dz at z=0")
    np.testing.assert_array_equal(dz[1], 0.0)  # not 1/sqrt(eps) * dL/du = 10^6 dL/du


def test_nan_propagates(lib, tf, rng):
    z, codes, labels, scale = random_problem(rng, 40, 1000, 8)
    z[3, 2] = np.nan
    loss = lib.ecoc_cross_entropy(z, codes, labels, scale)[0].numpy()
    assert np.isnan(loss[3])
    assert np.all(np.isfinite(np.delete(loss, 3)))
    rank = lib.ecoc_label_rank(z, codes, labels).numpy()
    assert rank[3] == 1000  # a NaN row is never counted as correct
    from keras_ecoc.decoding import label_rank as keras_label_rank

    assert int(keras_label_rank(labels, z, codes)[3]) == 1000
    # NaN in one code row poisons every loss (all share the softmax).
    z2, codes2, labels2, _ = random_problem(rng, 5, 50, 4)
    codes2[7, 0] = np.nan
    assert np.all(np.isnan(lib.ecoc_cross_entropy(z2, codes2, labels2, scale)[0].numpy()))


BAD_INPUTS = [
    # (description, z shape, codes shape, labels, scale shape, message regex)
    ("negative label", (4, 3), (5, 3), [0, 1, -1, 2], (), r"labels\[2\] = -1 is outside the valid range \[0, 5\)"),
    ("label >= n", (4, 3), (5, 3), [0, 5, 1, 2], (), r"labels\[1\] = 5 is outside the valid range \[0, 5\)"),
    ("k mismatch", (4, 3), (5, 2), [0, 1, 1, 2], (), r"code length.*3.*2"),
    ("z rank 3", (4, 3, 1), (5, 3), [0, 1, 1, 2], (), r"z must .*rank"),
    ("z rank 1", (3,), (5, 3), [0], (), r"z must .*rank"),
    ("codes rank 1", (4, 3), (5,), [0, 1, 1, 2], (), r"codes must .*rank"),
    ("labels rank 2", (4, 3), (5, 3), [[0, 1], [1, 2]], (), r"labels must .*rank"),
    ("scale not scalar", (4, 3), (5, 3), [0, 1, 1, 2], (2,), r"scale must be a scalar"),
    ("batch mismatch", (4, 3), (5, 3), [0, 1, 1], (), r"batch size 4 but labels has 3"),
    ("no classes", (4, 3), (0, 3), [0, 1, 1, 2], (), r"at least one row"),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs_raise(lib, tf, case):
    _, zs, cs, labels, ss, pattern = case
    z = np.ones(zs, np.float32)
    codes = np.ones(cs, np.float32)
    labels = np.asarray(labels, np.int32)
    scale = np.ones(ss, np.float32)
    # Eagerly: the kernel's checks.
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=pattern):
        lib.ecoc_cross_entropy(z, codes, labels, scale)
    # In a graph with static shapes: the shape function's checks (the label
    # range is only known at run time and is still checked by the kernel).
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=pattern):
        tf.function(lambda: lib.ecoc_cross_entropy(z, codes, labels, scale))()
    if "label" in case[0] and "rank" not in case[0] and "mismatch" not in case[0]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            lib.ecoc_label_rank(z, codes, labels)
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            lib.ecoc_cross_entropy_codes_grad(z, codes, labels, 1.0, np.zeros(4, np.float32),
                                              np.ones(4, np.float32))


def test_python_api_validates(lib, tf):
    from keras_ecoc import ops as eops

    with pytest.raises(ValueError, match="code length"):
        eops.ecoc_cross_entropy([0, 1], np.ones((2, 3), np.float32), np.ones((4, 5), np.float32))
    with pytest.raises(ValueError, match="batch size 2 but labels has 3"):
        eops.ecoc_cross_entropy([0, 1, 2], np.ones((2, 3), np.float32), np.ones((4, 3), np.float32))


@pytest.mark.parametrize("B,n,k", [(1, 1, 1), (7, 5, 3), (16, 2000, 12), (300, 40, 6), (2, 3000, 9)])
def test_rank_and_nearest_match_numpy(lib, tf, rng, B, n, k):
    z, codes, labels, _ = random_problem(rng, B, n, k)
    logits = ref_forward(z, codes, labels, 1.0)["logits"]
    rank = lib.ecoc_label_rank(z, codes, labels).numpy()
    expected = (logits > logits[np.arange(B), labels][:, None]).sum(-1)
    np.testing.assert_array_equal(rank, expected)
    np.testing.assert_array_equal(lib.ecoc_nearest_codeword(z, codes).numpy(), logits.argmax(-1))


def test_ties(lib, tf, rng):
    """Duplicated codewords: ties go to the smallest index, equal logits do not count."""
    z, base, _, _ = random_problem(rng, 12, 10, 6)
    codes = np.concatenate([base, base, base])  # class i, i+10 and i+20 are identical
    labels = rng.integers(0, 30, size=12).astype(np.int32)
    nearest = lib.ecoc_nearest_codeword(z, codes).numpy()
    assert np.all(nearest < 10)
    np.testing.assert_array_equal(nearest, lib.ecoc_nearest_codeword(z, base).numpy())
    rank = lib.ecoc_label_rank(z, codes, labels).numpy()
    np.testing.assert_array_equal(rank, 3 * lib.ecoc_label_rank(z, base, labels % 10).numpy())
    same = np.tile(base[:1], (7, 1))  # all classes identical: everything is rank 0, index 0
    assert np.all(lib.ecoc_label_rank(z, same, labels % 7).numpy() == 0)
    assert np.all(lib.ecoc_nearest_codeword(z, same).numpy() == 0)


def test_isa_variants_agree(lib, tf, rng, monkeypatch):
    """The baseline x86-64 and the AVX2/FMA copies of the math give the same results."""
    z, codes, labels, scale = random_problem(rng, 21, 700, 11)
    g = rng.normal(size=21).astype(np.float32)

    def run():
        out = [t.numpy() for t in lib.ecoc_cross_entropy(z, codes, labels, scale)]
        out.append(lib.ecoc_cross_entropy_codes_grad(z, codes, labels, scale, out[1], g).numpy())
        out.append(lib.ecoc_label_rank(z, codes, labels).numpy())
        out.append(lib.ecoc_nearest_codeword(z, codes).numpy())
        return out

    default = run()
    monkeypatch.setenv("KERAS_ECOC_CPU_ISA", "base")
    base = run()
    for a, b in zip(default, base):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_codes_gradient_only_when_requested(lib, tf, rng, monkeypatch):
    from keras_ecoc import ops as eops

    calls = count_calls(monkeypatch, lib, "ecoc_cross_entropy_codes_grad")
    z, codes, labels, scale = random_problem(rng, 5, 30, 4)
    zt, ct = tf.constant(z), tf.constant(codes)
    with tf.GradientTape() as tape:
        tape.watch(zt)
        total = tf.reduce_sum(eops.ecoc_cross_entropy(labels, zt, ct, scale))
    tape.gradient(total, zt)
    assert not calls
    cv = tf.Variable(codes)
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(eops.ecoc_cross_entropy(labels, zt, cv, scale))
    tape.gradient(total, cv)
    assert len(calls) == 1


# ---------------------------------------------------------------------------
# XLA.

@pytest.mark.parametrize("B,n,k", [(5, 37, 6), (64, 70_000, 4)], ids=["dense", "tiled"])
def test_xla_matches_eager(lib, tf, rng, B, n, k):
    from keras_ecoc import ops as eops

    z, codes, labels, scale = random_problem(rng, B, n, k, scale=5.0)
    g = rng.normal(size=B).astype(np.float32)
    cv, sv = tf.Variable(codes), tf.Variable(scale)

    def step(zz):
        with tf.GradientTape() as tape:
            tape.watch(zz)
            loss = eops.ecoc_cross_entropy(labels, zz, cv, sv)
            total = tf.reduce_sum(loss * g)
        dz, dc, ds = tape.gradient(total, [zz, cv, sv])
        return (loss, dz, dc, ds, eops.label_rank(labels, zz, cv), eops.nearest_codeword(zz, cv),
                lib.ecoc_cross_entropy(zz, cv, labels, sv)[2])

    eager = [t.numpy() for t in step(tf.constant(z))]
    xla = [t.numpy() for t in tf.function(step, jit_compile=True)(tf.constant(z))]
    names = ["loss", "dz", "dcodes", "dscale", "rank", "nearest", "expected_code"]
    logits = ref_forward(z, codes, labels, 1.0)["logits"]
    # Classes whose logit is within float32 rounding of another's may order
    # differently in the two implementations (different summation orders).
    tie = 1e-5 * (1.0 + np.abs(logits).max())
    for a, b, name in zip(xla, eager, names):
        if name == "nearest":
            differ = np.nonzero(a != b)[0]
            gap = np.abs(logits[differ, a[differ]] - logits[differ, b[differ]])
            assert np.all(gap < tie), (name, differ, gap)
        elif name == "rank":
            label_logit = logits[np.arange(B), labels][:, None]
            near = np.sum(np.abs(logits - label_logit) < tie, axis=-1)
            assert np.all(np.abs(a - b) <= near), (name, a - b, near)
        else:
            assert_close_grad(a, b.astype(np.float64), f"xla {name}", atol_rel=5e-5, rtol=1e-4)


def test_xla_out_of_range_label_gives_nan(lib, tf, rng):
    z, codes, _, scale = random_problem(rng, 3, 7, 4)
    labels = np.array([0, 7, -1], np.int32)
    loss = tf.function(lambda: lib.ecoc_cross_entropy(z, codes, labels, scale)[0], jit_compile=True)()
    loss = loss.numpy()
    assert np.isfinite(loss[0]) and np.isnan(loss[1]) and np.isnan(loss[2])
    rank = tf.function(lambda: lib.ecoc_label_rank(z, codes, labels), jit_compile=True)().numpy()
    assert rank[1] == 7 and rank[2] == 7


@pytest.mark.parametrize("jit_compile", [True, False])
def test_keras_fit(lib, tf, rng, jit_compile):
    from keras_ecoc import ops as eops

    n, k = 50, 8
    codes = rng.normal(size=(n, k)).astype(np.float32)
    codes /= np.linalg.norm(codes, axis=1, keepdims=True)
    x = rng.normal(size=(256, 12)).astype(np.float32)
    y = (np.abs(x[:, 0] * 20).astype(np.int32)) % n

    def loss_fn(y_true, y_pred):
        # Keras hands a plain loss function float32 y_true (exact for n <= 2^24).
        return eops.ecoc_cross_entropy(tf.reshape(y_true, [-1]), y_pred, codes, 8.0)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(k)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss_fn, jit_compile=jit_compile)
    history = model.fit(x, y, batch_size=64, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_fallback_when_disabled(lib, tf, rng, monkeypatch):
    from keras_ecoc import decoding
    from keras_ecoc import ops as eops

    monkeypatch.setenv("KERAS_ECOC_DISABLE_FUSED", "1")
    assert not eops.fused_available()
    assert "KERAS_ECOC_DISABLE_FUSED" in eops.fused_status()
    z, codes, labels, scale = random_problem(rng, 4, 9, 5)
    np.testing.assert_allclose(eops.ecoc_cross_entropy(labels, z, codes, scale),
                               decoding.cross_entropy(labels, z, codes, scale), rtol=1e-6)
    monkeypatch.delenv("KERAS_ECOC_DISABLE_FUSED")
    assert eops.fused_available()
    assert eops.fused_status().startswith("fused op loaded from")


# ---------------------------------------------------------------------------
# Loader behaviour (fresh interpreters, so the once-per-process state is clean).

def _run_python(code, **env):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full_env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    TF_CPP_MIN_LOG_LEVEL="3", **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=300, cwd=root)


def test_missing_library_falls_back_with_one_warning():
    # On every backend: the library the backend's fused path loads (the op
    # library on TensorFlow, the kernel library on JAX and PyTorch).
    code = """
import warnings, numpy as np
import keras_ecoc
from keras_ecoc import ops, decoding
assert ops.loss_path(5) != "fused"
status = ops.fused_status()
assert "not built or not loadable" in status and "/nonexistent/x.so" in status, status
z = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
codes = np.eye(5, 3, dtype="float32")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    a = ops.ecoc_cross_entropy([0, 1, 2, 3], z, codes, 2.0)
    ops.ecoc_cross_entropy([0, 1, 2, 3], z, codes, 2.0)
    ops.label_rank([0, 1, 2, 3], z, codes); ops.nearest_codeword(z, codes)
mine = [w for w in caught if "fused ECOC op is unavailable" in str(w.message)]
assert len(mine) == 1, [str(w.message) for w in caught]
np.testing.assert_allclose(a, decoding.cross_entropy([0, 1, 2, 3], z, codes, 2.0), rtol=1e-6)
print("OK")
"""
    library = "KERAS_ECOC_OPS_LIBRARY" if BACKEND == "tensorflow" else "KERAS_ECOC_KERNELS_LIBRARY"
    proc = _run_python(code, KERAS_BACKEND=BACKEND, **{library: "/nonexistent/x.so"})
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.backend_independent
def test_truncated_libraries_are_refused_not_loaded(tmp_path):
    # dlopen of a truncated library dies of SIGBUS (no exception to fall back
    # from): the loader must refuse it by its ELF headers. In a subprocess,
    # so that a regression kills that process, not the test run.
    from keras_ecoc.ops import _loader

    paths = {}
    for env, source in (("KERAS_ECOC_OPS_LIBRARY", _loader.library_path()),
                        ("KERAS_ECOC_KERNELS_LIBRARY", _loader.kernels_path())):
        if not os.path.exists(source):
            pytest.skip(f"{source} is not built")
        with open(source, "rb") as f:
            head = f.read(os.path.getsize(source) // 10)
        paths[env] = str(tmp_path / os.path.basename(source))
        with open(paths[env], "wb") as f:
            f.write(head)
    code = """
import numpy as np
from keras_ecoc import ops, decoding
from keras_ecoc.ops import _loader
assert _loader.load_kernels() is None and "is truncated" in _loader.kernels_error()
assert _loader.load_library() is None and "is truncated" in _loader.load_error()
z = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
codes = np.eye(5, 3, dtype="float32")
a = ops.ecoc_cross_entropy([0, 1, 2, 3], z, codes, 2.0)
np.testing.assert_allclose(a, decoding.cross_entropy([0, 1, 2, 3], z, codes, 2.0), rtol=1e-6)
print("OK")
"""
    proc = _run_python(code, KERAS_BACKEND="tensorflow", **paths)
    assert proc.returncode == 0 and "OK" in proc.stdout, (proc.returncode, proc.stderr[-3000:])


# Its subprocess always runs under JAX: once, in the TensorFlow pass.
@pytest.mark.backend_independent
def test_other_backends_do_not_import_tensorflow():
    pytest.importorskip("jax")
    code = """
import sys, numpy as np
import keras_ecoc
before = "tensorflow" in sys.modules
from keras_ecoc import ops, decoding
assert not ops.fused_available()
assert ops.fused_status().startswith("backend is jax"), ops.fused_status()
z = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
codes = np.eye(5, 3, dtype="float32")
a = ops.ecoc_cross_entropy(np.array([0, 1, 2, 3]), z, codes, 2.0)
np.testing.assert_allclose(np.asarray(a), np.asarray(decoding.cross_entropy(np.array([0, 1, 2, 3]), z, codes, 2.0)))
ops.label_rank(np.array([0, 1, 2, 3]), z, codes); ops.nearest_codeword(z, codes)
print("TF_BEFORE" if before else "", "TF_AFTER" if "tensorflow" in sys.modules else "", "OK")
"""
    proc = _run_python(code, KERAS_BACKEND="jax")
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    if "TF_BEFORE" in proc.stdout:
        pytest.skip("`import keras_ecoc` itself imports tensorflow under jax; cannot check keras_ecoc.ops")
    assert "TF_AFTER" not in proc.stdout, "keras_ecoc.ops imported tensorflow under the jax backend"


def test_scale_as_keras_variable(lib, tf, rng):
    from keras_ecoc import ops as eops

    z, codes, labels, scale = random_problem(rng, 7, 13, 5, scale=3.0)
    var = keras.Variable(3.0, dtype="float32")
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(eops.ecoc_cross_entropy(labels, z, codes, var))
    (ds,) = tape.gradient(total, [var.value])
    _, rds, _ = ref_grads(z, codes, labels, 3.0, np.ones(7))
    np.testing.assert_allclose(float(ds), rds, rtol=1e-4)


def test_xla_works_when_loaded_after_tensorflow_started():
    """The usual order: TF's device context exists before the lazy library load."""
    if BACKEND != "tensorflow":
        pytest.skip(f"backend is {BACKEND}")
    code = """
import numpy as np, tensorflow as tf
tf.constant(1.0) + 1.0  # creates the eager context and the XLA JIT kernels
from keras_ecoc import ops
z = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
codes = np.eye(5, 3, dtype="float32")
f = tf.function(lambda zz: ops.ecoc_cross_entropy([0, 1, 2, 3], zz, codes, 2.0), jit_compile=True)
if not ops.fused_available():
    print("UNAVAILABLE", ops.fused_status()); raise SystemExit(0)
np.testing.assert_allclose(f(z), ops.ecoc_cross_entropy([0, 1, 2, 3], z, codes, 2.0), rtol=1e-5)
print("OK", ops.fused_status())
"""
    proc = _run_python(code, KERAS_BACKEND="tensorflow")
    if "UNAVAILABLE" in proc.stdout and not REQUIRE_FUSED:
        pytest.skip(proc.stdout)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "under XLA: custom calls to the kernel library's FFI handlers on Host" in proc.stdout
