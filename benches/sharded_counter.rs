//! `ShardedCounter::add` against its peers, T = 1, 2, all cores and 4 × cores, in one criterion group and one run
//! (docs/benchmarks.md has the numbers and the goal).
//!
//! Workers are a persistent pool of unpinned threads (a counter's users do not pin), timed with barriers;
//! criterion's time is wall time per `add` per thread (`Throughput::Elements(T)`). Lines:
//!
//! | line | one `add(1)` | memory |
//! |---|---|---|
//! | `private_store` | plain (volatile, non-RMW) increment of the thread's own padded word: the physical limit | 1 word per thread |
//! | `sharded_counter` | `mmcid::ShardedCounter::add` (one fresh `Group` per T; `Group::enter` inside) | `shards_allocated()` |
//! | `sharded_counter_add_with` | `reg.enter()` + `ShardedCounter::add_with(&guard, 1)` (explicit registration) | `shards_allocated()` |
//! | `shared_fetch_add` | `fetch_add` on one shared `AtomicU64` | 1 slot |
//! | `thread_local` | `ThreadLocal<AtomicU64>::get_or_default().fetch_add` (the `thread_local` crate) | 1 slot per thread ever |
//! | `thread_local_store` | the same slot, owner-only increment with a Relaxed load + store (no RMW) | as above |
//! | `getcpu_fetch_add` | `sched_getcpu()`-indexed padded atomics | 1 slot per possible CPU |
//! | `rseq_mm_cid_fetch_add` | kernel rseq `mm_cid`-indexed padded atomics (skipped where unreadable) | 1 slot per possible CPU |
//!
//! After each line the bench checks conservation (the sum equals the adds performed) and records the shards or
//! slots allocated; at the end it prints a table with ratios against `private_store` of the same run.

use mmcid_harness::bench as common;

use common::{allowed_cpus, bench_line, thread_counts, Line, Pool, Rseq, Summary};
use criterion::{criterion_group, criterion_main, Criterion};
use mmcid::{Group, ShardedCounter};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use thread_local::ThreadLocal;

/// Conservation (the sum equals the adds performed) and the shards the counter allocated.
fn counter_note(counter: &ShardedCounter, pool: &Pool) -> String {
    assert_eq!(counter.sum(), pool.total_ops, "ShardedCounter lost or duplicated adds");
    let group = counter.group();
    let s = group.stats();
    let enters = s.enter_task_fast + s.enter_cpu_fast + s.enter_task_slow + s.enter_cpu_slow + s.enter_temporary;
    format!(
        "{} shards allocated (max_cids {}, mode {:?}, users {}; {} adds as one sequence, {} enters, {:.0}% of \
         them took a temporary CID)",
        counter.shards_allocated(),
        group.max_cids(),
        group.mode(),
        group.users(),
        s.counter_sequences,
        enters,
        100.0 * s.enter_temporary as f64 / enters.max(1) as f64
    )
}

fn sharded_counter(c: &mut Criterion) {
    let cores = allowed_cpus().len();
    let summary = Summary::default();
    let rseq = Rseq::probe();
    if let Err(why) = &rseq {
        println!("rseq mm_cid baseline skipped: {why}");
    }
    println!("sharded_counter: {cores} allowed CPUs, {} possible CPUs, unpinned workers", common::possible_cpus());
    let pin = None;

    let mut g = c.benchmark_group("sharded_counter");
    for t in thread_counts(cores, &[2], &[1, 4]) {
        common::bench_baselines(&mut g, &summary, t, &pin, &rseq, false);

        let group = Group::new();
        let counter = Arc::new(ShardedCounter::new(&group));
        bench_line(
            &mut g,
            &summary,
            Line { name: "sharded_counter", threads: t },
            || {
                let counter = counter.clone();
                Pool::new(t, None, move |_, _| {
                    let counter = counter.clone();
                    Box::new(move |n| {
                        for _ in 0..n {
                            counter.add(1);
                        }
                    })
                })
            },
            |pool| counter_note(&counter, pool),
        );

        // The explicit API: each worker holds a registration and enters once per add.
        let group = Group::new();
        let counter = Arc::new(ShardedCounter::new(&group));
        bench_line(
            &mut g,
            &summary,
            Line { name: "sharded_counter_add_with", threads: t },
            || {
                let counter = counter.clone();
                Pool::new(t, None, move |_, _| {
                    let counter = counter.clone();
                    let mut reg = counter.group().register();
                    Box::new(move |n| {
                        for _ in 0..n {
                            let guard = reg.enter();
                            counter.add_with(&guard, 1);
                        }
                    })
                })
            },
            |pool| counter_note(&counter, pool),
        );

        for (name, rmw) in [("thread_local", true), ("thread_local_store", false)] {
            let tls: Arc<ThreadLocal<AtomicU64>> = Arc::new(ThreadLocal::new());
            bench_line(
                &mut g,
                &summary,
                Line { name, threads: t },
                || {
                    let tls = tls.clone();
                    Pool::new(t, None, move |_, _| {
                        let tls = tls.clone();
                        Box::new(move |n| {
                            for _ in 0..n {
                                let slot = tls.get_or_default();
                                if rmw {
                                    slot.fetch_add(1, Relaxed);
                                } else {
                                    // Only this thread writes its slot: a load and a store suffice.
                                    slot.store(slot.load(Relaxed) + 1, Relaxed);
                                }
                            }
                        })
                    })
                },
                |pool| {
                    let sum: u64 = tls.iter().map(|s| s.load(Relaxed)).sum();
                    assert_eq!(sum, pool.total_ops, "thread_local lost increments");
                    format!("{} slots (one per thread)", tls.iter().count())
                },
            );
        }
    }
    g.finish();
    summary.print("sharded_counter", "private_store");
}

criterion_group!(benches, sharded_counter);
criterion_main!(benches);
