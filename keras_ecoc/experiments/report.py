"""JSON and Markdown writers shared by the experiments.

Every experiment returns a plain dict (JSON-serialisable) and writes, into its
output folder, `<name>.json` (all runs and summaries), `<name>.md` (the
tables) and PNG figures.
"""

import json
import math
import os

import numpy as np


def to_jsonable(value):
    """Converts NumPy scalars/arrays (nested in dicts/lists) to JSON types."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path, data):
    """Writes `data` as indented JSON (NumPy values converted)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(to_jsonable(data), f, indent=1)
    return path


def write_text(path, text):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    return path


def mean_std(values):
    """(mean, std) of a list of numbers, ignoring None; (None, None) if empty.

    The std is the population std (ddof=0) over the repeats; 0 for one repeat.
    """
    values = [float(v) for v in values if v is not None]
    if not values:
        return None, None
    return float(np.mean(values)), float(np.std(values))


def format_mean_std(mean, std, digits=3, percent=False):
    """'0.512 ± 0.010' (or '51.2 ± 1.0' with percent=True); '–' if missing."""
    if mean is None:
        return "–"
    if percent:
        mean, std, digits = 100 * mean, 100 * (std or 0.0), 1
    return f"{mean:.{digits}f} ± {std or 0.0:.{digits}f}"


def markdown_table(headers, rows):
    """A GitHub Markdown table from a header list and rows of cells."""
    lines = ["| " + " | ".join(str(h) for h in headers) + " |",
             "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def group_runs(runs, keys):
    """Groups run dicts by the tuple of `keys`, keeping first-seen order."""
    groups = {}
    for run in runs:
        groups.setdefault(tuple(run[k] for k in keys), []).append(run)
    return groups


def summarize(runs, keys, metrics=("final_accuracy", "best_accuracy",
                                   "wall_time")):
    """Mean and std over seeds of `metrics`, per group of `keys`.

    Returns:
        list of dicts: the key values, `seeds`, and `<metric>_mean` /
        `<metric>_std` for each metric.
    """
    summary = []
    for key, group in group_runs(runs, keys).items():
        row = dict(zip(keys, key))
        row["seeds"] = [r.get("seed") for r in group]
        row["failed"] = sum(r.get("status", "ok") != "ok" for r in group)
        reasons = [r["status"] for r in group if r.get("status", "ok") != "ok"]
        if reasons:
            row["failed_reason"] = reasons[0]
        for metric in metrics:
            mean, std = mean_std([r.get(metric) for r in group])
            row[f"{metric}_mean"], row[f"{metric}_std"] = mean, std
        summary.append(row)
    return summary


def stat_cell(row, metric, digits=3, percent=False):
    """A summary row's '<mean> ± <std>', or just '<mean>' for one repeat."""
    mean, std = row[f"{metric}_mean"], row[f"{metric}_std"]
    if len(row.get("seeds", ())) - row.get("failed", 0) == 1:
        if mean is None:
            return "–"
        return (f"{100 * mean:.1f}" if percent else f"{mean:.{digits}f}")
    return format_mean_std(mean, std, digits=digits, percent=percent)


def accuracy_cell(row, metric="final_accuracy"):
    """'51.2 ± 1.0' for a summary row, noting runs that could not train."""
    text = stat_cell(row, metric, percent=True)
    failed = row.get("failed", 0)
    if failed:
        reason = ("no admissible code" if row.get("failed_reason") == "no_code"
                  else "duplicate codewords")
        text = (reason if failed == len(row["seeds"]) else
                f"{text} ({failed}/{len(row['seeds'])} runs: {reason})")
    return text
