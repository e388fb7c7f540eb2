"""Short fits on real images: the embedded Omniglot set and ../shared/data."""

import numpy as np
import pytest
from conftest import shared_data

from keras_ecoc import datasets
from keras_ecoc import demo
from keras_ecoc import training


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


def test_cub_and_cifar_npz_layouts_load():
    cub = datasets.load_dataset(shared_data("cub50_64px.npz"))
    assert cub.num_classes == 50 and cub.input_shape == (64, 64, 3)
    assert len(cub.y_train) == 1500 and len(cub.y_test) == 1389
    assert cub.class_attributes.shape == (50, 312)
    assert cub.attribute_names is None or len(cub.attribute_names) == 312


def test_demo_runs_end_to_end_on_a_subset(capsys):
    results = demo.run(["--epochs", "1", "--train-per-class", "3",
                         "--test-per-class", "2", "--verbose", "0"])
    out = capsys.readouterr().out
    assert [r.encoding for r in results] == ["one_hot", "one_hot_imprinted",
                                             "gaussian", "spectral"]
    assert "| encoding | bits |" in out and "steps to" in out


def test_bad_dataset_spec_raises_value_error(tmp_path):
    with pytest.raises(ValueError, match="spec"):
        datasets.load_dataset(str(tmp_path / "missing.npz"))
    bad = tmp_path / "bad.npz"
    np.savez(bad, foo=np.zeros(3))
    with pytest.raises(ValueError, match="images"):
        datasets.load_dataset(str(bad))


def test_demo_console_entry_point_exits_zero(monkeypatch):
    monkeypatch.setattr(demo, "run", lambda argv=None: ["results"])
    assert demo.main([]) == 0
