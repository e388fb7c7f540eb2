#!/usr/bin/env bash
# The one command for a lent GPU machine (see /work/.library/device there):
# issue 16's measurements in one run of at most 8 minutes.
#
#   bash benchmarks/device_wheels.sh               (here, once: fills .whl/
#                                                   with the wheels and the
#                                                   prebuilt CUDA harness)
#   OUT=$OUT bash benchmarks/device_run.sh         (there, from the repository
#                                                   root; carry .whl,
#                                                   timeout_s >= 500)
#   bash benchmarks/device_run.sh --dry-run        (prints the phases, limits
#                                                   and commands; runs nothing)
#
# Phases, each under a hard `timeout`, none stopping the next:
#   info     nvidia-smi, nvcc, Python / PyTorch / JAX versions and devices
#   wheels   pip-installs the carried wheels (.whl/*.whl) into /tmp/site,
#            exactly as the device README says, and names every wheel of
#            benchmarks/device_wheels.txt that is missing
#   import   `import keras, keras_ecoc` with KERAS_BACKEND=jax and =torch
#            (keras_ecoc must import without TensorFlow; the image has none)
#   kernels  kernels/cuda/device_check.sh: build (or the prebuilt harness of
#            .whl/ where its stamp matches), checks, the grid against
#            float64, memcheck, racecheck, the harness's timing mode (today's
#            v2 kernels and every launch variant side by side, each math
#            mode), Nsight Compute profiles of the forward split kernels and
#            of the codes-gradient kernels (split, kGradMma and, at B = 16,
#            kGradPersistent) at B = 16 and
#            256; its step limits are
#            fitted into the time the later phases leave
#   gpuloss  benchmarks/bench_gpu_loss.py: the timing table of the loss
#            (JAX, torch.compile, cut cross-entropy, Liger) with the CUDA
#            kernels' rows merged from the harness's JSON, given the rest of
#            the budget (it writes after each cell and skips what does not fit)
#   bench    benchmarks/bench_streaming.py --device gpu, only if at least
#            DEVICE_RUN_STREAMING_MIN (60) seconds are left
#
# Budget: DEVICE_RUN_BUDGET seconds in all (default 465); the last phase ends
# at most ~15 s after it. The kernels phase gets at most its steps' caps + 10 s
# (400 s with a prebuilt harness, 480 s without) and leaves at
# least DEVICE_RUN_GPULOSS_MIN (110) s for gpuloss; DEVICE_RUN_IMPORT_LIMIT
# (30) s for each import check. On the H100 (2026-11-26) the run took 450 s
# and the device call held the machine 480 s: give the call timeout_s >= 500. DEVICE_CHECK_T_* set a
# step limit of device_check.sh outright (else the defaults below, scaled
# down to fit). DEVICE_RUN_GPULOSS_ARGS and DEVICE_RUN_BENCH_ARGS add
# arguments to the two benchmarks (word-split; their hidden --simulate-gpu
# runs the GPU code path on the CPU: how this script is tested without a
# GPU); DEVICE_RUN_QUICK=1 runs both benchmarks with --quick.
#
# The CUDA kernels' timing rows: this script exports ECOC_HARNESS_JSON (a
# file outside $OUT; default /tmp/ecoc_device_run/harness_timing.json) before
# the kernels phase. Where the harness's timing mode has written its rows
# there (format: the docstring of benchmarks/bench_gpu_loss.py), they are
# checked and merged into the gpuloss table (and its JSON keeps them).
#
# Files under $OUT (8, the most the device tool returns):
#   summary.md                 each phase: status, seconds, note
#   device_run.log             what the info/wheels/import/gpuloss/bench
#                              phases printed
#   device_check.md / .log     written by kernels/cuda/device_check.sh
#   bench_gpu_loss.md / .json  the loss timing table (and every row)
#   bench_streaming_gpu.md / .json   the streaming benchmark
# Without a GPU every phase that needs one says so; the script never exits
# early and always exits 0 (the summary holds the statuses), except for a bad
# command line (3).
set -u -o pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 1
DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "device_run: unknown argument '$arg' (usage: device_run.sh [--dry-run])" >&2; exit 3 ;;
  esac
done
OUT="${OUT:-$REPO/build/device_run}"
PY="${PYTHON:-python3}"
# nvcc and compute-sanitizer, if the image keeps them only in the toolkit folder.
[[ -d /usr/local/cuda/bin ]] && export PATH="$PATH:/usr/local/cuda/bin"
WHEELS="${WHEEL_DIR:-.whl}"
SITE="${SITE_DIR:-/tmp/site}"
WHEEL_LIST="$REPO/benchmarks/device_wheels.txt"
SCRIPT_NAME=device_run
# positive_int, left, write_summary, phase, no_gpu_row
source "$REPO/benchmarks/device_lib.sh"
BUDGET=$(positive_int DEVICE_RUN_BUDGET "${DEVICE_RUN_BUDGET:-465}" 465)
GPULOSS_MIN=$(positive_int DEVICE_RUN_GPULOSS_MIN "${DEVICE_RUN_GPULOSS_MIN:-110}" 110)
STREAMING_MIN=$(positive_int DEVICE_RUN_STREAMING_MIN "${DEVICE_RUN_STREAMING_MIN:-60}" 60)
# Each import check's limit: 7 s (jax) and 17 s (torch) on the H100 machine
# of 2026-11-26; a loaded machine without a GPU (the tests) may need more.
IMPORT_LIMIT=$(positive_int DEVICE_RUN_IMPORT_LIMIT "${DEVICE_RUN_IMPORT_LIMIT:-30}" 30)
export ECOC_HARNESS_JSON="${ECOC_HARNESS_JSON:-/tmp/ecoc_device_run/harness_timing.json}"
START=$SECONDS
LOG="$OUT/device_run.log"
SUMMARY="$OUT/summary.md"
if ((DRY_RUN)); then
  LOG=/dev/null
  echo "device_run --dry-run: budget ${BUDGET} s; would write under $OUT:" \
       "summary.md device_run.log device_check.md device_check.log bench_gpu_loss.md" \
       "bench_gpu_loss.json bench_streaming_gpu.md bench_streaming_gpu.json"
else
  mkdir -p "$OUT" "$(dirname "$ECOC_HARNESS_JSON")"
  : >"$LOG"
  rm -f "$ECOC_HARNESS_JSON"  # a stale file must not pass as this run's rows
fi
ROWS=()
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3

# --dry-run charges every phase its whole limit: it shows the worst case.
DRY_ELAPSED=0

# --- info -------------------------------------------------------------------
info() {
  echo "date: $(date -u +%FT%TZ); host: $(uname -a)"
  echo "libc: $(ldd --version 2>&1 | head -n 1)"  # what a prebuilt harness needs (glibc 2.34)
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi; else echo "nvidia-smi: not found (no GPU driver here)"; fi
  if command -v nvcc >/dev/null 2>&1; then nvcc --version; else echo "nvcc: not found"; fi
  command -v compute-sanitizer || echo "compute-sanitizer: not on PATH"
  "$PY" - <<'EOF'
import platform, sys
print("python", platform.python_version(), sys.executable)
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print("torch device:", p.name, f"cc {p.major}.{p.minor}", f"{p.total_memory / 2**30:.1f} GiB",
              p.multi_processor_count, "SMs")
except Exception as e:
    print("torch: not usable:", type(e).__name__, e)
try:
    import jax
    print("jax", jax.__version__, "backend", jax.default_backend(), "devices", jax.devices())
except Exception as e:
    print("jax: not usable:", type(e).__name__, e)
EOF
}
export PY WHEELS SITE WHEEL_LIST
export -f info
PHASE_NOTE="" phase info 20 bash -c info  # 9 s on the H100

# --- wheels -------------------------------------------------------------------
# Installs every wheel that is there (so keras still imports when, say, the
# cut cross-entropy wheel is missing), then fails naming the missing ones.
install_wheels() {
  shopt -s nullglob
  local whl=("$WHEELS"/*.whl) missing=() spec name version found
  if ((${#whl[@]} == 0)); then
    echo "no wheels in $WHEELS/ (build them with benchmarks/device_wheels.sh and carry .whl)"; return 1
  fi
  while read -r spec _; do
    [[ -z "$spec" || "$spec" == \#* ]] && continue
    name="${spec%%==*}" version="${spec##*==}"
    found=("$WHEELS/${name//-/_}-$version-"*.whl)
    ((${#found[@]} == 1)) || missing+=("$spec")
  done <"$WHEEL_LIST"
  ls -l "${whl[@]}"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${whl[@]}" || return 1
  if ((${#missing[@]})); then
    echo "missing wheels (benchmarks/device_wheels.txt): ${missing[*]}"; return 1
  fi
}
export -f install_wheels
PHASE_NOTE="into $SITE" PHASE_NOTE_GREP='^(missing wheels|no wheels in)' \
  phase wheels 30 bash -c install_wheels  # 1 s on the H100
WHEELS_RC=$?
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
if ((!DRY_RUN)) && [[ $WHEELS_RC != 0 ]]; then
  echo "wheels failed (exit $WHEELS_RC): the import checks and the benchmarks show what is missing" >>"$LOG"
fi

# --- import ------------------------------------------------------------------
IMPORT_CHECK='import sys, keras, keras_ecoc
from keras_ecoc import ops
print("keras", keras.__version__, keras.__file__, "| backend", keras.backend.backend(),
      "| keras_ecoc", keras_ecoc.__file__, "| tensorflow imported:", "tensorflow" in sys.modules)
print(ops.backend_status(100000))'
for backend in jax torch; do
  PHASE_NOTE="KERAS_BACKEND=$backend" KERAS_BACKEND=$backend \
    phase "import-$backend" "$IMPORT_LIMIT" "$PY" -c "$IMPORT_CHECK"
done

# --- kernels: the CUDA harness -------------------------------------------------
# The harness binary that benchmarks/device_wheels.sh prebuilt into the wheel
# folder (device_check.sh --prebuild), used where its stamp matches this tree
# and this machine's nvcc: the build step then copies it and runs it once.
case "$WHEELS" in /*) PREBUILT_DIR_DEFAULT="$WHEELS" ;; *) PREBUILT_DIR_DEFAULT="$REPO/$WHEELS" ;; esac
export DEVICE_CHECK_PREBUILT_DIR="${DEVICE_CHECK_PREBUILT_DIR:-$PREBUILT_DIR_DEFAULT}"
PREBUILT_LINE="$(bash kernels/cuda/device_check.sh --prebuilt-status 2>&1 | tail -n 1)"
PREBUILT_MATCH=0; [[ "$PREBUILT_LINE" == "prebuilt: match "* ]] && PREBUILT_MATCH=1
# Each step of device_check.sh gets NAME:NEED:CAP seconds. NEED is what the
# H100 run of 2026-11-26 and the H200 run of 2026-11-27 measured plus a
# margin:
# - build: 31 s on the H100, 73 s on the H200 of 2026-11-27 (eight more
#   register-softmax instantiations since), so 80 when it compiles; a
#   prebuilt harness is copied and started once: 5;
# - checks 2 s on the H100, 10 s on the H200 with today's variants: 12;
# - grid 75-81 s on the H100 of 2026-11-26, 92 s on the H100 of 2026-11-27
#   (the default variant, kAuto, now runs other kernels); smem-limit 1,
#   memcheck 1;
# - racecheck 16 s on the H100 of 2026-11-26; with every variant of today
#   in --small 32 s on the H200 of 2026-11-27 and more than 32 s (its limit)
#   on that day's H100: 45;
# - bench (every variant and the per-launch tables) 53 s on the H100 and
#   54 s on the H200 of 2026-11-27, with 12 variants; 15 since 2026-11-28
#   (rows128 and the two wgmma ones) and the decode table since 2026-11-29,
#   about 70 s by proportion (its JSON keeps the finished cells if it is
#   stopped); since 2026-12-06 auto's three columns are also timed in
#   blocks of back-to-back calls (forward, forward + codes gradient: one
#   sizing call and 3 blocks of about 20 ms each, ~0.15 s, x 3 columns x
#   18 cells: ~8 s, estimated, untimed): 83;
# - ncu 16 s for 12 forward profiles on the H100 of 2026-11-26, 23 s for
#   16 on 2026-11-27; ncu-codes-grad 8 s for its five profiles;
# - ldmatrix (since 2026-11-28, not yet run on a GPU): nvcc on one small
#   file and one warp's trials, a few seconds: 8; wgmma (since 2026-11-28,
#   the same for three warpgroup products; nvcc took 2 s on the
#   workstation): 8 of its 10.
# - racecheck 33 s on the H200 of 2026-11-28: its cap is 50 since wgmma's 10.
# CAP is device_check.sh's default. Room above the sum of the needs goes to
# each step in proportion to its CAP - NEED; below it (only when the
# earlier phases ran far over their measured times, or the harness must be
# compiled) the build keeps its need, since nothing runs without it, and
# every other step is scaled down, so that device_check.sh always finishes
# (it writes device_check.md at its end) and gpuloss keeps
# DEVICE_RUN_GPULOSS_MIN. On 2026-11-26 the earlier phases took 34 s, on
# 2026-11-27 37 s.
if ((PREBUILT_MATCH)); then BUILD_PLAN=BUILD:5:15; else BUILD_PLAN=BUILD:80:95; fi
STEP_PLAN=("$BUILD_PLAN" LDMATRIX:8:15 WGMMA:8:10 CHECK:12:20 GRID:95:115 SMEM:3:10 MEMCHECK:5:15
           RACECHECK:45:50 BENCH:83:90 NCU:26:35 NCUGRAD:13:25)
NEED_SUM=0 CAP_SUM=0
for plan in "${STEP_PLAN[@]}"; do
  IFS=: read -r _ need cap <<<"$plan"
  NEED_SUM=$((NEED_SUM + need)) CAP_SUM=$((CAP_SUM + cap))
done
KLIMIT=$(( $(left) - GPULOSS_MIN )); ((KLIMIT > CAP_SUM + 10)) && KLIMIT=$((CAP_SUM + 10))
STEP_ROOM=$((KLIMIT - 10))
IFS=: read -r _ BUILD_NEED _ <<<"$BUILD_PLAN"
for plan in "${STEP_PLAN[@]}"; do
  IFS=: read -r name need cap <<<"$plan"
  var="DEVICE_CHECK_T_$name"
  if ((STEP_ROOM >= CAP_SUM)); then t=$cap
  elif ((STEP_ROOM >= NEED_SUM)); then
    t=$(( need + (cap - need) * (STEP_ROOM - NEED_SUM) / (CAP_SUM - NEED_SUM) ))
  elif [[ $name == BUILD ]]; then
    t=$need
  else  # 5 s each at least, the rest in proportion to need - 5: the sum stays within STEP_ROOM
    others=$(( ${#STEP_PLAN[@]} - 1 ))
    t=$(( 5 + (need > 5 ? need - 5 : 0) * (STEP_ROOM - BUILD_NEED - 5 * others)
              / (NEED_SUM - BUILD_NEED - 5 * others) ))
    ((t < 5)) && t=5
  fi
  export "$var=${!var:-$t}"
done
if ((DRY_RUN)); then
  echo "kernels: ${PREBUILT_LINE}"
  ((PREBUILT_MATCH)) ||
    echo "kernels: the harness is compiled on the device (~75 s); run benchmarks/device_wheels.sh" \
         "(or kernels/cuda/device_check.sh --prebuild .whl) here and carry .whl to save it"
fi
T0=$SECONDS
if ((DRY_RUN)); then
  bash kernels/cuda/device_check.sh --dry-run | sed 's/^/  /'
fi
PHASE_NOTE="steps and results in device_check.md" OUT="$OUT" \
  phase kernels "$KLIMIT" bash kernels/cuda/device_check.sh
if [[ $? == 0 ]] && ((!DRY_RUN)) && tail -n 3 "$LOG" | grep -q "device_check: no GPU"; then
  no_gpu_row kernels $((SECONDS - T0)) "device_check.sh found no GPU (nvidia-smi) and ran nothing"
fi

# --- gpuloss: the loss timing table --------------------------------------------
QUICK=(); [[ "${DEVICE_RUN_QUICK:-0}" == 1 ]] && QUICK=(--quick)
HARNESS_ARGS=()
if ((DRY_RUN)); then
  echo "  (--harness-json $ECOC_HARNESS_JSON if the kernels phase wrote it and it passes --check-harness-json)"
elif [[ -s "$ECOC_HARNESS_JSON" ]]; then
  if "$PY" benchmarks/bench_gpu_loss.py --check-harness-json "$ECOC_HARNESS_JSON" >>"$LOG" 2>&1; then
    # Left out by bench_gpu_loss (with a note) unless the harness's checks and grid passed.
    HARNESS_ARGS=(--harness-json "$ECOC_HARNESS_JSON" --device-check-md "$OUT/device_check.md")
  else
    echo "the harness JSON $ECOC_HARNESS_JSON is malformed (above): its rows are left out" >>"$LOG"
  fi
else
  echo "no harness timing JSON at $ECOC_HARNESS_JSON: the table has no keras-ecoc CUDA rows" >>"$LOG"
fi
read -r -a GL_EXTRA <<<"${DEVICE_RUN_GPULOSS_ARGS:-}"
T0=$SECONDS
GLIMIT=$(( $(left) - 5 ))
PHASE_NOTE="table in bench_gpu_loss.md${HARNESS_ARGS[*]:+, harness rows merged}" \
  phase gpuloss "$GLIMIT" "$PY" benchmarks/bench_gpu_loss.py "${QUICK[@]}" \
  "${HARNESS_ARGS[@]}" "${GL_EXTRA[@]}" --time-limit "$((GLIMIT > 30 ? GLIMIT - 10 : GLIMIT))" \
  --out "$OUT/bench_gpu_loss.md"
if [[ $? == 2 ]] && ((!DRY_RUN)); then
  no_gpu_row gpuloss $((SECONDS - T0)) "neither PyTorch nor JAX sees a GPU, or bad arguments; see device_run.log"
fi

# --- bench: the streaming benchmark, if time is left ----------------------------
read -r -a BENCH_EXTRA <<<"${DEVICE_RUN_BENCH_ARGS:-}"
T0=$SECONDS
BLIMIT=$(( $(left) - 5 )); ((BLIMIT > 400)) && BLIMIT=400
if ((BLIMIT < STREAMING_MIN)); then
  ROWS+=("| bench | SKIPPED | 0 | ${BLIMIT} s left, under DEVICE_RUN_STREAMING_MIN=${STREAMING_MIN} |")
  ((DRY_RUN)) && echo "phase bench: SKIPPED (${BLIMIT} s left, under DEVICE_RUN_STREAMING_MIN=${STREAMING_MIN})"
  write_summary
else
  PHASE_NOTE="tables in bench_streaming_gpu.md" \
    phase bench "$BLIMIT" "$PY" benchmarks/bench_streaming.py \
    --device gpu "${QUICK[@]}" "${BENCH_EXTRA[@]}" --time-limit "$((BLIMIT > 30 ? BLIMIT - 15 : BLIMIT))" \
    --out "$OUT/bench_streaming_gpu.md"
  if [[ $? == 2 ]] && ((!DRY_RUN)); then
    no_gpu_row bench $((SECONDS - T0)) "neither PyTorch nor JAX sees a GPU; see device_run.log"
  fi
fi

if ((DRY_RUN)); then
  echo "worst case (every phase runs to its limit): $((BUDGET - $(left))) s of the ${BUDGET} s budget;" \
       "on the H100 of 2026-11-26 the phases before kernels took 34 s (limits: $((20 + 30 + 2 * IMPORT_LIMIT)) s)," \
       "which gives the kernels phase ~320 s (its steps need $((NEED_SUM + 10)) s here) and gpuloss ~110 s"
  exit 0
fi
NFILES=$(find "$OUT" -type f | wc -l)
if ((NFILES > 8)); then
  ROWS+=("| files | WARN | 0 | $NFILES files under \$OUT: the device tool returns 8 |")
fi
write_summary
cat "$SUMMARY"
exit 0
