"""The research application on many classes: a generated 1,200-class set,
the stop before any head when the pretrained network is near chance, the
pretraining options and `grid --smoke` on a small data set."""

import os

import numpy as np
import pytest

from ecoc_research import datasets
from ecoc_research.experiments import __main__ as cli
from ecoc_research.experiments import protocols


def test_synthetic_glyphs_are_deterministic_and_class_structured():
    a = datasets.synthetic_glyphs(1200, 3, 1, size=8, seed=5)
    b = datasets.synthetic_glyphs(1200, 3, 1, size=8, seed=5)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.x_train.shape == (3600, 8, 8, 1) and a.x_test.shape == (1200, 8, 8, 1)
    assert a.num_classes == 1200 and a.x_train.min() >= 0 and a.x_train.max() <= 1
    np.testing.assert_array_equal(np.bincount(a.y_train), np.full(1200, 3))
    # Images of a class are closer to their own class mean than to others'.
    c = datasets.synthetic_glyphs(40, 6, 1, size=12, shift=1, noise=0.05, seed=0)
    flat = c.x_train.reshape(len(c.y_train), -1).astype(np.float64)
    means = np.stack([flat[c.y_train == k].mean(0) for k in range(40)])
    nearest = np.argmin(((flat[:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert np.mean(nearest == c.y_train) > 0.9
    with pytest.raises(ValueError, match="num_classes"):
        datasets.synthetic_glyphs(1, 3, 1)


def test_chance_threshold_is_a_multiple_of_chance_capped_at_halfway():
    assert protocols.chance_threshold(1878) == pytest.approx(3 / 1878)
    assert protocols.chance_threshold(4) == pytest.approx((1 + 1 / 4) / 2)
    record = {"best_val_accuracy": 0.001, "epochs_run": 6,
              "settings": {"pretrain_learning_rate": 1e-3, "pretrain_batch_size": 32}}
    with pytest.raises(protocols.PretrainingFailed, match="near chance"):
        protocols.check_above_chance(record, 1878)
    protocols.check_above_chance(dict(record, best_val_accuracy=0.01), 1878)
    protocols.check_above_chance(record, 1878, multiple=0)  # disabled


def _npz(tmp_path, num_classes, train_per_class, size, shuffle_labels=False,
         test_per_class=1):
    data = datasets.synthetic_glyphs(num_classes, train_per_class, test_per_class,
                                     size=size, seed=0)
    if shuffle_labels:  # images unrelated to labels: nothing to learn
        data.y_train = np.random.default_rng(0).permutation(data.y_train)
    return datasets.save_npz(data, str(tmp_path / "glyphs.npz"))


@pytest.mark.backend_independent
def test_grid_stops_before_any_head_when_pretraining_is_near_chance(tmp_path, capsys):
    path = _npz(tmp_path, 1200, 4, 8, shuffle_labels=True)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as error:
        cli.main(["grid", "--dataset", path, "--output", str(out),
                  "--encodings", "one_hot", "spectral", "--learning-rate", "0.01",
                  "--epochs", "1", "--seeds", "0", "--batch-sizes", "32",
                  "--hidden", "16", "--val-per-class", "1", "--code-lengths", "8",
                  "--pretrain-epochs", "1", "--pretrain-batch-size", "256",
                  "--pretrain-learning-rate", "0.001"])
    assert error.value.code == 2
    err = capsys.readouterr().err
    assert "near chance" in err and "600 pretraining classes" in err
    assert "Traceback" not in err
    assert os.listdir(out / "runs") == []  # no head was trained
    # The pretraining options reached the pretraining.
    records = [f for f in os.listdir(out / "pretrain") if f.endswith(".json")]
    import json

    with open(out / "pretrain" / records[0]) as f:
        settings = json.load(f)["settings"]
    assert settings["pretrain_batch_size"] == 256
    assert settings["pretrain_learning_rate"] == 0.001


def test_grid_smoke_fits_a_ten_class_data_set(tmp_path):
    # The transfer variant of 10 classes in 10 groups retrains on 5 classes,
    # fewer than the smoke grid's default 8.
    path = _npz(tmp_path, 10, 8, 8, test_per_class=3)
    out = tmp_path / "out"
    results = cli.main(["grid", "--smoke", "--dataset", path, "--output", str(out),
                        "--encodings", "one_hot", "gaussian"])["grid"]
    assert results["dataset"]["num_classes"] == 5
    assert len(os.listdir(out / "runs")) == 4  # 2 encodings x 2 seeds


@pytest.mark.backend_independent
@pytest.mark.slow
def test_grid_trains_heads_on_600_of_1200_generated_classes(tmp_path):
    # The pipeline end to end on many classes. Whether a short pretraining
    # gets above chance here depends on the numerics of the run (8 epochs
    # ended at 0.50% against a 0.50% threshold in one CI run), so the chance
    # stop, which has its own test above, is off; the recipe that learns on
    # 10^3+ classes is measured in docs/results/many_classes.md.
    path = _npz(tmp_path, 1200, 6, 12)
    out = tmp_path / "out"
    results = cli.main(["grid", "--dataset", path, "--output", str(out),
                        "--encodings", "one_hot", "--learning-rate", "0.01",
                        "--epochs", "1", "--seeds", "0", "--batch-sizes", "32",
                        "--hidden", "64", "--val-per-class", "1",
                        "--pretrain-epochs", "2", "--pretrain-learning-rate", "3e-4",
                        "--pretrain-batch-size", "128",
                        "--min-pretrain-chance-multiple", "0"])["grid"]
    assert results["dataset"]["num_classes"] == 600
    assert len(os.listdir(out / "runs")) == 1  # the one-hot head was trained


@pytest.mark.parametrize("num_classes,expected", [(2000, (3e-4, 128)), (1998, (1e-3, 32))])
def test_command_line_pretraining_recipe_follows_the_number_of_classes(
        tmp_path, num_classes, expected):
    # Transfer variant: half of the classes pretrain (1,000 and 999).
    path = _npz(tmp_path, num_classes, 1, 4)
    parser = cli.build_parser()
    args = parser.parse_args(["grid", "--dataset", path])
    cli._fill_pretrain_recipe(args)
    assert (args.pretrain_learning_rate, args.pretrain_batch_size) == expected
    # An explicit value is kept.
    args = parser.parse_args(["grid", "--dataset", path, "--pretrain-batch-size", "64"])
    cli._fill_pretrain_recipe(args)
    assert (args.pretrain_learning_rate, args.pretrain_batch_size) == (expected[0], 64)
