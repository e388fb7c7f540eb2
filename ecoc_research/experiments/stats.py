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


def paired_difference(values, reference, confidence=0.95):
    """Mean and t-interval of values[seed] - reference[seed] over common seeds.

    Args:
        values, reference: dicts seed -> number (None: missing).

    Returns:
        dict: n (pairs), mean, low, high, verdict ("within noise" when the
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
            "verdict": verdict, "seeds": seeds}


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
