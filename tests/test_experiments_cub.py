"""CUB add-bits (pretrained backbone, TOST) and attribute nulls, tiny data."""

import json
import os

import numpy as np
import pytest
from scipy import stats

from ecoc_research.experiments import __main__ as cli
from ecoc_research.experiments import attributes as attr
from ecoc_research.experiments import cub_bits
from ecoc_research.experiments import protocols
from ecoc_research.experiments import runner as runner_lib
from ecoc_research.experiments import stats as stats_lib


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


def _records(values, encoding, code_length=None, lr=0.01):
    """Stored-run records (as `Runner.run` writes them) of one encoding."""
    spec = runner_lib.RunSpec(
        encoding=encoding, code_length=code_length,
        normalize_rows=True if encoding == "spectral" else None,
        learning_rate=lr)
    return [{"spec": {**spec.to_dict(), "seed": seed}, "status": "ok",
             "outputs": code_length or 6, "test_accuracy": v}
            for seed, v in enumerate(values)]


def test_imprinted_pretrained_head_is_the_normalised_class_means_of_pretrained_fc7(
        tmp_path):
    import keras

    from ecoc_research import training

    rng = np.random.default_rng(3)
    feats = rng.normal(size=(30, 7)).astype("float32")
    labels = np.repeat(np.arange(3), 10)
    head = training.build_head(7, 3, hidden=5, seed=0)
    # A stand-in for the pretrained network: only its fc7 is used (on the
    # 7 frozen features), with a non-zero bias so that fc7 really matters.
    pretrained = keras.Sequential(
        [keras.Input((7,)),
         keras.layers.Dense(5, activation="relu", name="fc7")])
    pretrained.get_layer("fc7").set_weights(
        [rng.normal(0, 0.5, (7, 5)).astype("float32"),
         rng.normal(0, 0.5, 5).astype("float32")])
    protocols.copy_pretrained_fc7(head, pretrained)
    training.imprint_output_layer(head, feats, labels, 3)
    kernel, bias = pretrained.get_layer("fc7").get_weights()
    h = np.maximum(feats.astype(np.float64) @ kernel + bias, 0.0)
    overall = h.mean(0)
    means = np.stack([h[labels == c].mean(0) for c in range(3)]) - overall
    w = means / np.linalg.norm(means, axis=1, keepdims=True)
    fc8 = head.get_layer("fc8")
    np.testing.assert_allclose(fc8.kernel.numpy(), w.T, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(fc8.bias.numpy(), -w @ overall, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_array_equal(head.get_layer("fc7").kernel.numpy(),
                                  kernel)
    with pytest.raises(ValueError, match="hidden"):
        protocols.copy_pretrained_fc7(
            training.build_head(7, 3, hidden=4, seed=0), pretrained)


def test_imprinted_pretrained_is_refused_where_there_is_no_pretrained_fc7():
    with pytest.raises(ValueError, match="scratch"):
        runner_lib.RunSpec(encoding="one_hot_imprinted_pretrained",
                           protocol="scratch", variant="same")


def test_new_spec_fields_keep_the_keys_of_stored_runs():
    spec = runner_lib.RunSpec()
    assert "pretrain_dataset" not in spec.to_dict()
    # The key of the default spec before the external variant existed.
    assert spec.key == "2ea098fdee423bec"
    external = runner_lib.RunSpec(variant="external",
                                  pretrain_dataset="c.npz")
    assert external.key != spec.key
    assert external.pretrain_settings()["pretrain_dataset"] == "c.npz"
    assert runner_lib.RunSpec.from_dict(external.to_dict()) == external
    with pytest.raises(ValueError, match="pretrain_dataset"):
        runner_lib.RunSpec(variant="external")
    with pytest.raises(ValueError, match="pretrain_dataset"):
        runner_lib.RunSpec(pretrain_dataset="c.npz")
    with pytest.raises(ValueError, match="head_lr_multiplier"):
        runner_lib.RunSpec(protocol="finetune", head_lr_multiplier=10.0)


def test_external_split_uses_the_shared_validation_rule(tmp_path):
    from ecoc_research import datasets

    cub = datasets.load_dataset(_fake_cub(tmp_path))
    source = datasets.load_dataset(_fake_source(tmp_path), image_size=16)
    task = protocols.split_task(cub, "retrain", "external", None, 1, 7,
                                pretrain_data=source)
    tr, va = protocols.validation_split(cub.y_train, 1, 7)
    np.testing.assert_array_equal(task.val[1], cub.y_train[va])
    np.testing.assert_array_equal(task.train[0], cub.x_train[tr])
    ptr, pva = protocols.validation_split(source.y_train, 1, 7)
    np.testing.assert_array_equal(task.pretrain_val[0], source.x_train[pva])
    assert task.pretrain_classes == list(source.class_names)
    assert task.num_classes == cub.num_classes
    with pytest.raises(ValueError, match="pretrain_data"):
        protocols.split_task(cub, "retrain", "external", None, 1, 7)


def test_finetune_network_copies_the_backbone_and_pairs_the_new_head():
    from ecoc_research import training

    rng = np.random.default_rng(0)
    pretrained = protocols.build_pretrain_network((8, 8, 3), 4, hidden=6)
    for w in pretrained.weights:
        w.assign(rng.normal(0, 0.1, w.shape).astype("float32"))
    codes = np.sign(rng.normal(size=(5, 3))).astype("float32")
    one_hot = protocols.build_finetune_network(pretrained, 5, hidden=6,
                                               seed=4)
    ecoc = protocols.build_finetune_network(pretrained, 5, codes, hidden=6,
                                            seed=4, scale=1.0,
                                            learnable_scale=False)
    head = training.build_head(256, 5, hidden=6, seed=4)
    for name in ("conv0", "conv1", "conv2", "features"):
        for a, b in zip(one_hot.get_layer(name).get_weights(),
                        pretrained.get_layer(name).get_weights()):
            np.testing.assert_array_equal(a, b)
    # Same seed: the same re-initialised fc7 as the frozen-feature head.
    np.testing.assert_array_equal(one_hot.get_layer("fc7").kernel.numpy(),
                                  head.get_layer("fc7").kernel.numpy())
    np.testing.assert_array_equal(
        ecoc.backbone.get_layer("fc7").kernel.numpy(),
        head.get_layer("fc7").kernel.numpy())
    assert not np.allclose(one_hot.get_layer("fc7").kernel.numpy(),
                           pretrained.get_layer("fc7").kernel.numpy())
    x = rng.normal(size=(2, 8, 8, 3)).astype("float32")
    assert tuple(one_hot(x).shape) == (2, 5)
    assert tuple(ecoc(x).shape) == (2, 3)


def test_summarize_cub_pairs_seeds_with_tost_and_holm():
    rng = np.random.default_rng(0)
    one_hot = rng.uniform(0.3, 0.4, 5)
    spectral = one_hot - 0.04 + rng.normal(0, 0.005, 5)
    imprinted = one_hot + rng.normal(0, 0.002, 5)
    records = (_records(one_hot, "one_hot")
               + _records(spectral, "spectral", 3)
               + _records(imprinted, "one_hot_imprinted_pretrained"))
    out = cub_bits.summarize_cub(records, margin=1.0)
    rows = {r["label"]: r for r in out["rows"]}
    d = 100 * (spectral - one_hot)
    test = rows["spectral_norm k=3"]["vs_one_hot"]
    assert test["mean"] == pytest.approx(d.mean())
    p = stats.ttest_1samp(d, 0.0).pvalue
    assert test["p_difference"] == pytest.approx(p)
    d2 = 100 * (imprinted - one_hot)
    p2 = stats.ttest_1samp(d2, 0.0).pvalue
    # Holm over the two comparisons with one-hot.
    low, high = sorted([p, p2])
    expected = {p: min(1, 2 * p) if p == low else max(min(1, 2 * low), p),
                p2: min(1, 2 * p2) if p2 == low else max(min(1, 2 * low),
                                                         p2)}
    assert test["p_difference_holm"] == pytest.approx(expected[p])
    assert test["verdict"] == "below one-hot"
    assert rows["one_hot_imprinted_pretrained"]["vs_one_hot"][
        "verdict"].startswith("matches one-hot")
    mean, low_ci, high_ci = 100 * one_hot.mean(), *stats.t.interval(
        0.95, 4, loc=100 * one_hot.mean(), scale=stats.sem(100 * one_hot))
    assert rows["one_hot"]["mean"] == pytest.approx(mean)
    assert rows["one_hot"]["ci95"] == pytest.approx([low_ci, high_ci])
    control = out["controls"][0]
    assert control["control"] == "one_hot_imprinted_pretrained"
    assert control["mean"] == pytest.approx(np.mean(100 * (spectral
                                                           - imprinted)))
    assert control["p_difference_holm"] == pytest.approx(
        control["p_difference"])  # A family of one.


# --- statistics ------------------------------------------------------------


def test_paired_equivalence_matches_two_one_sided_t_tests():
    d = np.array([0.3, -0.2, 0.5, 0.1, 0.4, -0.1])
    out = stats_lib.paired_equivalence(d, margin=1.0)
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
    assert stats_lib.equivalence_verdict(out).startswith("matches one-hot")


def test_paired_equivalence_rejects_a_clear_loss_and_bad_input():
    out = stats_lib.paired_equivalence([-4.0, -5.0, -3.5, -4.5, -6.0])
    assert not out["equivalent"] and out["ci95"][1] < 0
    assert stats_lib.equivalence_verdict(out) == "below one-hot"
    wide = stats_lib.paired_equivalence([3.0, -3.0, 2.0, -2.5])
    assert stats_lib.equivalence_verdict(wide) == "inconclusive"
    # Equal differences: no t-interval; the exact sign-flip tests decide.
    # Three seeds cannot show equivalence (1 / 2^3 = 0.125), five can (0.031).
    three = stats_lib.paired_equivalence([0.5, 0.5, 0.5])
    assert three["ci95"] is None and three["p_tost"] == pytest.approx(0.125)
    assert not three["equivalent"]
    assert stats_lib.equivalence_verdict(three) == "inconclusive"
    five = stats_lib.paired_equivalence([0.5] * 5)
    assert five["equivalent"] and five["p_tost"] == pytest.approx(1 / 32)
    with pytest.raises(ValueError, match="differences"):
        stats_lib.paired_equivalence([1.0])
    with pytest.raises(ValueError, match="margin"):
        stats_lib.paired_equivalence([1.0, 2.0], margin=0)


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
    # The progress file is gone once the summary is written.
    assert not (tmp_path / "attributes.partial.json").exists()
    with open(tmp_path / "attributes.json") as f:
        stored = json.load(f)
    assert stored["settings"]["draws"] == 20
    assert all(len(r["values"]) == 20 for r in stored["null"]
               if r.get("status") != "no_code")
    _assert_stored_nulls_give_p_values(stored)
    with pytest.raises(FileExistsError, match="overwrite"):
        attr.run_attributes(similarity, attributes, str(tmp_path),
                            code_lengths=(5,), draws=3)
    attr.run_attributes(similarity, attributes, str(tmp_path),
                        code_lengths=(5,), draws=3, overwrite=True)


def _assert_stored_nulls_give_p_values(stored):
    """Every p of an attributes JSON, and its Holm value, from its draws."""
    nulls = {(r["encoding"], r["code_length"]): np.asarray(r["values"])
             for r in stored["null"] if r.get("status") != "no_code"}
    cells = []
    for r in stored["codes"]:
        for null in ("permuted", *stored["settings"]["null_encodings"]):
            values = (np.asarray(r["permuted_null"]["values"])
                      if null == "permuted"
                      else nulls.get((null, r["code_length"])))
            if values is None:
                assert r[f"p_vs_{null}"] is None
            else:
                assert len(values) == stored["settings"]["draws"]
                # Independent of the module's helper: a count of draws.
                expected = ((1 + int(np.count_nonzero(
                    values >= r["mean_best_abs_r"]))) / (1 + len(values)))
                assert r[f"p_vs_{null}"] == pytest.approx(expected, abs=0)
                assert r[f"p_mc_se_vs_{null}"] == pytest.approx(
                    np.sqrt(expected * (1 - expected) / len(values)))
            cells.append((r, null))
    holm = stats_lib.holm([r[f"p_vs_{null}"] for r, null in cells])
    assert [r[f"p_holm_vs_{null}"] for r, null in cells] == pytest.approx(
        holm)


def test_dense_null_redraws_a_seed_without_admissible_code(monkeypatch):
    from keras_ecoc import codes as codes_lib

    attributes = np.random.default_rng(6).uniform(0, 1, (8, 5))
    real = codes_lib.dense_random
    tried = []

    def no_code_for_seed_2(num_classes, code_length, seed=None, **kwargs):
        tried.append(seed)
        if seed == 2:
            raise ValueError("no admissible candidate")
        return real(num_classes, code_length, seed=seed, **kwargs)

    monkeypatch.setattr(codes_lib, "dense_random", no_code_for_seed_2)
    redrawn = []
    values = attr.null_distribution("dense_random", 8, 4, attributes,
                                    draws=4, redrawn=redrawn)
    assert redrawn == [2]
    # Draw 2 takes seed 2 + 4 draws = 6, which no other draw uses.
    assert tried.count(6) == 1 and tried.count(2) == 2
    expected = [attr.mean_best_abs_r(codes_lib.normalize_rows(
        real(8, 4, seed=seed, trials=attr.NULL_DENSE_TRIALS)), attributes)
        for seed in (0, 1, 6, 3)]
    np.testing.assert_allclose(values, expected, rtol=1e-12)
    # A k with no admissible code for any seed stays an error.
    with pytest.raises(ValueError, match="2 \\*\\* code_length"):
        attr.null_distribution("dense_random", 50, 4, np.zeros((50, 3)) +
                               np.arange(50)[:, None], draws=2)


def test_stored_cub_attribute_nulls_give_the_reported_p_values():
    # docs/results/cub_attributes_null.json, behind cub_attributes.md: the
    # page's p-values must follow from the draws stored beside them.
    path = os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "docs", "results",
        "cub_attributes_null.json")
    with open(path) as f:
        stored = json.load(f)
    assert stored["settings"]["draws"] >= 5000
    assert len(stored["codes"]) == 18
    _assert_stored_nulls_give_p_values(stored)


def test_run_attributes_saves_finished_nulls_as_it_goes(tmp_path,
                                                        monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 3))
    similarity = np.exp(-np.sum((x[:, None] - x[None]) ** 2, -1))
    attributes = np.concatenate([x, rng.uniform(0, 1, (8, 4))], 1)
    calls = []
    real = attr.null_distribution

    def stop_on_second_null(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(attr, "null_distribution", stop_on_second_null)
    with pytest.raises(KeyboardInterrupt):
        attr.run_attributes(similarity, attributes, str(tmp_path),
                            code_lengths=(3, 5), draws=15,
                            encodings=("spectral",))
    assert not (tmp_path / "attributes.json").exists()
    with open(tmp_path / "attributes.partial.json") as f:
        partial = json.load(f)
    assert partial["complete"] is False
    # The codes with their permutation draws come first, then each null.
    assert [(r["encoding"], r["code_length"]) for r in partial["codes"]] == [
        ("spectral", 3), ("spectral", 5)]
    for code in partial["codes"]:
        draws = np.asarray(code["permuted_null"]["values"])
        assert len(draws) == 15
        assert code["p_vs_permuted"] == (
            1 + np.count_nonzero(draws >= code["mean_best_abs_r"])) / 16
    [null] = partial["null"]
    assert (null["encoding"], null["code_length"]) == ("gaussian", 3)
    assert len(null["values"]) == 15


# --- end to end --------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    ({"seeds": [0]}, "seeds"),
    ({"seeds": [0, 1], "select_seed": 1}, "select_seed"),
    ({"encodings": ["one_hot", "nope"]}, "encodings"),
    ({"code_lengths": ["1"]}, "code_lengths"),
    ({"learning_rates": [0.01, -1.0]}, "learning_rates"),
    ({"protocol": "scratch"}, "protocol"),
])
def test_cub_grid_rejects_bad_arguments_before_training(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cub_bits.cub_grid("cub.npz", "source.npz", **kwargs)


@pytest.mark.backend_independent
@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["retrain", "finetune"])
def test_cub_bits_command_end_to_end_with_resume(tmp_path, protocol,
                                                 monkeypatch):
    source, cub = _fake_source(tmp_path), _fake_cub(tmp_path)
    out = tmp_path / "out"
    # XLA off for finetune too: its 12 short trainings would each pay an XLA
    # compilation (about 40 s in all on 2 cores); what "auto" resolves to is
    # pinned by test_cub_bits_jit_compile_auto_is_on_for_finetune_only.
    passed = []
    real_run_grid = cub_bits.grid_lib.run_grid

    def spy_run_grid(*args, **kwargs):
        passed.append(kwargs["jit_compile"])
        return real_run_grid(*args, **kwargs)

    monkeypatch.setattr(cub_bits.grid_lib, "run_grid", spy_run_grid)
    argv = ["cub-bits", "--protocol", protocol, "--dataset", cub,
            "--pretrain-source", source, "--pretrain-epochs", "1",
            "--pretrain-image-size", "16", "--val-per-class", "1",
            "--seeds", "0", "1", "--select-seed", "9", "--epochs", "2",
            "--batch-size", "4", "--learning-rates", "0.01", "0.1",
            "--code-lengths", "3", "6", "--encodings", "one_hot",
            "one_hot_imprinted_pretrained", "spectral",
            "--min-pretrain-chance-multiple", "0", "--verbose", "0",
            "--jit-compile", "off", "--output", str(out)]
    results = cli.main(argv)["cub-bits"]
    assert passed == [False]
    rows = {r["label"]: r for r in results["cub"]["rows"]}
    # n = 6: spectral codes only for k <= n - 1.
    assert set(rows) == {"one_hot", "one_hot_imprinted_pretrained",
                         "spectral_norm k=3"}
    for label, row in rows.items():
        assert row["seeds"] == [0, 1]
        assert row["learning_rate"] in (0.01, 0.1)
        assert ("vs_one_hot" in row) == (label != "one_hot")
    # The rate is chosen with seed 9, which is never reported.
    runs = [json.loads(p.read_text()) for p in (out / "runs").iterdir()
            if p.suffix == ".json"]
    assert {r["spec"]["seed"] for r in runs} == {0, 1, 9}
    assert [r["status"] for r in runs if r["spec"]["code_length"] == 6] == [
        "no_code"] * 2  # tried at both rates, never reported
    assert all(r["spec"]["protocol"] == protocol and r["spec"]["scale"] == 1.0
               and not r["spec"]["learnable_scale"] for r in runs)
    assert [c["control"] for c in results["cub"]["controls"]] == [
        "one_hot_imprinted_pretrained"]
    name = f"cub_bits_{protocol}"
    assert (out / f"{name}.png").exists() and (out / f"{name}.md").exists()
    stored = json.loads((out / f"{name}.json").read_text())
    assert stored["cub"]["rows"][0]["label"] == "one_hot"
    with pytest.raises(SystemExit):  # A refused output folder.
        cli.main(argv)
    again = cli.main(argv + ["--resume"])["cub-bits"]
    assert [r["test_accuracy"] for r in again["cub"]["rows"]] == [
        r["test_accuracy"] for r in results["cub"]["rows"]]


@pytest.mark.parametrize("protocol, flag, expected", [
    ("finetune", None, True), ("retrain", None, False),
    ("finetune", False, False), ("retrain", True, True)])
def test_cub_bits_jit_compile_auto_is_on_for_finetune_only(
        monkeypatch, tmp_path, protocol, flag, expected):
    passed = []

    class Stop(Exception):
        pass

    def record(*args, **kwargs):
        passed.append(kwargs["jit_compile"])
        raise Stop

    monkeypatch.setattr(cub_bits.grid_lib, "run_grid", record)
    grid = type("FakeGrid", (), {"base": {"protocol": protocol}})()
    with pytest.raises(Stop):
        cub_bits.run_cub_bits(grid, str(tmp_path), jit_compile=flag)
    assert passed == [expected]


def test_cub_bits_command_rejects_an_unknown_jit_compile_choice(capsys):
    with pytest.raises(SystemExit):
        cli.main(["cub-bits", "--jit-compile", "maybe"])
    assert "--jit-compile" in capsys.readouterr().err


@pytest.mark.backend_independent
@pytest.mark.slow
def test_attributes_command_uses_the_pretrained_backbone(tmp_path):
    source, cub = _fake_source(tmp_path), _fake_cub(tmp_path)
    out = tmp_path / "out"
    results = cli.main([
        "attributes", "--dataset", cub, "--pretrain-source", source,
        "--pretrain-epochs", "1", "--pretrain-image-size", "16",
        "--val-per-class", "1", "--code-lengths", "3",
        "--random-draws", "10", "--min-pretrain-chance-multiple", "0",
        "--verbose", "0", "--output", str(out)])
    results = results["attributes"]
    assert results["settings"]["num_attributes"] == 20
    assert {r["encoding"] for r in results["codes"]} == set(
        attr.DATA_ENCODINGS)
    assert "pretrain" in results["settings"]["source"]
    assert (out / "attributes.png").exists()


def test_summary_refuses_two_runs_of_one_seed_in_an_arm():
    # A second run of seed 1 used to replace the first silently (n = 3 for 4 runs).
    records = _records([0.5, 0.6, 0.7], "one_hot") + _records([0.4, 0.5, 0.6], "spectral", 3)
    records.append(dict(records[-1], test_accuracy=0.9))
    with pytest.raises(ValueError, match="seed 2 twice"):
        cub_bits.summarize_cub(records, margin=1.0)


@pytest.mark.backend_independent
def test_attributes_with_fewer_classes_pairs_each_class_with_its_own_row(
        tmp_path, monkeypatch):
    """`attributes --classes N` draws N classes as the runner does; the
    similarity and the attribute table it is correlated with must hold the
    same classes in the same order (they had 6 and 4 rows)."""
    captured = {}

    def capture(similarity, class_attributes, *args, **kwargs):
        captured["similarity"] = similarity
        captured["attributes"] = class_attributes
        return {"markdown": "", "wall_time": 0.0, "files": []}

    monkeypatch.setattr(attr, "run_attributes", capture)
    cub = _fake_cub(tmp_path)
    cli.main(["attributes", "--dataset", cub, "--pretrain-source",
              _fake_source(tmp_path), "--pretrain-image-size", "16",
              "--classes", "4", "--pretrain-epochs", "1",
              "--val-per-class", "1", "--min-pretrain-chance-multiple", "0",
              "--output", str(tmp_path / "out"), "--verbose", "0"])
    task = runner_lib.build_task(runner_lib.RunSpec(**cub_bits.cub_grid(
        cub, _fake_source(tmp_path), image_size=16, val_per_class=1,
        classes=4).base))
    every = np.load(cub)["class_attributes_continuous"]
    assert captured["similarity"].shape == (4, 4)
    assert captured["attributes"].shape == (4, every.shape[1])
    from ecoc_research import datasets

    names = list(datasets.load_dataset(cub).class_names)
    rows = [names.index(name) for name in task.class_names]
    np.testing.assert_array_equal(captured["attributes"], every[rows])
