"""The statistics audit (`ecoc_research.experiments.audit`) on synthetic runs
against scipy, and on the stored Omniglot runs behind docs/results/."""

import json
import os

import numpy as np
import pytest
from scipy import stats as sps

from ecoc_research.experiments import audit
from ecoc_research.experiments import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STORED = os.path.join(ROOT, "docs", "results", "omniglot")


def _spec(encoding, seed, scale=1.0, learnable=False, lr=0.01):
    return {"encoding": encoding, "code_length": None if encoding.startswith("one_hot") else 4,
            "normalize_rows": True if encoding == "spectral" else None,
            "learning_rate": lr, "seed": seed, "scale": scale, "learnable_scale": learnable,
            "protocol": "retrain", "variant": "transfer", "optimizer": "sgd",
            "batch_size": 16, "epochs": 2, "classes": None, "dataset": "x"}


def _record(key, encoding, label, seed, curve, test, **spec):
    steps = list(range(0, 10 * len(curve), 10))
    return {"key": key, "status": "ok", "label": label, "num_classes": 8,
            "spec": _spec(encoding, seed, **spec), "steps": steps,
            "val_accuracy": list(curve), "test_accuracy": test,
            "final_test_accuracy": test, "best_val_accuracy": max(curve),
            "final_val_accuracy": curve[-1], "total_steps": steps[-1]}


def _curve(rng, final):
    """A validation curve of 5 evaluations, shape (5,): rising from 0.1 to
    `final` with N(0, 0.01) noise, clipped to [0, 1] like an accuracy."""
    return np.clip(np.linspace(0.1, final, 5) + rng.normal(0, 0.01, 5), 0, 1)


def _grid_accuracies(rng, n, shifts):
    """Final test accuracies of a synthetic grid, head -> shape (n,), one per
    seed: one-hot's uniform in [0.6, 0.7), each head of `shifts` (name ->
    (mean, sd)) one-hot's plus N(mean, sd) per seed, drawn in that order."""
    one_hot = rng.uniform(0.6, 0.7, n)
    return {"one_hot": one_hot,
            **{name: one_hot + rng.normal(mean, sd, n) for name, (mean, sd) in shifts.items()}}


def _write(folder, records, experiments):
    with open(os.path.join(folder, "runs.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    for name, keys in experiments.items():
        with open(os.path.join(folder, f"{name}.json"), "w") as f:
            json.dump({"runs": keys, "groups": []}, f)


def test_audit_pairs_by_seed_adjusts_by_holm_and_borrows_imprinted_runs(tmp_path):
    rng = np.random.default_rng(0)
    seeds = range(6)
    tests = _grid_accuracies(rng, 6, {"spectral": (0.02, 0.01),
                                      "one_hot_imprinted": (0.03, 0.01)})
    one_hot_test, spectral_test, imprinted_test = tests.values()
    records, e5, e1 = [], [], []
    for s in seeds:
        # e5: one-hot and a fixed-scale spectral head; e1: the imprinted head
        # (learnable-scale settings do not matter for a one-hot head).
        for enc, label, test, keys in (("one_hot", "one_hot", one_hot_test[s], e5),
                                       ("spectral", "spectral_norm", spectral_test[s], e5),
                                       ("one_hot_imprinted", "one_hot_imprinted",
                                        imprinted_test[s], e1)):
            curve = _curve(rng, test)
            key = f"{enc}-{s}"
            extra = {"learnable": True} if enc == "one_hot_imprinted" else {}
            records.append(_record(key, enc, label, s, curve.tolist(), float(test), **extra))
            keys.append(key)
    _write(tmp_path, records, {"e5_x": e5, "e1_x": e1})
    result = audit.audit(str(tmp_path))
    rows = {(r["experiment"], r["label"], r["reference"], r["metric"]): r
            for r in result["rows"]}
    row = rows[("e5_x", "spectral_norm", "one_hot", "test_accuracy")]
    assert row["mean"] == pytest.approx(float(np.mean(spectral_test - one_hot_test)))
    assert row["p"] == pytest.approx(sps.ttest_rel(spectral_test, one_hot_test).pvalue, rel=1e-9)
    borrowed = rows[("e5_x", "spectral_norm", "one_hot_imprinted", "test_accuracy")]
    assert borrowed["p"] == pytest.approx(
        sps.ttest_rel(spectral_test, imprinted_test).pvalue, rel=1e-9)
    assert borrowed["imprinted_from"].startswith("other experiment")
    # Holm over the whole family, in the same order.
    np.testing.assert_allclose([r["p_holm"] for r in result["rows"]],
                               stats.holm([r["p"] for r in result["rows"]]))
    assert result["family_size"] == len(result["rows"])
    tost = stats.paired_equivalence(100 * (spectral_test - one_hot_test), 1.0)
    assert row["tost"]["p_tost"] == pytest.approx(tost["p_tost"], rel=1e-9)


def test_audit_compares_spectral_with_both_imprinted_controls_run_in_the_same_grid(tmp_path):
    rng = np.random.default_rng(1)
    seeds = range(5)
    tests = _grid_accuracies(rng, 5, {"spectral": (0.0, 0.01),
                                      "one_hot_imprinted": (0.01, 0.01),
                                      "one_hot_imprinted_pretrained": (0.02, 0.01)})
    labels = {"spectral": "spectral_norm"}
    records, keys = [], []
    for s in seeds:
        for enc, test in tests.items():
            curve = _curve(rng, test[s])
            key = f"{enc}-{s}"
            records.append(_record(key, enc, labels.get(enc, enc), s, curve.tolist(),
                                   float(test[s])))
            keys.append(key)
    _write(tmp_path, records, {"e5_controls": keys})
    result = audit.audit(str(tmp_path))
    rows = {(r["label"], r["reference"], r["metric"]): r for r in result["rows"]}
    for control in ("one_hot_imprinted", "one_hot_imprinted_pretrained"):
        row = rows[("spectral_norm", control, "test_accuracy")]
        assert row["imprinted_from"] == "e5_controls"
        assert row["mean"] == pytest.approx(float(np.mean(tests["spectral"] - tests[control])))
        assert row["p"] == pytest.approx(
            sps.ttest_rel(tests["spectral"], tests[control]).pvalue, rel=1e-9)
    # 3 heads against one-hot and spectral against 2 controls, 3 metrics each.
    assert result["family_size"] == (3 + 2) * 3


def test_audit_borrows_every_reference_head_for_a_spectral_only_grid(tmp_path):
    # The E1 control grid: a learnable-scale spectral head alone, paired with
    # the one-hot, imprinted and pretrained-imprinted heads a fixed-scale
    # grid trained on the same backbone and seeds (one-hot ignores the scale).
    rng = np.random.default_rng(2)
    seeds = range(6)
    tests = _grid_accuracies(rng, 6, {"one_hot_imprinted": (0.01, 0.01),
                                      "one_hot_imprinted_pretrained": (0.0, 0.01),
                                      "spectral": (-0.01, 0.01)})
    finals = {}
    records, e5, e1 = [], [], []
    for s in seeds:
        for enc, test in tests.items():
            curve = _curve(rng, test[s])
            finals.setdefault(enc, []).append(curve[-1])
            learnable = enc == "spectral"
            key = f"{enc}-{s}-{learnable}"
            records.append(_record(key, enc, "spectral_norm" if enc == "spectral" else enc,
                                   s, curve.tolist(), float(test[s]), learnable=learnable))
            (e1 if learnable else e5).append(key)
    # A fixed-scale spectral head in the other grid must not be borrowed.
    _write(tmp_path, records, {"e1_controls": e1, "e5_controls": e5})
    result = audit.audit(str(tmp_path))
    e1_rows = [r for r in result["rows"] if r["experiment"] == "e1_controls"]
    rows = {(r["label"], r["reference"], r["metric"]): r for r in e1_rows}
    # Steps to target against the BORROWED one-hot's target: first step at
    # or above 90% of its mean final validation accuracy, else the budget.
    target = 0.9 * float(np.mean(finals["one_hot"]))

    def steps(enc):
        out = []
        for s in seeds:
            r = next(r for r in records if r["key"].startswith(f"{enc}-{s}-"))
            hit = [t for t, a in zip(r["steps"], r["val_accuracy"]) if a >= target]
            out.append(hit[0] if hit else r["total_steps"])
        return np.asarray(out, dtype=np.float64)

    assert rows[("spectral_norm", "one_hot", "steps_to_target")]["mean"] == pytest.approx(
        float(np.mean(steps("spectral") - steps("one_hot"))))
    for reference in ("one_hot", "one_hot_imprinted", "one_hot_imprinted_pretrained"):
        row = rows[("spectral_norm", reference, "test_accuracy")]
        expected = tests["spectral"] - tests[reference]
        assert row["n"] == 6
        assert row["mean"] == pytest.approx(float(np.mean(expected)))
        assert row["p"] == pytest.approx(
            sps.ttest_rel(tests["spectral"], tests[reference]).pvalue, rel=1e-9)
    assert rows[("spectral_norm", "one_hot_imprinted_pretrained", "auc")][
        "imprinted_from"].startswith("other experiment")
    assert rows[("spectral_norm", "one_hot", "auc")]["borrowed"] == ["one_hot"]
    # Same family shape as a grid that trained all four heads itself.
    assert len(e1_rows) == (3 + 2) * 3


def test_audit_compares_a_random_heads_grid_with_the_borrowed_one_hot_and_spectral_heads(tmp_path):
    # The E1 replicate's random/thresholded grid: Gaussian, thresholded and
    # raw-row spectral heads alone, paired by seed with the one-hot and
    # learnable-scale spectral_norm runs of the same folder. Neither a
    # fixed-scale spectral_norm nor the spectral_raw head (same encoding,
    # same seeds) may be the spectral reference.
    rng = np.random.default_rng(3)
    seeds = range(6)
    tests = _grid_accuracies(rng, 6, {"spectral_norm": (-0.02, 0.01),
                                      "spectral_norm_fixed": (0.05, 0.01),
                                      "spectral_raw": (-0.3, 0.01),
                                      "gaussian_norm": (-0.2, 0.02),
                                      "spectral_zero": (-0.08, 0.02)})
    heads = {  # label: (encoding, learnable scale, normalize_rows, experiment)
        "one_hot": ("one_hot", False, None, "e1_controls"),
        "spectral_norm": ("spectral", True, True, "e1_controls"),
        "spectral_norm_fixed": ("spectral", False, True, "e5_controls"),
        "spectral_raw": ("spectral", True, False, "e1_random"),
        "gaussian_norm": ("gaussian", True, True, "e1_random"),
        "spectral_zero": ("spectral_zero", True, None, "e1_random")}
    finals, records, experiments, curves = {}, [], {}, {}
    for s in seeds:
        for name, (enc, learnable, rows_on, experiment) in heads.items():
            curve = _curve(rng, tests[name][s])
            finals.setdefault(name, []).append(curve[-1])
            curves.setdefault(name, []).append(curve)
            key = f"{name}-{s}"
            record = _record(key, enc, name.replace("_fixed", ""), s, curve.tolist(),
                             float(tests[name][s]), learnable=learnable)
            record["spec"]["normalize_rows"] = rows_on
            records.append(record)
            if experiment is not None:
                experiments.setdefault(experiment, []).append(key)
    _write(tmp_path, records, experiments)
    result = audit.audit(str(tmp_path))
    rows = {(r["label"], r["reference"], r["metric"]): r for r in result["rows"]
            if r["experiment"] == "e1_random"}
    target = 0.9 * float(np.mean(finals["one_hot"]))

    def steps(name):
        hits = [[10 * i for i, a in enumerate(c) if a >= target] for c in curves[name]]
        return np.asarray([h[0] if h else 40 for h in hits], dtype=np.float64)

    for label in ("gaussian_norm", "spectral_zero", "spectral_raw"):
        for reference in ("one_hot", "spectral_norm"):
            row = rows[(label, reference, "test_accuracy")]
            assert row["n"] == 6
            assert row["mean"] == pytest.approx(
                float(np.mean(tests[label] - tests[reference])))
            assert row["p"] == pytest.approx(
                sps.ttest_rel(tests[label], tests[reference]).pvalue, rel=1e-9)
            expected_steps = steps(label) - steps(reference)
            assert rows[(label, reference, "steps_to_target")]["mean"] == pytest.approx(
                float(np.mean(expected_steps)))
        assert rows[(label, "spectral_norm", "auc")]["borrowed"] == ["spectral_norm"]
        assert rows[(label, "one_hot", "auc")]["borrowed"] == ["one_hot"]
    # 3 heads against one-hot and against spectral, 3 metrics each; the
    # spectral_norm runs are references only, not a row of this grid.
    assert len(rows) == 3 * 2 * 3
    assert not any(k[0] in ("one_hot", "spectral_norm") for k in rows)


def test_audit_cli_refuses_a_folder_without_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as error:
        audit.main([str(tmp_path)])
    assert error.value.code == 2
    assert "has no runs.jsonl" in capsys.readouterr().err


def test_stored_omniglot_audit_reproduces_the_summaries_and_the_docs_claims():
    result = audit.audit(STORED)
    assert result["mismatches"] == []
    rows = {(r["experiment"], r["batch_size"], r["label"], r["reference"], r["metric"]): r
            for r in result["rows"]}
    # E6, 242 classes, batch 16: test +2.0 points, p = 0.028, gone after Holm.
    e6 = rows[("e6_same_fixed_scale1_b16", 16, "spectral_norm", "one_hot", "test_accuracy")]
    assert 100 * e6["mean"] == pytest.approx(2.0, abs=0.06)
    assert e6["p"] == pytest.approx(0.028, abs=0.001) and e6["p_holm"] > 0.05
    # The speed results survive: E5 (10 seeds) AUC and steps.
    e5 = "e5_fixed_scale1_b16_10seeds"
    assert rows[(e5, 16, "spectral_norm", "one_hot", "auc")]["p_holm"] < 0.05
    assert rows[(e5, 16, "spectral_norm", "one_hot", "steps_to_target")]["p_holm"] < 0.05
    # Spectral minus imprinted at 112 classes (audit: AUC -1.9 [-2.7, -1.2]).
    imp = rows[(e5, 16, "spectral_norm", "one_hot_imprinted", "auc")]
    assert 100 * imp["mean"] == pytest.approx(-1.9, abs=0.06)
    # The stored audit file is the one this code writes.
    with open(os.path.join(STORED, "audit.json")) as f:
        stored = json.load(f)
    assert stored["family_size"] == result["family_size"]
    np.testing.assert_allclose([r["p_holm"] for r in stored["rows"]],
                               [r["p_holm"] for r in result["rows"]], rtol=1e-9)


@pytest.mark.parametrize("folder, family, claims", [
    # (experiment, batch, label, metric, points on the page) against the
    # borrowed spectral_norm runs: docs/results/e1_controls.md and
    # e4_e6_controls.md, the random and thresholded heads.
    ("e1_random", 72, [("e1_random_b16_10seeds", 16, "gaussian_norm", "test_accuracy", -14.5),
                       ("e1_random_b16_10seeds", 16, "dense_random", "auc", -27.1),
                       ("e1_random_b16_10seeds", 16, "spectral_zero", "test_accuracy", -4.4),
                       ("e1_random_b128", 128, "spectral_median", "test_accuracy", -5.2),
                       ("e1_spectral_raw_b16_10seeds", 16, "spectral_raw", "test_accuracy", -46.8)]),
    ("e4_random", 24, [("e4_random_same_b16", 16, "gaussian_norm", "test_accuracy", -10.7),
                       ("e4_random_same_b128", 128, "dense_random", "auc", -13.4)]),
])
def test_stored_random_head_audits_reproduce_their_files_and_the_docs_claims(folder, family, claims):
    path = os.path.join(ROOT, "docs", "results", "omniglot_controls", folder)
    result = audit.audit(path)
    assert result["mismatches"] == []
    assert result["family_size"] == family
    rows = {(r["experiment"], r["batch_size"], r["label"], r["reference"], r["metric"]): r
            for r in result["rows"]}
    for experiment, batch, label, metric, points in claims:
        row = rows[(experiment, batch, label, "spectral_norm", metric)]
        assert 100 * row["mean"] == pytest.approx(points, abs=0.06)
        assert row["p_holm"] < 0.05
    with open(os.path.join(path, "audit.json")) as f:
        stored = json.load(f)
    np.testing.assert_allclose([r["p_holm"] for r in stored["rows"]],
                               [r["p_holm"] for r in result["rows"]], rtol=1e-9)
