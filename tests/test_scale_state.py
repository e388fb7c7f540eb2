"""The code matrix is state, never a constant; checks read no device values.

Pins what makes a million classes cost what the codes cost (issue 18), with
small matrices: the traced training program (TensorFlow graph, JAX jaxpr)
holds no constant of the codes' size, losses and metrics share one variable,
and on eager PyTorch a loss, metric or op call copies nothing to the host.
"""

import numpy as np
import pytest

import keras

import keras_ecoc
from conftest import reference_loss
from keras_ecoc import ops as ecoc_ops

BACKEND = keras.backend.backend()
N, K, D, B = 3000, 16, 8, 32


def _codes(seed=0, n=N, k=K):
    codes = np.random.default_rng(seed).standard_normal((n, k)).astype("float32")
    return codes / np.linalg.norm(codes, axis=1, keepdims=True)


def _data(seed=1, n=N):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2 * B, D)).astype("float32")
    y = rng.integers(0, n, size=(2 * B,)).astype("int32")
    return x, y


def _dense_model(k=K):
    inputs = keras.Input((D,))
    return keras.Model(inputs, keras.layers.Dense(k)(inputs))


def _classifier(codes):
    inputs = keras.Input((D,))
    backbone = keras.Model(inputs, keras.layers.Dense(D)(inputs))
    return keras_ecoc.ECOCClassifier(backbone, codes)


def _models():
    """(name, compiled model) for the three ways codes enter training."""
    codes = _codes()
    standalone = _dense_model()
    standalone.compile("adam", keras_ecoc.ECOCLoss(codes),
                       metrics=[keras_ecoc.ECOCAccuracy(codes)])
    loss_only = _dense_model()
    loss_only.compile("adam", keras_ecoc.ECOCLoss(_codes(seed=2)), metrics=[])
    classifier = _classifier(_codes(seed=3))
    classifier.compile()
    return [("loss_and_metric", standalone), ("loss_only", loss_only),
            ("classifier", classifier)]


# ---------------------------------------------------------------- sharing


def test_loss_from_decoder_uses_the_decoders_codes_variable():
    decoder = keras_ecoc.ECOCDecoder(_codes())
    decoder.build((None, K))
    loss = keras_ecoc.ECOCLoss.from_decoder(decoder)
    assert loss.codes is decoder.codes


def test_losses_and_metrics_made_from_one_array_share_one_variable():
    codes = _codes()
    loss = keras_ecoc.ECOCLoss(codes)
    top1 = keras_ecoc.ECOCAccuracy(codes)
    top5 = keras_ecoc.ECOCTopKAccuracy(codes, k=5)
    assert loss.codes is top1.codes is top5.codes
    assert isinstance(loss.codes, keras.Variable) and not loss.codes.trainable
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loss.codes), codes)
    # A metric variable on JAX (the metric update is traced with only metric
    # variables mapped), tracked once: JAX donates each state buffer once.
    tracked = [m for m in (top1, top5) if any(v is loss.codes for v in m.variables)]
    assert len(tracked) == (1 if BACKEND == "jax" else 0)
    # Another array (even with equal values) gets its own variable.
    assert keras_ecoc.ECOCLoss(codes.copy()).codes is not loss.codes


def test_metric_reset_keeps_its_codes():
    codes = _codes()
    metric = keras_ecoc.ECOCAccuracy(codes)
    x = np.random.default_rng(0).standard_normal((4, K)).astype("float32")
    metric.update_state(np.arange(4), x)
    metric.reset_state()
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(metric.codes), codes)
    assert float(metric.result()) == 0.0


def test_decoder_drops_its_host_copy_once_built():
    layer = keras_ecoc.ECOCDecoder(_codes())
    layer.build((None, K))
    assert layer._initial_codes is None
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.codes), _codes())
    # Small codes still go into the config (read back from the weight).
    np.testing.assert_array_equal(
        keras_ecoc.ECOCDecoder.from_config(
            keras_ecoc.ECOCDecoder(_codes(n=40)).get_config())._initial_codes,
        _codes(n=40),
    )


# ---------------------------------------------------- traced programs


def _tf_constant_sizes(step, data):
    """Element counts of every Const in `tf.function(step)`'s graph (and library)."""
    import tensorflow as tf

    concrete = tf.function(step).get_concrete_function(data)
    graph_def = concrete.graph.as_graph_def()
    nodes = list(graph_def.node)
    for fn in graph_def.library.function:
        nodes.extend(fn.node_def)
    sizes = []
    for node in nodes:
        if node.op == "Const":
            dims = node.attr["value"].tensor.tensor_shape.dim
            sizes.append(int(np.prod([d.size for d in dims])) if dims else 1)
    return sizes


def _jaxpr_constant_sizes(closed_jaxpr):
    """Element counts of the constants of a closed jaxpr and every sub-jaxpr."""
    from jax.extend import core

    sizes = [int(np.size(c)) for c in closed_jaxpr.consts]
    stack = [closed_jaxpr.jaxpr]
    while stack:
        jaxpr = stack.pop()
        for eqn in jaxpr.eqns:
            for var in eqn.invars:
                if isinstance(var, core.Literal):
                    sizes.append(int(np.size(var.val)))
            for param in eqn.params.values():
                for sub in param if isinstance(param, (list, tuple)) else [param]:
                    if isinstance(sub, core.ClosedJaxpr):
                        sizes.extend(int(np.size(c)) for c in sub.consts)
                        stack.append(sub.jaxpr)
                    elif isinstance(sub, core.Jaxpr):
                        stack.append(sub)
    return sizes


@pytest.mark.parametrize("which", ["loss_and_metric", "loss_only", "classifier"])
def test_traced_train_and_test_steps_hold_no_constant_of_the_codes_size(which):
    if BACKEND == "torch":
        pytest.skip("PyTorch trains eagerly: nothing is traced")
    model = dict(_models())[which]
    x, y = _data()
    model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    model.evaluate(x, y, batch_size=B, verbose=0)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        data = (tf.constant(x[:B]), tf.constant(y[:B]))
        sizes = (_tf_constant_sizes(model.train_step, data)
                 + _tf_constant_sizes(model.test_step, data))
    else:
        import jax

        state = (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            [v.value for v in model.optimizer.variables],
            [v.value for v in model.metrics_variables],
        )
        data = (x[:B], y[:B])
        sizes = _jaxpr_constant_sizes(jax.make_jaxpr(model.train_step)(state, data))
        test_state = (state[0], state[1], state[3])
        sizes += _jaxpr_constant_sizes(jax.make_jaxpr(model.test_step)(test_state, data))
    assert sizes, "no constants found at all: the inspection is broken"
    assert max(sizes) < N * K // 4, sorted(sizes)[-5:]


def _jaxpr_primitive_names(closed_jaxpr):
    """Names of the primitives of a closed jaxpr and every sub-jaxpr."""
    from jax.extend import core

    names = []
    stack = [closed_jaxpr.jaxpr]
    while stack:
        jaxpr = stack.pop()
        for eqn in jaxpr.eqns:
            names.append(eqn.primitive.name)
            for param in eqn.params.values():
                for sub in param if isinstance(param, (list, tuple)) else [param]:
                    if isinstance(sub, core.ClosedJaxpr):
                        stack.append(sub.jaxpr)
                    elif isinstance(sub, core.Jaxpr):
                        stack.append(sub)
    return names


def _jax_train_step_jaxpr(model, x, y):
    import jax

    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.optimizer.variables],
        [v.value for v in model.metrics_variables],
    )
    return jax.make_jaxpr(model.train_step)(state, (x[:B], y[:B]))


@pytest.mark.parametrize("which", ["loss_and_metric", "loss_only", "classifier"])
def test_jax_train_step_reads_codes_as_state_unless_the_loss_stands_alone(which):
    # docs/api.md, "ECOCLoss on JAX": the recommended forms (an ECOCAccuracy
    # made from the loss's array, or ECOCLoss.from_decoder) take the codes
    # as an argument of the step (a metric or model variable): no callback,
    # no constant. A loss alone holds them in a variable the JAX trainer does
    # not map; it reads them through one host callback a step (the
    # documented gap), still with no constant of the codes' size.
    if BACKEND != "jax":
        pytest.skip("JAX trainer only")
    model = dict(_models())[which]
    x, y = _data()
    model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    closed = _jax_train_step_jaxpr(model, x, y)
    callbacks = [n for n in _jaxpr_primitive_names(closed) if "callback" in n]
    assert callbacks == ([] if which != "loss_only" else ["pure_callback"])
    assert max(_jaxpr_constant_sizes(closed)) < N * K // 4
    # The codes are an input of the step exactly when they are state.
    input_sizes = [int(np.prod(v.aval.shape)) for v in closed.jaxpr.invars]
    assert (N * K in input_sizes) == (which != "loss_only")


def test_loss_alone_and_loss_with_metric_train_to_the_float64_loss():
    # Both ways the standalone loss reads its codes on JAX (host callback
    # alone, metric state with an ECOCAccuracy) give the same loss, equal to
    # a float64 NumPy reference at the same weights; on other backends the
    # two forms are the same program.
    codes = _codes(seed=4)
    x, y = _data(seed=5)
    losses = []
    for metrics in ([], [keras_ecoc.ECOCAccuracy(codes)]):
        keras.utils.set_random_seed(0)
        model = _dense_model()
        model.compile("sgd", keras_ecoc.ECOCLoss(codes, scale=4.0), metrics=metrics)
        model.fit(x, y, batch_size=B, epochs=1, verbose=0, shuffle=False)
        z = keras.ops.convert_to_numpy(model(x)).astype("float64")
        u = z / np.linalg.norm(z, axis=1, keepdims=True)
        m = codes.astype("float64")
        logits = -2.0 * ((m * m).sum(1)[None, :] - 2.0 * u @ m.T + 1.0)
        top = logits.max(1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(logits - top).sum(1))
        expected = np.mean(lse - logits[np.arange(len(y)), y])
        got = float(model.evaluate(x, y, batch_size=B, verbose=0, return_dict=True)["loss"])
        np.testing.assert_allclose(got, expected, rtol=1e-4)
        losses.append(got)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


# ------------------------------------------------------------ host syncs


def test_torch_loss_metric_and_ops_read_no_tensor_value_on_the_host(monkeypatch):
    if BACKEND != "torch":
        pytest.skip("PyTorch runs eagerly: a value read is a sync per step")
    import torch

    decoder = keras_ecoc.ECOCDecoder(_codes(), learnable_scale=True, scale=2.0)
    decoder.build((None, K))
    loss = keras_ecoc.ECOCLoss.from_decoder(decoder)
    metric = keras_ecoc.ECOCTopKAccuracy.from_decoder(decoder, k=3)
    standalone = keras_ecoc.ECOCLoss(_codes(seed=5), scale=3.0)
    x, y = _data()
    z = torch.as_tensor(np.random.default_rng(2).standard_normal((2 * B, K)),
                        dtype=torch.float32).requires_grad_()
    labels = torch.as_tensor(y)
    # Only reads made by keras_ecoc's own code count. (The CPU-only compiled
    # scan loop that inductor generates reads its CPU loop counter; it never
    # runs on a GPU, where the loops are uncompiled.)
    reads = _count_host_reads(monkeypatch, torch)
    value = loss(labels, z) + standalone(labels[:, None], z)
    metric.update_state(labels, z)
    value.backward()
    ecoc_ops.ecoc_cross_entropy(labels, z, decoder.codes, decoder.scale)
    ecoc_ops.label_rank(labels, z, decoder.codes)
    ecoc_ops.nearest_codeword(z, decoder.codes)
    monkeypatch.undo()
    assert reads == []
    assert np.isfinite(float(value))


def test_out_of_range_label_tensor_gives_nan_and_zero_gradient_without_a_host_check():
    if BACKEND == "tensorflow" and ecoc_ops.fused_available():
        pytest.skip("the fused TensorFlow CPU kernel rejects it in the kernel")
    codes = _codes(n=50)
    z = np.random.default_rng(3).standard_normal((4, K)).astype("float32")
    labels = keras.ops.convert_to_tensor(np.array([0, 50, 3, -1], "int32"))
    loss = keras.ops.convert_to_numpy(keras_ecoc.ECOCLoss(codes, reduction=None)(labels, z))
    assert np.isnan(loss[[1, 3]]).all() and np.isfinite(loss[[0, 2]]).all()
    # Host data is still checked where it enters, naming the argument.
    with pytest.raises(ValueError, match="y_true"):
        keras_ecoc.ECOCLoss(codes)(np.array([0, 50, 3, 1]), z)


def test_float_label_tensor_values_that_are_not_class_ids_are_invalid_labels():
    # NaN (a missing value in a float column), infinities, fractions and
    # negative values are never a class: a NaN loss and never a hit, as for
    # an integer label out of range. A cast alone made NaN class 0 under XLA.
    codes = _codes(n=50)
    z = np.random.default_rng(5).standard_normal((7, K)).astype("float32")
    values = np.array([0, np.nan, 3, np.inf, 2.5, -1, 49], "float32")
    good = np.array([True, False, True, False, False, False, True])
    labels = keras.ops.convert_to_tensor(values)
    loss = keras_ecoc.ECOCLoss(codes, reduction=None)
    compiled = lambda fn: fn  # noqa: E731
    if BACKEND == "tensorflow" and ecoc_ops.fused_available():
        import tensorflow as tf

        with pytest.raises(tf.errors.InvalidArgumentError, match="labels"):
            loss(labels, z)  # the fused CPU kernel rejects invalid labels eagerly
        compiled = lambda fn: tf.function(fn, jit_compile=True)  # noqa: E731
    per_example = keras.ops.convert_to_numpy(compiled(loss)(labels, z))
    assert np.isnan(per_example[~good]).all()
    np.testing.assert_allclose(
        per_example[good], reference_loss(values[good].astype(int), z[good], codes), rtol=1e-5
    )
    # Every row's z decodes to the label's codeword; only the valid labels hit.
    rows = codes[np.where(good, values, 0).astype(int)]  # unit rows: u is the codeword
    for metric in (keras_ecoc.ECOCAccuracy(codes), keras_ecoc.ECOCTopKAccuracy(codes, k=3)):
        compiled(metric.update_state)(labels, rows)
        assert float(metric.result()) == pytest.approx(good.mean())


# ------------------------------------------------------------- checks


def test_code_checks_find_duplicates_nonfinite_and_keep_the_array():
    codes = _codes(n=20000, k=8)
    checked = keras_ecoc.codes.validate_codes(codes)
    assert checked is codes  # float32 C-contiguous: converted zero times
    dup = codes.copy()
    dup[17] = dup[12345]
    with pytest.raises(ValueError, match="classes 17 and 12345"):
        keras_ecoc.codes.validate_codes(dup)
    signed = codes.copy()
    signed[3] = 0.0
    signed[9] = -0.0
    with pytest.raises(ValueError, match="classes 3 and 9"):
        keras_ecoc.codes.validate_codes(signed)
    bad = codes.copy()
    bad[19999, 7] = np.nan
    with pytest.raises(ValueError, match=r"\(19999, 7\)"):
        keras_ecoc.codes.validate_codes(bad)


def test_duplicate_row_pairs_matches_an_exact_float64_reference():
    from keras_ecoc.codes._validation import duplicate_row_pairs

    rng = np.random.default_rng(4)
    for trial in range(40):
        n, k = int(rng.integers(2, 300)), int(rng.integers(1, 5))
        array = rng.integers(-1, 2, size=(n, k)).astype(
            ["float32", "float64", "int8"][trial % 3])
        rows = [tuple(np.asarray(r, np.float64) + 0.0) for r in array]
        expected = sorted((i, j) for i in range(n) for j in range(i + 1, n)
                          if rows[i] == rows[j])
        pairs, total = duplicate_row_pairs(array)
        assert (pairs, total) == (expected, len(expected))
        assert duplicate_row_pairs(array, max_pairs=3) == (expected[:3], len(expected))


# ------------------------------------------------------------- saving


def test_reloaded_classifier_stores_codes_once_and_its_metric_follows_them(tmp_path):
    import zipfile

    codes = _codes(n=5000)  # 80,000 entries: too many for a config
    model = _classifier(codes)
    model.compile()
    x, y = _data(n=5000)
    y[:8] = model.predict_classes(x[:8], verbose=0)  # some hits for the metric
    model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    before = model.evaluate(x, y, batch_size=B, verbose=0, return_dict=True)
    path = str(tmp_path / "model.keras")
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        assert archive.getinfo("config.json").file_size < 20_000
        weights = archive.getinfo("model.weights.h5").file_size
    # One copy of the codes (plus the small Dense weights), not two.
    assert codes.nbytes < weights < 1.5 * codes.nbytes
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(
        loaded.predict_classes(x, verbose=0), model.predict_classes(x, verbose=0))
    after = loaded.evaluate(x, y, batch_size=B, verbose=0, return_dict=True)
    assert after["ecoc_accuracy"] == pytest.approx(before["ecoc_accuracy"])
    assert after["ecoc_accuracy"] > 0
    assert after["loss"] == pytest.approx(before["loss"], rel=1e-5)
    metric = [m for m in loaded._compile_metrics.metrics
              if isinstance(m, keras_ecoc.ECOCAccuracy)][0]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(metric.codes), codes)


def _count_host_reads(monkeypatch, torch):
    """Patches torch.Tensor's value reads; returns the list of reads made by
    keras_ecoc's own code (caller frame in the package)."""
    import os
    import sys

    package = os.path.dirname(keras_ecoc.__file__)
    reads = []
    for name in ("item", "cpu", "numpy", "tolist", "__bool__", "__int__",
                 "__float__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _name=name, _original=original, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(package):
                reads.append((_name, caller, sys._getframe(1).f_lineno))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return reads


def test_torch_fit_and_evaluate_steps_read_no_tensor_value_in_keras_ecoc(monkeypatch):
    if BACKEND != "torch":
        pytest.skip("PyTorch trains eagerly: a value read is a sync per step")
    import torch

    x, y = _data()
    for name, model in _models():
        model.fit(x, y, batch_size=B, epochs=1, verbose=0)  # builds outside the count
        reads = _count_host_reads(monkeypatch, torch)
        model.fit(x, y, batch_size=B, epochs=1, verbose=0)
        model.evaluate(x, y, batch_size=B, verbose=0)
        monkeypatch.undo()
        assert reads == [], name


# ------------------------------------------------------------- loading


def test_load_rows_writes_row_blocks_in_place_and_matches_the_source():
    from keras_ecoc.layers import load_rows

    rng = np.random.default_rng(7)
    n, k = 1001, 7
    source = rng.standard_normal((n, k)).astype("float32")
    variable = keras.Variable(np.full((n, k), np.nan, "float32"), trainable=False)
    before = _buffer_address(variable)
    # 100-row blocks: ten full ones and a ragged last block of one row.
    load_rows(variable, source, block_bytes=100 * k * 4)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), source)
    if BACKEND in ("torch", "tensorflow"):
        assert _buffer_address(variable) == before
    with pytest.raises(ValueError, match=r"shape \(1000, 7\)"):
        load_rows(variable, source[:1000])


def _buffer_address(variable):
    if BACKEND == "torch":
        return variable.value.data_ptr()
    if BACKEND == "tensorflow":
        return id(variable.value.handle)
    return None


def test_reload_reads_the_codes_in_row_blocks_never_the_whole_matrix(monkeypatch, tmp_path):
    import h5py

    from keras_ecoc import layers

    n = 5000
    codes = _codes(n=n)
    model = _classifier(codes)
    model.compile()
    x, _ = _data(n=n)
    expected = model.predict_classes(x, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)

    block_rows = 700
    monkeypatch.setattr(layers, "_LOAD_BLOCK_BYTES", block_rows * K * 4)
    code_reads, whole_reads = [], []
    getitem, as_array = h5py.Dataset.__getitem__, h5py.Dataset.__array__

    def recording_getitem(self, selection, *args, **kwargs):
        out = getitem(self, selection, *args, **kwargs)
        if self.shape == (n, K):
            code_reads.append(np.shape(out))
        return out

    def recording_array(self, *args, **kwargs):
        if self.shape == (n, K):
            whole_reads.append(self.name)
        return as_array(self, *args, **kwargs)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", recording_getitem)
    monkeypatch.setattr(h5py.Dataset, "__array__", recording_array)
    loaded = keras.saving.load_model(path)
    monkeypatch.undo()
    assert whole_reads == []
    assert code_reads and all(s[0] <= block_rows for s in code_reads)
    assert sum(s[0] for s in code_reads) >= n
    np.testing.assert_array_equal(loaded.predict_classes(x, verbose=0), expected)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded.codes), codes)
