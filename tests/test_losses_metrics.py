"""ECOCLoss and the ECOC accuracy metrics against float64 references."""

import keras
import numpy as np
import pytest
from conftest import backend_grad
from conftest import reference_grad_z
from conftest import reference_logits
from conftest import reference_loss
from keras import ops

import keras_ecoc


def _inputs(rng, batch=8, num_classes=11, code_length=5):
    z = rng.normal(size=(batch, code_length)).astype("float32")
    codes = rng.normal(size=(num_classes, code_length)).astype("float32")
    labels = rng.integers(0, num_classes, size=batch)
    return z, codes, labels


@pytest.mark.parametrize("scale", [1.0, 5.0])
def test_loss_is_mean_reference_cross_entropy(rng, scale):
    z, codes, labels = _inputs(rng)
    loss = keras_ecoc.ECOCLoss(codes, scale=scale)(labels, z)
    np.testing.assert_allclose(
        float(ops.convert_to_numpy(loss)),
        reference_loss(labels, z, codes, scale).mean(), rtol=1e-5,
    )


def test_loss_reductions_and_sample_weights(rng):
    z, codes, labels = _inputs(rng)
    weights = rng.uniform(size=len(labels)).astype("float32")
    per_example = reference_loss(labels, z, codes)
    none = keras_ecoc.ECOCLoss(codes, reduction=None)(labels, z)
    np.testing.assert_allclose(ops.convert_to_numpy(none), per_example, rtol=1e-5)
    summed = keras_ecoc.ECOCLoss(codes, reduction="sum")(labels, z, weights)
    np.testing.assert_allclose(float(ops.convert_to_numpy(summed)),
                               np.sum(weights * per_example), rtol=1e-5)


def test_loss_accepts_column_labels(rng):
    z, codes, labels = _inputs(rng)
    loss = keras_ecoc.ECOCLoss(codes)
    np.testing.assert_allclose(ops.convert_to_numpy(loss(labels[:, None], z)),
                               ops.convert_to_numpy(loss(labels, z)), rtol=1e-6)


def test_loss_function_gradient_is_the_papers_analytic_gradient(rng):
    z, codes, labels = _inputs(rng, batch=5)
    grad = backend_grad(
        lambda t: ops.sum(keras_ecoc.ecoc_cross_entropy(labels, t, codes, 3.0)), z
    )
    np.testing.assert_allclose(grad, reference_grad_z(labels, z, codes, 3.0),
                               rtol=1e-4, atol=1e-5)


def test_loss_config_round_trip(rng):
    _, codes, _ = _inputs(rng)
    loss = keras_ecoc.ECOCLoss(codes, scale=2.0, reduction="sum", name="l")
    clone = keras_ecoc.ECOCLoss.from_config(loss.get_config())
    np.testing.assert_array_equal(clone.codes, codes)
    assert (clone.scale, clone.reduction, clone.name) == (2.0, "sum", "l")
    big = rng.normal(size=(3000, 32)).astype("float32")
    config = keras_ecoc.ECOCLoss(big).get_config()
    assert isinstance(config["codes"], dict)  # compact base64, not a list
    np.testing.assert_array_equal(keras_ecoc.ECOCLoss.from_config(config).codes, big)


def test_labels_outside_range_raise_value_error(rng):
    z, codes, _ = _inputs(rng, batch=3, num_classes=4)
    loss = keras_ecoc.ECOCLoss(codes)
    with pytest.raises(ValueError, match=r"y_true.*\[0, 4\)"):
        loss(np.array([0, 4, 1]), z)
    with pytest.raises(ValueError, match=r"y_true.*\[0, 4\)"):
        loss(np.array([0, -1, 1]), z)


def test_z_width_mismatch_raises_value_error(rng):
    z, codes, labels = _inputs(rng, code_length=5)
    with pytest.raises(ValueError, match="y_pred"):
        keras_ecoc.ECOCLoss(codes)(labels, z[:, :4])


def test_one_hot_targets_are_rejected_with_a_clear_error(rng):
    z, codes, labels = _inputs(rng)
    one_hot = np.eye(codes.shape[0])[labels]
    with pytest.raises(ValueError, match="integer class ids"):
        keras_ecoc.ECOCLoss(codes)(one_hot, z)


def test_accuracy_metrics_match_reference_decoding(rng):
    z, codes, labels = _inputs(rng, batch=200, num_classes=30, code_length=6)
    logits = reference_logits(z, codes)
    rank = np.sum(logits > logits[np.arange(200), labels][:, None], axis=-1)
    top1 = keras_ecoc.ECOCAccuracy(codes)
    top1.update_state(labels, z)
    top5 = keras_ecoc.ECOCTopKAccuracy(codes, k=5)
    top5.update_state(labels, z)
    np.testing.assert_allclose(float(top1.result()), np.mean(rank == 0), rtol=1e-6)
    np.testing.assert_allclose(float(top5.result()), np.mean(rank < 5), rtol=1e-6)
    # Accuracy equals argmax of the decoder's logits.
    np.testing.assert_allclose(
        float(top1.result()), np.mean(np.argmax(logits, -1) == labels), rtol=1e-6
    )


def test_accuracy_breaks_exact_ties_like_argmax_and_top_k_counts_them(rng):
    # z = 0 (a dead network) is equally close to every +-1 codeword: the
    # nearest codeword is class 0, as for predict_classes and Keras'
    # `accuracy`; top-k counts tied classes as in, as Keras' top-k does.
    num_classes, code_length = 12, 8
    codes = keras_ecoc.codes.make_codes("dense_random", num_classes, code_length, seed=2)
    labels = rng.integers(0, num_classes, size=40)
    labels[:3] = 0
    z = np.zeros((40, code_length), "float32")
    z[-5:] = codes[labels[-5:]] + 0.01  # rows that decode to their label
    logits = reference_logits(z, codes)
    top1 = keras_ecoc.ECOCAccuracy(codes)
    top1.update_state(labels, z)
    expected = np.mean(np.argmax(logits, -1) == labels)
    assert expected < 0.5
    np.testing.assert_allclose(float(top1.result()), expected, rtol=1e-6)
    tied_top1 = keras_ecoc.ECOCTopKAccuracy(codes, k=1)
    tied_top1.update_state(labels, z)
    assert float(tied_top1.result()) == 1.0


def test_metric_config_round_trip(rng):
    _, codes, _ = _inputs(rng)
    metric = keras_ecoc.ECOCTopKAccuracy(codes, k=3, name="t3")
    clone = keras_ecoc.ECOCTopKAccuracy.from_config(metric.get_config())
    assert clone.k == 3 and clone.name == "t3"
    np.testing.assert_array_equal(clone.codes, codes)
    acc = keras_ecoc.ECOCAccuracy.from_config(keras_ecoc.ECOCAccuracy(codes).get_config())
    assert acc.k == 1


def test_bad_metric_and_loss_arguments(rng):
    _, codes, _ = _inputs(rng)
    with pytest.raises(ValueError, match="`k`"):
        keras_ecoc.ECOCTopKAccuracy(codes, k=0)
    with pytest.raises(ValueError, match="scale"):
        keras_ecoc.ECOCLoss(codes, scale=0)
    with pytest.raises(ValueError, match="codes"):
        keras_ecoc.ECOCLoss(np.ones((4, 3)))


def test_loss_and_metric_train_a_model_on_z(rng):
    num_classes, code_length = 8, 6
    codes = keras_ecoc.codes.normalize_rows(keras_ecoc.codes.gaussian(num_classes, code_length, seed=0))
    x = rng.normal(size=(320, 10)).astype("float32")
    y = rng.integers(0, num_classes, size=320)
    x[np.arange(320), y] += 4.0
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(code_length)])
    model.compile(keras.optimizers.Adam(0.05), keras_ecoc.ECOCLoss(codes, scale=8.0),
                  metrics=[keras_ecoc.ECOCAccuracy(codes)])
    history = model.fit(x, y, epochs=15, batch_size=32, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0] / 2
    assert history.history["ecoc_accuracy"][-1] > 0.9


def test_loss_honours_the_keras_mask_in_evaluate_and_fit(rng):
    # Padded timesteps (masked by `Masking`) must not count, as with Keras'
    # own losses; on JAX the mask of a traced z sits in Keras' table, not on
    # the array.
    num_classes, code_length, steps, width = 13, 5, 5, 7
    codes = keras_ecoc.codes.make_codes("dense_random", num_classes, code_length, seed=0)
    x = rng.normal(size=(6, steps, width)).astype("float32")
    x[:, 3:] = 0.0
    y = rng.integers(0, num_classes, size=(6, steps))
    inputs = keras.Input((steps, width))
    model = keras.Model(
        inputs, keras.layers.Dense(code_length)(keras.layers.Masking(0.0)(inputs))
    )
    model.compile(keras.optimizers.SGD(0.5), keras_ecoc.ECOCLoss(codes))
    z = np.asarray(model.predict(x, verbose=0), np.float64)
    per_step = reference_loss(y.reshape(-1), z.reshape(-1, code_length), codes)
    mask = np.any(x != 0, axis=-1).reshape(-1)
    expected = per_step[mask].mean()
    assert abs(expected - per_step.mean()) > 1e-3  # the mask changes the mean
    np.testing.assert_allclose(model.evaluate(x, y, batch_size=6, verbose=0), expected, rtol=1e-5)
    # One SGD step moves the weights as Keras' own loss on decoded logits does.
    reference = keras.Model(inputs, keras_ecoc.ECOCDecoder(codes)(model.outputs[0]))
    reference.compile(
        keras.optimizers.SGD(0.5),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    before = [np.array(w) for w in model.get_weights()]
    model.fit(x, y, batch_size=6, epochs=1, verbose=0)
    after = [np.array(w) for w in model.get_weights()]
    reference.set_weights(before + [codes])
    reference.fit(x, y, batch_size=6, epochs=1, verbose=0)
    for got, want in zip(after, reference.get_weights()[: len(after)]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_two_models_compiled_from_one_code_matrix_run_in_turn(rng):
    # Their losses and metrics share one codes variable. On JAX the first
    # model's metric tracks it, and its steps donate the array that the
    # second model's program reads: that program must read the variable when
    # it runs (here it once returned a deleted array).
    num_classes, code_length = 17, 6
    codes = keras_ecoc.codes.make_codes("dense_random", num_classes, code_length, seed=1)
    x = rng.normal(size=(32, 9)).astype("float32")
    y = rng.integers(0, num_classes, size=32)

    def compiled():
        model = keras.Sequential([keras.Input((9,)), keras.layers.Dense(code_length)])
        model.compile(
            "adam",
            keras_ecoc.ECOCLoss(codes),
            metrics=[keras_ecoc.ECOCAccuracy(codes)],
        )
        return model

    first, second = compiled(), compiled()
    for _ in range(2):  # the second round runs the programs traced in the first
        first.fit(x, y, epochs=1, verbose=0)
        second.fit(x, y, epochs=1, verbose=0)
        first.evaluate(x, y, verbose=0)
        second.evaluate(x, y, verbose=0)
    for model in (second, first):
        loss, accuracy = model.evaluate(x, y, batch_size=32, verbose=0)
        z = model.predict(x, verbose=0)
        np.testing.assert_allclose(loss, reference_loss(y, z, codes).mean(), rtol=1e-5)
        logits = reference_logits(z, codes)
        np.testing.assert_allclose(accuracy, np.mean(np.argmax(logits, -1) == y), rtol=1e-6)
