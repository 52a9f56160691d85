#!/usr/bin/env bash
# Paired speed runs of two revisions' CPU kernels on this machine.
#
#   scripts/cpu-pair.sh OLD_REV NEW_REV [PAIRS] [ISAS] [PLS] [MODES] [N]
#
# Builds both revisions (release, in git worktrees under target/pair/), then for each ISA level
# (RACELAB_ISA; `native` is the detected level), each (P,L) and each mode (`nc` non-causal,
# `c` causal) runs `racelab bench --backward` (forward+backward, paper shape: 4 heads,
# d = 128, f32, N tokens, median of 3 runs) PAIRS times, the two binaries alternated and their
# order swapped every pair. Prints one line per pair and, per row, the median NEW/OLD ratio with
# its distribution-free 95% interval (scripts/pair_summary.py; 6 pairs or more give one) and
# whether the median is within PAIR_LIMIT (default 1.03, the ±3% of a no-regression check).
# Defaults: 5 pairs, ISAS "native avx2 scalar", PLS "2,2 4,4", MODES "nc c", N 1048576.
# Nothing else should run on the machine meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: scripts/cpu-pair.sh OLD_REV NEW_REV [PAIRS] [ISAS] [PLS] [MODES] [N]}
new=${2:?usage: scripts/cpu-pair.sh OLD_REV NEW_REV [PAIRS] [ISAS] [PLS] [MODES] [N]}
pairs=${3:-5}
isas=${4:-native avx2 scalar}
pls=${5:-2,2 4,4}
modes=${6:-nc c}
n=${7:-1048576}
root=$PWD/target/pair
summary=$PWD/scripts/pair_summary.py
limit=${PAIR_LIMIT:-1.03}
mkdir -p "$root"
bin() {
    local rev dir
    rev=$(git rev-parse --short=12 "$1")
    dir=$root/$rev
    if [ ! -x "$dir/target/release/racelab" ]; then
        rm -rf "$dir"
        git worktree add --detach -f "$dir" "$rev" >/dev/null 2>&1
        (cd "$dir" && cargo build --release --quiet)
    fi
    echo "$dir/target/release/racelab"
}
a=$(bin "$old")
b=$(bin "$new")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
seconds() {
    # One bench row's median seconds.
    local exe=$1 isa=$2 p=$3 l=$4 mode=$5 env=() flags=()
    [ "$isa" != native ] && env=(RACELAB_ISA="$isa")
    [ "$mode" = c ] && flags=(--causal)
    env "${env[@]}" "$exe" bench --n "$n" --p "$p" --l "$l" --backward "${flags[@]}" --json \
        --out "$out/run" 2>/dev/null |
        python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["isa"], r["rows"][0]["seconds"])'
}
echo "old $old ($a), new $new ($b); N = $n, forward+backward, $(nproc) cores"
for isa in $isas; do
    for pl in $pls; do
        p=${pl%,*}
        l=${pl#*,}
        for mode in $modes; do
            ratios=()
            for i in $(seq 1 "$pairs"); do
                if [ $((i % 2)) = 1 ]; then
                    read -r level ta <<<"$(seconds "$a" "$isa" "$p" "$l" "$mode")"
                    read -r _ tb <<<"$(seconds "$b" "$isa" "$p" "$l" "$mode")"
                else
                    read -r _ tb <<<"$(seconds "$b" "$isa" "$p" "$l" "$mode")"
                    read -r level ta <<<"$(seconds "$a" "$isa" "$p" "$l" "$mode")"
                fi
                r=$(python3 -c "print(f'{$tb / $ta:.4f}')")
                ratios+=("$r")
                echo "($p,$l) $mode $level pair $i: old $ta s, new $tb s, new/old $r"
            done
            echo "($p,$l) $mode $level $(python3 "$summary" "${ratios[@]}" --limit "$limit")"
        done
    done
done
