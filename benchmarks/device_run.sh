#!/usr/bin/env bash
# The one command for a lent GPU machine (see /work/.library/device there):
#
#   OUT=$OUT bash benchmarks/device_run.sh        (from the repository root;
#                                                  carry .whl, timeout_s >= 480)
#
# Phases, each under a hard `timeout`, none stopping the next:
#   info     nvidia-smi, nvcc, Python / PyTorch / JAX versions and devices
#   wheels   pip-installs the carried keras wheels (.whl/*.whl) into
#            /tmp/site, exactly as the device README says
#   import   `import keras, keras_ecoc` with KERAS_BACKEND=jax and =torch
#            (keras_ecoc must import without TensorFlow; the image has none)
#   kernels  kernels/cuda/device_check.sh with shorter step limits
#   bench    benchmarks/bench_streaming.py --device gpu, given what is left
#            of the budget (it skips and lists what does not fit)
# The CUDA check runs before the benchmark because its steps have fixed
# limits, while the benchmark saves each finished part and adapts to the time
# left, so together they use the budget best.
#
# Budget: DEVICE_RUN_BUDGET seconds in all (default 420); the last phase ends
# at most ~15 s after it. DEVICE_RUN_QUICK=1 runs the benchmark with --quick;
# DEVICE_RUN_BENCH_ARGS adds benchmark arguments (its hidden --simulate-gpu
# runs the GPU code path on CPU devices: how this script is tested without a
# GPU). DEVICE_CHECK_T_* override the CUDA check's step limits set below.
# Files under $OUT (at most 8, as the device tool returns them):
#   summary.md                 each phase: status, seconds, note
#   device_run.log             everything the info/wheels/import phases printed
#   device_check.md / .log     written by kernels/cuda/device_check.sh
#   bench_streaming_gpu.md / .json / .log   the benchmark (section, rows, output)
# Without a GPU every phase that needs one says so; the script never exits
# early and always exits 0 (the summary holds the statuses).
set -u -o pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 1
OUT="${OUT:-$REPO/build/device_run}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
# nvcc and compute-sanitizer, if the image keeps them only in the toolkit folder.
[[ -d /usr/local/cuda/bin ]] && export PATH="$PATH:/usr/local/cuda/bin"
WHEELS="${WHEEL_DIR:-.whl}"
SITE="${SITE_DIR:-/tmp/site}"
BUDGET="${DEVICE_RUN_BUDGET:-420}"
if [[ ! "$BUDGET" =~ ^[1-9][0-9]*$ ]]; then
  echo "device_run: DEVICE_RUN_BUDGET must be a positive integer number of seconds." \
       "Received: DEVICE_RUN_BUDGET=$BUDGET" >&2
  BUDGET=420
fi
START=$SECONDS
LOG="$OUT/device_run.log"
SUMMARY="$OUT/summary.md"
: >"$LOG"
ROWS=()
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3

left() { echo $((BUDGET - (SECONDS - START))); }

write_summary() {
  {
    echo "# device_run $(date -u +%FT%TZ): $((SECONDS - START)) s of a ${BUDGET} s budget"
    echo
    echo "| phase | status | seconds | note |"
    echo "|---|---|---:|---|"
    printf '%s\n' "${ROWS[@]}"
  } >"$SUMMARY"
}

# phase NAME LIMIT LOGFILE COMMAND...: runs COMMAND under `timeout LIMIT`,
# appends its output to LOGFILE and a row to the summary. Never exits.
phase() {
  local name="$1" limit="$2" log="$3"; shift 3
  if ((limit < 5)); then
    ROWS+=("| $name | SKIPPED | 0 | no time left in the ${BUDGET} s budget |")
    echo "## phase $name: SKIPPED (no time left)" >>"$log"; write_summary; return 99
  fi
  echo "## phase $name (limit ${limit} s) $(date -u +%T): $*" >>"$log"
  local t0=$SECONDS rc
  timeout --kill-after=5 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  local dt=$((SECONDS - t0)) status=pass note="${PHASE_NOTE:-}"
  if [[ $rc == 124 || $rc == 137 ]]; then status=FAIL; note="timed out after ${limit} s; $note"
  elif [[ $rc != 0 ]]; then status=FAIL; note="exit code $rc; $note"; fi
  ROWS+=("| $name | $status | $dt | ${note//|//} |")
  echo "## phase $name: $status in $dt s (exit $rc)" >>"$log"
  write_summary
  return $rc
}

# no_gpu_row NAME SECONDS NOTE: replaces the last summary row (a phase that
# found no GPU ran nothing; that is neither a pass nor a failure of the code).
no_gpu_row() {
  ROWS[${#ROWS[@]}-1]="| $1 | NO GPU | $2 | $3 |"
  write_summary
}

# --- info -------------------------------------------------------------------
info() {
  echo "date: $(date -u +%FT%TZ); host: $(uname -a)"
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
export PY WHEELS SITE
export -f info
PHASE_NOTE="" phase info 45 "$LOG" bash -c info

# --- wheels -------------------------------------------------------------------
install_wheels() {
  shopt -s nullglob
  local whl=("$WHEELS"/*.whl)
  if ((${#whl[@]} == 0)); then
    echo "no wheels in $WHEELS/ (carry .whl)"; return 1
  fi
  ls -l "${whl[@]}"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${whl[@]}"
}
export -f install_wheels
PHASE_NOTE="into $SITE" phase wheels 60 "$LOG" bash -c install_wheels
WHEELS_RC=$?
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
[[ $WHEELS_RC == 0 ]] || echo "wheels failed (exit $WHEELS_RC): the import checks show what is missing" >>"$LOG"

# --- import ------------------------------------------------------------------
IMPORT_CHECK='import sys, keras, keras_ecoc
from keras_ecoc import ops
print("keras", keras.__version__, keras.__file__, "| backend", keras.backend.backend(),
      "| keras_ecoc", keras_ecoc.__file__, "| tensorflow imported:", "tensorflow" in sys.modules)
print(ops.backend_status(100000))'
for backend in jax torch; do
  PHASE_NOTE="KERAS_BACKEND=$backend" KERAS_BACKEND=$backend \
    phase "import-$backend" 40 "$LOG" "$PY" -c "$IMPORT_CHECK"
done

# --- kernels: the CUDA harness (fixed step limits, 215 s together) -----------
export DEVICE_CHECK_T_BUILD="${DEVICE_CHECK_T_BUILD:-60}" DEVICE_CHECK_T_CHECK="${DEVICE_CHECK_T_CHECK:-25}" \
  DEVICE_CHECK_T_GRID="${DEVICE_CHECK_T_GRID:-60}" DEVICE_CHECK_T_SMEM="${DEVICE_CHECK_T_SMEM:-10}" \
  DEVICE_CHECK_T_MEMCHECK="${DEVICE_CHECK_T_MEMCHECK:-25}" \
  DEVICE_CHECK_T_RACECHECK="${DEVICE_CHECK_T_RACECHECK:-25}" DEVICE_CHECK_T_BENCH="${DEVICE_CHECK_T_BENCH:-10}"
# Keep at least 120 s of the budget for the benchmark.
KLIMIT=$(( $(left) - 120 )); ((KLIMIT > 235)) && KLIMIT=235
T0=$SECONDS
PHASE_NOTE="steps and results in device_check.md" OUT="$OUT" \
  phase kernels "$KLIMIT" "$LOG" bash kernels/cuda/device_check.sh
if [[ $? == 0 ]] && tail -n 3 "$LOG" | grep -q "device_check: no GPU"; then
  no_gpu_row kernels $((SECONDS - T0)) "device_check.sh found no GPU (nvidia-smi) and ran nothing"
fi

# --- bench -------------------------------------------------------------------
T0=$SECONDS
BLIMIT=$(( $(left) - 5 )); ((BLIMIT > 400)) && BLIMIT=400
QUICK=(); [[ "${DEVICE_RUN_QUICK:-0}" == 1 ]] && QUICK=(--quick)
# Extra arguments for the benchmark, e.g. "--backends torch" (word-split).
read -r -a BENCH_EXTRA <<<"${DEVICE_RUN_BENCH_ARGS:-}"
PHASE_NOTE="tables in bench_streaming_gpu.md" \
  phase bench "$BLIMIT" "$OUT/bench_streaming_gpu.log" "$PY" benchmarks/bench_streaming.py \
  --device gpu "${QUICK[@]}" "${BENCH_EXTRA[@]}" --time-limit "$((BLIMIT > 30 ? BLIMIT - 15 : BLIMIT))" \
  --out "$OUT/bench_streaming_gpu.md"
if [[ $? == 2 ]]; then
  no_gpu_row bench $((SECONDS - T0)) "neither PyTorch nor JAX sees a GPU; see bench_streaming_gpu.log"
fi

write_summary
cat "$SUMMARY"
exit 0
