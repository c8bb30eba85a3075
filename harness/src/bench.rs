//! Helpers shared by `benches/enter_exit.rs` and `benches/sharded_counter.rs` (`use mmcid_harness::bench as common;`):
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

/// The samples' median (the examples' one, the mean of the two middle samples for an even count); `None` without
/// samples.
fn median(samples: &[f64]) -> Option<f64> {
    Some(crate::median(samples)).filter(|m| !m.is_nan())
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
// The peers' building blocks: the same file the benchmark examples use, so both measure one implementation.

pub use crate::peers::{getcpu, possible_cpus, Padded, Rseq};
