"""Experiment 1: code design ablation (the paper's Table 1).

One-hot against dense random (+-1), Gaussian (raw, zero- and
median-thresholded) and data-based spectral codes (raw, zero, median) at
several code lengths, every encoding trained with the same network and
schedule, repeated over seeds.
"""

import time

from keras_ecoc.experiments import common
from keras_ecoc.experiments import plots
from keras_ecoc.experiments import report

ABLATION_ENCODINGS = ("one_hot", "dense_random", "gaussian", "gaussian_zero",
                      "gaussian_median", "spectral", "spectral_zero",
                      "spectral_median")


def run_ablation(data, code_lengths=(16, 64), encodings=ABLATION_ENCODINGS,
                 seeds=(0, 1), epochs=5, batch_size=32, output_dir=None,
                 verbose=1, similarity_epochs=common.SIMILARITY_EPOCHS,
                 scale=None, learnable_scale=None, eval_per_epoch=1,
                 name="ablation"):
    """Test accuracy of every encoding at every code length, over seeds.

    Args:
        data: an `ImageDataset`, a `common.DataOptions` or a data set spec.
        code_lengths: code lengths k to try (spectral codes need k <= n - 1;
            invalid pairs are listed under "skipped").
        encodings: `keras_ecoc.training.ENCODINGS` names; one-hot is trained
            once per seed (its length is n).
        seeds: repeats; each seeds the code draw, weights and shuffling.
        epochs, batch_size: the shared training schedule.
        output_dir: where to write `<name>.json`, `<name>.md` and
            `<name>.png` (None: write nothing).
        verbose: Keras progress bars (1), one line per epoch (2) or none (0).
        similarity_epochs: epochs of the one-hot network behind data codes.
        scale, learnable_scale: ECOC decoding scale (None: package default).
        eval_per_epoch: test evaluations per epoch.
        name: file stem of the outputs.

    Returns:
        dict: "runs" (one record per encoding x length x seed, see
        `common.train_run`), "summary" (mean/std over seeds per encoding and
        length), "skipped", "settings", "dataset", "environment", "markdown",
        "files", "wall_time".
    """
    start = time.perf_counter()
    data = data if hasattr(data, "x_train") else common.load_data(data)
    similarity = common.SimilarityCache(data, epochs=similarity_epochs)
    plan, skipped = [], []
    for encoding in encodings:
        lengths = [data.num_classes] if encoding == "one_hot" else code_lengths
        for k in lengths:
            if common.valid_length(encoding, data.num_classes, k):
                plan.append((encoding, int(k)))
            else:
                skipped.append({"encoding": encoding, "code_length": int(k),
                                "reason": f"k must be <= {data.num_classes - 1}"})
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
        "experiment": "ablation",
        "dataset": common.describe_data(data),
        "settings": {"code_lengths": list(code_lengths),
                     "encodings": list(encodings), "seeds": list(seeds),
                     "epochs": epochs, "batch_size": batch_size,
                     "scale": scale, "learnable_scale": learnable_scale,
                     "eval_per_epoch": eval_per_epoch,
                     "similarity": similarity.describe()},
        "environment": common.environment(),
        "command": common.COMMAND,
        "runs": runs, "summary": summary, "skipped": skipped,
    }
    results["wall_time"] = time.perf_counter() - start
    results["markdown"] = ablation_markdown(results)
    results["files"] = _write(results, output_dir, name)
    return results


def ablation_markdown(results):
    """Table: encodings x code lengths, test accuracy % (mean ± std)."""
    summary = results["summary"]
    lengths = sorted({r["code_length"] for r in summary
                      if r["encoding"] != "one_hot"})
    cells = {(r["encoding"], r["code_length"]): r for r in summary}
    encodings = list(dict.fromkeys(r["encoding"] for r in summary))
    n = results["dataset"]["num_classes"]
    headers = ["encoding"] + [f"k = {k}" for k in lengths] + [f"k = n = {n}"]
    rows = []
    for encoding in encodings:
        row = [encoding]
        for k in lengths + [n]:
            r = cells.get((encoding, k))
            if encoding == "one_hot" and k != n or r is None:
                row.append("")
            else:
                row.append(report.accuracy_cell(r))
        rows.append(row)
    s = results["settings"]
    text = (f"Test accuracy (%) after {s['epochs']} epochs, batch "
            f"{s['batch_size']}, mean ± std over seeds {s['seeds']} "
            f"({results['dataset']['name']}, n = {n} classes).\n\n")
    return text + report.markdown_table(headers, rows)


def _write(results, output_dir, name):
    if output_dir is None:
        return []
    summary = results["summary"]
    lengths = sorted({r["code_length"] for r in summary
                      if r["encoding"] != "one_hot"})
    encodings = [e for e in dict.fromkeys(r["encoding"] for r in summary)
                 if e != "one_hot"]
    cells = {(r["encoding"], r["code_length"]): r for r in summary}
    groups = []
    for k in lengths:
        rows = [cells.get((e, k)) for e in encodings]
        groups.append((f"k = {k}",
                       [r and r["final_accuracy_mean"] for r in rows],
                       [r and r["final_accuracy_std"] for r in rows]))
    references = [(f"one-hot (n = {r['code_length']})", r["final_accuracy_mean"])
                  for r in summary if r["encoding"] == "one_hot"]
    files = [plots.grouped_bars(
        common.output_path(output_dir, f"{name}.png"), encodings, groups,
        f"Code design ablation on {common.data_label(results)}",
        references=references)]
    files.append(report.write_text(common.output_path(output_dir, f"{name}.md"),
                                   results["markdown"]))
    files.append(common.output_path(output_dir, f"{name}.json"))
    report.write_json(files[-1], {k: v for k, v in results.items()
                                  if k != "files"})
    return files
