#!/bin/bash
# Causal and non-causal forward+backward at the paper shape, N = 2^20, in one invocation per
# run: `--causal-ratio` alternates their runs (after a warm-up of each), so both see the same
# memory state, and rows at this size are bracketed by their own bandwidth probes.
# RUNS="10 11" bash figures/bench/runs/causal-ratio-2e20/run.sh
cd "$(dirname "$0")/../../../.."
R=./target/release/racelab
O=figures/bench/runs/causal-ratio-2e20
T=$(mktemp -d)  # the CSV/PNG each run also writes (the JSON has the same rows)
for i in ${RUNS:-1 2}; do
  $R bench --causal-ratio --backward --n 1048576 --runs 5 --json --out $T/$i > $O/run-$i.json
done
