"""The launch-variant tables of kernels/cuda/README.md from this run's timings.

Reads run2_harness_timing.json (harness --bench-only --quick --variant all on
an NVIDIA H100 80GB HBM3, 2026-11-26: every launch variant in every math
mode, median of 3 after 1 warm-up) and prints, as Markdown:

1. per math mode and cell, the forward time of each variant and the codes
   gradient time (forward + codes gradient minus forward) of v2 and rows64,
   then the forward + codes gradient time of each variant (the fastest in
   bold; in FP32 the regsoftmax columns run v2 / rows64: a repeat of them);
2. what kAuto runs per cell (the rule of ResolveVariant in
   kernels/cuda/ecoc_kernels.cu.cc, copied below for cc = 90) and its
   forward and forward + codes gradient times against v2's;
3. auto in 3xTF32 against JAX's dense loss (jit, DEFAULT precision) on the
   same card (run1_bench_gpu_loss.json), issue 16's target.

auto's forward + codes gradient is a measured row where one exists with the
same forward variant and the same rows64 bit (the codes gradient reads no
other bit); otherwise (marked *) the sum of auto's forward and the codes
gradient of the row with its rows64 bit, two separate measurements.

    python docs/device_runs/2026-11-26-h100-variants/variant_table.py
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ["v2", "rows64", "foldnorms", "rows64+foldnorms", "regsoftmax", "rows64+regsoftmax"]
MODES = ["fp32", "3xtf32", "tf32"]


def load(path=HERE / "run2_harness_timing.json"):
    """(math, variant, B, k, n) -> (forward ms, forward + codes gradient ms) of a harness JSON."""
    table = {}
    for row in json.loads(Path(path).read_text()):
        math, _, variant = row["mode"].partition("+")
        table[(math, variant or "v2", row["B"], row["k"], row["n"])] = (row["fwd_ms"],
                                                                         row["fwdbwd_ms"])
    return table


def auto_variant(pass_, B, n, k, math, cc=90):
    """Python copy of ResolveVariant (kernels/cuda/ecoc_kernels.cu.cc)."""
    if pass_ in ("label_rank", "nearest"):
        return "v2"
    rows64 = B >= 64
    if pass_ == "codes_grad":
        return "rows64" if rows64 else "v2"
    engine = math if cc >= 80 else "fp32"
    if engine != "fp32" and k <= 128:
        if B < 64:
            if n >= 300000:
                return "regsoftmax"
        else:
            return "regsoftmax" if engine == "3xtf32" and B >= 2048 else "rows64+regsoftmax"
    if B <= 16:
        return "v2" if engine == "3xtf32" else "foldnorms"
    return "rows64" if rows64 and B < 1024 else "v2"


def main():
    t = load()
    cells = sorted({key[2:] for key in t}, key=lambda c: (c[2], c[1], c[0]))
    short = {"v2": "v2", "rows64": "r64", "foldnorms": "fold", "rows64+foldnorms": "r64+fold",
             "regsoftmax": "reg", "rows64+regsoftmax": "r64+reg"}
    for math in MODES:
        print(f"\n#### {math}: forward ms per variant; codes gradient ms (v2, rows64)\n")
        print("| B | k | n | " + " | ".join(short[v] for v in VARIANTS)
              + " | grad v2 | grad r64 |")
        print("|---:|---:|---:|" + "---:|" * (len(VARIANTS) + 2))
        for B, k, n in cells:
            fwd = [t[(math, v, B, k, n)][0] for v in VARIANTS]
            best = min(fwd)
            cols = [f"**{x:.3f}**" if x == best else f"{x:.3f}" for x in fwd]
            grad = [t[(math, v, B, k, n)][1] - t[(math, v, B, k, n)][0] for v in ("v2", "rows64")]
            print(f"| {B} | {k} | {n:,} | " + " | ".join(cols)
                  + f" | {grad[0]:.3f} | {grad[1]:.3f} |")
        print(f"\n#### {math}: forward + codes gradient ms per variant (measured together)\n")
        print("| B | k | n | " + " | ".join(short[v] for v in VARIANTS) + " |")
        print("|---:|---:|---:|" + "---:|" * len(VARIANTS))
        for B, k, n in cells:
            both = [t[(math, v, B, k, n)][1] for v in VARIANTS]
            best = min(both)
            cols = [f"**{x:.3f}**" if x == best else f"{x:.3f}" for x in both]
            print(f"| {B} | {k} | {n:,} | " + " | ".join(cols) + " |")
    print("\n#### What auto runs on the H100 (cc 9.0) and its time against v2\n")
    print("| mode | B | k | n | auto forward | auto grad | fwd v2 | fwd auto | fwd gain "
          "| fwd+grad v2 | fwd+grad auto | fwd+grad gain |")
    print("|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|")
    autos = {}
    for math in MODES:
        for B, k, n in cells:
            fv = auto_variant("forward", B, n, k, math)
            gv = auto_variant("codes_grad", B, n, k, math)
            v2_fwd, v2_both = t[(math, "v2", B, k, n)]
            a_fwd = t[(math, fv, B, k, n)][0]
            # A measured row with the same forward and the same rows64 bit.
            same = fv if (("rows64" in fv) == (gv == "rows64") or B <= 16) else None
            if same is not None:
                a_both, mark = t[(math, same, B, k, n)][1], ""
            else:
                g_fwd, g_both = t[(math, gv, B, k, n)]
                a_both, mark = a_fwd + (g_both - g_fwd), "*"
            print(f"| {math} | {B} | {k} | {n:,} | {fv} | {gv} | {v2_fwd:.3f} | {a_fwd:.3f} "
                  f"| {v2_fwd / a_fwd:.2f}x | {v2_both:.3f} | {a_both:.3f}{mark} "
                  f"| {v2_both / a_both:.2f}x |")
            autos[(math, B, k, n)] = (a_both, mark)
    # Issue 16's target: JAX's dense loss (jit, DEFAULT precision) on the
    # same card, run 1 of this session (forward + codes and z gradients).
    bench = json.loads((HERE / "run1_bench_gpu_loss.json").read_text())
    print(f"\n#### auto (3xTF32, the default) against JAX dense DEFAULT on the {bench['card']}\n")
    print("| B | k | n | auto fwd+grad ms | JAX DEFAULT fwd+bwd ms | auto / JAX |")
    print("|---:|---:|---:|---:|---:|---:|")
    jax = sorted((r for r in bench["rows"] if r["method"] == "jax_default" and r.get("fwdbwd_ms")),
                 key=lambda r: (r["n"], r["k"], r["B"]))
    for r in jax:
        a_both, mark = autos[("3xtf32", r["B"], r["k"], r["n"])]
        print(f"| {r['B']} | {r['k']} | {r['n']:,} | {a_both:.3f}{mark} | {r['fwdbwd_ms']:.3f} "
              f"| {a_both / r['fwdbwd_ms']:.1f} |")


if __name__ == "__main__":
    main()
