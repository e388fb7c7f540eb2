"""Experiment 6: what the decoding scale (inverse temperature) does.

The paper decodes with logits -1/2 ||M_i - z/||z|| ||^2 (scale 1). The
package defaults to a learnable scale started at 8. This compares fixed 1,
fixed 8 and learnable-from-8 (configurable) on the same codes and schedule,
with one-hot as the reference.
"""

import time

from keras_ecoc.experiments import common
from keras_ecoc.experiments import curves
from keras_ecoc.experiments import plots
from keras_ecoc.experiments import report

SCALE_CONFIGS = ("fixed:1", "fixed:8", "learnable:8")


def parse_scale_config(text):
    """'fixed:1' -> (1.0, False); 'learnable:8' -> (8.0, True)."""
    kind, _, value = str(text).partition(":")
    if kind not in ("fixed", "learnable") or not value:
        raise ValueError("A scale configuration must look like 'fixed:1' or "
                         f"'learnable:8'. Received: {text!r}")
    scale = float(value)
    if scale <= 0:
        raise ValueError(f"The scale must be positive. Received: {text!r}")
    return scale, kind == "learnable"


def run_scale(data, configs=SCALE_CONFIGS, encodings=("gaussian", "spectral"),
              code_length=32, seeds=(0, 1), epochs=4, batch_size=32,
              include_one_hot=True, eval_per_epoch=2, output_dir=None,
              verbose=1, similarity_epochs=common.SIMILARITY_EPOCHS,
              name="scale"):
    """Accuracy of ECOC codes under several decoding-scale settings.

    Args:
        data: an `ImageDataset`, a `common.DataOptions` or a data set spec.
        configs: 'fixed:S' or 'learnable:S' strings (S = initial scale).
        encodings: ECOC encodings to compare.
        code_length: k.
        include_one_hot: also train the one-hot reference.
        Others: as `ablation.run_ablation`.

    Returns:
        dict with "runs" (each with "scale_config" and "final_scale"),
        "summary" (per encoding and configuration), "settings", "dataset",
        "environment", "markdown", "files", "wall_time".
    """
    start = time.perf_counter()
    data = data if hasattr(data, "x_train") else common.load_data(data)
    k = min(int(code_length), data.num_classes - 1)
    parsed = [(c, *parse_scale_config(c)) for c in configs]
    similarity = common.SimilarityCache(data, epochs=similarity_epochs)
    plan = [("one_hot", "n/a", None, None)] if include_one_hot else []
    encodings = [e for e in encodings if e != "one_hot"]
    plan += [(e, c, s, learn) for e in encodings for c, s, learn in parsed]
    progress = common.RunProgress(len(plan) * len(seeds), name)
    runs = []
    for seed in seeds:
        for encoding, config, scale, learnable in plan:
            progress.begin(f"{encoding} scale={config} seed={seed}")
            record = common.train_run(
                data, encoding, k, seed, similarity, batch_size, epochs,
                eval_per_epoch=eval_per_epoch, verbose=verbose, scale=scale,
                learnable_scale=learnable, extra={"scale_config": config})
            runs.append(record)
            progress.end(record)
    summary = report.summarize(runs, ("encoding", "scale_config"),
                               ("final_accuracy", "best_accuracy",
                                "final_scale", "wall_time"))
    curve_rows = []
    for row in summary:
        group = [r for r in runs if r["encoding"] == row["encoding"]
                 and r["scale_config"] == row["scale_config"]
                 and r["status"] == "ok"]
        if not group:
            continue
        steps, mean, std = curves.mean_curve(group)
        curve_rows.append({"encoding": row["encoding"],
                           "scale_config": row["scale_config"],
                           "steps": steps, "mean": mean, "std": std})
    results = {
        "experiment": "scale",
        "dataset": common.describe_data(data),
        "settings": {"configs": list(configs), "encodings": list(encodings),
                     "code_length": k, "seeds": list(seeds),
                     "epochs": epochs, "batch_size": batch_size,
                     "eval_per_epoch": eval_per_epoch,
                     "similarity": similarity.describe()},
        "environment": common.environment(),
        "command": common.COMMAND,
        "runs": runs, "summary": summary, "curves": curve_rows,
    }
    results["wall_time"] = time.perf_counter() - start
    results["markdown"] = scale_markdown(results)
    results["files"] = _write(results, output_dir, name)
    return results


def scale_markdown(results):
    s = results["settings"]
    rows = []
    for r in results["summary"]:
        rows.append([r["encoding"], r["scale_config"],
                     report.stat_cell(r, "final_accuracy", percent=True),
                     report.stat_cell(r, "best_accuracy", percent=True),
                     report.stat_cell(r, "final_scale", digits=2)])
    text = (f"ECOC k = {s['code_length']}, {s['epochs']} epochs, batch "
            f"{s['batch_size']}, mean ± std over seeds {s['seeds']} "
            f"({results['dataset']['name']}, n = "
            f"{results['dataset']['num_classes']}).\n\n")
    return text + report.markdown_table(
        ["encoding", "scale", "final acc %", "best acc %", "scale at end"],
        rows)


def _write(results, output_dir, name):
    if output_dir is None:
        return []
    one_hot = [c for c in results["curves"] if c["encoding"] == "one_hot"]
    panels = []
    for e in results["settings"]["encodings"]:
        series = [(f"{c['scale_config']}", c["steps"], c["mean"], c["std"])
                  for c in results["curves"] if c["encoding"] == e]
        series += [("one-hot", c["steps"], c["mean"], c["std"])
                   for c in one_hot]
        panels.append((e, series))
    if not panels:  # one-hot only
        panels = [("one-hot", [("one-hot", c["steps"], c["mean"], c["std"])
                               for c in one_hot])]
    files = [plots.curve_panels(
        common.output_path(output_dir, f"{name}.png"), panels,
        f"Decoding scale on {common.data_label(results)}")]
    files.append(report.write_text(common.output_path(output_dir, f"{name}.md"),
                                   results["markdown"]))
    files.append(common.output_path(output_dir, f"{name}.json"))
    report.write_json(files[-1], {k: v for k, v in results.items()
                                  if k != "files"})
    return files
