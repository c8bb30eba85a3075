//! A live statistics histogram: threads record values (latencies, say) into power-of-two buckets held per CID in
//! a `SharedPerCid`, while the main thread reads every CID's buckets and prints the distribution as it grows. At
//! the end the totals are checked against what the threads recorded, exactly.
//!
//! ```text
//! cargo run --release --example histogram -- [--threads N] [--records N] [--json FILE] [--svg FILE]
//! ```
//!
//! Each recorder is the only writer of its CID's buckets while it holds the guard, so a record is a plain load and
//! store on two atomics (no read-modify-write); the atomics are there so that the reader may load them at any time.
//! Memory follows the CIDs used (the cores' CIDs, and a core's extra ones while a thread is preempted inside its
//! guard), not the threads. Between two records a thread does some work of its own outside the guard, as a
//! program that times requests would.

use mmcid_harness as common;

use common::chart::{self, Chart, Panel, Series, Style};
use common::cli::{self, Args, Flag};
use common::{errln, json_num, outln, OutFile};
use mmcid::{Group, SharedPerCid};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

const USAGE: &str = "\
a live histogram: threads record values into per-CID buckets while the main thread reads them

usage: histogram [options]

  -t, --threads N   recording threads (default 8; at most 8192)
      --records N   values each thread records (default 1000000)
      --json FILE   also write the final histogram as JSON (checked before the run, written at the end)
      --svg FILE    also draw the final histogram (an SVG chart)
  -h, --help        this text

Prints the records seen and the median and 99th percentile every quarter second while the threads record, then
the final histogram, the shards used against the number of threads, and whether every bucket's total is exact;
exits 1 if a total is wrong or a live reading ever went down.
";

/// Every flag of the command line.
const FLAGS: &[Flag] = &[
    Flag::value("--threads", Some("-t")),
    Flag::value("--records", None),
    Flag::value("--json", None),
    Flag::value("--svg", None),
];

/// Buckets: bucket `b < BUCKETS - 1` holds values in `[2^b, 2^(b+1))` (bucket 0 also holds 0); the last one holds
/// everything from `2^(BUCKETS - 1)` up.
const BUCKETS: usize = 20;

/// Generator rounds per value: the recorder's own work between two records, outside the guard.
const WORK: usize = 64;

/// How often the main thread prints a live reading.
const EVERY: Duration = Duration::from_millis(250);

/// One CID's histogram: the bucket counts and the sum of the values recorded (for the mean).
#[derive(Default)]
struct Hist {
    buckets: [AtomicU64; BUCKETS],
    sum: AtomicU64,
}

/// What the command line asks for.
struct Config {
    threads: usize,
    records: u64,
    json: Option<String>,
    svg: Option<String>,
}

fn config(args: &Args) -> Result<Config, String> {
    let threads = args.positive("--threads")?.unwrap_or(8);
    if threads > common::MAX_THREADS {
        return Err(format!("{} {threads}: at most {}", args.spelled("--threads"), common::MAX_THREADS));
    }
    let records = args.positive_u64("--records")?.unwrap_or(1_000_000);
    if (threads as u64).checked_mul(records).is_none() {
        return Err("--threads × --records overflows a 64-bit count".into());
    }
    let (json, svg) = (args.value("--json").map(str::to_string), args.value("--svg").map(str::to_string));
    Ok(Config { threads, records, json, svg })
}

/// The bucket of `value`.
fn bucket(value: u64) -> usize {
    (63 - (value | 1).leading_zeros() as usize).min(BUCKETS - 1)
}

/// The values a thread records: a latency-like spread (mostly hundreds of ns, a long tail up to milliseconds) from
/// a xorshift generator seeded by the thread's number, so each run records the same values.
struct Values(u64);

impl Iterator for Values {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let mut x = self.0;
        for _ in 0..WORK {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        self.0 = x;
        // 64..=1087 ns, times 2^k with k = 0 half the time, 1 a quarter, ...: a geometric tail.
        let base = 64 + (x & 1023);
        let k = ((x >> 32) as u32 | 1 << 12).trailing_zeros();
        Some(base << k)
    }
}

/// One reading of the whole histogram: every CID's buckets summed, while the recorders may be running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Reading {
    buckets: [u64; BUCKETS],
    sum: u64,
}

impl Reading {
    fn of(hist: &SharedPerCid<Hist>) -> Reading {
        let mut r = Reading::default();
        for (_cid, h) in hist {
            for (total, b) in r.buckets.iter_mut().zip(&h.buckets) {
                *total += b.load(Relaxed);
            }
            r.sum = r.sum.wrapping_add(h.sum.load(Relaxed));
        }
        r
    }

    fn records(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The upper end of the bucket holding the `q`-quantile (`q` in 0..=1); `None` before any record.
    fn quantile_below(&self, q: f64) -> Option<u64> {
        let rank = (q * self.records() as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        self.buckets
            .iter()
            .position(|&n| {
                seen += n;
                seen >= rank
            })
            .map(|b| 1u64 << (b + 1))
    }

    /// Whether no bucket of `self` is below `earlier`'s.
    fn covers(&self, earlier: &Reading) -> bool {
        self.buckets.iter().zip(&earlier.buckets).all(|(now, then)| now >= then)
    }
}

/// What a run found.
struct Outcome {
    /// The final reading, after the recorders were joined.
    last: Reading,
    /// What the recorders say they recorded.
    expected: Reading,
    /// Readings taken while recorders were running.
    live: usize,
    /// Whether every live reading covered the one before it (no bucket ever went down).
    monotonic: bool,
    shards: usize,
    elapsed: Duration,
}

/// Runs `cfg`'s recorders in `group`, printing a live reading every `every` while they run (if `print`).
fn run(group: &Group, cfg: &Config, every: Duration, print: bool) -> Outcome {
    let hist: SharedPerCid<Hist> = SharedPerCid::new(group);
    let running = AtomicUsize::new(cfg.threads);
    let start = Instant::now();
    let (expected, live, monotonic) = std::thread::scope(|s| {
        let recorders: Vec<_> = (0..cfg.threads)
            .map(|t| {
                let (hist, running) = (&hist, &running);
                s.spawn(move || {
                    let mut mine = Reading::default();
                    for value in Values(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1)).take(cfg.records as usize) {
                        let b = bucket(value);
                        {
                            let guard = group.enter();
                            let h = hist.get(&guard);
                            // Only this CID's holder writes its buckets: a load and a store, no read-modify-write.
                            h.buckets[b].store(h.buckets[b].load(Relaxed) + 1, Relaxed);
                            h.sum.store(h.sum.load(Relaxed).wrapping_add(value), Relaxed);
                        }
                        mine.buckets[b] += 1;
                        mine.sum = mine.sum.wrapping_add(value);
                    }
                    running.fetch_sub(1, Relaxed);
                    mine
                })
            })
            .collect();
        // The reader: every CID's buckets, summed while the recorders record.
        let (mut last, mut live, mut monotonic) = (Reading::default(), 0, true);
        let mut next = Instant::now();
        while running.load(Relaxed) > 0 {
            let now = Reading::of(&hist);
            monotonic &= now.covers(&last);
            live += 1;
            if print && Instant::now() >= next {
                outln!("{}", line(start.elapsed(), &now));
                next += every;
            }
            last = now;
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut expected = Reading::default();
        for r in recorders {
            let mine = r.join().expect("a recorder panicked");
            for (e, m) in expected.buckets.iter_mut().zip(mine.buckets) {
                *e += m;
            }
            expected.sum = expected.sum.wrapping_add(mine.sum);
        }
        (expected, live, monotonic)
    });
    let elapsed = start.elapsed();
    Outcome { last: Reading::of(&hist), expected, live, monotonic, shards: hist.shards_allocated(), elapsed }
}

/// A live reading's line: time, records, median and 99th percentile.
fn line(at: Duration, r: &Reading) -> String {
    let q = |q| r.quantile_below(q).map_or("-".into(), |v| format!("< {v} ns"));
    format!("{:>7.3} s: {:>11} records, median {:>11}, p99 {:>11}", at.as_secs_f64(), r.records(), q(0.5), q(0.99))
}

/// A bucket's range, `[lo, hi)`.
fn range(b: usize) -> String {
    let lo = if b == 0 { 0 } else { 1u64 << b };
    if b == BUCKETS - 1 {
        format!("[{lo}, ...)")
    } else {
        format!("[{lo}, {})", 1u64 << (b + 1))
    }
}

fn main() -> ExitCode {
    let cfg = cli::parse_or_exit("histogram", USAGE, FLAGS, config);
    // Checked before the run, so that an unwritable path is reported at once; written at the end.
    let files = [("--json", &cfg.json), ("--svg", &cfg.svg)].map(|(flag, path)| {
        path.as_deref().map(|p| {
            OutFile::create(flag, p).unwrap_or_else(|e| {
                errln!("histogram: {e}");
                std::process::exit(1)
            })
        })
    });
    let group = Group::new();
    outln!(
        "{} threads record {} values each into per-CID histograms ({BUCKETS} buckets, SharedPerCid); live readings:",
        cfg.threads,
        cfg.records
    );
    let out = run(&group, &cfg, EVERY, true);
    outln!("{}", line(out.elapsed, &out.last));
    outln!();
    let widest = out.last.buckets.iter().copied().max().unwrap_or(0).max(1);
    outln!("{:>18} {:>11}", "ns", "count");
    for (b, &n) in out.last.buckets.iter().enumerate().filter(|(_, &n)| n > 0) {
        let bar = "#".repeat((n * 40).div_ceil(widest) as usize);
        outln!("{:>18} {n:>11} {bar}", range(b));
    }
    let records = out.last.records();
    outln!();
    outln!(
        "records:          {records} (expected {}), mean {:.0} ns",
        out.expected.records(),
        out.last.sum as f64 / records.max(1) as f64
    );
    outln!(
        "shards allocated: {} for {} threads on {} allowed cores, one per CID ever used (a histogram per thread \
         would make {})",
        out.shards,
        cfg.threads,
        group.cpus().len(),
        cfg.threads
    );
    let stats = group.stats();
    outln!(
        "enters:           {} per-task, {} per-CPU, {} on a core's extra CID and {} temporary (a thread preempted \
         inside its guard holds the core's first CID)",
        stats.enter_task_fast,
        stats.enter_cpu_fast,
        stats.enter_cpu_extra,
        stats.enter_temporary
    );
    outln!(
        "readings:         {} while the threads recorded, every one covering the one before: {}",
        out.live,
        if out.monotonic { "yes" } else { "NO" }
    );
    let mut ok = true;
    let [json, svg] = files;
    if let Some(file) = json {
        let body = format!(
            "{{\"example\":\"histogram\",\"threads\":{},\"records_per_thread\":{},\"shards\":{},\"records\":{records},\
             \"mean_ns\":{},\"buckets\":[{}]}}\n",
            cfg.threads,
            cfg.records,
            out.shards,
            json_num(out.last.sum as f64 / records.max(1) as f64, 1),
            out.last.buckets.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
        );
        if let Err(e) = file.write(&body) {
            errln!("histogram: {e}");
            ok = false;
        }
    }
    if let Some(file) = svg {
        if let Err(e) = chart_of(&cfg, &out.last, chart::footer()).write(file) {
            errln!("histogram: {e}");
            ok = false;
        }
    }
    if out.last != out.expected {
        errln!("histogram: the totals are wrong: read {:?}, recorded {:?}", out.last, out.expected);
        ok = false;
    }
    if !out.monotonic {
        errln!("histogram: a live reading went down in some bucket");
        ok = false;
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The final histogram as a chart: a bar per bucket from the first to the last that holds a record (a log axis:
/// the tail is orders of magnitude below the peak).
fn chart_of(cfg: &Config, r: &Reading, footer: String) -> Chart {
    let used: Vec<usize> = (0..BUCKETS).filter(|&b| r.buckets[b] > 0).collect();
    let (first, last) = (used.first().copied().unwrap_or(0), used.last().copied().unwrap_or(0));
    let series = Series {
        name: "records".into(),
        values: (first..=last).map(|b| Some(chart::Value::plain(r.buckets[b] as f64))).collect(),
    };
    Chart {
        title: format!("histogram: {} threads x {} records, read from the per-CID shards", cfg.threads, cfg.records),
        panels: vec![Panel {
            title: "values recorded per power-of-two bucket".into(),
            x_label: "value, ns: bucket [2^b, 2^(b+1)), labelled by its lower end".into(),
            y_label: "records".into(),
            categories: (first..=last).map(|b| if b == 0 { "0".into() } else { (1u64 << b).to_string() }).collect(),
            series: vec![series],
            style: Style::Bars,
            log_y: true,
        }],
        footer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Option<(usize, u64)>, String> {
        cli::parse_words(FLAGS, words, |a| config(a).map(|c| (c.threads, c.records)))
    }

    /// Defaults, both value spellings; zero, too many threads and an overflowing total are errors naming the
    /// argument; the usage lists every flag.
    #[test]
    fn command_line() {
        assert_eq!(parse(&[]), Ok(Some((8, 1_000_000))));
        assert_eq!(parse(&["--threads", "2", "--records=5"]), Ok(Some((2, 5))));
        assert_eq!(parse(&["-t", "3"]), Ok(Some((3, 1_000_000))));
        assert_eq!(parse(&["--help"]), Ok(None));
        for (words, want) in [
            (&["--records", "0"][..], r#"--records: expected a positive integer, got "0""#),
            (&["--threads", "8193"], "--threads 8193: at most 8192"),
            (&["--threads", "2", "--records", "18446744073709551615"], "--threads × --records overflows"),
            (&["-T", "2"], r#"unknown argument "-T""#),
        ] {
            let e = parse(words).unwrap_err();
            assert!(e.starts_with(want), "{words:?}: {e}");
        }
        assert_eq!(cli::check_usage(USAGE, FLAGS), Ok(()));
    }

    #[test]
    fn buckets_and_quantiles() {
        assert_eq!([0, 1, 2, 3, 4, 1023, 1024].map(bucket), [0, 0, 1, 1, 2, 9, 10]);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(
            (range(0), range(3), range(BUCKETS - 1)),
            ("[0, 2)".into(), "[8, 16)".into(), "[524288, ...)".into())
        );
        let mut r = Reading::default();
        assert_eq!(r.quantile_below(0.5), None);
        r.buckets[3] = 50;
        r.buckets[9] = 49;
        r.buckets[12] = 1;
        assert_eq!(
            (r.quantile_below(0.5), r.quantile_below(0.99), r.quantile_below(1.0)),
            (Some(16), Some(1024), Some(8192))
        );
        let mut later = r;
        assert!(later.covers(&r));
        later.buckets[3] -= 1;
        later.buckets[4] += 1;
        assert!(!later.covers(&r), "a bucket went down");
    }

    /// A short run with readings while 8 threads record: the totals are exact and no reading went down.
    #[test]
    fn a_run_reads_while_recording_and_ends_exact() {
        let group = Group::builder().virtual_cpus(2).build().unwrap();
        let cfg = Config { threads: 8, records: 20_000, json: None, svg: None };
        let out = run(&group, &cfg, EVERY, false);
        assert_eq!(out.last, out.expected);
        assert_eq!(out.last.records(), 160_000);
        assert!(out.monotonic);
        assert!(out.shards <= 8 + 2 * group.cids_per_core(), "{} shards", out.shards);
        // The chart: a bar per bucket from the first used to the last, through --svg's file.
        let path = std::env::temp_dir().join(format!("mmcid-histogram-chart-{}.svg", std::process::id()));
        let path = path.to_str().unwrap();
        chart_of(&cfg, &out.last, "footer line".into()).write(OutFile::create("--svg", path).unwrap()).unwrap();
        let svg = std::fs::read_to_string(path).unwrap();
        std::fs::remove_file(path).unwrap();
        let first = out.last.buckets.iter().position(|&n| n > 0).unwrap();
        let label = if first == 0 { "0".to_string() } else { (1u64 << first).to_string() };
        for text in ["records", "footer line", "8 threads x 20000 records", &label] {
            assert!(svg.contains(text), "no {text:?} in the chart");
        }
    }
}
