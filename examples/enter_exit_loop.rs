//! N enter+exit pairs on one thread, for instruction counting (`scripts/callgrind.sh`).
//!
//! ```text
//! cargo run --release --example enter_exit_loop -- [--mode MODE] [--iters N]
//! MODE: per-task | per-task-fallback | per-cpu | per-cpu-unpinned | temporary | group-enter | counter-add |
//!       counter-add-with
//! ```
//!
//! `per-task` uses the default group (membarrier on the rare side, compiler fences on the hot side, where the
//! kernel allows it), `per-task-fallback` forces full fences (`asymmetric_fences(false)`), `per-cpu` registers
//! idle registrations so that `users > max_cids`, pins the thread and declares its core with `set_cpu`,
//! `per-cpu-unpinned` is the same without `set_cpu` (every enter asks which core it runs on, as unpinned threads do),
//! `temporary` is the same while another registration holds a guard on that core (so every enter takes a temporary
//! CID: what threads see when the core's holder is descheduled inside its guard), and `group-enter` uses the
//! thread-local convenience `Group::enter`; `counter-add` is N `ShardedCounter::add(1)` (which enters through
//! `Group::enter`) and `counter-add-with` is N `reg.enter()` + `ShardedCounter::add_with(&guard, 1)`. Running the
//! loop at two `--iters` and dividing the difference in instructions by the difference in iterations gives
//! instructions per pair, free of set-up costs. The loop runs in chunks of 2^24 iterations, with a progress line
//! between two chunks once the run has taken a few seconds, so runs of up to 2^24 iterations (callgrind's) are one
//! call of the measured loop.

use mmcid_harness as common;

use common::cli::{self, Args, Flag};
use common::{errln, outln};
use mmcid::{CpuSet, Group, Mode, Registration, ShardedCounter};
use std::hint::black_box;

/// Every mode, in the usage's order.
const MODES: [&str; 8] = [
    "per-task",
    "per-task-fallback",
    "per-cpu",
    "per-cpu-unpinned",
    "temporary",
    "group-enter",
    "counter-add",
    "counter-add-with",
];

const USAGE: &str = "\
enter+exit pairs (or counter adds) of one mode on one thread, for instruction counting

usage: enter_exit_loop [options]

      --mode MODE   per-task (default) | per-task-fallback | per-cpu | per-cpu-unpinned | temporary |
                    group-enter | counter-add | counter-add-with
      --iters N     pairs (or adds) to run (default 10000000)
  -h, --help        this text

scripts/callgrind.sh runs each mode at two --iters and divides the difference in instructions by the difference
in iterations. Prints one line: the mode, the iterations, the group's mode and path counts.
";

/// Every flag of the command line.
const FLAGS: &[Flag] = &[Flag::value("--mode", None), Flag::value("--iters", None)];

/// What the command line asks for: (mode, iterations).
fn config(args: &Args) -> Result<(&'static str, u64), String> {
    let mode = args
        .get("--mode", |m| {
            MODES.iter().copied().find(|&k| k == m).ok_or(format!("expected one of {}", MODES.join(", ")))
        })?
        .unwrap_or(MODES[0]);
    Ok((mode, args.positive_u64("--iters")?.unwrap_or(10_000_000)))
}

/// Iterations per call of the measured loop.
const CHUNK: u64 = 1 << 24;

/// Runs `n` iterations as calls `step(k)` of at most [`CHUNK`] iterations each, adding up what they return, and
/// reports on stderr between two calls once the run has taken [`common::PROGRESS_AFTER`] (then every
/// [`common::PROGRESS_EVERY`]). A run of at most one chunk is one call and reads the clock once.
fn chunked(n: u64, mut step: impl FnMut(u64) -> u64) -> u64 {
    let began = std::time::Instant::now();
    let (mut done, mut acc, mut next) = (0, 0u64, common::PROGRESS_AFTER);
    while done < n {
        let k = (n - done).min(CHUNK);
        acc = acc.wrapping_add(step(black_box(k)));
        done += k;
        if done < n && began.elapsed() >= next {
            let detail = format!("{done} of {n} iterations");
            errln!("{}", common::progress_line("enter_exit_loop", &detail, began.elapsed()));
            next += common::PROGRESS_EVERY;
        }
    }
    acc
}

/// The measured loop: kept out of line so it is easy to find in a profile.
#[inline(never)]
fn pairs(reg: &mut Registration, n: u64) -> u64 {
    let mut acc = 0u64;
    for _ in 0..n {
        let guard = reg.enter();
        acc = acc.wrapping_add(guard.cid().get() as u64);
    }
    acc
}

#[inline(never)]
fn pairs_local(group: &Group, n: u64) -> u64 {
    let mut acc = 0u64;
    for _ in 0..n {
        let guard = group.enter();
        acc = acc.wrapping_add(guard.cid().get() as u64);
    }
    acc
}

#[inline(never)]
fn adds(counter: &ShardedCounter, n: u64) -> u64 {
    for _ in 0..n {
        counter.add(1);
    }
    0
}

#[inline(never)]
fn adds_with(counter: &ShardedCounter, reg: &mut Registration, n: u64) -> u64 {
    for _ in 0..n {
        let guard = reg.enter();
        counter.add_with(&guard, 1);
    }
    0
}

fn main() {
    let (mode, n) = cli::parse_or_exit("enter_exit_loop", USAGE, FLAGS, config);
    run(mode, n).unwrap_or_else(|e| {
        errln!("enter_exit_loop: {e}");
        std::process::exit(1);
    })
}

fn run(mode: &str, n: u64) -> Result<(), mmcid::Error> {
    let (group, acc, idle) = match mode {
        "per-task" | "per-task-fallback" => {
            let group = Group::builder().asymmetric_fences(mode == "per-task").build()?;
            let mut reg = group.register();
            let acc = chunked(n, |k| pairs(&mut reg, k));
            (group, acc, vec![reg])
        }
        "per-cpu" | "per-cpu-unpinned" | "temporary" => {
            let cpus = CpuSet::current()?;
            let cpu = cpus.iter().next().ok_or(mmcid::Error::EmptyCpuSet)?;
            if !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
                errln!("note: could not pin to CPU {cpu}");
            }
            let group = Group::builder().cpus(cpus).build()?;
            let mut idle: Vec<Registration> = (0..group.cores() + 1).map(|_| group.register()).collect();
            assert_eq!(group.mode(), Mode::PerCpu, "idle registrations must force per-CPU mode");
            let mut reg = group.register();
            if mode != "per-cpu-unpinned" {
                reg.set_cpu(Some(cpu))?;
            }
            // `temporary`: the core's CID stays borrowed by this other registration's guard during the loop.
            let mut holder = group.register();
            holder.set_cpu(Some(cpu))?;
            let held = (mode == "temporary").then(|| holder.enter());
            let acc = chunked(n, |k| pairs(&mut reg, k));
            drop(held);
            idle.extend([reg, holder]);
            (group, acc, idle)
        }
        "group-enter" => {
            let group = Group::new();
            let acc = chunked(n, |k| pairs_local(&group, k));
            (group, acc, Vec::new())
        }
        "counter-add" => {
            let group = Group::new();
            let counter = ShardedCounter::new(&group);
            let acc = chunked(n, |k| adds(&counter, k)).wrapping_add(counter.sum());
            (group, acc, Vec::new())
        }
        "counter-add-with" => {
            let group = Group::new();
            let counter = ShardedCounter::new(&group);
            let mut reg = group.register();
            let acc = chunked(n, |k| adds_with(&counter, &mut reg, k)).wrapping_add(counter.sum());
            (group, acc, vec![reg])
        }
        _ => unreachable!("config accepts only MODES"),
    };
    let s = group.stats();
    outln!(
        "mode={mode} iterations={n} group_mode={:?} membarrier={} rseq={} task_fast={} cpu_fast={} temporary={} \
         alloc={} acc={acc}",
        group.mode(),
        group.uses_membarrier(),
        group.uses_rseq(),
        s.enter_task_fast,
        s.enter_cpu_fast,
        s.enter_temporary,
        s.enter_alloc,
    );
    drop(idle);
    group.leave_thread();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Option<(&'static str, u64)>, String> {
        cli::parse_words(FLAGS, words, config)
    }

    /// Named flags with defaults; every mode of the usage is accepted; the old positional form, an unknown mode
    /// and zero iterations are errors naming the argument; the usage lists every flag and mode.
    #[test]
    fn command_line() {
        assert_eq!(parse(&[]), Ok(Some(("per-task", 10_000_000))));
        for mode in MODES {
            assert_eq!(parse(&["--mode", mode, "--iters=7"]), Ok(Some((mode, 7))));
            assert!(USAGE.contains(mode), "{mode}");
        }
        assert_eq!(parse(&["--help"]), Ok(None));
        for (words, want) in [
            (&["per-task", "1000"][..], r#"unexpected argument "per-task""#),
            (&["--mode", "per-thread"], r#"--mode: expected one of per-task, "#),
            (&["--iters", "0"], r#"--iters: expected a positive integer, got "0""#),
        ] {
            let e = parse(words).unwrap_err();
            assert!(e.starts_with(want), "{words:?}: {e}");
        }
        assert_eq!(cli::check_usage(USAGE, FLAGS), Ok(()));
    }

    /// The chunks add up to the iterations asked for, none larger than CHUNK, and what they return adds up.
    #[test]
    fn chunks_cover_the_run() {
        for n in [1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5] {
            let mut calls = Vec::new();
            let acc = chunked(n, |k| {
                calls.push(k);
                k
            });
            assert_eq!((calls.iter().sum::<u64>(), acc), (n, n), "{n}");
            assert!(calls.iter().all(|&k| (1..=CHUNK).contains(&k)), "{n}: {calls:?}");
            assert_eq!(calls.len() as u64, n.div_ceil(CHUNK));
        }
    }
}
