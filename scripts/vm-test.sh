#!/usr/bin/env bash
# Runs mmcid's test binaries (and semantic checks of its examples) in a QEMU guest with many vCPUs and a chosen
# Debian kernel, so that code sizing per-core slots, bitmap lanes and CPU lists, pinning threads and using rseq
# and membarrier is exercised with 16 to 128 CPUs on a machine that has 2 (docs/vm-test.md).
#
#   scripts/vm-test.sh                                  # every test binary, 16 vCPUs, Debian's 6.12 kernel
#   scripts/vm-test.sh --smp 64 --kernel 6.1 main       # the library's own tests, 64 vCPUs, 6.1 (no rseq mm_cid)
#   scripts/vm-test.sh --smp 4,maxcpus=128 --kernel 6.1 # 128 possible CPUs, 4 online (hotpluggable slots)
#   scripts/vm-test.sh --smp 128 --online 4             # the same on 6.12, which ignores QEMU's empty slots
#   scripts/vm-test.sh --repeat 10 invariants -- i1_    # one binary, a test-name filter, ten runs in one boot
#   scripts/vm-test.sh examples                         # the examples as semantic checks (release build)
#
# Options (defaults in brackets):
#   --smp TOPOLOGY       QEMU's -smp argument: 16, 64, 4,maxcpus=128, 8,sockets=2,cores=4 ... [16]
#   --online N           boot only N of the CPUs (kernel maxcpus=N); the rest stay possible and present
#   --kernel K           6.1 or 6.12 (newest Debian cloud-amd64 kernel of that series), a full version such as
#                        6.1.0-57, or the path of a vmlinuz [6.12]
#   --repeat N           run the selection N times in the same boot, interleaved [1]
#   --release            release test binaries (debug assertions off) instead of cargo test's debug ones
#   --timeout S          limit for the whole guest, boot included [3600 per --repeat]
#   --binary-timeout S   limit for one binary inside the guest (its threads listed, killed, reported as failed)
#                        [1200]
#   --mem MIB            guest memory [2048 + twice the initramfs]
#   --accel A            auto | kvm | tcg: auto uses KVM when a probe guest boots with it, TCG otherwise [auto]
#   --time-scale N       MMCID_TEST_TIME_SCALE in the guest: the tests' deadlock detectors wait N times longer
#                        [10 under TCG, 1 under KVM]
#   --no-build           use the binaries the last build left (cargo's JSON list in target/vm-test/)
#   --report-time        each test's time in the binaries' output (libtest's unstable --report-time)
#   -v, --verbose        stream the guest's console (otherwise it is in the run's console.log only)
#   -h, --help           this text
# Selection (positional, any number) [tests]:
#   tests                every test binary cargo test --workspace builds (the library's unit tests,
#                        tests/*.rs, the examples' unit tests, mmcid-policies' and mmcid-harness' tests; not the
#                        loom models)
#   main                 the library's unit tests and tests/*.rs, and mmcid-policies' and mmcid-harness' tests
#   examples             every example check (below); examples:NAME one of hackbench, thread_pools, pinned,
#                        sharded_counter
#   all                  tests and examples
#   NAME                 one test binary by its cargo target name (mmcid for the library's unit tests)
# Arguments after -- go to every test binary (a name filter, --exact, --test-threads N ...).
#
# Exit status: 0 when every binary passed and the guest reached its end; 1 on any failure, a guest that did not
# reach its end marker, or a kernel oops; 2 on a usage error; 3 when QEMU, busybox or the kernel could not be
# installed or fetched (nothing was run).
#
# Needs qemu-system-x86_64, a static busybox, apt-get and dpkg-deb (Debian or Ubuntu); installs qemu-system-x86
# and busybox-static with apt-get where it may (root, or sudo without a password). Kernels are cached in
# $MMCID_VM_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/mmcid-vm); each run's console and per-binary logs go to
# target/vm-test/runs/. Under TCG (no usable KVM) no time it prints says anything about performance.
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
    echo "vm-test: $*" >&2
    exit 2
}
unavailable() {
    echo "vm-test: $*" >&2
    exit 3
}
say() { echo "vm-test: $*" >&2; }
help() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
whole() { case "$2" in '' | *[!0-9]*) die "$1 needs a whole number, got '$2'" ;; esac; }

smp=16
online=""
kernel_spec=6.12
repeat=1
release=0
timeout_s=""
binary_timeout=1200
mem=""
accel=auto
time_scale=""
build=1
verbose=0
report_time=0
selection=()
test_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --smp) smp=${2:?--smp needs a topology}; shift ;;
    --online) online=${2:-}; whole --online "$online"; shift ;;
    --kernel) kernel_spec=${2:?--kernel needs a version or a path}; shift ;;
    --repeat) repeat=${2:-}; whole --repeat "$repeat"; shift ;;
    --release) release=1 ;;
    --timeout) timeout_s=${2:-}; whole --timeout "$timeout_s"; shift ;;
    --binary-timeout) binary_timeout=${2:-}; whole --binary-timeout "$binary_timeout"; shift ;;
    --mem) mem=${2:-}; whole --mem "$mem"; shift ;;
    --accel) accel=${2:-}; shift ;;
    --time-scale) time_scale=${2:-}; whole --time-scale "$time_scale"; shift ;;
    --no-build) build=0 ;;
    --report-time) report_time=1 ;;
    -v | --verbose) verbose=1 ;;
    -h | --help) help; exit 0 ;;
    --) shift; test_args=("$@"); break ;;
    -*) die "unknown option $1 (try --help)" ;;
    *) selection+=("$1") ;;
    esac
    shift
done
case "$accel" in auto | kvm | tcg) ;; *) die "--accel: auto, kvm or tcg, got '$accel'" ;; esac
case "$smp" in '' | *[!0-9a-z=,]*) die "--smp: a QEMU -smp topology such as 16 or 4,maxcpus=128, got '$smp'" ;; esac
[ "$repeat" -ge 1 ] || die "--repeat must be at least 1"
[ -z "$online" ] || [ "$online" -ge 1 ] || die "--online must be at least 1"
[ ${#selection[@]} -gt 0 ] || selection=(tests)
[ -n "$timeout_s" ] || timeout_s=$((3600 * repeat))

target=${CARGO_TARGET_DIR:-target}
work="$target/vm-test"
cache=${MMCID_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmcid-vm}
mkdir -p "$work" "$cache"
work=$(cd "$work" && pwd)
cache=$(cd "$cache" && pwd)

# ---------------------------------------------------------------------------------------------------------------
# Prerequisites: qemu, a static busybox, a kernel.

# Runs a command as root: directly, or through sudo without a password; fails otherwise.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        return 1
    fi
}

# Without network, fail in seconds rather than retry for minutes.
apt_opts=(-q -o Acquire::Retries=0 -o Acquire::http::Timeout=20 -o Acquire::https::Timeout=20)

# Installs Debian packages with apt-get (updating the package lists once if the first try fails).
apt_install() {
    command -v apt-get >/dev/null || return 1
    say "installing $* (apt-get)"
    local install=(env DEBIAN_FRONTEND=noninteractive apt-get install "${apt_opts[@]}" -y --no-install-recommends "$@")
    as_root "${install[@]}" >"$work/apt.log" 2>&1 && return 0
    as_root apt-get update "${apt_opts[@]}" >>"$work/apt.log" 2>&1 || return 1
    as_root "${install[@]}" >>"$work/apt.log" 2>&1
}

busybox_bin() {
    local b
    for b in /bin/busybox /usr/bin/busybox "$(command -v busybox 2>/dev/null)"; do
        # Static: the guest has no libraries but the ones this script copies for the test binaries.
        if [ -x "$b" ] && ! ldd "$b" >/dev/null 2>&1; then
            echo "$b"
            return 0
        fi
    done
    return 1
}

if ! command -v qemu-system-x86_64 >/dev/null; then
    apt_install qemu-system-x86 || unavailable "qemu-system-x86_64 not found and qemu-system-x86 could not be installed (see $work/apt.log)"
fi
if ! busybox_bin >/dev/null; then
    apt_install busybox-static || unavailable "no static busybox and busybox-static could not be installed (see $work/apt.log)"
fi
busybox=$(busybox_bin) || unavailable "no static busybox after installing busybox-static"

# The newest kernel directory under the cache whose version starts with $1 (6.1 matches 6.1.0-57-cloud-amd64,
# not 6.12...).
cached_kernel() {
    local re=${1//./\\.}
    find "$cache/kernels" -mindepth 2 -maxdepth 2 -name vmlinuz 2>/dev/null | sed 's#.*/kernels/##; s#/vmlinuz$##' |
        grep -E "^${re}([.+-]|$)" | sort -V | tail -n 1 || true
}

# The newest Debian package linux-image-<$1...>-cloud-amd64 apt knows (not the -dbg or -unsigned ones).
kernel_package() {
    local re=${1//./\\.}
    # A full version (6.1.0-57, 6.12.117+deb12) names its package; a series (6.1, 6.12) has a metapackage of
    # that name, without a kernel, so it is looked up among the versions.
    if [[ "$1" == *[-+]* ]] && apt-cache show "linux-image-$1-cloud-amd64" >/dev/null 2>&1; then
        echo "linux-image-$1-cloud-amd64"
        return 0
    fi
    apt-cache pkgnames linux-image- 2>/dev/null | grep -E "^linux-image-${re}[.+-].*-cloud-amd64$" | sort -V |
        tail -n 1 || true
}

# Sets $vmlinuz and $kernel_name for --kernel.
resolve_kernel() {
    local spec=$1 name pkg tmp
    if [ -f "$spec" ]; then
        vmlinuz=$(cd "$(dirname "$spec")" && pwd)/$(basename "$spec")
        kernel_name=$(basename "$spec")
        return 0
    fi
    case "$spec" in [0-9]*) ;; *) die "--kernel: a version (6.1, 6.12, 6.1.0-57) or a vmlinuz path, got '$spec'" ;; esac
    name=$(cached_kernel "$spec")
    if [ -z "$name" ]; then
        command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
            unavailable "no cached kernel $spec in $cache/kernels and no apt-get/dpkg-deb to fetch one"
        pkg=$(kernel_package "$spec")
        if [ -z "$pkg" ]; then
            as_root apt-get update "${apt_opts[@]}" >"$work/apt.log" 2>&1 || true
            pkg=$(kernel_package "$spec")
        fi
        [ -n "$pkg" ] || unavailable "no Debian package linux-image-$spec*-cloud-amd64 known to apt (apt-get update?)"
        say "fetching $pkg"
        tmp=$(mktemp -d "$cache/fetch.XXXXXX")
        if ! (cd "$tmp" && apt-get download "${apt_opts[@]}" "$pkg" >"$tmp/log" 2>&1 && dpkg-deb -x ./*.deb x); then
            cat "$tmp/log" >&2 || true
            rm -rf "$tmp"
            unavailable "could not download or unpack $pkg (no network?)"
        fi
        local img
        img=$(find "$tmp/x/boot" -name 'vmlinuz-*' | head -n 1)
        [ -n "$img" ] || { rm -rf "$tmp"; unavailable "$pkg has no boot/vmlinuz-*"; }
        name=${img##*/vmlinuz-}
        mkdir -p "$cache/kernels/$name"
        cp "$img" "$cache/kernels/$name/vmlinuz"
        cp "$tmp"/x/boot/config-* "$cache/kernels/$name/config" 2>/dev/null || true
        rm -rf "$tmp"
    fi
    vmlinuz="$cache/kernels/$name/vmlinuz"
    kernel_name=$name
}
resolve_kernel "$kernel_spec"

# ---------------------------------------------------------------------------------------------------------------
# The binaries: cargo's own list of what it built (JSON messages), so that names and paths need no guessing.

want_tests=0
want_examples=()
names=()
for s in "${selection[@]}"; do
    case "$s" in
    tests | main) want_tests=1 ;;
    all) want_tests=1; want_examples=(hackbench thread_pools pinned sharded_counter) ;;
    examples) want_examples=(hackbench thread_pools pinned sharded_counter) ;;
    examples:hackbench | examples:thread_pools | examples:pinned | examples:sharded_counter) want_examples+=("${s#examples:}") ;;
    examples:*) die "unknown example check ${s#examples:} (hackbench, thread_pools, pinned, sharded_counter)" ;;
    *) want_tests=1 ;;
    esac
done

# "name<TAB>kind<TAB>test<TAB>src_path<TAB>executable" for every artifact of cargo's JSON messages on stdin that
# has an executable (kind: lib, test, example, bench; test: true when built as a test harness).
artifacts() {
    grep '"reason":"compiler-artifact"' | grep -v '"executable":null' | sed -E \
        's/.*"target":\{"kind":\["([a-z-]+)"\][^}]*"name":"([^"]*)","src_path":"([^"]*)".*"profile":\{[^}]*"test":(true|false)\}.*"executable":"([^"]*)".*/\2\t\1\t\4\t\3\t\5/'
}

tests_json="$work/tests.json"
[ "$release" -eq 0 ] || tests_json="$work/tests-release.json"
examples_json="$work/examples.json"
if [ "$build" -eq 1 ]; then
    if [ "$want_tests" -eq 1 ]; then
        say "building the test binaries"
        profile=()
        [ "$release" -eq 0 ] || profile=(--release)
        cargo test --workspace "${profile[@]}" --no-run --message-format=json-render-diagnostics >"$tests_json"
    fi
    if [ ${#want_examples[@]} -gt 0 ]; then
        say "building the examples (release)"
        cargo build --release --examples --message-format=json-render-diagnostics >"$examples_json"
    fi
fi

# The test binaries by cargo target name, and their group for the order: 0 the crates' unit tests, 1 their tests/*.rs,
# 2 the examples' unit tests, 3 loom-tests' binaries (none unless built with the loom feature).
declare -A test_bin=() test_group=()
if [ "$want_tests" -eq 1 ]; then
    [ -s "$tests_json" ] || die "no build list in $tests_json: run once without --no-build"
    while IFS=$'\t' read -r name kind is_test src exe; do
        [ "$is_test" = true ] || continue
        test_bin[$name]=$exe
        case "$src" in
        */loom-tests/*) test_group[$name]=3 ;;
        */examples/*) test_group[$name]=2 ;;
        */tests/*) test_group[$name]=1 ;;
        *) test_group[$name]=0 ;;
        esac
    done < <(artifacts <"$tests_json")
fi
declare -A example_bin=()
if [ ${#want_examples[@]} -gt 0 ]; then
    [ -s "$examples_json" ] || die "no build list in $examples_json: run once without --no-build"
    while IFS=$'\t' read -r name kind is_test src exe; do
        if [ "$kind" = example ] && [ "$is_test" = false ]; then example_bin[$name]=$exe; fi
    done < <(artifacts <"$examples_json")
fi

# The selected test binaries, in a fixed order: the library's unit tests, tests/*.rs, the examples' unit tests,
# the loom binaries.
order() {
    local n
    for n in "${!test_bin[@]}"; do
        echo "${test_group[$n]} $n"
    done | sort -k1,1n -k2 | cut -d' ' -f2
}
selected=()
for s in "${selection[@]}"; do
    case "$s" in
    tests | all) mapfile -t -O "${#selected[@]}" selected < <(order) ;;
    main)
        for n in $(order); do
            if [ "${test_group[$n]}" -le 1 ]; then selected+=("$n"); fi
        done
        ;;
    examples | examples:*) ;;
    *)
        [ -n "${test_bin[$s]:-}" ] || die "no test binary named '$s'; there are: $(order | tr '\n' ' ')"
        selected+=("$s")
        ;;
    esac
done
# Each binary once, in the order asked.
declare -A seen=()
tests_run=()
for n in "${selected[@]}"; do
    [ -n "${seen[$n]:-}" ] || tests_run+=("$n")
    seen[$n]=1
done
for e in "${want_examples[@]}"; do
    [ -n "${example_bin[$e]:-}" ] || die "example $e was not built"
done

# ---------------------------------------------------------------------------------------------------------------
# The example checks. Each is a command line for the guest and a check of its output on the host; both follow
# the guest's CPU counts (online A, possible P), so that they hold on any topology. mmcid's limits
# (docs/design.md, Group::max_cids): a group over A allowed CPUs of P possible with U registered threads has
# max_cids = min(min(A, U) + min(A, U) / 4, P) and is per-CPU once U > max_cids; every steady-state CID is below
# max_cids, every CID (a core's extra CIDs and temporaries included) below U + K P, I2's hard bound, where K is
# the CIDs a core may own (Group::cids_per_core; the examples' groups keep the default, MAX_CIDS_PER_CORE).
k=16

# example_runs EXAMPLE: lines "LABEL<TAB>ARGS" for the guest. The thread counts are computed in the guest from
# the CPUs it has ($switch_at: the fewest registered threads that make a group per-CPU there).
example_runs() {
    case "$1" in
    hackbench)
        # 2 x fds threads per group: below the switch (fds = (switch_at - 1) / 2), and far above it.
        printf '%s\t%s\n' \
            below '--policy mmcid -g 1 -f $(((switch_at - 1) / 2)) -l 100' \
            above '--policy mmcid -g 2 -f $switch_at -l 50' \
            above-update '--policy mmcid -g 2 -f $switch_at -l 50 --guard update' \
            compare '--compare --policies none,mmcid --repeats 1 --groups-list 1,2 -f 8 -l 50'
        ;;
    thread_pools)
        printf '%s\t%s\n' \
            at-limit '-p 1 -t $((switch_at - 1)) --policy mmcid --seconds 0.5' \
            over-limit '-p 1 -t $switch_at --policy mmcid --seconds 0.5' \
            compare '--compare --policies none,mmcid --repeats 1 --seconds 0.1'
        ;;
    pinned)
        printf '%s\t%s\n' one-per-cpu '--iters 20000 --threads-per-cpu 1' two-per-cpu '--iters 5000 --threads-per-cpu 2'
        ;;
    sharded_counter)
        printf '%s\t%s\n' \
            few '--threads $((switch_at - 1)) --iters 20000' \
            many '--threads $((4 * online_cpus)) --iters 50000'
        ;;
    esac
}

# Number of CPUs in a kernel CPU list ("0-3,8-11" -> 8).
list_count() {
    local n=0 r
    for r in ${1//,/ }; do
        n=$((n + ${r#*-} - ${r%-*} + 1))
    done
    echo "$n"
}
max_cids() { # max_cids A P U
    local opt=$(($1 < $3 ? $1 : $3))
    local m=$((opt + opt / 4))
    echo $((m < $2 ? m : $2))
}
switch_at() { # switch_at A P: the fewest users with users > max_cids
    local u=1
    while [ "$u" -le "$(max_cids "$1" "$2" "$u")" ]; do u=$((u + 1)); done
    echo "$u"
}

# check_example EXAMPLE LABEL OUTPUT_FILE A P: prints what is wrong (nothing when the output is right).
check_example() {
    local ex=$1 label=$2 out=$3 a=$4 p=$5 sw
    sw=$(switch_at "$a" "$p")
    case "$ex:$label" in
    hackbench:below | hackbench:above | hackbench:above-update)
        local threads to_cpu to_task
        threads=$(sed -nE 's/.*\(== ([0-9]+) tasks\).*/\1/p' "$out")
        to_cpu=$(sed -nE 's/.*switches: ([0-9]+) to per-CPU, ([0-9]+) to per-task.*/\1/p' "$out")
        to_task=$(sed -nE 's/.*switches: ([0-9]+) to per-CPU, ([0-9]+) to per-task.*/\2/p' "$out")
        grep -q '^Messages: [0-9]* passed' "$out" || echo "no 'Messages: N passed' line"
        [ -n "$threads" ] && [ -n "$to_cpu" ] || { echo "no thread count or mmcid switch line"; return; }
        if [ "$threads" -lt "$sw" ]; then
            [ "$to_cpu" -eq 0 ] || echo "$threads threads, below the per-CPU switch at $sw, but $to_cpu switches to per-CPU"
        else
            [ "$to_cpu" -ge 1 ] && [ "$to_task" -ge 1 ] ||
                echo "$threads threads, at or above the per-CPU switch at $sw, but switches $to_cpu to per-CPU / $to_task back"
        fi
        ;;
    hackbench:compare)
        grep -q '^goal (mmcid' "$out" || echo "no goal verdict: the comparison did not finish"
        ;;
    thread_pools:at-limit | thread_pools:over-limit)
        local created failed to_cpu to_task want
        created=$(sed -nE 's/^created ([0-9]+) threads \(([0-9]+) failed.*/\1/p' "$out")
        failed=$(sed -nE 's/^created ([0-9]+) threads \(([0-9]+) failed.*/\2/p' "$out")
        to_cpu=$(sed -nE 's/^mmcid mode switches: ([0-9]+) to per-CPU, ([0-9]+) to per-task.*/\1/p' "$out")
        to_task=$(sed -nE 's/^mmcid mode switches: ([0-9]+) to per-CPU, ([0-9]+) to per-task.*/\2/p' "$out")
        [ -n "$created" ] && [ -n "$to_cpu" ] || { echo "no 'created' or 'mmcid mode switches' line"; return; }
        [ "$created" -gt 0 ] && [ "$failed" -eq 0 ] || echo "created $created threads, $failed failed to start"
        if [ "$label" = at-limit ]; then
            want="0 to per-CPU with $((sw - 1)) threads (max_cids $(max_cids "$a" "$p" $((sw - 1))))"
            [ "$to_cpu" -eq 0 ] && [ "$to_task" -eq 0 ] || echo "switches $to_cpu/$to_task, want $want"
        else
            [ "$to_cpu" -ge 1 ] && [ "$to_task" -ge 1 ] ||
                echo "switches $to_cpu to per-CPU / $to_task back with $sw threads (> max_cids $(max_cids "$a" "$p" "$sw")): want both >= 1"
        fi
        ;;
    thread_pools:compare)
        # Only the crossing warning is about mmcid: the other one (spawn failures, check-ins later than 1 s) is
        # about the machine's speed, which under emulation says nothing.
        grep '^WARNING.*did not switch both ways' "$out" || true
        grep -q '^goal (mmcid' "$out" || echo "no goal verdict: the comparison did not finish"
        ;;
    pinned:one-per-cpu | pinned:two-per-cpu)
        local per=1 users bound lines
        [ "$label" = one-per-cpu ] || per=2
        users=$((per * a))
        grep -q '^total .*(expected' "$out" || echo "no total line"
        lines=$(grep -c '^thread .* on core .*: CIDs {' "$out" || true)
        [ "$lines" -eq "$users" ] || echo "$lines thread lines, want $users ($per per online CPU)"
        if [ "$users" -le "$(max_cids "$a" "$p" "$users")" ]; then
            # Per-task mode: each thread keeps one CID (I3), below max_cids (I2), no two alike (I1).
            bound=$(max_cids "$a" "$p" "$users")
            grep '^thread .* on core .*: CIDs {' "$out" | awk -v bound="$bound" '
                !/group mode PerTask/ { print "not per-task: " $0 }
                { s = $0; sub(/.*CIDs \{/, "", s); sub(/\}.*/, "", s); n = split(s, c, /, /)
                  if (n != 1) print "more than one CID in per-task mode: " $0
                  for (i = 1; i <= n; i++) { if (c[i] + 0 >= bound) print "CID " c[i] " >= max_cids " bound ": " $0
                                            if (c[i] in seen) print "CID " c[i] " used by two threads"; seen[c[i]] = 1 } }'
        else
            bound=$((users + k * p))
            grep '^thread .* on core .*: CIDs {' "$out" | awk -v bound="$bound" '
                !/group mode PerCpu/ { print "not per-CPU: " $0 }
                { s = $0; sub(/.*CIDs \{/, "", s); sub(/\}.*/, "", s); n = split(s, c, /, /)
                  for (i = 1; i <= n; i++) if (c[i] + 0 >= bound) print "CID " c[i] " >= users + K cores " bound ": " $0 }'
        fi
        ;;
    sharded_counter:few | sharded_counter:many)
        local threads shards bound
        threads=$(sed -nE 's/^threads: *([0-9]+).*/\1/p' "$out")
        shards=$(sed -nE 's/^shards allocated: ([0-9]+) for.*/\1/p' "$out")
        [ -n "$threads" ] && [ -n "$shards" ] || { echo "no threads or shards line"; return; }
        grep -q '^total: *\([0-9]*\) (expected \1)' "$out" || echo "the total is not the expected one"
        if [ "$label" = few ]; then
            bound=$(max_cids "$a" "$p" "$threads") # per-task: one CID per thread, below max_cids
            [ "$shards" -le "$bound" ] || echo "$shards shards for $threads threads in per-task mode: above max_cids $bound"
        else
            bound=$((threads + k * p)) # per-CPU, oversubscribed: core CIDs and temporaries, below users + K cores
            [ "$shards" -le "$bound" ] || echo "$shards shards for $threads threads: above users + K cores = $bound"
        fi
        ;;
    esac
}

# ---------------------------------------------------------------------------------------------------------------
# KVM or TCG. A probe guest (busybox alone) tells whether KVM boots here; the answer is cached per host kernel and
# QEMU version. Nested hosts can expose /dev/kvm and still crash the guest.

qemu_version=$(qemu-system-x86_64 --version | head -n 1)
probe_kvm() {
    local key probe_root probe_cpio out
    key="$(uname -r) ${qemu_version}"
    if [ -f "$cache/kvm-probe" ] && [ "$(head -n 1 "$cache/kvm-probe")" = "$key" ]; then
        [ "$(sed -n 2p "$cache/kvm-probe")" = ok ]
        return
    fi
    probe_root=$(mktemp -d "$work/probe.XXXXXX")
    mkdir -p "$probe_root/bin"
    cp "$busybox" "$probe_root/bin/busybox"
    printf '#!/bin/busybox sh\necho @@VMTEST-PROBE-OK\n/bin/busybox poweroff -f\n' >"$probe_root/init"
    chmod +x "$probe_root/init"
    probe_cpio="$probe_root.cpio"
    (cd "$probe_root" && find . | "$busybox" cpio -o -H newc >"$probe_cpio" 2>/dev/null)
    out=$(timeout -k 5 30 qemu-system-x86_64 -accel kvm -cpu host -smp 2 -m 256 -nodefaults -no-user-config \
        -display none -no-reboot -serial stdio -kernel "$vmlinuz" -initrd "$probe_cpio" \
        -append "console=ttyS0 quiet panic=-1" </dev/null 2>&1 || true)
    rm -rf "$probe_root" "$probe_cpio"
    if grep -q '@@VMTEST-PROBE-OK' <<<"$out"; then
        printf '%s\nok\n' "$key" >"$cache/kvm-probe"
        return 0
    fi
    printf '%s\nfails\n' "$key" >"$cache/kvm-probe"
    return 1
}
case "$accel" in
kvm) accel_args=(-accel kvm -cpu host) ;;
tcg) accel_args=(-accel tcg,thread=multi -cpu max) ;;
auto)
    if [ -r /dev/kvm ] && [ -w /dev/kvm ] && probe_kvm; then
        accel=kvm
        accel_args=(-accel kvm -cpu host)
    else
        accel=tcg
        accel_args=(-accel tcg,thread=multi -cpu max)
    fi
    ;;
esac

# ---------------------------------------------------------------------------------------------------------------
# The initramfs: busybox, the binaries (debug info stripped where strip exists), the libraries ldd names, /init.

# Each run has its own directory (so that runs may overlap): the logs stay, the root and initramfs go at the end.
run_dir="$work/runs/$(date +%Y%m%d-%H%M%S)-$$-smp${smp//[,=]/_}${online:+-online$online}-${kernel_name}"
mkdir -p "$run_dir/out"
root="$run_dir/root"
initrd="$run_dir/initramfs.cpio"
trap 'rm -rf "$root" "$initrd"' EXIT
mkdir -p "$root"/{bin,t,e,proc,sys,dev,tmp,etc}
cp "$busybox" "$root/bin/busybox"
copy_bin() { # copy_bin SRC DEST
    if command -v strip >/dev/null; then
        strip --strip-debug -o "$2" "$1" 2>/dev/null || cp "$1" "$2"
    else
        cp "$1" "$2"
    fi
}
libs=()
for n in "${tests_run[@]}"; do
    copy_bin "${test_bin[$n]}" "$root/t/$n"
    libs+=("${test_bin[$n]}")
done
for e in "${want_examples[@]}"; do
    copy_bin "${example_bin[$e]}" "$root/e/$e"
    libs+=("${example_bin[$e]}")
done
# Shared libraries (with the dynamic loader) at the paths the binaries name.
if [ ${#libs[@]} -gt 0 ]; then
    for lib in $(ldd "${libs[@]}" 2>/dev/null | grep -oE '/[^ ]+' | sort -u); do
        [ -f "$lib" ] || continue
        mkdir -p "$root$(dirname "$lib")"
        cp -L "$lib" "$root$lib"
    done
fi
# /lib64 and /lib may be links in the host's layout (merged /usr): the loader path is what matters.
echo "root:x:0:0:root:/tmp:/bin/sh" >"$root/etc/passwd"

{
    cat <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin HOME=/tmp TMPDIR=/tmp TERM=dumb RUST_BACKTRACE=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp
ulimit -n 65536
cd /tmp
cpus() { cat /sys/devices/system/cpu/$1 2>/dev/null || echo '?'; }
rseq=$( [ -e /proc/sys/kernel/rseq ] && echo yes || echo '?')
echo "@@VMTEST GUEST kernel=$(uname -r) nproc=$(nproc) possible=$(cpus possible) present=$(cpus present) online=$(cpus online)"
online_cpus=$(nproc)
possible_cpus=0
for r in $(cpus possible | tr , ' '); do possible_cpus=$((possible_cpus + ${r#*-} - ${r%-*} + 1)); done
# The fewest registered threads that make a group per-CPU here (max_cids = min(min(A, U) + min(A, U)/4, P)).
switch_at=1
while :; do
    o=$online_cpus; [ $switch_at -lt $o ] && o=$switch_at
    m=$((o + o / 4)); [ $m -gt $possible_cpus ] && m=$possible_cpus
    [ $switch_at -gt $m ] && break
    switch_at=$((switch_at + 1))
done
# threads PID: what each thread of a binary that ran out of time is doing (name, state, the kernel function it
# waits in, its system call with the user stack pointer and program counter, its kernel stack).
threads() {
    echo "@@VMTEST TIMEOUT: the threads of pid $1 before it is killed"
    for t in /proc/$1/task/*; do
        name=$(cat $t/comm 2>/dev/null) || continue # ended meanwhile
        echo "-- tid ${t##*/} $name: $(grep State: $t/status 2>/dev/null)," \
            "wchan $(cat $t/wchan 2>/dev/null), syscall $(cat $t/syscall 2>/dev/null)"
        cat $t/stack 2>/dev/null
    done
    grep " /t/" /proc/$1/maps 2>/dev/null | head -1
}
# run LABEL CMD...: one binary, between markers; after the binary timeout its threads are listed and it is killed.
run() {
    label=$1
    shift
    echo "@@VMTEST BEGIN $label"
    "$@" &
    pid=$!
    (sleep "$binary_timeout" && threads $pid && kill -KILL $pid) &
    watchdog=$!
    wait $pid
    rc=$?
    kill $watchdog 2>/dev/null
    printf '\n@@VMTEST DONE %s rc=%s\n' "$label" "$rc"
}
EOF
    echo "binary_timeout=$binary_timeout"
    # The tests' deadlock detectors wait this many times longer (tests/common's patience).
    echo "export MMCID_TEST_TIME_SCALE=${time_scale:-$([ "$accel" = kvm ] && echo 1 || echo 10)}"
    if [ "$report_time" -eq 1 ]; then
        # libtest takes its unstable options from a stable toolchain's binaries when RUSTC_BOOTSTRAP is set.
        echo "export RUSTC_BOOTSTRAP=1"
        test_args=(-Z unstable-options --report-time "${test_args[@]}")
    fi
    for ((r = 1; r <= repeat; r++)); do
        for n in "${tests_run[@]}"; do
            printf 'run %q /t/%q' "$n#$r" "$n"
            [ ${#test_args[@]} -eq 0 ] || printf ' %q' "${test_args[@]}"
            echo
        done
        for e in "${want_examples[@]}"; do
            while IFS=$'\t' read -r label args; do
                # The arguments are expanded in the guest (they use its CPU counts).
                echo "run \"example:$e:$label#$r\" /e/$e $args"
            done < <(example_runs "$e")
        done
    done
    cat <<'EOF'
echo "@@VMTEST END"
poweroff -f
EOF
} >"$root/init"
chmod +x "$root/init"

(cd "$root" && find . | "$busybox" cpio -o -H newc >"$initrd" 2>/dev/null)
initrd_mib=$(($(stat -c %s "$initrd") / 1048576 + 1))
[ -n "$mem" ] || mem=$((2048 + 2 * initrd_mib))

# Kernel command line. lpj skips the per-CPU delay-loop calibration (minutes for 64 vCPUs under TCG);
# tsc=unstable keeps the kernel from flipping the sched_clock static key after the CPUs are up: under
# multi-threaded TCG a CPU can still run the int3 of that code patch once it is done, an oops in the guest.
# oops=panic and panic=-1 with -no-reboot end the guest at once on a kernel oops.
# nowatchdog and rcu_cpu_stall_suppress: 64 vCPUs sharing 2 host cores starve each other for seconds, which the
# lockup detectors and RCU would report as kernel bugs.
append="console=ttyS0 quiet panic=-1 oops=panic lpj=10000000 tsc=unstable nowatchdog rcupdate.rcu_cpu_stall_suppress=1"
[ -z "$online" ] || append+=" maxcpus=$online"

# ---------------------------------------------------------------------------------------------------------------
# Boot and read the console: each binary's output goes to its own log, its result and time (host wall clock,
# from its BEGIN to its DONE marker) to the terminal.

console="$run_dir/console.log"
say "kernel $kernel_name, -smp $smp${online:+ (online $online)}, $accel, ${mem} MiB, initramfs ${initrd_mib} MiB," \
    "${#tests_run[@]} test binaries${want_examples:+ + examples ${want_examples[*]}} x $repeat; logs in $run_dir"

declare -A runs=() passes=() secs=()
failures=()
ended=0
oops=0
guest=""
current=""
begun=0
start_us=${EPOCHREALTIME/./}
ms_to_s() { printf '%d.%d' $(($1 / 1000)) $(($1 % 1000 / 100)); }

while IFS= read -r line; do
    line=${line%$'\r'}
    printf '%s\n' "$line" >>"$console"
    [ "$verbose" -eq 0 ] || printf '%s\n' "$line"
    case "$line" in
    *'@@VMTEST GUEST '*)
        guest=${line#*@@VMTEST GUEST }
        say "guest: $guest ($(ms_to_s $(((${EPOCHREALTIME/./} - start_us) / 1000))) s to boot)"
        ;;
    *'@@VMTEST BEGIN '*)
        current=${line#*@@VMTEST BEGIN }
        begun=${EPOCHREALTIME/./}
        : >"$run_dir/out/$current.log"
        ;;
    *'@@VMTEST DONE '*)
        rest=${line#*@@VMTEST DONE }
        label=${rest% rc=*}
        rc=${rest##* rc=}
        ms=$(((${EPOCHREALTIME/./} - begun) / 1000))
        name=${label%#*}
        runs[$name]=$((${runs[$name]:-0} + 1))
        secs[$name]=$((${secs[$name]:-0} + ms))
        verdict=ok
        if [ "$rc" != 0 ]; then
            verdict="FAILED (exit $rc)"
            [ "$rc" != 137 ] || verdict="FAILED (exit $rc: killed after ${binary_timeout} s?)"
        elif [[ "$name" == example:* ]]; then
            ex=${name#example:}
            a=$(sed -nE 's/.*online=([0-9,-]+).*/\1/p' <<<"$guest")
            p=$(sed -nE 's/.*possible=([0-9,-]+).*/\1/p' <<<"$guest")
            problems=$(check_example "${ex%%:*}" "${ex#*:}" "$run_dir/out/$label.log" "$(list_count "$a")" "$(list_count "$p")")
            if [ -n "$problems" ]; then
                verdict="FAILED check: $(head -n 3 <<<"$problems" | paste -sd ';' -)"
            fi
        fi
        printf 'vm-test: %-46s %-4s %7s s  %s\n' "$label" "" "$(ms_to_s "$ms")" "$verdict" >&2
        if [ "$verdict" = ok ]; then
            passes[$name]=$((${passes[$name]:-0} + 1))
        else
            failures+=("$label")
            # The failure's own lines (a test binary's passing tests left out).
            grep -vE '^test .* \.\.\. ok$|^$' "$run_dir/out/$label.log" | tail -n 60 | sed 's/^/    | /' >&2
        fi
        current=""
        ;;
    *'@@VMTEST END'*) ended=1 ;;
    *'Kernel panic'* | *'Oops:'* | *'BUG: '*)
        oops=1
        [ -z "$current" ] || printf '%s\n' "$line" >>"$run_dir/out/$current.log"
        ;;
    *)
        [ -z "$current" ] || printf '%s\n' "$line" >>"$run_dir/out/$current.log"
        ;;
    esac
done < <(timeout -k 10 "$timeout_s" qemu-system-x86_64 "${accel_args[@]}" -smp "$smp" -m "$mem" \
    -nodefaults -no-user-config -display none -no-reboot -serial stdio \
    -kernel "$vmlinuz" -initrd "$initrd" -append "$append" </dev/null 2>&1)

total_ms=$(((${EPOCHREALTIME/./} - start_us) / 1000))
{
    echo "kernel $kernel_name, -smp $smp${online:+, online $online}, $accel, repeat $repeat, $(date -u '+%F %T') UTC"
    echo "guest: ${guest:-never reported}"
    printf '%-46s %5s %5s %9s\n' binary runs ok 's/run'
    for name in $(printf '%s\n' "${!runs[@]}" | sort); do
        printf '%-46s %5d %5d %9s\n' "$name" "${runs[$name]}" "${passes[$name]:-0}" \
            "$(ms_to_s $((${secs[$name]} / ${runs[$name]})))"
    done
    echo "whole guest: $(ms_to_s "$total_ms") s (host wall clock; under TCG no time here measures performance)"
} | tee "$run_dir/summary.txt" >&2

status=0
if [ "$oops" -eq 1 ]; then
    say "the guest kernel reported an oops or panic (see $console)"
    status=1
fi
if [ "$ended" -eq 0 ]; then
    say "the guest did not reach its end marker (crash, hang past --timeout $timeout_s s, or qemu error); console tail:"
    tail -n 30 "$console" | sed 's/^/    | /' >&2
    status=1
fi
if [ ${#failures[@]} -gt 0 ]; then
    say "${#failures[@]} failed: ${failures[*]}"
    status=1
fi
[ "$status" -ne 0 ] || say "all passed"
exit "$status"
