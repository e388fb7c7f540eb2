#!/bin/bash
# The accuracy metric's cost in a model.fit step (TensorFlow, CPU, fused op,
# n = 100,000): six rounds, the two models' order alternated from round to
# round, one JSON-lines file per (round, batch, k) in this folder. Then
# `python docs/results/metric_cost/summarize.py` prints the paired table.
# Run from anywhere; PYTHON defaults to the checkout's .venv.
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PYTHON:-.venv/bin/python}
out=docs/results/metric_cost
for round in 1 2 3 4 5 6; do
  for B in 16 256; do
    for k in 32 128; do
      if [ $((round % 2)) = 1 ]; then models="loss loss_nometric"; else models="loss_nometric loss"; fi
      file="$out/tf_r${round}_B${B}_k${k}.jsonl"
      if [ -e "$file" ] && [ -z "${OVERWRITE:-}" ]; then
        echo "$file exists; set OVERWRITE=1 to replace it" >&2
        exit 2
      fi
      # shellcheck disable=SC2086
      "$PY" benchmarks/bench_scale.py --n 100000 --k "$k" --batch "$B" --steps 16 --epochs 3 \
        --backends tensorflow --models $models --out "$file" --overwrite
    done
  done
done
