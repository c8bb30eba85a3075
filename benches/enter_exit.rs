//! enter+exit pairs per mode, one thread, all cores and 2 × cores, against baselines measured in the same run
//! (issue 2, "Hot path and speed"; STYLE.md §3).
//!
//! Every line runs on a persistent pool of worker threads pinned round-robin to the allowed CPUs; criterion's
//! time is wall time per operation per thread (`Throughput::Elements(T)`). Lines:
//!
//! | line | one operation |
//! |---|---|
//! | `private_store` | volatile store to the thread's own cache-padded word: the physical limit |
//! | `private_fetch_add` | `fetch_add` on the thread's own padded atomic (one uncontended RMW) |
//! | `shared_fetch_add` | `fetch_add` on one `AtomicU64` shared by every thread |
//! | `getcpu_fetch_add` | `sched_getcpu()`-indexed padded atomic `fetch_add` |
//! | `rseq_mm_cid_fetch_add` | kernel rseq `mm_cid`-indexed padded atomic `fetch_add` (skipped without it) |
//! | `per_task` | `Registration::enter` + drop, per-task mode, membarrier fences where available |
//! | `per_task_fallback` | the same with `asymmetric_fences(false)`: full fences on enter and exit |
//! | `group_enter` | `Group::enter` + drop (thread-local registration pool) |
//! | `per_cpu` | `Registration::enter` + drop in per-CPU mode: pinned threads with `set_cpu`, extra idle
//! |   | registrations so that `users > max_cids` |
//!
//! Per-task mode needs `users ≤ max_cids ≤ cores`, so the per-task lines stop at T = cores. At the end the
//! bench prints its own table of median ns/op/thread with ratios against `private_store` of the same run,
//! and per line the mode and the share of enters that took the fast path.

#[path = "common/mod.rs"]
mod common;

use common::{allowed_cpus, bench_line, thread_counts, Line, Padded, Pool, Rseq, Summary, Work};
use criterion::{criterion_group, criterion_main, Criterion};
use crossbeam_utils::CachePadded;
use mmcid::{CpuSet, Group, Mode};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

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
        if group.uses_membarrier() { "membarrier" } else { "full fences" },
    )
}

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

fn enter_exit(c: &mut Criterion) {
    let cpus = allowed_cpus();
    let cores = cpus.len();
    let summary = Summary::default();
    let rseq = Rseq::probe();
    if let Err(why) = &rseq {
        println!("{why}");
    }
    let probe = Group::new();
    println!(
        "enter_exit: {cores} allowed CPUs {cpus:?}, group.cores() = {}, membarrier {}",
        probe.cores(),
        if probe.uses_membarrier() { "available (compiler fences on the hot side)" } else { "unavailable" }
    );
    drop(probe);

    let mut g = c.benchmark_group("enter_exit");
    for t in thread_counts(cores, &[], &[1, 2]) {
        let pin = Some(cpus.clone());

        // The physical limit: a plain store to a private padded word.
        bench_line(
            &mut g,
            &summary,
            Line { name: "private_store", threads: t },
            || {
                Pool::new(t, pin.clone(), |_, _| {
                    let mut word = Box::new(CachePadded::new(0u64));
                    Box::new(move |n| {
                        let p: *mut u64 = &mut **word;
                        for i in 0..n {
                            // SAFETY: `p` points to this worker's own boxed word, alive for the closure's life.
                            unsafe { std::ptr::write_volatile(p, i) };
                        }
                    })
                })
            },
            |_| String::new(),
        );

        bench_line(
            &mut g,
            &summary,
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

        bench_line(
            &mut g,
            &summary,
            Line { name: "shared_fetch_add", threads: t },
            || {
                let shared = Arc::new(CachePadded::new(AtomicU64::new(0)));
                Pool::new(t, pin.clone(), move |_, _| {
                    let shared = shared.clone();
                    Box::new(move |n| {
                        for _ in 0..n {
                            shared.fetch_add(1, Relaxed);
                        }
                    })
                })
            },
            |_| String::new(),
        );

        bench_line(
            &mut g,
            &summary,
            Line { name: "getcpu_fetch_add", threads: t },
            || {
                let slots = Arc::new(Padded::new(common::possible_cpus()));
                Pool::new(t, pin.clone(), move |_, _| {
                    let slots = slots.clone();
                    Box::new(move |n| {
                        for _ in 0..n {
                            slots.at(common::getcpu()).fetch_add(1, Relaxed);
                        }
                    })
                })
            },
            |_| String::new(),
        );

        match rseq.as_ref() {
            Ok(&rseq) => bench_line(
                &mut g,
                &summary,
                Line { name: "rseq_mm_cid_fetch_add", threads: t },
                || {
                    let slots = Arc::new(Padded::new(common::possible_cpus()));
                    Pool::new(t, pin.clone(), move |_, _| {
                        let slots = slots.clone();
                        Box::new(move |n| {
                            for _ in 0..n {
                                slots.at(rseq.mm_cid()).fetch_add(1, Relaxed);
                            }
                        })
                    })
                },
                |_| String::new(),
            ),
            Err(_) => summary.skip("rseq_mm_cid_fetch_add", t, "kernel mm_cid not readable through glibc here"),
        }

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
        let group = Group::builder().cpus(CpuSet::current().expect("affinity mask")).build().expect("group");
        let for_pool = group.clone();
        bench_line(
            &mut g,
            &summary,
            Line { name: "per_cpu", threads: t },
            || {
                let idle: Vec<_> = (0..group.cores() + 1).map(|_| for_pool.register()).collect();
                assert_eq!(for_pool.mode(), Mode::PerCpu, "idle registrations must force per-CPU mode");
                let workers = for_pool.clone();
                Pool::new(t, pin.clone(), move |_, cpu| registration_worker(&workers, cpu, true)).keep(idle)
            },
            |pool| group_note(&group, pool),
        );
    }
    g.finish();
    summary.print("enter_exit", "private_store");
}

criterion_group!(benches, enter_exit);
criterion_main!(benches);
