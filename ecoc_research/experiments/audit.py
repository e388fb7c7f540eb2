"""The statistics audit of stored grid results: Holm, TOST, imprinted rows.

Recomputes, from the stored runs alone (`runs.jsonl`, one record per run,
and the `<experiment>.json` summaries that list each experiment's runs),
every paired comparison the grid reports and adds what the first reports
lacked:

- the two-sided paired t-test p-value of every difference, and its Holm
  adjustment over the whole family of paired tests in the folder (every
  encoding against one-hot, every metric, every experiment, plus the rows
  below), so that a verdict survives only if its adjusted p <= 0.05;
- the TOST equivalence test (margin `stats.EQUIVALENCE_MARGIN` points) of
  every test-accuracy difference, the test behind an "equal accuracy";
- paired spectral minus imprinted one-hot rows: the data-based head against
  a one-hot head initialised from the class means of the same features, for
  every group with a spectral head. Where the experiment did not train the
  imprinted head itself (E5, E6), its runs come from another experiment with
  the same pairing settings (variant, classes, optimizer, batch, budget, data
  and pretraining): same seed = same fc7 initialisation and batch order.
- a group that trained random, thresholded or raw-row heads alone (the
  E1 replicate's second grid) borrows the one-hot and the normalised spectral
  runs of the same folder with the same pairing settings and adds, besides
  each head against one-hot, each head against the spectral head.
- a group that trained the spectral head alone (the E1 control grid, run on
  the backbone of an earlier replicate) borrows every reference head, one-hot
  and both imprinted controls, from the runs of the same folder with the same
  pairing settings. The one-hot heads never read the ECOC scale, so a
  fixed-scale one-hot run is the same computation as a learnable-scale one.
  This needs one backbone per pretraining key in a folder: keep a re-
  pretrained network's runs in their own folder.

Steps to target always use the one-hot target of the group (90% of one-hot's
mean final validation accuracy), so that they mean the same in both rows.
It also checks that the recomputed means equal the stored summaries.

    python -m ecoc_research.experiments.audit docs/results/omniglot

writes `audit.json` and `audit.md` into that folder.
"""

import argparse
import glob
import json
import os

import numpy as np

from ecoc_research.experiments import stats

METRICS = ("test_accuracy", "steps_to_target", "auc")
# Fields that may differ between two runs that are paired by seed: the head
# (encoding, code, its scale and rate) and the seed itself.
HEAD_FIELDS = ("encoding", "code_length", "normalize_rows", "learning_rate",
               "seed", "scale", "learnable_scale")
SPECTRAL = "spectral_norm"
# Accuracy differences are compared with the stored summaries to this (a
# hundredth of a point); steps to target exactly up to it.
ROUNDING_TOLERANCE = 1e-4
IMPRINTED = "one_hot_imprinted"
IMPRINTED_PRETRAINED = "one_hot_imprinted_pretrained"
# Heads whose code is random, a thresholded spectral code or the spectral code
# with raw (unequal-norm) rows: a grid of these alone is compared with the
# folder's one-hot and spectral_norm runs.
OTHER_CODES = frozenset({
    "gaussian_norm", "gaussian_raw", "dense_random", "spectral_zero",
    "spectral_median", "spectral_raw"})


def load_runs(folder):
    """dict key -> run record of `<folder>/runs.jsonl`."""
    runs = {}
    with open(os.path.join(folder, "runs.jsonl")) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                runs[record["key"]] = record
    return runs


def _pairing_key(spec):
    return json.dumps({k: v for k, v in spec.items() if k not in HEAD_FIELDS},
                      sort_keys=True)


def _group_key(spec):
    # As the grid groups runs: everything but the head and the seed; the
    # scale stays (a fixed-scale group is not a learnable-scale group).
    drop = ("encoding", "code_length", "normalize_rows", "learning_rate", "seed")
    return json.dumps({k: v for k, v in spec.items() if k not in drop},
                      sort_keys=True)


def _label(record, several_lengths):
    k = record["spec"]["code_length"]
    if several_lengths and k is not None:
        return f"{record['label']} k={k}"
    return record["label"]


def _imprinted_runs(runs, spec, seeds, encoding=IMPRINTED, label=None,
                    same_scale=False):
    """The `encoding` runs pairing with `spec` on `seeds`, one per seed.

    Among runs of that head with the same pairing settings (and, if given,
    the same `label`: 'spectral_norm', not 'spectral_raw'; with
    `same_scale`, the same ECOC scale setting as `spec`: an ECOC reference
    reads it), takes the learning rate that covers the most of `seeds` (its
    grid's chosen rate).
    """
    key = _pairing_key(spec)
    runs_by_rate = {}
    for r in runs.values():
        if (r["status"] == "ok" and r["spec"]["encoding"] == encoding
                and (label is None or r["label"] == label)
                and (not same_scale or (
                    r["spec"]["learnable_scale"] == spec["learnable_scale"]
                    and r["spec"]["scale"] == spec["scale"]))
                and r["spec"]["seed"] in seeds
                and _pairing_key(r["spec"]) == key):
            runs_by_rate.setdefault(r["spec"]["learning_rate"], []).append(r)
    if not runs_by_rate:
        return None, {}
    by_rate = {lr: stats.runs_by_seed(rs, f"{encoding} at lr {lr:g}")
               for lr, rs in runs_by_rate.items()}
    rate = max(by_rate, key=lambda lr: (len(by_rate[lr]), -lr))
    return rate, by_rate[rate]


def _rows_of_group(name, runs_of_group, all_runs, several):
    by_label = {}
    for r in runs_of_group:
        by_label.setdefault(_label(r, several), []).append(r)
    borrowed_from = {}
    if "one_hot" not in by_label and SPECTRAL in by_label:
        # A spectral-only grid: its references are the one-hot heads
        # already trained in this folder on the same backbone and seeds.
        seeds = {r["spec"]["seed"] for r in by_label[SPECTRAL]}
        for encoding in ("one_hot", IMPRINTED, IMPRINTED_PRETRAINED):
            _, borrowed = _imprinted_runs(all_runs, runs_of_group[0]["spec"],
                                          seeds, encoding)
            if len(borrowed) >= 2:
                by_label[encoding] = list(borrowed.values())
                borrowed_from[encoding] = ("other experiment (same pairing "
                                           "settings)")
    against_spectral = None
    if ("one_hot" not in by_label and SPECTRAL not in by_label
            and set(by_label) <= OTHER_CODES):
        # A grid of random, thresholded or raw-row heads alone (the E1
        # replicate's second grid): its references are the one-hot and the normalised
        # spectral heads already trained in this folder on the same
        # backbone, seeds and scale setting. The spectral rows answer "does
        # the data-based code beat the random (thresholded) one?" directly.
        seeds = {r["spec"]["seed"] for rs in by_label.values() for r in rs}
        spec = runs_of_group[0]["spec"]
        _, one_hot = _imprinted_runs(all_runs, spec, seeds, "one_hot")
        _, spectral = _imprinted_runs(all_runs, spec, seeds, "spectral",
                                      label=SPECTRAL, same_scale=True)
        if len(one_hot) >= 2:
            by_label["one_hot"] = list(one_hot.values())
            borrowed_from["one_hot"] = ("other experiment (same pairing "
                                        "settings)")
        if len(spectral) >= 2:
            against_spectral = spectral
    if "one_hot" not in by_label:
        return [], None
    comparison = stats.compare_to_reference(by_label, "one_hot")
    target = comparison["target"]
    spec = runs_of_group[0]["spec"]
    where = {"experiment": name, "variant": spec["variant"],
             "num_classes": runs_of_group[0]["num_classes"],
             "optimizer": spec["optimizer"], "batch_size": spec["batch_size"],
             "scale": None if spec["learnable_scale"] else spec["scale"]}
    rows = []
    for label, row in comparison["labels"].items():
        for metric, diff in row.get("difference", {}).items():
            rows.append(dict(where, label=label, reference="one_hot",
                             metric=metric, **_diff_fields(diff)))
            if borrowed_from:
                rows[-1]["borrowed"] = sorted(
                    e for e in borrowed_from if e in (label, "one_hot"))
    if against_spectral is not None:
        for label in sorted(set(by_label) - {"one_hot"}):
            runs_of_label = stats.runs_by_seed(by_label[label], label)
            if len(set(runs_of_label) & set(against_spectral)) < 2:
                continue
            for metric, diff in _paired_metric_differences(
                    runs_of_label, against_spectral, target):
                rows.append(dict(where, label=label, reference=SPECTRAL,
                                 metric=metric, borrowed=[SPECTRAL],
                                 **_diff_fields(diff)))
    if SPECTRAL in by_label:
        spectral = stats.runs_by_seed(by_label[SPECTRAL], SPECTRAL)
        controls = []
        if IMPRINTED in by_label:
            controls.append((IMPRINTED, borrowed_from.get(IMPRINTED, name),
                             by_label[IMPRINTED]))
        else:
            # Older experiments ran the imprinted head once (E1) and reused
            # it: borrow the runs with the same pairing settings.
            _, borrowed = _imprinted_runs(all_runs, spec, set(spectral))
            controls.append((IMPRINTED,
                             "other experiment (same pairing settings)",
                             list(borrowed.values())))
        if IMPRINTED_PRETRAINED in by_label:
            # The second control: fc8 imprinted from the pretrained fc7,
            # the features the spectral code itself comes from. Borrowed
            # only by a spectral-only group (above), never by a group that
            # trained its own one-hot head.
            controls.append((IMPRINTED_PRETRAINED,
                             borrowed_from.get(IMPRINTED_PRETRAINED, name),
                             by_label[IMPRINTED_PRETRAINED]))
        for control, source, control_runs in controls:
            reference = stats.runs_by_seed(control_runs, control)
            if len(set(spectral) & set(reference)) < 2:
                continue
            for metric, diff in _paired_metric_differences(
                    spectral, reference, target):
                rows.append(dict(where, label=SPECTRAL, reference=control,
                                 metric=metric, imprinted_from=source,
                                 **_diff_fields(diff)))
    return rows, comparison


def _paired_metric_differences(runs, reference_runs, target):
    """(metric, paired difference) of `runs` minus `reference_runs`.

    Both are {seed: run record}; the metrics of each run (steps to `target`
    among them) are computed once, not once per metric.
    """
    a = {s: stats.run_metrics(r, target) for s, r in runs.items()}
    b = {s: stats.run_metrics(r, target) for s, r in reference_runs.items()}
    for metric in METRICS:
        yield metric, stats.paired_difference(
            {s: m[metric] for s, m in a.items()},
            {s: m[metric] for s, m in b.items()})


def _diff_fields(diff):
    return {"n": diff["n"], "mean": diff["mean"], "low": diff["low"],
            "high": diff["high"], "p": diff["p"], "no_spread": diff["no_spread"],
            "seeds": diff["seeds"],
            "differences": diff["differences"]}


def audit(folder, margin=stats.EQUIVALENCE_MARGIN):
    """Every paired comparison of the grid summaries in `folder`, audited.

    Returns:
        dict: rows (one per experiment x group x label x reference x
        metric: n, mean, low, high, p, p_holm, and for test accuracy the
        TOST result in points), family_size, margin, mismatches (stored
        summary means that the recomputation does not reproduce).
    """
    all_runs = load_runs(folder)
    rows, mismatches = [], []
    for path in sorted(glob.glob(os.path.join(folder, "e*.json"))):
        name = os.path.splitext(os.path.basename(path))[0]
        with open(path) as f:
            summary = json.load(f)
        records = [all_runs[k] for k in summary["runs"]
                   if k in all_runs and all_runs[k]["status"] == "ok"]
        several = len({r["spec"]["code_length"] for r in records
                       if r["spec"]["code_length"] is not None}) > 1
        groups = {}
        for r in records:
            groups.setdefault(_group_key(r["spec"]), []).append(r)
        stored = {(g["batch_size"], g["optimizer"]): g["comparison"]
                  for g in summary["groups"]}
        for runs_of_group in groups.values():
            new_rows, comparison = _rows_of_group(name, runs_of_group,
                                                  all_runs, several)
            rows.extend(new_rows)
            spec = runs_of_group[0]["spec"]
            old = stored.get((spec["batch_size"], spec["optimizer"]))
            mismatches.extend(_check_stored(name, spec, old, comparison))
    _add_holm_and_tost(rows, margin)
    return {"folder": folder, "margin": margin, "family_size": len(rows),
            "rows": rows, "mismatches": mismatches}


def _check_stored(name, spec, old, new):
    if old is None or new is None:
        return []
    out = []
    for label, row in new["labels"].items():
        for metric, diff in row.get("difference", {}).items():
            stored = old["labels"].get(label, {}).get("difference", {}).get(
                metric)
            if stored is None or stored["mean"] is None:
                continue
            # runs.jsonl rounds each run's accuracies (6 decimals): a
            # mean difference may move by a few 1e-6.
            if not np.isclose(stored["mean"], diff["mean"], rtol=0,
                              atol=ROUNDING_TOLERANCE):
                out.append({"experiment": name,
                            "batch_size": spec["batch_size"],
                            "label": label, "metric": metric,
                            "stored": stored["mean"], "recomputed": diff["mean"]})
    return out


def _add_holm_and_tost(rows, margin):
    for row, p_holm in zip(rows, stats.holm([r["p"] for r in rows])):
        row["p_holm"] = p_holm
        if row["metric"] == "test_accuracy" and row["n"] >= 2:
            test = stats.paired_equivalence(
                100.0 * np.asarray(row["differences"]), margin)
            row["tost"] = {
                "p_tost": test["p_tost"], "equivalent": test["equivalent"],
                "ci90": test["ci90"],
                "verdict": stats.equivalence_verdict(
                    test, row["reference"].replace("_", " "))}


def _fmt(row, value):
    if value is None:
        return "–"
    if row["metric"] == "steps_to_target":
        return f"{value:+.0f}"
    return f"{100 * value:+.1f}"


def _p(value):
    if value is None:
        return "–"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def markdown(result):
    """Tables of the audit, one per experiment, and the reading notes."""
    metric_names = {"test_accuracy": "test acc (points)",
                    "steps_to_target": "steps to target",
                    "auc": "val AUC (points)"}
    parts = [
        f"Paired differences recomputed from `runs.jsonl`: mean [95% "
        f"t-interval], two-sided paired t-test p, and p adjusted by Holm's "
        f"method over the whole family of {result['family_size']} paired "
        f"tests below (a difference holds at the 5% level only if p Holm "
        f"<= 0.05). TOST: equivalence of test accuracy within "
        f"±{result['margin']:g} point (90% interval inside the margin). "
        f"Steps to target: to 90% of one-hot's mean final validation "
        f"accuracy, censored at the budget. Stored summaries reproduced: "
        f"{'all' if not result['mismatches'] else 'NOT all'} "
        f"({len(result['mismatches'])} mismatches beyond "
        f"{ROUNDING_TOLERANCE:g})."]
    by_experiment = {}
    for row in result["rows"]:
        by_experiment.setdefault(row["experiment"], []).append(row)
    from ecoc_research.experiments import report

    for name, rows in by_experiment.items():
        table = []
        for row in rows:
            tost = row.get("tost")
            table.append([
                f"{row['variant']}, n = {row['num_classes']}, "
                f"{row['optimizer']} b{row['batch_size']}"
                + (f", s = {row['scale']:g}" if row["scale"] else ""),
                f"{row['label']} − {row['reference']}",
                metric_names[row["metric"]], row["n"],
                f"{_fmt(row, row['mean'])} (all {row['n']} equal)"
                if row.get("no_spread") else
                f"{_fmt(row, row['mean'])} [{_fmt(row, row['low'])}, "
                f"{_fmt(row, row['high'])}]",
                _p(row["p"]), _p(row["p_holm"]),
                "" if not tost else f"{_p(tost['p_tost'])}: {tost['verdict']}",
            ])
        parts.append(f"### {name}\n\n" + report.markdown_table(
            ["group", "difference", "metric", "seeds", "mean [95% CI]", "p",
             "p Holm", "TOST ±1 pt"], table))
    return "\n\n".join(parts) + "\n"


def audit_cub(path):
    """Holm over a cub-bits summary's paired tests (`<name>.json`).

    Two families, each adjusted on its own: the two-sided paired t-tests of
    every code against one-hot and against the one-hot codewords through
    the ECOC head (differences), and the TOST p-values of the same
    comparisons (equivalence claims).

    Returns:
        dict: rows (encoding, k, reference, mean, p, p_holm, p_tost,
        p_tost_holm, equivalent_after_holm), path.
    """
    with open(path) as f:
        summary = json.load(f)["summary"]
    rows = []
    for row in summary:
        for field, reference in (("equivalence", "one_hot"),
                                 ("equivalence_ecoc_identity",
                                  "one_hot codewords, ECOC head")):
            test = row.get(field)
            if test:
                rows.append({"encoding": row["encoding"],
                             "code_length": row["code_length"],
                             "reference": reference, "mean": test["mean"],
                             "ci95": test["ci95"], "p": test["p_difference"],
                             "p_tost": test["p_tost"]})
    for row, p, q in zip(rows, stats.holm([r["p"] for r in rows]),
                         stats.holm([r["p_tost"] for r in rows])):
        row["p_holm"], row["p_tost_holm"] = p, q
        row["equivalent_after_holm"] = bool(q < 0.05)
    return {"path": path, "rows": rows}


def cub_markdown(result):
    """The CUB Holm table."""
    from ecoc_research.experiments import report

    table = [[r["encoding"], r["code_length"], r["reference"],
              f"{r['mean']:+.1f} (no spread)" if r["ci95"] is None else
              f"{r['mean']:+.1f} [{r['ci95'][0]:+.1f}, {r['ci95'][1]:+.1f}]",
              _p(r["p"]), _p(r["p_holm"]), _p(r["p_tost"]),
              _p(r["p_tost_holm"])] for r in result["rows"]]
    return (f"Paired tests of `{os.path.basename(result['path'])}` (points, 5 "
            f"seeds) with Holm's adjustment: differences over the "
            f"{len(table)} two-sided paired t-tests, equivalence over the "
            f"{len(table)} TOST p-values (margin ±1 point).\n\n"
            + report.markdown_table(
                ["encoding", "k", "reference", "mean [95% CI]", "p",
                 "p Holm", "p TOST", "p TOST Holm"], table) + "\n")


def audit_attributes(path):
    """Holm over an attributes summary's permutation-test p-values.

    One family: every (code, null) p-value of `<name>.json` ("codes":
    p_vs_gaussian, p_vs_dense_random, p_vs_permuted).

    Returns:
        dict: rows (encoding, k, null, p, p_holm), path.
    """
    with open(path) as f:
        codes = json.load(f)["codes"]
    rows = [{"encoding": c["encoding"], "code_length": c["code_length"],
             "null": null, "p": c[f"p_vs_{null}"]}
            for c in codes for null in ("gaussian", "dense_random", "permuted")
            if c.get(f"p_vs_{null}") is not None]
    for row, p in zip(rows, stats.holm([r["p"] for r in rows])):
        row["p_holm"] = p
    return {"path": path, "rows": rows}


def attributes_markdown(result):
    """The attributes Holm table."""
    from ecoc_research.experiments import report

    table = [[r["encoding"], r["code_length"], r["null"], _p(r["p"]),
              _p(r["p_holm"])] for r in result["rows"]]
    return (f"Permutation-test p-values of `{os.path.basename(result['path'])}`"
            f" with Holm's adjustment over the {len(table)} tests.\n\n"
            + report.markdown_table(["encoding", "k", "null", "p", "p Holm"],
                                    table) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m ecoc_research.experiments.audit",
        description="Holm-adjusted p-values, TOST and spectral minus "
        "imprinted rows for the grid results stored in a folder "
        "(runs.jsonl + <experiment>.json); writes audit.json and audit.md "
        "there.")
    parser.add_argument("folder", help="e.g. docs/results/omniglot")
    parser.add_argument("--cub", nargs="*", default=[],
                        help="cub-bits summaries (<name>.json) to adjust too; "
                        "writes <name>_audit.md beside each")
    parser.add_argument("--attributes", nargs="*", default=[],
                        help="attributes summaries (<name>.json) to adjust "
                        "too; writes <name>_audit.md beside each")
    parser.add_argument("--margin", type=float,
                        default=stats.EQUIVALENCE_MARGIN,
                        help="TOST margin in accuracy points (default 1)")
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.folder, "runs.jsonl")):
        parser.error(f"{args.folder} has no runs.jsonl. Received: "
                     f"folder={args.folder!r}")
    from ecoc_research.experiments import report

    result = audit(args.folder, args.margin)
    report.write_json(os.path.join(args.folder, "audit.json"), result)
    report.write_text(os.path.join(args.folder, "audit.md"), markdown(result))
    for path in args.cub:
        cub = audit_cub(path)
        report.write_text(os.path.splitext(path)[0] + "_audit.md",
                          cub_markdown(cub))
    for path in args.attributes:
        report.write_text(os.path.splitext(path)[0] + "_audit.md",
                          attributes_markdown(audit_attributes(path)))
    print(f"{result['family_size']} paired tests, "
          f"{len(result['mismatches'])} mismatches with the stored summaries; "
          f"wrote audit.json and audit.md in {args.folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
