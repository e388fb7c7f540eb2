"""Short fits on real images: the embedded Omniglot set and ../shared/data."""

import io
import os
import sys
from importlib import metadata

import numpy as np
import pytest
from conftest import SHARED_DATA
from conftest import shared_data

from ecoc_research import datasets
from ecoc_research import demo
from ecoc_research import training


def test_embedded_omniglot_loads_with_documented_split():
    data = datasets.load_dataset("embedded")
    assert data.num_classes == 242
    assert data.x_train.shape == (3630, 28, 28, 1)
    assert data.x_test.shape == (1210, 28, 28, 1)
    assert np.bincount(data.y_train).tolist() == [15] * 242
    assert 0.0 <= data.x_train.min() and data.x_train.max() <= 1.0
    # Ink is 1 on a 0 background: most pixels are background.
    assert np.mean(data.x_train) < 0.3


def test_omniglot_repeated_alphabets_are_merged_into_one_class_each():
    raw = np.load(datasets.embedded_path())
    data = datasets.load_dataset("embedded")
    assert len(set(data.class_names)) == data.num_classes == 242
    assert len(raw["class_names"]) == 292
    # Every kept class still has its 20 images, unchanged.
    for new_id in (0, 46, 241):
        old_id = list(raw["class_names"]).index(data.class_names[new_id])
        kept = np.concatenate([data.x_train[data.y_train == new_id],
                               data.x_test[data.y_test == new_id]])
        original = (255.0 - raw["images"][raw["labels"] == old_id]) / 255.0
        np.testing.assert_allclose(np.sort(kept.ravel()),
                                   np.sort(original.ravel()), atol=1e-6)


@pytest.mark.slow
def test_ecoc_fit_on_real_omniglot_beats_chance_by_a_wide_margin():
    # 60 classes keep the run short on 2 cores; chance is 1/60.
    data = datasets.load_dataset(shared_data("omniglot_small_28px.npz"))
    data = data.first_classes(60)
    codes = training.make_codes("gaussian", 60, 16, seed=0)
    result = training.train_and_evaluate(
        data, encoding="gaussian", codes=codes, batch_size=16, epochs=4, verbose=0
    )
    assert result.final_accuracy > 10 * (1 / 60), result


def _jpeg_bytes(image):
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=95)
    return np.frombuffer(buffer.getvalue(), np.uint8)


def _write_cub_layout(path, rng, n=3, per_class=4, size=8):
    labels = np.repeat(np.arange(n), per_class)
    center = rng.integers(0, 256, size=(len(labels), size, size, 3), dtype=np.uint8)
    np.savez(path, images_center=center, images_bbox=255 - center,
             labels=labels.astype(np.int16), is_train=np.arange(len(labels)) % 4 != 0,
             class_names=np.array([f"bird {i}" for i in range(n)]),
             class_attributes_continuous=rng.random((n, 5)).astype("float32"))
    return center, labels


def _write_cifar_layout(path, rng, n=4, per_class=3, size=8):
    labels = np.repeat(np.arange(n), per_class).astype(np.uint8)
    # Flat colours survive JPEG almost exactly.
    colours = rng.integers(0, 256, size=(len(labels), 1, 1, 3), dtype=np.uint8)
    images = np.broadcast_to(colours, (len(labels), size, size, 3)).copy()
    blobs = [_jpeg_bytes(image) for image in images]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blobs])]).astype(np.int64)
    np.savez(path, jpeg=np.concatenate(blobs), offsets=offsets, labels=labels,
             is_train=np.arange(len(labels)) % 3 != 0,
             class_names=np.array([f"class {i}" for i in range(n)]))
    return images, labels


def test_cub_and_cifar_npz_layouts_load(rng, tmp_path):
    # CUB layout: uint8 crops (bbox and center), int labels, is_train,
    # per-class attributes.
    center, labels = _write_cub_layout(tmp_path / "cub.npz", rng)
    is_train = np.arange(len(labels)) % 4 != 0
    for crop, expected in (("center", center), ("bbox", 255 - center)):
        cub = datasets.load_dataset(str(tmp_path / "cub.npz"), cub_crop=crop)
        assert cub.num_classes == 3 and cub.input_shape == (8, 8, 3)
        np.testing.assert_allclose(cub.x_train, expected[is_train] / 255.0, atol=1e-6)
        np.testing.assert_array_equal(cub.y_test, labels[~is_train])
        assert cub.class_attributes.shape == (3, 5)
    # CIFAR layout: concatenated JPEG bytes with offsets.
    images, labels = _write_cifar_layout(tmp_path / "cifar.npz", rng)
    is_train = np.arange(len(labels)) % 3 != 0
    cifar = datasets.load_dataset(str(tmp_path / "cifar.npz"))
    assert cifar.num_classes == 4 and cifar.input_shape == (8, 8, 3)
    assert cifar.class_names == [f"class {i}" for i in range(4)]
    np.testing.assert_array_equal(cifar.y_train, labels[is_train])
    np.testing.assert_allclose(cifar.x_test, images[~is_train] / 255.0, atol=4 / 255)
    # The real CUB subset, when ../shared/data has it.
    if os.path.exists(os.path.join(SHARED_DATA, "cub50_64px.npz")):
        cub = datasets.load_dataset(shared_data("cub50_64px.npz"))
        assert cub.num_classes == 50 and cub.input_shape == (64, 64, 3)
        assert len(cub.y_train) == 1500 and len(cub.y_test) == 1389
        assert cub.class_attributes.shape == (50, 312)
        assert cub.attribute_names is None or len(cub.attribute_names) == 312


@pytest.mark.slow
@pytest.mark.backend_independent
def test_real_cifar10_jpeg_npz_loads():
    # Decoding 60,000 JPEGs takes ~17 s and 2.6 GB here: slow, and the same
    # NumPy / Pillow work under every Keras backend, so the TensorFlow pass
    # alone runs it.
    cifar = datasets.load_dataset(shared_data("cifar10_jpeg_bytes.npz"))
    assert cifar.num_classes == 10 and cifar.input_shape == (32, 32, 3)
    assert len(cifar.y_train) == 50_000 and len(cifar.y_test) == 10_000
    assert np.bincount(cifar.y_test).tolist() == [1000] * 10
    assert 0.0 <= cifar.x_test.min() and cifar.x_test.max() <= 1.0


def _tiny_demo_npz(rng, path):
    """8 classes of 6 random 28x28 images (5 train, 1 test each): the demo
    pretrains on half of them and retrains on the other half, holding out 3
    training images per class for validation."""
    x = rng.random((8 * 6, 28, 28)).astype("float32")
    np.savez(path, x=x, y=np.repeat(np.arange(8), 6), is_train=np.arange(48) % 6 != 0)
    return str(path)


@pytest.mark.backend_independent
def test_demo_runs_end_to_end_through_its_console_entry_point(rng, tmp_path, capsys,
                                                               monkeypatch):
    # The `keras-ecoc-demo` console script as declared in the package metadata
    # (demo.main when the package is not installed, e.g. a checkout on
    # PYTHONPATH), called in this process with its argv: one demo run pins the
    # entry point, its exit status and the demo's results. (It replaces a run
    # of the console script in a fresh interpreter, which re-imported
    # TensorFlow and repeated this demo for 15 s of CI.)
    try:
        (entry,) = metadata.entry_points(group="console_scripts", name="keras-ecoc-demo")
        main = entry.load()
    except ValueError:
        main = demo.main
    runs = []

    def recorded_run(argv=None):
        runs.append(real_run(argv))
        return runs[-1]

    real_run = demo.run
    monkeypatch.setattr(demo, "run", recorded_run)
    # Random images: the pretrained network is at chance, so the stop is off.
    monkeypatch.setattr(sys, "argv", [
        "keras-ecoc-demo", "--dataset", _tiny_demo_npz(rng, tmp_path / "tiny.npz"),
        "--epochs", "1", "--code-fraction", "0.5", "--batch-size", "4", "--verbose", "0",
        "--min-pretrain-chance-multiple", "0"])
    assert main() == 0
    out = capsys.readouterr().out
    (results,) = runs
    assert [r.encoding for r in results] == ["one_hot", "one_hot_imprinted",
                                             "gaussian", "spectral"]
    assert "| encoding | bits |" in out and "steps to" in out and "spectral" in out


@pytest.mark.backend_independent
def test_demo_stops_when_the_pretrained_network_is_at_chance(
        rng, tmp_path, capsys, monkeypatch):
    from ecoc_research.experiments import protocols

    # Random images: whatever the pretraining reaches, a threshold above 100%
    # makes the stop certain (the threshold itself is tested elsewhere).
    monkeypatch.setattr(protocols, "chance_threshold", lambda n, m=3.0: 1.01)
    with pytest.raises(SystemExit) as error:
        demo.run(["--dataset", _tiny_demo_npz(rng, tmp_path / "tiny.npz"),
                  "--epochs", "1", "--code-fraction", "0.5", "--batch-size", "4",
                  "--verbose", "0"])
    assert error.value.code == 2
    assert "near chance" in capsys.readouterr().err


@pytest.mark.backend_independent
@pytest.mark.parametrize("bad, message", [
    (["--epochs", "0"], "`--epochs` must be a positive integer"),
    (["--batch-size", "0"], "`--batch-size` must be a positive integer"),
    (["--encodings", "one_hot", "bogus"], "`--encodings` must name"),
    (["--seed", "-1"], "`--seed` must be an integer"),
    (["--code-fraction", "-1"], "`--code-fraction` must be in"),
    (["--train-per-class", "0"], "`--train-per-class` must be a positive"),
    (["--resume"], "apply to an --output folder"),
    ([], "`--dataset` must be 'embedded', an existing .npz file"),
])
def test_demo_refuses_bad_options_before_any_work(tmp_path, capsys, bad, message):
    output = tmp_path / "out"
    with pytest.raises(SystemExit) as error:
        demo.run(["--dataset", str(tmp_path / "never_read.npz"), *bad]
                 + ([] if bad == ["--resume"] else ["--output", str(output)]))
    assert error.value.code == 2
    assert message in capsys.readouterr().err
    assert not output.exists()  # nothing loaded, trained or written


@pytest.mark.backend_independent
def test_demo_keeps_earlier_runs_unless_told_to_replace_them(rng, tmp_path, capsys):
    output = tmp_path / "runs_here"
    argv = ["--dataset", _tiny_demo_npz(rng, tmp_path / "tiny.npz"), "--epochs", "1",
            "--code-fraction", "0.5", "--batch-size", "4", "--verbose", "0",
            "--min-pretrain-chance-multiple", "0", "--encodings", "one_hot",
            "--output", str(output)]
    assert demo.main(argv) == 0
    stored = {p: p.read_bytes() for p in sorted((output / "runs").glob("*.json"))}
    assert stored
    with pytest.raises(SystemExit) as error:
        demo.run(argv)
    assert error.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert demo.main(argv + ["--resume"]) == 0  # reuses the stored run
    assert {p: p.read_bytes() for p in stored} == stored
    assert demo.main(argv + ["--overwrite"]) == 0


@pytest.mark.backend_independent
def test_demo_says_so_when_no_encoding_trained(rng, tmp_path, capsys):
    # 4 retraining classes, k = 2: seed 0's thresholded Gaussian code repeats a
    # codeword, so the only encoding asked for does not train.
    argv = ["--dataset", _tiny_demo_npz(rng, tmp_path / "tiny.npz"), "--epochs", "1",
            "--code-fraction", "0.5", "--batch-size", "4", "--verbose", "0",
            "--min-pretrain-chance-multiple", "0", "--encodings", "gaussian_zero"]
    assert demo.main(argv) == 1
    assert "No encoding trained" in capsys.readouterr().out


def test_bad_dataset_spec_raises_value_error(tmp_path):
    with pytest.raises(ValueError, match="spec"):
        datasets.load_dataset(str(tmp_path / "missing.npz"))
    bad = tmp_path / "bad.npz"
    np.savez(bad, foo=np.zeros(3))
    with pytest.raises(ValueError, match="images"):
        datasets.load_dataset(str(bad))
