"""The accuracy metric's cost in a `model.fit` step, from this folder's runs.

Each `tf_r{round}_B{batch}_k{k}.jsonl` holds one round of
`benchmarks/bench_scale.py` at n = 100,000 on the TensorFlow backend (fused
CPU op): the `loss` model (a Dense(k) head compiled with `ECOCLoss(codes)` and
`metrics=[ECOCAccuracy(codes)]`) and the `loss_nometric` model (the same head
and loss, no metric), in alternating order from round to round (`run.sh`).
Rounds pair the two arms: the table gives, per (batch, k), the median step
time of each arm (over its later epochs) averaged over the rounds, and the
paired difference with its 95 % confidence interval (Student t over rounds,
the experiments' `t_interval`).

    python docs/results/metric_cost/summarize.py
"""

import glob
import json
import os
import re
import statistics

from ecoc_research.experiments.stats import t_interval


def load(folder):
    """{(batch, k): {model: {round: step_ms}}} and the 1-minute loads seen."""
    cells, loads = {}, []
    for path in sorted(glob.glob(os.path.join(folder, "tf_r*_B*_k*.jsonl"))):
        rnd = int(re.search(r"_r(\d+)_", os.path.basename(path)).group(1))
        for line in open(path):
            row = json.loads(line)
            if "model" not in row:
                continue
            if row.get("status", "ok") != "ok" and "step_ms" not in row:
                raise SystemExit(f"{path}: a failed run: {row}")
            cells.setdefault((row["batch"], row["k"]), {}).setdefault(row["model"], {})[rnd] = \
                row["step_ms"]
            loads += [row.get("load1_start"), row.get("load1")]
    return cells, [x for x in loads if x is not None]


def table(cells):
    lines = ["| batch | k | rounds | step ms, loss + ECOCAccuracy | step ms, loss only | "
             "metric's cost ms [95 % CI] | with / without |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for (batch, k), arms in sorted(cells.items()):
        with_m, without = arms["loss"], arms["loss_nometric"]
        rounds = sorted(set(with_m) & set(without))
        mean, low, high = t_interval([with_m[r] - without[r] for r in rounds])
        a = statistics.mean(with_m[r] for r in rounds)
        b = statistics.mean(without[r] for r in rounds)
        lines.append(f"| {batch} | {k} | {len(rounds)} | {a:.1f} | {b:.1f} | "
                     f"{mean:+.1f} [{low:+.1f}, {high:+.1f}] | {a / b:.2f} |")
    return "\n".join(lines)


def main():
    cells, loads = load(os.path.dirname(os.path.abspath(__file__)))
    print(table(cells))
    print(f"\n1-minute load average during the runs: {min(loads):.1f}-{max(loads):.1f} "
          f"(2 cores).")


if __name__ == "__main__":
    main()
