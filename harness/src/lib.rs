//! What mmcid's examples and benches share: the command line ([`cli`]), output that ends quietly on a closed pipe
//! ([`outln!`]), progress on stderr, statistics (paired costs, a distribution-free confidence interval for their
//! median, the goal verdicts) and tables for the benchmark examples (`hackbench`, `thread_pools`), their charts
//! (`--svg`, [`chart`]) and output files ([`OutFile`]), the thread limit for all of them ([`MAX_THREADS`]); the
//! examples' peers ([`peers`]); and the criterion benches' harness
//! ([`mod@bench`]). A workspace crate the examples and benches use as a dev-dependency
//! (`use mmcid_harness as common;`), not published.

/// `println!` for the examples' output: through [`write_out`], so a closed pipe ends the program quietly.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` through [`write_out`].
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_out(format_args!($($arg)*))
    };
}

/// `eprintln!` for the examples' messages and progress: through [`write_err`], so a closed stderr is no panic.
#[macro_export]
macro_rules! errln {
    () => {
        $crate::write_err(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::write_err(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprint!` through [`write_err`].
#[macro_export]
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::write_err(format_args!($($arg)*))
    };
}

pub mod bench;
pub mod chart;
pub mod cli;
mod median;
pub mod peers;
pub use median::median;

/// Writes to stderr, ignoring errors: a message or a progress line that cannot be shown (stderr closed, as in
/// `example 2>&1 | head`) is dropped instead of panicking; stdout's own closing ends the program ([`write_out`]).
pub fn write_err(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = std::io::stderr().write_fmt(args);
}

/// Writes to stdout and flushes. When stdout is a closed pipe (`hackbench | head -3`) the program ends at once,
/// quietly, with status 141 (128 + SIGPIPE, as a command-line tool killed by SIGPIPE reports it; Rust ignores the
/// signal, which would make `println!` panic); another write error ends it with a message and status 1.
pub fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(128 + libc::SIGPIPE),
        Err(e) => {
            errln!("cannot write to stdout: {e}");
            std::process::exit(1);
        }
    }
}

/// The most threads an example starts at once: a larger request is a usage error, not a failed spawn halfway
/// through. It is below the usual limits on threads (`kernel.threads-max`, `pid_max`), but not below every limit
/// an example can reach with it: `hackbench` needs one descriptor per thread (2 × fds × groups channel ends), more
/// than the common soft limit of 1024 at this many threads, and one message buffer per thread, so it checks
/// RLIMIT_NOFILE and bounds the buffers' total itself.
pub const MAX_THREADS: usize = 8192;

/// The command-line words after the program name; an error naming the first word that is not valid UTF-8 (every
/// option and value here is text).
pub fn args() -> Result<Vec<String>, String> {
    utf8_args(std::env::args_os().skip(1))
}

/// [`args`] over any words.
fn utf8_args(words: impl Iterator<Item = std::ffi::OsString>) -> Result<Vec<String>, String> {
    words
        .enumerate()
        .map(|(i, word)| {
            word.into_string()
                .map_err(|bad| format!("argument {} ({:?}) is not valid UTF-8", i + 1, bad.to_string_lossy()))
        })
        .collect()
}

/// The policy names a `--compare` runs, in table order.
pub const POLICIES: [&str; 6] = ["none", "mutex", "bitmap", "lazy-all", "lazy-visited", "mmcid"];

/// The index of policy `name` in [`POLICIES`], or an error listing them.
pub fn policy_index(name: &str) -> Result<usize, String> {
    POLICIES
        .iter()
        .position(|p| *p == name)
        .ok_or_else(|| format!("unknown policy {name:?} (expected one of {})", POLICIES.join(", ")))
}

/// A `--policies` list: comma-separated names of [`POLICIES`], each at most once, naming `none` (the baseline
/// of every percentage) and `mmcid` (what the goal judges). Returned as indexes in table order, so `none` is
/// first and `mmcid` last.
pub fn parse_policies(list: &str) -> Result<Vec<usize>, String> {
    let mut picked = [false; POLICIES.len()];
    for name in list.split(',').map(str::trim) {
        let p = policy_index(name).map_err(|e| format!("--policies: {e}"))?;
        if std::mem::replace(&mut picked[p], true) {
            return Err(format!("--policies: {name} named twice"));
        }
    }
    if !picked[0] || !picked[POLICIES.len() - 1] {
        return Err("--policies must name none (the baseline) and mmcid (what the goal judges)".into());
    }
    Ok((0..POLICIES.len()).filter(|&p| picked[p]).collect())
}

/// Resolves `--compare`, `--policy` and `--policies`: whether the run is a comparison (the default without
/// `--policy`) and the policies it compares (every one without `--policies`). `--policy` is a single run, so it
/// goes with neither of the others.
pub fn compare_mode(
    compare: bool,
    policy: Option<usize>,
    policies: Option<Vec<usize>>,
) -> Result<(bool, Vec<usize>), String> {
    if policy.is_some() && compare {
        return Err("--compare and --policy exclude each other: --policy is a single run of one policy".into());
    }
    if policy.is_some() && policies.is_some() {
        return Err("--policies lists the policies of a comparison: use it without --policy".into());
    }
    Ok((policy.is_none(), policies.unwrap_or_else(|| (0..POLICIES.len()).collect())))
}

/// The order in which repeat `rep` runs `n` policies (indexes 0..n): the rows of a balanced Latin square (a
/// Williams design), one per repeat. Over every `order_cycle(n)` repeats each policy runs in each position equally
/// often and right after each other policy equally often (once for even n, twice for odd n, whose square is
/// followed by its mirror), so a carry-over from one run into the next (caches, scheduler state, the machine's
/// load) falls on every policy alike instead of always on the same successor, as a plain rotation did. A number of
/// repeats that is not a multiple of the cycle (the defaults: 9 and 11 repeats of 6 policies) leaves the last,
/// partial cycle nearly but not exactly balanced.
pub fn run_order(n: usize, rep: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    // First row 0, 1, n-1, 2, n-2, ...; row r adds r to each entry (mod n).
    let first = (0..n).map(|j| if j % 2 == 1 { j.div_ceil(2) } else { (n - j / 2) % n });
    let row = rep % order_cycle(n);
    let mut order: Vec<usize> = first.map(|p| (p + row) % n).collect();
    if row >= n {
        order.reverse(); // odd n: the mirror half of the design
    }
    order
}

/// The repeats after which [`run_order`] starts over: n for an even number of policies, 2n for an odd one.
pub fn order_cycle(n: usize) -> usize {
    if n % 2 == 0 {
        n.max(1)
    } else {
        2 * n
    }
}

/// The names of the policies `policies` (indexes into [`POLICIES`]) picks.
pub fn policy_names(policies: &[usize]) -> Vec<&'static str> {
    policies.iter().map(|&p| POLICIES[p]).collect()
}

/// Mean and standard error of the paired differences `other[r] - base[r]` (pairs past the shorter slice are
/// ignored); None with fewer than two pairs or a value that is not finite. For a quantity measured coarsely in each
/// run (user time, which the kernel splits from system time at each tick) whose average is still meaningful.
pub fn paired_mean_se(base: &[f64], other: &[f64]) -> Option<(f64, f64)> {
    let d: Vec<f64> = base.iter().zip(other).map(|(b, o)| o - b).collect();
    if d.len() < 2 || !d.iter().all(|x| x.is_finite()) {
        return None;
    }
    let n = d.len() as f64;
    let mean = d.iter().sum::<f64>() / n;
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    Some((mean, (var / n).sqrt()))
}

/// Prints `title`, then one row per label with each policy's (mean, standard error) past the first (the baseline),
/// as `+m.m +/- s.s`, or `n/a`.
pub fn print_mean_se_table(
    title: &str,
    heading: &str,
    labels: &[String],
    policies: &[&str],
    cells: &[Vec<Option<(f64, f64)>>],
) {
    let text = |cell: &Option<(f64, f64)>| cell.map_or_else(|| "n/a".into(), |(m, se)| format!("{m:+.1} +/- {se:.1}"));
    let rows: Vec<(Vec<String>, String)> =
        cells.iter().map(|row| (row.iter().skip(1).map(text).collect(), String::new())).collect();
    print_versus_baseline(title, heading, labels, policies, &rows, "");
}

/// The median of every cell's runs: `runs[cell][policy]` → `medians[cell][policy]`.
pub fn medians(runs: &[Vec<Vec<f64>>]) -> Vec<Vec<f64>> {
    runs.iter().map(|row| row.iter().map(|v| median(v)).collect()).collect()
}

/// `t` relative to `base`, in percent.
pub fn pct(t: f64, base: f64) -> f64 {
    (t - base) / base * 100.0
}

/// `s` as a JSON string literal.
pub fn json_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

// ---------------------------------------------------------------------------------------------------------------
// Paired differences and a distribution-free confidence interval for their median
//
// Each repeat runs every policy once, back to back, so the runs of one repeat saw nearly the same machine load.
// The paired cost d_r = cost(P, r) versus the baseline's run of the same repeat cancels the slow drift of that
// load; the median of the d_r gets a confidence interval from order statistics (the sign test's interval), which
// assumes nothing about the distribution of the d_r beyond independence between repeats.

/// Coverage the verdicts ask of a median's confidence interval.
pub const CI_LEVEL: f64 = 0.90;

/// Paired cost of a time `t` against the baseline's time `base` of the same repeat, in percent (positive = slower).
pub fn time_cost_pct(t: f64, base: f64) -> f64 {
    (t / base - 1.0) * 100.0
}

/// Paired cost of a throughput `thr` against the baseline's `base` of the same repeat, in percent of the
/// baseline's throughput (positive = slower).
pub fn throughput_cost_pct(thr: f64, base: f64) -> f64 {
    (1.0 - thr / base) * 100.0
}

/// `cost(runs[r], base[r])` for every repeat `r` both have, dropping values that are not finite (a zero baseline).
pub fn paired_pct(runs: &[f64], base: &[f64], cost: fn(f64, f64) -> f64) -> Vec<f64> {
    runs.iter().zip(base).map(|(&x, &b)| cost(x, b)).filter(|d| d.is_finite()).collect()
}

/// P(Bin(n, 1/2) <= k), summed in log space so that large `n` neither overflows nor underflows.
pub fn binomial_half_cdf(n: usize, k: usize) -> f64 {
    if k >= n {
        return 1.0;
    }
    let ln_half_pow_n = -(n as f64) * std::f64::consts::LN_2;
    let (mut ln_choose, mut sum) = (0.0, 0.0); // ln C(n, 0) = 0
    for i in 0..=k {
        if i > 0 {
            ln_choose += ((n - i + 1) as f64 / i as f64).ln();
        }
        sum += (ln_choose + ln_half_pow_n).exp();
    }
    sum.min(1.0)
}

/// Coverage of the interval from the k-th smallest to the k-th largest of `n` samples as an interval for their
/// distribution's median: 1 - 2 P(Bin(n, 1/2) <= k - 1), for 1 <= k <= (n + 1) / 2 (0 outside that range).
pub fn median_ci_coverage(n: usize, k: usize) -> f64 {
    if k == 0 || 2 * k > n + 1 {
        return 0.0;
    }
    (1.0 - 2.0 * binomial_half_cdf(n, k - 1)).max(0.0)
}

/// The fewest samples whose widest interval (minimum to maximum) reaches coverage `level` (< 1).
pub fn min_samples_for(level: f64) -> usize {
    (1..64).find(|&n| median_ci_coverage(n, 1) >= level).unwrap_or(64)
}

/// A sample's median with a confidence interval for its distribution's median.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MedianCi {
    pub median: f64,
    /// The k-th smallest sample.
    pub lo: f64,
    /// The k-th largest sample.
    pub hi: f64,
    /// The interval's coverage (below the level asked for when the sample is too small to reach it).
    pub coverage: f64,
    /// The number of samples.
    pub n: usize,
}

/// The median of `v` with the tightest symmetric pair of order statistics (k-th smallest, k-th largest) whose
/// coverage is still at least `level`; with too few samples for that, the minimum and maximum with the coverage
/// they have. None for an empty sample.
pub fn median_ci(v: &[f64], level: f64) -> Option<MedianCi> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return None;
    }
    let k = (1..=n.div_ceil(2)).take_while(|&k| median_ci_coverage(n, k) >= level).last().unwrap_or(1);
    Some(MedianCi { median: median(&s), lo: s[k - 1], hi: s[n - k], coverage: median_ci_coverage(n, k), n })
}

/// The paired costs of `runs` against `base` (see `paired_pct`) with the `CI_LEVEL` interval of their median.
pub fn paired_ci(runs: &[f64], base: &[f64], cost: fn(f64, f64) -> f64) -> Option<MedianCi> {
    median_ci(&paired_pct(runs, base, cost), CI_LEVEL)
}

/// A goal "cost <= budget" judged from a confidence interval of the median cost. Ordered from best to worst, so
/// the overall verdict over several cells is the maximum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// The whole interval is at or under the budget.
    Met,
    /// The interval contains the budget.
    Inconclusive,
    /// Too few samples for an interval of the asked coverage.
    TooFewRepeats,
    /// The whole interval is over the budget.
    NotMet,
}

impl Verdict {
    /// The verdict on a cost whose median has interval `ci` (None: no samples), against `budget` percent.
    pub fn judge(ci: Option<&MedianCi>, budget: f64) -> Verdict {
        match ci {
            None => Verdict::TooFewRepeats,
            Some(ci) if ci.coverage < CI_LEVEL => Verdict::TooFewRepeats,
            Some(ci) if ci.hi <= budget => Verdict::Met,
            Some(ci) if ci.lo > budget => Verdict::NotMet,
            Some(_) => Verdict::Inconclusive,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::NotMet => "NOT met",
            Verdict::Inconclusive | Verdict::TooFewRepeats => "inconclusive",
        }
    }

    /// The verdict with its reason, e.g. `met (CI [-1.20%, +1.85%])`.
    pub fn explain(self, ci: Option<&MedianCi>) -> String {
        let Some(ci) = ci else { return "inconclusive (no valid paired runs)".into() };
        let bounds = format!("CI [{:+.2}%, {:+.2}%]", ci.lo, ci.hi);
        match self {
            Verdict::Met | Verdict::NotMet => format!("{} ({bounds})", self.word()),
            Verdict::Inconclusive => format!("inconclusive ({bounds} straddles the budget; more --repeats narrow it)"),
            Verdict::TooFewRepeats => format!(
                "inconclusive ({} repeats: {:.1}% coverage at most; a {:.0}% CI needs --repeats {} or more)",
                ci.n,
                ci.coverage * 100.0,
                CI_LEVEL * 100.0,
                min_samples_for(CI_LEVEL)
            ),
        }
    }
}

/// The worst of several cells' verdicts (Met for none).
pub fn overall(verdicts: &[Verdict]) -> Verdict {
    verdicts.iter().copied().max().unwrap_or(Verdict::Met)
}

/// Prints one line per cell, `{indent}{label}: {verdict with reason}`, and returns the overall verdict.
pub fn print_verdicts(indent: &str, labels: &[String], cis: &[Option<MedianCi>], budget: f64) -> Verdict {
    let width = labels.iter().map(String::len).max().unwrap_or(0) + 1;
    let mut verdicts = Vec::new();
    for (label, ci) in labels.iter().zip(cis) {
        let v = Verdict::judge(ci.as_ref(), budget);
        outln!("{indent}{:<width$} {}", format!("{label}:"), v.explain(ci.as_ref()));
        verdicts.push(v);
    }
    overall(&verdicts)
}

// ---------------------------------------------------------------------------------------------------------------
// Tables (at most 120 columns for six policies)

/// Prints `rows` as a table after `indent`: the first column left-aligned, the others right-aligned, every column
/// as wide as its widest cell and separated from the next by two spaces, so no cell runs into its neighbour.
pub fn print_columns(indent: &str, rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            let w = cell.chars().count();
            match widths.get_mut(i) {
                Some(width) => *width = (*width).max(w),
                None => widths.push(w),
            }
        }
    }
    for row in rows {
        let mut line = String::from(indent);
        for (i, cell) in row.iter().enumerate() {
            let w = widths[i];
            if i == 0 {
                line.push_str(&format!("{cell:<w$}"));
            } else {
                line.push_str(&format!("  {cell:>w$}"));
            }
        }
        outln!("{}", line.trim_end());
    }
}

/// Prints `title`, then one row per label with each policy's median (`decimals` decimals) and its % versus the
/// first policy's.
pub fn print_median_table(
    title: &str,
    heading: &str,
    labels: &[String],
    policies: &[&str],
    medians: &[Vec<f64>],
    decimals: usize,
) {
    outln!("{title}");
    let mut rows = vec![std::iter::once(heading).chain(policies.iter().copied()).map(String::from).collect()];
    for (label, row) in labels.iter().zip(medians) {
        let cells = row.iter().map(|&m| {
            // A zero baseline (e.g. no involuntary switch at all in `none`'s runs) has no percentage.
            let vs = if row[0] > 0.0 { format!("{:+.2}%", pct(m, row[0])) } else { "n/a".into() };
            format!("{m:.decimals$} ({vs})")
        });
        rows.push(std::iter::once(label.clone()).chain(cells).collect());
    }
    print_columns("", &rows);
}

/// `+1.4 [-0.5,+3.2]`: a median and its interval, in percent, one decimal.
pub fn ci_cell(ci: Option<&MedianCi>) -> String {
    match ci {
        Some(c) => format!("{:+.1} [{:+.1},{:+.1}]", c.median, c.lo, c.hi),
        None => "n/a".into(),
    }
}

/// Prints `title`, then one row per label with each policy's paired median cost and interval versus the first
/// policy (which is left out: its cost is 0 by definition), then the coverage of the row's intervals.
pub fn print_paired_table(
    title: &str,
    heading: &str,
    labels: &[String],
    policies: &[&str],
    cis: &[Vec<Option<MedianCi>>],
) {
    let rows: Vec<(Vec<String>, String)> = cis
        .iter()
        .map(|row| {
            let coverage = row[1..].iter().flatten().map(|c| c.coverage).fold(f64::NAN, f64::min);
            let coverage = if coverage.is_nan() { "n/a".into() } else { format!("{:.1}%", coverage * 100.0) };
            (row[1..].iter().map(|ci| ci_cell(ci.as_ref())).collect(), coverage)
        })
        .collect();
    print_versus_baseline(title, heading, labels, policies, &rows, "CI cov");
}

/// Prints `title`, then a column per policy past the first (the baseline, which has no cell) and a row per label:
/// `rows[i]` holds row i's cell texts and the text of a last column headed `last` (none if `last` is empty).
fn print_versus_baseline(
    title: &str,
    heading: &str,
    labels: &[String],
    policies: &[&str],
    rows: &[(Vec<String>, String)],
    last: &str,
) {
    outln!("{title}");
    let tail = |text: &str| (!last.is_empty()).then(|| text.to_string());
    let mut table = vec![std::iter::once(heading)
        .chain(policies[1..].iter().copied())
        .map(String::from)
        .chain(tail(last))
        .collect::<Vec<_>>()];
    for (label, (cells, end)) in labels.iter().zip(rows) {
        table.push(std::iter::once(label.clone()).chain(cells.iter().cloned()).chain(tail(end)).collect());
    }
    print_columns("", &table);
}

/// Run-to-run spread (max - min) of `v` in percent of its median.
pub fn spread_pct(v: &[f64]) -> f64 {
    let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &t| (lo.min(t), hi.max(t)));
    (hi - lo) / median(v) * 100.0
}

/// `x` as a JSON number with `decimals` decimals, or `null` when it is not finite.
pub fn json_num(x: f64, decimals: usize) -> String {
    if x.is_finite() {
        format!("{x:.decimals$}")
    } else {
        "null".into()
    }
}

/// `v` as the inside of a JSON array: each number with `decimals` decimals, `null` where it is not finite.
pub fn json_list(v: &[f64], decimals: usize) -> String {
    v.iter().map(|&x| json_num(x, decimals)).collect::<Vec<_>>().join(",")
}

/// `"{prefix}{median_key}":..,"{prefix}vs_none_pct":..`: a median (`decimals` decimals) and its difference
/// versus the baseline's median `base` in percent (3 decimals). Either is `null` when it is not finite: an empty
/// sample's median, or a baseline median of zero or NaN (e.g. no thread created in a very short run).
pub fn json_median_vs(prefix: &str, median_key: &str, m: f64, base: f64, decimals: usize) -> String {
    format!("\"{prefix}{median_key}\":{},\"{prefix}vs_none_pct\":{}", json_num(m, decimals), json_num(pct(m, base), 3))
}

/// An output file of a run (`--json FILE`, `--svg FILE`). Checked before the run (it can be written, and it is not a
/// directory), written only at the end. A regular file (or a new one) is written into `FILE.<pid>.tmp`, made fresh (never through an existing
/// file or link of that name), which is then renamed over `FILE`, so a run that fails or is killed leaves an earlier
/// `FILE` as it was; anything else that exists (`/dev/stdout`, a pipe) is written in place.
#[derive(Debug)]
pub struct OutFile {
    path: std::path::PathBuf,
    /// `None`: write `path` in place.
    tmp: Option<std::path::PathBuf>,
}

impl OutFile {
    /// Checks that `path` can be written (by making and removing its temporary, or opening it for writing if it
    /// is not a regular file); the error names the path (and `flag`, the option that gave it, for an empty one).
    pub fn create(flag: &str, path: &str) -> Result<OutFile, String> {
        if path.is_empty() {
            return Err(format!("{flag}: an empty file name"));
        }
        let target = std::path::Path::new(path);
        match std::fs::metadata(target) {
            Ok(m) if m.is_dir() => return Err(format!("cannot write {path}: it is a directory")),
            Ok(m) if !m.is_file() => {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(target)
                    .map_err(|e| format!("cannot write {path}: {e}"))?;
                return Ok(OutFile { path: path.into(), tmp: None });
            }
            _ => {}
        }
        let tmp = std::path::PathBuf::from(format!("{path}.{}.tmp", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|_| std::fs::remove_file(&tmp))
            .map_err(|e| format!("cannot write {path} (tried {}): {e}", tmp.display()))?;
        Ok(OutFile { path: path.into(), tmp: Some(tmp) })
    }

    /// Writes `body` as the whole file (see the type). On an error the temporary is removed and `FILE` is left as
    /// it was.
    pub fn write(self, body: &str) -> Result<(), String> {
        use std::io::Write;
        let Some(tmp) = &self.tmp else {
            return std::fs::OpenOptions::new()
                .write(true)
                .open(&self.path)
                .and_then(|mut f| f.write_all(body.as_bytes()))
                .map_err(|e| format!("cannot write {}: {e}", self.path.display()));
        };
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp)
            .and_then(|mut f| f.write_all(body.as_bytes()).and_then(|()| f.sync_all()))
            .and_then(|()| std::fs::rename(tmp, &self.path));
        written.map_err(|e| {
            let _ = std::fs::remove_file(tmp);
            format!("cannot write {}: {e}", self.path.display())
        })
    }
}

/// `"{prefix}median_pct":..,"{prefix}ci_lo_pct":..,"{prefix}ci_hi_pct":..,"{prefix}ci_coverage":..` (nulls for
/// no interval): a paired cost's JSON fields.
pub fn json_paired(prefix: &str, ci: Option<&MedianCi>) -> String {
    let f = |get: fn(&MedianCi) -> f64, d| ci.map_or("null".into(), |c| json_num(get(c), d));
    format!(
        "\"{prefix}median_pct\":{},\"{prefix}ci_lo_pct\":{},\"{prefix}ci_hi_pct\":{},\"{prefix}ci_coverage\":{}",
        f(|c| c.median, 3),
        f(|c| c.lo, 3),
        f(|c| c.hi, 3),
        f(|c| c.coverage, 4)
    )
}

/// The progress of a `--compare` run, on stderr: one line rewritten in place (`\r`) on a terminal; elsewhere (a
/// log, CI) a line at the first run, at each further tenth of the runs and whenever [`LOG_EVERY`] passed since the
/// last line, instead of one very long line.
pub struct Progress {
    total: usize,
    done: usize,
    began: std::time::Instant,
    /// When the last line went to a log.
    logged: std::time::Instant,
    terminal: bool,
}

/// The longest a log goes without a progress line while runs start.
pub const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

impl Progress {
    pub fn new(total: usize) -> Progress {
        use std::io::IsTerminal;
        let now = std::time::Instant::now();
        Progress { total, done: 0, began: now, logged: now, terminal: std::io::stderr().is_terminal() }
    }

    /// Counts the run about to start, described by `what`.
    pub fn step(&mut self, what: std::fmt::Arguments<'_>) {
        self.done += 1;
        let (done, total, s) = (self.done, self.total, self.began.elapsed().as_secs_f64());
        let line = format!("[{done:>3}/{total}] {what} elapsed {s:>5.1}s");
        if self.terminal {
            err!("\r{line} ");
        } else if milestone(done, total) || self.logged.elapsed() >= LOG_EVERY {
            errln!("{line}");
            self.logged = std::time::Instant::now();
        }
    }

    /// Ends the in-place line, before an error message.
    pub fn interrupt(&self) {
        if self.terminal {
            errln!();
        }
    }

    pub fn finish(self) {
        let line = format!("done: {} runs in {:.1}s", self.done, self.began.elapsed().as_secs_f64());
        if self.terminal {
            errln!("\r{line:<70}");
        } else {
            errln!("{line}");
        }
    }
}

/// When [`with_progress`] first reports a run that has not ended, and then how often.
pub const PROGRESS_AFTER: std::time::Duration = std::time::Duration::from_secs(3);
pub const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs `work` on the calling thread while a helper thread reports on stderr, [`PROGRESS_AFTER`] after the start
/// and then every [`PROGRESS_EVERY`] until `work` returns: `NAME: DETAIL, N s elapsed` (`detail()` may say how far
/// the run is; an empty detail is left out), rewritten in place on a terminal, one line each time in a log. A run
/// shorter than [`PROGRESS_AFTER`] prints nothing. The helper sleeps between reports, so the run it watches pays
/// nothing else.
pub fn with_progress<R>(name: &str, detail: impl Fn() -> String + Sync, work: impl FnOnce() -> R) -> R {
    std::thread::scope(|s| {
        // Dropped when `work` returns or unwinds: the helper stops waiting and the scope joins it.
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let detail = &detail;
        s.spawn(move || report_until(name, detail, &stopped));
        let result = work();
        drop(stop);
        result
    })
}

/// The helper of [`with_progress`]: reports until `stopped` is disconnected.
fn report_until(name: &str, detail: &dyn Fn() -> String, stopped: &std::sync::mpsc::Receiver<()>) {
    use std::io::IsTerminal;
    use std::sync::mpsc::RecvTimeoutError;
    let (began, terminal) = (std::time::Instant::now(), std::io::stderr().is_terminal());
    let (mut next, mut reported) = (PROGRESS_AFTER, false);
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(next.saturating_sub(began.elapsed())) {
        let line = progress_line(name, &detail(), began.elapsed());
        if terminal {
            err!("\r{line} ");
        } else {
            errln!("{line}");
        }
        reported = true;
        next += PROGRESS_EVERY;
    }
    if reported && terminal {
        errln!();
    }
}

/// `NAME: DETAIL, N s elapsed`, or `NAME: N s elapsed` for an empty detail.
pub fn progress_line(name: &str, detail: &str, elapsed: std::time::Duration) -> String {
    let sep = if detail.is_empty() { "" } else { ", " };
    format!("{name}: {detail}{sep}{:.0} s elapsed", elapsed.as_secs_f64())
}

/// Whether run `done` (1-based) of `total` gets a progress line in a log: the first, and each that starts a new
/// tenth.
fn milestone(done: usize, total: usize) -> bool {
    let total = total.max(1);
    done == 1 || done * 10 / total != (done - 1) * 10 / total
}

/// Test-only helpers shared by the examples' tests.
pub mod testing {
    use mmcid_policies::{NoCid, Policy};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Starts `f()` on another thread; the returned wait gives its result, or an error if it has not returned
    /// 20 s after the wait began (so that a call that waits for ever fails the test instead of hanging it).
    pub fn spawn_bounded<T: Send + 'static>(
        f: impl FnOnce() -> T + Send + 'static,
    ) -> impl FnOnce() -> Result<T, &'static str> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        move || rx.recv_timeout(Duration::from_secs(20)).map_err(|_| "still waiting after 20 s")
    }

    /// `f()` on another thread, given at most 20 s.
    pub fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, &'static str> {
        spawn_bounded(f)()
    }

    /// Like [`spawn_bounded`], but returns only once `f` sleeps in the kernel (state `S` in
    /// `/proc/self/task/TID/stat`): a test of what frees a thread blocked in a system call then knows it is
    /// blocked, instead of sleeping and hoping. `f` must block in its first system call; panics if it has not
    /// after 10 s. Without Linux's `/proc` it gives `f` 200 ms to get there.
    #[cfg(not(target_os = "linux"))]
    pub fn spawn_blocked<T: Send + 'static>(
        f: impl FnOnce() -> T + Send + 'static,
    ) -> impl FnOnce() -> Result<T, &'static str> {
        let wait = spawn_bounded(f);
        std::thread::sleep(Duration::from_millis(200));
        wait
    }

    /// See the other platforms' `spawn_blocked` above.
    #[cfg(target_os = "linux")]
    pub fn spawn_blocked<T: Send + 'static>(
        f: impl FnOnce() -> T + Send + 'static,
    ) -> impl FnOnce() -> Result<T, &'static str> {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let wait = spawn_bounded(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            f()
        });
        let tid = tid_rx.recv_timeout(Duration::from_secs(10)).expect("the thread started");
        let path = format!("/proc/self/task/{tid}/stat");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            // The state follows the command name, which is in parentheses and may itself contain ") ".
            let state = std::fs::read_to_string(&path)
                .ok()
                .and_then(|stat| stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()));
            if state == Some('S') {
                return wait;
            }
            assert!(std::time::Instant::now() < deadline, "thread {tid} did not block within 10 s (state {state:?})");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The baseline's CIDs, but the `thread_at`-th `thread` or the `enter_at`-th `enter` (over all threads, from
    /// 0) panics: a short-lived thread failing in the middle of a run.
    pub struct PanicAt {
        inner: NoCid,
        thread_at: usize,
        enter_at: usize,
        threads: AtomicUsize,
        enters: AtomicUsize,
    }

    impl PanicAt {
        pub fn new(thread_at: usize, enter_at: usize) -> PanicAt {
            PanicAt {
                inner: NoCid::new(),
                thread_at,
                enter_at,
                threads: AtomicUsize::new(0),
                enters: AtomicUsize::new(0),
            }
        }
    }

    impl Policy for PanicAt {
        type Thread = <NoCid as Policy>::Thread;
        type Guard<'a> = <NoCid as Policy>::Guard<'a>;
        fn name(&self) -> &'static str {
            "panic-at"
        }
        fn thread(&self, cpu: Option<usize>) -> Self::Thread {
            if self.threads.fetch_add(1, Ordering::Relaxed) == self.thread_at {
                panic!("injected panic in thread {}", self.thread_at);
            }
            self.inner.thread(cpu)
        }
        fn enter<'a>(&'a self, thread: &'a mut Self::Thread) -> Self::Guard<'a> {
            if self.enters.fetch_add(1, Ordering::Relaxed) == self.enter_at {
                panic!("injected panic at enter {}", self.enter_at);
            }
            self.inner.enter(thread)
        }
        fn cids_in_use(&self) -> usize {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every repeat's order is a permutation; over one cycle each policy holds each position equally often and
    /// follows each other policy equally often (a plain rotation fails the latter: 0 always follows n-1).
    #[test]
    fn run_order_is_a_balanced_latin_square() {
        assert_eq!(run_order(0, 3), Vec::<usize>::new());
        assert_eq!(run_order(1, 5), [0]);
        assert_eq!((0..2).map(|r| run_order(2, r)).collect::<Vec<_>>(), [[0, 1], [1, 0]]);
        assert_eq!(run_order(4, 0), [0, 1, 3, 2]);
        for n in 2..=7 {
            let cycle = order_cycle(n);
            let (mut position, mut follows) = (vec![vec![0; n]; n], vec![vec![0; n]; n]);
            for rep in 0..cycle {
                let order = run_order(n, rep);
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n {n} rep {rep}: {order:?}");
                assert_eq!(run_order(n, rep + cycle), order, "the cycle repeats");
                for (i, &p) in order.iter().enumerate() {
                    position[p][i] += 1;
                }
                for w in order.windows(2) {
                    follows[w[0]][w[1]] += 1;
                }
            }
            let times = cycle / n;
            assert!(position.iter().flatten().all(|&c| c == times), "n {n}: positions {position:?}");
            for (a, row) in follows.iter().enumerate() {
                for (b, &c) in row.iter().enumerate() {
                    assert_eq!(c, if a == b { 0 } else { times }, "n {n}: {b} after {a}");
                }
            }
        }
    }

    /// Words pass unchanged (`cli` splits `--flag=value`); a word that is not UTF-8 is an error naming it, not a
    /// panic.
    #[test]
    fn args_reject_non_utf8() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        let words = |w: &[&str]| w.iter().map(OsString::from).collect::<Vec<_>>().into_iter();
        assert_eq!(utf8_args(words(&["--json=a=b", "-g", "x=y"])).unwrap(), ["--json=a=b", "-g", "x=y"]);
        let bad = vec![OsString::from("-g"), OsString::from_vec(vec![b'a', 0xff])];
        let e = utf8_args(bad.into_iter()).unwrap_err();
        assert!(e.contains("argument 2") && e.contains("not valid UTF-8"), "{e}");
    }

    /// A log gets the first run and about one line per tenth: at most 11 lines, the last run included when the
    /// runs divide into tenths.
    #[test]
    fn progress_logs_about_ten_lines() {
        for total in [1, 3, 10, 162, 1206] {
            let lines: Vec<usize> = (1..=total).filter(|&d| milestone(d, total)).collect();
            assert_eq!(lines[0], 1, "total {total}");
            assert!(lines.len() <= 11 && lines.len() >= total.min(10), "total {total}: {lines:?}");
        }
        assert!(milestone(162, 162) && milestone(10, 10));
    }

    /// A run that ends before the first report prints nothing and returns its result at once; the helper stops
    /// with the run (the scope would hang otherwise); a panicking run still stops it. The line's format.
    #[test]
    fn with_progress_stops_with_the_run() {
        let began = std::time::Instant::now();
        assert_eq!(with_progress("t", String::new, || 7), 7);
        assert!(began.elapsed() < PROGRESS_AFTER, "waited for the helper's first report");
        let unwound = std::panic::catch_unwind(|| with_progress("t", String::new, || panic!("boom")));
        assert!(unwound.is_err());
        assert!(began.elapsed() < PROGRESS_AFTER);
        let second = std::time::Duration::from_millis(2400);
        assert_eq!(progress_line("hb", "", second), "hb: 2 s elapsed");
        assert_eq!(progress_line("sc", "5 of 8 adds", second * 5), "sc: 5 of 8 adds, 12 s elapsed");
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    /// Differences 1, 2, 3: mean 2, sample variance 1, standard error 1/sqrt(3); a longer slice's extra runs are
    /// left out; one pair, or a NaN, gives nothing.
    #[test]
    fn paired_mean_and_standard_error() {
        let (mean, se) = paired_mean_se(&[1.0, 2.0, 3.0], &[2.0, 4.0, 6.0, 100.0]).unwrap();
        assert!((mean - 2.0).abs() < 1e-12 && (se - (1.0f64 / 3.0).sqrt()).abs() < 1e-12, "{mean} {se}");
        assert_eq!(paired_mean_se(&[1.0, 1.0], &[3.0, 3.0]), Some((2.0, 0.0)));
        assert_eq!(paired_mean_se(&[1.0], &[2.0]), None);
        assert_eq!(paired_mean_se(&[1.0, f64::NAN], &[2.0, 3.0]), None);
    }

    #[test]
    fn median_of_odd_even_and_empty_samples() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn binomial_cdf_matches_exact_fractions() {
        assert!(close(binomial_half_cdf(5, 0), 1.0 / 32.0));
        assert!(close(binomial_half_cdf(9, 1), 10.0 / 512.0));
        assert!(close(binomial_half_cdf(11, 2), 67.0 / 2048.0));
        assert!(close(binomial_half_cdf(15, 3), 576.0 / 32768.0));
        assert!(close(binomial_half_cdf(4, 4), 1.0));
        assert!(close(binomial_half_cdf(7, 3), 0.5));
        // Symmetry P(X <= k) + P(X <= n - k - 1) = 1, also where 2^-n underflows an f64.
        for (n, k) in [(20, 6), (2000, 980), (5000, 2400)] {
            assert!((binomial_half_cdf(n, k) + binomial_half_cdf(n, n - k - 1) - 1.0).abs() < 1e-9, "n {n} k {k}");
        }
    }

    #[test]
    fn coverage_of_order_statistic_intervals() {
        assert!(close(median_ci_coverage(5, 1), 0.9375));
        assert!(close(median_ci_coverage(9, 2), 1.0 - 20.0 / 512.0));
        assert!(close(median_ci_coverage(9, 3), 1.0 - 92.0 / 512.0));
        assert!(close(median_ci_coverage(11, 2), 1.0 - 24.0 / 2048.0));
        assert!(close(median_ci_coverage(11, 3), 1.0 - 134.0 / 2048.0));
        assert!(close(median_ci_coverage(15, 4), 1.0 - 1152.0 / 32768.0));
        assert_eq!(median_ci_coverage(5, 0), 0.0);
        assert_eq!(median_ci_coverage(5, 4), 0.0);
        assert_eq!(min_samples_for(0.90), 5);
        assert_eq!(min_samples_for(0.95), 6);
    }

    #[test]
    fn median_ci_picks_the_tightest_pair_reaching_the_level() {
        let nine = [9.0, 1.0, 8.0, 2.0, 7.0, 3.0, 6.0, 4.0, 5.0];
        let ci = median_ci(&nine, 0.90).unwrap();
        assert_eq!((ci.median, ci.lo, ci.hi, ci.n), (5.0, 2.0, 8.0, 9));
        assert!(close(ci.coverage, 1.0 - 20.0 / 512.0));
        let eleven: Vec<f64> = (1..=11).map(f64::from).collect();
        let ci = median_ci(&eleven, 0.90).unwrap();
        assert_eq!((ci.median, ci.lo, ci.hi), (6.0, 3.0, 9.0));
        let fifteen: Vec<f64> = (1..=15).rev().map(f64::from).collect();
        let ci = median_ci(&fifteen, 0.90).unwrap();
        assert_eq!((ci.lo, ci.hi), (4.0, 12.0));
        assert!(close(ci.coverage, 1.0 - 1152.0 / 32768.0));
        let ci = median_ci(&[1.0, 2.0, 3.0, 4.0], 0.90).unwrap();
        assert_eq!((ci.median, ci.lo, ci.hi), (2.5, 1.0, 4.0));
        assert!(close(ci.coverage, 0.875));
        assert_eq!(median_ci(&[], 0.90), None);
    }

    #[test]
    fn paired_costs_are_positive_when_slower() {
        assert_eq!(paired_pct(&[1.1, 2.0, 3.0], &[1.0, 2.0, 0.0], time_cost_pct).len(), 2);
        assert!((paired_pct(&[1.1], &[1.0], time_cost_pct)[0] - 10.0).abs() < 1e-9);
        assert!((paired_pct(&[90.0], &[100.0], throughput_cost_pct)[0] - 10.0).abs() < 1e-9);
        assert!((paired_pct(&[110.0], &[100.0], throughput_cost_pct)[0] + 10.0).abs() < 1e-9);
    }

    fn ci(lo: f64, hi: f64, n: usize) -> MedianCi {
        MedianCi { median: (lo + hi) / 2.0, lo, hi, coverage: median_ci_coverage(n, 1), n }
    }

    #[test]
    fn verdicts_from_the_interval() {
        assert_eq!(Verdict::judge(Some(&ci(-1.0, 2.0, 9)), 2.0), Verdict::Met);
        assert_eq!(Verdict::judge(Some(&ci(2.5, 9.0, 9)), 2.0), Verdict::NotMet);
        assert_eq!(Verdict::judge(Some(&ci(-1.0, 2.5, 9)), 2.0), Verdict::Inconclusive);
        assert_eq!(Verdict::judge(Some(&ci(2.5, 9.0, 4)), 2.0), Verdict::TooFewRepeats);
        assert_eq!(Verdict::judge(None, 2.0), Verdict::TooFewRepeats);
        assert_eq!(overall(&[Verdict::Met, Verdict::Inconclusive, Verdict::Met]), Verdict::Inconclusive);
        assert_eq!(overall(&[Verdict::Met, Verdict::NotMet, Verdict::Inconclusive]), Verdict::NotMet);
        assert_eq!(overall(&[Verdict::Met, Verdict::Met]), Verdict::Met);
        let text = Verdict::Inconclusive.explain(Some(&ci(-1.0, 2.5, 9)));
        assert_eq!(text, "inconclusive (CI [-1.00%, +2.50%] straddles the budget; more --repeats narrow it)");
    }

    #[test]
    fn a_lower_bound_exactly_at_the_budget_is_inconclusive() {
        // NOT met needs the whole interval over the budget; a lower bound equal to it is not over it.
        assert_eq!(Verdict::judge(Some(&ci(2.0, 5.0, 9)), 2.0), Verdict::Inconclusive);
        assert_eq!(Verdict::judge(Some(&ci(2.0, 5.0, 9)), 2.0).word(), "inconclusive");
        assert_eq!(Verdict::judge(Some(&ci(2.0 + 1e-9, 5.0, 9)), 2.0), Verdict::NotMet);
        // An upper bound equal to the budget is met.
        assert_eq!(Verdict::judge(Some(&ci(-1.0, 2.0, 9)), 2.0), Verdict::Met);
    }

    #[test]
    fn too_few_repeats_ranks_between_inconclusive_and_not_met() {
        use Verdict::*;
        // Too few repeats outranks met and a straddling interval, so the overall verdict keeps its reason...
        assert_eq!(overall(&[Met, TooFewRepeats, Met]), TooFewRepeats);
        assert_eq!(overall(&[TooFewRepeats, Inconclusive]), TooFewRepeats);
        assert_eq!(overall(&[Inconclusive, TooFewRepeats]), TooFewRepeats);
        // ...but a cell whose whole interval is over the budget still decides.
        assert_eq!(overall(&[TooFewRepeats, NotMet]), NotMet);
        assert_eq!(overall(&[NotMet, TooFewRepeats, Met]), NotMet);
        assert_eq!(overall(&[Met, TooFewRepeats]).word(), "inconclusive");
        assert_eq!(overall(&[]), Met);
        let mut all = [NotMet, TooFewRepeats, Met, Inconclusive];
        all.sort();
        assert_eq!(all, [Met, Inconclusive, TooFewRepeats, NotMet]);
    }

    #[test]
    fn medians_versus_a_zero_or_nan_baseline_are_null_in_json() {
        // A zero baseline (no thread created in a very short run): the percentage is inf or NaN, not JSON.
        assert_eq!(
            json_median_vs("", "median_thr_per_s", 10.0, 0.0, 1),
            "\"median_thr_per_s\":10.0,\"vs_none_pct\":null"
        );
        assert_eq!(
            json_median_vs("", "median_thr_per_s", 0.0, 0.0, 1),
            "\"median_thr_per_s\":0.0,\"vs_none_pct\":null"
        );
        // A NaN median (an empty sample) and a NaN baseline.
        assert_eq!(
            json_median_vs("cpu_", "median_s", f64::NAN, 1.0, 6),
            "\"cpu_median_s\":null,\"cpu_vs_none_pct\":null"
        );
        assert_eq!(json_median_vs("", "median_s", 1.0, f64::NAN, 6), "\"median_s\":1.000000,\"vs_none_pct\":null");
        assert_eq!(json_median_vs("", "median_s", 1.1, 1.0, 6), "\"median_s\":1.100000,\"vs_none_pct\":10.000");
        assert_eq!(json_list(&[1.0, f64::INFINITY, f64::NAN, -2.25], 2), "1.00,null,null,-2.25");
        assert_eq!(json_list(&[], 2), "");
    }

    /// The path is checked up front but written only at the end, through `FILE.<pid>.tmp`: until then (a run that
    /// fails) an earlier file is untouched, and no temporary is left either way. A path that exists but is not a
    /// regular file (`/dev/null` here, `/dev/stdout` in use) is written in place.
    #[test]
    fn json_file_is_checked_up_front_and_replaced_at_the_end() {
        let dir = std::env::temp_dir().join(format!("mmcid-json-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.json");
        let tmp = dir.join(format!("out.json.{}.tmp", std::process::id()));
        let path = path.to_str().unwrap();
        std::fs::write(path, "earlier\n").unwrap();
        let file = OutFile::create("--json", path).unwrap();
        assert_eq!(std::fs::read_to_string(path).unwrap(), "earlier\n", "checking does not touch the file");
        assert!(!tmp.exists(), "the probe is removed");
        drop(file); // a run that failed: nothing written
        assert_eq!(std::fs::read_to_string(path).unwrap(), "earlier\n");
        OutFile::create("--json", path).unwrap().write("{\"a\":1}\n").unwrap();
        assert_eq!(std::fs::read_to_string(path).unwrap(), "{\"a\":1}\n");
        assert!(!tmp.exists(), "renamed, not copied");
        let missing = dir.join("no-such-dir").join("out.json");
        let e = OutFile::create("--json", missing.to_str().unwrap()).unwrap_err();
        assert!(e.starts_with("cannot write ") && e.contains("no-such-dir"), "{e}");
        let e = OutFile::create("--json", dir.to_str().unwrap()).unwrap_err();
        assert!(e.contains("is a directory"), "{e}");
        assert_eq!(OutFile::create("--svg", "").unwrap_err(), "--svg: an empty file name");
        // A write that fails (the target became a directory) leaves no temporary behind.
        let file = OutFile::create("--json", path).unwrap();
        std::fs::remove_file(path).unwrap();
        std::fs::create_dir(path).unwrap();
        assert!(file.write("x").is_err());
        assert!(!tmp.exists(), "the temporary is removed after a failed rename");
        OutFile::create("--json", "/dev/null").unwrap().write("{}").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn json_fields_are_valid_numbers_or_null() {
        assert_eq!(json_num(f64::NAN, 3), "null");
        assert_eq!(json_num(1.23456, 2), "1.23");
        let fields = json_paired("cpu_paired_", Some(&ci(-1.0, 2.0, 5)));
        assert_eq!(
            fields,
            "\"cpu_paired_median_pct\":0.500,\"cpu_paired_ci_lo_pct\":-1.000,\"cpu_paired_ci_hi_pct\":2.000,\
             \"cpu_paired_ci_coverage\":0.9375"
        );
        assert!(json_paired("paired_", None).contains("\"paired_ci_lo_pct\":null"));
    }
}
