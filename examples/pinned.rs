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

#[path = "common/mod.rs"]
mod common;

use mmcid::{PerCid, Runtime};
use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A barrier for every thread the runtime plans, which the main thread breaks as soon as one of them has ended
/// early: a thread that failed to start (spawn, pin or register error, so its closure never runs) never arrives,
/// and the others must not wait for it for ever. Once broken, `wait` returns at once.
struct Lockstep {
    n: usize,
    /// (threads arrived in this round, round, broken)
    state: Mutex<(usize, u64, bool)>,
    turn: Condvar,
}

impl Lockstep {
    fn new(n: usize) -> Lockstep {
        Lockstep { n, state: Mutex::new((0, 0, false)), turn: Condvar::new() }
    }

    fn wait(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let round = s.1;
        s.0 += 1;
        if s.0 == self.n {
            *s = (0, round + 1, s.2);
            self.turn.notify_all();
        }
        while s.1 == round && !s.2 {
            s = self.turn.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn break_all(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).2 = true;
        self.turn.notify_all();
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().is_some_and(|a| a == "-h" || a == "--help") {
        println!("usage: pinned [ITERATIONS per thread, default 1000000] [THREADS_PER_CPU, default 1]");
        return Ok(());
    }
    let iterations: u64 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let threads_per_cpu: usize = args.next().map_or(Ok(1), |a| a.parse())?;

    let rt = Runtime::builder().threads_per_cpu(threads_per_cpu).build()?;
    if rt.capacity() > common::MAX_THREADS {
        return Err(
            format!("{} threads ({threads_per_cpu} per core): at most {}", rt.capacity(), common::MAX_THREADS).into()
        );
    }
    let expected = (rt.capacity() as u64).checked_mul(iterations).ok_or("threads × iterations overflows a u64")?;
    let mut counts: PerCid<u64> = PerCid::new(rt.group());
    println!("runtime: cores {:?}, {} thread(s) per core, group {:?}", rt.cpus(), rt.threads_per_cpu(), rt.group());

    let counts_ref = &counts;
    // Start and finish in lock-step, so membership is fixed while the threads count: the CIDs printed are the
    // steady state's (drop the barriers to watch CIDs converge as threads come and go, I4).
    let lockstep = Lockstep::new(rt.capacity());
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
        // A thread that ended while others still run either passed both barriers (then breaking changes nothing)
        // or never reached them.
        while !handles.iter().all(|h| h.is_finished()) {
            if handles.iter().any(|h| h.is_finished()) {
                lockstep.break_all();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
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

    let threads = rt.capacity();
    let mut total = 0;
    for (cid, n) in counts.iter_visited() {
        println!("CID {cid:>3}: {n:>12}");
        total += *n;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{mpsc, Arc};

    /// Two rounds pass with every thread; a thread that never arrives holds the others only until `break_all`.
    #[test]
    fn lockstep_rounds_and_break() {
        let step = Arc::new(Lockstep::new(2));
        let (tx, rx) = mpsc::channel();
        let other = {
            let (step, tx) = (Arc::clone(&step), tx.clone());
            std::thread::spawn(move || {
                step.wait();
                step.wait();
                tx.send("other passed both rounds").unwrap();
            })
        };
        step.wait();
        step.wait();
        // A deadlock detector, not a time budget.
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok("other passed both rounds"));
        other.join().unwrap();

        let step = Arc::new(Lockstep::new(3)); // the third thread "failed to start"
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (step, tx) = (Arc::clone(&step), tx.clone());
                std::thread::spawn(move || {
                    step.wait();
                    tx.send("released").unwrap();
                })
            })
            .collect();
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "released before the break");
        step.break_all();
        for _ in 0..2 {
            assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok("released"));
        }
        waiters.into_iter().for_each(|w| w.join().unwrap());
        step.wait(); // once broken, returns at once
    }
}
