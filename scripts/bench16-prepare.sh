#!/usr/bin/env bash
# Builds what scripts/bench16.sh runs and copies it into DIR (default .bench16, git-ignored), for a machine without
# a Rust toolchain: copy DIR there with the repository and run `PREBUILT=DIR scripts/bench16.sh RESULTS_DIR`.
# DIR gets hackbench, thread_pools, use_case, pool, enter_exit and sharded_counter (the criterion benches' executables) and a BUILD
# file naming the commit, the compiler and the date.
#
#   scripts/bench16-prepare.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.bench16}"
target="${CARGO_TARGET_DIR:-target}"

cargo build --release --examples
mkdir -p "$dir"
for ex in hackbench thread_pools use_case pool; do
    cp "$target/release/examples/$ex" "$dir/"
done
for bench in enter_exit sharded_counter; do
    # The bench target is the build's only executable artifact; its path is in cargo's JSON messages.
    # (`|| true`: under `set -e` a failed substitution would end the script before the message below.)
    exe=$(cargo bench --no-run --bench "$bench" --message-format=json 2>"$dir/cargo-$bench.err" |
        grep -o '"executable":"[^"]*"' | tail -n 1 | cut -d'"' -f4) || true
    if [ -z "$exe" ] || [ ! -x "$exe" ]; then
        echo "bench16-prepare: no executable for bench $bench (cargo's messages: $dir/cargo-$bench.err)" >&2
        exit 1
    fi
    rm -f "$dir/cargo-$bench.err"
    cp "$exe" "$dir/$bench"
done
# Without debug info (the release profile keeps it for profiling): the six binaries then take about 12 MB.
if command -v strip >/dev/null; then
    strip --strip-debug "$dir"/hackbench "$dir"/thread_pools "$dir"/use_case "$dir"/pool "$dir"/enter_exit \
        "$dir"/sharded_counter
fi
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo '+changes'), $(rustc --version), built $(date -u +%FT%TZ) on $(hostname)" >"$dir/BUILD"
du -sh "$dir"
cat "$dir/BUILD"
