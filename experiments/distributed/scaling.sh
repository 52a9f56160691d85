#!/usr/bin/env bash
# Strong and weak scaling of `racelab bench --distributed` with 1, 2 and 4 ranks on this
# machine, causal and not, at the paper shape (4 heads, d = 128, (P, L) = (2, 2)); one JSON
# row per run into $1 (default docs/bench/distributed.jsonl). Needs a build with
# `--features mpi` and Open MPI. Ranks share the machine's cores: each rank gets
# cores/ranks rayon threads (at least 1), so 4 ranks on 2 cores are oversubscribed 2×.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-docs/bench/distributed.jsonl}
strong=${STRONG_N:-262144}
weak=${WEAK_N:-131072}
cores=$(nproc)
bin=${RACELAB_BIN:-target/release/racelab}
: > "$out"
for causal in "" "--causal"; do
    for mode in strong weak; do
        for ranks in 1 2 4; do
            threads=$(( cores / ranks )); [ "$threads" -ge 1 ] || threads=1
            if [ "$mode" = strong ]; then n=$strong; flag=""; else n=$weak; flag="--weak"; fi
            RAYON_NUM_THREADS=$threads mpirun --allow-run-as-root --oversubscribe --bind-to none \
                -np "$ranks" "$bin" bench --distributed $flag $causal --n "$n" \
                --heads 4 --d 128 --p 2 --l 2 --runs 3 --json --out /tmp/racelab-row.json >/dev/null
            cat /tmp/racelab-row.json >> "$out"
            echo "$mode ranks=$ranks threads=$threads $causal: $(grep -o '"seconds":[0-9.e-]*' /tmp/racelab-row.json | head -1)"
        done
    done
done
