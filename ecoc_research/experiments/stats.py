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
  number of steps (trapezoids): the mean accuracy over training, 1 = perfect
  from the first step.

Tests: `paired_difference` adds the two-sided paired t-test p-value of a
zero mean; `holm` adjusts a family of such p-values for multiple comparisons
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
    """Area under accuracy vs steps over [0, last step], divided by it."""
    steps = np.asarray(steps, np.float64)
    accuracy = np.asarray(accuracy, np.float64)
    if len(steps) < 2 or steps[-1] <= steps[0]:
        return float(accuracy[-1]) if len(accuracy) else None
    return float(np.trapezoid(accuracy, steps) / (steps[-1] - steps[0]))


def t_interval(values, confidence=0.95):
    """(mean, low, high) of the Student-t interval; (mean, None, None) if n < 2."""
    from scipy import stats

    values = np.asarray([v for v in values if v is not None], np.float64)
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
        statistic is infinite: 1.0 when the mean is 0, else 0.0.
    """
    from scipy import stats

    d = np.asarray([v for v in differences if v is not None], np.float64)
    if len(d) < 2:
        return None
    if float(d.std(ddof=1)) == 0:
        return 1.0 if float(d.mean()) == 0 else 0.0
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
        zero mean; None for n < 2), verdict ("within noise" when the
        interval contains 0, else "higher" / "lower"; "too few seeds" for
        n < 2).
    """
    seeds = sorted(s for s in values if s in reference
                   and values[s] is not None and reference[s] is not None)
    diffs = [values[s] - reference[s] for s in seeds]
    mean, low, high = t_interval(diffs, confidence)
    if low is None:
        verdict = "too few seeds"
    elif low <= 0 <= high:
        verdict = "within noise"
    else:
        verdict = "higher" if mean > 0 else "lower"
    return {"n": len(diffs), "mean": mean, "low": low, "high": high,
            "p": paired_t_pvalue(diffs), "verdict": verdict, "seeds": seeds,
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
        metrics = {r["spec"]["seed"]: run_metrics(r, target) for r in runs}
        metrics_by_label[label] = metrics
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
        dict: seeds, mean, std, ci90 / ci95 (t intervals of the mean),
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
    sem = std / np.sqrt(s)

    def interval(level):
        _, low, high = t_interval(d, level)
        return None if low is None else [low, high]

    if sem == 0:
        # No spread: the t statistics are infinite; decide by the mean alone.
        p_lower = 0.0 if mean > -margin else 1.0
        p_upper = 0.0 if mean < margin else 1.0
        p_difference = 1.0 if mean == 0 else 0.0
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
            "p_difference": p_difference}


def equivalence_verdict(test, reference="one-hot"):
    """A short verdict of a `paired_equivalence` result against `reference`."""
    m = test["margin"]
    if test["equivalent"]:
        return f"matches {reference} (TOST, ±{m:g} pt)"
    low, high = test["ci95"]
    if high < 0:
        return f"below {reference}"
    if low > 0:
        return f"above {reference}"
    return "inconclusive"
