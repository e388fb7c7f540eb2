#!/usr/bin/env bash
# One run on a GPU machine (CUDA toolkit only; no TensorFlow needed) that
# checks everything a GPU can tell about the ECOC CUDA kernels, in at most
# about 8 minutes on one H100/H200:
#
#   1. builds kernels/cuda/harness.cu + ecoc_kernels.cu.cc for the card's own
#      architecture (nvidia-smi --query-gpu=compute_cap), with OpenMP for the
#      host reference; then builds and runs emu/selftest/ldmatrix.cu (step
#      ldmatrix: the card's ldmatrix on 32-bit words against plain loads, the
#      layout the mma kernels' fragment loads and the emulator assume);
#   2. runs the harness's checks (odd shapes, float16/bfloat16 z, int64 labels,
#      NaN/zero rows, ties, every launch variant) in each math mode (fp32,
#      3xtf32, tf32) against the float64 reference;
#   3. runs the grid B in {1,7,16,256} x k in {1,31,128,1000} x n in
#      {1,33,1e4,1e6} against the float64 reference (3xTF32, the default math
#      mode), with a free-device-memory check per case;
#   4. checks the shared-memory limit the Python guard predicts;
#   5. runs compute-sanitizer memcheck and racecheck on small shapes;
#   6. times forward and forward + codes gradient in each math mode and
#      each launch variant side by side (v2, rows64, foldnorms,
#      rows64+foldnorms, regsoftmax, rows64+regsoftmax, the two +warps8,
#      gradmma, rows64+gradmma, gradpersistent, auto;
#      harness --bench-only --quick --variant all: B in
#      {16,256,4096}, k in {32,128}, n in {1e4,1e5,1e6}; the full grid B in
#      {1,7,16,256,4096} x k in {1,31,32,128,1000} x n in {1,33,1e4,1e5,1e6}
#      is `harness --bench-only`, minutes), then auto's call once more per
#      cell and math mode with an event after each launch: the per-launch
#      tables (prep, split, combine of each pass);
#   7. profiles the forward split kernel with Nsight Compute (ncu; sections
#      SpeedOfLight, MemoryWorkloadAnalysis, Occupancy, LaunchStats,
#      WarpStateStats) at B = 256, n = 1e5, k = 128 and B = 16, n = 1e6,
#      k = 128, every variant, 3xTF32 (harness --profile), then the
#      codes-gradient kernels of the same run (step ncu-codes-grad: at each
#      cell the row tile kAuto picks, without and with kGradMma, and at
#      B = 16 with kGradPersistent: five launches); the reports go to device_check.log with the other raw
#      output. Measurements, not
#      checks: ncu not found (SKIPPED) or failing (say ERR_NVGPUCTRPERM: no
#      access to the counters) is reported but does not change the exit code.
#
# Writes $OUT/device_check.md (one Markdown table: each step, its status and
# time, then the timing table) and $OUT/device_check.log (everything the
# steps printed). Without $OUT it writes to build/device_check/.
#
# Usage (from anywhere):
#   bash kernels/cuda/device_check.sh [--dry-run]
#   bash kernels/cuda/device_check.sh --prebuild DIR
#   bash kernels/cuda/device_check.sh --prebuilt-status
#   --dry-run          print the steps and commands, run nothing (exit 0)
#   --prebuild DIR     build the harness here, without a GPU, for sm_90 (or
#                      DEVICE_CHECK_ARCH) into DIR/ecoc_harness_sm<arch>,
#                      with DIR/ecoc_harness_sm<arch>.stamp: a digest of the
#                      nvcc flags, `nvcc --version` and every file of
#                      kernels/cuda (benchmarks/device_wheels.sh does this
#                      into .whl/, which device_run.sh carries)
#   --prebuilt-status  print one line: "prebuilt: match <path>" where the
#                      binary in DEVICE_CHECK_PREBUILT_DIR (default .whl) was
#                      built from this tree by this nvcc for this card's
#                      architecture (sm_90 without a GPU), else
#                      "prebuilt: none (<why>)"
# With a matching prebuilt binary the build step copies it and runs it once
# (`--auto-table`, a second on the card) instead of compiling (73 s on the
# H200 of 2026-11-27, whose whole kernels phase then failed at a 36-s build
# limit); with none, or a stale one, it compiles as before.
# Step time limits (seconds) from the environment: DEVICE_CHECK_T_BUILD (95),
#   _T_CHECK (20), _T_GRID (115), _T_SMEM (10), _T_MEMCHECK (15),
#   _T_RACECHECK (50), _T_BENCH (90), _T_NCU (35), _T_NCUGRAD (25),
#   _T_LDMATRIX (15), _T_WGMMA (10).
# Exit codes: 0 every step passed, or no GPU (says "no GPU" and runs
# nothing); 1 a step failed; 3 bad command line.
set -u -o pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DRY_RUN=0 PREBUILD_DIR="" STATUS_ONLY=0
USAGE="usage: device_check.sh [--dry-run | --prebuild DIR | --prebuilt-status]"
while (($#)); do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --prebuilt-status) STATUS_ONLY=1 ;;
    --prebuild)
      if (($# < 2)) || [[ -z "$2" || "$2" == -* ]]; then
        echo "device_check: --prebuild needs a folder to write the harness into. $USAGE" >&2
        exit 3
      fi
      PREBUILD_DIR="$2"; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "device_check: unknown argument '$1' ($USAGE)" >&2; exit 3 ;;
  esac
  shift
done

OUT_DIR="${OUT:-$REPO/build/device_check}"
# The harness binary goes to a temporary folder, removed at the end.
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ecoc_device_check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
LOG="$OUT_DIR/device_check.log"
MD="$OUT_DIR/device_check.md"
EXE="$WORK/ecoc_harness"
NVCC="${NVCC:-nvcc}"
SANITIZER="${COMPUTE_SANITIZER:-}"
NCU="${NCU:-}"
if [[ -z "$NCU" ]]; then
  NCU=ncu
  for candidate in "$(command -v ncu 2>/dev/null)" \
      "$(dirname "$(readlink -f "$(command -v "$NVCC" 2>/dev/null || echo /nonexistent)")")/ncu" \
      /usr/local/cuda/bin/ncu; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then NCU="$candidate"; break; fi
  done
fi
if [[ -z "$SANITIZER" ]]; then
  SANITIZER=compute-sanitizer
  for candidate in "$(command -v compute-sanitizer 2>/dev/null)" \
      "$(dirname "$(readlink -f "$(command -v "$NVCC" 2>/dev/null || echo /nonexistent)")")/compute-sanitizer" \
      /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then SANITIZER="$candidate"; break; fi
  done
fi
# Seconds per step; together 480 s (ldmatrix: nvcc on one small file and
# one warp's trials, not yet run on a GPU). Measured on the H200 of 2026-11-27
# (docs/device_runs/2026-11-27-h200, 2026-11-27-kauto): build 73 s, checks
# 10 s, bench 54 s, racecheck 32 s; on that day's H100: grid 92 s, bench
# 53 s, ncu 23 s, ncu-codes-grad 8 s, racecheck over 32 s.
# Measured on an H100 on 2026-11-26
# (docs/device_runs/2026-11-26-h100-variants): build 31 s, checks 2 s, grid
# 75-81 s, smem-limit 1 s, memcheck 1 s, racecheck 16 s, bench ~47 s for six
# launch variants (eleven then, with auto, two kWarps8 and two kGradMma: ~86 s,
# ~80 s since gradmma, rows64+gradmma and auto reuse the forward ms of the
# column whose forward launch they run; ~86 s with the gradpersistent
# column of 2026-11-27, which reuses v2's forward: ~6 s, as each kGradMma
# one, untimed; 54 s measured on the H200 of 2026-11-28; thirteen in `all`
# since rows128+regsoftmax+warps8, a forward of its own: ~5 s more,
# untimed; fourteen since rows128+regsoftmax+warps8+wgmma (on an sm_90a
# card), ~5 s more again, untimed; fifteen since rows64+gradmma+wgmma, a
# codes gradient only (rows64's forward): ~6 s, untimed; `all` leaves out rows64+gradpersistent, whose launches there
# are gradpersistent's or rows64's);
# racecheck's --small runs them all too: ~29 s; the per-launch tables of
# 2026-11-27 add three traced calls per cell to the 36 columns, ~8 %, untimed), ncu 16 s. Each can be lowered (or
# raised) from the environment, e.g. DEVICE_CHECK_T_GRID=60, to fit a shorter
# device lease (benchmarks/device_run.sh does); a step that runs out of time
# is reported as failed.
# racecheck took 33 s on the H200 of 2026-11-28: 50 leaves room for the
# wgmma selftest's 10 within the 480-s run.
T_BUILD=95 T_CHECK=20 T_GRID=115 T_SMEM=10 T_MEMCHECK=15 T_RACECHECK=50 T_BENCH=90 T_NCU=35
T_NCUGRAD=25 T_LDMATRIX=15 T_WGMMA=10
for step_var in T_BUILD T_CHECK T_GRID T_SMEM T_MEMCHECK T_RACECHECK T_BENCH T_NCU T_NCUGRAD \
    T_LDMATRIX T_WGMMA; do
  env_var="DEVICE_CHECK_$step_var"
  if [[ -n "${!env_var:-}" ]]; then
    if [[ ! "${!env_var}" =~ ^[1-9][0-9]*$ ]]; then
      echo "device_check: $env_var must be a positive integer number of seconds." \
           "Received: $env_var=${!env_var}" >&2
      exit 3
    fi
    printf -v "$step_var" '%s' "${!env_var}"
  fi
done

# The card's architecture, e.g. "90".
ARCH=""
if command -v nvidia-smi >/dev/null 2>&1; then
  ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .\r')"
fi
[[ "$ARCH" =~ ^[0-9]+$ ]] || ARCH=""

# The harness's nvcc flags: the library's device code (kernels/build.py
# compiles the same sources with -O3 -DNDEBUG; no kernel reads NDEBUG, and
# nvcc's -O sets the host side only) plus line info for ncu.
BUILD_FLAGS=(-O2 -std=c++17 --expt-relaxed-constexpr -lineinfo -Xcompiler -fopenmp)
# An H100 / H200 (90) gets the architecture-specific sm_90a image, whose
# kernels may use wgmma (the kWgmma variant; KERAS_ECOC_SM90A_IMAGE tells the
# launcher the image has it). The library's build keeps sm_90 until kWgmma
# is timed.
gencode() {
  if [[ "$1" == 90 ]]; then echo "-gencode=arch=compute_90a,code=sm_90a"
  else echo "-gencode=arch=compute_$1,code=sm_$1"; fi
}
image_define() { [[ "$1" != 90 ]] || echo "-DKERAS_ECOC_SM90A_IMAGE=1"; }
build_cmd() {  # arch output -> the compile command, one word per line
  local define
  mapfile -t define < <(image_define "$1")
  printf '%s\n' "$NVCC" "${BUILD_FLAGS[@]}" "$(gencode "$1")" "${define[@]}" \
    -I"$REPO/kernels" -x cu "$HERE/harness.cu" "$HERE/ecoc_kernels.cu.cc" -o "$2"
}
mapfile -t BUILD_CMD < <(build_cmd "${ARCH:-90}" "$EXE")
# Step ldmatrix: emu/selftest/ldmatrix.cu built for the card and run (exit 1
# if any register differs from the plain loads).
LDMATRIX_SH='"$1" -O2 "$2" -std=c++17 -I"$3" -x cu "$3/emu/selftest/ldmatrix.cu" -o "$4/ldm"'
LDMATRIX_SH+=' && "$4/ldm" "$4/ldm.bin" ok'
LDMATRIX_CMD=(bash -c "$LDMATRIX_SH" ldmatrix "$NVCC" "$(gencode "${ARCH:-90}")" "$HERE" "$WORK")
# Step wgmma (an H100 / H200 only): emu/selftest/wgmma.cu built for sm_90a and
# run: the kWgmma forward's layouts (A fragment, accumulator, descriptor
# strides) against an exact reference; on a mismatch it names the wrong
# reading it matches instead. A failure here explains failed rows128+wgmma
# checks.
WGMMA_SH='"$1" -O2 "$2" -std=c++17 -I"$3" -x cu "$3/emu/selftest/wgmma.cu" -o "$4/wgmma"'
WGMMA_SH+=' && "$4/wgmma" "$4/wgmma.bin" ok'
WGMMA_CMD=(bash -c "$WGMMA_SH" wgmma "$NVCC" "$(gencode 90)" "$HERE" "$WORK")
# What a harness binary was built from: the flags, the compiler and every
# source and header of kernels/cuda (more than the harness includes: an edit
# anywhere there costs a build, never a stale binary).
harness_stamp() {  # arch -> one hex digest
  {
    echo "flags ${BUILD_FLAGS[*]} $(gencode "$1") $(image_define "$1")"
    "$NVCC" --version 2>&1 | tail -n 1
    (cd "$REPO" && find kernels/cuda -maxdepth 2 -type f \
       \( -name '*.cu' -o -name '*.cc' -o -name '*.cuh' -o -name '*.h' \) | LC_ALL=C sort |
       while read -r f; do echo "$f $(sha256sum <"$f" | cut -d' ' -f1)"; done)
  } | sha256sum | cut -d' ' -f1
}
PREBUILT_DIR="${DEVICE_CHECK_PREBUILT_DIR:-$REPO/.whl}"
PREBUILT="$PREBUILT_DIR/ecoc_harness_sm${ARCH:-90}"
prebuilt_state() {  # -> "match" or "none (why)"
  if ! command -v "$NVCC" >/dev/null 2>&1; then echo "none (nvcc not found)"
  elif [[ ! -x "$PREBUILT" || ! -f "$PREBUILT.stamp" ]]; then echo "none (no $PREBUILT)"
  elif [[ "$(cat "$PREBUILT.stamp")" != "$(harness_stamp "${ARCH:-90}")" ]]; then
    echo "none ($PREBUILT is stale: built from other sources, flags or nvcc)"
  else echo "match"
  fi
}

if [[ -n "$PREBUILD_DIR" ]]; then
  PB_ARCH="${DEVICE_CHECK_ARCH:-90}"
  if [[ ! "$PB_ARCH" =~ ^[0-9]+$ ]]; then
    echo "device_check: DEVICE_CHECK_ARCH must be a compute capability such as 90." \
         "Received: DEVICE_CHECK_ARCH=$PB_ARCH" >&2
    exit 3
  fi
  if ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "device_check: nvcc not found (set NVCC or put the CUDA toolkit on PATH)" >&2
    exit 1
  fi
  mkdir -p "$PREBUILD_DIR" || exit 1
  target="$PREBUILD_DIR/ecoc_harness_sm$PB_ARCH"
  mapfile -t cmd < <(build_cmd "$PB_ARCH" "$WORK/ecoc_harness")
  echo "device_check --prebuild: ${cmd[*]}"
  t0=$SECONDS
  # The stamp of the sources as the build reads them (an edit during the
  # build then makes the binary stale, never wrongly current).
  stamp="$(harness_stamp "$PB_ARCH")"
  "${cmd[@]}" || { echo "device_check --prebuild: the build failed; $target left as it was" >&2; exit 1; }
  # The binary, then its stamp: a stamp never names a binary it does not describe.
  rm -f "$target.stamp"
  install -m 755 "$WORK/ecoc_harness" "$target" && echo "$stamp" >"$target.stamp" || exit 1
  echo "device_check --prebuild: wrote $target and $target.stamp in $((SECONDS - t0)) s"
  exit 0
fi
PREBUILT_STATE="$(prebuilt_state)"
if ((STATUS_ONLY)); then
  if [[ "$PREBUILT_STATE" == match ]]; then echo "prebuilt: match $PREBUILT"
  else echo "prebuilt: $PREBUILT_STATE"; fi
  exit 0
fi
if [[ "$PREBUILT_STATE" == match ]]; then
  # The copy, then one run on the card: a binary that cannot start here
  # (a missing shared library) fails this step, as a failed build would.
  BUILD_CMD=(bash -c 'install -m 755 "$1" "$2" && "$2" --auto-table >/dev/null' prebuilt
             "$PREBUILT" "$EXE")
fi
# Five sections only, the forward split kernel only (ForwardSplitKernel, or
# ForwardRegKernel for the regsoftmax variants where they apply: 2 cells x 6
# variants = 12 launches), so that the replays stay within about a minute.
NCU_CMD=("$NCU" --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy
  --section LaunchStats --section WarpStateStats --kernel-name "regex:Forward(Split|Reg)Kernel")
# The codes-gradient kernels that `harness --profile` launches after its
# forwards: CodesGradSplitKernel (v2 at B = 16, rows64 at B = 256),
# CodesGradMmaKernel (gradmma, rows64+gradmma) and CodesGradPersistentKernel
# (gradpersistent at B = 16). ncu prints the grid and the
# template arguments (math mode, row tile) of each.
NCU_GRAD_CMD=("$NCU" --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy
  --section LaunchStats --section WarpStateStats --kernel-name "regex:CodesGrad(Split|Mma|Persistent)Kernel")
# The steps, in the order they run: --dry-run lists them and the run below
# walks them from this one list. step_of NAME sets LIMIT (seconds) and CMD
# (the command, an array) to the step's.
STEP_NAMES=(build ldmatrix wgmma checks grid smem-limit memcheck racecheck bench ncu ncu-codes-grad)
step_of() {
  case "$1" in
    build) LIMIT=$T_BUILD; CMD=("${BUILD_CMD[@]}") ;;
    # A few seconds: nvcc on one small file, one warp's trials.
    ldmatrix) LIMIT=$T_LDMATRIX; CMD=("${LDMATRIX_CMD[@]}") ;;
    # The same: nvcc on one small file, three warpgroup products.
    wgmma) LIMIT=$T_WGMMA; CMD=("${WGMMA_CMD[@]}") ;;
    checks) LIMIT=$T_CHECK; CMD=("$EXE" --check-only) ;;
    grid) LIMIT=$T_GRID; CMD=("$EXE" --grid) ;;
    smem-limit) LIMIT=$T_SMEM; CMD=("$EXE" --smem-limit) ;;
    memcheck) LIMIT=$T_MEMCHECK; CMD=("$SANITIZER" --tool memcheck --error-exitcode 1 "$EXE" --small) ;;
    racecheck) LIMIT=$T_RACECHECK; CMD=("$SANITIZER" --tool racecheck --error-exitcode 1 "$EXE" --small) ;;
    bench) LIMIT=$T_BENCH; CMD=("$EXE" --bench-only --quick --variant all) ;;
    ncu) LIMIT=$T_NCU; CMD=("${NCU_CMD[@]}" "$EXE" --profile) ;;
    ncu-codes-grad) LIMIT=$T_NCUGRAD; CMD=("${NCU_GRAD_CMD[@]}" "$EXE" --profile) ;;
    *) echo "device_check: no step named $1" >&2; exit 1 ;;
  esac
}

if [[ $DRY_RUN == 1 ]]; then
  echo "device_check --dry-run: GPU architecture ${ARCH:-none found (sm_90 assumed)}; would write $MD and $LOG"
  echo "prebuilt harness: $PREBUILT_STATE"
  for name in "${STEP_NAMES[@]}"; do
    step_of "$name"
    echo "step $name (<= ${LIMIT} s): ${CMD[*]}"
  done
  exit 0
fi

if [[ -z "$ARCH" ]]; then
  echo "device_check: no GPU (nvidia-smi lists none); nothing was run."
  exit 0
fi
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "device_check: nvcc not found (set NVCC or put the CUDA toolkit on PATH)" >&2
  exit 1
fi
mkdir -p "$OUT_DIR"
: >"$LOG"
{
  echo "# device_check $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv 2>&1
  "$NVCC" --version | tail -n 2
  command -v "$SANITIZER" >/dev/null 2>&1 || echo "compute-sanitizer not found: memcheck/racecheck will fail"
} >>"$LOG"

declare -a ROWS
FAILED=0
STEP_PID="" STEP_NAME="" STEP_T0=0
# Stopped from outside (the device run's phase limit, or ^C): end the running
# step's whole process group (its `timeout` and what runs under it, e.g. the
# harness under compute-sanitizer), record it, and still write device_check.md.
on_stop() {
  trap - TERM INT
  if [[ -n "$STEP_PID" ]]; then
    kill -TERM -- -"$STEP_PID" 2>/dev/null || kill -TERM "$STEP_PID" 2>/dev/null
    sleep 1
    kill -KILL -- -"$STEP_PID" 2>/dev/null
    ROWS+=("| $STEP_NAME | FAIL | $((SECONDS - STEP_T0)) | stopped: device_check.sh was told to stop (the caller's time limit) |")
    echo "## step $STEP_NAME: stopped from outside" >>"$LOG"
  fi
  FAILED=1
  write_md
  exit 143
}
run_step() {  # name limit command...
  local name="$1" limit="$2"; shift 2
  echo "## step $name (limit ${limit} s): $*" >>"$LOG"
  local t0=$SECONDS rc from
  from=$(wc -l <"$LOG")
  # In the background, so that a TERM to this script (the device run's phase
  # limit) reaches the trap below while the step runs: `timeout` leads a
  # process group of its own, which a kill of this script's group misses.
  STEP_NAME=$name STEP_T0=$t0
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1 &
  STEP_PID=$!
  wait "$STEP_PID"
  rc=$?
  STEP_PID=
  local dt=$((SECONDS - t0)) status="pass" note=""
  if [[ $rc == 124 || $rc == 137 ]]; then
    status="FAIL"; note="timed out after ${limit} s"
  elif [[ $rc != 0 ]]; then
    status="FAIL"; note="exit code $rc"
  fi
  case "$name" in
    build)
      if [[ "$PREBUILT_STATE" == match ]]; then
        note="${note:+$note; }copied the prebuilt $(basename "$PREBUILT") (stamp matches this tree and nvcc) and ran it once"
      fi ;;
    ldmatrix)
      note="${note:+$note; }$(tail -n +"$((from + 1))" "$LOG" | grep -E '^ldmatrix: ' | tail -n1)" ;;
    wgmma)
      note="${note:+$note; }$(tail -n +"$((from + 1))" "$LOG" | grep -E '^wgmma' | paste -sd ';' -)" ;;
    checks|grid|smem-limit)
      note="${note:+$note; }$(tail -n +"$((from + 1))" "$LOG" | grep -E '^[0-9]+ checks, [0-9]+ failed' | tail -n1)" ;;
    ncu)
      note="${note:+$note; }$(tail -n +"$((from + 1))" "$LOG" | grep -cE 'Forward(Split|Reg)Kernel.*Context') kernel reports in device_check.log" ;;
    ncu-codes-grad)
      note="${note:+$note; }$(tail -n +"$((from + 1))" "$LOG" | grep -cE 'CodesGrad(Split|Mma|Persistent)Kernel.*Context') kernel reports in device_check.log" ;;
    memcheck|racecheck)
      note="${note:+$note; }$(tail -n +"$((from + 1))" "$LOG" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' | tail -n1)" ;;
  esac
  # The profiles are measurements: their failure does not fail the check.
  [[ $status == pass || $name == ncu* ]] || FAILED=1
  ROWS+=("| $name | $status | $dt | ${note//|//} |")
  echo "## step $name: $status in $dt s ($note)" >>"$LOG"
  return $rc
}

# device_check.md: the steps so far, the timing tables, the failures.
write_md() {
{
  echo "# ECOC CUDA kernels: device check"
  echo
  echo "$(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | head -n1);" \
       "harness built for sm_$ARCH with $("$NVCC" --version | tail -n1)$([[ "$PREBUILT_STATE" == match ]] && echo " (prebuilt)")"
  echo
  echo "| step | status | seconds | result |"
  echo "|---|---|---:|---|"
  printf '%s\n' "${ROWS[@]}"
  if [[ -n "${BENCH_FROM:-}" ]]; then
    echo
    tail -n +"$((BENCH_FROM + 1))" "$LOG" | sed -n '/^## Timings/,/^Largest drop/p'
  fi
  echo
  grep -E '^FAIL ' "$LOG" | head -n 40 | sed 's/^/    /'
} >"$MD"
}
trap on_stop TERM INT
# Every step in order; none after a failed build (there is no harness).
for name in "${STEP_NAMES[@]}"; do
  case "$name" in
    bench) BENCH_FROM=$(wc -l <"$LOG") ;;  # where the timing tables begin
    wgmma)
      if [[ "${ARCH:-90}" != 90 ]]; then
        ROWS+=("| $name | SKIPPED | 0 | sm_90a only (this card: sm_${ARCH:-none}) |")
        continue
      fi ;;
    ncu*)
      if ! command -v "$NCU" >/dev/null 2>&1; then
        ROWS+=("| $name | SKIPPED | 0 | ncu not found (set NCU or put Nsight Compute on PATH) |")
        continue
      fi ;;
  esac
  step_of "$name"
  run_step "$name" "$LIMIT" "${CMD[@]}" || [[ $name != build ]] || break
done

write_md
cat "$MD"
exit $FAILED
