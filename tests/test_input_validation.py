"""Bad input gets a ValueError naming the argument (issue 8, item 12)."""

import keras
import numpy as np
import pytest
from conftest import count_calls, reference_logits
from keras import ops

import keras_ecoc
from ecoc_research import datasets


def _codes(n=6, k=4, seed=0):
    return keras_ecoc.codes.normalize_rows(keras_ecoc.codes.gaussian(n, k, seed=seed))


def _reference_loss(y, z, codes, scale=1.0):
    logits = reference_logits(z, codes, scale)
    top = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(-1)) + top[:, 0]
    return lse - logits[np.arange(len(y)), y]


def test_codes_given_as_a_nested_list_are_converted(rng):
    codes = _codes()
    y = rng.integers(0, 6, size=5)
    z = rng.normal(size=(5, 4)).astype("float32")
    got = ops.convert_to_numpy(keras_ecoc.ecoc_cross_entropy(y, z, codes.tolist()))
    np.testing.assert_allclose(got, _reference_loss(y, z, codes), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(6,), (2, 3, 4), ()])
def test_codes_of_rank_other_than_two_raise(shape):
    codes = np.arange(int(np.prod(shape)), dtype="float32").reshape(shape)
    z = np.ones((2, 4), "float32")
    with pytest.raises(ValueError, match="codes"):
        keras_ecoc.ecoc_cross_entropy(np.zeros(2, "int32"), z, codes)
    with pytest.raises(ValueError, match="codes"):
        keras_ecoc.ecoc_cross_entropy(np.zeros(2, "int32"), z, ops.convert_to_tensor(codes))


def test_nan_or_duplicate_codes_raise_in_the_function_api():
    z = np.ones((2, 4), "float32")
    y = np.zeros(2, "int32")
    codes = _codes()
    with_nan = codes.copy()
    with_nan[2, 1] = np.nan
    with pytest.raises(ValueError, match="codes.*finite"):
        keras_ecoc.ecoc_cross_entropy(y, z, with_nan)
    duplicated = codes.copy()
    duplicated[3] = duplicated[1]
    with pytest.raises(ValueError, match="codes.*distinct"):
        keras_ecoc.ecoc_cross_entropy(y, z, duplicated)
    with pytest.raises(ValueError, match="codes.*distinct"):
        keras_ecoc.ecoc_cross_entropy(y, z, ops.convert_to_tensor(duplicated))


@pytest.mark.parametrize("scale", [True, False, 0.0, -1.0, float("nan"), float("inf"), "2"])
def test_bad_scales_raise_naming_the_argument(scale):
    z = np.ones((2, 4), "float32")
    with pytest.raises(ValueError, match="scale"):
        keras_ecoc.ecoc_cross_entropy(np.zeros(2, "int32"), z, _codes(), scale)
    with pytest.raises(ValueError, match="scale"):
        keras_ecoc.ECOCLoss(_codes(), scale=scale)
    with pytest.raises(ValueError, match="scale"):
        keras_ecoc.ECOCDecoder(_codes(), scale=scale)


@pytest.mark.parametrize(
    "scale", [True, 0.0, -1.0, float("nan"), "2", None, [2.0], np.array([1.0, 2.0])]
)
def test_a_bad_scale_gets_the_same_message_from_every_entry(scale):
    # One rule for `scale` (ops._checks): the constructors, the loss function
    # and the op say the same thing about the same value.
    z = np.ones((2, 4), "float32")
    y = np.zeros(2, "int32")
    entries = {
        "ecoc_cross_entropy": lambda: keras_ecoc.ecoc_cross_entropy(y, z, _codes(), scale),
        "ops.ecoc_cross_entropy": lambda: keras_ecoc.ops.ecoc_cross_entropy(y, z, _codes(), scale),
        "ECOCLoss": lambda: keras_ecoc.ECOCLoss(_codes(), scale=scale),
        "ECOCDecoder": lambda: keras_ecoc.ECOCDecoder(_codes(), scale=scale),
    }
    messages = {}
    for name, call in entries.items():
        with pytest.raises(ValueError, match=r"^Argument `scale` must be ") as info:
            call()
        messages[name] = str(info.value)
    # The function APIs also take tensors, so their wording for a non-number
    # may add "or a scalar float tensor"; the rest is common.
    heads = {m.split(". Received:")[0].replace(" or a scalar float tensor", "") for m in messages.values()}
    assert len(heads) == 1, messages
    tails = {m.split(". Received:")[1] for m in messages.values()}
    assert len(tails) == 1, messages


def test_a_concrete_scale_tensor_is_accepted_by_the_constructors():
    decoder = keras_ecoc.ECOCDecoder(_codes(), scale=ops.convert_to_tensor(2.5))
    assert decoder.initial_scale == 2.5
    loss = keras_ecoc.ECOCLoss(_codes(), scale=ops.convert_to_tensor([2.5]))
    assert loss.get_config()["scale"] == 2.5


def test_bad_host_scale_array_raises_and_a_scale_tensor_is_checked_for_shape_only():
    # Host values are checked; a tensor's value is never read (that would be
    # a device-to-host copy on every call), only its shape.
    z = np.ones((2, 4), "float32")
    with pytest.raises(ValueError, match="scale"):
        keras_ecoc.ecoc_cross_entropy(np.zeros(2, "int32"), z, _codes(), np.float32(-2.0))
    with pytest.raises(ValueError, match="scale"):
        keras_ecoc.ecoc_cross_entropy(
            np.zeros(2, "int32"), z, _codes(), ops.convert_to_tensor([1.0, 2.0])
        )
    loss = keras_ecoc.ecoc_cross_entropy(
        np.zeros(2, "int32"), z, _codes(), ops.convert_to_tensor(2.0)
    )
    assert np.all(np.isfinite(ops.convert_to_numpy(loss)))


def test_rank_one_y_pred_gets_a_message_about_y_pred_not_one_hot():
    with pytest.raises(ValueError, match="y_pred") as info:
        keras_ecoc.ecoc_cross_entropy(np.zeros(1, "int32"), np.ones(4, "float32"), _codes())
    assert "one-hot" not in str(info.value)
    with pytest.raises(ValueError, match="y_pred") as info:
        keras_ecoc.ECOCLoss(_codes())(np.zeros(1, "int32"), np.ones(4, "float32"))
    assert "one-hot" not in str(info.value)
    metric = keras_ecoc.ECOCAccuracy(_codes())
    with pytest.raises(ValueError, match="y_pred"):
        metric.update_state(np.zeros(1, "int32"), np.ones(4, "float32"))


def test_one_hot_targets_still_get_the_one_hot_message():
    with pytest.raises(ValueError, match="one-hot"):
        keras_ecoc.ecoc_cross_entropy(np.eye(6)[:2], np.ones((2, 4), "float32"), _codes())


def _classifier():
    inputs = keras.Input((3,))
    backbone = keras.Model(inputs, keras.layers.Dense(5)(inputs))
    return keras_ecoc.ECOCClassifier(backbone, _codes(6, 4))


def test_predictions_on_zero_samples_are_empty_arrays_of_the_right_shape():
    model = _classifier()
    empty = np.zeros((0, 3), "float32")
    z = model.predict(empty, verbose=0)
    probabilities = model.predict_proba(empty, verbose=0)
    classes = model.predict_classes(empty, verbose=0)
    assert z.shape == (0, 4) and probabilities.shape == (0, 6) and classes.shape == (0,)
    assert probabilities.dtype == np.float32 and classes.dtype == np.int32


# --- ecoc_research.datasets --------------------------------------------------


def _dataset(**overrides):
    arguments = dict(
        name="toy", x_train=np.zeros((3, 2, 2, 1), "float32"),
        y_train=np.array([0, 1, 2]), x_test=np.zeros((2, 2, 2, 1), "float32"),
        y_test=np.array([1, 0]), class_names=["a", "b", "c"],
    )
    arguments.update(overrides)
    return datasets.ImageDataset(**arguments)


def test_dataset_labels_must_index_class_names():
    assert _dataset().num_classes == 3
    with pytest.raises(ValueError, match="y_train"):
        _dataset(y_train=np.array([0, 1, 3]))
    with pytest.raises(ValueError, match="y_test"):
        _dataset(y_test=np.array([-1, 0]))
    with pytest.raises(ValueError, match="y_train"):
        _dataset(y_train=np.array([0, 1]))


def _write_npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def test_npz_with_negative_labels_raises(tmp_path):
    path = _write_npz(tmp_path / "neg.npz", x=np.zeros((4, 2, 2), "float32"),
                      y=np.array([0, 1, -1, 1]))
    with pytest.raises(ValueError, match="negative"):
        datasets.load_dataset(path)


def test_npz_with_labels_beyond_the_class_names_raises(tmp_path):
    path = _write_npz(tmp_path / "names.npz", x=np.zeros((4, 2, 2), "float32"),
                      y=np.array([0, 1, 2, 1]), class_names=np.array(["a", "b"]),
                      is_train=np.array([1, 1, 0, 0]))
    with pytest.raises(ValueError, match="class_names"):
        datasets.load_dataset(path)


def test_npz_with_is_train_of_the_wrong_length_raises(tmp_path):
    path = _write_npz(tmp_path / "split.npz", x=np.zeros((4, 2, 2), "float32"),
                      y=np.array([0, 1, 0, 1]), is_train=np.array([1, 0, 1]))
    with pytest.raises(ValueError, match="is_train"):
        datasets.load_dataset(path)


def test_int64_labels_at_or_above_2_31_are_rejected_not_wrapped(rng):
    # 2^32 + 1 narrowed to int32 would be class 1.
    y = np.array([0, 2**32 + 1], "int64")
    z = rng.normal(size=(2, 4)).astype("float32")
    with pytest.raises(ValueError, match="y_true"):
        keras_ecoc.ecoc_cross_entropy(y, z, _codes())
    with pytest.raises(ValueError, match="y_true"):
        keras_ecoc.ECOCLoss(_codes())(y, z)
    with pytest.raises(ValueError, match="y_true"):
        keras_ecoc.ECOCAccuracy(_codes()).update_state(y, z)


def test_a_code_tensor_is_validated_once_and_kept_as_a_tensor(rng, monkeypatch):
    """The function API reads and checks a concrete code tensor the first time
    it sees it; later calls with the same tensor use it as it is."""
    from keras_ecoc import _validation

    checked = count_calls(monkeypatch, _validation, "codes_array")
    codes = _codes()
    tensor = ops.convert_to_tensor(codes)
    y = rng.integers(0, 6, size=5)
    z = rng.normal(size=(5, 4)).astype("float32")
    for _ in range(3):
        got = ops.convert_to_numpy(keras_ecoc.ecoc_cross_entropy(y, z, tensor))
        np.testing.assert_allclose(got, _reference_loss(y, z, codes), rtol=1e-5, atol=1e-6)
    assert len(checked) == 1
    assert _validation.function_codes(tensor) is tensor
    # Another tensor with the same values is checked again.
    keras_ecoc.ecoc_cross_entropy(y, z, ops.convert_to_tensor(codes))
    assert len(checked) == 2
    if keras.backend.backend() == "torch":
        # A tensor changed in place is checked again (its version moved).
        import torch

        with torch.no_grad():
            tensor[3] = tensor[1]
        with pytest.raises(ValueError, match="codes.*distinct"):
            keras_ecoc.ecoc_cross_entropy(y, z, tensor)


def test_label_tensor_is_converted_once_per_call(rng, monkeypatch):
    """Float label tensors are made integers once, where they enter: by the
    public op, or by the loss / metric on their unchecked path."""
    from keras_ecoc.ops import _checks

    converted = count_calls(monkeypatch, _checks, "integer_label_tensor")
    codes = _codes()
    y = rng.integers(0, 6, size=5)
    labels = ops.convert_to_tensor(y.astype("float32"))
    z = rng.normal(size=(5, 4)).astype("float32")
    got = ops.convert_to_numpy(keras_ecoc.ops.ecoc_cross_entropy(labels, z, codes))
    np.testing.assert_allclose(got, _reference_loss(y, z, codes), rtol=1e-5, atol=1e-6)
    assert len(converted) == 1
    rank = ops.convert_to_numpy(keras_ecoc.ops.label_rank(labels, z, codes))
    logits = reference_logits(z, codes, 1.0)
    want = (logits > logits[np.arange(5), y][:, None]).sum(-1)
    np.testing.assert_array_equal(rank, want)
    assert len(converted) == 2
    loss = keras_ecoc.ECOCLoss(codes, reduction=None)
    got = ops.convert_to_numpy(loss(labels, z))
    np.testing.assert_allclose(got, _reference_loss(y, z, codes), rtol=1e-5, atol=1e-6)
    assert len(converted) == 3


@pytest.mark.parametrize("scale", [None, "2", b"2", [2.0]])
def test_op_scale_that_is_not_a_number_or_tensor_is_named_in_the_error(rng, scale):
    # The op API once passed these on, to an unpacking error or a backend's
    # own cast error.
    z = rng.normal(size=(3, 4)).astype("float32")
    with pytest.raises(ValueError, match="Argument `scale` must be a finite number > 0"):
        keras_ecoc.ops.ecoc_cross_entropy(np.array([0, 1, 2]), z, _codes(), scale=scale)


def test_misspelt_loss_path_variable_fails_where_the_fused_path_runs_too(monkeypatch):
    # It used to be read only without the fused path: a typo showed up only on
    # machines without the kernels.
    monkeypatch.setenv("KERAS_ECOC_LOSS_PATH", "strem")
    with pytest.raises(ValueError, match="KERAS_ECOC_LOSS_PATH.*Received: KERAS_ECOC_LOSS_PATH='strem'"):
        keras_ecoc.ops.loss_path(10**5)
    monkeypatch.setenv("KERAS_ECOC_LOSS_PATH", "dense")
    assert keras_ecoc.ops.loss_path(10**5) in ("fused", "dense")


@pytest.mark.parametrize("fused", [None, False])
@pytest.mark.parametrize("shape", [(3, 1, 1), (1, 3)])
def test_labels_of_another_shape_than_zs_batch_raise_on_every_path(rng, fused, shape):
    # One rule on every backend and path: z's batch shape, or that + (1,).
    # A flatten used to pair (1, B) labels with the rows on some paths, and
    # the accuracy broadcast (B, 1, 1) labels against every prediction.
    z = rng.normal(size=(3, 4)).astype("float32")
    y = np.array([0, 2, 5], "int32")
    with pytest.raises(ValueError, match="labels"):
        keras_ecoc.ops.ecoc_cross_entropy(y.reshape(shape), z, _codes(), fused=fused)
    with pytest.raises(ValueError, match="labels"):
        keras_ecoc.ops.label_rank(ops.convert_to_tensor(y.reshape(shape)), z, _codes(), fused=fused)
    with pytest.raises(ValueError, match="labels|y_true"):
        keras_ecoc.ECOCAccuracy(_codes()).update_state(ops.convert_to_tensor(y.reshape(shape)), z)
    for good in [(3,), (3, 1)]:
        got = keras_ecoc.ops.ecoc_cross_entropy(y.reshape(good), z, _codes(), fused=fused)
        np.testing.assert_allclose(ops.convert_to_numpy(got), _reference_loss(y, z, _codes()),
                                   rtol=1e-5, atol=1e-6)


def test_one_label_for_a_batch_of_three_raises_in_the_accuracy(rng):
    z = rng.normal(size=(3, 4)).astype("float32")
    with pytest.raises(ValueError, match="batch size 3 but labels has 1"):
        keras_ecoc.ECOCAccuracy(_codes()).update_state(ops.convert_to_tensor([1]), z)


def test_boolean_host_labels_are_rejected_by_the_keras_objects(rng):
    z = rng.normal(size=(3, 4)).astype("float32")
    y = np.array([False, True, True])
    with pytest.raises(ValueError, match="y_true.*bool"):
        keras_ecoc.ECOCLoss(_codes())(y, z)
    with pytest.raises(ValueError, match="y_true.*bool"):
        keras_ecoc.ecoc_cross_entropy(y, z, _codes())
    with pytest.raises(ValueError, match="y_true.*bool"):
        keras_ecoc.ECOCAccuracy(_codes()).update_state(y, z)


def _three_ops(z, codes, fused):
    return (lambda: keras_ecoc.ops.ecoc_cross_entropy([0, 1, 2], z, codes, fused=fused),
            lambda: keras_ecoc.ops.nearest_codeword(z, codes, fused=fused),
            lambda: keras_ecoc.ops.label_rank([0, 1, 2], z, codes, fused=fused))


@pytest.mark.parametrize("fused", [None, False])
@pytest.mark.parametrize("rows, k, message", [
    (5, 0, "`codes` must have at least one column"),
    # A broadcast view: 2^31 rows without 8.6 GB of memory; class ids are int32.
    (2**31, 2, "fewer than 2\\^31 rows"),
])
def test_the_ops_refuse_codes_they_cannot_index(fused, rows, k, message):
    codes = np.broadcast_to(np.ones((1, k), "float32"), (rows, k))
    z = np.ones((3, k), "float32")
    for call in _three_ops(z, codes, fused):
        with pytest.raises(ValueError, match=message):
            call()


def test_a_tensorflow_datasets_set_that_cannot_be_loaded_says_why_and_what_to_do(monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")

    def offline(*args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(tfds, "load", offline)
    with pytest.raises(RuntimeError, match="could not load 'cifar10'.*TFDS_DATA_DIR.*network unreachable"):
        datasets.load_dataset("tfds:cifar10")


def test_a_code_length_beyond_the_cuda_kernels_is_not_sent_to_them_on_jax_or_torch():
    from keras_ecoc.ops import _dispatch

    from keras_ecoc.ops import _loader

    backend = keras.backend.backend()
    if backend not in ("jax", "torch") or keras_ecoc.ops.loss_path(10**4) != "fused":
        pytest.skip("the JAX / PyTorch fused kernels")
    if not _loader.kernels_have_cuda():
        pytest.skip("a kernel library built without its CUDA part never runs on a GPU")
    ok, why = _dispatch._fused_here(backend, 2**24 + 1, "loss", True)
    assert not ok and "exceeds the CUDA kernels' limit of 16777216" in why
    assert _dispatch._fused_here(backend, 2**24 + 1, "loss", False)[0]  # the CPU kernels have no limit


@pytest.mark.parametrize("fused", [None, False])
def test_keras_style_labels_of_unknown_shape_are_accepted_in_a_traced_function(rng, fused):
    # (None, None) labels under tf.function: the last axis is squeezed at run
    # time (TF's squeeze refuses an axis of unknown size at trace time).
    if keras.backend.backend() != "tensorflow":
        pytest.skip("tf.function input signatures")
    import tensorflow as tf

    z = rng.normal(size=(3, 4)).astype("float32")
    y = np.array([[0], [3], [5]], "int32")
    f = tf.function(lambda yy, zz: keras_ecoc.ops.ecoc_cross_entropy(yy, zz, _codes(), fused=fused),
                    input_signature=[tf.TensorSpec((None, None), tf.int32),
                                     tf.TensorSpec((None, 4), tf.float32)])
    np.testing.assert_allclose(f(tf.constant(y), tf.constant(z)).numpy(),
                               _reference_loss(y[:, 0], z, _codes()), rtol=1e-5, atol=1e-6)
    loss = keras_ecoc.ECOCLoss(_codes(), reduction=None)
    g = tf.function(lambda yy, zz: loss(yy, zz),
                    input_signature=[tf.TensorSpec((None, None), tf.int32),
                                     tf.TensorSpec((None, 4), tf.float32)])
    np.testing.assert_allclose(g(tf.constant(y), tf.constant(z)).numpy(),
                               _reference_loss(y[:, 0], z, _codes()), rtol=1e-5, atol=1e-6)
