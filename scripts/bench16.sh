#!/usr/bin/env bash
# The prepared many-core benchmark run (issue 6; docs/benchmarks.md): release build, the criterion benches
# (enter_exit, sharded_counter) and both workload examples (hackbench, thread_pools) across 1, 2, 4, 8 and 16
# threads/groups, with every result written under one results directory. Sized for ~8 minutes on a 16-core
# machine (estimate: build 1 min, criterion 4 x ~50 s, hackbench 3 x ~20 s, thread_pools ~2 min); works on any
# core count (thread counts above the machine's are still run: oversubscription). Every step has a time limit.
#
#   scripts/bench16.sh [RESULTS_DIR]      # default: target/bench-results/<host>-<date>
#   QUICK=1 scripts/bench16.sh            # smoke run (tiny sizes, ~1-2 minutes on 2 cores)
#
# Output in RESULTS_DIR: machine.txt, build.log, criterion-<bench>-<cpus>cpus.txt (+ criterion/ estimates),
# hackbench-*.txt/.json, thread_pools-*.txt/.json, and summary.txt (the tables, concatenated).
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK="${QUICK:-0}"
ncpu=$(nproc)
results="${1:-target/bench-results/$(hostname)-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$results"
results=$(cd "$results" && pwd)
start=$(date +%s)
log() { echo "[bench16 $(( $(date +%s) - start ))s] $*" >&2; }

# Each step has a time limit so one hung step cannot eat the machine's lease.
step() {
    local limit=$1 out=$2
    shift 2
    log "$* > $(basename "$out")"
    if ! timeout --kill-after=10 "$limit" "$@" >"$out" 2>"$out.err"; then
        log "FAILED or timed out (limit ${limit}s): $*  (see $out.err)"
    fi
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname)"
    echo "nproc: $ncpu"
    uname -a
    rustc -V
    git rev-parse HEAD 2>/dev/null || true
    lscpu 2>/dev/null | grep -E 'Model name|Socket|Core|Thread|NUMA node\(s\)|^CPU\(s\)' || true
    grep -E 'MemTotal' /proc/meminfo || true
} >"$results/machine.txt"

log "building (release): examples and benches"
cargo build --release --examples --benches >"$results/build.log" 2>&1
hb=target/release/examples/hackbench
tp=target/release/examples/thread_pools

# Core-count sets for the criterion benches: each bench measures 1, N and 2N threads on the N CPUs it is
# allowed, so N = 4 and N = all cover 1, 2, 4, 8, 16 (and 32) threads on a 16-core machine.
cpu_sets=()
if [ "$ncpu" -gt 4 ]; then cpu_sets+=(4); fi
cpu_sets+=("$ncpu")
if [ "$QUICK" = 1 ]; then
    crit=(--warm-up-time 0.2 --measurement-time 0.3 --sample-size 10)
    cpu_sets=("$ncpu")
else
    crit=(--warm-up-time 0.5 --measurement-time 1 --sample-size 20)
fi

for n in "${cpu_sets[@]}"; do
    for bench in enter_exit sharded_counter; do
        step 240 "$results/criterion-$bench-${n}cpus.txt" \
            taskset -c "0-$((n - 1))" cargo bench --bench "$bench" -- "${crit[@]}"
    done
done
if [ -d target/criterion ]; then
    cp -r target/criterion "$results/criterion"
fi

# hackbench: every policy, groups 1..16, interleaved repeats; guard around the I/O (default) and around the
# per-CID update only.
if [ "$QUICK" = 1 ]; then
    hbargs=(--compare --groups-list 1,2,4,8,16 -f 5 -l 50 --repeats 1)
else
    hbargs=(--compare --groups-list 1,2,4,8,16 -f 20 -l 200 --repeats 5) # 5+ repeats: the goal verdict needs a CI
fi
step 240 "$results/hackbench-io.txt" "$hb" "${hbargs[@]}" --json "$results/hackbench-io.json"
step 240 "$results/hackbench-update.txt" "$hb" "${hbargs[@]}" --guard update --json "$results/hackbench-update.json"
step 120 "$results/hackbench-pipe-pinned.txt" "$hb" "${hbargs[@]}" --pipe --pin \
    --json "$results/hackbench-pipe-pinned.json"

# thread_pools: the default three (8x8 and two mode-crossing configurations), then 1..16 pools of 8 threads and the
# kernel's 32x32.
if [ "$QUICK" = 1 ]; then
    tpargs=(--compare --seconds 0.2 --repeats 1)
else
    tpargs=(--compare --seconds 0.3 --repeats 7)
fi
step 120 "$results/thread_pools-default.txt" "$tp" "${tpargs[@]:1}" \
    --json "$results/thread_pools-default.json"
for p in 1 2 4 8 16; do
    step 60 "$results/thread_pools-${p}x8.txt" "$tp" "${tpargs[@]}" -p "$p" -t 8 \
        --json "$results/thread_pools-${p}x8.json"
done
step 60 "$results/thread_pools-32x32.txt" "$tp" "${tpargs[@]}" -p 32 -t 32 --json "$results/thread_pools-32x32.json"

{
    cat "$results/machine.txt"
    for f in "$results"/criterion-*.txt "$results"/hackbench-*.txt "$results"/thread_pools-*.txt; do
        [ -f "$f" ] || continue
        echo
        echo "== $(basename "$f")"
        # criterion's own per-line output is long: keep the benches' summary tables ("## <title>: medians ...").
        case "$f" in
        */criterion-*) awk '/^## .*medians over samples/{p=1} p' "$f" ;;
        *) cat "$f" ;;
        esac
    done
} >"$results/summary.txt"
log "done in $(( $(date +%s) - start ))s: $results"
