# Sourced by kernels/cuda/device_retime.sh and ncu_stalls.sh (from the
# repository root): the prebuilt harness they run and the Nsight Compute
# profile they take of it.
[[ -d /usr/local/cuda/bin ]] && export PATH="$PATH:/usr/local/cuda/bin"
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"

# prebuilt_harness DEST: prints device_check.sh's --prebuilt-status line and
# copies the harness it names to DEST; returns 4, copying nothing, where that
# harness was not built from this tree (a stale binary would time the old
# kernels).
prebuilt_harness() {
  local status
  status="$(bash kernels/cuda/device_check.sh --prebuilt-status 2>&1)"
  echo "$status"
  grep -q '^prebuilt: match' <<< "$status" || return 4
  cp "${status#prebuilt: match }" "$1"
}

# ncu_profile EXE REPORT KERNEL_REGEX VARIANT MATH LOG DETAILS SOURCE:
# Nsight Compute's full set (stall reasons sampled per program counter) on
# the matching kernels of
# `EXE --profile --variant VARIANT --math MATH` into REPORT.ncu-rep, then
# appends its details page (--print-details all) to DETAILS and writes its
# SASS source page (per instruction) to SOURCE; what ncu prints goes to LOG.
# Returns 1 where no report was written.
ncu_profile() {
  local exe=$1 report=$2 regex=$3 variant=$4 math=$5 log=$6 details=$7 source=$8
  timeout 120 "$NCU" --set full --import-source no --kernel-name "regex:$regex" -f -o "$report" \
    "$exe" --profile --variant "$variant" --math "$math" >> "$log" 2>&1 \
    || echo "ncu exit $? for $report" >> "$log"
  [[ -f "$report.ncu-rep" ]] || return 1
  "$NCU" -i "$report.ncu-rep" --page details --print-details all >> "$details" 2>> "$log" \
    || echo "details page failed for $report" >> "$log"
  "$NCU" -i "$report.ncu-rep" --page source --csv --print-source sass > "$source" 2>> "$log" \
    || echo "source page failed for $report" >> "$log"
}
