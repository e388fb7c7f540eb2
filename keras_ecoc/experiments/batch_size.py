"""Experiment 3: convergence against mini-batch size.

The paper's ImageNet / Places figure: test (validation) accuracy against
optimizer steps for several batch sizes, one-hot against Gaussian and
data-based codes. Reports the steps each encoding needs to reach a fixed
fraction of the best accuracy seen at that batch size.
"""

import time

from keras_ecoc.experiments import common
from keras_ecoc.experiments import curves
from keras_ecoc.experiments import plots
from keras_ecoc.experiments import report

BATCH_SIZES = (16, 32, 128)
BATCH_ENCODINGS = ("one_hot", "gaussian", "spectral")


def run_batch_size(data, batch_sizes=BATCH_SIZES, encodings=BATCH_ENCODINGS,
                   code_length=32, seeds=(0, 1), epochs=4, fraction=0.9,
                   eval_per_epoch=5, output_dir=None, verbose=1,
                   similarity_epochs=common.SIMILARITY_EPOCHS, scale=None,
                   learnable_scale=None, previous_runs=None,
                   name="batch_size"):
    """Accuracy-against-steps curves per batch size and encoding.

    Every run trains `epochs` passes over the training split, so smaller
    batches take more (cheaper) steps. The target of a batch size is
    `fraction` x the best mean (over seeds) test accuracy any encoding
    reached at that batch size; "steps_to_target" is the first measured step
    at or above it (None: never reached).

    Args:
        data: an `ImageDataset`, a `common.DataOptions` or a data set spec.
        batch_sizes: mini-batch sizes to compare.
        encodings: encodings (one-hot included by default).
        code_length: k of the ECOC encodings.
        fraction: the target fraction of the best accuracy, in (0, 1].
        eval_per_epoch: test evaluations per epoch (points of the curves).
        previous_runs: run records of an earlier call (its JSON "runs")
            with the same settings; runs with the same batch size, encoding
            and seed are reused instead of trained again (to add seeds).
        Others: as `ablation.run_ablation`.

    Returns:
        dict with "runs" (each with "steps_to_target" and
        "steps_to_own_target", the first step at `fraction` x the run's own
        best accuracy), "summary" (per batch
        size and encoding: final/best accuracy and steps to target, mean and
        std), "targets" ({batch size: accuracy}), "curves", "settings",
        "dataset", "environment", "markdown", "files", "wall_time".
    """
    start = time.perf_counter()
    data = data if hasattr(data, "x_train") else common.load_data(data)
    k = min(int(code_length), data.num_classes - 1)
    similarity = common.SimilarityCache(data, epochs=similarity_epochs)
    plan = [(b, e) for b in batch_sizes for e in encodings]
    progress = common.RunProgress(len(plan) * len(seeds), name)
    done = {(r["batch_size"], r["encoding"], r["seed"]): r
            for r in previous_runs or []}
    runs = []
    for seed in seeds:
        for batch_size, encoding in plan:
            progress.begin(f"{encoding} batch={batch_size} seed={seed}")
            if (batch_size, encoding, seed) in done:
                record = done[(batch_size, encoding, seed)]
                common.log("    -> reused from the previous results")
                runs.append(record)
                progress.end(record)
                continue
            record = common.train_run(
                data, encoding, k, seed, similarity, batch_size, epochs,
                eval_per_epoch=eval_per_epoch, verbose=verbose, scale=scale,
                learnable_scale=learnable_scale)
            runs.append(record)
            progress.end(record)
    targets, curve_rows = {}, []
    for batch_size in batch_sizes:
        bests = [report.mean_std([r["best_accuracy"] for r in runs
                                  if r["batch_size"] == batch_size
                                  and r["encoding"] == e])[0]
                 for e in encodings]
        best = max([b for b in bests if b is not None], default=0.0)
        targets[batch_size] = fraction * best
        for encoding in encodings:
            group = [r for r in runs if r["batch_size"] == batch_size
                     and r["encoding"] == encoding and r["status"] == "ok"]
            if not group:
                continue
            steps, mean, std = curves.mean_curve(group)
            curve_rows.append({"batch_size": batch_size, "encoding": encoding,
                               "steps": steps, "mean": mean, "std": std})
    for r in runs:
        r["target"] = targets[r["batch_size"]]
        r["steps_to_target"] = curves.steps_to(r, r["target"])
        r["steps_to_own_target"] = (
            None if r["best_accuracy"] is None
            else curves.steps_to(r, fraction * r["best_accuracy"]))
    summary = report.summarize(runs, ("batch_size", "encoding"),
                               ("final_accuracy", "best_accuracy",
                                "steps_to_target", "steps_to_own_target",
                                "wall_time"))
    for row in summary:
        group = [r for r in runs if r["batch_size"] == row["batch_size"]
                 and r["encoding"] == row["encoding"]]
        row["reached"] = sum(r["steps_to_target"] is not None for r in group)
        row["wall_time_mean"] = row["wall_time_mean"] or 0.0
        row["repeats"] = len(group)
        row["code_length"] = group[0]["code_length"]
    results = {
        "experiment": "batch_size",
        "dataset": common.describe_data(data),
        "settings": {"batch_sizes": list(batch_sizes),
                     "encodings": list(encodings), "code_length": k,
                     "seeds": list(seeds), "epochs": epochs,
                     "fraction": fraction, "eval_per_epoch": eval_per_epoch,
                     "scale": scale, "learnable_scale": learnable_scale,
                     "similarity": similarity.describe()},
        "environment": common.environment(),
        "command": common.COMMAND,
        "runs": runs, "summary": summary,
        "targets": {str(b): t for b, t in targets.items()},
        "curves": curve_rows,
    }
    results["wall_time"] = time.perf_counter() - start
    results["markdown"] = batch_size_markdown(results)
    results["files"] = _write(results, output_dir, name)
    return results


def batch_size_markdown(results):
    """Table per batch size and encoding: accuracy and steps to target."""
    s = results["settings"]
    rows = []
    for r in results["summary"]:
        target = results["targets"][str(r["batch_size"])]
        steps = report.stat_cell(r, "steps_to_target", digits=0)
        rows.append([
            r["batch_size"], r["encoding"], r["code_length"],
            report.stat_cell(r, "final_accuracy", percent=True),
            report.stat_cell(r, "best_accuracy", percent=True),
            f"{100 * target:.1f}",
            f"{steps} ({r['reached']}/{r['repeats']} reached)",
            report.stat_cell(r, "steps_to_own_target", digits=0),
            f"{r['wall_time_mean']:.0f}",
        ])
    text = (f"{s['epochs']} epochs at every batch size, ECOC k = "
            f"{s['code_length']}, test accuracy measured {s['eval_per_epoch']} "
            f"times per epoch; target = {s['fraction']:.0%} of the best mean "
            "accuracy at that batch size (any encoding); own target = "
            f"{s['fraction']:.0%} of the encoding's own best accuracy; "
            f"mean ± std over seeds {s['seeds']} "
            f"({results['dataset']['name']}, n = "
            f"{results['dataset']['num_classes']}). Steps to target average "
            "the repeats that reached it.\n\n")
    return text + report.markdown_table(
        ["batch", "encoding", "outputs", "final acc %", "best acc %",
         "target %", "steps to target", "steps to own target", "wall s"],
        rows)


def _write(results, output_dir, name):
    if output_dir is None:
        return []
    panels = []
    for b in results["settings"]["batch_sizes"]:
        series = [(c["encoding"], c["steps"], c["mean"], c["std"])
                  for c in results["curves"] if c["batch_size"] == b]
        panels.append((f"batch {b}", series))
    files = [plots.curve_panels(
        common.output_path(output_dir, f"{name}.png"), panels,
        f"Test accuracy against steps on {common.data_label(results)}")]
    files.append(report.write_text(common.output_path(output_dir, f"{name}.md"),
                                   results["markdown"]))
    files.append(common.output_path(output_dir, f"{name}.json"))
    report.write_json(files[-1], {k: v for k, v in results.items()
                                  if k != "files"})
    return files
