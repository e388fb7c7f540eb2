# Helpers shared by benchmarks/device_run.sh and benchmarks/device_run_backends.sh
# (sourced, not run). Each script sets, before calling them:
#   SCRIPT_NAME  the prefix of messages ("device_run")
#   BUDGET       seconds in all; START=$SECONDS at the start
#   DRY_RUN      1: print the phases and charge each its whole limit, run nothing
#   LOG          the file every phase's output is appended to (/dev/null in a dry run)
#   SUMMARY      the Markdown summary file; SUMMARY_NOTE: text after its title
#   ROWS=()      the summary rows; DRY_ELAPSED=0
# and may set GPU=0 (phases with NEEDS_GPU unset or 1 then say NO GPU and run
# nothing) and PHASE_ONLY (a comma-separated list of phase names; the others
# are SKIPPED rows).

# positive_int NAME VALUE [DEFAULT]: echoes VALUE if it is a positive integer.
# Otherwise, with DEFAULT: a warning naming NAME on stderr and DEFAULT; without:
# an error naming NAME on stderr and return code 3 (the caller exits 3).
positive_int() {
  if [[ "$2" =~ ^[1-9][0-9]*$ ]]; then echo "$2"; return 0; fi
  echo "$SCRIPT_NAME: $1 must be a positive integer number of seconds. Received: $1=$2" >&2
  if (($# > 2)); then echo "$3"; return 0; fi
  return 3
}

# Seconds left in the budget (a dry run counts every earlier phase's whole limit).
left() { echo $((BUDGET - (SECONDS - START) - DRY_ELAPSED)); }

write_summary() {
  ((DRY_RUN)) && return
  {
    echo "# $SCRIPT_NAME $(date -u +%FT%TZ): $((SECONDS - START)) s of a ${BUDGET} s budget" \
         "${SUMMARY_NOTE:-}"
    echo
    echo "| phase | status | seconds | note |"
    echo "|---|---|---:|---|"
    printf '%s\n' "${ROWS[@]}"
  } >"$SUMMARY"
}

# phase NAME LIMIT COMMAND...: runs COMMAND under `timeout LIMIT`, appends its
# output to $LOG and a row to the summary. The note: the first three lines of
# the phase's output that match the extended regex PHASE_NOTE_GREP (if set),
# then PHASE_NOTE. Never exits; returns COMMAND's exit code (99: no time left,
# 98: no GPU, 97: not in PHASE_ONLY). With DRY_RUN it prints the phase instead
# and returns 0.
phase() {
  local name="$1" limit="$2"; shift 2
  if ((DRY_RUN)); then
    local cmd="$*"
    echo "phase $name (<= ${limit} s, starts by $((BUDGET - $(left))) s): ${cmd//$'\n'/ }"
    DRY_ELAPSED=$((DRY_ELAPSED + limit))
    ROWS+=("| $name | DRY RUN | 0 | |"); return 0
  fi
  if ((limit < 5)); then
    ROWS+=("| $name | SKIPPED | 0 | no time left in the ${BUDGET} s budget |")
    echo "## phase $name: SKIPPED (no time left)" >>"$LOG"; write_summary; return 99
  fi
  if [[ -n "${PHASE_ONLY:-}" && ",$PHASE_ONLY," != *",$name,"* ]]; then
    ROWS+=("| $name | SKIPPED | 0 | not in ${PHASE_ONLY_VAR:-PHASE_ONLY}=$PHASE_ONLY |")
    write_summary; return 97
  fi
  if ((${NEEDS_GPU:-1} && !${GPU:-1})); then
    ROWS+=("| $name | NO GPU | 0 | nvidia-smi lists no GPU: nothing run |"); write_summary; return 98
  fi
  echo "## phase $name (limit ${limit} s) $(date -u +%T): $*" >>"$LOG"
  local t0=$SECONDS rc from found
  from=$(wc -l <"$LOG")
  timeout --kill-after=5 "$limit" "$@" >>"$LOG" 2>&1
  rc=$?
  local dt=$((SECONDS - t0)) status=pass note="${PHASE_NOTE:-}"
  if [[ -n "${PHASE_NOTE_GREP:-}" ]]; then
    found="$(tail -n +"$((from + 1))" "$LOG" | grep -E "$PHASE_NOTE_GREP" | head -n3 | tr '\n' ' ')"
    [[ -n "$found" ]] && note="${found% }${note:+; $note}"
  fi
  if [[ $rc == 124 || $rc == 137 ]]; then status=FAIL; note="timed out after ${limit} s; $note"
  elif [[ $rc != 0 ]]; then status=FAIL; note="exit code $rc; $note"; fi
  ROWS+=("| $name | $status | $dt | ${note//|//} |")
  echo "## phase $name: $status in $dt s (exit $rc)" >>"$LOG"
  write_summary
  return $rc
}

# no_gpu_row NAME SECONDS NOTE: replaces the last summary row (a phase that
# found no GPU itself ran nothing; that is neither a pass nor a failure).
no_gpu_row() {
  ((DRY_RUN)) && return
  ROWS[${#ROWS[@]}-1]="| $1 | NO GPU | $2 | $3 |"
  write_summary
}
