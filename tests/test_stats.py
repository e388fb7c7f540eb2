"""The research statistics module: paired t p-values, Holm's adjustment and
the TOST equivalence test, against scipy and hand-computed values."""

import json
import os

import numpy as np
import pytest
from scipy import stats as sps

from ecoc_research.experiments import stats


def _holm_reference(p):
    # Holm (1979), written out in float64 from the definition.
    p = np.asarray(p, np.float64)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def test_holm_matches_hand_computed_values():
    # m = 4; sorted 0.01, 0.02, 0.03, 0.04 -> 0.04, 0.06, 0.06 (monotone), 0.06.
    got = stats.holm([0.03, 0.01, 0.04, 0.02])
    np.testing.assert_allclose(got, [0.06, 0.04, 0.06, 0.06])
    # The audit's case: p = 0.028 alone survives, but not in a family of 3
    # where the other two are larger.
    got = stats.holm({"a": 0.028, "b": 0.048, "c": 0.049})
    assert got == pytest.approx({"a": 0.084, "b": 0.096, "c": 0.096})


def test_holm_matches_reference_on_random_pvalues_and_keeps_none():
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 0.2, size=37)
    np.testing.assert_allclose(stats.holm(list(p)), _holm_reference(p), rtol=1e-12)
    with_none = list(p[:3]) + [None]
    got = stats.holm(with_none)
    assert got[3] is None
    np.testing.assert_allclose(got[:3], _holm_reference(p[:3]), rtol=1e-12)
    assert all(a >= r for a, r in zip(stats.holm(list(p)), p))


def test_holm_rejects_values_outside_unit_interval():
    with pytest.raises(ValueError, match="`pvalues`"):
        stats.holm([0.1, 1.5])


def test_paired_difference_p_is_scipy_paired_t_test():
    rng = np.random.default_rng(1)
    a = rng.normal(0.7, 0.02, size=10)
    b = a + rng.normal(0.01, 0.01, size=10)
    got = stats.paired_difference(dict(enumerate(b)), dict(enumerate(a)))
    assert got["p"] == pytest.approx(sps.ttest_rel(b, a).pvalue, rel=1e-10)
    assert got["mean"] == pytest.approx(float(np.mean(b - a)))
    assert stats.paired_difference({0: 1.0}, {0: 0.5})["p"] is None


def test_tost_matches_two_one_sided_scipy_tests():
    rng = np.random.default_rng(2)
    d = rng.normal(0.2, 0.8, size=10)
    got = stats.paired_equivalence(d, margin=1.0)
    lower = sps.ttest_1samp(d, -1.0, alternative="greater").pvalue
    upper = sps.ttest_1samp(d, 1.0, alternative="less").pvalue
    assert got["p_tost"] == pytest.approx(max(lower, upper), rel=1e-10)
    # Equivalent exactly when the 90% interval lies inside the margin.
    low, high = sps.t.interval(0.90, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    assert got["equivalent"] == (-1.0 < low and high < 1.0)
    np.testing.assert_allclose(got["ci90"], [low, high], rtol=1e-10)


def test_tost_declares_a_wide_interval_inconclusive():
    d = np.array([-3.0, 2.5, -1.0, 3.0, -2.0])
    got = stats.paired_equivalence(d, margin=1.0)
    assert not got["equivalent"]
    assert stats.equivalence_verdict(got) == "inconclusive"
    tight = stats.paired_equivalence(np.array([0.1, -0.1, 0.05, 0.0, -0.05]), margin=1.0)
    assert tight["equivalent"] and stats.equivalence_verdict(tight).startswith("matches")


def test_tost_rejects_bad_arguments():
    with pytest.raises(ValueError, match="`differences`"):
        stats.paired_equivalence([1.0])
    with pytest.raises(ValueError, match="`margin`"):
        stats.paired_equivalence([1.0, 2.0], margin=0)


def _sign_flip_reference(d, alternative="two-sided"):
    # Every one of the 2^n sign assignments, counted: the exact randomization
    # test of a zero mean, written out independently of stats.no_spread_pvalue.
    import itertools

    d = np.asarray(d, np.float64)
    observed = d.mean()
    means = [np.mean(d * np.array(signs))
             for signs in itertools.product((1.0, -1.0), repeat=len(d))]
    if alternative == "two-sided":
        return np.mean([abs(m) >= abs(observed) for m in means])
    if alternative == "greater":
        return np.mean([m >= observed for m in means])
    return np.mean([m <= observed for m in means])


@pytest.mark.parametrize("n", [2, 5, 6, 10])
@pytest.mark.parametrize("value", [66.0, -0.02])
def test_equal_differences_get_the_exact_sign_flip_p_not_zero(n, value):
    # Steps to target are measured at validation points: five seeds can all
    # differ by exactly +66 steps. The t statistic is then c / 0; its limit
    # p = 0 claimed more than n seeds can show.
    d = [value] * n
    assert stats.paired_t_pvalue(d) == pytest.approx(_sign_flip_reference(d))
    got = stats.paired_difference(dict(enumerate(d)), dict.fromkeys(range(n), 0.0))
    assert got["no_spread"] and got["low"] is None and got["high"] is None
    assert got["p"] == pytest.approx(2 / 2**n)
    expected = "within noise" if 2 / 2**n > 0.05 else ("higher" if value > 0 else "lower")
    assert got["verdict"] == expected
    assert stats.format_interval(got, 1, 0) == f"{value:+.0f} (all {n} equal)"


def test_identical_arms_are_within_noise_with_p_one():
    got = stats.paired_difference({0: 0.5, 1: 0.6, 2: 0.7}, {0: 0.5, 1: 0.6, 2: 0.7})
    assert got["p"] == 1.0 and got["verdict"] == "within noise" and got["no_spread"]


@pytest.mark.parametrize("value", [0.5, 3.0, -0.5])
def test_tost_with_equal_differences_uses_exact_one_sided_sign_flip_tests(value):
    d = np.full(5, value)
    got = stats.paired_equivalence(d, margin=1.0)
    assert got["p_lower"] == pytest.approx(_sign_flip_reference(d + 1.0, "greater"))
    assert got["p_upper"] == pytest.approx(_sign_flip_reference(d - 1.0, "less"))
    assert got["p_difference"] == pytest.approx(_sign_flip_reference(d))
    # 1 / 2^5 = 0.031 < 0.05: inside the margin, five equal seeds show equivalence.
    assert got["equivalent"] == (abs(value) < 1.0)


def test_a_nan_metric_raises_instead_of_a_nan_verdict():
    with pytest.raises(ValueError, match="`values`.*NaN"):
        stats.paired_difference({0: 0.5, 1: float("nan"), 2: 0.7}, {0: 0.4, 1: 0.5, 2: 0.6})
    with pytest.raises(ValueError, match="`differences`"):
        stats.paired_t_pvalue([0.1, float("inf"), 0.2])


def test_two_runs_with_one_seed_in_an_arm_raise():
    def record(seed, acc):
        return {"spec": {"seed": seed}, "steps": [0, 10], "val_accuracy": [0.1, acc],
                "total_steps": 10, "test_accuracy": acc, "final_test_accuracy": acc,
                "best_val_accuracy": acc, "final_val_accuracy": acc}

    groups = {"one_hot": [record(0, 0.5), record(1, 0.6)],
              "spectral": [record(0, 0.55), record(1, 0.62), record(1, 0.7)]}
    with pytest.raises(ValueError, match="'spectral' hold seed 1 twice"):
        stats.compare_to_reference(groups, "one_hot")


# --- Holm over several audit families (audit_union) --------------------------


def _write_family(folder, pvalues):
    # The fields of the rows `audit.py` writes to audit.json that the union reads.
    os.makedirs(folder)
    rows = [{"experiment": "e", "num_classes": 10, "optimizer": "sgd", "batch_size": 16,
             "label": f"code{i}", "reference": "one_hot", "metric": "auc",
             "mean": 0.01 * (i + 1), "p": p} for i, p in enumerate(pvalues)]
    for row, adjusted in zip(rows, stats.holm(pvalues)):
        row["p_holm"] = adjusted
    with open(os.path.join(folder, "audit.json"), "w") as f:
        json.dump({"rows": rows}, f)


def test_union_holm_adjusts_all_families_at_once_and_lists_only_lost_verdicts(tmp_path):
    from ecoc_research.experiments import audit_union

    rng = np.random.default_rng(3)
    families = {"a": list(rng.uniform(0, 0.01, 12)), "b": list(rng.uniform(0, 0.2, 20)),
                "c": [0.0004, 0.3]}
    folders = []
    for name, p in families.items():
        _write_family(str(tmp_path / name), p)
        folders.append(str(tmp_path / name))
    got = audit_union.union_holm(folders)
    everything = [p for p in families.values() for p in p]
    union = _holm_reference(everything)
    np.testing.assert_allclose([r["p_holm_union"] for r in got["rows"]], union, rtol=1e-12)
    assert got["size"] == 34 and [f["tests"] for f in got["families"]] == [12, 20, 2]
    # More tests never lower an adjusted p-value, so verdicts are only lost.
    assert all(r["p_holm_union"] >= r["p_holm"] - 1e-15 for r in got["rows"])
    expected_lost = [i for i, r in enumerate(got["rows"])
                     if r["p_holm"] <= 0.05 < union[i]]
    assert [got["rows"].index(r) for r in got["lost"]] == expected_lost
    assert expected_lost, "the random families should lose some verdicts"


def test_union_holm_command_refuses_to_replace_its_output_and_names_bad_folders(tmp_path, capsys):
    from ecoc_research.experiments import audit_union

    _write_family(str(tmp_path / "a"), [0.01, 0.02])
    out = str(tmp_path / "union.md")
    assert audit_union.main([str(tmp_path / "a"), "--output", out]) == 0
    first = open(out).read()
    assert "| all | 2 |" in first
    with pytest.raises(SystemExit) as e:
        audit_union.main([str(tmp_path / "a"), "--output", out])
    assert e.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert open(out).read() == first
    with pytest.raises(SystemExit):
        audit_union.main([str(tmp_path / "a"), str(tmp_path / "a") + "/", "--output",
                          str(tmp_path / "u2.md")])
    assert "each audit folder once" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        audit_union.main([str(tmp_path / "missing"), "--output", str(tmp_path / "u3.md")])
    assert "has no audit.json" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "u2.md") and not os.path.exists(tmp_path / "u3.md")
