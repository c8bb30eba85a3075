//! Helpers shared by `benches/enter_exit.rs` and `benches/sharded_counter.rs`:
//!
//! * [`Pool`]: a persistent worker pool timed with two barriers (criterion's `iter_custom`), so thread spawn cost
//!   never lands in a sample of a nanosecond-scale operation;
//! * [`Summary`]: our own per-sample record, printed at the end of the run as a table of ns per op per thread and
//!   ratios against the private-store baseline measured in the same run;
//! * the peers' building blocks: [`Padded`] arrays of atomics, a `sched_getcpu` index, the kernel's rseq `mm_cid`
//!   read through glibc's `__rseq_offset` / `__rseq_size` ([`Rseq`]), and pinning.
//!
//! Each bench uses a subset of these helpers.
#![allow(dead_code)]

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Throughput};
use crossbeam_utils::CachePadded;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Barrier, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------------------------
// Worker pool

/// What one worker runs per sample: `iters` operations.
pub type Work = Box<dyn FnMut(u64)>;

struct Shared {
    start: Barrier,
    done: Barrier,
    iters: AtomicU64,
    stop: AtomicBool,
    /// CPU time the workers spent in the current sample's operations.
    cpu_ns: AtomicU64,
}

/// `threads` persistent workers. Each builds its own state on its own thread (`make(index)`: registrations,
/// thread-local slots, pinning), then per sample runs `iters` operations between a start and a done barrier while
/// the main thread times the span (the sharded-slab crate's pattern, without per-sample spawns).
pub struct Pool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    threads: usize,
    /// Operations run by all workers so far (for conservation checks).
    pub total_ops: u64,
    /// State that must outlive the workers (e.g. idle registrations that keep a group in per-CPU mode).
    keep: Option<Box<dyn std::any::Any>>,
}

impl Pool {
    /// Starts the workers and returns once every worker has built its state. With `pin`, worker `i` is pinned
    /// to `pin[i % pin.len()]` before `make` runs.
    pub fn new<F>(threads: usize, pin: Option<Vec<usize>>, make: F) -> Pool
    where
        F: Fn(usize, Option<usize>) -> Work + Send + Sync + 'static,
    {
        let shared = Arc::new(Shared {
            start: Barrier::new(threads + 1),
            done: Barrier::new(threads + 1),
            iters: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            cpu_ns: AtomicU64::new(0),
        });
        let make = Arc::new(make);
        let handles = (0..threads)
            .map(|i| {
                let shared = shared.clone();
                let make = make.clone();
                let cpu = pin.as_ref().map(|cpus| cpus[i % cpus.len()]);
                std::thread::Builder::new()
                    .name(format!("bench-worker-{i}"))
                    .spawn(move || {
                        let cpu = cpu.filter(|&c| pin_current(c));
                        let mut work = make(i, cpu);
                        drop(make);
                        shared.done.wait(); // ready
                        loop {
                            shared.start.wait();
                            if shared.stop.load(Acquire) {
                                break;
                            }
                            let cpu0 = thread_cpu_ns();
                            work(shared.iters.load(Relaxed));
                            shared.cpu_ns.fetch_add(thread_cpu_ns() - cpu0, Relaxed);
                            shared.done.wait();
                        }
                        drop(work); // e.g. unregisters before the pool's drop returns
                    })
                    .expect("spawn bench worker")
            })
            .collect();
        shared.done.wait();
        Pool { shared, handles, threads, total_ops: 0, keep: None }
    }

    /// Keeps `state` alive until the workers have exited.
    pub fn keep<K: 'static>(mut self, state: K) -> Pool {
        self.keep = Some(Box::new(state));
        self
    }

    /// Runs one sample: every worker performs `iters` operations; returns the wall time from the release of the
    /// start barrier to the last worker's arrival at the done barrier. The workers' CPU time for the sample is
    /// then in [`Pool::last_cpu`].
    pub fn run(&mut self, iters: u64) -> Duration {
        self.shared.iters.store(iters, Relaxed);
        self.shared.cpu_ns.store(0, Relaxed);
        let t0 = Instant::now();
        self.shared.start.wait();
        self.shared.done.wait();
        let elapsed = t0.elapsed();
        self.total_ops += iters * self.threads as u64;
        elapsed
    }

    /// Number of workers.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// CPU time all workers spent in the last sample's operations (excludes time they were descheduled, which
    /// on a shared machine makes it steadier than wall time).
    pub fn last_cpu(&self) -> Duration {
        // The done barrier orders the workers' additions before this load.
        Duration::from_nanos(self.shared.cpu_ns.load(Relaxed))
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Release);
        self.shared.start.wait();
        for h in self.handles.drain(..) {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
        drop(self.keep.take());
    }
}

/// CPU time consumed by the calling thread, in ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Pins the calling thread to `cpu`; prints a message and returns false if the OS refuses.
pub fn pin_current(cpu: usize) -> bool {
    let ok = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
    if !ok {
        eprintln!("note: could not pin a bench thread to CPU {cpu}; it runs unpinned");
    }
    ok
}

/// The CPUs this process may run on (the pinning targets, round-robin).
pub fn allowed_cpus() -> Vec<usize> {
    match mmcid::CpuSet::current() {
        Ok(set) => set.iter().collect(),
        Err(_) => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
    }
}

/// Thread counts to measure: 1, then each multiple of the core count in `multiples` (deduplicated, in order),
/// plus `extra` counts.
pub fn thread_counts(cores: usize, extra: &[usize], multiples: &[usize]) -> Vec<usize> {
    let mut out = vec![1];
    out.extend_from_slice(extra);
    out.extend(multiples.iter().map(|m| m * cores));
    out.sort_unstable();
    out.dedup();
    out
}

// ---------------------------------------------------------------------------------------------------------------
// Running a line and recording it

/// One measured line: a name, its thread count and a pool built lazily (only if criterion's filter selects it).
pub struct Line<'a> {
    pub name: &'a str,
    pub threads: usize,
}

/// Benchmarks one line in `group`: throughput `Elements(threads)`, so criterion's time reads as wall time per
/// operation per thread. `setup` builds the pool (and whatever else) the first time criterion runs the line;
/// `after` runs once at the end with the pool still alive (stats, conservation checks) and returns a note for
/// the summary.
pub fn bench_line<S, A>(group: &mut BenchmarkGroup<'_, WallTime>, summary: &Summary, line: Line<'_>, setup: S, after: A)
where
    S: FnOnce() -> Pool,
    A: FnOnce(&Pool) -> String,
{
    let mut setup = Some(setup);
    let mut pool: Option<Pool> = None;
    group.throughput(Throughput::Elements(line.threads as u64));
    group.bench_function(BenchmarkId::new(line.name, line.threads), |b| {
        let p = pool.get_or_insert_with(|| (setup.take().expect("setup runs once"))());
        b.iter_custom(|iters| {
            let elapsed = p.run(iters);
            summary.record(line.name, line.threads, iters, elapsed, p.last_cpu());
            elapsed
        })
    });
    if let Some(p) = pool.take() {
        let note = after(&p);
        summary.note(line.name, line.threads, note);
        drop(p);
    }
}

/// Our own record of every sample, so the end-of-run table can put ratios against the same run's baseline.
#[derive(Default)]
pub struct Summary {
    rows: Mutex<BTreeMap<(usize, usize), Row>>,
    order: Mutex<Vec<String>>,
}

#[derive(Default)]
struct Row {
    /// Wall ns per operation per thread, one per sample.
    samples: Vec<f64>,
    /// CPU ns per operation (all workers' CPU time / all operations), one per sample.
    cpu: Vec<f64>,
    note: String,
}

/// Samples with fewer iterations are criterion's first warm-up steps or `--test` mode: too short to mean much.
const MIN_ITERS: u64 = 1000;

impl Summary {
    fn key(&self, name: &str, threads: usize) -> (usize, usize) {
        let mut order = self.order.lock().unwrap();
        let i = order.iter().position(|n| n == name).unwrap_or_else(|| {
            order.push(name.to_string());
            order.len() - 1
        });
        (threads, i)
    }

    /// Records one sample of `iters` operations per thread: its wall time and the workers' CPU time.
    pub fn record(&self, name: &str, threads: usize, iters: u64, elapsed: Duration, cpu: Duration) {
        let key = self.key(name, threads);
        let mut rows = self.rows.lock().unwrap();
        let row = rows.entry(key).or_default();
        if iters >= MIN_ITERS {
            row.samples.push(elapsed.as_nanos() as f64 / iters as f64);
            row.cpu.push(cpu.as_nanos() as f64 / (iters * threads as u64) as f64);
        }
    }

    /// Attaches a note (mode, path counters, shards) to a line.
    pub fn note(&self, name: &str, threads: usize, note: String) {
        let key = self.key(name, threads);
        self.rows.lock().unwrap().entry(key).or_default().note = note;
    }

    /// Marks a line as not measured, with the reason.
    pub fn skip(&self, name: &str, threads: usize, why: &str) {
        self.note(name, threads, format!("skipped: {why}"));
    }

    /// Prints a markdown table: per thread count, each line's median wall ns per op per thread and median CPU
    /// ns per op, each with its ratio to `baseline` (the physical limit) measured in the same run.
    pub fn print(&self, title: &str, baseline: &str) {
        let order = self.order.lock().unwrap().clone();
        let rows = self.rows.lock().unwrap();
        if rows.values().all(|r| r.samples.is_empty()) {
            println!("\n{title}: no samples of ≥ {MIN_ITERS} iterations (test mode or filtered run): no summary");
            return;
        }
        println!("\n## {title}: medians over samples, ratios vs `{baseline}` of the same run\n");
        println!("| threads | line | wall ns/op/thread | × {baseline} | CPU ns/op | × {baseline} | notes |");
        println!("|---:|---|---:|---:|---:|---:|---|");
        let threads: Vec<usize> = {
            let mut t: Vec<usize> = rows.keys().map(|k| k.0).collect();
            t.dedup();
            t
        };
        for t in threads {
            if !(0..order.len()).any(|i| rows.get(&(t, i)).is_some_and(|r| !r.samples.is_empty())) {
                continue; // nothing measured at this thread count (filtered run)
            }
            let base = order.iter().position(|n| n == baseline).and_then(|i| rows.get(&(t, i)));
            let (base_wall, base_cpu) = (base.and_then(|r| median(&r.samples)), base.and_then(|r| median(&r.cpu)));
            for (i, name) in order.iter().enumerate() {
                let Some(row) = rows.get(&(t, i)) else {
                    continue;
                };
                let (wall, wall_ratio) = cell(median(&row.samples), base_wall);
                let (cpu, cpu_ratio) = cell(median(&row.cpu), base_cpu);
                println!("| {t} | {name} | {wall} | {wall_ratio} | {cpu} | {cpu_ratio} | {} |", row.note);
            }
        }
        println!();
    }
}

fn median(samples: &[f64]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    Some(s[s.len() / 2])
}

/// A value and its ratio to the baseline, formatted for the table.
fn cell(value: Option<f64>, base: Option<f64>) -> (String, String) {
    match (value, base) {
        (Some(v), Some(b)) => (format!("{v:.2}"), format!("{:.2}", v / b)),
        (Some(v), None) => (format!("{v:.2}"), "–".into()),
        (None, _) => ("–".into(), "–".into()),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Baseline lines shared by both benches

/// The lines every bench measures next to its own, at `t` threads (pinned per `pin`):
///
/// * `private_store`, the physical limit: increment the thread's own cache-padded word with a plain (volatile,
///   non-RMW) load and store — what a counter shard or a per-CID slot costs at best;
/// * `private_fetch_add` (if `private_rmw`): one uncontended atomic RMW on the thread's own padded word;
/// * `shared_fetch_add`: one `AtomicU64` shared by every thread;
/// * `getcpu_fetch_add`: `sched_getcpu()`-indexed padded atomics, one per possible CPU;
/// * `rseq_mm_cid_fetch_add`: padded atomics indexed by the kernel's rseq `mm_cid` (skipped where unreadable).
pub fn bench_baselines(
    group: &mut BenchmarkGroup<'_, WallTime>,
    summary: &Summary,
    t: usize,
    pin: &Option<Vec<usize>>,
    rseq: &Result<Rseq, String>,
    private_rmw: bool,
) {
    bench_line(
        group,
        summary,
        Line { name: "private_store", threads: t },
        || {
            Pool::new(t, pin.clone(), |_, _| {
                let mut word = Box::new(CachePadded::new(0u64));
                Box::new(move |n| {
                    let p: *mut u64 = &mut **word;
                    for _ in 0..n {
                        // SAFETY: `p` points to this worker's own boxed word, alive as long as the closure.
                        unsafe { std::ptr::write_volatile(p, std::ptr::read_volatile(p) + 1) };
                    }
                })
            })
        },
        |_| "1 private word per thread".into(),
    );

    if private_rmw {
        bench_line(
            group,
            summary,
            Line { name: "private_fetch_add", threads: t },
            || {
                Pool::new(t, pin.clone(), |_, _| {
                    let word = Box::new(CachePadded::new(AtomicU64::new(0)));
                    Box::new(move |n| {
                        for _ in 0..n {
                            word.fetch_add(1, Relaxed);
                        }
                    })
                })
            },
            |_| String::new(),
        );
    }

    let shared = Arc::new(Padded::new(1));
    bench_line(
        group,
        summary,
        Line { name: "shared_fetch_add", threads: t },
        || indexed_pool(t, pin, &shared, |_| 0),
        |pool| check_sum(&shared, pool, "1 slot"),
    );

    let slots = Arc::new(Padded::new(possible_cpus()));
    bench_line(
        group,
        summary,
        Line { name: "getcpu_fetch_add", threads: t },
        || indexed_pool(t, pin, &slots, |_| getcpu()),
        |pool| check_sum(&slots, pool, &format!("{} slots (possible CPUs), {} touched", slots.len(), slots.touched())),
    );

    match rseq.as_ref() {
        Ok(&rseq) => {
            let slots = Arc::new(Padded::new(possible_cpus()));
            bench_line(
                group,
                summary,
                Line { name: "rseq_mm_cid_fetch_add", threads: t },
                || indexed_pool(t, pin, &slots, move |_| rseq.mm_cid()),
                |pool| {
                    let note = format!("{} slots (possible CPUs), {} touched", slots.len(), slots.touched());
                    check_sum(&slots, pool, &note)
                },
            );
        }
        Err(_) => summary.skip("rseq_mm_cid_fetch_add", t, "the kernel's mm_cid is not readable through glibc here"),
    }
}

/// Workers doing `slots.at(index(worker)).fetch_add(1)`.
fn indexed_pool<I>(t: usize, pin: &Option<Vec<usize>>, slots: &Arc<Padded>, index: I) -> Pool
where
    I: Fn(usize) -> usize + Copy + Send + Sync + 'static,
{
    let slots = slots.clone();
    Pool::new(t, pin.clone(), move |i, _| {
        let slots = slots.clone();
        Box::new(move |n| {
            for _ in 0..n {
                slots.at(index(i)).fetch_add(1, Relaxed);
            }
        })
    })
}

/// Conservation: every operation the pool ran is in the slots.
fn check_sum(slots: &Padded, pool: &Pool, note: &str) -> String {
    assert_eq!(slots.sum(), pool.total_ops, "lost or duplicated increments");
    note.to_string()
}

// ---------------------------------------------------------------------------------------------------------------
// The peers' building blocks

/// One cache-padded atomic per index.
pub struct Padded {
    slots: Box<[CachePadded<AtomicU64>]>,
}

impl Padded {
    pub fn new(n: usize) -> Padded {
        Padded { slots: (0..n.max(1)).map(|_| CachePadded::new(AtomicU64::new(0))).collect() }
    }

    /// Slot `i`; an out-of-range index (a CPU number beyond the array) wraps, off the fast path (no division
    /// per operation, which would tax the baselines).
    #[inline(always)]
    pub fn at(&self, i: usize) -> &AtomicU64 {
        match self.slots.get(i) {
            Some(slot) => slot,
            None => &self.slots[i % self.slots.len()],
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Slots that were ever incremented (what a scan would have to read).
    pub fn touched(&self) -> usize {
        self.slots.iter().filter(|s| s.load(Relaxed) != 0).count()
    }

    pub fn sum(&self) -> u64 {
        self.slots.iter().map(|s| s.load(Relaxed)).sum()
    }
}

/// The number of possible CPUs (the size of a per-CPU array).
pub fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| s.trim().rsplit(['-', ',']).next().and_then(|m| m.parse::<usize>().ok()))
        .map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()), |max| max + 1)
}

/// The CPU the calling thread runs on (glibc reads it from the rseq area).
#[inline(always)]
pub fn getcpu() -> usize {
    // SAFETY: sched_getcpu has no preconditions; -1 (error) maps to index 0 below.
    let cpu = unsafe { libc::sched_getcpu() };
    cpu.max(0) as usize
}

/// The kernel's rseq `mm_cid` of the calling thread, read from the rseq area glibc registered: `struct rseq` is
/// at thread pointer + `__rseq_offset`, and `mm_cid` is the `u32` at byte 24.
///
/// Readable when glibc's registration succeeded (`__rseq_size > 0`) and the kernel provides the field
/// (`AT_RSEQ_FEATURE_SIZE >= 28`, Linux 6.3+): the kernel refuses registrations shorter than `ORIG_RSEQ_SIZE` (32
/// bytes), so a registered area always covers byte 24..28, and such a kernel writes `mm_cid` there on every return
/// to user space. glibc up to 2.39 reports `__rseq_size = 20`: that is the part of the area glibc itself uses, not
/// the registered length (checked on ci-2core: the field reads the compact CIDs the kernel hands out).
#[derive(Clone, Copy)]
pub struct Rseq {
    offset: isize,
}

/// Byte offset of `mm_cid` in `struct rseq` (after cpu_id_start, cpu_id, rseq_cs (u64), flags, node_id).
const MM_CID_OFFSET: usize = 24;
/// `getauxval` key for the kernel's rseq feature size.
const AT_RSEQ_FEATURE_SIZE: libc::c_ulong = 27;

impl Rseq {
    /// Checks at run time whether `mm_cid` is readable; `Err` says why not (printed by the benches).
    pub fn probe() -> Result<Rseq, String> {
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
        {
            Err("rseq mm_cid baseline: only implemented for x86_64 Linux with glibc".into())
        }
        #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
        {
            // Looked up at run time rather than linked as extern statics, so the benches still build and run
            // on glibc < 2.35 (which lacks the symbols) and report the skip instead of failing to link.
            // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name has no other preconditions.
            let off = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()) };
            // SAFETY: as above.
            let size = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()) };
            // SAFETY: getauxval has no preconditions; 0 means unknown.
            let kernel = unsafe { libc::getauxval(AT_RSEQ_FEATURE_SIZE) };
            if off.is_null() || size.is_null() {
                return Err("rseq mm_cid baseline skipped: this libc does not export __rseq_offset/__rseq_size \
                            (glibc >= 2.35 needed)"
                    .into());
            }
            // SAFETY: glibc defines `__rseq_size` as `const unsigned int` and `__rseq_offset` as `const ptrdiff_t`,
            // both initialised before main and never written again.
            let (size, offset) = unsafe { (*(size as *const u32), *(off as *const isize)) };
            if size == 0 {
                return Err("rseq mm_cid baseline skipped: glibc did not register an rseq area".into());
            }
            if (kernel as usize) < MM_CID_OFFSET + 4 {
                return Err(format!(
                    "rseq mm_cid baseline skipped: the kernel's rseq has no mm_cid (AT_RSEQ_FEATURE_SIZE = {kernel} < \
                     28; Linux 6.3+ has it)"
                ));
            }
            let rseq = Rseq { offset };
            // Sanity: one running thread of this process gets a CID below the number of possible CPUs.
            if rseq.mm_cid() >= possible_cpus() {
                return Err(format!("rseq mm_cid baseline skipped: mm_cid reads {}, not a CID", rseq.mm_cid()));
            }
            Ok(rseq)
        }
    }

    /// The calling thread's `mm_cid` (kept up to date by the kernel at every schedule-in).
    #[inline(always)]
    pub fn mm_cid(self) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            let tp: *const u8;
            // SAFETY: on x86_64 Linux, fs:0 holds the TCB's self pointer, which is the thread pointer; reading it
            // has no side effects.
            unsafe { std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags)) };
            // SAFETY: `probe` checked that glibc registered an rseq area with mm_cid for every thread, at
            // tp + __rseq_offset; it lives as long as the thread. Volatile: the kernel rewrites it on preemption.
            unsafe { std::ptr::read_volatile(tp.offset(self.offset).add(MM_CID_OFFSET) as *const u32) as usize }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            unreachable!("Rseq::probe fails on this architecture")
        }
    }
}
