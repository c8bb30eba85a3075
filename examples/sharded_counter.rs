//! Counts events from many threads with a `ShardedCounter`: prints the total (and checks it), the shards the
//! counter allocated against the number of threads, and the time.
//!
//! ```text
//! cargo run --release --example sharded_counter -- [--threads N] [--iters M]
//! ```
//!
//! Defaults: 8 threads × 1 000 000 adds each. The group's cores are the process's affinity mask, so with more
//! threads than cores the counter holds about one shard per core (per-CPU mode), not one per thread.

#[path = "common/mod.rs"]
mod common;

use mmcid::{Group, ShardedCounter};
use std::process::ExitCode;
use std::time::Instant;

struct Args {
    threads: usize,
    iters: u64,
}

fn usage() -> String {
    format!(
        "usage: sharded_counter [--threads N] [--iters M]   (1 ≤ N ≤ {} threads, M adds per thread)",
        common::MAX_THREADS
    )
}

/// The arguments, or `Ok(None)` after printing the usage for `--help`.
fn parse() -> Result<Option<Args>, String> {
    let mut args = Args { threads: 8, iters: 1_000_000 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            let v = it.next().ok_or_else(|| format!("{name} needs a value"))?;
            v.parse().map_err(|_| format!("{name}: not a number: {v:?}"))
        };
        match flag.as_str() {
            "--threads" => args.threads = value("--threads")? as usize,
            "--iters" => args.iters = value("--iters")?,
            "-h" | "--help" => {
                println!("{}", usage());
                return Ok(None);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.threads == 0 || args.threads > common::MAX_THREADS {
        return Err(format!("--threads must be between 1 and {}", common::MAX_THREADS));
    }
    if (args.threads as u64).checked_mul(args.iters).is_none() {
        return Err("--threads × --iters overflows a 64-bit count".into());
    }
    Ok(Some(args))
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            eprintln!("{}", usage());
            return ExitCode::from(2);
        }
    };
    let group = Group::new();
    let counter = ShardedCounter::new(&group);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..args.threads {
            s.spawn(|| {
                for _ in 0..args.iters {
                    counter.add(1);
                }
            });
        }
    });
    let elapsed = start.elapsed();
    let total = counter.sum();
    let expected = args.threads as u64 * args.iters;
    let ops = expected.max(1) as f64;
    println!("threads:          {}", args.threads);
    println!("allowed cores:    {}", group.cpus().len());
    println!("total:            {total} (expected {expected})");
    println!(
        "shards allocated: {} for {} threads (a thread-id keyed counter would hold {})",
        counter.shards_allocated(),
        args.threads,
        args.threads
    );
    println!(
        "time:             {:.3} s, {:.1} ns per add per thread, {:.1} M adds/s in all",
        elapsed.as_secs_f64(),
        elapsed.as_nanos() as f64 * args.threads as f64 / ops,
        ops / elapsed.as_secs_f64() / 1e6
    );
    let stats = group.stats();
    println!(
        "enters:           {} per-task fast, {} per-CPU fast, {} temporary, and {} adds as one sequence; {} mode \
         switches",
        stats.enter_task_fast,
        stats.enter_cpu_fast,
        stats.enter_temporary,
        stats.counter_sequences,
        stats.switches_to_per_cpu + stats.switches_to_per_task
    );
    if total != expected {
        eprintln!("error: the total is wrong");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
