"""Add-bits on CUB-50 from a pretrained backbone (the paper's CUB figure).

The paper fine-tunes an ImageNet network on CUB-200 and finds that
data-based codes with about a quarter of the bits match one-hot. Nothing
pretrained can be downloaded offline, so the backbone is pretrained one-hot
on another data set (CIFAR-10 by default, whose classes are disjoint from
the birds: the runner's "external" variant), then every encoding trains
through the shared runner (`runner.RunSpec`, `grid.run_grid`):

- protocol "retrain": fc7 + fc8 re-initialised and trained on the frozen
  fc6 features; protocol "finetune" (the paper's): the whole network,
  pretrained conv blocks and fc6, fc7 + fc8 re-initialised;
- SGD momentum 0.9, 30 epochs, rate / 10 after 15 (the paper's schedule),
  fixed decoding scale 1 by default;
- one validation split rule (`protocols.validation_split`), the learning
  rate chosen on it with a selection seed that is NOT a reported seed, the
  reported seeds paired across encodings (same fc7 / fc8 initialisation,
  same batch order);
- codes from `keras_ecoc.codes.make_codes`; data-based codes take their
  class similarity from the pretrained fc7 activations of the CUB training
  images (validation excluded);
- two imprinted one-hot controls: fc8 imprinted from the re-initialised fc7
  ("one_hot_imprinted") and from the PRETRAINED fc7, which also starts fc7
  ("one_hot_imprinted_pretrained": the information the spectral code uses);
- statistics from `stats`: means with 95% t-intervals, paired differences
  to one-hot with TOST (margin +-1 point) for "matches one-hot", raw and
  Holm-adjusted p-values, and the paired data-based code minus control rows.

Every run is stored under `<output>/runs/<key>.json` as it finishes.
"""

import json
import os
import time

import numpy as np

from ecoc_research.experiments import grid as grid_lib
from ecoc_research.experiments import protocols
from ecoc_research.experiments import runner as runner_lib
from ecoc_research.experiments import stats

# Pretraining: 32 px because one epoch of CIFAR-10 costs ~47 s at 32 px and
# ~400 s at 64 px on the 2-core CPU these runs were made on (measured, batch
# 64, uncontended), and the pretraining budget is about 12 minutes.
IMAGE_SIZE = 32
PRETRAIN = {"pretrain_epochs": 6, "pretrain_batch_size": 64,
            "pretrain_learning_rate": 1e-3,
            # Patience = epochs: all epochs run; the best validation epoch
            # is kept.
            "pretrain_patience": 6}
VAL_PER_CLASS = 5
EPOCHS = 30
LR_DROP_EPOCHS = (15,)
BATCH_SIZE = 32
LEARNING_RATES = {"retrain": (0.003, 0.01, 0.03, 0.1),
                  "finetune": (0.001, 0.003, 0.01)}
CODE_LENGTHS = (4, 8, 12, 16, 25, 49)
ENCODINGS = ("one_hot", "one_hot_imprinted", "one_hot_imprinted_pretrained",
             "spectral", "spectral_zero", "spectral_median", "gaussian",
             "dense_random")
CONTROLS = ("one_hot_imprinted", "one_hot_imprinted_pretrained")
SEEDS = (0, 1, 2, 3, 4)
SELECT_SEED = 100
PROTOCOLS = ("retrain", "finetune")


def cub_grid(dataset, pretrain_dataset, protocol="retrain",
             encodings=ENCODINGS, code_lengths=CODE_LENGTHS, seeds=SEEDS,
             select_seed=SELECT_SEED, learning_rates=None, epochs=EPOCHS,
             lr_drop_epochs=None, batch_size=BATCH_SIZE,
             image_size=IMAGE_SIZE, val_per_class=VAL_PER_CLASS,
             pretrain=None, pretrain_per_class=None, scale=1.0,
             learnable_scale=False, evals_per_epoch=1, hidden=256,
             classes=None, train_per_class=None, test_per_class=None):
    """The `grid.Grid` of the CUB protocol.

    Args:
        dataset: the retraining data (a CUB `.npz`).
        pretrain_dataset: the pretraining data (e.g. CIFAR-10 `.npz`).
        protocol: "retrain" (frozen fc6 features) or "finetune" (whole
            network).
        encodings: names of `runner.ENCODINGS`; one-hot is always added (it
            is the reference of the comparisons).
        code_lengths: k of the ECOC encodings (tokens of
            `grid.parse_code_length`: 12, "0.25n", "n-1").
        seeds: reported seeds (>= 2), paired across encodings.
        select_seed: seed of the learning-rate selection runs; it must not
            be a reported seed.
        learning_rates: the rate grid (default `LEARNING_RATES[protocol]`).
        epochs: training epochs; lr_drop_epochs: epochs after which the rate
            is divided by 10 (default: half of `epochs`).
        batch_size, image_size, val_per_class, hidden: as `runner.RunSpec`.
        pretrain: dict of `RunSpec` pretraining fields (default `PRETRAIN`).
        pretrain_per_class: cap of pretraining images per class (smoke).
        scale, learnable_scale: ECOC decoding scale (default fixed 1).
        evals_per_epoch: validation points per epoch.
        classes, train_per_class, test_per_class: CUB subsets (smoke).

    Returns:
        A `grid.Grid`.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"Argument `protocol` must be one of {PROTOCOLS}. "
                         f"Received: protocol={protocol!r}")
    seeds = [int(s) for s in seeds]
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ValueError(
            "Argument `seeds` must list at least 2 distinct paired seeds for "
            f"the statistics. Received: seeds={seeds}")
    if int(select_seed) in seeds:
        raise ValueError(
            "Argument `select_seed` must not be a reported seed (the rate is "
            "chosen with it). Received: "
            f"select_seed={select_seed} with seeds={seeds}")
    unknown = sorted(set(encodings) - set(runner_lib.ENCODINGS))
    if unknown:
        raise ValueError(
            f"Argument `encodings` must be among {runner_lib.ENCODINGS}. "
            f"Received unknown encodings {unknown}")
    if not code_lengths:
        raise ValueError("Argument `code_lengths` must list at least one k. "
                         f"Received: code_lengths={code_lengths!r}")
    for k in code_lengths:
        grid_lib.parse_code_length(k, 2)  # Raises on a bad token.
    rates = list(learning_rates or LEARNING_RATES[protocol])
    if any(not isinstance(r, (int, float)) or not r > 0 for r in rates):
        raise ValueError(
            "Argument `learning_rates` must list positive floats. Received: "
            f"learning_rates={learning_rates!r}")
    if lr_drop_epochs is None:
        lr_drop_epochs = (int(epochs) // 2,) if int(epochs) >= 2 else ()
    base = dict(
        dataset=dataset, image_size=int(image_size), classes=classes,
        train_per_class=train_per_class, test_per_class=test_per_class,
        val_per_class=int(val_per_class), protocol=protocol,
        variant="external", pretrain_dataset=pretrain_dataset,
        pretrain_per_class=pretrain_per_class, hidden=int(hidden),
        scale=float(scale), learnable_scale=bool(learnable_scale),
        optimizer="sgd", momentum=0.9,
        lr_drop_epochs=tuple(int(e) for e in lr_drop_epochs),
        evals_per_epoch=int(evals_per_epoch), **(pretrain or PRETRAIN))
    # Every field is checked once here, before anything is loaded.
    runner_lib.RunSpec(**base)
    encodings = ["one_hot"] + [e for e in encodings if e != "one_hot"]
    return grid_lib.Grid(
        base=base, encodings=encodings,
        code_lengths=[str(k) for k in code_lengths], normalize_rows=[True],
        batch_sizes=[int(batch_size)], epochs={int(batch_size): int(epochs)},
        learning_rates=[float(r) for r in rates], seeds=seeds,
        select_seed=int(select_seed))


def run_cub_bits(grid, output, name="cub_bits",
                 margin=stats.EQUIVALENCE_MARGIN, resume=False, verbose=0,
                 chance_multiple=None, jit_compile=None):
    """Runs a `cub_grid` and writes the CUB tables next to the grid's.

    Args:
        grid: a `grid.Grid` from `cub_grid`.
        output: the output folder (prepared with `runner.prepare_output`).
        name: stem of `<name>.json`, `<name>.md`, `<name>.png`.
        margin: equivalence margin of TOST, in accuracy points.
        resume: reuse stored runs whose settings all match.
        verbose: Keras verbosity.
        chance_multiple: see `grid.run_grid`.
        jit_compile: XLA for the training steps (None: on for "finetune",
            one compilation for a whole CNN trained ~1,000 steps; off for
            the small heads of "retrain", where the runner measured that
            compilation costs more than it saves).

    Returns:
        The grid's results dict with "cub" (`summarize_cub`), "markdown" and
        "files" added.
    """
    start = time.perf_counter()
    if jit_compile is None:
        jit_compile = grid.base["protocol"] == "finetune"
    results = grid_lib.run_grid(grid, output, name, resume=resume,
                                verbose=verbose,
                                chance_multiple=chance_multiple,
                                jit_compile=jit_compile)
    records = []
    for key in results["runs"]:
        with open(os.path.join(output, "runs", f"{key}.json")) as f:
            records.append(json.load(f))
    results["cub"] = summarize_cub(records, margin)
    results["markdown"] = cub_markdown(results) + "\n\n" + \
        results["markdown"]
    results["wall_time"] = time.perf_counter() - start
    results["files"] = _write(results, output, name) + results.get(
        "figures", [])
    return results


def _label(spec):
    s = runner_lib.RunSpec.from_dict(spec)
    return s.label if s.code_length is None else f"{s.label} k={s.code_length}"


def summarize_cub(records, margin=stats.EQUIVALENCE_MARGIN):
    """Test accuracy per encoding, paired differences, TOST and Holm.

    Args:
        records: the reported runs (`Runner.run` records; runs that could not
            train, e.g. no code of that length, are listed, not compared).
        margin: TOST margin in accuracy points.

    Returns:
        dict: "rows" (per label: encoding, code_length, learning_rate, seeds,
        test accuracies, mean / 95% CI in %, and against one-hot: the paired
        difference in points with its 95% CI, raw two-sided p, Holm-adjusted
        p over the family of all comparisons with one-hot, TOST p and its
        Holm-adjusted value, verdict), "controls" (data-based code minus
        each imprinted control, paired, raw and Holm p over that family),
        "not_trained" and "margin".
    """
    by_label, not_trained = {}, []
    for r in records:
        if r["status"] != "ok":
            not_trained.append({"label": _label(r["spec"]),
                                "status": r["status"],
                                "error": r.get("error")})
            continue
        by_label.setdefault(_label(r["spec"]), []).append(r)
    rows = []
    # One run per seed and arm (stats.runs_by_seed raises on a second one).
    accuracy = {label: {seed: 100.0 * r["test_accuracy"]
                        for seed, r in stats.runs_by_seed(runs, label).items()}
                for label, runs in by_label.items()}
    for label, runs in by_label.items():
        spec = runs[0]["spec"]
        mean, low, high = stats.t_interval(list(accuracy[label].values()))
        rows.append({"label": label, "encoding": spec["encoding"],
                     "code_length": spec["code_length"],
                     "outputs": runs[0]["outputs"],
                     "learning_rate": spec["learning_rate"],
                     "seeds": sorted(accuracy[label]),
                     "test_accuracy": [accuracy[label][s]
                                       for s in sorted(accuracy[label])],
                     "mean": mean, "ci95": [low, high]})
    reference = accuracy.get("one_hot")
    compared = []
    if reference is not None:
        for row in rows:
            if row["label"] == "one_hot":
                continue
            test = _paired(accuracy[row["label"]], reference, margin)
            if test is not None:
                row["vs_one_hot"] = test
                compared.append(row)
    for key in ("p_difference", "p_tost"):
        adjusted = stats.holm([r["vs_one_hot"][key] for r in compared])
        for row, p in zip(compared, adjusted):
            row["vs_one_hot"][f"{key}_holm"] = p
    for row in compared:
        row["vs_one_hot"]["verdict"] = _verdict(row["vs_one_hot"])
    controls = []
    for row in rows:
        if row["encoding"] not in runner_lib.DATA_ENCODINGS:
            continue
        for control in CONTROLS:
            if control not in accuracy:
                continue
            test = _paired(accuracy[row["label"]], accuracy[control], margin)
            if test is not None:
                controls.append({"label": row["label"], "control": control,
                                 **test})
    for p, row in zip(stats.holm([c["p_difference"] for c in controls]),
                      controls):
        row["p_difference_holm"] = p
    return {"rows": rows, "controls": controls, "not_trained": not_trained,
            "margin": float(margin)}


def _paired(values, reference, margin):
    """TOST and paired t-test of values - reference (points), common seeds."""
    seeds = sorted(set(values) & set(reference))
    if len(seeds) < 2:
        return None
    d = [values[s] - reference[s] for s in seeds]
    return {"seeds": seeds, "differences": d,
            **stats.paired_equivalence(d, margin)}


def _verdict(test, alpha=0.05):
    """A verdict that holds after Holm (both adjusted p-values)."""
    m = test["margin"]
    if test["p_tost_holm"] is not None and test["p_tost_holm"] < alpha:
        return f"matches one-hot (TOST ±{m:g} pt, Holm)"
    if test["p_difference_holm"] is not None and \
            test["p_difference_holm"] < alpha:
        return "above one-hot" if test["mean"] > 0 else "below one-hot"
    return "inconclusive"


def _fmt_p(p):
    if p is None:
        return "–"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def cub_markdown(results):
    """The CUB tables: accuracy per encoding, vs one-hot, vs the controls."""
    from ecoc_research.experiments import report

    cub = results["cub"]
    g = results["grid"]
    base = g["base"]
    pre = results.get("pretrain") or {}
    d = results["dataset"]
    what = ("the whole network fine-tuned (pretrained conv blocks and fc6, "
            "fc7 + fc8 re-initialised)" if base["protocol"] == "finetune"
            else "fc7 + fc8 re-initialised and trained on frozen fc6 "
            "features")
    scale = (f"learnable decoding scale from {base['scale']:g}"
             if base["learnable_scale"] else
             f"fixed decoding scale {base['scale']:g}")
    best = pre.get("best_val_accuracy")
    text = (
        f"**CUB, {base['protocol']}**: {what}; backbone pretrained one-hot on "
        f"{base['pretrain_dataset']} ({base['image_size']} px, "
        f"{pre.get('epochs_run', '?')} epochs, best pretraining validation "
        f"accuracy {'?' if best is None else f'{100 * best:.1f}%'}). "
        f"{d['train_images']} training / {d['val_images']} validation / "
        f"{d['test_images']} test images of {d['num_classes']} classes. "
        f"SGD momentum {base['momentum']}, batch {g['batch_sizes'][0]}, "
        f"{list(g['epochs'].values())[0]} epochs, rate / 10 after epoch(s) "
        f"{base['lr_drop_epochs']}; {scale}; rate chosen from "
        f"{g['learning_rates']} on the validation split with seed "
        f"{g['select_seed']} (not reported); reported seeds {g['seeds']}, "
        "paired. Test accuracy at the best validation point. Mean [95% "
        "t-CI] in %; differences in points, paired by seed; p: two-sided "
        "paired t-test, Holm over the table's family; TOST margin "
        f"±{cub['margin']:g} point.\n\n")
    rows = []
    for r in cub["rows"]:
        t = r.get("vs_one_hot")
        cells = [r["label"], r["outputs"], f"{r['learning_rate']:g}",
                 _mean_ci(r["mean"], r["ci95"])]
        if t is None:
            cells += ["reference", "", "", "", ""]
        else:
            cells += [_mean_ci(t["mean"], t["ci95"], signed=True),
                      f"{_fmt_p(t['p_difference'])} / "
                      f"{_fmt_p(t['p_difference_holm'])}",
                      f"{_fmt_p(t['p_tost'])} / {_fmt_p(t['p_tost_holm'])}",
                      t["verdict"], ""]
        rows.append(cells[:8])
    text += report.markdown_table(
        ["encoding", "outputs", "lr", "test acc. %", "minus one-hot (pt)",
         "p raw / Holm", "p TOST raw / Holm", "verdict"], rows)
    if cub["controls"]:
        text += ("\n\nData-based codes minus the imprinted one-hot controls "
                 "(paired, points; Holm over this table):\n\n")
        text += report.markdown_table(
            ["code", "control", "difference (pt)", "p raw / Holm"],
            [[c["label"], c["control"],
              _mean_ci(c["mean"], c["ci95"], signed=True),
              f"{_fmt_p(c['p_difference'])} / "
              f"{_fmt_p(c['p_difference_holm'])}"]
             for c in cub["controls"]])
    if cub["not_trained"]:
        seen = {}
        for r in cub["not_trained"]:
            seen.setdefault(r["label"], r)
        text += "\n\nNot trained (no admissible code): " + "; ".join(
            f"{label} ({r['error']})" for label, r in seen.items()) + "."
    return text


def _mean_ci(mean, ci, signed=False):
    sign = "+" if signed else ""
    if ci is None or ci[0] is None:
        return f"{mean:{sign}.1f}"
    return f"{mean:{sign}.1f} [{ci[0]:{sign}.1f}, {ci[1]:{sign}.1f}]"


def _write(results, output, name):
    """`<name>.png` (accuracy against k), `<name>.md`, `<name>.json`."""
    from matplotlib.figure import Figure

    from ecoc_research.experiments import report

    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.subplots()
    rows = results["cub"]["rows"]
    for encoding in dict.fromkeys(r["encoding"] for r in rows):
        series = sorted((r for r in rows if r["encoding"] == encoding),
                        key=lambda r: r["code_length"] or 0)
        if series[0]["code_length"] is None:
            r = series[0]
            line = ax.axhline(r["mean"], linestyle="--" if encoding !=
                              "one_hot" else "-", label=encoding,
                              color="black" if encoding == "one_hot"
                              else None)
            if r["ci95"][0] is not None:
                ax.axhspan(r["ci95"][0], r["ci95"][1], alpha=0.08,
                           color=line.get_color())
            continue
        ks = [r["code_length"] for r in series]
        line, = ax.plot(ks, [r["mean"] for r in series], marker="o",
                        label=encoding)
        if all(r["ci95"][0] is not None for r in series):
            ax.fill_between(ks, [r["ci95"][0] for r in series],
                            [r["ci95"][1] for r in series], alpha=0.15,
                            color=line.get_color())
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bits k")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"CUB, {results['grid']['base']['protocol']} "
                 "(mean, 95% CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return report.write_summary(fig, results, output, name)


def pretrained_similarity(dataset, pretrain_dataset, output,
                          image_size=IMAGE_SIZE, val_per_class=VAL_PER_CLASS,
                          pretrain=None, pretrain_per_class=None,
                          chance_multiple=None, verbose=0, classes=None,
                          train_per_class=None, test_per_class=None):
    """Class similarity of the CUB classes from the runner's pretrained fc7.

    The same pretrained network (and cache, `<output>/pretrain/`) as
    `cub_grid`'s runs with these settings, and the same rule as data-based
    codes: cosine similarity of the class means of the pretrained fc7
    activations of the training images (validation split excluded).
    `classes` keeps so many classes drawn as `cub_grid` draws them: the
    returned task's `class_names` say which, in the similarity's order.

    Returns:
        (similarity (n, n) float64, pretraining record, task).
    """
    spec = runner_lib.RunSpec(**cub_grid(
        dataset, pretrain_dataset, image_size=image_size,
        val_per_class=val_per_class, pretrain=pretrain,
        pretrain_per_class=pretrain_per_class, classes=classes,
        train_per_class=train_per_class, test_per_class=test_per_class).base)
    run = runner_lib.Runner(
        output, resume=True, verbose=verbose,
        chance_multiple=(protocols.CHANCE_MULTIPLE if chance_multiple is None
                         else chance_multiple))
    return (np.asarray(run.similarity(spec), np.float64),
            run.pretrained(spec).record, run.task(spec))
