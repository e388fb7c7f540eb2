"""Holm's adjustment over several audit families at once.

Each folder audited by `ecoc_research.experiments.audit` adjusts its own
paired tests (its `audit.json`): a study's family. A reader who counts every
Omniglot study as one question asks a stricter thing, Holm over all of their
tests together. This module answers it from the stored `audit.json` files,
without recomputing any test:

- the family of each folder and its size;
- every test whose verdict (adjusted p <= 0.05) holds in its own family but
  not in the union. Holm over a superset of tests never lowers an adjusted
  p-value (each test's step-down multiplier and the running maximum can only
  grow), so no verdict appears that the per-folder audit did not have.

    python -m ecoc_research.experiments.audit_union \\
        --output docs/results/omniglot_union_holm.md \\
        docs/results/omniglot docs/results/omniglot_replicate \\
        docs/results/omniglot_controls/*/

writes that Markdown file and a `.json` beside it (refused if either exists,
unless `--overwrite`).
"""

import argparse
import json
import os

from ecoc_research.experiments import stats

ALPHA = 0.05


def load_family(folder):
    """The rows of `folder`'s audit.json, each with its folder's name."""
    path = os.path.join(folder, "audit.json")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{folder} has no audit.json: run `python -m "
            f"ecoc_research.experiments.audit {folder}` first. Received: "
            f"folder={folder!r}")
    with open(path) as f:
        rows = json.load(f)["rows"]
    name = os.path.normpath(folder)
    return [dict(row, family=name) for row in rows]


def union_holm(folders):
    """Holm over the union of the audit families in `folders`.

    Args:
        folders: audit folders (each holding an audit.json), distinct.

    Returns:
        dict: families [{family, tests}], size (all tests), rows (every
        test, with p, p_holm (its own family) and p_holm_union), lost (the
        rows whose verdict holds in their family but not in the union).
    """
    names = [os.path.normpath(f) for f in folders]
    if len(set(names)) != len(names):
        raise ValueError(
            "Argument `folders` must name each audit folder once (a family "
            f"counted twice would inflate the union). Received: folders={list(folders)}")
    rows = [row for folder in folders for row in load_family(folder)]
    for row, adjusted in zip(rows, stats.holm([r["p"] for r in rows])):
        row["p_holm_union"] = adjusted
    families = [{"family": n, "tests": sum(r["family"] == n for r in rows)}
                for n in names]
    lost = [r for r in rows if r["p_holm"] is not None and r["p_holm"] <= ALPHA
            and r["p_holm_union"] > ALPHA]
    return {"families": families, "size": len(rows), "rows": rows, "lost": lost}


def _p(value):
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def _mean(row):
    if row["metric"] == "steps_to_target":
        return f"{row['mean']:+.0f}"
    return f"{100 * row['mean']:+.1f}"


def markdown(result):
    """The families, and the verdicts that do not survive the union."""
    from ecoc_research.experiments import report  # noqa: PLC0415

    families = report.markdown_table(
        ["family (audit folder)", "tests"],
        [[f"`{f['family']}`", f["tests"]] for f in result["families"]]
        + [["all", result["size"]]])
    metric = {"test_accuracy": "test acc (points)",
              "steps_to_target": "steps to target",
              "auc": "val AUC (points)"}
    lost = report.markdown_table(
        ["family", "group", "difference", "metric", "mean", "p",
         "p Holm (family)", "p Holm (all)"],
        [[f"`{r['family']}`",
          f"{r['experiment']}, n = {r['num_classes']}, {r['optimizer']} b{r['batch_size']}",
          f"{r['label']} − {r['reference']}", metric[r["metric"]], _mean(r),
          _p(r["p"]), _p(r["p_holm"]), _p(r["p_holm_union"])]
         for r in result["lost"]])
    survive = sum(r["p_holm"] is not None and r["p_holm"] <= ALPHA
                  for r in result["rows"])
    return (
        "Holm's adjustment over every test of the audit families below at "
        f"once ({result['size']} paired tests), against each family's own "
        "adjustment (its `audit.md`). A verdict holds at the 5% level when its "
        f"adjusted p <= {ALPHA}. Of the {survive} verdicts that hold in their "
        f"own family, {len(result['lost'])} do not hold over all "
        f"{result['size']} tests; they are listed below. Holm over more tests "
        "never lowers an adjusted p-value, so no verdict is gained.\n\n"
        f"{families}\n\n### Verdicts that hold in their family, not over all "
        f"{result['size']} tests\n\n{lost}\n")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m ecoc_research.experiments.audit_union",
        description="Holm over the union of several audit families "
        "(folders holding audit.json); writes a Markdown table and a JSON "
        "file.")
    parser.add_argument("folders", nargs="+",
                        help="audit folders, e.g. docs/results/omniglot")
    parser.add_argument("--output", required=True,
                        help="Markdown file to write (a .json goes beside it)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace existing output files")
    args = parser.parse_args(argv)
    if not args.output.endswith(".md"):
        parser.error(f"--output must name a .md file. Received: {args.output!r}")
    json_path = os.path.splitext(args.output)[0] + ".json"
    existing = [p for p in (args.output, json_path) if os.path.exists(p)]
    if existing and not args.overwrite:
        parser.error(f"{', '.join(existing)} already exist; pass --overwrite "
                     "to replace them.")
    try:
        result = union_holm(args.folders)
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    from ecoc_research.experiments import report  # noqa: PLC0415

    # Every test with both adjusted p-values; the full rows are in each
    # family's own audit.json.
    fields = ("family", "experiment", "batch_size", "label", "reference", "metric",
              "mean", "p", "p_holm", "p_holm_union")
    rows = [{k: r[k] for k in fields} for r in result["rows"]]
    report.write_json(json_path, dict(result, rows=rows))
    report.write_text(args.output, markdown(result))
    print(f"{result['size']} tests in {len(result['families'])} families; "
          f"{len(result['lost'])} verdicts do not survive the union; wrote "
          f"{args.output} and {json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
