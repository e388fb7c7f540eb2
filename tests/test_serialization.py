"""Saving and loading: codes stored once, small configs, one output definition.

Issue 8, items 9 and 10: a compiled `ECOCClassifier` with many classes saves
and loads (its codes live only in the decoder's weights; the config of the
layer, the loss and the metrics stay small), and `model(x)`, `predict`,
`evaluate` and the serving model agree on what they return.
"""

import json
import os
import warnings
import zipfile

import keras
import numpy as np
import pytest
from conftest import reference_logits
from keras import ops

import keras_ecoc
from keras_ecoc import _validation


def _backbone(width=10):
    inputs = keras.Input((width,))
    return keras.Model(inputs, keras.layers.Dense(16, activation="relu")(inputs))


def _codes(n, k, seed=0):
    return keras_ecoc.codes.normalize_rows(
        np.random.default_rng(seed).normal(size=(n, k)).astype("float32")
    )


def _config_json(path):
    with zipfile.ZipFile(path) as archive:
        return archive.read("config.json")


def _reference_probabilities(z, codes, scale):
    logits = reference_logits(z, codes, scale)
    logits -= logits.max(-1, keepdims=True)
    p = np.exp(logits)
    return p / p.sum(-1, keepdims=True)


@pytest.fixture
def dtype_policy(request):
    """Sets the global dtype policy for one test and restores it after."""
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(request.param)
    yield request.param
    keras.config.set_dtype_policy(before)


@pytest.mark.parametrize("num_classes, code_length, dtype_policy", [
    (3000, 100, "float32"), (100_000, 8, "float32"), (100_000, 8, "mixed_float16"),
], indirect=["dtype_policy"])
def test_compiled_classifier_with_many_classes_saves_and_loads(
    rng, tmp_path, num_classes, code_length, dtype_policy
):
    x = rng.normal(size=(24, 10)).astype("float32")
    y = rng.integers(0, num_classes, size=24)
    model = keras_ecoc.ECOCClassifier(_backbone(), _codes(num_classes, code_length))
    model.compile()
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    path = os.path.join(tmp_path, "many.keras")
    model.save(path)
    config = _config_json(path)
    assert len(config) < 100_000
    restored = keras.models.load_model(path)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(restored.codes), ops.convert_to_numpy(model.codes)
    )
    np.testing.assert_array_equal(model.predict_proba(x, verbose=0),
                                  restored.predict_proba(x, verbose=0))
    np.testing.assert_array_equal(model.predict_classes(x, verbose=0),
                                  restored.predict_classes(x, verbose=0))
    # Compile state: the same loss (bound to the restored decoder, so the
    # learnable scale keeps training), metric and optimizer state.
    assert isinstance(restored.loss, keras_ecoc.ECOCLoss)
    assert restored.loss._decoder is restored.decoder
    assert int(ops.convert_to_numpy(restored.optimizer.iterations)) == 3
    for before, after in zip(model.optimizer.variables, restored.optimizer.variables):
        np.testing.assert_array_equal(ops.convert_to_numpy(before),
                                      ops.convert_to_numpy(after))
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0),
                               restored.evaluate(x, y, verbose=0), rtol=1e-6)
    restored.fit(x, y, epochs=1, batch_size=8, verbose=0)  # still trainable


def test_classifier_config_holds_no_large_codes():
    model = keras_ecoc.ECOCClassifier(_backbone(), _codes(3000, 100))
    model.compile()
    decoder_config = model.decoder.get_config()
    assert "codes" not in decoder_config
    assert decoder_config["num_classes"] == 3000
    loss_config = model.loss.get_config()
    assert loss_config["codes"] is None and loss_config["decoder"] == "ecoc_decoder"
    metric = model._compile_metrics._user_metrics[0]
    assert metric.get_config()["codes"] is None


def test_classifier_rebuilt_from_config_without_weights_predicts_no_class(rng):
    model = keras_ecoc.ECOCClassifier(_backbone(), _codes(3000, 100))
    rebuilt = keras_ecoc.ECOCClassifier.from_config(model.get_config())
    x = rng.normal(size=(5, 10)).astype("float32")
    # NaN placeholder codes until weights are loaded: no row decodes to a
    # class (before: every row was class 0).
    np.testing.assert_array_equal(rebuilt.predict_classes(x, verbose=0), -1)
    assert np.all(np.isnan(rebuilt.predict_proba(x, verbose=0)))


def test_standalone_loss_and_metrics_round_trip_through_their_config(rng):
    codes = _codes(12, 5)
    y = rng.integers(0, 12, size=7)
    z = rng.normal(size=(7, 5)).astype("float32")
    loss = keras_ecoc.ECOCLoss(codes, scale=2.5, name="my_loss")
    restored = keras_ecoc.ECOCLoss.from_config(json.loads(json.dumps(loss.get_config())))
    assert restored.scale == 2.5 and restored.name == "my_loss"
    np.testing.assert_array_equal(ops.convert_to_numpy(restored(y, z)),
                                  ops.convert_to_numpy(loss(y, z)))
    metric = keras_ecoc.ECOCTopKAccuracy(codes, k=3)
    copy = keras_ecoc.ECOCTopKAccuracy.from_config(json.loads(json.dumps(metric.get_config())))
    metric.update_state(y, z)
    copy.update_state(y, z)
    assert copy.k == 3
    assert float(copy.result()) == float(metric.result())


def test_standalone_loss_with_large_codes_writes_them_compactly():
    codes = _codes(5000, 16)
    loss = keras_ecoc.ECOCLoss(codes)
    config = loss.get_config()
    assert "float32_base64" in config["codes"]
    restored = keras_ecoc.ECOCLoss.from_config(json.loads(json.dumps(config)))
    np.testing.assert_array_equal(restored.codes, codes)


def test_loss_from_decoder_in_a_plain_model_reloads(rng, tmp_path):
    codes = _codes(9, 4)
    decoder = keras_ecoc.ECOCDecoder(codes, scale=2.0)
    inputs = keras.Input((10,))
    model = keras.Model(inputs, keras.layers.Dense(4)(inputs))
    model.compile("adam", keras_ecoc.ECOCLoss.from_decoder(decoder),
                  metrics=[keras_ecoc.ECOCAccuracy.from_decoder(decoder)])
    x = rng.normal(size=(6, 10)).astype("float32")
    y = rng.integers(0, 9, size=6)
    model.fit(x, y, epochs=1, verbose=0)
    path = os.path.join(tmp_path, "plain.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    # Small codes also travel in the loss config, so a plain model's loss
    # works after loading without being bound again.
    np.testing.assert_allclose(restored.evaluate(x, y, verbose=0),
                               model.evaluate(x, y, verbose=0), rtol=1e-6)


def test_reloaded_loss_that_followed_a_learnable_scale_warns_until_bound(rng, tmp_path):
    # Outside ECOCClassifier nothing binds the reloaded loss to its decoder:
    # it then trains with the saved scale as a constant, so it says so once,
    # and after `bind` the decoder's scale trains again.
    codes = _codes(9, 4)
    inputs = keras.Input((10,))
    z = keras.layers.Dense(4)(inputs)
    decoder = keras_ecoc.ECOCDecoder(codes, learnable_scale=True, name="dec")
    model = keras.Model(inputs, [z, decoder(z)])
    model.compile(keras.optimizers.Adam(0.05), [keras_ecoc.ECOCLoss.from_decoder(decoder), None])
    x = rng.normal(size=(32, 10)).astype("float32")
    y = rng.integers(0, 9, size=32)
    model.fit(x, (y, y), epochs=1, verbose=0)
    path = os.path.join(tmp_path, "scale.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    loss = restored.loss[0]
    scale = restored.get_layer("dec").log_scale
    saved = np.array(ops.convert_to_numpy(scale))
    # Plain SGD: the restored Adam's momentum would move the scale without
    # a gradient.
    restored.compile(keras.optimizers.SGD(0.5), [loss, None])
    with pytest.warns(UserWarning, match=r"loss.bind\(model.get_layer\('dec'\)\)"):
        restored.fit(x, (y, y), epochs=1, verbose=0)
    np.testing.assert_array_equal(ops.convert_to_numpy(scale), saved)
    loss.bind(restored.get_layer("dec"))
    restored.compile(keras.optimizers.SGD(0.5), [loss, None])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="This ECOCLoss")
        restored.fit(x, (y, y), epochs=1, verbose=0)
    assert not np.array_equal(ops.convert_to_numpy(scale), saved)
    # A re-saved unbound loss keeps saying which decoder's scale it followed.
    config = keras_ecoc.ECOCLoss.from_config(loss.get_config()).get_config()
    assert config["follows_learnable_scale"] is True and config["decoder"] == "dec"


def test_unbound_reference_without_codes_raises_a_clear_error(rng):
    loss = keras_ecoc.ECOCLoss.from_config(
        {"codes": None, "decoder": "ecoc_decoder", "scale": 1.0,
         "name": "ecoc_loss", "reduction": "sum_over_batch_size"}
    )
    with pytest.raises(ValueError, match="bind"):
        loss(np.zeros(2, "int32"), np.ones((2, 3), "float32"))
    decoder = keras_ecoc.ECOCDecoder(_codes(4, 3))
    loss.bind(decoder)
    assert np.isfinite(float(loss(np.zeros(2, "int32"), np.ones((2, 3), "float32"))))


def test_decoder_configs_stay_small_whatever_the_number_of_classes():
    for n, k in [(64, 64), (4097, 1), (20_000, 32)]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            decoder = keras_ecoc.ECOCDecoder(
                np.arange(n * k, dtype="float32").reshape(n, k))
        assert len(json.dumps(decoder.get_config())) < 100_000
        assert ("codes" in decoder.get_config()) == (n * k <= _validation.MAX_CONFIG_CODE_ENTRIES)


# --- item 10: one definition of the classifier's output ---------------------


def test_classifier_call_predict_and_evaluate_all_see_z(rng):
    codes = _codes(8, 6)
    model = keras_ecoc.ECOCClassifier(_backbone(), codes, scale=2.0, learnable_scale=False)
    model.compile()
    x = rng.normal(size=(16, 10)).astype("float32")
    y = rng.integers(0, 8, size=16)
    z = model.predict(x, verbose=0)
    assert z.shape == (16, 6)
    np.testing.assert_allclose(z, ops.convert_to_numpy(model(x)), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(z, model.predict_codes(x, verbose=0))
    loss, accuracy = model.evaluate(x, y, batch_size=16, verbose=0)
    logits = reference_logits(z, codes, 2.0)
    shifted = logits - logits.max(-1, keepdims=True)
    expected = np.mean(np.log(np.exp(shifted).sum(-1)) - shifted[np.arange(16), y])
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(accuracy, np.mean(np.argmax(logits, -1) == y))


@pytest.mark.parametrize("output", ["probabilities", "logits", "log_probabilities"])
def test_serving_model_returns_decoded_outputs(rng, output):
    codes = _codes(8, 6)
    model = keras_ecoc.ECOCClassifier(_backbone(), codes, scale=3.0)
    x = rng.normal(size=(5, 10)).astype("float32")
    serving = model.serving_model(output)
    got = ops.convert_to_numpy(serving(x))
    z = model.predict(x, verbose=0)
    logits = reference_logits(z, codes, 3.0)
    expected = {
        "logits": logits,
        "probabilities": _reference_probabilities(z, codes, 3.0),
        "log_probabilities": np.log(_reference_probabilities(z, codes, 3.0)),
    }[output]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # Shares the classifier's variables: no copy of the codes.
    assert any(v is model.decoder.codes for v in serving.weights)
    with pytest.raises(ValueError, match="output"):
        model.serving_model("classes")


@pytest.mark.parametrize("output", ["probabilities", "log_probabilities"])
def test_serving_model_saves_reloads_and_clones_with_the_same_outputs(rng, tmp_path, output):
    # It used to end in a private wrapper layer with no config: save, to_json
    # and clone_model raised NotImplementedError.
    codes = _codes(8, 6)
    model = keras_ecoc.ECOCClassifier(_backbone(), codes, scale=2.0, learnable_scale=True)
    model.decoder.log_scale.assign(0.3)  # a trained scale, not the initial one
    x = rng.normal(size=(5, 10)).astype("float32")
    serving = model.serving_model(output)
    expected = ops.convert_to_numpy(serving(x))
    path = os.path.join(tmp_path, "serving.keras")
    serving.save(path)
    reloaded = keras.models.load_model(path)
    np.testing.assert_array_equal(ops.convert_to_numpy(reloaded(x)), expected)
    clone = keras.models.clone_model(serving)
    clone.set_weights(serving.get_weights())
    np.testing.assert_allclose(ops.convert_to_numpy(clone(x)), expected, rtol=1e-6)
    assert keras.models.model_from_json(serving.to_json()) is not None


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="tf_saved_model export needs the TensorFlow backend")
def test_exported_serving_model_returns_probabilities(rng, tmp_path):
    import tensorflow as tf

    codes = _codes(8, 6)
    model = keras_ecoc.ECOCClassifier(_backbone(), codes, scale=3.0)
    x = rng.normal(size=(5, 10)).astype("float32")
    path = os.path.join(tmp_path, "serving")
    model.serving_model().export(path, format="tf_saved_model", verbose=False)
    loaded = tf.saved_model.load(path)
    served = loaded.serve(tf.constant(x)).numpy()
    np.testing.assert_allclose(served, model.predict_proba(x, verbose=0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(served.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="only JAX metrics keep a device copy of the decoder's codes",
)
def test_loaded_jax_metric_shares_the_decoder_codes_until_its_first_step(
    rng, tmp_path
):
    # 100,000 x 8 codes are too large for the configs: they come from the
    # weights file, whose in-memory read is alive while the weights load.
    x = rng.normal(size=(24, 10)).astype("float32")
    y = rng.integers(0, 100_000, size=24)
    model = keras_ecoc.ECOCClassifier(_backbone(), _codes(100_000, 8))
    model.compile()
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    path = os.path.join(tmp_path, "shared.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    metric = restored._compile_metrics._user_metrics[0]
    decoder_codes = restored.decoder.codes.value
    # No copy made by the load: the metric holds the decoder's array.
    assert metric.codes.value is decoder_codes
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0),
                               restored.evaluate(x, y, verbose=0), rtol=1e-6)
    # The first test function gave the metric its own buffer (a JAX step
    # donates every state buffer), with the decoder's values.
    assert metric.codes.value is not restored.decoder.codes.value
    np.testing.assert_array_equal(np.asarray(metric.codes.value),
                                  np.asarray(restored.decoder.codes.value))
    np.testing.assert_array_equal(np.asarray(restored.decoder.codes.value),
                                  ops.convert_to_numpy(model.codes))
    history = restored.fit(x, y, epochs=1, batch_size=8, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    np.testing.assert_array_equal(np.asarray(metric.codes.value),
                                  ops.convert_to_numpy(model.codes))
