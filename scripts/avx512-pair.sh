#!/usr/bin/env bash
# The AVX-512 rows of docs/performance.md, re-measured on any AVX-512 machine:
#
#   scripts/avx512-pair.sh OLD_REV NEW_REV [PAIRS]
#
# Builds both revisions (scripts/cpu-pair.sh does), then alternates PAIRS (default 6, the
# fewest that give a 95% interval) old/new pairs at the native level (AVX-512) of
# `racelab bench --backward`, paper shape (4 heads, d = 128, f32), N = 2^20: (2,2) and (4,4),
# non-causal and causal. Prints each pair and, per row, the median NEW/OLD ratio with its
# distribution-free 95% interval and whether the median is within 3% (scripts/pair_summary.py).
# Refuses to run where the CPU lacks AVX-512 (the rows would measure another level).
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: scripts/avx512-pair.sh OLD_REV NEW_REV [PAIRS]}
new=${2:?usage: scripts/avx512-pair.sh OLD_REV NEW_REV [PAIRS]}
pairs=${3:-6}
for f in avx512f avx512bw avx512cd avx512dq avx512vl; do
    if ! grep -qw "$f" /proc/cpuinfo; then
        echo "avx512-pair: this CPU lacks $f, so its native level is not AVX-512;" \
            "run on an AVX-512 machine (or scripts/cpu-pair.sh for the levels this one has)" >&2
        exit 2
    fi
done
PAIR_LIMIT=1.03 exec scripts/cpu-pair.sh "$old" "$new" "$pairs" native "2,2 4,4" "nc c"
