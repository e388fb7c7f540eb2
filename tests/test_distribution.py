"""Multi-device training: tf.distribute.MirroredStrategy and JAX DataParallel.

Each case runs in a subprocess, because logical devices must be configured
before the framework initializes and that cannot be undone in this process.
"""

import os
import subprocess
import sys
import textwrap

import keras
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_COMMON = """
import numpy as np
import keras
import keras_ecoc

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 10)).astype("float32")
y = rng.integers(0, 8, size=256)
x[np.arange(256), y] += 4.0
codes = keras_ecoc.codes.normalize_rows(keras_ecoc.codes.gaussian(8, 6, seed=0))

def make_model():
    inputs = keras.Input((10,))
    backbone = keras.Model(inputs, keras.layers.Dense(16, activation="relu")(inputs))
    model = keras_ecoc.ECOCClassifier(backbone, codes)
    model.compile(optimizer=keras.optimizers.Adam(0.02))
    return model
"""


def _run(script, backend, extra_env=None):
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT)
    env.update(extra_env or {})
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="MirroredStrategy is TensorFlow's")
def test_mirrored_strategy_on_two_logical_cpus_trains_classifier():
    script = textwrap.dedent("""
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    """) + _COMMON + textwrap.dedent("""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        model = make_model()
    history = model.fit(x, y, epochs=10, batch_size=32, verbose=0)
    print("ACC", history.history["ecoc_accuracy"][-1])
    assert history.history["ecoc_accuracy"][-1] > 0.85, history.history
    """)
    assert "ACC" in _run(script, "tensorflow")


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="MirroredStrategy is TensorFlow's")
def test_a_saved_classifier_loads_inside_a_mirrored_strategy_scope(tmp_path):
    # The codes are written block by block into the variable's buffer; a
    # mirrored variable has one buffer per replica and no single handle, and
    # load_model / load_weights in the scope used to fail on it.
    script = textwrap.dedent("""
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    """) + _COMMON + textwrap.dedent(f"""
    model = make_model()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    path = {str(tmp_path / "clf.keras")!r}
    model.save(path)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        loaded = keras.models.load_model(path)
    for replica_codes in loaded.decoder.codes.value.values:
        np.testing.assert_array_equal(replica_codes.numpy(), codes)
    np.testing.assert_array_equal(loaded.predict_classes(x, verbose=0),
                                  model.predict_classes(x, verbose=0))
    model.save_weights(path.replace(".keras", ".weights.h5"))
    with strategy.scope():
        # Codes from the weights alone (NaN until they are loaded).
        inputs = keras.Input((10,))
        backbone = keras.Model(inputs, keras.layers.Dense(16, activation="relu")(inputs))
        rebuilt = keras_ecoc.ECOCClassifier(backbone, {{"num_classes": 8, "code_length": 6}})
        rebuilt.load_weights(path.replace(".keras", ".weights.h5"))
    for replica_codes in rebuilt.decoder.codes.value.values:
        np.testing.assert_array_equal(replica_codes.numpy(), codes)
    print("OK")
    """)
    assert "OK" in _run(script, "tensorflow")


@pytest.mark.skipif(keras.backend.backend() != "jax",
                    reason="keras.distribution.DataParallel runs on JAX")
def test_jax_data_parallel_on_two_cpu_devices_trains_classifier():
    script = textwrap.dedent("""
    import keras
    devices = keras.distribution.list_devices("cpu")
    assert len(devices) == 2, devices
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=devices))
    """) + _COMMON + textwrap.dedent("""
    model = make_model()
    history = model.fit(x, y, epochs=10, batch_size=32, verbose=0)
    print("ACC", history.history["ecoc_accuracy"][-1])
    assert history.history["ecoc_accuracy"][-1] > 0.85, history.history
    """)
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    assert "ACC" in _run(script, "jax", {"XLA_FLAGS": flags})
