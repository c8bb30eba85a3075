//! Per-CPU data as users write it: mmcid against the peers a user would pick instead, in loops shaped like user
//! code (the operation monomorphized and inlined into each worker's loop; no dynamic call and no `black_box` per
//! operation), all measured in the same run.
//!
//! ```text
//! cargo run --release --example use_case -- [--compare] [--workloads counter,record,private] [--threads LIST]
//!                                           [--seconds S] [--repeats N] [--private-rounds N] [--json FILE]
//!                                           [--svg FILE]
//! ```
//!
//! Workloads:
//! * `counter`: a counter add (`+1`);
//! * `record`: an update of a 56-byte statistics record (count, sum, max, four buckets) in a tight loop;
//! * `private`: the same record update with private work outside the guard (`--private-rounds` rounds of a
//!   mixing function that also produces the recorded value), sized so that the guard is about a tenth of each
//!   thread's time; the `private work alone` line is that work without any update, the baseline of the guard's
//!   share.
//!
//! Thread counts (default): 1, cores, 4 × cores and 16 × cores unpinned, and 1 and cores pinned (one thread per
//! allowed CPU). Each cell runs its threads for `--seconds` seconds and reports the workers' CPU time per update
//! (the median over `--repeats` interleaved repeats) and the shards or slots the approach used; every total is
//! checked against the updates made.

use mmcid_harness as common;
use mmcid_harness::peers;

use common::chart::{self, Chart, Panel, Series, Style};
use common::cli::{self, Args, Flag};
use common::{errln, outln};
use crossbeam_utils::CachePadded;
use mmcid::{Group, PerCid, Registration, ShardedCounter};
use peers::{getcpu, possible_cpus, thread_cpu_ns, Padded, Rseq};
use std::cell::{RefCell, UnsafeCell};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Barrier};
use std::time::Duration;
use thread_local::ThreadLocal;

// ---------------------------------------------------------------------------------------------------------------
// What is updated

/// A statistics record of 56 bytes: what a per-CPU metrics shard typically holds.
#[derive(Clone, Copy, Default, Debug)]
struct Record {
    count: u64,
    sum: u64,
    max: u64,
    buckets: [u64; 4],
}

const _: () = assert!(std::mem::size_of::<Record>() == 56);

impl Record {
    #[inline(always)]
    fn apply(&mut self, v: u64) {
        self.count += 1;
        self.sum = self.sum.wrapping_add(v);
        self.max = self.max.max(v);
        self.buckets[(v >> 62) as usize] += 1;
    }

    fn merge(&mut self, o: &Record) {
        self.count += o.count;
        self.sum = self.sum.wrapping_add(o.sum);
        self.max = self.max.max(o.max);
        for (a, b) in self.buckets.iter_mut().zip(o.buckets) {
            *a += b;
        }
    }
}

/// The values a worker records: a xorshift sequence, so every approach records the same values and nothing folds
/// to a constant.
#[derive(Clone, Copy)]
struct Values(u64);

impl Values {
    fn new(thread: usize) -> Values {
        Values(0x9E37_79B9_7F4A_7C15 ^ (thread as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    #[inline(always)]
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// `rounds` rounds of private work (a multiply-xorshift mix with a serial dependency), whose result is the
    /// next value recorded.
    #[inline(always)]
    fn private(&mut self, rounds: u32) -> u64 {
        let mut x = self.next();
        for _ in 0..rounds {
            x = (x ^ (x >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        x
    }
}

/// What a worker checks against after the run: its updates, and for records the sum and largest of its values.
#[derive(Clone, Copy, Default)]
struct Expect {
    updates: u64,
    sum: u64,
    max: u64,
}

// ---------------------------------------------------------------------------------------------------------------
// Approaches

/// One way to keep per-CPU style data. `update` is called from the worker loop, monomorphized and inlined.
trait Approach: Send + Sync + 'static {
    /// Per-thread state, made on the worker's own thread before timing starts.
    type Local;
    fn local(&self) -> Self::Local;
    /// One update with value `v` (`counter` ignores it and adds 1).
    fn update(&self, local: &mut Self::Local, v: u64);
    /// The totals the data holds after every worker finished, and the shards or slots used.
    fn totals(&mut self) -> (Record, usize);
    /// Whether `totals` must match the updates made (false only for the baseline that updates nothing).
    fn checked(&self) -> bool {
        true
    }
    /// The group's path counters after the run (mmcid approaches), for `--stats`.
    fn stats(&self) -> Option<mmcid::Stats> {
        None
    }
}

/// Counter approaches hold `u64` shards: `totals` returns a record with only `count` set.
fn counted(count: u64, shards: usize) -> (Record, usize) {
    (Record { count, ..Record::default() }, shards)
}

/// `ShardedCounter::add`.
struct CounterAdd(ShardedCounter);

impl Approach for CounterAdd {
    type Local = ();
    fn local(&self) {}
    #[inline(always)]
    fn update(&self, _: &mut (), _: u64) {
        self.0.add(1);
    }
    fn stats(&self) -> Option<mmcid::Stats> {
        Some(self.0.group().stats())
    }
    fn totals(&mut self) -> (Record, usize) {
        counted(self.0.sum(), self.0.shards_allocated())
    }
}

/// `ShardedCounter::add_with` inside a guard of an explicit registration.
struct CounterReg(ShardedCounter);

impl Approach for CounterReg {
    type Local = Registration;
    fn local(&self) -> Registration {
        self.0.group().register()
    }
    #[inline(always)]
    fn update(&self, reg: &mut Registration, _: u64) {
        self.0.add_with(&reg.enter(), 1);
    }
    fn stats(&self) -> Option<mmcid::Stats> {
        Some(self.0.group().stats())
    }
    fn totals(&mut self) -> (Record, usize) {
        counted(self.0.sum(), self.0.shards_allocated())
    }
}

/// `ShardedCounter::add_with` inside a `Group::enter` guard.
struct CounterGroup(ShardedCounter);

impl Approach for CounterGroup {
    type Local = ();
    fn local(&self) {}
    #[inline(always)]
    fn update(&self, _: &mut (), _: u64) {
        self.0.add_with(&self.0.group().enter(), 1);
    }
    fn stats(&self) -> Option<mmcid::Stats> {
        Some(self.0.group().stats())
    }
    fn totals(&mut self) -> (Record, usize) {
        counted(self.0.sum(), self.0.shards_allocated())
    }
}

/// `thread_local::ThreadLocal<AtomicU64>` with `fetch_add`.
#[derive(Default)]
struct TlAtomic(ThreadLocal<AtomicU64>);

impl Approach for TlAtomic {
    type Local = ();
    fn local(&self) {}
    #[inline(always)]
    fn update(&self, _: &mut (), _: u64) {
        self.0.get_or_default().fetch_add(1, Relaxed);
    }
    fn totals(&mut self) -> (Record, usize) {
        counted(self.0.iter().map(|c| c.load(Relaxed)).sum(), self.0.iter().count())
    }
}

/// Padded atomics indexed by `sched_getcpu`, with `fetch_add`.
struct CpuFetchAdd(Padded);

impl Approach for CpuFetchAdd {
    type Local = ();
    fn local(&self) {}
    #[inline(always)]
    fn update(&self, _: &mut (), _: u64) {
        self.0.at(getcpu()).fetch_add(1, Relaxed);
    }
    fn totals(&mut self) -> (Record, usize) {
        counted(self.0.sum(), self.0.touched())
    }
}

/// Padded atomics indexed by the kernel's rseq `mm_cid`, with `fetch_add`.
struct MmCidFetchAdd(Padded, Rseq);

impl Approach for MmCidFetchAdd {
    type Local = ();
    fn local(&self) {}
    #[inline(always)]
    fn update(&self, _: &mut (), _: u64) {
        self.0.at(self.1.mm_cid()).fetch_add(1, Relaxed);
    }
    fn totals(&mut self) -> (Record, usize) {
        counted(self.0.sum(), self.0.touched())
    }
}

/// A restartable-sequence increment of padded cells indexed by the kernel's `mm_cid`, no atomic instruction.
struct MmCidSequence(Padded, Rseq);

impl Approach for MmCidSequence {
    type Local = ();
    fn local(&self) {}
    #[inline(always)]
    fn update(&self, _: &mut (), _: u64) {
        self.1.add(&self.0, 1);
    }
    fn totals(&mut self) -> (Record, usize) {
        counted(self.0.sum(), self.0.touched())
    }
}

/// `PerCid<Record>` inside a guard of an explicit registration.
struct RecordReg(Group, PerCid<Record>);

impl Approach for RecordReg {
    type Local = Registration;
    fn local(&self) -> Registration {
        self.0.register()
    }
    #[inline(always)]
    fn update(&self, reg: &mut Registration, v: u64) {
        let mut guard = reg.enter();
        self.1.get_mut(&mut guard).apply(v);
    }
    fn stats(&self) -> Option<mmcid::Stats> {
        Some(self.0.stats())
    }
    fn totals(&mut self) -> (Record, usize) {
        percid_totals(&mut self.1)
    }
}

/// `PerCid<Record>` inside a `Group::enter` guard.
struct RecordGroup(Group, PerCid<Record>);

impl Approach for RecordGroup {
    type Local = ();
    fn local(&self) {}
    #[inline(always)]
    fn update(&self, _: &mut (), v: u64) {
        let mut guard = self.0.enter();
        self.1.get_mut(&mut guard).apply(v);
    }
    fn stats(&self) -> Option<mmcid::Stats> {
        Some(self.0.stats())
    }
    fn totals(&mut self) -> (Record, usize) {
        percid_totals(&mut self.1)
    }
}

fn percid_totals(p: &mut PerCid<Record>) -> (Record, usize) {
    let mut total = Record::default();
    for (_, r) in p.iter_mut() {
        total.merge(r);
    }
    (total, p.shards_allocated())
}

/// `thread_local::ThreadLocal<RefCell<Record>>`.
#[derive(Default)]
struct TlRecord(ThreadLocal<RefCell<Record>>);

impl Approach for TlRecord {
    type Local = ();
    fn local(&self) {}
    #[inline(always)]
    fn update(&self, _: &mut (), v: u64) {
        self.0.get_or_default().borrow_mut().apply(v);
    }
    fn totals(&mut self) -> (Record, usize) {
        let mut total = Record::default();
        let mut n = 0;
        for r in self.0.iter_mut() {
            total.merge(r.get_mut());
            n += 1;
        }
        (total, n)
    }
}

/// A record behind a test-and-set spin lock, one per slot.
#[derive(Default)]
struct Locked {
    lock: AtomicBool,
    record: UnsafeCell<Record>,
}

// SAFETY: `record` is only accessed while `lock` is held (Acquire on taking it, Release on giving it back).
unsafe impl Sync for Locked {}

impl Locked {
    #[inline(always)]
    fn update(&self, v: u64) {
        while self.lock.compare_exchange_weak(false, true, Acquire, Relaxed).is_err() {
            std::hint::spin_loop();
        }
        // SAFETY: the lock is ours until the Release store below.
        unsafe { (*self.record.get()).apply(v) };
        self.lock.store(false, Release);
    }
}

/// Records behind per-slot spin locks, indexed by the kernel's rseq `mm_cid`.
struct MmCidSpin(Box<[CachePadded<Locked>]>, Rseq);

impl Approach for MmCidSpin {
    type Local = ();
    fn local(&self) {}
    #[inline(always)]
    fn update(&self, _: &mut (), v: u64) {
        self.0[self.1.mm_cid()].update(v);
    }
    fn totals(&mut self) -> (Record, usize) {
        slot_totals(self.0.iter_mut().map(|l| *l.record.get_mut()))
    }
}

/// Records behind per-CPU `parking_lot::Mutex`es, indexed by `sched_getcpu`.
struct CpuMutex(Box<[CachePadded<parking_lot::Mutex<Record>>]>);

impl Approach for CpuMutex {
    type Local = ();
    fn local(&self) {}
    #[inline(always)]
    fn update(&self, _: &mut (), v: u64) {
        self.0[getcpu()].lock().apply(v);
    }
    fn totals(&mut self) -> (Record, usize) {
        slot_totals(self.0.iter_mut().map(|m| *m.get_mut()))
    }
}

fn slot_totals(records: impl Iterator<Item = Record>) -> (Record, usize) {
    let mut total = Record::default();
    let mut used = 0;
    for r in records {
        used += (r.count != 0) as usize;
        total.merge(&r);
    }
    (total, used)
}

/// The private work alone, no update: the baseline of the `private` workload.
struct PrivateOnly;

impl Approach for PrivateOnly {
    type Local = ();
    fn local(&self) {}
    #[inline(always)]
    fn update(&self, _: &mut (), v: u64) {
        // The value must be used, or the private work would be dead code; a register-only sink is what a user's
        // loop has (the value goes into the update).
        std::hint::black_box(v);
    }
    fn totals(&mut self) -> (Record, usize) {
        (Record::default(), 0)
    }
    fn checked(&self) -> bool {
        false
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Running a cell

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    Counter,
    Record,
    Private,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Counter => "counter",
            Workload::Record => "record",
            Workload::Private => "private",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Workload::Counter => "(a) counter add",
            Workload::Record => "(b) 56-byte record update, tight loop",
            Workload::Private => "(c) 56-byte record update with private work outside the guard",
        }
    }
}

/// One thread configuration: `threads` workers, pinned one per allowed CPU or not.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Config {
    threads: usize,
    pinned: bool,
}

impl Config {
    fn label(self) -> String {
        format!("T={}{}", self.threads, if self.pinned { " pin" } else { "" })
    }
}

/// One cell's result.
#[derive(Clone, Copy, Debug)]
struct Cell {
    ns: f64,
    shards: usize,
}

/// Runs `threads` workers of approach `a` for `run` (wall time); checks the totals.
fn run_cell<A: Approach>(
    a: A,
    w: Workload,
    cfg: Config,
    run: Duration,
    rounds: u32,
    cpus: &[usize],
    stats: bool,
) -> Result<Cell, String> {
    let a = Arc::new(a);
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(cfg.threads + 1));
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handles: Vec<_> = (0..cfg.threads)
        .map(|i| {
            let (a, stop, ready, started) = (a.clone(), stop.clone(), ready.clone(), started.clone());
            let cpu = cfg.pinned.then(|| cpus[i % cpus.len()]);
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || {
                    if let Some(c) = cpu {
                        if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
                            errln!("note: could not pin a worker to CPU {c}");
                        }
                    }
                    let mut local = a.local();
                    ready.wait();
                    // Every worker runs before the clock starts (a barrier's wake-up can leave some runnable but not
                    // yet running when the others already count).
                    started.fetch_add(1, Relaxed);
                    let r = match w {
                        Workload::Counter => worker(&*a, &mut local, &stop, i, |v| v.next()),
                        Workload::Record => worker(&*a, &mut local, &stop, i, |v| v.next()),
                        Workload::Private => worker(&*a, &mut local, &stop, i, |v| v.private(rounds)),
                    };
                    drop(local);
                    r
                })
                .map_err(|e| format!("cannot start a worker thread: {e}"))
        })
        .collect::<Result<_, _>>()?;
    ready.wait();
    while started.load(Relaxed) < cfg.threads {
        std::thread::sleep(Duration::from_micros(100));
    }
    std::thread::sleep(run);
    stop.store(true, Relaxed);
    let (mut cpu, mut expect) = (0u64, Expect::default());
    for h in handles {
        let (c, e) = h.join().map_err(|_| "a worker panicked".to_string())?;
        cpu += c;
        expect.updates += e.updates;
        expect.sum = expect.sum.wrapping_add(e.sum);
        expect.max = expect.max.max(e.max);
    }
    let mut a = Arc::try_unwrap(a).map_err(|_| "a worker kept the approach alive".to_string())?;
    let (total, shards) = a.totals();
    if let (true, Some(st)) = (stats, a.stats()) {
        errln!(
            "  stats {} {}: task fast {} slow {}, cpu fast {} slow {} extra {}, temporary {}, sequences {}, converge {}, \
             steals {}, switches {}/{}, cids in use {}",
            std::any::type_name::<A>().rsplit("::").next().unwrap_or("?"),
            cfg.label(),
            st.enter_task_fast,
            st.enter_task_slow,
            st.enter_cpu_fast,
            st.enter_cpu_slow,
            st.enter_cpu_extra,
            st.enter_temporary,
            st.counter_sequences,
            st.enter_converge,
            st.steals,
            st.switches_to_per_cpu,
            st.switches_to_per_task,
            st.cids_in_use
        );
    }
    let name = std::any::type_name::<A>().rsplit("::").next().unwrap_or("?");
    if a.checked() {
        if total.count != expect.updates {
            return Err(format!("{name}: counted {} of {} updates", total.count, expect.updates));
        }
        if w != Workload::Counter {
            let in_buckets: u64 = total.buckets.iter().sum();
            if (total.sum, total.max, in_buckets) != (expect.sum, expect.max, expect.updates) {
                return Err(format!("{name}: record totals {total:?} do not match {} updates", expect.updates));
            }
        }
    }
    Ok(Cell { ns: cpu as f64 / expect.updates.max(1) as f64, shards })
}

/// Updates between two looks at the stop flag.
const BATCH: u64 = 256;

/// A worker's loop: `update` inlined, values from `value`. Returns its CPU time in the loop and what it recorded.
#[inline(never)]
fn worker<A: Approach>(
    a: &A,
    local: &mut A::Local,
    stop: &AtomicBool,
    thread: usize,
    mut value: impl FnMut(&mut Values) -> u64,
) -> (u64, Expect) {
    let mut values = Values::new(thread);
    let mut e = Expect::default();
    let t0 = thread_cpu_ns();
    loop {
        for _ in 0..BATCH {
            let v = value(&mut values);
            e.sum = e.sum.wrapping_add(v);
            e.max = e.max.max(v);
            a.update(local, v);
        }
        e.updates += BATCH;
        if stop.load(Relaxed) {
            break;
        }
    }
    (thread_cpu_ns() - t0, e)
}

// ---------------------------------------------------------------------------------------------------------------
// The approaches of each workload

/// Runs one cell of an approach: a configuration, the options, the allowed CPUs.
type RunCell = dyn Fn(Config, &Opts, &[usize]) -> Result<Cell, String>;

/// An approach's name, and how to run one cell of it (`None`: skipped, with the reason printed once).
struct Line {
    name: &'static str,
    /// Whether this is mmcid (the approaches the goals judge).
    ours: bool,
    run: Box<RunCell>,
}

/// `--per-cpu`: mmcid groups start with `cores + 1` idle registrations held by the main thread, so that they are in
/// per-CPU mode at every thread count (a diagnostic of the per-CPU paths; not a workload a user runs).
static FORCE_PER_CPU: AtomicBool = AtomicBool::new(false);

thread_local! {
    static IDLE: RefCell<Vec<Registration>> = const { RefCell::new(Vec::new()) };
}

/// `--no-rseq`: mmcid groups borrow core CIDs with a CAS instead of a restartable sequence (a diagnostic).
static NO_RSEQ: AtomicBool = AtomicBool::new(false);

/// A new group for an mmcid approach (see `FORCE_PER_CPU`, `NO_RSEQ`).
fn group() -> Group {
    let g = if NO_RSEQ.load(Relaxed) {
        Group::builder().restartable_sequences(false).build().expect("a group over this thread's CPUs")
    } else {
        Group::new()
    };
    if FORCE_PER_CPU.load(Relaxed) {
        IDLE.with(|idle| {
            let mut idle = idle.borrow_mut();
            idle.clear();
            idle.extend((0..=g.cores()).map(|_| g.register()));
        });
    }
    g
}

fn lines(w: Workload, rseq: &Result<Rseq, String>) -> Vec<Line> {
    let n = possible_cpus();
    fn line<A: Approach>(name: &'static str, ours: bool, w: Workload, make: impl Fn() -> A + 'static) -> Line {
        Line { name, ours, run: Box::new(move |cfg, o, cpus| run_cell(make(), w, cfg, o.run, o.rounds, cpus, o.stats)) }
    }
    let mut out = Vec::new();
    match w {
        Workload::Counter => {
            out.push(line("mmcid ShardedCounter::add", true, w, || CounterAdd(ShardedCounter::new(&group()))));
            out.push(line("mmcid reg.enter + add_with", true, w, || CounterReg(ShardedCounter::new(&group()))));
            out.push(line("mmcid Group::enter + add_with", true, w, || CounterGroup(ShardedCounter::new(&group()))));
            out.push(line("thread_local AtomicU64 fetch_add", false, w, TlAtomic::default));
            out.push(line("sched_getcpu + fetch_add", false, w, move || CpuFetchAdd(Padded::new(n))));
            if let Ok(r) = *rseq {
                out.push(line("rseq mm_cid + fetch_add", false, w, move || MmCidFetchAdd(Padded::new(n), r)));
                out.push(line("rseq mm_cid sequence (no atomic)", false, w, move || MmCidSequence(Padded::new(n), r)));
            }
        }
        Workload::Record | Workload::Private => {
            if w == Workload::Private {
                out.push(line("private work alone", false, w, || PrivateOnly));
            }
            out.push(line("mmcid reg.enter + PerCid", true, w, || {
                let g = group();
                let p = PerCid::new(&g);
                RecordReg(g, p)
            }));
            out.push(line("mmcid Group::enter + PerCid", true, w, || {
                let g = group();
                let p = PerCid::new(&g);
                RecordGroup(g, p)
            }));
            out.push(line("thread_local RefCell<Record>", false, w, TlRecord::default));
            out.push(line("sched_getcpu + parking_lot::Mutex", false, w, move || {
                CpuMutex((0..n).map(|_| CachePadded::new(parking_lot::Mutex::new(Record::default()))).collect())
            }));
            if let Ok(r) = *rseq {
                out.push(line("rseq mm_cid + spin lock", false, w, move || {
                    MmCidSpin((0..n).map(|_| CachePadded::new(Locked::default())).collect(), r)
                }));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------------------------
// Command line, report

struct Opts {
    workloads: Vec<Workload>,
    configs: Vec<Config>,
    /// Each cell's run time, `--seconds`.
    run: Duration,
    repeats: usize,
    rounds: u32,
    /// `--only SUBSTRING`: run only the approaches whose name contains it (a diagnostic).
    only: Option<String>,
    stats: bool,
    json: Option<common::OutFile>,
    svg: Option<common::OutFile>,
}

const USAGE: &str = "\
per-CPU data as users write it: mmcid against thread_local and kernel-rseq peers, in the same run

usage: use_case [options]

      --compare             accepted for symmetry with the other benchmarks (comparing is all this does)
      --workloads LIST      comma-separated: counter, record, private (default: all three)
  -t, --threads LIST        comma-separated thread counts, each optionally followed by 'p' for pinned
                            (round-robin over the allowed CPUs), e.g. 1p,2p,1,2,8,32; default: 1 and cores
                            pinned, then 1, cores, 4 x cores and 16 x cores unpinned
      --seconds S           each cell's run time in seconds, fractions allowed (default 0.2)
  -r, --repeats N           interleaved repeats; the median is reported (default 3)
      --private-rounds N    the private work per update of the 'private' workload (default 40)
      --json FILE           also write every cell as JSON
      --svg FILE            also draw each workload's CPU ns per update by approach and thread count (an SVG
                            chart: the median of the repeats, with their range)
      --stats               print each mmcid cell's path counters (stderr)
      --per-cpu             diagnostic: keep the mmcid groups in per-CPU mode at every thread count
      --no-rseq             diagnostic: mmcid groups borrow with a CAS instead of a restartable sequence
      --only SUBSTRING      run only the approaches whose name contains SUBSTRING
  -h, --help                this text

Workloads: (a) counter: a counter add; (b) record: an update of a 56-byte statistics record in a tight loop;
(c) private: the same with private work outside the guard. Prints one table per workload: CPU ns per update
(median of the repeats) and the shards or slots used, then each mmcid line's ratio to the best counter peer (a)
or to thread_local (b, c). Every total is checked; exits 1 if one is wrong.
";

/// Every flag of the command line.
const FLAGS: &[Flag] = &[
    Flag::switch("--compare", None),
    Flag::value("--workloads", None),
    Flag::value("--threads", Some("-t")),
    Flag::value("--seconds", None),
    Flag::value("--repeats", Some("-r")),
    Flag::value("--private-rounds", None),
    Flag::value("--json", None),
    Flag::value("--svg", None),
    Flag::switch("--stats", None),
    Flag::switch("--per-cpu", None),
    Flag::switch("--no-rseq", None),
    Flag::value("--only", None),
];

fn config(args: &Args, cpus: usize) -> Result<Opts, String> {
    let workloads = match args.value("--workloads") {
        None => vec![Workload::Counter, Workload::Record, Workload::Private],
        Some(list) => list
            .split(',')
            .map(|s| match s {
                "counter" => Ok(Workload::Counter),
                "record" => Ok(Workload::Record),
                "private" => Ok(Workload::Private),
                _ => Err(format!("{}: unknown workload {s:?} (counter, record, private)", args.spelled("--workloads"))),
            })
            .collect::<Result<_, _>>()?,
    };
    let configs = match args.value("--threads") {
        None => {
            let mut v = vec![Config { threads: 1, pinned: true }];
            if cpus > 1 {
                v.push(Config { threads: cpus, pinned: true });
            }
            for t in [1, cpus, 4 * cpus, 16 * cpus] {
                if !v.contains(&Config { threads: t, pinned: false }) {
                    v.push(Config { threads: t, pinned: false });
                }
            }
            v
        }
        Some(list) => list
            .split(',')
            .map(|s| {
                let (n, pinned) = s.strip_suffix('p').map_or((s, false), |n| (n, true));
                match n.parse::<usize>() {
                    Ok(t) if (1..=common::MAX_THREADS).contains(&t) => Ok(Config { threads: t, pinned }),
                    _ => Err(format!(
                        "{}: {s:?} is not a thread count from 1 to {}",
                        args.spelled("--threads"),
                        common::MAX_THREADS
                    )),
                }
            })
            .collect::<Result<_, _>>()?,
    };
    let rounds = args.positive("--private-rounds")?.unwrap_or(40);
    let rounds = u32::try_from(rounds).map_err(|_| format!("{}: too large", args.spelled("--private-rounds")))?;
    FORCE_PER_CPU.store(args.has("--per-cpu"), Relaxed);
    NO_RSEQ.store(args.has("--no-rseq"), Relaxed);
    Ok(Opts {
        workloads,
        configs,
        run: Duration::from_secs_f64(args.seconds("--seconds")?.unwrap_or(0.2)),
        repeats: args.positive("--repeats")?.unwrap_or(3),
        rounds,
        only: args.value("--only").map(str::to_string),
        stats: args.has("--stats"),
        json: args.value("--json").map(|path| common::OutFile::create("--json", path)).transpose()?,
        svg: args.value("--svg").map(|path| common::OutFile::create("--svg", path)).transpose()?,
    })
}

fn main() -> ExitCode {
    let cpus: Vec<usize> = match mmcid::CpuSet::current() {
        Ok(set) => set.iter().collect(),
        Err(e) => {
            errln!("use_case: cannot read this thread's CPUs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = cli::parse_or_exit("use_case", USAGE, FLAGS, |args| config(args, cpus.len()));
    let rseq = Rseq::probe();
    if let Err(why) = &rseq {
        outln!("note: the kernel-rseq peers are skipped: {why}");
    }
    let group = Group::new();
    outln!(
        "use_case: {} allowed CPUs, {} possible; mmcid groups {} restartable sequences, {} membarrier; {} s per cell, \
         median of {} repeats; CPU ns per update (shards or slots used)",
        cpus.len(),
        possible_cpus(),
        if group.uses_rseq() { "use" } else { "do not use" },
        if group.uses_membarrier() { "with" } else { "without" },
        opts.run.as_secs_f64(),
        opts.repeats
    );
    drop(group);
    let (mut json, mut panels) = (Vec::new(), Vec::new());
    let filtered = |w| {
        let mut v = lines(w, &rseq);
        if let Some(only) = &opts.only {
            v.retain(|l| l.name.contains(only.as_str()));
        }
        v
    };
    let total_cells: usize =
        opts.workloads.iter().map(|&w| filtered(w).len()).sum::<usize>() * opts.configs.len() * opts.repeats;
    let mut progress = common::Progress::new(total_cells);
    let mut failed = false;
    for &w in &opts.workloads {
        let lines = filtered(w);
        // results[line][config] = per-repeat cells
        let mut results: Vec<Vec<Vec<Cell>>> = vec![vec![Vec::new(); opts.configs.len()]; lines.len()];
        for rep in 0..opts.repeats {
            for (ci, &cfg) in opts.configs.iter().enumerate() {
                // Interleaved: every approach once per repeat and configuration, in an order that rotates.
                for k in 0..lines.len() {
                    let li = (k + rep + ci) % lines.len();
                    progress.step(format_args!("{} {} {}", w.name(), lines[li].name, cfg.label()));
                    match (lines[li].run)(cfg, &opts, &cpus) {
                        Ok(cell) => results[li][ci].push(cell),
                        Err(e) => {
                            progress.interrupt();
                            errln!("use_case: {} {} {}: {e}", w.name(), lines[li].name, cfg.label());
                            failed = true;
                        }
                    }
                }
            }
        }
        progress.interrupt();
        report(w, &lines, &opts.configs, &results, &mut json);
        panels.push(panel(w, &lines, &opts.configs, &results));
    }
    progress.finish();
    if let Some(file) = opts.json {
        let body = format!(
            "{{\"benchmark\":\"use_case\",\"seconds\":{},\"repeats\":{},\"private_rounds\":{},\"allowed_cpus\":{},\"results\":[{}]}}\n",
            opts.run.as_secs_f64(),
            opts.repeats,
            opts.rounds,
            cpus.len(),
            json.join(",")
        );
        if let Err(e) = file.write(&body) {
            errln!("use_case: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(file) = opts.svg {
        let title = format!(
            "use_case: CPU ns per update, {} CPUs, {} s per cell, median of {} repeats (whiskers: range)",
            cpus.len(),
            opts.run.as_secs_f64(),
            opts.repeats
        );
        if let Err(e) = (Chart { title, panels, footer: chart::footer() }).write(file) {
            errln!("use_case: {e}");
            return ExitCode::FAILURE;
        }
    }
    if failed {
        errln!("use_case: some cells failed their checks (above)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Prints one workload's table and appends its JSON rows.
fn report(w: Workload, lines: &[Line], configs: &[Config], results: &[Vec<Vec<Cell>>], json: &mut Vec<String>) {
    outln!("\n{}", w.title());
    let cell = |li: usize, ci: usize| -> Option<(f64, usize)> {
        let cells = &results[li][ci];
        (!cells.is_empty()).then(|| {
            (
                common::median(&cells.iter().map(|c| c.ns).collect::<Vec<_>>()),
                cells.iter().map(|c| c.shards).max().unwrap_or(0),
            )
        })
    };
    // One table, the ratio rows included, so that every row lines up with the column headings.
    let mut rows = vec![std::iter::once(String::new()).chain(configs.iter().map(|c| c.label())).collect::<Vec<_>>()];
    for (li, l) in lines.iter().enumerate() {
        let mut row = vec![l.name.to_string()];
        for ci in 0..configs.len() {
            row.push(match cell(li, ci) {
                Some((ns, shards)) => format!("{ns:.2} ({shards})"),
                None => "failed".into(),
            });
            if let Some((ns, shards)) = cell(li, ci) {
                let runs: Vec<f64> = results[li][ci].iter().map(|c| c.ns).collect();
                json.push(format!(
                    "{{\"workload\":\"{}\",\"approach\":{},\"mmcid\":{},\"threads\":{},\"pinned\":{},\
                     \"ns_per_update\":{},\"runs\":[{}],\"shards\":{}}}",
                    w.name(),
                    common::json_str(l.name),
                    l.ours,
                    configs[ci].threads,
                    configs[ci].pinned,
                    common::json_num(ns, 3),
                    common::json_list(&runs, 3),
                    shards
                ));
            }
        }
        rows.push(row);
    }
    // Ratios the goals are judged by: each mmcid line against the best peer (counter) or thread_local (records).
    for (li, l) in lines.iter().enumerate().filter(|(_, l)| l.ours) {
        let against = if w == Workload::Counter { "best peer" } else { "thread_local" };
        let mut row = vec![format!("{} vs {against}", short(l.name))];
        for ci in 0..configs.len() {
            let base = lines
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.ours && p.name != "private work alone")
                .filter(|(_, p)| w == Workload::Counter || p.name.starts_with("thread_local"))
                .filter_map(|(pi, _)| cell(pi, ci).map(|c| c.0))
                .fold(f64::INFINITY, f64::min);
            row.push(match cell(li, ci) {
                Some((ns, _)) if base.is_finite() => format!("{:.2}x", ns / base),
                _ => "-".into(),
            });
        }
        rows.push(row);
    }
    common::print_columns("  ", &rows);
}

/// One workload's chart panel: a bar per approach and thread configuration, the median of its repeats, with
/// their range (min to max) as the interval; a cell that failed every repeat has no bar. A log axis: the
/// approaches differ by decades at high thread counts.
fn panel(w: Workload, lines: &[Line], configs: &[Config], results: &[Vec<Vec<Cell>>]) -> Panel {
    let series = lines
        .iter()
        .zip(results)
        .map(|(l, row)| Series {
            name: l.name.to_string(),
            values: row
                .iter()
                .map(|cells| {
                    let ns: Vec<f64> = cells.iter().map(|c| c.ns).collect();
                    let lo = ns.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = ns.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    (!ns.is_empty()).then(|| chart::Value { value: common::median(&ns), interval: Some((lo, hi)) })
                })
                .collect(),
        })
        .collect();
    Panel {
        title: w.title().into(),
        x_label: "threads (pin: one per allowed CPU)".into(),
        y_label: "CPU ns per update (lower is better)".into(),
        categories: configs.iter().map(|c| c.label()).collect(),
        series,
        style: Style::Bars,
        log_y: true,
    }
}

/// A short label for a ratio row.
fn short(name: &str) -> &str {
    name.strip_prefix("mmcid ").unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Option<Opts>, String> {
        cli::parse_words(FLAGS, words, |a| config(a, 2))
    }

    /// Defaults (2 allowed CPUs), thread lists with pinned entries, and errors naming the argument; the usage lists
    /// every flag.
    #[test]
    fn command_line() {
        let o = parse(&[]).unwrap().unwrap();
        let labels: Vec<_> = o.configs.iter().map(|c| c.label()).collect();
        assert_eq!(labels, ["T=1 pin", "T=2 pin", "T=1", "T=2", "T=8", "T=32"]);
        assert_eq!((o.run, o.repeats, o.rounds, o.workloads.len()), (Duration::from_millis(200), 3, 40, 3));
        let o = parse(&["-t", "4p,3", "--workloads=record", "--seconds", "0.01"]).unwrap().unwrap();
        let labels: Vec<_> = o.configs.iter().map(|c| c.label()).collect();
        assert_eq!(
            (labels, o.workloads, o.run),
            (vec!["T=4 pin".to_string(), "T=3".into()], vec![Workload::Record], Duration::from_millis(10))
        );
        assert!(parse(&["--help"]).unwrap().is_none());
        for (words, want) in [
            (&["--threads", "0"][..], r#"--threads: "0" is not a thread count"#),
            (&["-t", "2x"], r#"-t: "2x" is not a thread count"#),
            (&["--workloads", "count"], r#"--workloads: unknown workload "count""#),
            (&["--seconds", "0"], r#"--seconds: expected a number of seconds in (0, 86400], got "0""#),
            (&["--ms", "10"], r#"unknown argument "--ms""#),
            (&["--svg", "/nonexistent-dir/x.svg"], "cannot write /nonexistent-dir/x.svg"),
            (&["8"], r#"unexpected argument "8""#),
        ] {
            let e = parse(words).map(|_| ()).unwrap_err();
            assert!(e.starts_with(want), "{words:?}: {e}");
        }
        assert_eq!(cli::check_usage(USAGE, FLAGS), Ok(()));
    }

    /// A short run of a few approaches at two thread counts draws a panel with every approach and thread count;
    /// the chart goes through --svg's file.
    #[test]
    fn a_short_run_draws_its_chart() {
        let path = std::env::temp_dir().join(format!("mmcid-use-case-chart-{}.svg", std::process::id()));
        let path = path.to_str().unwrap();
        let opts = parse(&["-t", "1,2p", "--seconds", "0.005", "--svg", path]).unwrap().unwrap();
        let cpus: Vec<usize> = mmcid::CpuSet::current().unwrap().iter().collect();
        let lines: Vec<Line> = lines(Workload::Record, &Rseq::probe()).into_iter().take(4).collect();
        let results: Vec<Vec<Vec<Cell>>> = lines
            .iter()
            .map(|l| opts.configs.iter().map(|&c| vec![(l.run)(c, &opts, &cpus).unwrap()]).collect())
            .collect();
        let p = panel(Workload::Record, &lines, &opts.configs, &results);
        assert!(p.series.iter().all(|s| s.values.iter().all(|v| v.is_some_and(|v| v.value > 0.0))));
        let chart = Chart { title: "use_case".into(), panels: vec![p], footer: "footer line".into() };
        chart.write(opts.svg.unwrap()).unwrap();
        let svg = std::fs::read_to_string(path).unwrap();
        std::fs::remove_file(path).unwrap();
        let escaped = |t: &str| t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        for text in lines.iter().map(|l| l.name).chain(["T=1", "T=2 pin", "footer line", Workload::Record.title()]) {
            assert!(svg.contains(&escaped(text)), "no {text:?} in the chart");
        }
    }
}
