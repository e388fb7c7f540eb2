"""The measured kAuto tables of this run (kernels/cuda/README.md, docs/benchmarks.md).

Two leases on 2026-11-27, tree 2061684 (the kAuto rule refit to the H200 run
of fc87b08) plus, for the H200 calls, the harness's tie-break premise fix:

* H100 (NVIDIA H100 80GB HBM3), call 1, `benchmarks/device_run.sh`:
  run1_h100_harness_timing.json (every variant, the auto rows measured as one
  call each) and run1_h100_bench_gpu_loss.json (JAX, torch.compile, cut
  cross-entropy, Liger; its time limit reached 7 of the JAX cells);
* H200, calls 3 and 4 of one lease: `harness --bench-only --quick --variant
  auto` twice (run3_h200_auto_bench.json, run4_h200_auto_bench.json; the
  second run is the one the table uses, the first shows the repeat spread) and
  JAX dense `jit` DEFAULT on all 18 cells (run4_h200_gpuloss_jax.json).

Per card and cell it prints kAuto's forward + codes gradient ms in 3xTF32 (the
default) and TF32 (JAX DEFAULT's precision) against JAX DEFAULT's forward +
backward on the same card and lease; at B = 16 the time to read the codes once
at the card's bandwidth (H100 SXM 3.35 TB/s, H200 4.8 TB/s; the issue's
target: within 3x); and, on the H100, cut cross-entropy (`cce_exact`, FP32;
`cce_tf32`) where it ran.

    python docs/device_runs/2026-11-27-kauto/kauto_table.py
"""
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12}  # bytes/s, the cards' HBM peaks


def load(name):
    return json.loads((HERE / name).read_text())


def auto_rows(rows):
    return {(r["mode"].split("+")[0], r["B"], r["k"], r["n"]): r for r in rows
            if r["mode"].endswith("+auto")}


def method_rows(bench, method):
    return {(r["B"], r["k"], r["n"]): r for r in bench["rows"]
            if r["method"] == method and r.get("fwdbwd_ms")}


def fmt(x, digits=3):
    return "—" if x is None else f"{x:.{digits}f}"


def table(card, auto, bench, repeat=None):
    jax = method_rows(bench, "jax_default")
    cce = method_rows(bench, "cce_exact")
    cce_tf32 = method_rows(bench, "cce_tf32")
    print(f"\n#### {card}: kAuto forward + codes gradient against JAX dense DEFAULT "
          "(same card and lease)\n")
    head = "| B | k | n | 3xTF32 ms | TF32 ms | JAX DEFAULT ms | 3xTF32 / JAX | TF32 / JAX "
    head += "| B = 16: 3xTF32 / codes once |"
    if cce:
        head += " cut CE exact (FP32) ms | cut CE TF32 ms |"
    if repeat:
        head += " 3xTF32 ms, repeat |"
    print(head)
    print("|" + "---:|" * (head.count("|") - 1))
    cells = sorted({key[1:] for key in auto}, key=lambda c: (c[2], c[1], c[0]))
    met = {"3xtf32": 0, "tf32": 0}
    for B, k, n in cells:
        a3 = auto[("3xtf32", B, k, n)]["fwdbwd_ms"]
        a1 = auto[("tf32", B, k, n)]["fwdbwd_ms"]
        j = jax.get((B, k, n), {}).get("fwdbwd_ms")
        r3 = a3 / j if j else None
        r1 = a1 / j if j else None
        if j:
            met["3xtf32"] += a3 <= j
            met["tf32"] += a1 <= j
        once = n * k * 4 / BANDWIDTH[card.split()[1][:4]] * 1e3 if B == 16 else None
        line = (f"| {B} | {k} | {n:,} | {a3:.3f} | {a1:.3f} | {fmt(j)} | {fmt(r3, 2)} "
                f"| {fmt(r1, 2)} | {fmt(a3 / once if once else None, 1)} |")
        if cce:
            line += (f" {fmt(cce.get((B, k, n), {}).get('fwdbwd_ms'), 1)} "
                     f"| {fmt(cce_tf32.get((B, k, n), {}).get('fwdbwd_ms'), 2)} |")
        if repeat:
            line += f" {repeat[('3xtf32', B, k, n)]['fwdbwd_ms']:.3f} |"
        print(line)
    print(f"\nAt or below JAX DEFAULT: 3xTF32 in {met['3xtf32']}, TF32 in {met['tf32']} of "
          f"{len(jax.keys() & set(cells))} cells both ran.")


def main():
    h100 = load("run1_h100_harness_timing.json")
    table("NVIDIA H100 80GB HBM3", auto_rows(h100), load("run1_h100_bench_gpu_loss.json"))
    table("NVIDIA H200", auto_rows(load("run4_h200_auto_bench.json")),
          load("run4_h200_gpuloss_jax.json"), repeat=auto_rows(load("run3_h200_auto_bench.json")))


if __name__ == "__main__":
    main()
