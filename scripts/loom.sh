#!/usr/bin/env bash
# Runs the loom models of mmcid (loom-tests/, docs/loom.md): release build with debug assertions, --cfg loom and the
# loom-tests crate's `loom` feature (without which the models do not build), in its own target directory
# (target/loom) so the normal build is never invalidated, LOOM_MAX_PREEMPTIONS=2 unless the caller sets it. Exits
# non-zero if any model fails or any mutant is not rejected.
#
#   scripts/loom.sh                          # CI's first run (P=2); .ci/run has its second (P=3, three skipped)
#   LOOM_MAX_PREEMPTIONS=3 scripts/loom.sh   # the deeper, documented run
#   scripts/loom.sh --test m3_enter_vs_task_to_cpu -- --nocapture   # one file, with iteration counts
set -euo pipefail
cd "$(dirname "$0")/../loom-tests"
# Every model file must be a [[test]] of loom-tests/Cargo.toml, which gates it behind the `loom` feature; one that
# is not would run, empty, in the workspace's normal `cargo test`.
for f in tests/*.rs; do
    name=$(basename "$f" .rs)
    if ! grep -qxF "name = \"$name\"" Cargo.toml; then
        echo "loom: $f is not a [[test]] in loom-tests/Cargo.toml" >&2
        exit 1
    fi
done
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export RUSTFLAGS="--cfg loom -C debug-assertions"
export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-$(cd .. && pwd)/target/loom}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-0}"
echo "loom: LOOM_MAX_PREEMPTIONS=$LOOM_MAX_PREEMPTIONS target=$CARGO_TARGET_DIR" >&2
start=$(date +%s)
if [ "$#" -eq 0 ]; then
    set -- --tests
fi
cargo test --release --features loom "$@"
echo "loom: suite finished in $(( $(date +%s) - start ))s" >&2
