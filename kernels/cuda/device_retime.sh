#!/usr/bin/env bash
# A short device call after a kernel change: the timing table of a few launch
# variants (harness --bench-only --quick: B in {16, 256, 4096}, k in {32, 128},
# n in {1e4, 1e5, 1e6}, every math mode) and, optionally, one Nsight Compute
# profile with the stall reasons per SASS instruction. Uses the prebuilt
# harness of .whl/ (device_check.sh --prebuild .whl on the workstation) and
# stops if its stamp does not match the tree: a stale binary would time the
# old kernels.
#
#   OUT=$OUT bash kernels/cuda/device_retime.sh [--ncu KERNEL_REGEX VARIANT MATH] VARIANT...
#
# e.g. `rows64 v2 auto --ncu CodesGradSplitKernel rows64 fp32` after a change
# to the 64-row codes gradient. Writes under $OUT (at most 8 files, what the
# device tool returns: 7 variants, or 4 with --ncu): bench.log (the prebuilt status and
# each variant's tables), timing_<variant, '+' as '_'>.json (its ECOC_HARNESS_JSON rows),
# and with --ncu ncu.log, ncu_details.txt (--print-details all) and
# ncu_source.csv (per SASS instruction; harness --profile at B = 256,
# n = 1e5 and B = 16, n = 1e6, k = 128).
set -u -o pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO" || exit 1
OUT="${OUT:-$REPO/build/device_retime}"
mkdir -p "$OUT"
source kernels/cuda/device_common.sh
NCU_REGEX="" NCU_VARIANT="" NCU_MATH=""
VARIANTS=()
while (($#)); do
  case "$1" in
    --ncu)
      if (($# < 4)); then echo "device_retime: --ncu needs KERNEL_REGEX VARIANT MATH" >&2; exit 3; fi
      NCU_REGEX="$2" NCU_VARIANT="$3" NCU_MATH="$4"; shift 4 ;;
    -*) echo "device_retime: unknown option '$1'" >&2; exit 3 ;;
    *) VARIANTS+=("$1"); shift ;;
  esac
done
if ((${#VARIANTS[@]} == 0)) && [[ -z "$NCU_REGEX" ]]; then
  echo "device_retime: name at least one variant (or --ncu)" >&2; exit 3
fi
# At most 8 files come back from the device: bench.log and one timing file a
# variant, and with --ncu three more (ncu.log, ncu_details.txt, ncu_source.csv).
MAX_VARIANTS=7; [[ -n "$NCU_REGEX" ]] && MAX_VARIANTS=4
if ((${#VARIANTS[@]} > MAX_VARIANTS)); then
  echo "device_retime: at most $MAX_VARIANTS variants${NCU_REGEX:+ with --ncu} (8 files come back)" >&2; exit 3
fi
EXE="$(mktemp -d /tmp/ecoc_retime.XXXXXX)/ecoc_harness"
if ! prebuilt_harness "$EXE" > "$OUT/bench.log"; then
  echo "device_retime: the prebuilt harness does not match this tree ($(cat "$OUT/bench.log"))" >&2
  exit 4
fi
for v in "${VARIANTS[@]}"; do
  # '+' in a variant's name (rows128+regsoftmax+warps8) is outside the device
  # tool's file-name rule, and such a file would not come back: '_' instead.
  ECOC_HARNESS_JSON="$OUT/timing_${v//+/_}.json" timeout 120 "$EXE" --bench-only --quick --variant "$v" \
    >> "$OUT/bench.log" 2>&1 || echo "harness exit $? for $v" >> "$OUT/bench.log"
done
if [[ -n "$NCU_REGEX" ]]; then
  : > "$OUT/ncu.log"; : > "$OUT/ncu_details.txt"
  ncu_profile "$EXE" "$(dirname "$EXE")/profile" "$NCU_REGEX" "$NCU_VARIANT" "$NCU_MATH" \
    "$OUT/ncu.log" "$OUT/ncu_details.txt" "$OUT/ncu_source.csv"
fi
ls -la "$OUT"
exit 0
