//! One pinned thread per core, each incrementing per-CID data inside guards.
//!
//! ```text
//! cargo run --release --example pinned -- [iterations per thread, default 1000000] [threads per core, default 1]
//! ```
//!
//! Each runtime thread is pinned to its core and registered in the runtime's group; every increment happens
//! inside a guard, on the shard of the guard's CID, with a plain `+= 1` (no atomic read-modify-write: the guard
//! makes the shard exclusively ours, I1, and shows us what the previous holder wrote, I8). The example prints
//! which CIDs each core's thread used and the per-CID totals, and exits non-zero unless the grand total is exactly
//! threads × iterations (a lost update would show here).

use mmcid::{PerCid, Runtime};
use std::collections::BTreeSet;
use std::sync::Barrier;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().is_some_and(|a| a == "-h" || a == "--help") {
        println!("usage: pinned [ITERATIONS per thread, default 1000000] [THREADS_PER_CPU, default 1]");
        return Ok(());
    }
    let iterations: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let threads_per_cpu: usize = args.next().map_or(Ok(1), |a| a.parse())?;

    let rt = Runtime::builder().threads_per_cpu(threads_per_cpu).build()?;
    let mut counts: PerCid<u64> = PerCid::new(rt.group());
    println!("runtime: cores {:?}, {} thread(s) per core, group {:?}", rt.cpus(), rt.threads_per_cpu(), rt.group());

    let counts_ref = &counts;
    // Start and finish in lock-step, so membership is fixed while the threads count: the CIDs printed are the
    // steady state's (drop the barriers to watch CIDs converge as threads come and go, I4).
    let lockstep = Barrier::new(rt.capacity());
    let mut reports = rt.scope(|s| {
        let handles = s.spawn_per_cpu(|ctx| {
            let cpu = ctx.cpu();
            let mut cids = BTreeSet::new();
            lockstep.wait();
            let mode = ctx.group().mode();
            for _ in 0..iterations {
                let mut guard = ctx.enter();
                cids.insert(guard.cid().get());
                *counts_ref.get_mut(&mut guard) += 1;
            }
            lockstep.wait();
            let view = mmcid::current().map(|v| (v.cpu(), v.is_pinned()));
            (ctx.index(), cpu, cids, mode, view)
        });
        handles.into_iter().map(|h| h.join()).collect::<Vec<_>>()
    });

    let mut failed = false;
    for report in reports.drain(..) {
        match report {
            Ok((index, cpu, cids, mode, view)) => {
                println!(
                    "thread {index:>3} on core {cpu:>3}: CIDs {cids:?}, group mode {mode:?}, view (cpu, pinned) {view:?}"
                );
            }
            Err(payload) => {
                failed = true;
                println!("a thread failed: {:?}", payload.downcast_ref::<mmcid::Error>());
            }
        }
    }

    let threads = rt.capacity() as u64;
    let mut total = 0;
    for (cid, n) in counts.iter_visited() {
        println!("CID {cid:>3}: {n:>12}");
        total += *n;
    }
    let expected = threads * iterations;
    println!("total {total} (expected {threads} threads × {iterations} = {expected})");
    let stats = rt.group().stats();
    println!(
        "enters: per-task fast {}, per-CPU fast {}, temporary {}; CIDs in use now {}",
        stats.enter_task_fast, stats.enter_cpu_fast, stats.enter_temporary, stats.cids_in_use
    );
    if failed || total != expected {
        eprintln!("MISMATCH");
        std::process::exit(1);
    }
    Ok(())
}
