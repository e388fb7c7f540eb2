#!/usr/bin/env bash
# Where the tensor-core kernels' warps stall, per SASS instruction: one short
# device call (about 2 minutes with the carried harness), run after
# benchmarks/device_run.sh when device time is left.
#
#   OUT=$OUT bash kernels/cuda/ncu_stalls.sh      (on the device machine,
#                                                  repository root, carry .whl)
#
# device_run.sh's ncu steps print each kernel's warp cycles per issued
# instruction (CPI) but not what the warps wait on; the CPI model of
# docs/device_runs/2026-11-27-kauto/cpi_fit.py, fitted on static stall counts,
# over-predicted the gain of the 64-row kernels of 05bff1a by 15-20 % in the
# H200 run of 2026-11-28. This script profiles the four launches kAuto runs at
# k = 128 in 3xTF32 (harness --profile: the 64-row forward and kGradMma at
# B = 256, n = 1e5; the 16-row folded forward and kGradMma at B = 16, n = 1e6)
# with Nsight Compute's full set, which samples the warps' stall reasons at
# each program counter, and writes under $OUT (6 files, under the device
# tool's 8):
#   details.txt        every section of each launch, with the stall-reason
#                      breakdown (--print-details all)
#   raw.csv            every metric of each launch (--page raw)
#   source_<name>.csv  per SASS instruction: executed instructions and sampled
#                      stall reasons (--page source --print-source sass), one
#                      file per harness call: fwd (both forwards),
#                      grad64 (64-row kGradMma), grad16 (16-row kGradMma)
#   ncu_stalls.log     what the commands printed
# Uses the prebuilt harness of .whl/ (device_check.sh --prebuild .whl on the
# workstation) and stops (exit 4) if its stamp does not match the tree.
set -u -o pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO" || exit 1
OUT="${OUT:-$REPO/build/ncu_stalls}"
mkdir -p "$OUT"
LOG="$OUT/ncu_stalls.log"
source kernels/cuda/device_common.sh
WORK="$(mktemp -d /tmp/ecoc_ncu_stalls.XXXXXX)"
EXE="$WORK/ecoc_harness"
if ! STATUS="$(prebuilt_harness "$EXE")"; then
  echo "ncu_stalls: the prebuilt harness does not match this tree ($STATUS); run" \
    "device_check.sh --prebuild .whl on the workstation and carry .whl" | tee "$LOG" >&2
  exit 4
fi
{
  echo "# ncu_stalls $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)"
  echo "harness: $STATUS"
  "$NCU" --version 2>&1 | tail -1
} > "$LOG" 2>&1

# name | harness --variant | kernels
RUNS=(
  "fwd|auto|ForwardRegKernel"
  "grad64|rows64+gradmma|CodesGradMmaKernel"
  "grad16|gradmma|CodesGradMmaKernel"
)
for entry in "${RUNS[@]}"; do
  IFS='|' read -r name variant kernels <<< "$entry"
  echo "## $name: harness --profile --variant $variant, kernels $kernels" >> "$LOG"
  ncu_profile "$EXE" "$WORK/$name" "$kernels" "$variant" 3xtf32 "$LOG" "$OUT/details.txt" \
    "$OUT/source_$name.csv" || continue
  "$NCU" -i "$WORK/$name.ncu-rep" --page raw --csv >> "$OUT/raw.csv" 2>> "$LOG" \
    || echo "raw page failed for $name" >> "$LOG"
done
ls -la "$OUT" >> "$LOG"
tail -5 "$LOG"
exit 0
