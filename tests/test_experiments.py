"""The experiment command (`python -m ecoc_research.experiments`) on tiny data.

Every sub-command runs in-process on a few images of a few classes for one
epoch and must write sane JSON, Markdown and PNG files. The full runs of
docs/results.md are not part of the suite. Backend-neutral: the experiments
only use Keras models and NumPy.
"""

import json
import os

import numpy as np
import pytest

from ecoc_research.experiments import __main__ as cli
from ecoc_research.experiments import attribute_correlation
from ecoc_research.experiments import tsne
from ecoc_research.experiments.tsne import neighbour_agreement

# 6 Omniglot classes (embedded set), 3 training and 2 test images a class.
TINY = ["--classes", "6", "--train-per-class", "3", "--test-per-class", "2",
        "--epochs", "1", "--seeds", "0", "--verbose", "0",
        "--similarity-epochs", "1"]


def _load(tmp_path, stem):
    with open(tmp_path / f"{stem}.json") as f:
        data = json.load(f)
    markdown = (tmp_path / f"{stem}.md").read_text()
    assert "|---|" in markdown
    return data, markdown


def _check_png(path):
    assert os.path.exists(path), path
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert 1_000 < os.path.getsize(path) < 200_000


def _check_accuracy(value):
    assert value is not None and 0.0 <= value <= 1.0


def test_attribute_correlation_matches_numpy():
    rng = np.random.default_rng(1)
    codes = rng.standard_normal((15, 6))
    attributes = rng.uniform(0, 100, (15, 9))
    r = attribute_correlation(codes, attributes)
    reference = np.corrcoef(codes.T, attributes.T)[:6, 6:]
    assert r.shape == (6, 9)
    np.testing.assert_allclose(r, reference, atol=1e-10)
    assert np.all(np.abs(r) <= 1.0)


def test_attribute_correlation_constant_columns_are_zero():
    codes = np.array([[1.0, 1.0], [1.0, -1.0], [1.0, 1.0], [1.0, -1.0]])
    attributes = np.array([[0.0, 5.0], [0.0, 1.0], [0.0, 5.0], [0.0, 1.0]])
    r = attribute_correlation(codes, attributes)
    np.testing.assert_allclose(r, [[0.0, 0.0], [0.0, 1.0]], atol=1e-12)
    with pytest.raises(ValueError, match="same number of rows"):
        attribute_correlation(codes, attributes[:3])


def test_tsne_separates_clusters():
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((4, 30)) * 8.0
    labels = np.repeat(np.arange(4), 30)
    x = centers[labels] + rng.standard_normal((120, 30))
    y = tsne(x, perplexity=20, n_iter=300)
    assert y.shape == (120, 2) and np.all(np.isfinite(y))
    assert neighbour_agreement(y, labels) > 0.97
    # Every cluster's points sit closer to their own centroid than to others.
    centroids = np.stack([y[labels == c].mean(0) for c in range(4)])
    nearest = np.argmin(((y[:, None] - centroids[None]) ** 2).sum(-1), 1)
    assert np.mean(nearest == labels) > 0.97


def test_duplicate_classes_are_dropped():
    from ecoc_research.datasets import ImageDataset
    from ecoc_research.experiments import common

    rng = np.random.default_rng(0)
    x = rng.random((3, 2, 4, 4, 1)).astype("float32")  # class, image, ...
    x[2] = x[0]  # class 2 repeats class 0's images under another label
    data = ImageDataset(
        name="toy", x_train=x[:, :1].reshape(3, 4, 4, 1),
        y_train=np.arange(3, dtype="int32"),
        x_test=x[:, 1:].reshape(3, 4, 4, 1), y_test=np.arange(3, dtype="int32"),
        class_names=["a", "b", "a again"],
        class_attributes=np.arange(6.0).reshape(3, 2))
    assert common.duplicate_classes(data) == [(2, 0)]
    clean = common.drop_classes(data, [2])
    assert clean.class_names == ["a", "b"] and clean.num_classes == 2
    np.testing.assert_array_equal(clean.y_train, [0, 1])
    np.testing.assert_array_equal(clean.class_attributes, [[0, 1], [2, 3]])
    # The embedded Omniglot set lists Greek and Latin twice.
    omniglot = common.load_data(common.DataOptions())
    assert omniglot.num_classes == 242
    assert len(set(omniglot.class_names)) == 242


def test_attributes_need_class_attributes(tmp_path, capsys):
    with pytest.raises(SystemExit) as error:
        cli.main(["attributes", *TINY, "--output", str(tmp_path)])
    assert error.value.code == 2  # a command-line error, not a traceback
    assert "per-class attributes" in capsys.readouterr().err


@pytest.mark.backend_independent
def test_pictures_command(tmp_path):
    cli.main(["pictures", *TINY, "--encodings", "one_hot", "spectral",
              "--code-length", "4", "--tsne-iterations", "50",
              "--confusion-classes", "4", "--output", str(tmp_path)])
    data, _ = _load(tmp_path, "pictures")
    _check_png(tmp_path / "pictures_tsne.png")
    _check_png(tmp_path / "pictures_confusion.png")
    assert [r["encoding"] for r in data["encodings"]] == ["one_hot", "spectral"]
    for record in data["encodings"]:
        _check_accuracy(record["test_accuracy"])
        confusion = np.array(record["confusion"])
        assert confusion.shape == (4, 4)
        assert np.all(confusion >= 0) and np.all(confusion.sum(1) <= 1 + 1e-9)
        assert 0.0 <= record["knn5_agreement_tsne"] <= 1.0


def test_pictures_keeps_earlier_results_unless_told_to_replace_them(tmp_path, capsys):
    # Refused before any training, with a command-line error naming the
    # files and --overwrite.
    (tmp_path / "pictures.json").write_text("{}")
    argv = ["pictures", *TINY, "--encodings", "one_hot", "--code-length", "4",
            "--output", str(tmp_path)]
    with pytest.raises(SystemExit) as error:
        cli.main(argv)
    assert error.value.code == 2
    assert "pictures.json" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["pictures.json"]
    (tmp_path / "pictures.json").unlink()
    (tmp_path / "pictures_index.md").write_text("earlier")
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert "pictures_index.md" in capsys.readouterr().err
    assert (tmp_path / "pictures_index.md").read_text() == "earlier"


def test_grid_overwrite_keeps_the_pretraining_cache_when_a_setting_is_refused(
        tmp_path, capsys):
    # --overwrite deletes the cache, so it must come after every check.
    out = tmp_path / "out"
    (out / "pretrain").mkdir(parents=True)
    (out / "pretrain" / "cached.txt").write_text("weights")
    with pytest.raises(SystemExit) as error:
        cli.main(["grid", "--dataset", _tiny_npz(tmp_path), "--output", str(out),
                  "--encodings", "one_hot", *GRID_TINY, "--overwrite",
                  "--lr-from", str(tmp_path / "missing.json")])
    assert error.value.code == 2
    assert "`lr_from`" in capsys.readouterr().err
    assert (out / "pretrain" / "cached.txt").read_text() == "weights"


def test_all_runs_every_experiment(tmp_path, monkeypatch):
    # `all` wiring only (each experiment has its own test above): a stub
    # records the calls and the options they get.
    calls = []

    def fake(experiment, options, output_dir):
        calls.append((experiment, options["epochs"], options["classes"]))
        return {"markdown": f"table of {experiment}", "wall_time": 1.0,
                "files": []}

    monkeypatch.setattr(cli, "run_experiment", fake)
    results = cli.main(["all", "--smoke", "--output", str(tmp_path)])
    # The embedded Omniglot set has no class attributes: skipped.
    assert [c[0] for c in calls] == ["cub-bits", "pictures"]
    assert set(results) == {c[0] for c in calls}
    assert all(c[1:] == (1, 12) for c in calls)  # --smoke settings
    readme = (tmp_path / "README.md").read_text()
    assert "## cub-bits" in readme and "table of pictures" in readme


@pytest.mark.parametrize("experiment", ["ablation", "batch-size"])
def test_replaced_sub_commands_are_gone(experiment, capsys):
    # The `grid` command (the shared runner) replaced them.
    with pytest.raises(SystemExit):
        cli.main([experiment, "--smoke"])
    assert "invalid choice" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# The shared runner, the retrain protocol and the statistics (grid command).

from ecoc_research.experiments import protocols  # noqa: E402
from ecoc_research.experiments import runner as runner_lib  # noqa: E402
from ecoc_research.experiments import stats  # noqa: E402


def _tiny_npz(tmp_path, num_classes=6, per_class=10, size=8):
    """A generic .npz (images/labels/is_train), classes named 'group/name'."""
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(num_classes), per_class).astype("int32")
    # Class-dependent blobs, so the networks have something to learn.
    centres = rng.uniform(0, 1, (num_classes, size, size, 1))
    images = (centres[labels] + 0.3 * rng.normal(
        size=(len(labels), size, size, 1))).clip(0, 1).astype("float32")
    is_train = np.tile(np.arange(per_class) < per_class - 3, num_classes)
    names = np.array([f"g{c % 2}/c{c}" for c in range(num_classes)])
    path = tmp_path / "tiny.npz"
    np.savez(path, images=images, labels=labels, is_train=is_train,
             class_names=names)
    return str(path)


# Two pretraining epochs on tiny data may stay near chance: these tests are
# about the grid, so the chance stop (tested in test_many_classes.py) is off.
GRID_TINY = ["--min-pretrain-chance-multiple", "0",
             "--epochs", "2", "--seeds", "0", "1", "--pretrain-epochs", "2",
             "--batch-sizes", "4", "--hidden", "16", "--code-lengths", "3",
             "--val-per-class", "2", "--verbose", "0"]


@pytest.mark.backend_independent
def test_grid_command_on_any_npz(tmp_path):
    path = _tiny_npz(tmp_path, num_classes=8)
    out = tmp_path / "out"
    results = cli.main(["grid", "--dataset", path, "--output", str(out),
                        "--encodings", "one_hot", "one_hot_imprinted",
                        "spectral", "--normalize-rows", "on", "off",
                        "--learning-rates", "0.01", "0.1",
                        *GRID_TINY])["grid"]
    runs = sorted(os.listdir(out / "runs"))
    # 4 labels x (2 selection rates + 2 seeds).
    assert len(runs) == 16
    with open(out / "runs" / runs[0]) as f:
        record = json.load(f)
    for field in ("spec", "environment", "steps", "val_accuracy",
                  "best_step", "test_accuracy", "final_test_accuracy",
                  "wall_time", "sparsity"):
        assert field in record
    assert record["steps"][0] == 0
    assert record["spec"]["dataset"] == path
    # Transfer by group: g1/* classes are retrained, g0/* pretrain.
    assert results["dataset"]["num_classes"] == 4
    group = results["groups"][0]
    assert set(group["comparison"]["labels"]) == {
        "one_hot", "one_hot_imprinted", "spectral_norm", "spectral_raw"}
    diff = group["comparison"]["labels"]["spectral_raw"]["difference"]
    assert diff["test_accuracy"]["n"] == 2
    _check_png(out / "grid_curves.png")
    assert "Δ vs one-hot" in (out / "grid.md").read_text()
    # Nothing written outside the output folder.
    assert sorted(os.listdir(tmp_path)) == ["out", "tiny.npz"]


@pytest.mark.backend_independent
def test_grid_refuses_non_empty_output_and_resumes_matching_runs(tmp_path, capsys):
    path = _tiny_npz(tmp_path)
    out = tmp_path / "out"
    args = ["grid", "--dataset", path, "--output", str(out), "--encodings",
            "one_hot", "--learning-rate", "0.01", *GRID_TINY]
    cli.main(args)
    # A refused folder is a command-line error (exit status 2), no traceback.
    with pytest.raises(SystemExit) as error:
        cli.main(args)
    assert error.value.code == 2
    assert "not empty" in capsys.readouterr().err
    runs = sorted(os.listdir(out / "runs"))
    stamps = {r: os.path.getmtime(out / "runs" / r) for r in runs}
    cli.main(args + ["--resume"])
    assert {r: os.path.getmtime(out / "runs" / r) for r in runs} == stamps
    # A stored run whose settings differ from its key's is not reused.
    with open(out / "runs" / runs[0]) as f:
        record = json.load(f)
    record["spec"]["momentum"] = 0.5
    with open(out / "runs" / runs[0], "w") as f:
        json.dump(record, f)
    with pytest.raises(ValueError, match="another run's settings"):
        cli.main(args + ["--resume"])


@pytest.mark.parametrize("flag,value", [("--classes", "0"),
                                        ("--train-per-class", "-1")])
def test_grid_rejects_zero_or_negative_counts(tmp_path, flag, value, capsys):
    with pytest.raises(SystemExit) as error:
        cli.main(["grid", "--output", str(tmp_path / "o"), flag, value])
    assert error.value.code == 2
    assert flag[2:].replace("-", "_") in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")


# Every setting the grid cannot use, data-dependent ones included, is a
# command-line error before the output folder is touched or anything trains.
GRID_REFUSALS = [
    (["--val-per-class", "99"], "val_per_class"),
    (["--classes", "100"], "classes"),
    (["--learning-rates", "0.1", "-1"], "learning_rates"),
    (["--momentum", "-0.5"], "momentum"),
    (["--momentum", "1"], "momentum"),
    (["--lr-drop-epochs", "-1"], "lr_drop_epochs"),
    (["--lr-drop-epochs", "3", "2"], "lr_drop_epochs"),
    (["--fraction", "0"], "fraction"),
    (["--fraction", "1.5"], "fraction"),
    (["--pretrain-patience", "-1"], "pretrain_patience"),
    (["--min-code-length", "1"], "min_code_length"),
    (["--learning-rates", "0.1", "0.01", "--select-seed", "1"], "select_seed"),
    (["--seeds", "-1", "0"], "seeds"),
    (["--batch-sizes", "100"], "batch_sizes"),
    (["--name", "../elsewhere/grid"], "name"),
    (["--encodings", "one_hot", "gaussian", "--code-lengths", "n-10"],
     "code_lengths"),
    # dense random codes for n = 4 classes have at most 7 columns
    (["--encodings", "one_hot", "dense_random", "--code-lengths", "100"],
     "code_lengths"),
]


@pytest.mark.backend_independent
@pytest.mark.parametrize("extra,name", GRID_REFUSALS)
def test_grid_refuses_unusable_settings_before_touching_the_output(
        tmp_path, extra, name, capsys):
    path = _tiny_npz(tmp_path, num_classes=8)
    tiny = [a for a in GRID_TINY]
    rates = [] if "--learning-rates" in extra else ["--learning-rate", "0.01"]
    with pytest.raises(SystemExit) as error:
        cli.main(["grid", "--dataset", path, "--output", str(tmp_path / "o"),
                  "--encodings", "one_hot", *tiny, *rates, *extra])
    assert error.value.code == 2
    assert f"`{name}`" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")


@pytest.mark.backend_independent
def test_grid_overwrite_deletes_only_what_the_runner_wrote(tmp_path):
    path = _tiny_npz(tmp_path)
    out = tmp_path / "out"
    args = ["grid", "--dataset", path, "--output", str(out), "--encodings",
            "one_hot", "--learning-rate", "0.01", *GRID_TINY]
    cli.main(args + ["--encodings", "one_hot", "gaussian"])
    (out / "notes.txt").write_text("mine")
    (out / "pretrain" / "notes.txt").write_text("mine")
    cli.main(args + ["--overwrite"])
    # The gaussian runs of the first grid are gone with every other run;
    # the user's files stay.
    assert len(os.listdir(out / "runs")) == 2
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "pretrain" / "notes.txt").read_text() == "mine"


@pytest.mark.backend_independent
def test_grid_refuses_to_resume_runs_of_a_data_file_that_changed(
        tmp_path, capsys):
    path = _tiny_npz(tmp_path)
    out = tmp_path / "out"
    args = ["grid", "--dataset", path, "--output", str(out), "--encodings",
            "one_hot", "--learning-rate", "0.01", *GRID_TINY]
    cli.main(args)
    data = dict(np.load(path))
    data["images"] = data["images"][::-1].copy()
    np.savez(path, **data)
    before = sorted(os.listdir(out / "runs"))
    with pytest.raises(SystemExit) as error:
        cli.main(args + ["--resume"])
    assert error.value.code == 2
    assert "other contents" in capsys.readouterr().err
    assert sorted(os.listdir(out / "runs")) == before


@pytest.mark.backend_independent
def test_grid_output_under_a_file_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    path = _tiny_npz(tmp_path)
    with pytest.raises(SystemExit) as error:
        cli.main(["grid", "--dataset", path, "--output",
                  str(tmp_path / "afile" / "sub"), "--encodings", "one_hot",
                  "--learning-rate", "0.01", *GRID_TINY])
    assert error.value.code == 2
    assert "`output`" in capsys.readouterr().err


def test_missing_matplotlib_is_named_before_training(tmp_path, monkeypatch,
                                                     capsys):
    import importlib.util

    from ecoc_research.experiments import common

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None
                        if name == "matplotlib" else real(name, *a))
    # A command-line error naming the extra, not a traceback.
    with pytest.raises(SystemExit) as error:
        cli.main(["grid", "--output", str(tmp_path / "o")])
    assert error.value.code == 2
    assert 'pip install "keras-ecoc[research]"' in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")
    # From Python it is still a ModuleNotFoundError.
    with pytest.raises(ModuleNotFoundError, match="matplotlib"):
        common.require_extras(["matplotlib"])


def test_pretraining_gives_the_same_network_whatever_ran_before_it(tmp_path):
    """One pretraining key, one network: the seed is set before the layers
    are built, so the initial weights (and the codes built from fc7) do not
    depend on what drew random numbers earlier in the process."""
    import keras

    rng = np.random.default_rng(0)
    x = rng.uniform(size=(24, 8, 8, 1)).astype("float32")
    y = np.repeat(np.arange(4), 6).astype("int32")
    task = protocols.Task(
        name="t", class_names=list("abcd"), train=(x, y), val=(x[:8], y[:8]),
        test=(x[:8], y[:8]), pretrain_train=(x, y), pretrain_val=(x[:8], y[:8]),
        pretrain_classes=list("abcd"))
    settings = {"variant": "same", "hidden": 8, "pretrain_seed": 3,
                "pretrain_epochs": 1, "pretrain_batch_size": 8,
                "pretrain_learning_rate": 1e-3, "pretrain_patience": 1}
    weights = []
    for earlier_seed in (1, 2):
        keras.utils.set_random_seed(earlier_seed)
        pretrained = protocols.Pretrained(
            settings, str(tmp_path / f"cache{earlier_seed}")).load_or_train(task)
        weights.append(pretrained.model.get_weights())
    for first, second in zip(*weights):
        np.testing.assert_array_equal(first, second)


def _tiny_one_hot_model(seed):
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    model = keras.Model(inputs, keras.layers.Dense(3, name="logits")(inputs))
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_train_tracked_trains_on_the_seeded_batches_of_a_gathered_copy():
    """train_tracked gathers each batch of the seeded order on demand; the
    weights must be those of fitting the whole gathered copy x[order]."""
    from ecoc_research import training

    rng = np.random.default_rng(5)
    x = rng.normal(size=(23, 6)).astype("float32")
    y = rng.integers(0, 3, 23).astype("int32")
    batch_size, epochs, seed = 4, 3, 7
    tracked = _tiny_one_hot_model(0)
    training.train_tracked(tracked, (x, y), (x, y), (x, y), batch_size,
                           epochs, seed, evals_per_epoch=2)
    # The order train_tracked documents: per epoch a permutation cut to
    # floor(23 / 4) = 5 full batches.
    order_rng = np.random.default_rng(seed)
    order = np.concatenate([order_rng.permutation(23)[:20]
                            for _ in range(epochs)])
    reference = _tiny_one_hot_model(0)
    reference.fit(x[order], y[order], batch_size=batch_size, epochs=1,
                  shuffle=False, verbose=0)
    for got, want in zip(tracked.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_validation_split_is_stratified_and_disjoint():
    labels = np.repeat(np.arange(5), 7)
    train, val = protocols.validation_split(labels, 3, seed=4)
    assert len(np.intersect1d(train, val)) == 0
    assert len(train) + len(val) == len(labels)
    assert np.all(np.bincount(labels[val]) == 3)
    again = protocols.validation_split(labels, 3, seed=4)[1]
    assert np.array_equal(val, again)
    with pytest.raises(ValueError, match="val_per_class"):
        protocols.validation_split(labels, 7, seed=0)


def test_transfer_split_alternates_alphabets():
    names = ["B/c1", "A/c1", "C/c1", "A/c2", "B/c2", "D/c1"]
    pre, re = protocols.transfer_split(names)
    # Sorted alphabets A, B, C, D: A and C pretrain, B and D retrain.
    assert list(pre) == [1, 2, 3] and list(re) == [0, 4, 5]
    pre, re = protocols.transfer_split(["x", "y", "z"])
    assert list(pre) == [0, 2] and list(re) == [1]


def test_paired_difference_matches_t_interval_by_hand():
    from scipy import stats as sps

    a = {0: 0.5, 1: 0.7, 2: 0.6, 3: 0.9}
    b = {0: 0.4, 1: 0.5, 2: 0.65, 3: 0.6, 9: 0.1}
    d = np.array([0.1, 0.2, -0.05, 0.3])
    half = sps.t.ppf(0.975, 3) * d.std(ddof=1) / np.sqrt(4)
    out = stats.paired_difference(a, b)
    assert out["n"] == 4
    np.testing.assert_allclose([out["low"], out["high"]],
                               [d.mean() - half, d.mean() + half])
    assert out["verdict"] == "within noise"
    out = stats.paired_difference({0: 1.0, 1: 1.1, 2: 1.2},
                                  {0: 0.0, 1: 0.0, 2: 0.0})
    assert out["verdict"] == "higher"


def test_steps_to_target_is_censored_at_the_budget():
    record = {"steps": [0, 10, 20], "val_accuracy": [0.0, 0.4, 0.6],
              "total_steps": 20, "test_accuracy": 0.5,
              "final_test_accuracy": 0.5, "best_val_accuracy": 0.6,
              "final_val_accuracy": 0.6}
    m = stats.run_metrics(record, 0.5)
    assert m["steps_to_target"] == 20 and m["reached"]
    m = stats.run_metrics(record, 0.9)
    assert m["steps_to_target"] == 20 and not m["reached"]
    assert stats.run_metrics(record, 0.3)["steps_to_target"] == 10
    # Trapezoids: (0.2 * 10 + 0.5 * 10) / 20.
    assert m["auc"] == pytest.approx(0.35)


def test_same_seed_gives_every_encoding_the_same_fc7():
    from ecoc_research import training

    codes = np.sign(np.random.default_rng(0).normal(size=(6, 4)))
    a = training.build_head(8, 6, codes=None, hidden=5, seed=3)
    b = training.build_head(8, 6, codes=codes.astype("float32"), hidden=5,
                            seed=3)
    c = training.build_head(8, 6, codes=None, hidden=5, seed=4)
    ka = a.get_layer("fc7").get_weights()[0]
    kb = b.backbone.get_layer("fc7").get_weights()[0]
    kc = c.get_layer("fc7").get_weights()[0]
    np.testing.assert_array_equal(ka, kb)
    assert not np.allclose(ka, kc)


def test_output_gradient_rows_match_numpy_softmax_gradient(rng):
    import keras

    from ecoc_research import training

    model = training.build_head(5, 4, hidden=3, seed=0)
    model.compile(optimizer="sgd", loss=keras.losses.
                  SparseCategoricalCrossentropy(from_logits=True))
    x = rng.normal(size=(6, 5)).astype("float32")
    y = np.array([0, 1, 1, 3, 3, 3])
    trunk = model.get_layer("fc7")
    w7, b7 = [np.asarray(v, np.float64) for v in trunk.get_weights()]
    w8, b8 = [np.asarray(v, np.float64)
              for v in model.get_layer("fc8").get_weights()]
    h = np.maximum(x @ w7 + b7, 0)
    logits = h @ w8 + b8
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(6), y] -= 1
    expected = np.linalg.norm(h.T @ p / 6, axis=0)
    np.testing.assert_allclose(training.output_gradient_rows(model, x, y),
                               expected, rtol=1e-4, atol=1e-7)
    assert training.active_fraction([1.0, 1e-4, 0.5], 1e-3) == pytest.approx(
        2 / 3)


def test_imprinted_output_layer_holds_normalised_centred_class_means(rng):
    from ecoc_research import training

    model = training.build_head(5, 3, hidden=4, seed=0)
    x = rng.normal(size=(9, 5)).astype("float32")
    y = np.repeat(np.arange(3), 3)
    training.imprint_output_layer(model, x, y, 3)
    w7, b7 = model.get_layer("fc7").get_weights()
    h = np.maximum(np.asarray(x, np.float64) @ w7 + b7, 0)
    means = np.stack([h[y == c].mean(0) for c in range(3)]) - h.mean(0)
    weights = means / np.linalg.norm(means, axis=1, keepdims=True)
    kernel, bias = model.get_layer("fc8").get_weights()
    np.testing.assert_allclose(kernel, weights.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bias, -weights @ h.mean(0), rtol=1e-5,
                               atol=1e-6)


def test_run_spec_rejects_bad_settings():
    with pytest.raises(ValueError, match="code_length"):
        runner_lib.RunSpec(encoding="gaussian", normalize_rows=True)
    with pytest.raises(ValueError, match="normalize_rows"):
        runner_lib.RunSpec(encoding="spectral", code_length=4)
    with pytest.raises(ValueError, match="head_lr_multiplier"):
        runner_lib.RunSpec(protocol="scratch", variant="same",
                           head_lr_multiplier=10.0)
    a = runner_lib.RunSpec(seed=1)
    assert a.key != runner_lib.RunSpec(seed=2).key
    assert runner_lib.RunSpec.from_dict(a.to_dict()) == a


@pytest.mark.backend_independent
def test_grid_scratch_protocol_trains_the_whole_network(tmp_path):
    path = _tiny_npz(tmp_path)
    out = tmp_path / "out"
    results = cli.main(["grid", "--dataset", path, "--output", str(out),
                        "--protocol", "scratch", "--encodings", "one_hot",
                        "spectral", "--learning-rate", "0.01",
                        *GRID_TINY])["grid"]
    # Scratch trains on every class (no transfer split).
    assert results["dataset"]["num_classes"] == 6
    labels = results["groups"][0]["comparison"]["labels"]
    assert set(labels) == {"one_hot", "spectral_norm"}
    with open(out / "runs" / f"{results['runs'][0]}.json") as f:
        record = json.load(f)
    assert record["spec"]["protocol"] == "scratch"
    assert "pretrain" not in record


def _code_error_record(tmp_path, monkeypatch, make_codes):
    from ecoc_research import training

    monkeypatch.setattr(training, "make_codes", make_codes)
    path = _tiny_npz(tmp_path, num_classes=4)
    spec = runner_lib.RunSpec(
        dataset=path, protocol="scratch", variant="same",
        encoding="dense_random", code_length=2, val_per_class=2,
        pretrain_epochs=1, hidden=8, batch_size=4, epochs=1)
    return runner_lib.Runner(str(tmp_path / "out"), chance_multiple=0).run(spec)


def test_duplicate_codewords_are_recorded_not_trained(tmp_path, monkeypatch):
    duplicated = np.array([[1, 1], [1, -1], [1, 1], [-1, -1]], np.float32)
    record = _code_error_record(tmp_path, monkeypatch,
                                lambda *args, **kwargs: duplicated)
    assert record["status"] == "duplicate_codewords"
    assert "3 distinct of 4" in record["error"]
    assert "test_accuracy" not in record
    with open(tmp_path / "out" / "runs" / f"{record['key']}.json") as f:
        assert json.load(f)["status"] == "duplicate_codewords"


def test_impossible_codes_are_recorded_not_trained(tmp_path, monkeypatch):
    def no_code(*args, **kwargs):
        raise ValueError("Could not draw dense random codes")

    record = _code_error_record(tmp_path, monkeypatch, no_code)
    assert record["status"] == "no_code"
    assert "Could not draw" in record["error"]
    assert "test_accuracy" not in record


@pytest.mark.backend_independent
def test_saved_runs_are_read_back_under_the_same_settings(tmp_path):
    from ecoc_research.experiments import saved_runs

    settings = {"epochs": 3, "code_lengths": (6, 12), "dataset": "cub"}
    runs = saved_runs.open_folder(str(tmp_path / "out"), settings)
    assert saved_runs.load_run(runs, "spectral_k6") is None
    saved_runs.save_run(runs, "spectral_k6", {"test": 0.5, "steps": [0, 10]})
    # Reopened with equal settings (a tuple and its JSON list are equal).
    again = saved_runs.open_folder(str(tmp_path / "out"), dict(settings))
    assert saved_runs.load_run(again, "spectral_k6") == {"test": 0.5,
                                                        "steps": [0, 10]}
    assert sorted(os.listdir(tmp_path / "out" / "runs")) == ["spectral_k6.json"]


@pytest.mark.backend_independent
def test_saved_runs_refuse_other_settings_unless_told_to_replace_them(tmp_path):
    from ecoc_research.experiments import common, saved_runs

    folder = str(tmp_path / "out")
    runs = saved_runs.open_folder(folder, {"epochs": 3, "seed": 0})
    saved_runs.save_run(runs, "one_hot", {"test": 0.5})
    with pytest.raises(common.ExistingResultsError, match=r"changed: epochs\)"):
        saved_runs.open_folder(folder, {"epochs": 6, "seed": 0})
    # The refusal kept the run and the settings it was made with.
    assert saved_runs.load_run(runs, "one_hot") == {"test": 0.5}
    runs = saved_runs.open_folder(folder, {"epochs": 6, "seed": 0},
                                  overwrite=True)
    assert saved_runs.load_run(runs, "one_hot") is None
    with pytest.raises(common.ExistingResultsError, match="epochs"):
        saved_runs.open_folder(folder, {"epochs": 3, "seed": 0})
    # Nothing written outside the folder it was given.
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.backend_independent
def test_saved_runs_reject_a_file_and_settings_json_cannot_hold(tmp_path):
    from ecoc_research.experiments import saved_runs

    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="Argument `path` must be a folder"):
        saved_runs.open_folder(str(tmp_path / "f"), {})
    with pytest.raises(ValueError, match="Argument `settings`"):
        saved_runs.open_folder(str(tmp_path / "d"), {"x": object()})
