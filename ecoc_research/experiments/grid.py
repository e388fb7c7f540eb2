"""The grid command: (encoding, k, row norm, batch, optimizer, lr, seed) runs.

For every cell of the grid (all settings but the learning rate and the seed)
the learning rate is chosen on the VALIDATION split with a selection seed
that is not reused for reporting (best validation accuracy, ties broken by
the area under the validation curve), then the reporting seeds run with the
chosen rate. Every encoding is compared with one-hot of the same group
(same protocol, data, batch size, optimizer, schedule), paired by seed
(`stats.compare_to_reference`). Outputs in `--output`: runs/<key>.json (one
per run, written as it finishes), <name>.json (selection, comparisons,
curves, sparsity), <name>.md (tables) and <name>_curves.png /
<name>_sparsity.png.
"""

import dataclasses
import json
import time

import numpy as np

from ecoc_research.experiments import common
from ecoc_research.experiments import protocols
from ecoc_research.experiments import runner as runner_lib
from ecoc_research.experiments import stats


def parse_code_length(token, num_classes):
    """k from '18', '0.16n' (rounded), 'n-1' or '2n'."""
    text = str(token).strip().replace(" ", "")
    n = int(num_classes)
    try:
        if text.endswith("n"):
            factor = text[:-1]
            return max(2, int(round((float(factor) if factor else 1.0) * n)))
        if text.startswith("n-"):
            value = n - int(text[2:])
        else:
            value = int(text)
    except ValueError:
        value = None
    if value is None or value < 2:
        raise ValueError(
            "Argument `code_lengths` takes integers >= 2 or expressions in "
            "the number of classes n: '0.16n', 'n-1', '2n'. Received: "
            f"{token!r}")
    return value


@dataclasses.dataclass
class Grid:
    """The factors of a grid command.

    Attributes:
        base: dict of `RunSpec` fields shared by every run.
        encodings: encoding names (`runner.ENCODINGS`); one-hot is the
            reference of the comparisons.
        code_lengths: tokens for `parse_code_length`.
        normalize_rows: values tried for raw Gaussian / spectral codes.
        batch_sizes: mini-batch sizes.
        epochs: {batch size: epochs} (a fixed budget per batch size).
        learning_rates: the grid; one value = no selection.
        lr_overrides: {(label, batch_size): rate} chosen elsewhere (e.g. by
            an earlier grid's selection): no selection for those cells.
        seeds: reporting seeds (paired across encodings).
        select_seed: the seed of the learning-rate selection runs.
        min_code_length: lower bound of k after parsing.
        fraction: target of "steps to target" = fraction x one-hot's mean
            final validation accuracy.
        evals_per_epoch: {batch size: validation points per epoch} (None:
            the base's).
    """

    base: dict
    encodings: list
    code_lengths: list
    normalize_rows: list
    batch_sizes: list
    epochs: dict
    learning_rates: list
    seeds: list
    select_seed: int = 100
    lr_overrides: dict = None
    min_code_length: int = 2
    fraction: float = 0.9
    evals_per_epoch: dict = None

    def __post_init__(self):
        # The factors RunSpec does not see: checked here, before any run.
        if not self.seeds:
            raise ValueError("Argument `seeds` must name at least one seed. "
                             f"Received: seeds={self.seeds!r}")
        for seed in list(self.seeds) + [self.select_seed]:
            if not common.is_integer(seed) or not 0 <= seed < 2 ** 32:
                raise ValueError("Arguments `seeds` and `select_seed` take "
                                 "integers in [0, 2**32). Received: "
                                 f"seeds={self.seeds!r}, "
                                 f"select_seed={self.select_seed!r}")
        for rate in self.learning_rates:
            if not (common.is_real(rate) and rate > 0):
                raise ValueError(
                    "Argument `learning_rates` must hold positive floats. "
                    f"Received: learning_rates={self.learning_rates!r}")
        if len(self.learning_rates) > 1 and self.select_seed in self.seeds:
            raise ValueError(
                "Argument `select_seed` must not be a reported seed: its "
                "selection runs would be reported as that seed's runs, "
                "chosen on their own validation score. Received: "
                f"select_seed={self.select_seed} with seeds={self.seeds}")
        if not (common.is_real(self.fraction) and 0 < self.fraction <= 1):
            raise ValueError("Argument `fraction` must be in (0, 1] (the "
                             "target is this fraction of one-hot's mean "
                             f"accuracy). Received: fraction={self.fraction!r}")
        if not common.is_integer(self.min_code_length) or self.min_code_length < 2:
            raise ValueError("Argument `min_code_length` must be an integer "
                             ">= 2. Received: "
                             f"min_code_length={self.min_code_length!r}")

    def _evals(self, batch_size):
        if not self.evals_per_epoch:
            return {}
        return {"evals_per_epoch": self.evals_per_epoch[batch_size]}

    def cells(self, num_classes):
        """Spec templates (learning rate and seed left to fill), in order."""
        out = []
        for batch_size in self.batch_sizes:
            for encoding in self.encodings:
                if encoding.startswith("one_hot"):
                    lengths = [None]
                else:
                    lengths = sorted({max(self.min_code_length,
                                          parse_code_length(t, num_classes))
                                      for t in self.code_lengths})
                norms = (list(dict.fromkeys(self.normalize_rows))
                         if encoding in runner_lib.ROW_NORM_ENCODINGS
                         else [None])
                for k in lengths:
                    for norm in norms:
                        out.append(dict(self.base, encoding=encoding,
                                        code_length=k, normalize_rows=norm,
                                        batch_size=batch_size,
                                        epochs=self.epochs[batch_size],
                                        **self._evals(batch_size)))
        return out


def check_name(name):
    """`name` is a plain file stem: the summary files stay in the output."""
    text = str(name)
    if (not text or text in (".", "..") or "/" in text or "\\" in text
            or text != text.strip()):
        raise ValueError("Argument `name` must be a plain file name stem "
                         "(no folder separators, not '.' or '..'). "
                         f"Received: name={name!r}")
    return text


def check_batch_sizes(batch_sizes, task):
    """Every batch size fits in the task's training split (full batches)."""
    examples = len(task.train[1])
    if max(batch_sizes) > examples:
        raise ValueError(f"Argument `batch_sizes` must be at most the "
                         f"{examples} training images of the split. "
                         f"Received: batch_sizes={list(batch_sizes)}")


def check_code_lengths(grid, num_classes):
    """Refuses an encoding none of whose code lengths can be built for
    `num_classes` classes; returns [(encoding, k, reason)] of the single
    cells that cannot (they are recorded as not trained, e.g. 2n for the
    data-based codes in a sweep over k)."""
    lengths, bad = {}, []
    for cell in grid.cells(num_classes):
        if cell["code_length"] is None:
            continue
        encoding, k = cell["encoding"], cell["code_length"]
        lengths.setdefault(encoding, set()).add(k)
        try:
            runner_lib.check_code_length(encoding, num_classes, k)
        except ValueError as error:
            bad.append((encoding, k, str(error)))
    for encoding, ks in lengths.items():
        failed = {k for e, k, _ in bad if e == encoding}
        if failed == ks:
            reason = next(r for e, _, r in bad if e == encoding)
            raise ValueError(
                f"Argument `code_lengths` gives {encoding!r} no code it can "
                f"build for n = {num_classes} classes ({reason}). Received: "
                f"code_lengths={list(grid.code_lengths)}")
    return sorted(set(bad))


def _spec(cell, learning_rate, seed):
    return runner_lib.RunSpec(**dict(cell, learning_rate=float(learning_rate),
                                     seed=int(seed)))


def cell_label(spec, several_lengths):
    if several_lengths and spec.code_length is not None:
        return f"{spec.label} k={spec.code_length}"
    return spec.label


def run_grid(grid, output, name, resume=False, verbose=0, log_every=1,
             chance_multiple=None, jit_compile=False):
    """Runs a grid (selection, then reporting seeds) and summarises it.

    The pretrained network (retrain protocol, or data-based codes) is
    trained first and must be above chance (`chance_multiple`, default
    `protocols.CHANCE_MULTIPLE`; 0 disables): otherwise
    `protocols.PretrainingFailed` is raised before any head is trained.
    `jit_compile`: XLA for the training steps (`runner.Runner`; it pays off
    for whole-network fine-tuning, not for small heads).

    Returns:
        dict written to `<output>/<name>.json`.
    """
    start = time.perf_counter()
    name = check_name(name)
    if chance_multiple is None:
        chance_multiple = protocols.CHANCE_MULTIPLE
    run = runner_lib.Runner(output, resume=resume, verbose=verbose,
                            chance_multiple=chance_multiple,
                            jit_compile=jit_compile)
    first = grid.batch_sizes[0]
    probe = _spec(dict(grid.base, encoding="one_hot", code_length=None,
                       normalize_rows=None, batch_size=first,
                       epochs=grid.epochs[first], **grid._evals(first)),
                  grid.learning_rates[0], grid.seeds[0])
    task = run.task(probe)
    n = task.num_classes
    runner_lib.check_data_fingerprint(output, probe, resume)
    try:  # before any training, as the command line checks it
        check_batch_sizes(grid.batch_sizes, task)
        unbuildable = check_code_lengths(grid, n)
    except ValueError as error:
        raise common.UsageError(str(error)) from error
    for encoding, k, reason in unbuildable:
        common.log(f"note: {encoding} k = {k} cannot be built for n = {n} "
                   f"({reason}): recorded as not trained")
    common.log(f"== {name}: {task.name}, protocol {probe.protocol}"
               f"/{probe.variant}, n = {n} classes, {len(task.train[1])} "
               f"train / {len(task.val[1])} validation / {len(task.test[1])} "
               f"test images; pretraining on {len(task.pretrain_classes)} "
               "classes")
    cells = grid.cells(n)
    if probe.protocol != "scratch" or any(
            c["encoding"] in runner_lib.DATA_ENCODINGS for c in cells):
        run.pretrained(probe)  # stops here when it is near chance
    several = len({c["code_length"] for c in cells
                   if c["code_length"] is not None}) > 1
    selection, chosen = [], {}
    overrides = grid.lr_overrides or {}
    total = len(cells) * (len(grid.seeds) + (
        len(grid.learning_rates) if len(grid.learning_rates) > 1 else 0))
    progress = common.RunProgress(total, name)
    for cell in cells:
        probe = _spec(cell, grid.learning_rates[0], grid.select_seed)
        label = cell_label(probe, several)
        key = (probe.label, probe.batch_size)
        if key in overrides:
            chosen[json.dumps(cell, sort_keys=True)] = float(overrides[key])
            continue
        if len(grid.learning_rates) == 1:
            chosen[json.dumps(cell, sort_keys=True)] = grid.learning_rates[0]
            continue
        tried = []
        for lr in grid.learning_rates:
            spec = _spec(cell, lr, grid.select_seed)
            progress.begin(f"select {label} batch={spec.batch_size} "
                           f"{spec.optimizer} lr={lr}")
            record = run.run(spec)
            _log_record(record)
            progress.done += 1
            if record["status"] != "ok":
                continue
            tried.append({"learning_rate": lr, "key": record["key"],
                          "best_val_accuracy": record["best_val_accuracy"],
                          "auc": stats.curve_auc(record["steps"],
                                                 record["val_accuracy"])})
        if not tried:
            chosen[json.dumps(cell, sort_keys=True)] = None
            continue
        best = max(tried, key=lambda t: (t["best_val_accuracy"], t["auc"]))
        chosen[json.dumps(cell, sort_keys=True)] = best["learning_rate"]
        selection.append({"label": label, "batch_size": probe.batch_size,
                          "optimizer": probe.optimizer,
                          "code_length": probe.code_length,
                          "chosen": best["learning_rate"], "tried": tried})
    records = []
    for seed in grid.seeds:
        for cell in cells:
            lr = chosen[json.dumps(cell, sort_keys=True)]
            if lr is None:
                progress.done += 1
                continue
            spec = _spec(cell, lr, seed)
            progress.begin(f"{cell_label(spec, several)} batch="
                           f"{spec.batch_size} {spec.optimizer} lr={lr} "
                           f"seed={seed}")
            record = run.run(spec)
            _log_record(record)
            progress.done += 1
            records.append(record)
    results = summarize(records, grid, several, n)
    results.update(
        name=name, command=common.COMMAND,
        environment=common.environment(),
        dataset={"name": task.name, "num_classes": n,
                 "train_images": int(len(task.train[1])),
                 "val_images": int(len(task.val[1])),
                 "test_images": int(len(task.test[1])),
                 "pretrain_classes": len(task.pretrain_classes)},
        pretrain=run.pretrained(probe).record if probe.protocol != "scratch"
        or any(c["encoding"] in runner_lib.DATA_ENCODINGS for c in cells)
        else None,
        grid={"base": grid.base, "encodings": grid.encodings,
              "code_lengths": grid.code_lengths,
              "normalize_rows": grid.normalize_rows,
              "batch_sizes": grid.batch_sizes,
              "epochs": {str(b): e for b, e in grid.epochs.items()},
              "learning_rates": grid.learning_rates, "seeds": grid.seeds,
              "select_seed": grid.select_seed,
              "lr_overrides": {f"{k[0]}@{k[1]}": v
                               for k, v in overrides.items()}},
        selection=selection,
        wall_time=time.perf_counter() - start)
    results["markdown"] = markdown(results)
    from ecoc_research.experiments import report

    report.write_json(f"{output}/{name}.json", results)
    report.write_text(f"{output}/{name}.md", results["markdown"])
    results["figures"] = write_figures(results, output, name)
    report.write_json(f"{output}/{name}.json", results)
    return results


def _log_record(record):
    if record["status"] != "ok":
        return
    common.log(f"    -> val {record['best_val_accuracy']:.3f} at step "
               f"{record['best_step']}/{record['total_steps']}, test "
               f"{record['test_accuracy']:.3f} ({record['wall_time']:.1f} s)")


def _group_key(spec):
    d = dict(spec)
    for field in ("encoding", "code_length", "normalize_rows",
                  "learning_rate", "seed"):
        d.pop(field)
    return json.dumps(d, sort_keys=True)


def summarize(records, grid, several, num_classes):
    """Comparisons with one-hot, curves with 95% bands, sparsity per group."""
    ok = [r for r in records if r["status"] == "ok"]
    failed = [{"label": cell_label(runner_lib.RunSpec.from_dict(r["spec"]),
                                   several),
               "seed": r["spec"]["seed"],
               "status": r["status"], "error": r.get("error")}
              for r in records if r["status"] != "ok"]
    groups = {}
    for r in ok:
        groups.setdefault(_group_key(r["spec"]), []).append(r)
    summaries = []
    for key, runs in groups.items():
        spec = runs[0]["spec"]
        by_label = {}
        for r in runs:
            label = cell_label(runner_lib.RunSpec.from_dict(r["spec"]),
                               several)
            by_label.setdefault(label, []).append(r)
        comparison = stats.compare_to_reference(by_label, "one_hot",
                                                grid.fraction)
        curves, sparsity = [], []
        for label, rs in by_label.items():
            steps = sorted(set.intersection(*[set(r["steps"]) for r in rs]))
            values = np.array([[dict(zip(r["steps"], r["val_accuracy"]))[s]
                                for s in steps] for r in rs])
            mean = values.mean(0)
            low = high = None
            if len(rs) > 1:
                from scipy import stats as sps

                sem = sps.sem(values, axis=0)
                half = sps.t.ppf(0.975, len(rs) - 1) * sem
                low, high = (mean - half).tolist(), (mean + half).tolist()
            curves.append({"label": label, "steps": steps,
                           "mean": mean.tolist(), "low": low, "high": high})
            fractions = np.array([np.mean(r["sparsity"]["fraction"], axis=0)
                                  for r in rs])
            sparsity.append({
                "label": label, "outputs": rs[0]["outputs"],
                "thresholds": rs[0]["sparsity"]["thresholds"],
                "mean_active_fraction": fractions.mean(0).tolist(),
                "learning_rate": rs[0]["spec"]["learning_rate"]})
        summaries.append({
            "protocol": spec["protocol"], "variant": spec["variant"],
            "optimizer": spec["optimizer"], "batch_size": spec["batch_size"],
            "epochs": spec["epochs"], "classes": spec["classes"],
            "num_classes": runs[0]["num_classes"],
            "learning_rates": {label: rs[0]["spec"]["learning_rate"]
                               for label, rs in by_label.items()},
            "outputs": {label: rs[0]["outputs"]
                        for label, rs in by_label.items()},
            "comparison": comparison, "curves": curves,
            "sparsity": sparsity,
            "total_steps": runs[0]["total_steps"],
            "mean_wall_time": float(np.mean([r["wall_time"] for r in runs])),
        })
    return {"groups": summaries, "failed": failed,
            "runs": [r["key"] for r in records]}


def markdown(results):
    """One table per group: accuracy, steps to target and AUC vs one-hot."""
    parts = []
    for g in results["groups"]:
        c = g["comparison"]
        head = (f"**{g['protocol']}/{g['variant']}, {g['optimizer']}, batch "
                f"{g['batch_size']}, {g['epochs']} epochs "
                f"({g['total_steps']} steps), n = {g['num_classes']}**")
        if c is None:
            parts.append(head + "\n\n(no one-hot reference in this group)")
            continue
        head += (f"; target = {c['fraction']:.0%} of one-hot's mean final "
                 f"validation accuracy = {100 * c['target']:.1f}%")
        rows = []
        sparsity = {s["label"]: s for s in g["sparsity"]}
        for label, row in c["labels"].items():
            diff = row.get("difference", {})
            active = sparsity[label]["mean_active_fraction"]
            rows.append([
                label, g["outputs"][label], g["learning_rates"][label],
                row["n"],
                stats.format_mean_ci(row["test_accuracy"]),
                stats.format_interval(diff.get("test_accuracy")),
                f"{stats.format_mean_ci(row['steps_to_target'], 1, 0)} "
                f"({row['reached']}/{row['n']})",
                stats.format_interval(diff.get("steps_to_target"), 1, 0),
                stats.format_mean_ci(row["auc"]),
                stats.format_interval(diff.get("auc")),
                f"{100 * active[0]:.0f}",
            ])
        from ecoc_research.experiments import report

        parts.append(head + "\n\n" + report.markdown_table(
            ["encoding", "outputs", "lr", "seeds", "test acc % (best val)",
             "Δ vs one-hot", "steps to target (reached)", "Δ steps",
             "val AUC %", "Δ AUC", "active rows %"], rows))
    if results.get("failed"):
        parts.append("Not trained: " + "; ".join(
            f"{f['label']} seed {f['seed']} ({f['status']})"
            for f in results["failed"]))
    parts.append(
        "Means ± half-width of the 95% t-interval over seeds; Δ = paired "
        "difference to one-hot (same seed: same fc7 initialisation and "
        "batch order), mean [95% t-interval]; runs that never reach the "
        "target count with the step budget (censored). 'active rows' = mean "
        "fraction of output units whose weight-gradient norm exceeds 1e-3 x "
        "the largest, over the sampled steps.")
    return "\n\n".join(parts)


def write_figures(results, output, name):
    """Validation curves with 95% bands; active output rows vs batch size."""
    from ecoc_research.experiments import plots

    panels = []
    for g in results["groups"]:
        title = (f"{g['optimizer']} batch {g['batch_size']} "
                 f"(n = {g['num_classes']})")
        panels.append((title, [(c["label"], c["steps"], c["mean"], c["low"],
                                c["high"]) for c in g["curves"]]))
    files = [plots.band_panels(
        f"{output}/{name}_curves.png", panels,
        f"{name}: validation accuracy, mean and 95% band over seeds")]
    by_label = {}
    for g in results["groups"]:
        for s in g["sparsity"]:
            # The largest threshold (0.1 x the largest row) separates the
            # encodings best: at 1e-3 almost every row counts as active.
            by_label.setdefault((g["optimizer"], s["label"]), []).append(
                (g["batch_size"], s["mean_active_fraction"][-1],
                 s["thresholds"][-1]))
    if len({g["batch_size"] for g in results["groups"]}) > 1:
        series = []
        for (optimizer, label), points in sorted(by_label.items()):
            points.sort()
            series.append((f"{label} ({optimizer})", [p[0] for p in points],
                           [p[1] for p in points], None))
        threshold = next(iter(by_label.values()))[0][2]
        files.append(plots.lines(
            f"{output}/{name}_sparsity.png", series,
            f"{name}: output rows with gradient norm > {threshold:g} x "
            "the largest row's", "batch size",
            ylabel="mean fraction of active rows", logx=True))
    return files
