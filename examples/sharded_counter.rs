//! Counts events from many threads with a `ShardedCounter`: prints the total (and checks it), the shards the
//! counter allocated against the number of threads, and the time.
//!
//! ```text
//! cargo run --release --example sharded_counter -- [--threads N] [--iters N]
//! ```
//!
//! Defaults: 8 threads × 1 000 000 adds each. The group's cores are the process's affinity mask, so with more
//! threads than cores the counter holds about one shard per core (per-CPU mode), not one per thread.

use mmcid_harness as common;
use mmcid_harness::peers;

use common::cli::{self, Args, Flag};
use common::{errln, outln};
use mmcid::{Group, ShardedCounter};
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "\
threads counting events through a ShardedCounter

usage: sharded_counter [options]

  -t, --threads N   counting threads (default 8; at most 8192)
      --iters N     adds per thread (default 1000000)
  -h, --help        this text

Prints the total (and checks it against threads x adds), the shards the counter allocated against the number of
threads, the time (wall time and adds per second in all; CPU time per add, summed over the threads, so threads
waiting for a core count nothing) and the group's enter counts; exits 1 if the total is wrong.
";

/// Every flag of the command line.
const FLAGS: &[Flag] = &[Flag::value("--threads", Some("-t")), Flag::value("--iters", None)];

/// What the command line asks for.
struct Config {
    threads: usize,
    iters: u64,
}

fn config(args: &Args) -> Result<Config, String> {
    let threads = args.positive("--threads")?.unwrap_or(8);
    if threads > common::MAX_THREADS {
        return Err(format!("{} {threads}: at most {}", args.spelled("--threads"), common::MAX_THREADS));
    }
    let iters = args.positive_u64("--iters")?.unwrap_or(1_000_000);
    if (threads as u64).checked_mul(iters).is_none() {
        return Err("--threads × --iters overflows a 64-bit count".into());
    }
    Ok(Config { threads, iters })
}

fn main() -> ExitCode {
    let args = cli::parse_or_exit("sharded_counter", USAGE, FLAGS, config);
    let group = Group::new();
    let counter = ShardedCounter::new(&group);
    let expected = args.threads as u64 * args.iters;
    let start = Instant::now();
    let done = || format!("{} of {expected} adds", counter.sum());
    // Each thread's own CPU time for its adds: with more threads than cores, wall time also counts the time a
    // thread waited for a core.
    let cpu_ns: u64 = common::with_progress("sharded_counter", done, || {
        std::thread::scope(|s| {
            let threads: Vec<_> = (0..args.threads)
                .map(|_| {
                    s.spawn(|| {
                        let began = peers::thread_cpu_ns();
                        for _ in 0..args.iters {
                            counter.add(1);
                        }
                        peers::thread_cpu_ns() - began
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().expect("a counting thread panicked")).sum()
        })
    });
    let elapsed = start.elapsed();
    let total = counter.sum();
    let ops = expected as f64; // at least 1: both factors are
    outln!("threads:          {}", args.threads);
    outln!("allowed cores:    {}", group.cpus().len());
    outln!("total:            {total} (expected {expected})");
    outln!(
        "shards allocated: {} for {} threads (a thread-id keyed counter would hold {})",
        counter.shards_allocated(),
        args.threads,
        args.threads
    );
    outln!(
        "time:             {:.3} s wall, {:.1} M adds/s in all; {:.2} ns of CPU time per add (the threads' CPU \
         time summed)",
        elapsed.as_secs_f64(),
        ops / elapsed.as_secs_f64() / 1e6,
        cpu_ns as f64 / ops
    );
    let stats = group.stats();
    outln!(
        "enters:           {} per-task fast, {} per-CPU fast, {} temporary, and {} adds as one sequence; {} mode \
         switches",
        stats.enter_task_fast,
        stats.enter_cpu_fast,
        stats.enter_temporary,
        stats.counter_sequences,
        stats.switches_to_per_cpu + stats.switches_to_per_task
    );
    if total != expected {
        errln!("sharded_counter: the total is wrong ({total}, expected {expected})");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Option<(usize, u64)>, String> {
        cli::parse_words(FLAGS, words, |a| config(a).map(|c| (c.threads, c.iters)))
    }

    /// Defaults, both spellings; zero adds or threads (whose time per add would be nonsense), too many threads
    /// and an overflowing total are errors naming the argument; the usage lists every flag.
    #[test]
    fn command_line() {
        assert_eq!(parse(&[]), Ok(Some((8, 1_000_000))));
        assert_eq!(parse(&["-t", "2", "--iters=5"]), Ok(Some((2, 5))));
        assert_eq!(parse(&["--threads", "8192"]), Ok(Some((8192, 1_000_000))));
        assert_eq!(parse(&["--help"]), Ok(None));
        for (words, want) in [
            (&["--iters", "0"][..], r#"--iters: expected a positive integer, got "0""#),
            (&["-t", "0"], r#"-t: expected a positive integer, got "0""#),
            (&["--threads", "8193"], "--threads 8193: at most 8192"),
            (&["--threads", "2", "--iters", "18446744073709551615"], "--threads × --iters overflows"),
            (&["8"], r#"unexpected argument "8""#),
        ] {
            let e = parse(words).unwrap_err();
            assert!(e.starts_with(want), "{words:?}: {e}");
        }
        assert_eq!(cli::check_usage(USAGE, FLAGS), Ok(()));
    }
}
