//! Helpers shared by the benchmark examples (`hackbench`, `thread_pools`): argument parsing and statistics.
//! Included with `#[path = "common/mod.rs"] mod common;`; not an example of its own.
#![allow(dead_code)]

/// The command-line words after the program name, with `--flag=value` split into `--flag` and `value`.
pub fn args() -> impl Iterator<Item = String> {
    std::env::args().skip(1).flat_map(|a| match a.split_once('=') {
        Some((k, v)) if k.starts_with("--") => vec![k.to_string(), v.to_string()],
        _ => vec![a],
    })
}

/// The value following `flag`, or an error naming the flag.
pub fn value(flag: &str, v: Option<String>) -> Result<String, String> {
    v.ok_or_else(|| format!("{flag} needs a value"))
}

/// A positive integer value for `flag`.
pub fn positive(flag: &str, v: Option<String>) -> Result<usize, String> {
    let v = value(flag, v)?;
    match v.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{flag}: expected a positive integer, got {v:?}")),
    }
}

/// The median of `v` (the mean of the two middle values for an even count); NaN for an empty slice.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => s[n / 2],
        _ => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// `t` relative to `base`, in percent.
pub fn pct(t: f64, base: f64) -> f64 {
    (t - base) / base * 100.0
}

/// `s` as a JSON string literal.
pub fn json_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}
