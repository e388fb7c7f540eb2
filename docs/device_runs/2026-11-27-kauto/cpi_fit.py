"""How a warp's issue rate on the H100 follows the static stall counts: a fit
on this run's Nsight Compute reports, and what it predicts for the kernels
changed since (kernels/cuda/README.md, the section "What the static counts
predict").

Measured (run1_h100_device_check.log.gz, tree 2061684, NVIDIA H100 80GB
HBM3, 3xTF32, k = 128): for each register-softmax forward and `kGradMma`
codes-gradient kernel that `harness --profile` ran under ncu, its warp cycles
per issued instruction (CPI) and its achieved active warps per SM (W = that /
4, the warps per scheduler).

Static (sm_90 SASS of the same sources, nvcc 13.0, kernels/cuda/sass_loop_stats.py
--kp 128 on a cubin of each tree, `nvcc -O3 -std=c++17 --expt-relaxed-constexpr
-cubin -gencode=arch=compute_90,code=sm_90 -Ikernels -Ikernels/cuda -x cu
kernels/cuda/ecoc_kernels.cu.cc`): per warp and tile, the instructions a warp
issues and the sum of their control-bit stall counts, s = stall cycles per
instruction. Forward kernels: one 64-class tile. `kGradMma`: one batch tile
(the tool's weights: the tile loop once, its first product's k-step loop
kp / 8 / unroll times, the u tile's staging copies through the cheapest
vector loop, the once-per-block loops not at all, and the cases of the
second product's `switch` by the warps that take them).

The fit: CPI = a + b * s + c * W by least squares, and with b = 1 (each
static stall cycle one cycle). Then, for the kernels of 05bff1a, the
predicted CPI and the time per tile per scheduler, instructions x CPI / W,
against 2061684's measured one. A warp count outside the fitted range
(W = 2 to 3.9) is an extrapolation and is marked so.

    python docs/device_runs/2026-11-27-kauto/cpi_fit.py
    python docs/device_runs/2026-11-27-kauto/cpi_fit.py --check NEW_LOG

--check: after a device run of these kernels (its device_check.log, plain
or .gz), the measured W and CPI of each predicted kernel against the fit's
CPI at that W; where the launch's warps differ from the prediction's, the
CPI comparison still tests the fit, the time ratio does not.
"""
import argparse
import gzip
import re
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # kauto_table, this folder's reader of the run's JSON
LOG = HERE / "run1_h100_device_check.log.gz"

# name as ncu prints it -> (instructions, stall cycles) per warp and tile at
# 2061684, then at 05bff1a with the warps per scheduler its launch gets on
# an H100 (blocks per SM from registers and shared memory, 4 schedulers).
STATIC_OLD = {
    "ForwardRegKernel<1, 16, 4, 0, 128>": (2664, 7936),
    "ForwardRegKernel<1, 16, 4, 1, 128>": (2694, 8015),
    "ForwardRegKernel<1, 64, 4, 0, 128>": (6241, 17587),
    "ForwardRegKernel<1, 16, 8, 0, 128>": (1931, 5761),
    "ForwardRegKernel<1, 64, 8, 0, 128>": (3900, 13855),
    "CodesGradMmaKernel<1, 64>": (5295, 15002),
    "CodesGradMmaKernel<1, 16>": (2337, 6627),
}
# How ncu names each kernel of 05bff1a (the KMAX argument is new in kGradMma).
NAME_NEW = {
    "ForwardRegKernel<1, 16, 4, 0, 128>": "ForwardRegKernel<1, 16, 4, 0, 128>",
    "ForwardRegKernel<1, 16, 4, 1, 128>": "ForwardRegKernel<1, 16, 4, 1, 128>",
    "ForwardRegKernel<1, 64, 4, 0, 128>": "ForwardRegKernel<1, 64, 4, 0, 128>",
    "CodesGradMmaKernel<1, 64>": "CodesGradMmaKernel<1, 64, 128>",
    "CodesGradMmaKernel<1, 16>": "CodesGradMmaKernel<1, 16, 128>",
}
STATIC_NEW = {  # same key (the 2061684 kernel it replaces): (instr, stalls, W, note)
    "ForwardRegKernel<1, 16, 4, 0, 128>": (2684, 7515, 3.0, "16-row forward, B = 17-63"),
    "ForwardRegKernel<1, 16, 4, 1, 128>": (2728, 7077, 3.0, "16-row folded forward, B ≤ 16"),
    "ForwardRegKernel<1, 64, 4, 0, 128>": (6199, 11351, 2.0, "64-row forward, B ≥ 64"),
    "CodesGradMmaKernel<1, 64>": (3684, 8021, 3.0, "64-row `kGradMma`, B ≥ 64 (3 blocks per SM, was 2)"),
    "CodesGradMmaKernel<1, 16>": (2209, 6549, 7.0, "16-row `kGradMma`, B ≤ 16 (7 blocks per SM, was 4)"),
}
W_FITTED = (2.0, 3.92)

# Out of sample: the register-softmax kernels of tree 1da2967 (before the
# tile loops lost their per-element global loads and branches), profiled on
# the H100 of 2026-11-26 in the same cells (../2026-11-26-h100-variants,
# run1_ncu_forward.log). Per-tile estimate of sass_loop_stats.py, whose
# name pattern predates these two-argument templates: counted with the
# 4-warp layout they have.
LOG_OLDER = HERE.parent / "2026-11-26-h100-variants" / "run1_ncu_forward.log"
STATIC_OLDER = {
    "ForwardRegKernel<1, 16>": (3836, 11299),
    "ForwardRegKernel<1, 64>": (8927, 28252),
}


def measured(log=LOG):
    """{kernel: [(grid, W, CPI, reports), ...]} of the ncu reports in the log,
    the reports of one kernel on one grid (repeated launches of a cell)
    averaged."""
    seen = {}
    name = None
    cpi = None
    opener = gzip.open if str(log).endswith(".gz") else open
    for line in opener(log, "rt", errors="replace"):
        m = re.match(r"\s+void (?:keras_ecoc::cuda::detail::)?(\w+<[^>]*>)\(\w+\) (\([\d, ]+\))", line)
        if m:
            name, grid, cpi, cycles = m.group(1), m.group(2), None, float("nan")
            continue
        m = re.search(r"Warp Cycles Per Issued Instruction\s+cycle\s+([\d.]+)", line)
        if m and name:
            cpi = float(m.group(1))
            continue
        m = re.search(r"Elapsed Cycles\s+cycle\s+([\d,]+)", line)
        if m and name:
            cycles = float(m.group(1).replace(",", ""))
            continue
        m = re.search(r"Achieved Active Warps Per SM\s+warp\s+([\d.]+)", line)
        if m and name and cpi is not None:
            seen.setdefault((name, grid), []).append((float(m.group(1)) / 4, cpi, cycles))
            name = None
    out = {}
    for (name, grid), obs in seen.items():
        w, c, cycles = np.mean(obs, axis=0)
        out.setdefault(name, []).append((grid, w, c, len(obs), cycles))
    return out


def power_of_ten(n):
    e = len(str(n)) - 1
    return f"10{str(e).translate(str.maketrans('0123456789', '⁰¹²³⁴⁵⁶⁷⁸⁹'))}" if n == 10**e else f"{n:,}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", metavar="NEW_LOG",
                   help="a later run's device_check.log (.gz): measured CPI against the fit")
    args = p.parse_args(argv)
    if args.check and not Path(args.check).is_file():
        p.error(f"--check must name a device_check.log file. Received: --check={args.check}")
    runs = measured()
    rows = []
    for name, (instr, stalls) in STATIC_OLD.items():
        for grid, w, cpi, count, _ in runs.get(name, []):
            rows.append((name, grid, count, stalls / instr, w, cpi))
    if len(rows) < 4:
        raise SystemExit(f"only {len(rows)} ncu reports matched the static table in {LOG}")
    s = np.array([r[3] for r in rows])
    w = np.array([r[4] for r in rows])
    y = np.array([r[5] for r in rows])
    free, *_ = np.linalg.lstsq(np.stack([np.ones_like(s), s, w], 1), y, rcond=None)
    unit, *_ = np.linalg.lstsq(np.stack([np.ones_like(s), w], 1), y - s, rcond=None)

    def fit_free(s_, w_):
        return free[0] + free[1] * s_ + free[2] * w_

    def fit_unit(s_, w_):
        return unit[0] + s_ + unit[1] * w_

    print(f"fit: CPI = {free[0]:.2f} + {free[1]:.2f} s + {free[2]:.2f} W;"
          f" with b = 1, CPI = {unit[0]:.2f} + s + {unit[1]:.2f} W"
          f" ({len(rows)} kernel launches, {sum(r[2] for r in rows)} ncu reports;"
          f" s {s.min():.2f}-{s.max():.2f}, W {w.min():.2f}-{w.max():.2f})\n")
    print("| kernel (2061684) | grid | ncu reports | s | W | CPI measured | fit | fit, b = 1 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, grid, count, s_, w_, c) in rows:
        print(f"| `{name}` | {grid} | {count} | {s_:.2f} | {w_:.2f} | {c:.2f} | "
              f"{fit_free(s_, w_):.2f} | {fit_unit(s_, w_):.2f} |")
    older = measured(LOG_OLDER)
    print("\nOut of sample (tree 1da2967, H100 of 2026-11-26):\n")
    print("| kernel (1da2967) | grid | ncu reports | s | W | CPI measured | fit | fit, b = 1 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, (instr, stalls) in STATIC_OLDER.items():
        for grid, w_, c, count, _ in older.get(name, []):
            s_ = stalls / instr
            print(f"| `{name}` | {grid} | {count} | {s_:.2f} | {w_:.2f} | {c:.2f} | "
                  f"{fit_free(s_, w_):.2f} | {fit_unit(s_, w_):.2f} |")
    # The same cell and grid on both trees: elapsed cycles against
    # instructions x measured CPI (the per-tile count's check).
    a = next(r for r in older["ForwardRegKernel<1, 64>"] if r[0] == "(4, 66, 1)")
    b = next(r for r in runs["ForwardRegKernel<1, 64, 4, 0, 128>"] if r[0] == "(4, 66, 1)")
    i_a, st_a = STATIC_OLDER["ForwardRegKernel<1, 64>"]
    i_b, _ = STATIC_OLD["ForwardRegKernel<1, 64, 4, 0, 128>"]
    print(f"\n64-row forward, B = 256, n = 10⁵, grid (4, 66, 1), 2061684 / 1da2967: elapsed cycles "
          f"{b[4]:,.0f} / {a[4]:,.0f} = {b[4] / a[4]:.3f}; instructions x measured CPI "
          f"{i_b:,} x {b[2]:.2f} / ({i_a:,} x {a[2]:.2f}) = {i_b * b[2] / (i_a * a[2]):.3f}; "
          f"with the fitted CPI instead: {i_b * b[2] / (i_a * fit_free(st_a / i_a, a[1])):.3f}")

    ratios_by_kernel = {}
    print("\n| kernel | s: 2061684 → 05bff1a | W | instructions per tile | CPI predicted "
          "(fit; b = 1) | time per tile per scheduler, 05bff1a / 2061684 (fit; b = 1) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (instr, stalls, w_new, note) in STATIC_NEW.items():
        i_old, st_old = STATIC_OLD[name]
        obs = runs.get(name, [])
        _, w_old, cpi_old, _, _ = obs[0]
        s_new = stalls / instr
        cpis = (fit_free(s_new, w_new), fit_unit(s_new, w_new))
        before = i_old * cpi_old / w_old
        ratios = [instr * c / w_new / before for c in cpis]
        ratios_by_kernel[name] = ratios
        flag = "" if W_FITTED[0] - 0.1 <= w_new <= W_FITTED[1] + 0.1 else " (W outside the fit)"
        print(f"| {note} | {st_old / i_old:.2f} → {s_new:.2f} | {w_old:.2f} → {w_new:.0f}{flag} | "
              f"{i_old:,} → {instr:,} | {cpi_old:.2f} → {cpis[0]:.2f}; {cpis[1]:.2f} | "
              f"{ratios[0]:.2f}; {ratios[1]:.2f} |")
    cells(ratios_by_kernel)
    if args.check:
        check(measured(args.check), fit_free, fit_unit)


def check(new_runs, fit_free, fit_unit):
    """The predicted kernels' ncu reports in a later run's log."""
    print("\n| kernel | grid | W measured | CPI measured | CPI of the fit at that W (fit; b = 1) |")
    print("|---|---|---:|---:|---:|")
    found = 0
    for key, (instr, stalls, _, note) in STATIC_NEW.items():
        for grid, w, c, count, _ in new_runs.get(NAME_NEW[key], []):
            found += 1
            print(f"| {note} | {grid} | {w:.2f} | {c:.2f} | "
                  f"{fit_free(stalls / instr, w):.2f}; {fit_unit(stalls / instr, w):.2f} |")
    if not found:
        print("| (none of the predicted kernels in that log) | | | | |")


def cells(ratios):
    """The H200 cells at k = 128 (3xTF32 kAuto, run4 of this folder): each
    call's split launches scaled by their kernel's predicted ratio, the other
    launches (prep, combine) as measured, against JAX dense DEFAULT."""
    import kauto_table as kt
    auto = kt.auto_rows(kt.load("run4_h200_auto_bench.json"))
    jax = kt.method_rows(kt.load("run4_h200_gpuloss_jax.json"), "jax_default")
    print("\n| B | n | measured ms (forward split, codes-gradient split, rest) | predicted ms (fit; b = 1) "
          "| JAX DEFAULT ms | ratio to JAX: measured → predicted |")
    print("|---:|---:|---|---:|---:|---:|")
    for (mode, B, k, n), r in sorted(auto.items(), key=lambda kv: kv[0][1:]):
        if mode != "3xtf32" or k != 128:
            continue
        fwd, grad = ((("ForwardRegKernel<1, 64, 4, 0, 128>", "CodesGradMmaKernel<1, 64>")) if B >= 64
                     else ("ForwardRegKernel<1, 16, 4, 1, 128>", "CodesGradMmaKernel<1, 16>"))
        lm = r["launch_ms"]
        f_ms, g_ms = lm["forward split"], lm["codes-grad split"]
        rest = r["fwdbwd_ms"] - f_ms - g_ms
        pred = [f_ms * ratios[fwd][i] + g_ms * ratios[grad][i] + rest for i in (0, 1)]
        j = jax.get((B, k, n), {}).get("fwdbwd_ms")
        j_ms, ratio = ((f"{j:.3f}", f"{r['fwdbwd_ms'] / j:.2f} → {pred[0] / j:.2f}; {pred[1] / j:.2f}")
                       if j else ("—", "—"))
        mark = " *" if B < 64 else ""
        print(f"| {B} | {power_of_ten(n)} | {r['fwdbwd_ms']:.3f} ({f_ms:.3f}, {g_ms:.3f}, {rest:.3f}) | "
              f"{pred[0]:.3f}; {pred[1]:.3f}{mark} | {j_ms} | {ratio} |")
    print("\n(*: with the 16-row `kGradMma`'s ratio, whose W lies outside the fit.)")


if __name__ == "__main__":
    main()
