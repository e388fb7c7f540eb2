"""Experiment 2: accuracy against code length (the paper's "add bits" figure).

Data-based spectral codes and random codes from a few bits up to n - 1,
against the one-hot network (n outputs).
"""

import time

import numpy as np

from keras_ecoc.experiments import common
from keras_ecoc.experiments import plots
from keras_ecoc.experiments import report

BITS_ENCODINGS = ("spectral", "dense_random")


def default_code_lengths(num_classes):
    """Powers of two from 4 below n - 1, then n // 4, n // 2 and n - 1."""
    lengths = {2 ** i for i in range(2, 12) if 2 ** i < num_classes - 1}
    lengths |= {max(2, num_classes // 4), max(2, num_classes // 2),
                num_classes - 1}
    return sorted(k for k in lengths if k >= 2)


def run_bits(data, code_lengths=None, encodings=BITS_ENCODINGS, seeds=(0, 1),
             epochs=5, batch_size=32, output_dir=None, verbose=1,
             similarity_epochs=common.SIMILARITY_EPOCHS, scale=None,
             learnable_scale=None, eval_per_epoch=1, name="bits"):
    """Test accuracy against the number of bits k, with one-hot as reference.

    Args:
        data: an `ImageDataset`, a `common.DataOptions` or a data set spec.
        code_lengths: list of k (default `default_code_lengths(n)`: a few
            bits up to n - 1).
        encodings: ECOC encodings to sweep (one-hot is always added).
        Others: as `ablation.run_ablation`.

    Returns:
        dict with "runs", "summary" (per encoding and k), "one_hot" (its
        summary row), "settings", "dataset", "environment", "markdown",
        "files", "wall_time".
    """
    start = time.perf_counter()
    data = data if hasattr(data, "x_train") else common.load_data(data)
    n = data.num_classes
    code_lengths = [int(k) for k in (code_lengths or default_code_lengths(n))]
    similarity = common.SimilarityCache(data, epochs=similarity_epochs)
    plan = [("one_hot", n)] + [
        (e, k) for e in encodings if e != "one_hot" for k in code_lengths
        if common.valid_length(e, n, k)]
    progress = common.RunProgress(len(plan) * len(seeds), name)
    runs = []
    for seed in seeds:
        for encoding, k in plan:
            progress.begin(f"{encoding} k={k} seed={seed}")
            record = common.train_run(
                data, encoding, k, seed, similarity, batch_size, epochs,
                eval_per_epoch=eval_per_epoch, verbose=verbose, scale=scale,
                learnable_scale=learnable_scale)
            runs.append(record)
            progress.end(record)
    summary = report.summarize(runs, ("encoding", "code_length"))
    results = {
        "experiment": "bits",
        "dataset": common.describe_data(data),
        "settings": {"code_lengths": code_lengths, "encodings": list(encodings),
                     "seeds": list(seeds), "epochs": epochs,
                     "batch_size": batch_size, "scale": scale,
                     "learnable_scale": learnable_scale,
                     "eval_per_epoch": eval_per_epoch,
                     "similarity": similarity.describe()},
        "environment": common.environment(),
        "command": common.COMMAND,
        "runs": runs, "summary": summary,
        "one_hot": next(r for r in summary if r["encoding"] == "one_hot"),
    }
    results["wall_time"] = time.perf_counter() - start
    results["markdown"] = bits_markdown(results)
    results["files"] = _write(results, output_dir, name)
    return results


def bits_markdown(results):
    """Table: rows k (and one-hot), columns encodings; accuracy %."""
    summary = results["summary"]
    encodings = [e for e in dict.fromkeys(r["encoding"] for r in summary)
                 if e != "one_hot"]
    cells = {(r["encoding"], r["code_length"]): r for r in summary}
    rows = []
    for k in results["settings"]["code_lengths"]:
        row = [str(k)]
        for e in encodings:
            r = cells.get((e, k))
            row.append(report.accuracy_cell(r) if r else "")
        rows.append(row)
    oh = results["one_hot"]
    rows.append([f"one-hot (n = {oh['code_length']})",
                 report.accuracy_cell(oh)]
                + [""] * (len(encodings) - 1))
    s = results["settings"]
    text = (f"Test accuracy (%) against code length k after {s['epochs']} "
            f"epochs, batch {s['batch_size']}, mean ± std over seeds "
            f"{s['seeds']} ({results['dataset']['name']}, n = "
            f"{results['dataset']['num_classes']}).\n\n")
    return text + report.markdown_table(["bits k"] + encodings, rows)


def _write(results, output_dir, name):
    if output_dir is None:
        return []
    summary = results["summary"]
    series = []
    for e in dict.fromkeys(r["encoding"] for r in summary):
        if e == "one_hot":
            continue
        rows = sorted((r for r in summary if r["encoding"] == e),
                      key=lambda r: r["code_length"])
        rows = [r for r in rows if r["final_accuracy_mean"] is not None]
        series.append((e, [r["code_length"] for r in rows],
                       [r["final_accuracy_mean"] for r in rows],
                       [r["final_accuracy_std"] for r in rows]))
    oh = results["one_hot"]
    files = [plots.lines(
        common.output_path(output_dir, f"{name}.png"), series,
        f"Accuracy against code length on {common.data_label(results)}",
        "bits k", logx=True,
        hlines=[(f"one-hot (n = {oh['code_length']})",
                 oh["final_accuracy_mean"])])]
    files.append(report.write_text(common.output_path(output_dir, f"{name}.md"),
                                   results["markdown"]))
    files.append(common.output_path(output_dir, f"{name}.json"))
    report.write_json(files[-1], {k: v for k, v in results.items()
                                  if k != "files"})
    return files
