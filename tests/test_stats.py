"""The research statistics module: paired t p-values, Holm's adjustment and
the TOST equivalence test, against scipy and hand-computed values."""

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
