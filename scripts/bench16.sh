#!/usr/bin/env bash
# The prepared many-core benchmark run (docs/benchmarks.md): release build, the criterion benches
# (enter_exit, sharded_counter) at 1, 2, 4, 8 and 16 threads, the use-case and object-pool comparisons (use_case,
# pool), then both workload examples (hackbench, thread_pools), every result written under one results directory
# as soon as its step ends. Works on any core count: the thread
# counts a machine cannot give one core each are still run where a bench oversubscribes by design.
#
#   scripts/bench16.sh [RESULTS_DIR]            # default: $CARGO_TARGET_DIR (or target)/bench-results/<host>-<date>
#   QUICK=1 scripts/bench16.sh RESULTS_DIR      # smoke run (tiny sizes, ~1-2 minutes on 2 cores)
#   BUDGET_S=300 scripts/bench16.sh RESULTS_DIR # total time budget in seconds (default 540)
#
#   PREBUILT=DIR scripts/bench16.sh RESULTS_DIR # run the binaries scripts/bench16-prepare.sh put in DIR, no build
#
# For a many-core machine without a Rust toolchain or network: build here, copy the binaries there with the
# repository, and bring the results back as one archive plus the summary:
#
#   scripts/bench16-prepare.sh .bench16         # here: release binaries into the git-ignored .bench16/
#   PREBUILT=.bench16 BUDGET_S=540 scripts/bench16.sh /tmp/r && tar czf bench16.tgz -C /tmp/r .   # there
#
# Time budget: the whole script, build (if any) included, stays within BUDGET_S seconds, and the steps run most
# important first: the criterion benches, then use_case and pool (each --compare, sized to about half its limit
# on 16 cores), then hackbench (guard around the I/O, one group count per step), then
# thread_pools. A criterion step's limit is clipped to what is left of the budget (cut short, it keeps every line
# it finished). The examples print their tables only when they end, so their steps are skipped, not cut, when less
# than their limit is left. summary.txt and steps.txt are rewritten after every step, so a kill at any point
# leaves everything done so far. Paths are taken from the caller's directory.
#
# Output in RESULTS_DIR: machine.txt, build.log, steps.txt (one line per step: status, seconds, command),
# bench16.log (this script's progress), criterion-<bench>-<n>cpus.txt (+ criterion/ estimates; target/criterion/
# with PREBUILT),
# use_case.txt/.json/.svg, pool.txt/.json/.svg, hackbench-*.txt/.json/.svg, thread_pools-*.txt/.json/.svg (the
# charts), and summary.txt (the tables, concatenated). A step's stderr is in <its output>.err.
set -euo pipefail
here=$(pwd)
# abs PATH: PATH as given from the caller's directory (the script then works from the repository root).
abs() {
    case "$1" in
    /*) echo "$1" ;;
    *) echo "$here/$1" ;;
    esac
}
cd "$(dirname "$0")/.."

QUICK="${QUICK:-0}"
PREBUILT="${PREBUILT:-}"
if [ -n "$PREBUILT" ]; then
    PREBUILT=$(abs "$PREBUILT")
fi
BUDGET_S="${BUDGET_S:-540}"
case "$BUDGET_S" in
'' | *[!0-9]*)
    echo "bench16: BUDGET_S must be a whole number of seconds, got '$BUDGET_S'" >&2
    exit 2
    ;;
esac
target="${CARGO_TARGET_DIR:-target}"
start=$(date +%s)
deadline=$((start + BUDGET_S))
if [ $# -ge 1 ]; then
    results=$(abs "$1")
else
    results="$target/bench-results/$(hostname)-$(date +%Y%m%d-%H%M%S)"
fi
mkdir -p "$results"
results=$(cd "$results" && pwd)
: >"$results/steps.txt"
log() { echo "[bench16 $(($(date +%s) - start))s] $*" | tee -a "$results/bench16.log" >&2; }

# The CPUs this process may run on, one per line, from the kernel's list (e.g. "0-3,8-11"): they need not start
# at 0 or be contiguous.
allowed_cpus() {
    local list range
    list=$(awk '/^Cpus_allowed_list:/ {print $2}' /proc/self/status)
    for range in ${list//,/ }; do
        seq "${range%-*}" "${range#*-}"
    done
}
mapfile -t cpus < <(allowed_cpus)
ncpu=${#cpus[@]}
if [ "$ncpu" -eq 0 ]; then
    echo "bench16: cannot read Cpus_allowed_list from /proc/self/status" >&2
    exit 1
fi
# The first n allowed CPUs, comma-separated, for taskset -c.
first_cpus() {
    local IFS=,
    echo "${cpus[*]:0:$1}"
}

# Seconds a step may still take: what is left of the budget, less 10 s for timeout's kill grace and the summary.
left() { echo $((deadline - $(date +%s) - 10)); }

summarize() {
    {
        cat "$results/machine.txt"
        echo
        echo "== steps"
        cat "$results/steps.txt"
        for f in "$results"/criterion-*.txt "$results"/use_case.txt "$results"/pool.txt "$results"/hackbench-*.txt \
            "$results"/thread_pools-*.txt; do
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
}

# step LIMIT OUT COMMAND...: runs COMMAND with stdout in OUT and stderr in OUT.err, for at most LIMIT seconds or
# what is left of the budget, whichever is less; records the outcome in steps.txt (and step_status) and rewrites
# summary.txt.
step_status=
# skip WHY COMMAND: records a step that did not run for lack of budget.
skip() {
    log "SKIPPED ($1): $2"
    echo "skipped (budget)  0s  $2" >>"$results/steps.txt"
    step_status=skipped
}
step() {
    local limit=$1 out=$2 rest status began rc=0
    shift 2
    rest=$(left)
    if [ "$rest" -lt 10 ]; then
        skip "budget of ${BUDGET_S}s spent" "$*"
        return 0
    fi
    if [ "$limit" -gt "$rest" ]; then
        limit=$rest
    fi
    log "$* > $(basename "$out") (limit ${limit}s)"
    began=$(date +%s)
    timeout --kill-after=5 "$limit" "$@" >"$out" 2>"$out.err" || rc=$?
    case $rc in
    0) status=ok ;;
    124) status="timed out (${limit}s)" ;;
    137) status="killed (the ${limit}s limit, or out of memory)" ;;
    *) status="failed (exit $rc)" ;;
    esac
    if [ "$rc" -ne 0 ]; then
        log "$status: $*  (see $(basename "$out").err)"
    fi
    echo "$status  $(($(date +%s) - began))s  $*" >>"$results/steps.txt"
    step_status=$status
    summarize
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname)"
    echo "allowed CPUs: $ncpu ($(first_cpus "$ncpu"))"
    echo "budget: ${BUDGET_S}s, quick: $QUICK"
    uname -a
    ldd --version 2>/dev/null | head -n 1 || true
    rustc -V 2>/dev/null || echo "rustc: not installed here"
    git rev-parse HEAD 2>/dev/null || true
    lscpu 2>/dev/null | grep -E 'Model name|Socket|Core|Thread|NUMA node\(s\)|^CPU\(s\)' || true
    grep -E 'MemTotal' /proc/meminfo || true
} >"$results/machine.txt"

if [ -n "$PREBUILT" ]; then
    for b in hackbench thread_pools use_case pool enter_exit sharded_counter; do
        if [ ! -x "$PREBUILT/$b" ]; then
            echo "bench16: $PREBUILT/$b is missing: run scripts/bench16-prepare.sh $PREBUILT first" >&2
            exit 1
        fi
    done
    echo "prebuilt: $(cat "$PREBUILT/BUILD" 2>/dev/null || echo 'no BUILD file')" >>"$results/machine.txt"
    hb="$PREBUILT/hackbench"
    tp="$PREBUILT/thread_pools"
    uc="$PREBUILT/use_case"
    pl="$PREBUILT/pool"
    # criterion writes its estimates under $CARGO_TARGET_DIR/criterion (it asks cargo only when that is unset):
    # here straight into the results, so no estimates of earlier runs mix in.
    export CARGO_TARGET_DIR="$results/target"
else
    step 300 "$results/build.log" cargo build --release --examples --benches
    if [ "$step_status" != ok ]; then
        log "build failed or did not finish: nothing to run (see build.log.err)"
        summarize
        exit 1
    fi
    hb="$target/release/examples/hackbench"
    tp="$target/release/examples/thread_pools"
    uc="$target/release/examples/use_case"
    pl="$target/release/examples/pool"
fi
# whole LIMIT OUT COMMAND...: `step` for a command that prints its results only when it ends (the examples'
# comparisons): skipped, rather than cut short with nothing to show, when less than LIMIT seconds are left.
whole() {
    if [ "$(left)" -lt "$1" ]; then
        skip "needs up to ${1}s, $(left)s left of the budget" "${*:3}"
        return 0
    fi
    step "$@"
}

# Criterion: each bench measures thread counts derived from the N CPUs it is allowed (enter_exit: 1, N, 2N;
# sharded_counter: 1, 2, N, 4N). Runs on the first N allowed CPUs for N = 2, 4, 8, 16 (those the machine has, and
# all of them if that is not a power of two), each filtered to its own N threads, the first also to 1 (and 2) and
# the last to its oversubscribed count: 1, 2, 4, 8 and 16 threads one per core, without measuring a count twice.
sizes=()
for n in 2 4 8 16; do
    if [ "$n" -le "$ncpu" ]; then sizes+=("$n"); fi
done
if [ "${#sizes[@]}" -eq 0 ]; then
    sizes=("$ncpu")
elif [ "${sizes[-1]}" -lt "$ncpu" ] && [ "$ncpu" -le 16 ]; then
    sizes+=("$ncpu")
fi
if [ "$QUICK" = 1 ]; then
    crit=(--warm-up-time 0.2 --measurement-time 0.3 --sample-size 10)
    sizes=("${sizes[0]}")
else
    crit=(--warm-up-time 0.5 --measurement-time 1 --sample-size 20)
fi
# regex THREADS...: criterion's filter for ids ending in one of the thread counts (ids are group/line/threads).
regex() {
    local IFS='|'
    echo "/($*)\$"
}
last=$((${#sizes[@]} - 1))
for bench in enter_exit sharded_counter; do
    for i in "${!sizes[@]}"; do
        n=${sizes[$i]}
        if [ "$bench" = enter_exit ]; then
            counts=("$n")
            if [ "$i" -eq 0 ]; then counts+=(1); fi
            if [ "$i" -eq "$last" ]; then counts+=($((2 * n))); fi
        else
            counts=("$n")
            if [ "$i" -eq 0 ]; then counts+=(1 2); fi
            if [ "$i" -eq "$last" ]; then counts+=($((4 * n))); fi
        fi
        if [ -n "$PREBUILT" ]; then
            run_bench=("$PREBUILT/$bench" --bench)
        else
            run_bench=(cargo bench --bench "$bench" --)
        fi
        # Cut short, a criterion step still leaves every line it finished (only its closing table is lost).
        step 150 "$results/criterion-$bench-${n}cpus.txt" \
            taskset -c "$(first_cpus "$n")" "${run_bench[@]}" "${crit[@]}" "$(regex "${counts[@]}")"
        if [ -z "$PREBUILT" ] && [ -d "$target/criterion" ]; then
            cp -r "$target/criterion" "$results/"
        fi
    done
done

# use_case and pool: every approach of each, interleaved repeats, thread counts 1, cores and 4 x cores (pool also
# 16 x cores). Not the examples' defaults: their largest counts (16 and 32 x cores for use_case, 128 x cores for
# pool) ran past these limits on a 16-core Intel Xeon (use_case's 256-thread cells took about 12 s each, pool's
# 2048-thread cells 20 to 30 s); with these lists the two took 41 s together there (2026-12-04).
if [ "$QUICK" = 1 ]; then
    ucargs=(--compare --seconds 0.01 --repeats 1 --threads 1,2)
    plargs=(--compare --seconds 0.005 --repeats 1 --threads 1,4)
else
    ucargs=(--compare --seconds 0.05 --repeats 3 --threads "1,$ncpu,$((4 * ncpu))")
    plargs=(--compare --seconds 0.02 --repeats 1 --threads "1,$ncpu,$((4 * ncpu)),$((16 * ncpu))")
fi
whole 60 "$results/use_case.txt" "$uc" "${ucargs[@]}" --json "$results/use_case.json" --svg "$results/use_case.svg"
whole 150 "$results/pool.txt" "$pl" "${plargs[@]}" --json "$results/pool.json" --svg "$results/pool.svg"

# hackbench: every policy, interleaved repeats. The guard around the I/O (the default, and the goal's setting) one group
# count per step, so that running out of budget loses one count, not the table; then groups 1..16 with the guard
# around the per-CID update only, and over pipes with pinned threads.
if [ "$QUICK" = 1 ]; then
    hbargs=(--compare -f 5 -l 50 --repeats 1)
else
    hbargs=(--compare -f 20 -l 200 --repeats 5) # 5+ repeats: the goal verdict needs a CI
fi
for g in 1 2 4 8 16; do
    whole 60 "$results/hackbench-io-${g}groups.txt" "$hb" "${hbargs[@]}" --groups-list "$g" \
        --json "$results/hackbench-io-${g}groups.json" --svg "$results/hackbench-io-${g}groups.svg"
done
whole 240 "$results/hackbench-update.txt" "$hb" "${hbargs[@]}" --groups-list 1,2,4,8,16 --guard update \
    --json "$results/hackbench-update.json" --svg "$results/hackbench-update.svg"
whole 120 "$results/hackbench-pipe-pinned.txt" "$hb" "${hbargs[@]}" --groups-list 1,2,4,8,16 --pipe --pin \
    --json "$results/hackbench-pipe-pinned.json" --svg "$results/hackbench-pipe-pinned.svg"

# thread_pools: the default three (8x8 and two mode-crossing configurations), then 1..16 pools of 8 threads and the
# kernel's 32x32.
if [ "$QUICK" = 1 ]; then
    tpargs=(--compare --seconds 0.2 --repeats 1)
else
    tpargs=(--compare --seconds 0.3 --repeats 7)
fi
whole 120 "$results/thread_pools-default.txt" "$tp" "${tpargs[@]:1}" --json "$results/thread_pools-default.json" \
    --svg "$results/thread_pools-default.svg"
for p in 1 2 4 8 16; do
    whole 60 "$results/thread_pools-${p}x8.txt" "$tp" "${tpargs[@]}" -p "$p" -t 8 \
        --json "$results/thread_pools-${p}x8.json" --svg "$results/thread_pools-${p}x8.svg"
done
whole 60 "$results/thread_pools-32x32.txt" "$tp" "${tpargs[@]}" -p 32 -t 32 --json "$results/thread_pools-32x32.json" \
    --svg "$results/thread_pools-32x32.svg"

summarize
log "done in $(($(date +%s) - start))s (budget ${BUDGET_S}s): $results"
