#!/usr/bin/env bash
# One command for a GPU machine: run the CUDA tests against the CPU kernels (the default
# kernels, then the tiled and the warp-per-chunk kernels forced, with several tiles per
# chunk), then a short benchmark at the paper shape (batch 1, 4 heads, d = 128, f32) for
# (P,L) = (2,2) and (4,4): forward+backward, non-causal and causal, at N = 2^20 and 2^22 per
# head (4·2^20 and 16·2^20 tokens); forward only at 2^20; and the forward+backward rows at
# 2^20 again on the warp-per-chunk kernels; and a lean PyTorch version of the operator on the
# same GPU. Run 3 took 350 s on an H200 (the issue asks for under 8 minutes). Everything goes
# under $OUT (or ./gpu-check): summary.txt and one gpu-check.tgz with the logs and each
# bench's csv/json/png.
#
# Knobs for a short rerun (run 4 used all three):
# - GPU_CHECK_SKIP="warp torch": skip the warp-per-chunk benches and/or the PyTorch comparison;
# - GPU_CHECK_VARIANTS="-DPROD_SPREAD=64 ...": also bench forward+backward at 2^20, non-causal and
#   causal, with each variant's defines (RACELAB_CUDA_DEFINES), one variant per word;
# - GPU_CHECK_NCU=1: an Nsight Compute profile of one forward+backward at (2,2), 2^20, on the
#   default kernels (ncu-22.txt: duration, throughput, issue and occupancy per kernel).
#
# Two ways to run it:
# - with cargo on the GPU machine: `scripts/gpu-check.sh` builds and tests there;
# - without (the lent machines have no Rust): build here with
#   `scripts/gpu-check.sh --prebuild DIR`, which puts the `racelab` binary and the CUDA test
#   binary (compiled with RACELAB_CUDA_TESTS=1) in DIR; carry DIR and run
#   `RACELAB_PREBUILT=DIR scripts/gpu-check.sh` there.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prebuild" ]; then
  dir="${2:?usage: scripts/gpu-check.sh --prebuild DIR}"
  mkdir -p "$dir"
  export RACELAB_CUDA_TESTS=1 CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/gpu-prebuild}"
  t=$(cargo test --release --test cuda --no-run --message-format=json 2>/dev/null |
      python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="cuda" and m.get("executable"): print(m["executable"])')
  [ -n "$t" ] || { echo "building the CUDA test binary failed"; exit 1; }
  cargo build --release --bin racelab || exit 1
  cp "$t" "$dir/cuda-test" && cp "$CARGO_TARGET_DIR/release/racelab" "$dir/racelab"
  strip "$dir/cuda-test" "$dir/racelab" 2>/dev/null
  # The revision the binaries were built from (the lent machine's copy of .git may not say).
  echo "$(git rev-parse --short=12 HEAD)$(git diff --quiet HEAD || echo +dirty)" >"$dir/REV"
  # Compressed, because a lent machine's upload limit (64 MiB with the tracked files) is tight.
  xz -9e -f "$dir/cuda-test" "$dir/racelab"
  ls -la "$dir"
  exit 0
fi

OUT="${OUT:-gpu-check}"
W=$(mktemp -d)
mkdir -p "$OUT"
start=$(date +%s)
# summary.txt is written straight into $OUT, so a run cut short still returns it.
ln -s "$(cd "$OUT" && pwd)/summary.txt" "$W/summary.txt"
log() { echo "[gpu-check +$(( $(date +%s) - start ))s] $*" | tee -a "$W/summary.txt"; }
finish() { tar czhf "$OUT/gpu-check.tgz" -C "$W" .; }
trap finish EXIT

log "nvidia-smi: $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"
log "host: $(nproc) cores, $(free -g | awk '/Mem/{print $2" GiB, "$7" GiB available"}'); $(nvcc --version 2>/dev/null | tail -1)"

# cudarc loads libcuda and libnvrtc by name (libnvrtc.so, .so.12, ...): make the toolkit's
# NVRTC findable, under the unversioned name if only a versioned one (e.g. .so.13) exists.
libs=$(mktemp -d)
nv=$(ls /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda*/targets/*/lib/libnvrtc.so* 2>/dev/null | head -1)
[ -n "$nv" ] || nv=$(find / -xdev -name 'libnvrtc.so*' 2>/dev/null | grep -v builtins | head -1)
if [ -n "$nv" ]; then
  ln -sf "$nv" "$libs/libnvrtc.so"
  export LD_LIBRARY_PATH="$libs:$(dirname "$nv")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
log "NVRTC: ${nv:-not found}"

if [ -n "${RACELAB_PREBUILT:-}" ]; then
  bin=$(mktemp -d)
  for f in racelab cuda-test; do
    python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' \
      "$RACELAB_PREBUILT/$f.xz" "$bin/$f" && chmod +x "$bin/$f"
  done
  log "prebuilt binaries from revision $(cat "$RACELAB_PREBUILT/REV" 2>/dev/null || echo unknown)"
  # Their outputs record that revision, not whatever the copied .git says.
  export RACELAB_BUILD_REV="$(cat "$RACELAB_PREBUILT/REV" 2>/dev/null)"
  RACELAB_PREBUILT=$bin
  racelab="$RACELAB_PREBUILT/racelab"
  cudatest=("$RACELAB_PREBUILT/cuda-test")
else
  log "building (release)"
  cargo build --release --bin racelab >"$W/build.log" 2>&1 || { log "BUILD FAILED (see build.log)"; tail -30 "$W/build.log"; exit 1; }
  racelab=./target/release/racelab
  cudatest=(env RACELAB_CUDA_TESTS=1 cargo test --release --test cuda --)
fi

log "CUDA tests"
timeout 150 "${cudatest[@]}" --skip emulated --nocapture --test-threads=1 >"$W/cuda-tests.log" 2>&1
rc=$?
grep -E "^test |test result|skipped|^cuda P" "$W/cuda-tests.log" | tee -a "$W/summary.txt"
[ $rc -eq 0 ] || { log "CUDA TESTS FAILED (rc=$rc)"; grep -B2 -A15 "panicked" "$W/cuda-tests.log" | head -60 | tee -a "$W/summary.txt"; }
for path in tiled warp; do
  log "CUDA test, RACELAB_CUDA_PATH=$path, chunks of 64 tokens (several tiles per chunk)"
  RACELAB_CUDA_CHUNK=64 RACELAB_CUDA_PATH=$path timeout 100 "${cudatest[@]}" soft_race_on_cuda_device --nocapture --test-threads=1 >"$W/cuda-tests-$path.log" 2>&1
  rc=$?
  grep -E "test result|^cuda P" "$W/cuda-tests-$path.log" | tee -a "$W/summary.txt"
  [ $rc -eq 0 ] || { log "CUDA TEST ON THE $path PATH FAILED (rc=$rc)"; grep -B2 -A15 "panicked" "$W/cuda-tests-$path.log" | head -40 | tee -a "$W/summary.txt"; }
done

bench() {  # name, timeout, args...
  local name=$1 to=$2; shift 2
  log "bench $name: $*"
  timeout "$to" "$racelab" bench --device cuda "$@" --out "$W/$name" >"$W/$name.txt" 2>&1
  local r=$?
  grep -E "^GPU|^race|skipped|rror" "$W/$name.txt" | tee -a "$W/summary.txt"
  [ $r -eq 0 ] || log "bench $name exited with $r"
}
# The paper shape, forward+backward, N = 2^20 and 2^22 per head (4 and 16 Mi tokens), on the
# default (tiled) kernels.
bench nc 120 --backward --n 1048576,4194304 --p 2,4 --l 2,4
bench causal 100 --backward --causal --n 1048576,4194304 --p 2,4 --l 2,4
# Forward only.
bench fwd 40 --n 1048576 --p 2,4 --l 2,4
bench fwd-causal 40 --causal --n 1048576 --p 2,4 --l 2,4
skip() { case " ${GPU_CHECK_SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
# Variants of the kernels' tuning macros, forward+backward at 2^20.
i=0
for v in ${GPU_CHECK_VARIANTS:-}; do
  i=$((i + 1))
  export RACELAB_CUDA_DEFINES="$v"
  bench "nc-v$i" 90 --backward --n 1048576 --p 2,4 --l 2,4
  bench "causal-v$i" 90 --backward --causal --n 1048576 --p 2,4 --l 2,4
  unset RACELAB_CUDA_DEFINES
done
if [ -n "${GPU_CHECK_NCU:-}" ] && ! command -v ncu >/dev/null; then
  log "ncu profile skipped: no ncu on this machine"
elif [ -n "${GPU_CHECK_NCU:-}" ]; then
  log "ncu: one forward+backward, (2,2), N = 2^20, default kernels"
  timeout 90 ncu --clock-control none -k regex:'race_(partial|fwd|bwd|scan)' --launch-count 8 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy \
    --section WarpStateStats "$racelab" bench --device cuda --backward --n 1048576 --p 2 --l 2 \
    --out "$W/ncu-bench" >"$W/ncu-22.txt" 2>&1
  cp "$W/ncu-22.txt" "$OUT/" 2>/dev/null
  grep -E "^  race_|Duration|Compute \(SM\) Throughput|DRAM Throughput|Issue Slots Busy" "$W/ncu-22.txt" | tee -a "$W/summary.txt"
fi
if ! skip warp; then
  # The same forward+backward rows on the warp-per-chunk kernels.
  export RACELAB_CUDA_PATH=warp
  bench nc-warp 60 --backward --n 1048576 --p 2,4 --l 2,4
  bench causal-warp 60 --backward --causal --n 1048576 --p 2,4 --l 2,4
  unset RACELAB_CUDA_PATH
fi
if ! skip torch; then
  # The comparison point: a lean PyTorch autograd version of the same operator on the same GPU.
  log "PyTorch on the GPU (experiments/tools/torch_race.py, forward+backward, non-causal)"
  for args in "--n 1048576 --p 2 --l 2" "--n 4194304 --p 2 --l 2" "--n 1048576 --p 4 --l 4"; do
    timeout 90 python3 experiments/tools/torch_race.py --device cuda $args >>"$W/torch.txt" 2>&1
    tail -1 "$W/torch.txt" | tee -a "$W/summary.txt"
  done
fi
log "done"
