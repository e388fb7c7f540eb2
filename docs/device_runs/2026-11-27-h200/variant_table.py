"""The launch-variant tables of kernels/cuda/README.md from this run's timings.

Reads run2_harness_timing.json (harness --bench-only --quick --variant all on
an NVIDIA H200, 2026-11-27, tree fc87b08: every launch variant in every math
mode, median of 3 after 1 warm-up, CUDA events) and prints, as Markdown:

1. per math mode and cell, the forward ms of each forward variant and the
   codes gradient ms of each codes-gradient variant (the fastest of each in
   bold);
2. what kAuto ran in that run (the rule fitted on the H100, 2026-11-26) and
   what the rule fitted here runs (ResolveVariant in
   kernels/cuda/ecoc_kernels.cu.cc, copied below for cc = 90), with their
   forward + codes gradient ms;
3. both against JAX's dense loss (jit, DEFAULT precision) on the same card
   and lease (run1_bench_gpu_loss.json), issue 16's target.

A variant's codes gradient ms is its row's forward + codes gradient ms minus
its forward ms. The gradmma and gradpersistent rows time no forward of their
own (the harness reuses the v2 row's forward ms, the rows64 row's for
rows64+gradmma): their codes gradient ms is their forward + codes gradient
ms minus that reused forward, two measurements of the same process. The old
rule's time is the measured auto row; the new rule's (marked *) is the sum
of its forward variant's forward ms and its codes-gradient variant's codes
gradient ms, a projection from two rows, not one measured call.

    python docs/device_runs/2026-11-27-h200/variant_table.py
"""
import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
FORWARD = ["v2", "rows64", "foldnorms", "rows64+foldnorms", "regsoftmax", "rows64+regsoftmax",
           "regsoftmax+warps8", "rows64+regsoftmax+warps8"]
GRAD = ["v2", "rows64", "gradmma", "rows64+gradmma", "gradpersistent"]
MODES = ["fp32", "3xtf32", "tf32"]
SHORT = {"v2": "v2", "rows64": "r64", "foldnorms": "fold", "rows64+foldnorms": "r64+fold",
         "regsoftmax": "reg", "rows64+regsoftmax": "r64+reg", "regsoftmax+warps8": "reg+w8",
         "rows64+regsoftmax+warps8": "r64+reg+w8", "gradmma": "mma", "rows64+gradmma": "r64+mma",
         "gradpersistent": "pers"}


def _h100_script():
    """The H100 run's variant_table.py, whose auto_variant is the rule of 2026-11-26."""
    path = HERE.parent / "2026-11-26-h100-variants" / "variant_table.py"
    spec = importlib.util.spec_from_file_location("h100_variant_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load():
    return _h100_script().load(HERE / "run2_harness_timing.json")


def old_auto(pass_, B, n, k, math, cc=90):
    """The H100 rule of 2026-11-26, what the auto rows of this run ran."""
    return _h100_script().auto_variant(pass_, B, n, k, math, cc)


def new_auto(pass_, B, n, k, math, cc=90):
    """Python copy of ResolveVariant (kernels/cuda/ecoc_kernels.cu.cc)."""
    rows64 = B >= 64
    engine = math if cc >= 80 else "fp32"
    mma = engine != "fp32" and k <= 128
    if pass_ == "codes_grad":
        if mma:
            return "rows64+gradmma" if rows64 else "gradmma"
        if B <= 16:
            return "gradpersistent"
        return "rows64" if rows64 else "v2"
    if mma:
        if rows64:
            return "rows64+regsoftmax"
        return "regsoftmax+warps8" if k <= 32 and n < 300000 else "regsoftmax"
    if B <= 16:
        return "v2" if engine == "3xtf32" else "foldnorms"
    return "rows64" if rows64 and B < 1024 else "v2"


def forward_ms(t, math, v, cell):
    return t[(math, v, *cell)][0]


def grad_ms(t, math, v, cell):
    fwd_from = {"gradmma": "v2", "rows64+gradmma": "rows64", "gradpersistent": "v2"}.get(v, v)
    return t[(math, v, *cell)][1] - t[(math, fwd_from, *cell)][0]


def bold_min(values):
    best = min(values)
    return [f"**{x:.3f}**" if x == best else f"{x:.3f}" for x in values]


def main():
    t = load()
    cells = sorted({key[2:] for key in t}, key=lambda c: (c[2], c[1], c[0]))
    for math in MODES:
        print(f"\n#### {math}: forward ms per forward variant | codes gradient ms per "
              "codes-gradient variant\n")
        print("| B | k | n | " + " | ".join(SHORT[v] for v in FORWARD) + " | "
              + " | ".join("grad " + SHORT[v] for v in GRAD) + " |")
        print("|---:|---:|---:|" + "---:|" * (len(FORWARD) + len(GRAD)))
        for cell in cells:
            fwd = bold_min([forward_ms(t, math, v, cell) for v in FORWARD])
            grad = bold_min([grad_ms(t, math, v, cell) for v in GRAD])
            B, k, n = cell
            print(f"| {B} | {k} | {n:,} | " + " | ".join(fwd) + " | " + " | ".join(grad) + " |")
    bench = json.loads((HERE / "run1_bench_gpu_loss.json").read_text())
    jax = {(r["B"], r["k"], r["n"]): r["fwdbwd_ms"] for r in bench["rows"]
           if r["method"] == "jax_default" and r.get("fwdbwd_ms")}
    print(f"\n#### What auto runs on the H200 (cc 9.0): the H100 rule (measured) and the rule "
          "fitted here (* projected)\n")
    print("| mode | B | k | n | old forward | old grad | old ms | new forward | new grad "
          "| new ms | old / new | JAX DEFAULT ms | new / JAX |")
    print("|---|---:|---:|---:|---|---|---:|---|---|---:|---:|---:|---:|")
    for math in MODES:
        for cell in cells:
            B, k, n = cell
            of, og = old_auto("forward", B, n, k, math), old_auto("codes_grad", B, n, k, math)
            nf, ng = new_auto("forward", B, n, k, math), new_auto("codes_grad", B, n, k, math)
            old = t[(math, "auto", *cell)][1]
            new = forward_ms(t, math, nf, cell) + grad_ms(t, math, ng, cell)
            j = jax.get(cell)
            jcols = f"{j:.3f} | {new / j:.2f}" if j else "— | —"
            print(f"| {math} | {B} | {k} | {n:,} | {SHORT[of]} | {SHORT[og]} | {old:.3f} "
                  f"| {SHORT[nf]} | {SHORT[ng]} | {new:.3f}* | {old / new:.2f}x | {jcols} |")


if __name__ == "__main__":
    main()
