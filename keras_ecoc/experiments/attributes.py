"""Experiment 4: correlation of code bits with class attributes (Table 2).

For CUB, each class has 312 attribute values (the percentage of its images
showing "has_bill_shape::dagger", ...). A code column is a function of the
class too, so the Pearson correlation across classes between column j of the
code matrix (n,) and attribute a (n,) says how "semantic" a bit is. The paper
finds data-based bits correlate more with attributes than random bits.
"""

import time

import numpy as np

from keras_ecoc.experiments import common
from keras_ecoc.experiments import plots
from keras_ecoc.experiments import report

ATTRIBUTE_ENCODINGS = ("dense_random", "gaussian", "spectral",
                       "spectral_median")


def attribute_correlation(codes, attributes):
    """Pearson correlation of every code column with every attribute.

    Args:
        codes: (n, k) code matrix.
        attributes: (n, A) per-class attribute table.

    Returns:
        float64 (k, A) correlations in [-1, 1]; 0 where a column or an
        attribute is constant over the classes (correlation undefined).
    """
    c = np.asarray(codes, np.float64)
    a = np.asarray(attributes, np.float64)
    if c.ndim != 2 or a.ndim != 2 or len(c) != len(a):
        raise ValueError(
            "Arguments `codes` (n, k) and `attributes` (n, A) must be 2-D with "
            f"the same number of rows. Received: {c.shape} and {a.shape}")
    c = c - c.mean(0)
    a = a - a.mean(0)
    cn = np.sqrt(np.sum(c * c, 0))
    an = np.sqrt(np.sum(a * a, 0))
    denominator = np.outer(cn, an)
    ok = denominator > 1e-12 * max(1.0, float(denominator.max(initial=0)))
    r = np.where(ok, (c.T @ a) / np.where(ok, denominator, 1.0), 0.0)
    return np.clip(r, -1.0, 1.0)


def correlation_stats(r, top=5):
    """Per-bit max |r| and mean of the top-`top` |r|, averaged over bits."""
    absr = np.sort(np.abs(r), axis=1)[:, ::-1]
    return {"mean_max_abs": float(absr[:, 0].mean()),
            "mean_top_abs": float(absr[:, :top].mean()),
            "max_abs_per_bit": absr[:, 0].tolist()}


def top_attributes(r, names, top=3):
    """For each bit, the `top` attributes with the largest |r|."""
    out = []
    for j in range(r.shape[0]):
        order = np.argsort(-np.abs(r[j]))[:top]
        out.append([{"attribute": names[a] if names else str(a),
                     "r": float(r[j, a])} for a in order])
    return out


def run_attributes(data, code_lengths=(12, 25), encodings=ATTRIBUTE_ENCODINGS,
                   seeds=(0, 1), random_draws=10, top=3, show_bits=6,
                   output_dir=None, verbose=0,
                   similarity_epochs=common.SIMILARITY_EPOCHS,
                   name="attributes"):
    """Correlation between code columns and class attributes.

    Args:
        data: an `ImageDataset` with `class_attributes` (n, A) (the CUB .npz
            files), a `common.DataOptions` or a data set spec.
        code_lengths: k values.
        encodings: random encodings get `random_draws` draws (seeds
            0..random_draws-1, no training needed); data-based encodings one
            code per seed in `seeds` (each trains the one-hot similarity
            network on the training split).
        top: attributes listed per bit.
        show_bits: bits listed in the Markdown report.
        verbose: Keras verbosity of the similarity network.
        similarity_epochs: epochs of that network.

    Returns:
        dict with "summary" (per encoding and k: mean over draws of the
        per-bit max |r| and top-5 mean |r|, with std), "codes" (per draw:
        stats and top attributes per bit), "settings", "dataset",
        "environment", "markdown", "files", "wall_time".
    """
    start = time.perf_counter()
    data = data if hasattr(data, "x_train") else common.load_data(data)
    if data.class_attributes is None:
        raise ValueError(
            "The attributes experiment needs per-class attributes (the CUB "
            "`.npz` files of ../shared/data, array "
            f"`class_attributes_continuous`). Data set {data.name!r} has none.")
    attributes = np.asarray(data.class_attributes, np.float64)
    names = data.attribute_names
    n = data.num_classes
    similarity = common.SimilarityCache(data, epochs=similarity_epochs,
                                        verbose=verbose)
    encodings = [e for e in encodings if e != "one_hot"]
    records = []
    for encoding in encodings:
        draws = (list(seeds) if encoding in common.DATA_ENCODINGS
                 else list(range(random_draws)))
        for k in code_lengths:
            if not common.valid_length(encoding, n, k):
                continue
            for seed in draws:
                codes = common.encoding_codes(encoding, n, int(k), similarity,
                                              seed)
                r = attribute_correlation(codes, attributes)
                stats = correlation_stats(r)
                records.append({
                    "encoding": encoding, "code_length": int(k),
                    "seed": int(seed), **stats,
                    "top_attributes": top_attributes(r, names, top),
                })
    summary = report.summarize(records, ("encoding", "code_length"),
                               ("mean_max_abs", "mean_top_abs"))
    results = {
        "experiment": "attributes",
        "dataset": common.describe_data(data),
        "settings": {"code_lengths": list(code_lengths),
                     "encodings": list(encodings), "seeds": list(seeds),
                     "random_draws": random_draws, "top": top,
                     "num_attributes": int(attributes.shape[1]),
                     "similarity": similarity.describe()},
        "environment": common.environment(),
        "command": common.COMMAND,
        "codes": records, "summary": summary,
    }
    results["wall_time"] = time.perf_counter() - start
    results["markdown"] = attributes_markdown(results, show_bits)
    results["files"] = _write(results, output_dir, name)
    return results


def attributes_markdown(results, show_bits=6):
    s = results["settings"]
    rows = []
    for r in results["summary"]:
        rows.append([r["encoding"], r["code_length"], len(r["seeds"]),
                     report.stat_cell(r, "mean_max_abs"),
                     report.stat_cell(r, "mean_top_abs")])
    text = (f"Pearson correlation across the {results['dataset']['num_classes']} "
            f"classes between each code column and each of the "
            f"{s['num_attributes']} attributes, averaged over bits; mean ± std "
            "over code draws.\n\n")
    text += report.markdown_table(
        ["encoding", "k", "draws", "max abs(r) per bit",
         "top-5 mean abs(r) per bit"],
        rows)
    k = min(s["code_lengths"])
    for encoding in s["encodings"]:
        record = next((c for c in results["codes"] if c["encoding"] == encoding
                       and c["code_length"] == k), None)
        if record is None:
            continue
        text += (f"\n\nTop {s['top']} attributes of the first {show_bits} bits, "
                 f"{encoding}, k = {k}, seed {record['seed']}:\n\n")
        rows = [[j, "; ".join(f"{t['attribute']} ({t['r']:+.2f})"
                              for t in bit)]
                for j, bit in enumerate(record["top_attributes"][:show_bits])]
        text += report.markdown_table(["bit", "attributes (r)"], rows)
    return text


def _write(results, output_dir, name):
    if output_dir is None:
        return []
    series = []
    for r in results["summary"]:
        record = next(c for c in results["codes"]
                      if c["encoding"] == r["encoding"]
                      and c["code_length"] == r["code_length"])
        values = sorted(record["max_abs_per_bit"], reverse=True)
        series.append((f"{r['encoding']} k={r['code_length']}",
                       np.arange(1, len(values) + 1), values, None))
    files = [plots.lines(
        common.output_path(output_dir, f"{name}.png"), series,
        f"Max |attribute correlation| per bit on {common.data_label(results)}",
        "bit (sorted by max |r|)", ylabel="max |r| over attributes")]
    files.append(report.write_text(common.output_path(output_dir, f"{name}.md"),
                                   results["markdown"]))
    files.append(common.output_path(output_dir, f"{name}.json"))
    report.write_json(files[-1], {k: v for k, v in results.items()
                                  if k != "files"})
    return files
