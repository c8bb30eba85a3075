//! enter+exit pairs per mode, one thread, all cores and 2 × cores, against baselines measured in the same run
//! (docs/benchmarks.md has the numbers and the goals).
//!
//! Every line runs on a persistent pool of worker threads pinned round-robin to the allowed CPUs; criterion's
//! time is wall time per operation per thread (`Throughput::Elements(T)`). Lines:
//!
//! | line | one operation |
//! |---|---|
//! | `private_store` | increment of the thread's own cache-padded word with a plain (volatile, non-RMW) load and
//! |   | store: the physical limit |
//! | `private_fetch_add` | `fetch_add` on the thread's own padded atomic (one uncontended RMW) |
//! | `shared_fetch_add` | `fetch_add` on one `AtomicU64` shared by every thread |
//! | `getcpu_fetch_add` | `sched_getcpu()`-indexed padded atomic `fetch_add` |
//! | `rseq_mm_cid_fetch_add` | kernel rseq `mm_cid`-indexed padded atomic `fetch_add` (skipped without it) |
//! | `per_task` | `Registration::enter` + drop, per-task mode, membarrier fences where available |
//! | `per_task_fallback` | the same with `asymmetric_fences(false)`: full fences on enter and exit |
//! | `group_enter` | `Group::enter` + drop (thread-local registration pool) |
//! | `per_cpu` | `Registration::enter` + drop in per-CPU mode: pinned threads with `set_cpu`, extra idle
//! |   | registrations so that `users > max_cids` |
//! | `temporary` | the same while another registration of the worker holds a guard on its core (as when the
//! |   | core's holder is descheduled inside its guard): every enter takes a temporary CID from the core's bitmap lane |
//!
//! Per-task mode needs `users ≤ max_cids ≤ cores`, so the per-task lines stop at T = cores. At the end the
//! bench prints its own table of median ns/op/thread with ratios against `private_store` of the same run,
//! and per line the mode and the share of enters that took the fast path.

use mmcid_harness::bench as common;

use common::{allowed_cpus, bench_line, thread_counts, Line, Pool, Rseq, Summary, Work};
use criterion::{criterion_group, criterion_main, Criterion};
use mmcid::{CpuSet, Group, Mode};
use std::hint::black_box;

/// Mode, fast-path share and fence kind of a group after a line ran (the pool is still alive).
fn group_note(group: &Group, pool: &Pool) -> String {
    let s = group.stats();
    let total = pool.total_ops.max(1) as f64;
    format!(
        "mode {:?}, users {}, max_cids {}, fast path {:.2}% (task {}, cpu {}), temporary {}, alloc {}, {}",
        group.mode(),
        group.users(),
        group.max_cids(),
        100.0 * (s.enter_task_fast + s.enter_cpu_fast) as f64 / total,
        s.enter_task_fast,
        s.enter_cpu_fast,
        s.enter_temporary,
        s.enter_alloc,
        match (group.uses_membarrier(), group.uses_rseq()) {
            (true, true) => "membarrier, rseq borrows",
            (true, false) => "membarrier, CAS borrows",
            _ => "full fences, CAS borrows",
        },
    )
}

/// Makes one pinned worker (on the given CPU) of a line.
type MakeWorker = fn(&Group, Option<usize>) -> Work;

/// A worker that enters and leaves `group` through its own registration, `n` times per sample.
fn registration_worker(group: &Group, cpu: Option<usize>, declare_cpu: bool) -> Work {
    let mut reg = group.register();
    if declare_cpu {
        reg.set_cpu(cpu).expect("pinned CPU is below group.cores()");
    }
    Box::new(move |n| {
        for _ in 0..n {
            let guard = reg.enter();
            black_box(guard.cid().get());
        }
    })
}

/// A worker whose enters all take temporaries: during each batch a second registration of the worker holds a
/// guard on the same core, so the core's CID stays borrowed.
fn temporary_worker(group: &Group, cpu: Option<usize>) -> Work {
    let mut reg = group.register();
    let mut holder = group.register();
    reg.set_cpu(cpu).expect("pinned CPU is below group.cores()");
    holder.set_cpu(cpu).expect("pinned CPU is below group.cores()");
    Box::new(move |n| {
        let held = holder.enter();
        for _ in 0..n {
            let guard = reg.enter();
            black_box(guard.cid().get());
        }
        drop(held);
    })
}

fn enter_exit(c: &mut Criterion) {
    let cpus = allowed_cpus();
    let cores = cpus.len();
    let summary = Summary::default();
    let rseq = Rseq::probe();
    if let Err(why) = &rseq {
        println!("rseq mm_cid baseline skipped: {why}");
    }
    let probe = Group::new();
    println!(
        "enter_exit: {cores} allowed CPUs {cpus:?}, group.cores() = {}, membarrier {}, per-CPU borrows {}",
        probe.cores(),
        if probe.uses_membarrier() { "available (compiler fences on the hot side)" } else { "unavailable" },
        if probe.uses_rseq() { "rseq sequences" } else { "CAS" },
    );
    drop(probe);

    let mut g = c.benchmark_group("enter_exit");
    for t in thread_counts(cores, &[], &[1, 2]) {
        let pin = Some(cpus.clone());

        common::bench_baselines(&mut g, &summary, t, &pin, &rseq, true);

        // Per-task mode: users = t ≤ cores keeps the group per-task.
        for (name, asym) in [("per_task", true), ("per_task_fallback", false)] {
            if t > cores {
                summary.skip(name, t, "per-task mode needs users ≤ max_cids ≤ cores");
                continue;
            }
            let group = Group::builder().asymmetric_fences(asym).build().expect("group on the allowed CPUs");
            let for_pool = group.clone();
            bench_line(
                &mut g,
                &summary,
                Line { name, threads: t },
                || Pool::new(t, pin.clone(), move |_, cpu| registration_worker(&for_pool, cpu, false)),
                |pool| group_note(&group, pool),
            );
        }

        // The thread-local convenience (per-task up to `cores` threads, per-CPU via sched_getcpu beyond).
        let group = Group::new();
        let for_pool = group.clone();
        bench_line(
            &mut g,
            &summary,
            Line { name: "group_enter", threads: t },
            || {
                Pool::new(t, pin.clone(), move |_, _| {
                    let group = for_pool.clone();
                    Box::new(move |n| {
                        for _ in 0..n {
                            let guard = group.enter();
                            black_box(guard.cid().get());
                        }
                    })
                })
            },
            |pool| group_note(&group, pool),
        );

        // Per-CPU mode: idle registrations push users above max_cids; workers are pinned and declare their core.
        // `temporary`: the core's CID held by another guard on the core for the whole batch.
        let per_cpu_lines: [(&str, MakeWorker); 2] =
            [("per_cpu", |group, cpu| registration_worker(group, cpu, true)), ("temporary", temporary_worker)];
        for (name, worker) in per_cpu_lines {
            let group = Group::builder().cpus(CpuSet::current().expect("affinity mask")).build().expect("group");
            let for_pool = group.clone();
            bench_line(
                &mut g,
                &summary,
                Line { name, threads: t },
                || {
                    let idle: Vec<_> = (0..group.cores() + 1).map(|_| for_pool.register()).collect();
                    assert_eq!(for_pool.mode(), Mode::PerCpu, "idle registrations must force per-CPU mode");
                    let workers = for_pool.clone();
                    Pool::new(t, pin.clone(), move |_, cpu| worker(&workers, cpu)).keep(idle)
                },
                |pool| group_note(&group, pool),
            );
        }
    }
    g.finish();
    summary.print("enter_exit", "private_store");
}

criterion_group!(benches, enter_exit);
criterion_main!(benches);
