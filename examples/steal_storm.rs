//! Steal storms: registrations left in per-CPU mode with fewer users than cores, moving between cores, so that a
//! core's CID is out of range at most enters and convergence takes an idle in-range CID from another core
//! (design.md §4.5; in a group with restartable sequences each steal is a claim and an RSEQ membarrier), and what
//! the switch to per-task mode that such storms trigger (§4.5.1) leaves. Prints, per scenario, the steals, the
//! switches and the time per enter+exit pair.
//!
//! ```text
//! cargo run --release --example steal_storm -- [--scenario NAME] [--enters N] [--json FILE] [--svg FILE]
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

use common::chart::{self, Chart, Panel, Series, Style};
use common::cli::{self, Args, Flag};
use common::{errln, json_num, json_str, outln, OutFile};
use mmcid::{CpuSet, Group, Mode, Registration};
use std::time::{Duration, Instant};

/// Every scenario, in the usage's order (`all` runs each).
const SCENARIOS: [&str; 5] = ["lone", "lone-cas", "virtual", "wander", "all"];

const USAGE: &str = "\
steal storms: per-CPU mode with fewer users than cores, registrations moving between cores

usage: steal_storm [options]

      --scenario NAME   lone (default) | lone-cas | virtual | wander | all
      --enters N        enter+exit pairs per scenario (default 20000)
      --json FILE       also write every scenario's line as JSON (checked before the run, written at the end)
      --svg FILE        also draw each scenario's time per pair and its steals (an SVG chart)
  -h, --help            this text

Prints one line per scenario: the pairs, the steals, the switches to per-task mode, the group's mode at the end,
the mean time per enter+exit pair (with two clock reads, whose cost clock_ns gives; the pinning of `lone` is not
included) and the enters by path.
";

/// Every flag of the command line.
const FLAGS: &[Flag] = &[
    Flag::value("--scenario", None),
    Flag::value("--enters", None),
    Flag::value("--json", None),
    Flag::value("--svg", None),
];

/// What the command line asks for.
struct Config {
    scenario: &'static str,
    /// Pairs per scenario.
    n: u64,
    json: Option<String>,
    svg: Option<String>,
}

fn config(args: &Args) -> Result<Config, String> {
    let scenario = args
        .get("--scenario", |m| {
            SCENARIOS.iter().copied().find(|&k| k == m).ok_or(format!("expected one of {}", SCENARIOS.join(", ")))
        })?
        .unwrap_or(SCENARIOS[0]);
    let n = args.positive_u64("--enters")?.unwrap_or(20_000);
    let (json, svg) = (args.value("--json").map(str::to_string), args.value("--svg").map(str::to_string));
    Ok(Config { scenario, n, json, svg })
}

/// One scenario's line.
#[derive(Clone, Debug)]
struct Row {
    scenario: &'static str,
    rseq: bool,
    pairs: u64,
    steals: u64,
    switches_to_per_task: u64,
    mode_at_end: Mode,
    ns_per_pair: f64,
    clock_ns: f64,
    /// ` allowed=A` where `lone` had to shrink the group to one CPU.
    note: &'static str,
}

fn fail(e: String) -> ! {
    errln!("steal_storm: {e}");
    std::process::exit(1);
}

fn main() {
    let cfg = cli::parse_or_exit("steal_storm", USAGE, FLAGS, config);
    // Checked before the run, so that an unwritable path is reported at once; written at the end.
    let json = cfg.json.as_deref().map(|path| OutFile::create("--json", path).unwrap_or_else(|e| fail(e)));
    let svg = cfg.svg.as_deref().map(|path| OutFile::create("--svg", path).unwrap_or_else(|e| fail(e)));
    let (scenario, n) = (cfg.scenario, cfg.n);
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
    let mut rows = Vec::new();
    for name in names {
        // Each on a thread of its own, which starts with the process's affinity (`lone` pins its thread).
        let result = std::thread::scope(|s| s.spawn(|| run(name)).join()).unwrap_or_else(|_| Err("panicked".into()));
        rows.push(result.unwrap_or_else(|e| fail(format!("{name}: {e}"))));
    }
    if let Some(file) = json {
        let body: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{{\"scenario\":{},\"rseq\":{},\"pairs\":{},\"steals\":{},\"switches_to_per_task\":{},\
                     \"mode_at_end\":{},\"ns_per_pair\":{},\"clock_ns\":{},\"allowed_a_only\":{}}}",
                    json_str(r.scenario),
                    r.rseq,
                    r.pairs,
                    r.steals,
                    r.switches_to_per_task,
                    json_str(&format!("{:?}", r.mode_at_end)),
                    json_num(r.ns_per_pair, 1),
                    json_num(r.clock_ns, 1),
                    !r.note.is_empty()
                )
            })
            .collect();
        let body = format!("{{\"benchmark\":\"steal_storm\",\"results\":[{}]}}\n", body.join(","));
        file.write(&body).unwrap_or_else(|e| fail(e));
    }
    if let Some(file) = svg {
        chart_of(&rows, chart::footer()).write(file).unwrap_or_else(|e| fail(e));
    }
}

/// The scenarios as a chart: the time per enter+exit pair (clock reads included) and the steals.
fn chart_of(rows: &[Row], footer: String) -> Chart {
    let panel = |title: &str, y_label: &str, name: &str, f: &dyn Fn(&Row) -> f64| Panel {
        title: title.into(),
        x_label: "scenario".into(),
        y_label: y_label.into(),
        categories: rows.iter().map(|r| format!("{}{}", r.scenario, r.note)).collect(),
        series: vec![Series {
            name: name.into(),
            values: rows.iter().map(|r| Some(chart::Value::plain(f(r)))).collect(),
        }],
        style: Style::Bars,
        log_y: false,
    };
    let pairs = rows.first().map_or(0, |r| r.pairs);
    Chart {
        title: format!("steal_storm: per-CPU mode with fewer users than cores, {pairs} enter+exit pairs per scenario"),
        panels: vec![
            panel("time per enter+exit pair (two clock reads included)", "ns per pair", "enter+exit", &|r| {
                r.ns_per_pair
            }),
            panel("steals (until the switch to per-task mode)", "steals", "steals", &|r| r.steals as f64),
        ],
        footer,
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

fn report(scenario: &'static str, group: &Group, n: u64, took: Duration, note: &'static str) -> Row {
    let s = group.stats();
    let (ns_per_pair, clock) = (took.as_nanos() as f64 / n as f64, clock_ns(n));
    outln!(
        "scenario={scenario} rseq={} pairs={n} steals={} switches_to_per_task={} mode_at_end={:?} \
         ns_per_pair={:.0} clock_ns={:.0} cpu_fast={} cpu_slow={} task_fast={}{note}",
        group.uses_rseq(),
        s.steals,
        s.switches_to_per_task,
        group.mode(),
        ns_per_pair,
        clock,
        s.enter_cpu_fast,
        s.enter_cpu_slow,
        s.enter_task_fast,
    );
    Row {
        scenario,
        rseq: group.uses_rseq(),
        pairs: n,
        steals: s.steals,
        switches_to_per_task: s.switches_to_per_task,
        mode_at_end: group.mode(),
        ns_per_pair,
        clock_ns: clock,
        note,
    }
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

fn lone(cpus: &[usize], n: u64, rseq: bool) -> Result<Row, String> {
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
    let row = report(if rseq { "lone" } else { "lone-cas" }, &group, n, took, note);
    drop(reg);
    Ok(row)
}

fn virtual_lone(n: u64) -> Result<Row, String> {
    let group = Group::builder().virtual_cpus(2).build().map_err(|e| e.to_string())?;
    let mut regs: Vec<_> = (0..3).map(|_| group.register()).collect();
    let mut reg = regs.pop().expect("three registrations");
    drop(regs);
    let mut took = Duration::ZERO;
    for i in 0..n {
        reg.set_cpu(Some((i % 2) as usize)).map_err(|e| e.to_string())?;
        took += pair(&mut reg);
    }
    Ok(report("virtual", &group, n, took, ""))
}

fn wander(n: u64) -> Result<Row, String> {
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
    Ok(report("wander", &group, n, took, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Option<(&'static str, u64)>, String> {
        cli::parse_words(FLAGS, words, |a| config(a).map(|c| (c.scenario, c.n)))
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

    /// The scenarios that need no real CPUs, run short, draw a chart with a bar per scenario; the chart goes
    /// through --svg's file.
    #[test]
    fn short_scenarios_draw_their_chart() {
        let rows = [virtual_lone(200).unwrap(), wander(200).unwrap()];
        assert!(rows.iter().all(|r| r.pairs == 200 && r.ns_per_pair > 0.0));
        let path = std::env::temp_dir().join(format!("mmcid-steal-storm-chart-{}.svg", std::process::id()));
        let path = path.to_str().unwrap();
        chart_of(&rows, "footer line".into()).write(OutFile::create("--svg", path).unwrap()).unwrap();
        let svg = std::fs::read_to_string(path).unwrap();
        std::fs::remove_file(path).unwrap();
        for text in ["virtual", "wander", "steals (until", "footer line", "200 enter+exit pairs"] {
            assert!(svg.contains(text), "no {text:?} in the chart");
        }
    }
}
