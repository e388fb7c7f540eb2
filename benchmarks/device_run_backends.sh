#!/usr/bin/env bash
# Issue 17's GPU evidence in one run of at most ~5 minutes on a lent GPU
# machine (see /work/.library/device there): the fused path of JAX and
# PyTorch on the CUDA kernels, against streaming and dense, and JAX model.fit
# at 10^5 and 10^6 classes against a one-hot Dense(n) head.
#
#   bash benchmarks/device_wheels.sh                     (here, once: fills .whl/)
#   OUT=$OUT bash benchmarks/device_run_backends.sh      (there, from the
#                                                         repository root; carry
#                                                         .whl, timeout_s >= 320)
#   bash benchmarks/device_run_backends.sh --dry-run     (prints the phases,
#                                                         limits and commands)
#   bash benchmarks/device_run_backends.sh --simulate-gpu  (the GPU code paths
#                                                         on the CPU, tiny
#                                                         shapes: the tests)
#
# A call of its own, not the same call as benchmarks/device_run.sh: that one
# leaves 8 files under $OUT, the most the device tool returns. On the same
# warm machine the wheels installed by device_run.sh are reused.
#
# Phases, each under a hard `timeout`, none stopping the next:
#   info     nvidia-smi (name, compute capability, memory), nvcc, versions
#   wheels   keras and its requirements from the carried .whl/ into /tmp/site
#            (skipped when keras is already there)
#   build    the framework-free kernel library keras_ecoc/_lib/_ecoc_kernels.so
#            with nvcc for this card's architecture only (KERAS_ECOC_CUDA_ARCHS
#            from nvidia-smi's compute_cap); fails without the CUDA part
#   status   under KERAS_BACKEND=jax and =torch: the backend is on the GPU,
#            fused_status() names the kernel library's CUDA kernels,
#            loss_path(10**5) == "fused" (the dispatcher asked for the GPU),
#            and one jitted fused loss + gradient (B = 8, k = 16, n = 1000)
#            matches a float64 NumPy reference (benchmarks/device_fused_check.py);
#            a call that raises fails the phase and its error is the note
#   bench    benchmarks/bench_fused_backends.py --device gpu, jax then torch:
#            fused vs streaming vs dense, forward+backward, B in {16, 256},
#            k in {32, 128}, n in {10^4, 10^5, 10^6}, time and peak device
#            memory; every cell written to the JSON as it finishes, the cells
#            that do not fit its --time-limit skipped and named
#   fit      benchmarks/bench_scale.py on JAX: ECOCClassifier (k = 64) and a
#            one-hot Dense(n) head at n = 10^5 and 10^6, a few steps each:
#            step time and peak device memory (one fresh process per row)
#
# Budget: DEVICE_RUN_BACKENDS_BUDGET seconds in all (default 280); the fit
# phase keeps at least DEVICE_RUN_BACKENDS_FIT_MIN (75) s, the bench phase
# gets the rest (--dry-run charges every earlier phase its whole limit, so it
# shows the worst case); the last phase ends at most ~10 s after the budget.
# DEVICE_RUN_BACKENDS_BENCH_ARGS and DEVICE_RUN_BACKENDS_FIT_ARGS replace the
# two benchmarks' shape arguments (word-split); DEVICE_RUN_BACKENDS_ONLY (say
# "status" or "build,status") runs only the phases it names.
#
# Files under $OUT (6): backends_summary.md (each phase: status, seconds,
# note), backends.log (everything printed), bench_fused_backends_gpu.json/.md,
# fit_jax_gpu.jsonl/.md. Without a GPU (nvidia-smi lists none) every GPU phase
# says NO GPU and runs nothing. Always exits 0 (the summary holds the
# statuses), except for a bad command line (3).
set -u -o pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 1
DRY_RUN=0 SIMULATE=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    --simulate-gpu) SIMULATE=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "device_run_backends: unknown argument '$arg'" \
            "(usage: device_run_backends.sh [--dry-run] [--simulate-gpu])" >&2; exit 3 ;;
  esac
done
SCRIPT_NAME=device_run_backends
# positive_int, left, write_summary, phase
source "$REPO/benchmarks/device_lib.sh"
BUDGET=$(positive_int DEVICE_RUN_BACKENDS_BUDGET "${DEVICE_RUN_BACKENDS_BUDGET:-280}") || exit 3
FIT_MIN=$(positive_int DEVICE_RUN_BACKENDS_FIT_MIN "${DEVICE_RUN_BACKENDS_FIT_MIN:-75}") || exit 3
OUT="${OUT:-$REPO/build/device_run_backends}"
# A comma-separated subset of the phases (say "status" on a warm machine after
# a fix); the others are SKIPPED rows. Empty: every phase.
PHASE_ONLY="${DEVICE_RUN_BACKENDS_ONLY:-}" PHASE_ONLY_VAR=DEVICE_RUN_BACKENDS_ONLY
PY="${PYTHON:-python3}"
[[ -d /usr/local/cuda/bin ]] && export PATH="$PATH:/usr/local/cuda/bin"
WHEELS="${WHEEL_DIR:-.whl}"
SITE="${SITE_DIR:-/tmp/site}"
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
# JAX must not take 75% of the card at start: the peak statistics then show
# what the programs use, and PyTorch's cells (a later process) find memory.
export XLA_PYTHON_CLIENT_PREALLOCATE=false

# The card: "90" for compute capability 9.0; empty without a GPU.
ARCH=""
if ((!DRY_RUN)) && command -v nvidia-smi >/dev/null 2>&1; then
  ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')"
  [[ "$ARCH" =~ ^[0-9]+$ ]] || ARCH=""
fi
((DRY_RUN)) && ARCH="<compute_cap of GPU 0>"
GPU=0; [[ -n "$ARCH" ]] && GPU=1
((SIMULATE)) && GPU=1

# Shapes: the issue's grid, or tiny ones with --simulate-gpu (the CPU runs them).
if ((SIMULATE)); then
  BENCH_SHAPES=(--batch 4 --k 8 --n 1000 --reps 1 --simulate-gpu)
  FIT_SHAPES=(--n 1000 --k 8 --batch 16 --steps 2 --epochs 2 --onehot-steps 2 --onehot-epochs 2)
else
  BENCH_SHAPES=(--batch 16,256 --k 32,128 --n 10000,100000,1000000 --reps 3 --big-reps 2
                --dense-max-mb 4096)
  FIT_SHAPES=(--n 100000 1000000 --k 64 --batch 256 --steps 8 --epochs 2 --onehot-steps 8
              --onehot-epochs 2)
fi
[[ -n "${DEVICE_RUN_BACKENDS_BENCH_ARGS:-}" ]] && read -r -a BENCH_SHAPES <<<"$DEVICE_RUN_BACKENDS_BENCH_ARGS"
[[ -n "${DEVICE_RUN_BACKENDS_FIT_ARGS:-}" ]] && read -r -a FIT_SHAPES <<<"$DEVICE_RUN_BACKENDS_FIT_ARGS"

START=$SECONDS
LOG="$OUT/backends.log"
SUMMARY="$OUT/backends_summary.md"
if ((DRY_RUN)); then
  LOG=/dev/null
  echo "device_run_backends --dry-run: budget ${BUDGET} s; would write under $OUT:" \
       "backends_summary.md backends.log bench_fused_backends_gpu.json" \
       "bench_fused_backends_gpu.md fit_jax_gpu.jsonl fit_jax_gpu.md"
else
  mkdir -p "$OUT"
  : >"$LOG"
  rm -f "$OUT/bench_fused_backends_gpu.json" "$OUT/fit_jax_gpu.jsonl"
fi
ROWS=()
DRY_ELAPSED=0
((SIMULATE)) && SUMMARY_NOTE="(SIMULATED: --simulate-gpu, the CPU; not GPU numbers)"

# --- info (runs with or without a GPU) ---------------------------------------------
info() {
  echo "date: $(date -u +%FT%TZ); host: $(uname -n)"
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv 2>&1 \
    || echo "nvidia-smi: no GPU listed"
  command -v nvcc >/dev/null && nvcc --version | tail -n 2 || echo "nvcc: not found"
  "$PY" -c 'import platform; print("python", platform.python_version())'
}
export -f info
export PY
NEEDS_GPU=0 PHASE_NOTE="arch ${ARCH:-none}" phase info 10 bash -c info

# --- wheels ---------------------------------------------------------------------
install_wheels() {
  # find_spec, not `import keras`: that imports the default backend (TensorFlow).
  local found
  if found="$("$PY" -c 'import importlib.util as u, importlib.metadata as m
s = u.find_spec("keras"); print(m.version("keras"), s.origin) if s else exit(1)' 2>/dev/null)"; then
    echo "keras already there ($found): nothing installed"; return 0
  fi
  shopt -s nullglob
  local whl=("$WHEELS"/*.whl)
  if ((${#whl[@]} == 0)); then
    echo "no wheels in $WHEELS/ and keras does not import (carry .whl; see benchmarks/device_wheels.sh)"
    return 1
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${whl[@]}"
}
export -f install_wheels
export WHEELS SITE
NEEDS_GPU=0 PHASE_NOTE="into $SITE" phase wheels 20 bash -c install_wheels  # 0 s on the H100

# --- build: the kernel library for this card only ---------------------------------
# build_kernels, not build.py's main: no TensorFlow op library (none there),
# and a kernel library without its CUDA part is a failure here.
BUILD_CHECK='import os, sys
sys.path.insert(0, "kernels")
import build
r = build.build_kernels(cuda=False if os.environ.get("SIMULATE") == "1" else None)
print(r.summary())
sys.exit(0 if ("cuda" in r.parts or os.environ.get("SIMULATE") == "1") else 1)'
SIMULATE=$SIMULATE KERAS_ECOC_CUDA_ARCHS="$ARCH" PHASE_NOTE="KERAS_ECOC_CUDA_ARCHS=$ARCH" \
  phase build 60 "$PY" -c "$BUILD_CHECK"  # 27 s on the H100
[[ -n "$ARCH" ]] && export KERAS_ECOC_CUDA_ARCHS="$ARCH"

# --- status: the dispatcher picks the CUDA kernels under JAX and PyTorch -----------
STATUS_CHECK='import os, sys
from keras_ecoc import ops
from keras_ecoc.ops import _dispatch, _loader
b = os.environ["KERAS_BACKEND"]
status, path = ops.fused_status(), ops.loss_path(10**5)
on_gpu = _dispatch._on_gpu_for(b, None)  # JAX default backend gpu / torch.cuda.is_available()
print(b, "| on GPU:", on_gpu, "| fused_status:", status, "| loss_path(1e5):", path)
print(ops.backend_status(10**5))
cuda = on_gpu and _loader.kernels_have_cuda() and "and CUDA kernels" in status
if path != "fused" or not (cuda or os.environ.get("SIMULATE") == "1"):
    print(f"FAIL {b}: loss_path(10**5) = {path}, on GPU {on_gpu}, CUDA kernels {cuda}")
    sys.exit(1)'
# The dispatcher's answer is not enough (on the H100 of 2026-11-26 it said
# "fused" for JAX and every JAX fused call then raised): each backend also
# runs one jitted fused loss + gradient and compares it with float64 NumPy
# (benchmarks/device_fused_check.py); its FAIL line names the error.
status_both() {
  local rc=0 sim=()
  ((SIMULATE)) && sim=(--simulate-gpu)
  for b in jax torch; do
    KERAS_BACKEND=$b "$PY" -c "$STATUS_CHECK" || rc=1
    KERAS_BACKEND=$b "$PY" benchmarks/device_fused_check.py "${sim[@]}" || rc=1
  done
  return $rc
}
export -f status_both
export STATUS_CHECK SIMULATE
# 22 s on the H100 without the fused calls; four processes on a loaded CPU
# machine (--simulate-gpu, the tests) take minutes.
STATUS_LIMIT=60; ((SIMULATE)) && STATUS_LIMIT=240
PHASE_NOTE="dispatcher picks the CUDA kernels and one jitted fused loss + gradient matches float64: jax and torch" \
  PHASE_NOTE_GREP="^FAIL " phase status "$STATUS_LIMIT" bash -c status_both

# --- bench: fused vs streaming vs dense on the GPU ------------------------------------
BLIMIT=$(( $(left) - FIT_MIN ))
BENCH_JSON="$OUT/bench_fused_backends_gpu.json"
PHASE_NOTE="table in bench_fused_backends_gpu.md (skipped cells named there)" \
  phase bench "$BLIMIT" "$PY" benchmarks/bench_fused_backends.py --device gpu --backends jax,torch \
  "${BENCH_SHAPES[@]}" --time-limit "$((BLIMIT > 40 ? BLIMIT - 25 : BLIMIT / 2))" --grace 10 \
  --json "$BENCH_JSON"
if ((!DRY_RUN)) && [[ -s "$BENCH_JSON" ]]; then
  timeout 30 "$PY" benchmarks/bench_fused_backends.py --render "$BENCH_JSON" \
    >"$OUT/bench_fused_backends_gpu.md" 2>>"$LOG"
fi

# --- fit: JAX model.fit, ECOC against one-hot -------------------------------------------
FLIMIT=$(( $(left) - 5 ))
FIT_JSONL="$OUT/fit_jax_gpu.jsonl"
PHASE_NOTE="rows in fit_jax_gpu.md" \
  phase fit "$FLIMIT" "$PY" benchmarks/bench_scale.py --backends jax --models classifier onehot \
  "${FIT_SHAPES[@]}" --timeout "$FLIMIT" --out "$FIT_JSONL" --overwrite
if ((!DRY_RUN)) && [[ -s "$FIT_JSONL" ]]; then
  timeout 30 "$PY" benchmarks/bench_scale.py --render "$FIT_JSONL" >"$OUT/fit_jax_gpu.md" 2>>"$LOG"
fi

if ((DRY_RUN)); then
  echo "worst case (every phase runs to its limit): $((BUDGET - $(left))) s of the ${BUDGET} s budget"
  exit 0
fi
write_summary
cat "$SUMMARY"
exit 0
