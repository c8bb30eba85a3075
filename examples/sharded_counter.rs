//! Counts events from many threads with a `ShardedCounter`: prints the total (and checks it), the shards the
//! counter allocated against the number of threads, and the time.
//!
//! ```text
//! cargo run --release --example sharded_counter -- [--threads N[,N...]] [--iters N] [--json FILE] [--svg FILE]
//! ```
//!
//! Defaults: 8 threads × 1 000 000 adds each. The group's cores are the process's affinity mask, so with more
//! threads than cores the counter holds about one shard per core (per-CPU mode), not one per thread.

use mmcid_harness as common;
use mmcid_harness::peers;

use common::chart::{self, Chart, Panel, Series, Style};
use common::cli::{self, Args, Flag};
use common::{errln, json_num, outln, OutFile};
use mmcid::{Group, ShardedCounter};
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "\
threads counting events through a ShardedCounter

usage: sharded_counter [options]

  -t, --threads LIST   counting threads, or a comma-separated list of counts to run one after the other
                       (default 8; each at most 8192)
      --iters N        adds per thread (default 1000000)
      --json FILE      also write every run as JSON (checked before the runs, written at the end)
      --svg FILE       also draw the CPU time per add and the shards allocated by thread count (an SVG chart)
  -h, --help           this text

Prints, for each thread count, the total (and checks it against threads x adds), the shards the counter
allocated against the number of threads, the time (wall time and adds per second in all; CPU time per add,
summed over the threads, so threads waiting for a core count nothing) and the group's enter counts; exits 1 if a
total is wrong.
";

/// Every flag of the command line.
const FLAGS: &[Flag] = &[
    Flag::value("--threads", Some("-t")),
    Flag::value("--iters", None),
    Flag::value("--json", None),
    Flag::value("--svg", None),
];

/// What the command line asks for.
struct Config {
    /// The thread counts to run, in order.
    threads: Vec<usize>,
    iters: u64,
    json: Option<String>,
    svg: Option<String>,
}

fn config(args: &Args) -> Result<Config, String> {
    let threads = args
        .get("--threads", |list| {
            list.split(',')
                .map(|t| t.trim().parse::<usize>().ok().filter(|&n| n >= 1))
                .collect::<Option<Vec<usize>>>()
                .ok_or_else(|| "expected a positive integer or a comma-separated list of them".to_string())
        })?
        .unwrap_or_else(|| vec![8]);
    let most = threads.iter().copied().max().unwrap_or(1);
    if most > common::MAX_THREADS {
        return Err(format!("{} {most}: at most {}", args.spelled("--threads"), common::MAX_THREADS));
    }
    let iters = args.positive_u64("--iters")?.unwrap_or(1_000_000);
    if (most as u64).checked_mul(iters).is_none() {
        return Err("--threads × --iters overflows a 64-bit count".into());
    }
    let (json, svg) = (args.value("--json").map(str::to_string), args.value("--svg").map(str::to_string));
    Ok(Config { threads, iters, json, svg })
}

/// One run's numbers.
struct Outcome {
    threads: usize,
    total: u64,
    expected: u64,
    shards: usize,
    wall_s: f64,
    /// CPU time per add, summed over the threads, ns.
    cpu_ns_per_add: f64,
}

fn fail(e: String) -> ! {
    errln!("sharded_counter: {e}");
    std::process::exit(1);
}

fn main() -> ExitCode {
    let cfg = cli::parse_or_exit("sharded_counter", USAGE, FLAGS, config);
    // Checked before the runs, so that an unwritable path is reported at once; written at the end.
    let json = cfg.json.as_deref().map(|path| OutFile::create("--json", path).unwrap_or_else(|e| fail(e)));
    let svg = cfg.svg.as_deref().map(|path| OutFile::create("--svg", path).unwrap_or_else(|e| fail(e)));
    let mut outcomes = Vec::new();
    for (i, &threads) in cfg.threads.iter().enumerate() {
        if i > 0 {
            outln!();
        }
        outcomes.push(run(threads, cfg.iters));
    }
    if let Some(file) = json {
        let rows: Vec<String> = outcomes
            .iter()
            .map(|o| {
                format!(
                    "{{\"threads\":{},\"total\":{},\"expected\":{},\"shards\":{},\"wall_s\":{},\"cpu_ns_per_add\":{}}}",
                    o.threads,
                    o.total,
                    o.expected,
                    o.shards,
                    json_num(o.wall_s, 6),
                    json_num(o.cpu_ns_per_add, 3)
                )
            })
            .collect();
        let body = format!(
            "{{\"benchmark\":\"sharded_counter\",\"iters\":{},\"cpus\":{},\"results\":[{}]}}\n",
            cfg.iters,
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            rows.join(",")
        );
        file.write(&body).unwrap_or_else(|e| fail(e));
    }
    if let Some(file) = svg {
        chart_of(&outcomes, cfg.iters, chart::footer()).write(file).unwrap_or_else(|e| fail(e));
    }
    if outcomes.iter().any(|o| o.total != o.expected) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// `threads` threads adding 1 `iters` times each to one counter; prints the run (and a wrong total on stderr).
fn run(threads: usize, iters: u64) -> Outcome {
    let group = Group::new();
    let counter = ShardedCounter::new(&group);
    let expected = threads as u64 * iters;
    let start = Instant::now();
    let done = || format!("{} of {expected} adds", counter.sum());
    // Each thread's own CPU time for its adds: with more threads than cores, wall time also counts the time a
    // thread waited for a core.
    let cpu_ns: u64 = common::with_progress("sharded_counter", done, || {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let began = peers::thread_cpu_ns();
                        for _ in 0..iters {
                            counter.add(1);
                        }
                        peers::thread_cpu_ns() - began
                    })
                })
                .collect();
            handles.into_iter().map(|t| t.join().expect("a counting thread panicked")).sum()
        })
    });
    let elapsed = start.elapsed();
    let total = counter.sum();
    let ops = expected as f64; // at least 1: both factors are
    outln!("threads:          {threads}");
    outln!("allowed cores:    {}", group.cpus().len());
    outln!("total:            {total} (expected {expected})");
    outln!(
        "shards allocated: {} for {threads} threads (a thread-id keyed counter would hold {threads})",
        counter.shards_allocated()
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
    }
    Outcome {
        threads,
        total,
        expected,
        shards: counter.shards_allocated(),
        wall_s: elapsed.as_secs_f64(),
        cpu_ns_per_add: cpu_ns as f64 / ops,
    }
}

/// The runs as a chart by thread count: the CPU time per add, and the shards allocated against the threads (what
/// a counter keyed by thread would hold).
fn chart_of(outcomes: &[Outcome], iters: u64, footer: String) -> Chart {
    let categories: Vec<String> = outcomes.iter().map(|o| o.threads.to_string()).collect();
    let line = |name: &str, f: &dyn Fn(&Outcome) -> f64| Series {
        name: name.into(),
        values: outcomes.iter().map(|o| Some(chart::Value::plain(f(o)))).collect(),
    };
    let panel = |title: &str, y_label: &str, series| Panel {
        title: title.into(),
        x_label: "threads".into(),
        y_label: y_label.into(),
        categories: categories.clone(),
        series,
        style: Style::Lines,
        log_y: false,
    };
    Chart {
        title: format!("sharded_counter: {iters} adds per thread"),
        panels: vec![
            panel(
                "CPU time per add (the threads' CPU time summed)",
                "ns per add (lower is better)",
                vec![line("ShardedCounter::add", &|o| o.cpu_ns_per_add)],
            ),
            panel(
                "shards allocated",
                "shards",
                vec![
                    line("ShardedCounter", &|o| o.shards as f64),
                    line("a counter keyed by thread", &|o| o.threads as f64),
                ],
            ),
        ],
        footer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Option<(Vec<usize>, u64)>, String> {
        cli::parse_words(FLAGS, words, |a| config(a).map(|c| (c.threads, c.iters)))
    }

    /// Defaults, both spellings; zero adds or threads (whose time per add would be nonsense), too many threads
    /// and an overflowing total are errors naming the argument; the usage lists every flag.
    #[test]
    fn command_line() {
        assert_eq!(parse(&[]), Ok(Some((vec![8], 1_000_000))));
        assert_eq!(parse(&["-t", "2", "--iters=5"]), Ok(Some((vec![2], 5))));
        assert_eq!(parse(&["-t", "1,2,8"]), Ok(Some((vec![1, 2, 8], 1_000_000))));
        assert_eq!(parse(&["--threads", "8192"]), Ok(Some((vec![8192], 1_000_000))));
        assert_eq!(parse(&["--help"]), Ok(None));
        for (words, want) in [
            (&["--iters", "0"][..], r#"--iters: expected a positive integer, got "0""#),
            (&["-t", "0"], r#"-t: expected a positive integer or a comma-separated list of them, got "0""#),
            (&["-t", "1,,2"], r#"-t: expected a positive integer or a comma-separated list of them, got "1,,2""#),
            (&["--threads", "1,8193"], "--threads 8193: at most 8192"),
            (&["--threads", "8193"], "--threads 8193: at most 8192"),
            (&["--threads", "2", "--iters", "18446744073709551615"], "--threads × --iters overflows"),
            (&["8"], r#"unexpected argument "8""#),
        ] {
            let e = parse(words).unwrap_err();
            assert!(e.starts_with(want), "{words:?}: {e}");
        }
        assert_eq!(cli::check_usage(USAGE, FLAGS), Ok(()));
    }

    /// Two short runs draw a chart with both thread counts and the three lines; the chart goes through --svg's file.
    #[test]
    fn short_runs_draw_their_chart() {
        let path = std::env::temp_dir().join(format!("mmcid-sharded-counter-chart-{}.svg", std::process::id()));
        let path = path.to_str().unwrap();
        let outcomes = [run(1, 1000), run(3, 1000)];
        assert!(outcomes.iter().all(|o| o.total == o.expected && o.shards >= 1));
        chart_of(&outcomes, 1000, "footer line".into()).write(OutFile::create("--svg", path).unwrap()).unwrap();
        let svg = std::fs::read_to_string(path).unwrap();
        std::fs::remove_file(path).unwrap();
        for text in ["ShardedCounter::add", "a counter keyed by thread", "shards allocated", "footer line", "3"] {
            assert!(svg.contains(text), "no {text:?} in the chart");
        }
    }
}
