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


def write_summary(fig, results, output_dir, name):
    """Writes an experiment's figure, Markdown and summary JSON.

    Args:
        fig: a `matplotlib.figure.Figure`, saved as `<name>.png`.
        results: dict with a "markdown" entry (written to `<name>.md`); all of
            it but its "files" entry goes to `<name>.json`.
        output_dir: the folder the user named (nothing is written elsewhere).
        name: the files' common stem.

    Returns:
        [png path, md path, json path].
    """
    png = os.path.join(output_dir, f"{name}.png")
    fig.savefig(png, dpi=110)
    md = write_text(os.path.join(output_dir, f"{name}.md"), results["markdown"])
    path = os.path.join(output_dir, f"{name}.json")
    write_json(path, {k: v for k, v in results.items() if k != "files"})
    return [png, md, path]


def markdown_table(headers, rows):
    """A GitHub Markdown table from a header list and rows of cells."""
    lines = ["| " + " | ".join(str(h) for h in headers) + " |",
             "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
