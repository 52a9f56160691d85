#!/bin/bash
# Non-causal and causal forward+backward at N = 2^20, alternated, so each causal/non-causal
# ratio compares runs a minute apart (the machine's bandwidth drifts between ~47 and ~73 GB/s).
cd "$(dirname "$0")/../../../.."
R=./target/release/racelab
O=figures/bench/runs/paired-2e20
T=$(mktemp -d)  # the CSV/PNG each run also writes (the JSON has the same rows)
for i in ${RUNS:-1 2}; do
  $R bench --backward --n 1048576 --json --out $T/nc$i > $O/noncausal-$i.json
  $R bench --backward --causal --n 1048576 --json --out $T/c$i > $O/causal-$i.json
done
