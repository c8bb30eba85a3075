//! Steal storms: registrations left in per-CPU mode with fewer users than cores, moving between cores, so that a
//! core's CID is out of range at most enters and convergence takes an idle in-range CID from another core
//! (design.md §4.5; in a group with restartable sequences each steal is a claim and an RSEQ membarrier), and what
//! the switch to per-task mode that such storms trigger (§4.5.1) leaves. Prints, per scenario, the steals, the
//! switches and the time per enter+exit pair.
//!
//! ```text
//! cargo run --release --example steal_storm -- [--scenario NAME] [--enters N]
//! NAME: lone | lone-cas | virtual | wander | all
//! ```
//!
//! * `lone`: a group over two real CPUs A and B (restartable sequences where the kernel offers them), three users
//!   (per-CPU mode), then one: the last one pins itself to A and B in turn and enters once on each. Where the
//!   machine's switch-back threshold would end per-CPU mode at one user (4 or more possible CPUs), the group is
//!   allowed CPU A alone instead (threshold 1), and B lies outside its set. The clock reads and the pinning are
//!   outside the measured pair.
//! * `lone-cas`: the same with CAS borrows (`restartable_sequences(false)`).
//! * `virtual`: a lone registration on two virtual cores, declaring core 0 and core 1 in turn (no system call).
//! * `wander`: a mostly idle group on 4 virtual cores: 5 users (per-CPU), then 2 (threshold 2: still per-CPU,
//!   `max_cids` 2); each of the two enters on the next core at every round, the other one two cores ahead.

use mmcid_harness as common;

use common::cli::{self, Args, Flag};
use common::{errln, outln};
use mmcid::{CpuSet, Group, Mode, Registration};
use std::time::{Duration, Instant};

/// Every scenario, in the usage's order (`all` runs each).
const SCENARIOS: [&str; 5] = ["lone", "lone-cas", "virtual", "wander", "all"];

const USAGE: &str = "\
steal storms: per-CPU mode with fewer users than cores, registrations moving between cores

usage: steal_storm [options]

      --scenario NAME   lone (default) | lone-cas | virtual | wander | all
      --enters N        enter+exit pairs per scenario (default 20000)
  -h, --help            this text

Prints one line per scenario: the pairs, the steals, the switches to per-task mode, the group's mode at the end,
the mean time per enter+exit pair (with two clock reads, whose cost clock_ns gives; the pinning of `lone` is not
included) and the enters by path.
";

/// Every flag of the command line.
const FLAGS: &[Flag] = &[Flag::value("--scenario", None), Flag::value("--enters", None)];

/// What the command line asks for: (scenario, pairs).
fn config(args: &Args) -> Result<(&'static str, u64), String> {
    let scenario = args
        .get("--scenario", |m| {
            SCENARIOS.iter().copied().find(|&k| k == m).ok_or(format!("expected one of {}", SCENARIOS.join(", ")))
        })?
        .unwrap_or(SCENARIOS[0]);
    Ok((scenario, args.positive_u64("--enters")?.unwrap_or(20_000)))
}

fn main() {
    let (scenario, n) = cli::parse_or_exit("steal_storm", USAGE, FLAGS, config);
    // The affinity at start: `lone` pins the thread, so later scenarios must not read it again.
    let cpus: Vec<usize> = CpuSet::current().map(|set| set.iter().take(2).collect()).unwrap_or_default();
    let run = |name: &str| match name {
        "lone" => lone(&cpus, n, true),
        "lone-cas" => lone(&cpus, n, false),
        "virtual" => virtual_lone(n),
        "wander" => wander(n),
        _ => unreachable!("config accepts only SCENARIOS"),
    };
    let names: Vec<&str> = if scenario == "all" { SCENARIOS[..4].to_vec() } else { vec![scenario] };
    for name in names {
        // Each on a thread of its own, which starts with the process's affinity (`lone` pins its thread).
        let result = std::thread::scope(|s| s.spawn(|| run(name)).join()).unwrap_or_else(|_| Err("panicked".into()));
        if let Err(e) = result {
            errln!("steal_storm: {name}: {e}");
            std::process::exit(1);
        }
    }
}

/// One enter+exit pair of `reg`, timed.
#[inline(never)]
fn pair(reg: &mut Registration) -> Duration {
    let start = Instant::now();
    let guard = reg.enter();
    std::hint::black_box(guard.cid());
    drop(guard);
    start.elapsed()
}

/// The mean cost of the two clock reads around a pair, in ns: measured on an empty pair, and included in
/// `ns_per_pair`.
fn clock_ns(n: u64) -> f64 {
    let mut took = Duration::ZERO;
    for _ in 0..n {
        let start = Instant::now();
        std::hint::black_box(&start);
        took += start.elapsed();
    }
    took.as_nanos() as f64 / n as f64
}

fn report(scenario: &str, group: &Group, n: u64, took: Duration, note: &str) {
    let s = group.stats();
    outln!(
        "scenario={scenario} rseq={} pairs={n} steals={} switches_to_per_task={} mode_at_end={:?} \
         ns_per_pair={:.0} clock_ns={:.0} cpu_fast={} cpu_slow={} task_fast={}{note}",
        group.uses_rseq(),
        s.steals,
        s.switches_to_per_task,
        group.mode(),
        took.as_nanos() as f64 / n as f64,
        clock_ns(n),
        s.enter_cpu_fast,
        s.enter_cpu_slow,
        s.enter_task_fast,
    );
}

fn pin(cpu: usize) -> Result<(), String> {
    if core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
        Ok(())
    } else {
        Err(format!("could not pin to CPU {cpu}"))
    }
}

/// Three users over `allowed` (per-CPU mode), then one: the survivor, or `None` with the group if the group went
/// back to per-task mode at one user.
fn shrink_to_one(allowed: &CpuSet, rseq: bool) -> Result<(Group, Option<Registration>), mmcid::Error> {
    let group = Group::builder().cpus(allowed.clone()).restartable_sequences(rseq).build()?;
    let mut regs: Vec<_> = (0..3).map(|_| group.register()).collect();
    let last = regs.pop().expect("three registrations");
    drop(regs);
    let per_cpu = group.mode() == Mode::PerCpu;
    Ok((group, per_cpu.then_some(last)))
}

fn lone(cpus: &[usize], n: u64, rseq: bool) -> Result<(), String> {
    let &[a, b] = cpus else { return Err("needs two CPUs in this thread's affinity".into()) };
    let both = CpuSet::from_cpus([a, b]).map_err(|e| e.to_string())?;
    let (mut group, mut survivor) = shrink_to_one(&both, rseq).map_err(|e| e.to_string())?;
    let mut note = "";
    if survivor.is_none() {
        // 4 or more possible CPUs: threshold 2 over two allowed CPUs. One allowed CPU keeps it at 1.
        (group, survivor) =
            shrink_to_one(&CpuSet::from_cpus([a]).map_err(|e| e.to_string())?, rseq).map_err(|e| e.to_string())?;
        note = " allowed=A";
    }
    let mut reg = survivor.ok_or("per-task mode at one user even with one allowed CPU")?;
    let mut took = Duration::ZERO;
    for i in 0..n {
        pin(if i % 2 == 0 { a } else { b })?;
        took += pair(&mut reg);
    }
    report(if rseq { "lone" } else { "lone-cas" }, &group, n, took, note);
    drop(reg);
    Ok(())
}

fn virtual_lone(n: u64) -> Result<(), String> {
    let group = Group::builder().virtual_cpus(2).build().map_err(|e| e.to_string())?;
    let mut regs: Vec<_> = (0..3).map(|_| group.register()).collect();
    let mut reg = regs.pop().expect("three registrations");
    drop(regs);
    let mut took = Duration::ZERO;
    for i in 0..n {
        reg.set_cpu(Some((i % 2) as usize)).map_err(|e| e.to_string())?;
        took += pair(&mut reg);
    }
    report("virtual", &group, n, took, "");
    Ok(())
}

fn wander(n: u64) -> Result<(), String> {
    let group = Group::builder().virtual_cpus(4).build().map_err(|e| e.to_string())?;
    let mut regs: Vec<_> = (0..5).map(|_| group.register()).collect();
    let mut pair_regs = regs.split_off(3);
    drop(regs);
    if group.mode() != Mode::PerCpu {
        return Err(format!("expected per-CPU mode at 2 users, got {:?}", group.mode()));
    }
    let mut took = Duration::ZERO;
    for i in 0..n {
        let (j, round) = ((i % 2) as usize, (i / 2) as usize);
        let reg = &mut pair_regs[j];
        reg.set_cpu(Some((round + 2 * j) % 4)).map_err(|e| e.to_string())?;
        took += pair(reg);
    }
    report("wander", &group, n, took, "");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Option<(&'static str, u64)>, String> {
        cli::parse_words(FLAGS, words, config)
    }

    /// Named flags with defaults; every scenario of the usage is accepted; an unknown scenario and zero pairs are
    /// errors naming the argument; the usage lists every flag and scenario.
    #[test]
    fn command_line() {
        assert_eq!(parse(&[]), Ok(Some(("lone", 20_000))));
        for scenario in SCENARIOS {
            assert_eq!(parse(&["--scenario", scenario, "--enters=7"]), Ok(Some((scenario, 7))));
            assert!(USAGE.contains(scenario), "{scenario}");
        }
        assert_eq!(parse(&["--help"]), Ok(None));
        for (words, want) in [
            (&["--scenario", "storm"][..], r#"--scenario: expected one of lone, "#),
            (&["--enters", "0"], r#"--enters: expected a positive integer, got "0""#),
        ] {
            let e = parse(words).unwrap_err();
            assert!(e.starts_with(want), "{words:?}: {e}");
        }
        assert_eq!(cli::check_usage(USAGE, FLAGS), Ok(()));
    }
}
