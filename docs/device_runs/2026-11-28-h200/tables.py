"""The tables of the H200 runs of 2026-11-28 (README.md of this folder).

    python docs/device_runs/2026-11-28-h200/tables.py [kauto|prediction|stalls|regression]

Without an argument it prints all four:

* kauto: kAuto's forward + codes gradient (3xTF32, the default, and TF32) per
  cell, tree 3565e4a (run 1, `benchmarks/device_run.sh`), against the same
  call at tree 2061684 on an H200 of 2026-11-27 (../2026-11-27-kauto,
  run4_h200_auto_bench.json) and against JAX dense `jit` DEFAULT: measured in
  the same lease where run 1's time limit reached it (7 cells), else the
  2026-11-27 H200's (marked †, another lease and card).
* prediction: the pre-registered prediction of kernels/cuda/README.md ("What
  the static counts predict", ../2026-11-27-kauto/cpi_fit.py) against run 1:
  per k = 128 3xTF32 cell, the forward and codes-gradient split launches'
  time, 3565e4a / 2061684, with the predicted per-tile ratio.
* stalls: Nsight Compute's warp-stall samples per launch (run 2,
  kernels/cuda/ncu_stalls.sh; run 3, the 64-row FP32 split codes gradient):
  the share of samples per stall reason, and per opcode.
* regression: the 64-row split codes gradient (rows64 column; its codes
  gradient ms = forward + codes gradient - forward) at tree fc87b08
  (../2026-11-27-h200, run2_harness_timing.json), 3565e4a (run 1) and the
  reverted experiment of run 3 (run3_experiment.patch on 3565e4a).
"""
import csv
import gzip
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = HERE.parent
KAUTO = RUNS / "2026-11-27-kauto"
sys.path.insert(0, str(KAUTO))
import kauto_table as kt  # noqa: E402  (its reader of a bench_gpu_loss JSON)


def md_tables(path):
    """(mode, B, k, n) -> {"fwd_ms", "fwdbwd_ms"} per variant column of a
    device_check.md (the harness JSON's fields), and the per-launch ms of the
    auto rows."""
    timing, launches, cur, per_launch = {}, {}, None, None
    for line in Path(path).read_text().splitlines():
        m = re.match(r"### (Per launch: )?math mode (\w+), variant (\S+)$", line)
        if m:
            per_launch, mode, variant = m.group(1) is not None, m.group(2), m.group(3)
            cur = mode if variant == "v2" else f"{mode}+{variant}"
            continue
        if cur is None or not re.match(r"\| \d", line):
            continue
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        key = (cur, int(c[0]), int(c[1]), int(c[2]))
        if per_launch:
            launches[key] = {name.strip(): float(ms) for name, ms in
                             re.findall(r"([a-z -]+?) (\d+\.\d+)", c[-1].replace("·", " "))}
        else:
            timing[key] = {"fwd_ms": float(c[3]), "fwdbwd_ms": float(c[4])}
    return timing, launches


def json_rows(path):
    return {(r["mode"], r["B"], r["k"], r["n"]): r for r in json.loads(Path(path).read_text())}


def jax_default(path):
    """(B, k, n) -> JAX dense DEFAULT forward + backward ms of a bench_gpu_loss JSON."""
    bench = json.loads(Path(path).read_text())
    return {key: r["fwdbwd_ms"] for key, r in kt.method_rows(bench, "jax_default").items()}


def grad_ms(rows, key):
    """The codes gradient's ms: forward + codes gradient less forward."""
    return rows[key]["fwdbwd_ms"] - rows[key]["fwd_ms"]


def p10(n):
    return f"10^{len(str(n)) - 1}"


def kauto():
    now, _ = md_tables(HERE / "run1_device_check.md")
    before = json_rows(KAUTO / "run4_h200_auto_bench.json")
    jax_now = jax_default(HERE / "run1_bench_gpu_loss.json")
    jax_then = jax_default(KAUTO / "run4_h200_gpuloss_jax.json")
    print("| B | k | n | 3xTF32 ms, 2061684 → 3565e4a | TF32 ms, 2061684 → 3565e4a | JAX DEFAULT ms "
          "| 3xTF32 / JAX | TF32 / JAX |")
    print("|---:|---:|---:|---|---|---:|---:|---:|")
    for (mode, B, k, n) in sorted(k for k in now if k[0] == "3xtf32+auto"):
        t3, tt = now[(mode, B, k, n)]["fwdbwd_ms"], now[("tf32+auto", B, k, n)]["fwdbwd_ms"]
        b3, bt = before[(mode, B, k, n)]["fwdbwd_ms"], before[("tf32+auto", B, k, n)]["fwdbwd_ms"]
        j, mark = (jax_now[(B, k, n)], "") if (B, k, n) in jax_now else (jax_then.get((B, k, n)), " †")
        ratio = (lambda t: f"{t / j:.2f}{mark}") if j else (lambda t: "—")
        print(f"| {B} | {k} | {p10(n)} | {b3:.3f} → {t3:.3f} ({t3 / b3:.2f}x) | {bt:.3f} → {tt:.3f} "
              f"({tt / bt:.2f}x) | {f'{j:.3f}{mark}' if j else '—'} | {ratio(t3)} | {ratio(tt)} |")


# The prediction of 2026-11-28 (kernels/cuda/README.md, "What the static
# counts predict"): time per tile, 05bff1a / 2061684 (fit; fit with b = 1).
PREDICTED = {"forward split": {16: (0.93, 0.95), 64: (0.67, 0.73)},
             "codes-grad split": {16: (0.77, 0.79), 64: (0.47, 0.49)}}


def prediction():
    _, launches = md_tables(HERE / "run1_device_check.md")
    before = json_rows(KAUTO / "run4_h200_auto_bench.json")
    print("| B | n | launch | 2061684 ms | 3565e4a ms | measured ratio | predicted ratio |")
    print("|---:|---:|---|---:|---:|---:|---|")
    for (mode, B, k, n) in sorted(k for k in launches if k[0] == "3xtf32+auto" and k[2] == 128):
        for name, pred in PREDICTED.items():
            old, new = before[(mode, B, k, n)]["launch_ms"][name], launches[(mode, B, k, n)][name]
            lo, hi = pred[64 if B >= 64 else 16]
            print(f"| {B} | {p10(n)} | {name} | {old:.3f} | {new:.3f} | {new / old:.2f} "
                  f"| {lo:.2f}-{hi:.2f} |")


def source_csv(path):
    """kernel name -> per-instruction rows (dicts) of an ncu --page source CSV
    (this folder's trimmed copies); a kernel listed twice is read once."""
    out, name, hdr = {}, None, None
    with gzip.open(path, "rt", newline="") as f:
        for r in csv.reader(f):
            if r and r[0] == "Kernel Name":
                name, hdr = re.search(r"(\w+Kernel<[^>]*>)", r[1]).group(1), None
                name = name.replace("(int)", "").replace("(bool)", "")
                if name in out:
                    name = None
                else:
                    out[name] = []
            elif name and hdr is None:
                hdr = r
            elif name:
                out[name].append(dict(zip(hdr, r)))
    return out


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def stalls():
    files = ["run2_source_fwd.csv.gz", "run2_source_grad64.csv.gz", "run2_source_grad16.csv.gz",
             "run3_source_split64_fp32.csv.gz"]
    for f in files:
        for name, rows in source_csv(HERE / f).items():
            samples = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in rows)
            executed = sum(num(r["Instructions Executed"]) for r in rows)
            reasons, by_op, inst = Counter(), defaultdict(Counter), Counter()
            for r in rows:
                tokens = [t for t in r["Source"].split() if not t.startswith("@")]
                op = tokens[0].split(".")[0] if tokens else "?"
                inst[op] += num(r["Instructions Executed"])
                for h, v in r.items():
                    if h.startswith("stall_"):
                        reasons[h[6:]] += num(v)
                        by_op[op][h[6:]] += num(v)
                by_op[op]["(all)"] += num(r["Warp Stall Sampling (All Samples)"])
            print(f"\n{name} ({f}): {samples:,.0f} samples; by reason: "
                  + ", ".join(f"{k} {v / samples:.0%}" for k, v in reasons.most_common(7)))
            print("| opcode | instructions | samples | its top reasons (share of all samples) |")
            print("|---|---:|---:|---|")
            for op, c in sorted(by_op.items(), key=lambda kv: -kv[1]["(all)"])[:6]:
                top = sorted(((k, v) for k, v in c.items() if k != "(all)"), key=lambda kv: -kv[1])
                print(f"| {op} | {inst[op] / executed:.0%} | {c['(all)'] / samples:.0%} | "
                      + ", ".join(f"{k} {v / samples:.0%}" for k, v in top[:3]) + " |")


def regression():
    then = json_rows(RUNS / "2026-11-27-h200" / "run2_harness_timing.json")
    now, _ = md_tables(HERE / "run1_device_check.md")
    exp = {}
    for v in ("rows64", "v2"):
        exp.update(json_rows(HERE / f"run3_timing_{v}.json"))
    print("| mode | B | k | n | 16-row (v2) codes gradient ms, fc87b08 → 3565e4a | 64-row: fc87b08 "
          "| 3565e4a | run 3 experiment | 3565e4a / fc87b08 |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for key in sorted(k for k in now if k[0].endswith("+rows64") and k[1] >= 256):
        base = (key[0].split("+")[0],) + key[1:]
        print(f"| {base[0]} | {key[1]} | {key[2]} | {p10(key[3])} | {grad_ms(then, base):.3f} → "
              f"{grad_ms(now, base):.3f} | {grad_ms(then, key):.3f} | {grad_ms(now, key):.3f} | "
              f"{grad_ms(exp, key):.3f} | {grad_ms(now, key) / grad_ms(then, key):.2f} |")


if __name__ == "__main__":
    tables = {"kauto": kauto, "prediction": prediction, "stalls": stalls, "regression": regression}
    names = sys.argv[1:] or list(tables)
    for bad in set(names) - set(tables):
        sys.exit(f"tables.py: unknown table '{bad}'; expected one of {', '.join(tables)}")
    for n in names:
        print(f"\n#### {n}\n")
        tables[n]()
