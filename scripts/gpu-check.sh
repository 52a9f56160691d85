#!/usr/bin/env bash
# One command for a GPU machine: build, run the CUDA tests against the CPU kernels, and a
# short benchmark at the paper shape (batch 1, 4 heads, d = 128, f32, forward+backward):
# N = 2^20 and 2^22 for (P,L) = (2,2) and (4,4), then the largest N tried for (2,2).
# Designed to finish inside 8 minutes on an H200. Writes everything under $OUT (or ./gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check}"
mkdir -p "$OUT"
start=$(date +%s)
log() { echo "[gpu-check +$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/summary.txt"; }

log "nvidia-smi: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
log "building (release)"
cargo build --release --all-targets >"$OUT/build.log" 2>&1 || { log "BUILD FAILED (see build.log)"; tail -30 "$OUT/build.log"; exit 1; }

log "CUDA tests (RACELAB_CUDA_TESTS=1)"
RACELAB_CUDA_TESTS=1 timeout 180 cargo test --release --test cuda -- --nocapture >"$OUT/cuda-tests.log" 2>&1
rc=$?
grep -E "^test |test result" "$OUT/cuda-tests.log" | tee -a "$OUT/summary.txt"
[ $rc -eq 0 ] || { log "CUDA TESTS FAILED (rc=$rc)"; grep -A15 "panicked" "$OUT/cuda-tests.log" | head -40; }

for pl in "2 2" "4 4"; do
  set -- $pl
  log "bench (P,L)=($1,$2) N=2^20,2^22 fwd+bwd non-causal"
  timeout 150 ./target/release/racelab bench --device cuda --backward --n 1048576,4194304 --p "$1" --l "$2" \
      --out "$OUT/bench-$1-$2" >"$OUT/bench-$1-$2.txt" 2>&1
  grep -E "^race|bandwidth|skipped|error" "$OUT/bench-$1-$2.txt" | tee -a "$OUT/summary.txt"
done
log "bench (2,2) causal fwd+bwd N=2^22"
timeout 90 ./target/release/racelab bench --device cuda --backward --causal --n 4194304 --p 2 --l 2 \
    --out "$OUT/bench-causal" >"$OUT/bench-causal.txt" 2>&1
grep -E "^race|error" "$OUT/bench-causal.txt" | tee -a "$OUT/summary.txt"
for n in 16777216 33554432; do
  log "largest-N probe (2,2) fwd+bwd N=$n"
  timeout 90 ./target/release/racelab bench --device cuda --backward --n "$n" --p 2 --l 2 --runs 3 \
      --out "$OUT/bench-large-$n" >"$OUT/bench-large-$n.txt" 2>&1
  grep -E "^race|error|skipped" "$OUT/bench-large-$n.txt" | tee -a "$OUT/summary.txt"
done
log "done"
