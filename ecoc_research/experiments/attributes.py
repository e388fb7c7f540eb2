"""Correlation of code bits with CUB class attributes (the paper's Table 2).

For CUB, each class has 312 attribute values (the percentage of its images
showing "has_bill_shape::dagger", ...). A code column is a function of the
class too, so the Pearson correlation across classes between column j of the
code matrix (n,) and attribute a (n,) says how "semantic" a bit is. The paper
finds that data-based bits correlate more with attributes than random bits.

The statistic of a code is the mean over its bits of the best |r| over the
attributes. With 50 classes and 312 attributes the best of 312 |r| is large
even for random bits, so the data-based codes are compared with a NULL
distribution: the same statistic for >= 1,000 random codes (Gaussian and
dense random, the same k, the same row normalisation as in training), and
reported as an empirical p-value (share of random draws at least as high),
with Holm's adjustment over every p-value of the run. Every draw of every
null is stored, so each p can be recomputed from the JSON.

The data-based codes take their class similarity from the fc7 features of
the backbone pretrained on CIFAR-10 (the runner's "external" variant,
`cub_bits.pretrained_similarity`), on the
CUB training images (validation split excluded), as in the add-bits
experiment: one similarity, so one data-based code per (encoding, k).
"""

import time
import warnings

import numpy as np

from ecoc_research.experiments import common

DATA_ENCODINGS = ("spectral", "spectral_zero", "spectral_median")
NULL_ENCODINGS = ("gaussian", "dense_random")
CODE_LENGTHS = (4, 8, 12, 16, 25, 49)
NULL_DRAWS = 1000
NULL_DENSE_TRIALS = 100
# Seeds tried per dense random draw before its null counts as "no code".
DENSE_REDRAWS = 10

# Columns of one np.corrcoef call: (chunk + A) ** 2 floats, ~60 MB at 2,500.
_CHUNK_COLUMNS = 2500


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
            "Arguments `codes` (n, k) and `attributes` (n, A) must be 2-D "
            f"with the same number of rows. Received: {c.shape} and {a.shape}")
    return _corrcoef_block(c, a)


def _corrcoef_block(c, a):
    """np.corrcoef between the columns of c (n, m) and a (n, A), NaN -> 0."""
    m = c.shape[1]
    constant_c = np.ptp(c, axis=0) == 0
    constant_a = np.ptp(a, axis=0) == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.corrcoef(c, a, rowvar=False)[:m, m:]
    r[constant_c] = 0.0
    r[:, constant_a] = 0.0
    return np.clip(np.nan_to_num(r, nan=0.0), -1.0, 1.0)


def mean_best_abs_r(codes, attributes):
    """The statistic of a code: mean over bits of max_a |r(bit, a)|."""
    return float(np.abs(attribute_correlation(codes, attributes))
                 .max(axis=1).mean())


def batched_mean_best_abs_r(code_stack, attributes):
    """`mean_best_abs_r` of many codes at once.

    Args:
        code_stack: (D, n, k) D code matrices.
        attributes: (n, A).

    Returns:
        float64 (D,) statistics, equal to `mean_best_abs_r` of each code.
    """
    stack = np.asarray(code_stack, np.float64)
    a = np.asarray(attributes, np.float64)
    if stack.ndim != 3 or a.ndim != 2 or stack.shape[1] != len(a):
        raise ValueError(
            "Arguments `code_stack` (D, n, k) and `attributes` (n, A) must "
            "share n. Received: "
            f"{stack.shape} and {a.shape}")
    d, n, k = stack.shape
    columns = stack.transpose(1, 0, 2).reshape(n, d * k)  # draw-major
    per_chunk = max(1, _CHUNK_COLUMNS // k) * k
    best = np.concatenate([
        np.abs(_corrcoef_block(columns[:, i:i + per_chunk], a)).max(axis=1)
        for i in range(0, d * k, per_chunk)])
    return best.reshape(d, k).mean(axis=1)


def null_distribution(encoding, num_classes, code_length, attributes,
                      draws=NULL_DRAWS, first_seed=0,
                      dense_trials=NULL_DENSE_TRIALS, redrawn=None):
    """`mean_best_abs_r` of `draws` random codes of one encoding.

    Gaussian codes are `ecoc_research.training.make_codes("gaussian", n, k,
    seed=first_seed + i)`, exactly as trained. Dense random codes are drawn
    the same way (rows rescaled to norm sqrt(k)) but as the best of
    `dense_trials` candidates instead of 1,000 (1,000 when none of
    `dense_trials` is admissible, as for k = 8, n = 50): the selection only
    favours a
    larger minimum Hamming distance between rows, and 1,000 candidates per
    draw would cost ~0.2 s x 1,000 draws per k here. A draw whose seed has
    no admissible candidate at all is redrawn with seed + draws, seed + 2
    draws, ... (`DENSE_REDRAWS` seeds in all), as a training run would take
    another seed; when every one fails the error is raised (the caller
    records that null as "no code").

    Args:
        redrawn: optional list; the seeds that had no admissible code and
            were replaced are appended to it.

    Returns:
        float64 (draws,).
    """
    from keras_ecoc import codes as codes_lib
    from ecoc_research import training

    if encoding not in NULL_ENCODINGS:
        raise ValueError(
            f"Argument `encoding` must be one of {NULL_ENCODINGS}. "
            f"Received: encoding={encoding!r}")
    if not isinstance(draws, (int, np.integer)) or draws < 1:
        raise ValueError(
            "Argument `draws` must be a positive integer. "
            f"Received: draws={draws!r}")
    if encoding == "dense_random":
        def candidate(seed):
            try:
                codes = codes_lib.dense_random(num_classes, code_length,
                                               seed=seed, trials=dense_trials)
            except ValueError:
                # Short codes (2 ** k not >> n^2): few candidates have
                # distinct rows; use the experiments' 1,000 candidates.
                codes = codes_lib.dense_random(num_classes, code_length,
                                               seed=seed)
            return codes_lib.normalize_rows(codes)

        def draw(seed):
            # At k = 8, n = 50 about 1 seed in 300 has no admissible
            # candidate among 1,000 (16 of the 5,000 seeds of the stored CUB
            # run); a training run would take another seed,
            # so the draw does too (seed + j * draws: no other draw's seed).
            for attempt in range(DENSE_REDRAWS):
                try:
                    return candidate(seed + attempt * draws)
                except ValueError as error:
                    last = error
                    if redrawn is not None:
                        redrawn.append(seed + attempt * draws)
            raise last
    else:
        def draw(seed):
            return training.make_codes(encoding, num_classes, code_length,
                                       seed=seed)
    stack = np.stack([draw(first_seed + i) for i in range(draws)])
    return batched_mean_best_abs_r(stack, attributes)


def permutation_null(codes, attributes, draws=NULL_DRAWS, seed=0):
    """`mean_best_abs_r` of `codes` with its rows (classes) shuffled.

    The strictest null for a data-based code: it keeps the code's own
    columns (their smoothness, thresholding, number of bits) and breaks only
    the match between a class's codeword and that class's attributes.

    Returns:
        float64 (draws,).
    """
    codes = np.asarray(codes, np.float64)
    rng = np.random.default_rng(seed)
    order = np.stack([rng.permutation(len(codes)) for _ in range(draws)])
    return batched_mean_best_abs_r(codes[order], attributes)


def empirical_p_value(value, null):
    """(1 + #{null >= value}) / (1 + D): share of draws at least as high."""
    null = np.asarray(null)
    return float((1 + np.sum(null >= value)) / (1 + len(null)))


def top_attributes(r, names, top=3):
    """For each bit, the `top` attributes with the largest |r|."""
    out = []
    for j in range(r.shape[0]):
        order = np.argsort(-np.abs(r[j]))[:top]
        out.append([{"attribute": names[a] if names else str(a),
                     "r": float(r[j, a])} for a in order])
    return out


def run_attributes(similarity, attributes, output_dir=None,
                   attribute_names=None, code_lengths=CODE_LENGTHS,
                   encodings=DATA_ENCODINGS, null_encodings=NULL_ENCODINGS,
                   draws=NULL_DRAWS, dense_trials=NULL_DENSE_TRIALS, top=3,
                   source=None, overwrite=False, name="attributes"):
    """Attribute correlation of data-based codes against a random-code null.

    Args:
        similarity: (n, n) class similarity behind the data-based codes.
        attributes: (n, A) per-class attributes of the same n classes.
        output_dir: folder of the JSON / Markdown / PNG files (None: none).
        attribute_names: A names (for the per-bit listing).
        code_lengths: k values (data-based codes need k <= n - 1).
        encodings: data-based encodings (`common.DATA_ENCODINGS`).
        null_encodings: random encodings of the null distribution.
        draws: random codes per (null encoding, k), >= 1.
        dense_trials: candidates per dense random draw of the null (see
            `null_distribution`).
        top: attributes listed per bit.
        source: JSON-able description of where `similarity` comes from.
        overwrite: replace existing `<name>.json/.md/.png` files in
            `output_dir` (otherwise they are an error).

    Returns:
        dict with "codes" (per data-based encoding and k: statistic, its
        percentile and empirical p-value under each null, with its Holm
        adjustment over every p of the run and its Monte-Carlo standard
        error, every permuted-rows draw, top attributes per bit), "null"
        (per null encoding and k: every draw, mean, std, 5/50/95/99th
        percentiles of the statistic), "settings", "markdown", "files",
        "wall_time". While it runs, `<output_dir>/<name>.partial.json`
        holds the codes and nulls finished so far (see `_Progress`).
    """
    from ecoc_research import training

    start = time.perf_counter()
    _check_outputs(output_dir, name, overwrite)
    sim = np.asarray(similarity, np.float64)
    attributes = np.asarray(attributes, np.float64)
    n = len(attributes)
    if sim.shape != (n, n):
        raise ValueError(
            "Arguments `similarity` (n, n) and `attributes` (n, A) must "
            f"describe the same classes. Received: {sim.shape} and "
            f"{attributes.shape}")
    unknown = sorted(set(encodings) - set(common.DATA_ENCODINGS))
    if unknown:
        raise ValueError(
            f"Argument `encodings` must be among {common.DATA_ENCODINGS}. "
            f"Received unknown encodings {unknown}")
    code_lengths = [int(k) for k in code_lengths
                    if common.valid_length("spectral", n, int(k))]
    settings = {"code_lengths": code_lengths,
                "encodings": list(encodings),
                "null_encodings": list(null_encodings),
                "draws": int(draws), "num_classes": int(n),
                "dense_trials": int(dense_trials),
                "num_attributes": int(attributes.shape[1]),
                "statistic": "mean over bits of the max |Pearson r| "
                "over attributes (numpy.corrcoef across classes)",
                "row_normalization": "rows rescaled to norm sqrt(k) "
                "(ecoc_research.training.make_codes), as trained",
                "p_value": "(1 + #draws >= value) / (1 + draws)",
                "holm": "over every (code, null) p-value of the run",
                "source": source}
    progress = _Progress(output_dir, name, settings)
    # The data-based codes and their permutation nulls first: they are the
    # strictest test, and the progress file keeps them if the run stops.
    records, null_rows = [], []
    for encoding in encodings:
        for k in code_lengths:
            with warnings.catch_warnings():
                # Thresholded codes with few bits can repeat codewords; that
                # is recorded (distinct_rows) and does not change r.
                warnings.filterwarnings("ignore", message=".*identical "
                                        "codewords")
                codes = training.make_codes(encoding, n, k, similarity=sim)
            r = attribute_correlation(codes, attributes)
            value = float(np.abs(r).max(axis=1).mean())
            record = {"encoding": encoding, "code_length": k,
                      "mean_best_abs_r": value,
                      "best_abs_r_per_bit": np.abs(r).max(axis=1).tolist(),
                      "distinct_rows": int(len(np.unique(codes, axis=0))),
                      "top_attributes": top_attributes(r, attribute_names,
                                                       top)}
            permuted = permutation_null(codes, attributes, draws)
            record["permuted_null"] = {
                "mean": float(permuted.mean()),
                "std": float(permuted.std()),
                "percentile_95": float(np.percentile(permuted, 95)),
                # Every draw, so that the p-value can be re-examined (the
                # random-code nulls store theirs too).
                "values": permuted.tolist()}
            record["p_vs_permuted"] = empirical_p_value(value, permuted)
            record["percentile_vs_permuted"] = float(
                100.0 * np.mean(permuted < value))
            records.append(record)
            progress.save(null_rows, records)
            common.log(f"  {encoding} k={k}: {value:.3f}, permuted rows "
                       f"{permuted.mean():.3f} ± {permuted.std():.3f}, p "
                       f"{record['p_vs_permuted']:.4g}")
    nulls = {}
    for encoding in null_encodings:
        for k in code_lengths:
            t = time.perf_counter()
            redrawn = []
            try:
                values = null_distribution(encoding, n, k, attributes, draws,
                                           dense_trials=dense_trials,
                                           redrawn=redrawn)
            except ValueError as error:
                # E.g. dense random codes with 2 ** k < n: no admissible code.
                null_rows.append({"encoding": encoding, "code_length": k,
                                  "draws": 0, "status": "no_code",
                                  "error": str(error)})
                common.log(f"  null {encoding} k={k}: no code ({error})")
                continue
            nulls[(encoding, k)] = values
            null_rows.append({
                "encoding": encoding, "code_length": k, "draws": int(draws),
                "mean": float(values.mean()), "std": float(values.std()),
                "percentiles": {str(q): float(np.percentile(values, q))
                                for q in (5, 50, 95, 99)},
                "max": float(values.max()),
                "values": values.tolist(),
                # Seeds without an admissible dense random code, replaced.
                "redrawn_seeds": redrawn,
                "wall_time": time.perf_counter() - t})
            common.log(f"  null {encoding} k={k}: {draws} draws, mean "
                       f"{values.mean():.3f} ± {values.std():.3f} "
                       f"({time.perf_counter() - t:.1f} s)")
            progress.save(null_rows, records)
    for record in records:
        k, value = record["code_length"], record["mean_best_abs_r"]
        for null_encoding in null_encodings:
            null = nulls.get((null_encoding, k))
            if null is None:
                record[f"p_vs_{null_encoding}"] = None
                record[f"percentile_vs_{null_encoding}"] = None
                continue
            record[f"p_vs_{null_encoding}"] = empirical_p_value(value,
                                                                null)
            record[f"percentile_vs_{null_encoding}"] = float(
                100.0 * np.mean(null < value))
    _add_holm(records, null_encodings)
    results = {
        "experiment": "attributes",
        "settings": settings,
        "environment": common.environment(), "command": common.COMMAND,
        "codes": records, "null": null_rows,
    }
    results["wall_time"] = time.perf_counter() - start
    results["markdown"] = attributes_markdown(results)
    results["files"] = _write(results, nulls, output_dir, name)
    progress.remove()
    return results


def _add_holm(records, null_encodings):
    """Holm-adjusted p and the Monte-Carlo error of every p in `records`.

    One family: every (code, null) p-value of the run, the permutation null
    and each random-code null (None entries, no admissible null code, do not
    count). Adds `p_holm_vs_<null>` and `p_mc_se_vs_<null>` =
    sqrt(p (1 - p) / draws), the binomial standard error of an empirical p
    estimated from that many draws.
    """
    from ecoc_research.experiments import stats

    keys = [f"vs_{e}" for e in ("permuted", *null_encodings)]
    cells = [(r, key) for r in records for key in keys]
    adjusted = stats.holm([r[f"p_{key}"] for r, key in cells])
    for (r, key), p_holm in zip(cells, adjusted):
        r[f"p_holm_{key}"] = p_holm
        p = r[f"p_{key}"]
        draws = len(r["permuted_null"]["values"])
        r[f"p_mc_se_{key}"] = (None if p is None
                               else float(np.sqrt(p * (1 - p) / draws)))


class _Progress:
    """`<name>.partial.json`: the finished nulls and codes, as the run goes.

    Rewritten (write, then rename) after every null family and every
    data-based code, with every draw's value, so that an interrupted run
    keeps what it computed; removed once `<name>.json` is written.
    """

    def __init__(self, output_dir, name, settings):
        import os

        self.path = (None if output_dir is None else
                     os.path.join(output_dir, f"{name}.partial.json"))
        self.settings = settings

    def save(self, null_rows, records):
        import os

        from ecoc_research.experiments import report

        if self.path is None:
            return
        report.write_json(self.path + ".tmp", {
            "experiment": "attributes", "complete": False,
            "settings": self.settings, "command": common.COMMAND,
            "null": null_rows, "codes": records})
        os.replace(self.path + ".tmp", self.path)

    def remove(self):
        import os

        if self.path is not None and os.path.exists(self.path):
            os.remove(self.path)


def _check_outputs(output_dir, name, overwrite):
    """Refuses to replace earlier results unless `overwrite`."""
    common.refuse_existing_results(
        output_dir, [f"{name}.{ext}" for ext in ("json", "md", "png")],
        overwrite)


def attributes_markdown(results, show_bits=6):
    s = results["settings"]
    null = {(r["encoding"], r["code_length"]): r for r in results["null"]}
    rows = []
    for r in results["codes"]:
        row = [r["encoding"], r["code_length"], f"{r['mean_best_abs_r']:.3f}"]
        for e in s["null_encodings"]:
            nr = null[(e, r["code_length"])]
            if r[f"p_vs_{e}"] is None:
                row += ["no admissible code", ""]
                continue
            row += [f"{nr['mean']:.3f} ± {nr['std']:.3f} (95th "
                    f"{nr['percentiles']['95']:.3f})", _p_cell(r, e)]
        pn = r["permuted_null"]
        row += [f"{pn['mean']:.3f} ± {pn['std']:.3f} (95th "
                f"{pn['percentile_95']:.3f})", _p_cell(r, "permuted")]
        rows.append(row)
    headers = ["encoding", "k", "mean best abs(r)"]
    for e in s["null_encodings"]:
        headers += [f"{e} null mean ± std", f"percentile / p / p Holm vs {e}"]
    headers += ["permuted-rows null mean ± std",
                "percentile / p / p Holm vs permuted"]
    family = sum(r.get(f"p_holm_vs_{e}") is not None
                 for r in results["codes"]
                 for e in ("permuted", *s["null_encodings"]))
    text = (f"Mean over bits of the best |r| over the {s['num_attributes']} "
            f"attributes, across the {s['num_classes']} classes; null: "
            f"{s['draws']} random codes per encoding and k, and {s['draws']} "
            "row (class) permutations of each data-based code. p = (1 + "
            "#draws "
            f">= value) / (1 + draws), so 1 / {s['draws'] + 1:,} is the "
            "smallest possible; Holm's adjustment over the "
            f"{family} p-values of the table.\n\n")
    text += _table(headers, rows)
    k = min(s["code_lengths"])
    for r in results["codes"]:
        if r["code_length"] != k:
            continue
        text += (f"\n\nTop attributes of the first {show_bits} bits, "
                 f"{r['encoding']}, k = {k}:\n\n")
        bits = [[j, "; ".join(f"{t['attribute']} ({t['r']:+.2f})"
                              for t in bit)]
                for j, bit in enumerate(r["top_attributes"][:show_bits])]
        text += _table(["bit", "attributes (r)"], bits)
    return text


def _p_cell(record, null):
    """"percentile / p / p Holm" of one code against one null."""
    cell = (f"{record[f'percentile_vs_{null}']:.1f} / "
            f"{record[f'p_vs_{null}']:.4f}")
    p_holm = record.get(f"p_holm_vs_{null}")
    return cell if p_holm is None else f"{cell} / {p_holm:.4f}"


def _table(headers, rows):
    from ecoc_research.experiments import report

    return report.markdown_table(headers, rows)


def _write(results, nulls, output_dir, name):
    """JSON, Markdown and one histogram panel per k (matplotlib Figure)."""
    if output_dir is None:
        return []
    import os

    from matplotlib.figure import Figure

    from ecoc_research.experiments import report

    os.makedirs(output_dir, exist_ok=True)
    s = results["settings"]
    ks = s["code_lengths"]
    cols = min(3, len(ks))
    rows = int(np.ceil(len(ks) / cols))
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows))
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    colors = {"spectral": "tab:red", "spectral_zero": "tab:purple",
              "spectral_median": "tab:green"}
    for ax, k in zip(axes, ks):
        for e in s["null_encodings"]:
            if (e, k) in nulls:
                ax.hist(nulls[(e, k)], bins=40, alpha=0.45,
                        label=f"{e} null")
        for r in results["codes"]:
            if r["code_length"] == k:
                ax.axvline(r["mean_best_abs_r"],
                           color=colors.get(r["encoding"], "black"),
                           label=r["encoding"])
        ax.set_title(f"k = {k}")
        ax.set_xlabel("mean over bits of best |r|")
    for ax in axes[len(ks):]:
        ax.set_visible(False)
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="lower center",
               ncol=len(handles), fontsize=8)
    fig.suptitle(f"Bit-attribute correlation, {s['num_classes']} classes, "
                 f"{s['num_attributes']} attributes, {s['draws']} null draws")
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    return report.write_summary(fig, results, output_dir, name)
