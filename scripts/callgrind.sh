#!/usr/bin/env bash
# Instructions per enter+exit pair, counted by callgrind (docs/benchmarks.md).
#
# Runs examples/enter_exit_loop.rs under `valgrind --tool=callgrind` at two iteration counts per mode and prints
# a markdown table of Δinstructions / Δiterations, which cancels start-up, group set-up and teardown.
#
# usage: scripts/callgrind.sh [N1 N2]        (default 100000 1100000)
# env:   RUSTFLAGS="--cfg mmcid_portable" CARGO_TARGET_DIR=target/portable counts the portable path (design.md §12.6)
#        MODES="per-task per-task-fallback per-cpu per-cpu-unpinned temporary group-enter counter-add counter-add-with"   KEEP=1 keeps the callgrind.out files
set -euo pipefail

cd "$(dirname "$0")/.."
N1=${1:-100000}
N2=${2:-1100000}
MODES=${MODES:-"per-task per-task-fallback per-cpu per-cpu-unpinned temporary group-enter counter-add counter-add-with"}
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)" >&2; exit 1; }

cargo build --release --example enter_exit_loop >&2
BIN=${CARGO_TARGET_DIR:-target}/release/examples/enter_exit_loop
OUT=$(mktemp -d "${TMPDIR:-/tmp}/mmcid-callgrind.XXXXXX")
[ -n "${KEEP:-}" ] || trap 'rm -rf "$OUT"' EXIT

# Total instructions (Ir) of one run.
count() {
    local mode=$1 n=$2 file="$OUT/callgrind.$1.$2.out"
    valgrind --tool=callgrind --callgrind-out-file="$file" "$BIN" --mode "$mode" --iters "$n" >"$OUT/stdout.$mode.$n" 2>"$OUT/stderr.$mode.$n"
    awk '/^(summary|totals):/ { print $2; exit }' "$file"
}

echo "callgrind: $(valgrind --version), $(rustc --version), commit $(git rev-parse --short HEAD 2>/dev/null || cat COMMIT 2>/dev/null || echo unknown), $(date -u +%F)"
echo
echo "| mode | instructions @ N=$N1 | instructions @ N=$N2 | instructions per iteration | run (N=$N2) |"
echo "|---|---:|---:|---:|---|"
for mode in $MODES; do
    a=$(count "$mode" "$N1")
    b=$(count "$mode" "$N2")
    per=$(awk -v a="$a" -v b="$b" -v n1="$N1" -v n2="$N2" 'BEGIN { printf "%.2f", (b - a) / (n2 - n1) }')
    info=$(sed -e 's/^mode=[^ ]* //' -e 's/ acc=.*//' "$OUT/stdout.$mode.$N2")
    echo "| $mode | $a | $b | **$per** | $info |"
done
[ -z "${KEEP:-}" ] || echo "callgrind.out files kept in $OUT (callgrind_annotate --auto=yes $OUT/callgrind.per-task.$N2.out)" >&2
