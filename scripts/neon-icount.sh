#!/usr/bin/env bash
# The NEON kernels of two revisions compared without an aarch64 machine: instructions
# executed per forward+backward, counted under qemu-user by a plugin (scripts/qemu_icount.c).
#
#   scripts/neon-icount.sh OLD_REV NEW_REV [N]
#
# Cross-builds `examples/timing` of both revisions for aarch64 (git worktrees under
# target/pair/), runs each (P,L) in {(2,2), (4,4)}, non-causal and causal, at N tokens (default
# 65536; 2 heads, d = 128, one thread) with REPS=1 and REPS=3, and prints the instructions of
# one repetition, (count(3) - count(1)) / 2, so that set-up and input generation cancel, and
# the NEW/OLD ratio. The counts do not depend on the host's load (run to run they agree to
# within a few tens of instructions).
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: scripts/neon-icount.sh OLD_REV NEW_REV [N]}
new=${2:?usage: scripts/neon-icount.sh OLD_REV NEW_REV [N]}
n=${3:-65536}
target=aarch64-unknown-linux-gnu
for tool in aarch64-linux-gnu-gcc qemu-aarch64 gcc; do
    command -v "$tool" >/dev/null || { echo "neon-icount: needs $tool" >&2; exit 2; }
done
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
root=$PWD/target/pair
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O2 -shared -fPIC -o "$work/icount.so" scripts/qemu_icount.c
bin() {
    local rev dir features=""
    rev=$(git rev-parse --short=12 "$1")
    dir=$root/$rev
    [ -d "$dir" ] || git worktree add --detach -f "$dir" "$rev" >/dev/null 2>&1
    grep -q '^bench-internals' "$dir/Cargo.toml" && features="--features bench-internals"
    # shellcheck disable=SC2086
    (cd "$dir" && cargo build --release --quiet --target $target $features --example timing)
    echo "$dir/target/$target/release/examples/timing"
}
a=$(bin "$old")
b=$(bin "$new")
count() {
    RAYON_NUM_THREADS=1 N=$n PL=$2 CAUSAL=$3 REPS=$4 ICOUNT_OUT="$work/c.txt" \
        qemu-aarch64 -L /usr/aarch64-linux-gnu -plugin "$work/icount.so" "$1" >/dev/null
    tail -1 "$work/c.txt" | cut -d' ' -f2
}
echo "old $old, new $new; NEON under qemu, N = $n, 2 heads, d = 128, forward+backward, instructions per repetition"
for pl in 2 4; do
    for c in 0 1; do
        per=()
        for exe in "$a" "$b"; do
            one=$(count "$exe" "$pl" "$c" 1)
            three=$(count "$exe" "$pl" "$c" 3)
            per+=($(((three - one) / 2)))
        done
        mode=non-causal
        [ "$c" = 1 ] && mode=causal
        echo "($pl,$pl) $mode: old ${per[0]}, new ${per[1]}, new/old $(python3 -c "print(f'{${per[1]} / ${per[0]}:.4f}')")"
    done
done
