//! The one median of the workspace: the examples' statistics (`lib.rs`) and the criterion benches' tables
//! (`bench.rs`) both use it.

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
