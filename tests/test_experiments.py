"""The experiment command (`python -m keras_ecoc.experiments`) on tiny data.

Every sub-command runs in-process on a few images of a few classes for one
epoch and must write sane JSON, Markdown and PNG files. The full runs of
docs/results.md are not part of the suite. Backend-neutral: the experiments
only use Keras models and NumPy.
"""

import json
import os

import numpy as np
import pytest

from keras_ecoc.experiments import __main__ as cli
from keras_ecoc.experiments import attribute_correlation
from keras_ecoc.experiments import tsne
from keras_ecoc.experiments.scale import parse_scale_config
from keras_ecoc.experiments.tsne import neighbour_agreement

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


def test_parse_scale_config():
    assert parse_scale_config("fixed:1") == (1.0, False)
    assert parse_scale_config("learnable:8") == (8.0, True)
    for bad in ("fixed", "learn:2", "fixed:-1"):
        with pytest.raises(ValueError):
            parse_scale_config(bad)


def test_ablation_command(tmp_path):
    encodings = ["one_hot", "spectral"]
    cli.main(["ablation", *TINY, "--code-lengths", "4", "9",
              "--encodings", *encodings, "--output", str(tmp_path)])
    data, markdown = _load(tmp_path, "ablation")
    _check_png(tmp_path / "ablation.png")
    assert {r["encoding"] for r in data["summary"]} == set(encodings)
    for encoding in encodings:
        assert encoding in markdown
    # k = 9 > n - 1 = 5 is impossible for spectral codes: skipped, not run.
    assert data["skipped"] == [{"encoding": "spectral", "code_length": 9,
                                "reason": "k must be <= 5"}]
    assert [(r["encoding"], r["code_length"]) for r in data["runs"]] == [
        ("one_hot", 6), ("spectral", 4)]
    for run in data["runs"]:
        _check_accuracy(run["final_accuracy"])
        assert len(run["epoch_accuracies"]) == 1
    assert data["dataset"]["num_classes"] == 6
    assert data["dataset"]["train_images"] == 18
    assert data["settings"]["similarity"]["epochs"] == 1


def test_duplicate_codewords_are_recorded_not_trained(monkeypatch):
    from keras_ecoc.experiments import common

    duplicated = np.array([[1, 1], [1, -1], [1, 1], [-1, -1]], np.float32)
    monkeypatch.setattr(common, "encoding_codes",
                        lambda *args, **kwargs: duplicated)
    data = common.load_data(common.DataOptions(
        classes=4, train_per_class=2, test_per_class=1))
    record = common.train_run(data, "spectral_median", 2, 0, None,
                              batch_size=4, epochs=1, verbose=0)
    assert record["status"] == "duplicate_codewords"
    assert record["distinct_rows"] == 3 and record["final_accuracy"] is None
    from keras_ecoc.experiments import report

    row = report.summarize([record], ("encoding",))[0]
    assert row["failed"] == 1
    assert report.accuracy_cell(row) == "duplicate codewords"


def test_duplicate_classes_are_dropped():
    from keras_ecoc.datasets import ImageDataset
    from keras_ecoc.experiments import common

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


def test_impossible_codes_are_recorded_not_trained(monkeypatch):
    from keras_ecoc.experiments import common
    from keras_ecoc.experiments import report

    def no_code(*args, **kwargs):
        raise ValueError("Could not draw dense random codes")

    monkeypatch.setattr(common, "encoding_codes", no_code)
    data = common.load_data(common.DataOptions(
        classes=4, train_per_class=2, test_per_class=1))
    record = common.train_run(data, "dense_random", 2, 0, None,
                              batch_size=4, epochs=1, verbose=0)
    assert record["status"] == "no_code"
    assert "Could not draw" in record["error"]
    row = report.summarize([record], ("encoding",))[0]
    assert report.accuracy_cell(row) == "no admissible code"


def test_batch_size_command(tmp_path):
    cli.main(["batch-size", *TINY, "--batch-sizes", "4", "9",
              "--encodings", "one_hot", "gaussian", "--code-length", "4",
              "--eval-per-epoch", "2", "--fraction", "0.5",
              "--output", str(tmp_path)])
    data, _ = _load(tmp_path, "batch_size")
    _check_png(tmp_path / "batch_size.png")
    assert {(r["batch_size"], r["encoding"]) for r in data["summary"]} == {
        (4, "one_hot"), (4, "gaussian"), (9, "one_hot"), (9, "gaussian")}
    for run in data["runs"]:
        # 18 images: 5 steps at batch 4, 2 at batch 9.
        assert run["steps"][-1] == {4: 5, 9: 2}[run["batch_size"]]
        for value in run["accuracies"]:
            _check_accuracy(value)
        if run["steps_to_target"] is not None:
            assert run["steps_to_target"] in run["steps"]
        assert run["target"] == pytest.approx(
            0.5 * max(r["best_accuracy_mean"] for r in data["summary"]
                      if r["batch_size"] == run["batch_size"]))
    assert len(data["curves"]) == 4


def test_attributes_need_class_attributes(tmp_path):
    with pytest.raises(ValueError, match="attributes"):
        cli.main(["attributes", *TINY, "--output", str(tmp_path)])


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


def test_scale_command(tmp_path):
    cli.main(["scale", *TINY, "--encodings", "gaussian", "--code-length", "4",
              "--scale-configs", "fixed:1", "learnable:8",
              "--output", str(tmp_path)])
    data, _ = _load(tmp_path, "scale")
    _check_png(tmp_path / "scale.png")
    configs = {(r["encoding"], r["scale_config"]): r for r in data["summary"]}
    assert set(configs) == {("one_hot", "n/a"), ("gaussian", "fixed:1"),
                            ("gaussian", "learnable:8")}
    assert configs[("gaussian", "fixed:1")]["final_scale_mean"] == (
        pytest.approx(1.0))
    assert configs[("one_hot", "n/a")]["final_scale_mean"] is None


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
    assert [c[0] for c in calls] == ["ablation", "cub-bits", "batch-size",
                                     "pictures", "scale"]
    assert set(results) == {c[0] for c in calls}
    assert all(c[1:] == (1, 12) for c in calls)  # --smoke settings
    readme = (tmp_path / "README.md").read_text()
    assert "## batch-size" in readme and "table of scale" in readme
