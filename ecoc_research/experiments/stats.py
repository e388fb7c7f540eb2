"""Paired statistics of runs against one-hot (scipy.stats).

Runs of different encodings with the same seed share the head
initialisation (fc7) and the batch order, so the comparison is the PAIRED
difference encoding - one-hot over seeds, reported as its mean and 95%
Student-t interval. A difference whose interval includes 0 is "within
noise".

Metrics of a run (its validation curve (steps, accuracy), measured at step 0
and every few steps):

- `test_accuracy`: test accuracy at the best-validation checkpoint.
- steps to a target validation accuracy (`steps_to`): the first measured
  step at or above it; a run that never reaches it is censored at its
  budget (total steps), which biases its steps DOWN, and the count of such
  runs is reported beside the number.
- `curve_auc`: area under validation accuracy against steps divided by the
  number of steps from the first measured step to the last (trapezoids):
  the mean accuracy over training, 1 = perfect from the first step.

Tests: `paired_difference` adds the two-sided paired t-test p-value of a
zero mean (with no spread, where the t statistic is undefined, the exact
sign-flip test: `no_spread_pvalue`); `holm` adjusts a family of such p-values for multiple comparisons
(Holm's step-down method, which controls the family-wise error rate without
assuming independence); `paired_equivalence` is the TOST equivalence test
("equal accuracy" within a stated margin), `equivalence_verdict` its words.
"""

import numpy as np


def steps_to(steps, accuracy, target):
    """First measured step whose accuracy is >= target, or None."""
    for step, value in zip(steps, accuracy):
        if value >= target:
            return int(step)
    return None


def curve_auc(steps, accuracy):
    """Area under accuracy vs steps over [first step, last step], divided by
    the length of that range (every stored curve starts at step 0)."""
    steps = np.asarray(steps, np.float64)
    accuracy = np.asarray(accuracy, np.float64)
    if len(steps) < 2 or steps[-1] <= steps[0]:
        return float(accuracy[-1]) if len(accuracy) else None
    return float(np.trapezoid(accuracy, steps) / (steps[-1] - steps[0]))


def _finite_values(values, name="values"):
    """`values` without None entries as float64; NaN or an infinity raises: a
    diverged run's metric must not turn a mean, an interval and a verdict
    into NaN (or into "lower") without a word."""
    out = np.asarray([v for v in values if v is not None], np.float64)
    if not np.all(np.isfinite(out)):
        raise ValueError(
            f"Argument `{name}` must hold finite numbers or None (missing); a NaN "
            "or an infinity is a failed measurement to exclude explicitly. "
            f"Received: {name}={list(values)!r}")
    return out


def has_no_spread(values):
    """True when all `values` are equal up to float rounding (a spread under
    1e-9 of their magnitude: ten copies of -0.02 have a sample standard
    deviation of about 4e-18, not 0, and a t statistic of 1e16)."""
    d = np.asarray(values, np.float64)
    return len(d) >= 2 and float(np.ptp(d)) <= 1e-9 * float(np.max(np.abs(d)))


def no_spread_pvalue(differences, alternative="two-sided"):
    """Exact sign-flip p-value of n paired differences that are all equal.

    With no spread the t statistic is c / 0, undefined, and the t-test's
    limit (p = 0) claims more than n seeds can show. Under the null of a
    distribution symmetric about 0, each of the 2^n sign assignments is
    equally likely; n equal non-zero differences are the most extreme
    assignment, so p = 1 / 2^n one-sided (in their direction) and 2 / 2^n
    two-sided: 0.0625 for 5 seeds, 0.002 for 10. All zero: p = 1.

    Args:
        differences: (S,) equal values.
        alternative: "two-sided", "greater" (H1: mean > 0) or "less".
    """
    d = np.asarray(differences, np.float64)
    c, n = float(np.mean(d)), len(d)
    if c == 0:
        return 1.0
    if alternative == "two-sided":
        return min(1.0, 2.0 * 0.5 ** n)
    agrees = (c > 0) == (alternative == "greater")
    return 0.5 ** n if agrees else 1.0


def t_interval(values, confidence=0.95):
    """(mean, low, high) of the Student-t interval; (mean, None, None) if n < 2.

    With no spread the interval is [mean, mean]: fine for describing one
    arm; `paired_difference` does not use it for a test."""
    from scipy import stats

    values = _finite_values(values)
    if len(values) == 0:
        return None, None, None
    mean = float(values.mean())
    if len(values) < 2:
        return mean, None, None
    sem = float(stats.sem(values))
    if sem == 0:
        return mean, mean, mean
    low, high = stats.t.interval(confidence, len(values) - 1, loc=mean,
                                 scale=sem)
    return mean, float(low), float(high)


def paired_t_pvalue(differences):
    """Two-sided p-value of the paired t-test of mean(differences) = 0.

    Args:
        differences: (S,) paired differences; None entries are dropped.

    Returns:
        float, or None for fewer than 2 differences. With no spread the t
        statistic is undefined: the exact sign-flip p-value
        (`no_spread_pvalue`; 0.0625 for five equal differences).
    """
    from scipy import stats

    d = _finite_values(differences, "differences")
    if len(d) < 2:
        return None
    if has_no_spread(d):
        return no_spread_pvalue(d)
    return float(stats.ttest_1samp(d, 0.0).pvalue)


def holm(pvalues):
    """Holm-adjusted p-values of a family of tests, in the input order.

    The m raw p-values sorted ascending, p_(1) <= ... <= p_(m), are adjusted
    to max over j <= i of min(1, (m - j + 1) p_(j)); a test is rejected at
    level alpha when its adjusted p-value is <= alpha. None entries (tests
    that could not be run) are kept as None and do not count in m.

    Args:
        pvalues: a sequence of floats in [0, 1] or None, or a dict name ->
            such a value.

    Returns:
        the same container type with adjusted p-values.
    """
    if isinstance(pvalues, dict):
        names = list(pvalues)
        adjusted = holm([pvalues[k] for k in names])
        return dict(zip(names, adjusted))
    values = list(pvalues)
    for p in values:
        if p is not None and not (0.0 <= float(p) <= 1.0):
            raise ValueError(
                "Argument `pvalues` must hold p-values in [0, 1] or None. "
                f"Received: {p!r}")
    present = [(float(p), i) for i, p in enumerate(values) if p is not None]
    m = len(present)
    out = [None] * len(values)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def paired_difference(values, reference, confidence=0.95):
    """Mean and t-interval of values[seed] - reference[seed] over common seeds.

    Args:
        values, reference: dicts seed -> number (None: missing).

    Returns:
        dict: n (pairs), mean, low, high, seeds and differences (per
        seed, in seed order), p (two-sided paired t-test of a
        zero mean; None for n < 2), no_spread, verdict ("within noise"
        when the interval contains 0, else "higher" / "lower"; "too few
        seeds" for n < 2).

        no_spread: every difference is the same (steps measured at
        validation points often are). Then no t-interval exists (low and
        high are None), p is the exact sign-flip p-value
        (`no_spread_pvalue`) and the verdict follows it at the level
        1 - confidence: five equal differences (p = 0.0625) are "within
        noise".
    """
    seeds = sorted(s for s in values if s in reference
                   and values[s] is not None and reference[s] is not None)
    diffs = [values[s] - reference[s] for s in seeds]
    mean, low, high = t_interval(diffs, confidence)
    p = paired_t_pvalue(diffs)
    no_spread = has_no_spread(diffs)
    if no_spread:
        low = high = None
        verdict = ("within noise" if p > 1 - confidence
                   else "higher" if mean > 0 else "lower")
    elif low is None:
        verdict = "too few seeds"
    elif low <= 0 <= high:
        verdict = "within noise"
    else:
        verdict = "higher" if mean > 0 else "lower"
    return {"n": len(diffs), "mean": mean, "low": low, "high": high,
            "p": p, "no_spread": no_spread, "verdict": verdict, "seeds": seeds,
            "differences": [float(d) for d in diffs]}


def run_metrics(record, target):
    """test_accuracy, steps_to_target (censored), reached, auc of a record."""
    steps, accuracy = record["steps"], record["val_accuracy"]
    reached = steps_to(steps, accuracy, target)
    return {
        "test_accuracy": record["test_accuracy"],
        "final_test_accuracy": record["final_test_accuracy"],
        "best_val_accuracy": record["best_val_accuracy"],
        "final_val_accuracy": record["final_val_accuracy"],
        "steps_to_target": reached if reached is not None
        else int(record["total_steps"]),
        "reached": reached is not None,
        "auc": curve_auc(steps, accuracy),
    }


def runs_by_seed(runs, label="runs"):
    """{seed: run record} of `runs`; two runs with one seed raise (the
    pairing is by seed, and a dict would silently keep only the last)."""
    out = {}
    for r in runs:
        seed = r["spec"]["seed"]
        if seed in out:
            raise ValueError(
                f"Runs of {label!r} hold seed {seed} twice: paired statistics need "
                "one run per seed and arm. Remove the duplicate run (or give it "
                "another seed) before summarizing.")
        out[seed] = r
    return out


def metrics_by_seed(runs, target, label="runs"):
    """{seed: run_metrics} of `runs` (one run per seed, see `runs_by_seed`)."""
    return {s: run_metrics(r, target) for s, r in runs_by_seed(runs, label).items()}


def compare_to_reference(groups, reference_label, fraction=0.9):
    """Paired comparison of every encoding of a cell with its reference.

    Args:
        groups: dict label -> list of ok run records of one cell (same
            everything but the encoding / code / learning rate).
        reference_label: the label of the reference (e.g. "one_hot").
        fraction: target = fraction x the reference's mean final
            validation accuracy.

    Returns:
        dict: target, per label {seeds, metrics means, reached count,
        differences {metric: paired_difference}}.
    """
    reference = groups.get(reference_label) or []
    if not reference:
        return None
    target = fraction * float(np.mean([r["final_val_accuracy"]
                                       for r in reference]))
    per_label = {}
    metrics_by_label = {}
    for label, runs in groups.items():
        metrics_by_label[label] = metrics_by_seed(runs, target, label)
    ref = metrics_by_label[reference_label]
    for label, metrics in metrics_by_label.items():
        row = {"seeds": sorted(metrics), "n": len(metrics),
               "reached": sum(m["reached"] for m in metrics.values())}
        for name in ("test_accuracy", "final_test_accuracy",
                     "best_val_accuracy", "steps_to_target", "auc"):
            mean, low, high = t_interval([m[name] for m in metrics.values()])
            row[name] = {"mean": mean, "low": low, "high": high}
        if label != reference_label:
            row["difference"] = {
                name: paired_difference(
                    {s: m[name] for s, m in metrics.items()},
                    {s: m[name] for s, m in ref.items()})
                for name in ("test_accuracy", "steps_to_target", "auc")}
        per_label[label] = row
    return {"target": target, "fraction": fraction,
            "reference": reference_label, "labels": per_label}


def format_interval(d, scale=100.0, digits=1):
    """'+1.2 [-0.3, +2.7]' of a paired_difference (x scale)."""
    if d is None or d.get("mean") is None:
        return "–"
    if d.get("no_spread"):
        return f"{scale * d['mean']:+.{digits}f} (all {d['n']} equal)"
    if d.get("low") is None:
        return f"{scale * d['mean']:+.{digits}f} (n = {d['n']})"
    return (f"{scale * d['mean']:+.{digits}f} [{scale * d['low']:+.{digits}f},"
            f" {scale * d['high']:+.{digits}f}]")


def format_mean_ci(d, scale=100.0, digits=1):
    """'51.2 ± 1.3' (half-width of the 95% interval)."""
    if d is None or d.get("mean") is None:
        return "–"
    if d.get("low") is None:
        return f"{scale * d['mean']:.{digits}f}"
    half = scale * (d["high"] - d["low"]) / 2
    return f"{scale * d['mean']:.{digits}f} ± {half:.{digits}f}"


# The equivalence margin of every "equal accuracy" claim, in accuracy points
# (the CUB reports used it first; the Omniglot audit uses the same, so that
# "equal" means the same thing everywhere).
EQUIVALENCE_MARGIN = 1.0


def paired_equivalence(differences, margin=EQUIVALENCE_MARGIN, alpha=0.05):
    """Two one-sided paired t-tests (TOST) of |mean difference| < margin.

    Args:
        differences: (S,) per-seed paired differences (encoding - one-hot),
            in accuracy points; S >= 2.
        margin: equivalence margin (points), > 0.
        alpha: level of each one-sided test; equivalence is declared when
            both reject, i.e. when the (1 - 2 alpha) CI lies inside
            (-margin, margin).

    Returns:
        dict: seeds, mean, std, ci90 / ci95 (t intervals of the mean; None
        when every difference is the same, `no_spread`, where the p-values
        are the exact sign-flip tests' (`no_spread_pvalue`)),
        p_lower (H0: mean <= -margin), p_upper (H0: mean >= margin),
        p_tost = max of the two, equivalent (bool), p_difference (two-sided
        paired t-test of mean = 0).
    """
    from scipy import stats

    d = np.asarray(differences, np.float64)
    if d.ndim != 1 or len(d) < 2 or not np.all(np.isfinite(d)):
        raise ValueError(
            "Argument `differences` must be a 1-D array of at least 2 finite "
            f"paired differences. Received: differences={differences!r}")
    if not margin > 0:
        raise ValueError(
            f"Argument `margin` must be positive. Received: margin={margin!r}")
    mean, std, s = float(d.mean()), float(d.std(ddof=1)), len(d)
    no_spread = has_no_spread(d)

    def interval(level):
        _, low, high = t_interval(d, level)
        # With no spread no t-interval exists: [mean, mean] would claim
        # certainty that n seeds cannot give.
        return None if low is None or no_spread else [low, high]

    if no_spread:
        # No spread: the t statistics are undefined; the exact sign-flip
        # tests of d + margin > 0 and d - margin < 0 stand in.
        p_lower = no_spread_pvalue(d + margin, "greater")
        p_upper = no_spread_pvalue(d - margin, "less")
        p_difference = no_spread_pvalue(d)
    else:
        p_lower = float(stats.ttest_1samp(d, -margin,
                                          alternative="greater").pvalue)
        p_upper = float(stats.ttest_1samp(d, margin,
                                          alternative="less").pvalue)
        p_difference = float(stats.ttest_1samp(d, 0.0).pvalue)
    p_tost = max(p_lower, p_upper)
    return {"seeds": s, "mean": mean, "std": std,
            "ci90": interval(1 - 2 * alpha), "ci95": interval(0.95),
            "p_lower": p_lower, "p_upper": p_upper, "p_tost": p_tost,
            "equivalent": bool(p_tost < alpha), "margin": float(margin),
            "p_difference": p_difference, "no_spread": no_spread}


def equivalence_verdict(test, reference="one-hot"):
    """A short verdict of a `paired_equivalence` result against `reference`."""
    m = test["margin"]
    if test["equivalent"]:
        return f"matches {reference} (TOST, ±{m:g} pt)"
    if test["ci95"] is None:  # no spread: the exact test decides
        if test["p_difference"] >= 0.05:
            return "inconclusive"
        return f"{'above' if test['mean'] > 0 else 'below'} {reference}"
    low, high = test["ci95"]
    if high < 0:
        return f"below {reference}"
    if low > 0:
        return f"above {reference}"
    return "inconclusive"
