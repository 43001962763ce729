//! Order statistics over samples, and the summaries `--json` reports of them.

use serde::Serialize;

/// Median (mean of the middle two for even counts); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

pub fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::min)
}

pub fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

/// Median of `b[i] / a[i]`: the ratio of two measurements taken in
/// alternation, robust to noise that drifts over the run.
pub fn paired_ratio(a: &[f64], b: &[f64]) -> f64 {
    let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| y / x).collect();
    median(&r)
}

/// Nearest-rank percentile (`q` in 0..=1) of integer samples; 0 when empty.
pub fn percentile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// A set of runs: `{"median", "min", "max", "runs"}` in JSON.
#[derive(Serialize)]
pub struct Dist {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: Vec<f64>,
}

pub fn dist(v: &[f64]) -> Dist {
    Dist {
        median: median(v),
        min: min(v),
        max: max(v),
        runs: v.to_vec(),
    }
}

/// Integer samples (ns): `{"median", "p99", "count"}` in JSON.
#[derive(Serialize)]
pub struct Percentiles {
    pub median: u64,
    pub p99: u64,
    pub count: usize,
}

pub fn percentiles(v: &[u64]) -> Percentiles {
    Percentiles {
        median: percentile(v, 0.5),
        p99: percentile(v, 0.99),
        count: v.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_statistics() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(min(&[2.0, 1.0]), 1.0);
        assert_eq!(max(&[2.0, 1.0]), 2.0);
        assert_eq!(paired_ratio(&[1.0, 2.0, 4.0], &[3.0, 2.0, 4.0]), 1.0);
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&v, 1.0), 100);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}
