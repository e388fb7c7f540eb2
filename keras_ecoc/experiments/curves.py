"""Helpers for accuracy-against-steps curves over seeds."""

import numpy as np


def mean_curve(runs):
    """Mean and std test-accuracy curves of runs with the same schedule.

    Returns:
        (steps (T,), mean (T,), std (T,)) over the common measured steps.
    """
    steps = sorted(set.intersection(*[set(r["steps"]) for r in runs]))
    values = np.array([[dict(zip(r["steps"], r["accuracies"]))[s]
                        for s in steps] for r in runs], float)
    return steps, values.mean(0), values.std(0)


def steps_to(run, target):
    """First measured step whose test accuracy is >= target, or None."""
    for step, value in zip(run["steps"], run["accuracies"]):
        if value >= target:
            return int(step)
    return None
