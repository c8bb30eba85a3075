//! One pinned thread per core, each incrementing per-CID data inside guards.
//!
//! ```text
//! cargo run --release --example pinned -- [--iters N] [--threads-per-cpu N]
//! ```
//!
//! Each runtime thread is pinned to its core and registered in the runtime's group; every increment happens
//! inside a guard, on the shard of the guard's CID, with a plain `+= 1` (no atomic read-modify-write: the guard
//! makes the shard exclusively ours, I1, and shows us what the previous holder wrote, I8). The example prints
//! which CIDs each core's thread used and the per-CID totals, and exits non-zero unless the grand total is exactly
//! threads × iterations (a lost update would show here).

use mmcid_harness as common;

use common::cli::{self, Args, Flag};
use common::{errln, outln};
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

const USAGE: &str = "\
one pinned runtime thread per allowed core, each incrementing per-CID data inside guards

usage: pinned [options]

      --iters N            increments per thread (default 1000000)
      --threads-per-cpu N  runtime threads per allowed core (default 1); at most 8192 threads in all
  -h, --help               this text

Prints the runtime's cores, which CIDs each thread used, the per-CID totals and the group's enter counts, and
exits 1 (MISMATCH) unless the grand total is exactly threads x iterations: a lost update would show there.
";

/// Every flag of the command line.
const FLAGS: &[Flag] = &[Flag::value("--iters", None), Flag::value("--threads-per-cpu", None)];

/// What the command line asks for: (increments per thread, threads per core).
fn config(args: &Args) -> Result<(u64, usize), String> {
    let iterations = args.positive_u64("--iters")?.unwrap_or(1_000_000);
    let threads_per_cpu = args.positive("--threads-per-cpu")?.unwrap_or(1);
    if threads_per_cpu > common::MAX_THREADS {
        return Err(format!("--threads-per-cpu {threads_per_cpu}: at most {} threads in all", common::MAX_THREADS));
    }
    Ok((iterations, threads_per_cpu))
}

fn fail(e: impl std::fmt::Display) -> ! {
    errln!("pinned: {e}");
    std::process::exit(1);
}

fn main() {
    let (iterations, threads_per_cpu) = cli::parse_or_exit("pinned", USAGE, FLAGS, config);
    let rt = Runtime::builder().threads_per_cpu(threads_per_cpu).build().unwrap_or_else(|e| fail(e));
    if rt.capacity() > common::MAX_THREADS {
        let n = rt.capacity();
        cli::usage_error(
            "pinned",
            &format!("{n} threads ({threads_per_cpu} per core): at most {}", common::MAX_THREADS),
        );
    }
    let Some(expected) = (rt.capacity() as u64).checked_mul(iterations) else {
        cli::usage_error("pinned", &format!("{} threads × --iters {iterations} overflows a u64", rt.capacity()))
    };
    let mut counts: PerCid<u64> = PerCid::new(rt.group());
    outln!("runtime: cores {:?}, {} thread(s) per core, group {:?}", rt.cpus(), rt.threads_per_cpu(), rt.group());

    let counts_ref = &counts;
    // Start and finish in lock-step, so membership is fixed while the threads count: the CIDs printed are the
    // steady state's (drop the barriers to watch CIDs converge as threads come and go, I4).
    let lockstep = Lockstep::new(rt.capacity());
    let progress = || format!("{} threads × {iterations} increments", rt.capacity());
    let mut reports = common::with_progress("pinned", progress, || {
        rt.scope(|s| {
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
        })
    });

    let mut failed = false;
    for report in reports.drain(..) {
        match report {
            Ok((index, cpu, cids, mode, view)) => {
                outln!(
                    "thread {index:>3} on core {cpu:>3}: CIDs {cids:?}, group mode {mode:?}, view (cpu, pinned) {view:?}"
                );
            }
            Err(payload) => {
                failed = true;
                outln!("a thread failed: {:?}", payload.downcast_ref::<mmcid::Error>());
            }
        }
    }

    let threads = rt.capacity();
    let mut total = 0;
    for (cid, n) in counts.iter_mut() {
        outln!("CID {cid:>3}: {n:>12}");
        total += *n;
    }
    outln!("total {total} (expected {threads} threads × {iterations} = {expected})");
    let stats = rt.group().stats();
    outln!(
        "enters: per-task fast {}, per-CPU fast {}, temporary {}; CIDs in use now {}",
        stats.enter_task_fast,
        stats.enter_cpu_fast,
        stats.enter_temporary,
        stats.cids_in_use
    );
    if failed || total != expected {
        errln!("MISMATCH");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Option<(u64, usize)>, String> {
        cli::parse_words(FLAGS, words, config)
    }

    /// Named flags with defaults; the old positional form, zeros and too many threads are errors naming the
    /// argument; the usage lists every flag.
    #[test]
    fn command_line() {
        assert_eq!(parse(&[]), Ok(Some((1_000_000, 1))));
        assert_eq!(parse(&["--iters", "5", "--threads-per-cpu=2"]), Ok(Some((5, 2))));
        assert_eq!(parse(&["--help"]), Ok(None));
        for (words, want) in [
            (&["1000"][..], r#"unexpected argument "1000""#),
            (&["--iters", "0"], r#"--iters: expected a positive integer, got "0""#),
            (&["--iters", "x"], r#"--iters: expected a positive integer, got "x""#),
            (&["--threads-per-cpu", "0"], r#"--threads-per-cpu: expected a positive integer, got "0""#),
            (&["--threads-per-cpu", "8193"], "--threads-per-cpu 8193: at most 8192 threads"),
            (&["--iters", "1", "--iters", "2"], "--iters given twice"),
        ] {
            let e = parse(words).unwrap_err();
            assert!(e.starts_with(want), "{words:?}: {e}");
        }
        assert_eq!(cli::check_usage(USAGE, FLAGS), Ok(()));
    }
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
