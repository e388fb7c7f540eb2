#!/usr/bin/env bash
# Builds .whl/ for benchmarks/device_run.sh: the wheels the GPU machine lacks,
# as listed in benchmarks/device_wheels.txt (run here, where pip reaches PyPI;
# the GPU machine reaches nothing), and the CUDA harness for sm_90
# (kernels/cuda/device_check.sh --prebuild: ~40 s of nvcc here instead of
# ~75 s of the device's time; it is used there only while its stamp matches
# the carried tree and the device's nvcc, so rerun this after editing
# kernels/cuda).
#
#   bash benchmarks/device_wheels.sh [--dry-run] [CCE_MIRROR]
#
# CCE_MIRROR: a git directory of apple/ml-cross-entropy (the search tool's
# `fetch github:apple/ml-cross-entropy` gives one; default
# /work/.mirror/apple+ml-cross-entropy/repo). The pinned commit is built if
# the mirror has it, else its HEAD (said on stderr). PyPI wheels come as the
# device README says (CPython 3.12, manylinux x86-64, --no-deps).
# Env: PYTHON (default .venv/bin/python when present, else python3), WHEEL_DIR (default .whl).
# Exit codes: 0 every wheel of the list and the harness are in WHEEL_DIR; 1 a
# download or build failed or a wheel is missing; 3 bad command line.
set -u -o pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIST="$REPO/benchmarks/device_wheels.txt"
# The project's venv when there is one: building the cut cross-entropy wheel
# without build isolation needs setuptools and wheel, which a bare python3
# lacks ("invalid command 'bdist_wheel'").
DEFAULT_PY=python3
[[ -x "$REPO/.venv/bin/python" ]] && DEFAULT_PY="$REPO/.venv/bin/python"
PY="${PYTHON:-$DEFAULT_PY}"
DEST="${WHEEL_DIR:-$REPO/.whl}"
DRY=0 MIRROR=/work/.mirror/apple+ml-cross-entropy/repo
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "device_wheels: unknown option '$arg' (usage: device_wheels.sh [--dry-run] [CCE_MIRROR])" >&2; exit 3 ;;
    *) MIRROR="$arg" ;;
  esac
done
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
run() { echo "+ $*"; ((DRY)) || "$@"; }
((DRY)) || mkdir -p "$DEST"
FAILED=0
while read -r spec source; do
  [[ -z "$spec" || "$spec" == \#* ]] && continue
  name="${spec%%==*}" version="${spec##*==}"
  case "$source" in
    pypi)
      run "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${PLATFORMS[@]}" -d "$DEST" "$spec" || FAILED=1 ;;
    git:*)
      commit="${source##*@}" tmp="$(mktemp -d)"
      if ((!DRY)) && ! git -C "$MIRROR" cat-file -e "$commit^{commit}" 2>/dev/null; then
        echo "device_wheels: $MIRROR lacks $commit; building its HEAD" \
             "($(git -C "$MIRROR" rev-parse HEAD 2>/dev/null || echo 'no git directory'))" >&2
        commit=HEAD
      fi
      echo "+ git -C $MIRROR archive $commit | tar -x -C $tmp"
      if ((!DRY)); then
        git -C "$MIRROR" archive "$commit" | tar -x -C "$tmp" || FAILED=1
      fi
      run "$PY" -m pip wheel -q --no-deps --no-build-isolation "$tmp" -w "$DEST" || FAILED=1
      rm -rf "$tmp" ;;
    *) echo "device_wheels: unknown source '$source' for $spec in $LIST" >&2; FAILED=1 ;;
  esac
  if ((!DRY)); then
    # Wheel file names use underscores: liger-kernel -> liger_kernel-0.8.5-*.whl
    shopt -s nullglob
    found=("$DEST/${name//-/_}-$version-"*.whl)
    if ((${#found[@]} != 1)); then
      echo "device_wheels: expected one ${name//-/_}-$version-*.whl in $DEST, found ${#found[@]}" >&2
      FAILED=1
    fi
  fi
done <"$LIST"
run bash "$REPO/kernels/cuda/device_check.sh" --prebuild "$DEST" || FAILED=1
((DRY)) || ls -l "$DEST"
exit $FAILED
