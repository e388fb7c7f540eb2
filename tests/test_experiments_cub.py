"""CUB add-bits (pretrained backbone, TOST) and attribute nulls, tiny data."""

import json
import os

import numpy as np
import pytest
from scipy import stats

from ecoc_research.experiments import __main__ as cli
from ecoc_research.experiments import attributes as attr
from ecoc_research.experiments import cub_bits


def _fake_source(tmp_path, num_classes=4, per_class=8, size=16):
    """A generic .npz (images/labels/is_train) to pretrain on."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(num_classes), per_class).astype("int16")
    images = rng.integers(0, 256, (len(labels), size, size, 3), dtype=np.uint8)
    is_train = np.tile([1] * (per_class - 2) + [0, 0], num_classes)
    path = tmp_path / "source.npz"
    np.savez(path, images=images, labels=labels,
             is_train=is_train.astype("uint8"))
    return str(path)


def _fake_cub(tmp_path, num_classes=6, attributes=20, size=16):
    """A CUB-layout .npz: 4 train + 2 test images a class, attributes."""
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(num_classes), 6).astype("int16")
    is_train = np.tile([1, 1, 1, 1, 0, 0], num_classes).astype("uint8")
    images = rng.integers(0, 256, (len(labels), size, size, 3), dtype=np.uint8)
    path = tmp_path / "fake_cub.npz"
    np.savez(path, images_center=images, images_bbox=images, labels=labels,
             is_train=is_train, image_id=np.arange(len(labels), dtype="int32"),
             class_attributes_continuous=rng.uniform(
                 0, 100, (num_classes, attributes)).astype("float32"))
    return str(path)


# --- codes -----------------------------------------------------------------


def test_truncated_one_hot_keeps_distinct_rows_only_at_n_minus_1():
    codes = cub_bits.truncated_one_hot(5, 4)
    np.testing.assert_array_equal(codes, np.eye(5, 4))
    assert len(np.unique(codes, axis=0)) == 5  # last class: the zero row
    with pytest.raises(ValueError, match="code_length"):
        cub_bits.truncated_one_hot(5, 3)  # classes 3 and 4 would share 0


def test_make_code_data_based_codes_ignore_the_seed():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 4))
    similarity = np.exp(-np.sum((x[:, None] - x[None]) ** 2, -1))
    a = cub_bits.make_code("spectral", 6, 3, similarity, seed=0)
    b = cub_bits.make_code("spectral", 6, 3, similarity, seed=5)
    np.testing.assert_array_equal(a, b)
    g0 = cub_bits.make_code("gaussian", 6, 3, None, seed=0)
    g1 = cub_bits.make_code("gaussian", 6, 3, None, seed=1)
    assert not np.allclose(g0, g1)
    np.testing.assert_allclose(np.linalg.norm(g0, axis=1), np.sqrt(3),
                               rtol=1e-5)
    assert cub_bits.make_code("one_hot", 6, 6, None, 0) is None


def test_build_head_sets_the_initial_decoding_scale():
    codes = cub_bits.truncated_one_hot(5, 4)
    model = cub_bits.build_head(7, 5, codes, fc_width=3, scale=7.0)
    assert float(np.asarray(model.decoder.scale)) == pytest.approx(7.0)
    assert model.code_length == 4 and model.num_classes == 5
    one_hot = cub_bits.build_head(7, 5, None, fc_width=3)
    assert one_hot.output_shape == (None, 5)


# --- statistics ------------------------------------------------------------


def test_paired_equivalence_matches_two_one_sided_t_tests():
    d = np.array([0.3, -0.2, 0.5, 0.1, 0.4, -0.1])
    out = cub_bits.paired_equivalence(d, margin=1.0)
    s, mean, sem = len(d), d.mean(), d.std(ddof=1) / np.sqrt(len(d))
    p_lower = stats.t.sf((mean + 1.0) / sem, s - 1)
    p_upper = stats.t.cdf((mean - 1.0) / sem, s - 1)
    assert out["p_lower"] == pytest.approx(p_lower, rel=1e-9)
    assert out["p_upper"] == pytest.approx(p_upper, rel=1e-9)
    assert out["p_tost"] == pytest.approx(max(p_lower, p_upper), rel=1e-9)
    half90 = stats.t.ppf(0.95, s - 1) * sem
    np.testing.assert_allclose(out["ci90"], [mean - half90, mean + half90])
    # TOST at 5% <=> the 90% CI inside the margin.
    assert out["equivalent"] == (-1 < out["ci90"][0] and out["ci90"][1] < 1)
    assert out["equivalent"]
    assert cub_bits.verdict(out).startswith("matches one-hot")


def test_paired_equivalence_rejects_a_clear_loss_and_bad_input():
    out = cub_bits.paired_equivalence([-4.0, -5.0, -3.5, -4.5, -6.0])
    assert not out["equivalent"] and out["ci95"][1] < 0
    assert cub_bits.verdict(out) == "below one-hot"
    wide = cub_bits.paired_equivalence([3.0, -3.0, 2.0, -2.5])
    assert cub_bits.verdict(wide) == "inconclusive"
    constant = cub_bits.paired_equivalence([0.5, 0.5, 0.5])
    assert constant["equivalent"] and constant["ci95"] == [0.5, 0.5]
    with pytest.raises(ValueError, match="differences"):
        cub_bits.paired_equivalence([1.0])
    with pytest.raises(ValueError, match="margin"):
        cub_bits.paired_equivalence([1.0, 2.0], margin=0)


def test_validation_split_is_stratified_and_fixed():
    labels = np.repeat(np.arange(4), [7, 5, 6, 9])
    train, val = cub_bits.validation_split(labels, per_class=2, seed=3)
    assert np.bincount(labels[val]).tolist() == [2, 2, 2, 2]
    np.testing.assert_array_equal(np.sort(np.concatenate([train, val])),
                                  np.arange(len(labels)))
    again = cub_bits.validation_split(labels, per_class=2, seed=3)
    np.testing.assert_array_equal(val, again[1])
    with pytest.raises(ValueError, match="per_class"):
        cub_bits.validation_split(labels, per_class=5)  # class 1 has 5


def test_pretrain_settings_key_tracks_every_setting():
    a = cub_bits.PretrainSettings(source="/x/cifar.npz")
    assert a.key() == cub_bits.PretrainSettings(source="/y/cifar.npz").key()
    assert a.key() != cub_bits.PretrainSettings(source="/x/cifar.npz",
                                                epochs=7).key()
    assert a.key() != cub_bits.PretrainSettings(source="/x/cifar.npz",
                                                train_per_class=3).key()
    with pytest.raises(ValueError, match="epochs"):
        cub_bits.PretrainSettings(source="s.npz", epochs=0)
    with pytest.raises(ValueError, match="learning_rate"):
        cub_bits.PretrainSettings(source="s.npz", learning_rate=-1.0)


# --- attribute correlation and its null --------------------------------------


def test_attribute_correlation_matches_float64_reference():
    rng = np.random.default_rng(1)
    codes = rng.standard_normal((15, 6))
    attributes = rng.uniform(0, 100, (15, 9))
    attributes[:, 4] = 7.0  # constant: correlation undefined -> 0
    c = codes - codes.mean(0)
    a = attributes - attributes.mean(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        reference = (c.T @ a) / np.outer(np.linalg.norm(c, axis=0),
                                         np.linalg.norm(a, axis=0))
    reference[:, 4] = 0.0
    r = attr.attribute_correlation(codes, attributes)
    np.testing.assert_allclose(r, reference, atol=1e-12)
    with pytest.raises(ValueError, match="same number of rows"):
        attr.attribute_correlation(codes, attributes[:3])


def test_batched_statistic_equals_one_code_at_a_time(monkeypatch):
    monkeypatch.setattr(attr, "_CHUNK_COLUMNS", 7)  # several chunks
    rng = np.random.default_rng(2)
    stack = rng.standard_normal((5, 10, 3))
    attributes = rng.uniform(0, 1, (10, 4))
    batched = attr.batched_mean_best_abs_r(stack, attributes)
    single = [attr.mean_best_abs_r(c, attributes) for c in stack]
    np.testing.assert_allclose(batched, single, atol=1e-12)


def test_empirical_p_value_counts_draws_at_least_as_high():
    null = np.array([0.1, 0.2, 0.3, 0.4])
    assert attr.empirical_p_value(0.35, null) == pytest.approx(2 / 5)
    assert attr.empirical_p_value(0.5, null) == pytest.approx(1 / 5)
    assert attr.empirical_p_value(0.0, null) == pytest.approx(1.0)


def test_null_distribution_is_reproducible_and_rejects_bad_input():
    attributes = np.random.default_rng(3).uniform(0, 1, (8, 5))
    a = attr.null_distribution("dense_random", 8, 4, attributes, draws=6)
    b = attr.null_distribution("dense_random", 8, 4, attributes, draws=6)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (6,) and np.all((a >= 0) & (a <= 1))
    with pytest.raises(ValueError, match="encoding"):
        attr.null_distribution("spectral", 8, 4, attributes)
    with pytest.raises(ValueError, match="draws"):
        attr.null_distribution("gaussian", 8, 4, attributes, draws=0)


def test_permutation_null_shuffles_classes_only():
    rng = np.random.default_rng(5)
    attributes = rng.uniform(0, 1, (9, 6))
    codes = attributes[:, :2] + 0.01 * rng.standard_normal((9, 2))
    null = attr.permutation_null(codes, attributes, draws=50, seed=1)
    order = np.random.default_rng(1).permutation(9)
    assert null[0] == pytest.approx(
        attr.mean_best_abs_r(codes[order], attributes), abs=1e-12)
    # Codes copied from the attributes beat (almost) every shuffle.
    value = attr.mean_best_abs_r(codes, attributes)
    assert value > 0.99 and attr.empirical_p_value(value, null) < 0.1


def test_run_attributes_reports_null_and_p_values(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 3))
    similarity = np.exp(-np.sum((x[:, None] - x[None]) ** 2, -1))
    attributes = np.concatenate([x, rng.uniform(0, 1, (8, 4))], 1)
    out = attr.run_attributes(similarity, attributes, str(tmp_path),
                              code_lengths=(2, 5), draws=20,
                              encodings=("spectral", "spectral_median"))
    assert {(r["encoding"], r["code_length"]) for r in out["codes"]} == {
        ("spectral", 2), ("spectral", 5), ("spectral_median", 2),
        ("spectral_median", 5)}
    no_code = [r for r in out["null"] if r.get("status") == "no_code"]
    # Dense random codes need 2 ** k >= n: none with 2 bits for 8 classes.
    assert [(r["encoding"], r["code_length"]) for r in no_code] == [
        ("dense_random", 2)]
    for r in out["codes"]:
        assert 0 < r["p_vs_gaussian"] <= 1 and 0 < r["p_vs_permuted"] <= 1
        assert 0 <= r["mean_best_abs_r"] <= 1
        # The permutation draws are stored and give the stored p-value.
        draws = np.asarray(r["permuted_null"]["values"])
        assert len(draws) == 20
        assert r["p_vs_permuted"] == pytest.approx(
            (1 + np.sum(draws >= r["mean_best_abs_r"])) / 21)
    assert {os.path.basename(f) for f in out["files"]} == {
        "attributes.png", "attributes.md", "attributes.json"}
    with open(tmp_path / "attributes.json") as f:
        stored = json.load(f)
    assert stored["settings"]["draws"] == 20
    assert all(len(r["values"]) == 20 for r in stored["null"]
               if r.get("status") != "no_code")
    with pytest.raises(FileExistsError, match="overwrite"):
        attr.run_attributes(similarity, attributes, str(tmp_path),
                            code_lengths=(5,), draws=3)
    attr.run_attributes(similarity, attributes, str(tmp_path),
                        code_lengths=(5,), draws=3, overwrite=True)


# --- end to end --------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    ({"seeds": [0]}, "seeds"),
    ({"encodings": ["one_hot", "hadamard"]}, "encodings"),
    ({"code_lengths": [1, 4]}, "code_lengths"),
    ({"learning_rates": [0.01, -1.0]}, "learning_rates"),
])
def test_run_cub_bits_rejects_bad_arguments_before_training(
        tmp_path, kwargs, match):
    pretrain = cub_bits.PretrainSettings(source="missing.npz")
    with pytest.raises(ValueError, match=match):
        cub_bits.run_cub_bits("missing.npz", str(tmp_path), pretrain,
                              **kwargs)
    assert not os.listdir(tmp_path)  # nothing written


@pytest.mark.slow
def test_cub_bits_command_end_to_end_with_resume(tmp_path):
    source, cub = _fake_source(tmp_path), _fake_cub(tmp_path)
    out = tmp_path / "out"
    argv = ["cub-bits", "--dataset", cub, "--pretrain-source", source,
            "--pretrain-epochs", "1", "--pretrain-image-size", "16",
            "--val-per-class", "1", "--seeds", "0", "1", "--epochs", "2",
            "--batch-size", "8", "--learning-rates", "0.01", "0.1",
            "--code-lengths", "3", "5", "6", "--encodings", "one_hot",
            "truncated_one_hot", "spectral", "--verbose", "0",
            "--output", str(out)]
    results = cli.main(argv)["cub-bits"]
    rows = {(r["encoding"], r["code_length"]): r for r in results["summary"]}
    # n = 6: truncated one-hot only at k >= n - 1; spectral only k <= n - 1.
    assert set(rows) == {("one_hot", 6), ("truncated_one_hot", 5),
                         ("truncated_one_hot", 6), ("spectral", 3),
                         ("spectral", 5)}
    for row in rows.values():
        assert row["status"] == "ok" and row["learning_rate"] in (0.01, 0.1)
        assert len(row["test_accuracy"]) == 2
    assert "equivalence" in rows[("spectral", 3)]
    # Same decoder, one-hot codewords (k = n): the code-only comparison.
    assert "equivalence_ecoc_identity" in rows[("spectral", 3)]
    assert "equivalence_ecoc_identity" not in rows[("truncated_one_hot", 6)]
    runs = sorted(os.listdir(out / "runs"))
    # Per (encoding, k): 2 learning rates at seed 0, then seed 1.
    assert len(runs) == 5 * 3
    assert (out / "cub_bits.png").exists() and (out / "cub_bits.json").exists()
    backbones = [d for d in os.listdir(out) if d.startswith("backbone-")]
    assert len(backbones) == 1
    with pytest.raises(FileExistsError, match="--resume"):
        cli.main(argv)
    again = cli.main(argv + ["--resume"])["cub-bits"]
    assert [r["test_accuracy"] for r in again["summary"]] == [
        r["test_accuracy"] for r in results["summary"]]


@pytest.mark.slow
def test_attributes_command_uses_the_pretrained_backbone(tmp_path):
    source, cub = _fake_source(tmp_path), _fake_cub(tmp_path)
    out = tmp_path / "out"
    results = cli.main([
        "attributes", "--dataset", cub, "--pretrain-source", source,
        "--pretrain-epochs", "1", "--pretrain-image-size", "16",
        "--val-per-class", "1", "--code-lengths", "3",
        "--random-draws", "10", "--verbose", "0", "--output", str(out)])
    results = results["attributes"]
    assert results["settings"]["num_attributes"] == 20
    assert {r["encoding"] for r in results["codes"]} == set(
        attr.DATA_ENCODINGS)
    assert "pretrain" in results["settings"]["source"]
    assert (out / "attributes.png").exists()
