//! Small statistics over measurements.

use std::time::Duration;

/// The median (mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// Latency summary of one scenario.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Largest sample.
    pub max: Duration,
    /// Arithmetic mean.
    pub mean: Duration,
}

/// Nearest-rank percentiles (the p-th percentile is a sample, never an interpolation, so p99
/// of 20,000 samples is the 19,800th smallest); `None` when empty.
pub fn percentiles(samples: &mut [Duration]) -> Option<Percentiles> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let rank = |p: f64| {
        let index = (p * samples.len() as f64).ceil() as usize;
        samples[index.clamp(1, samples.len()) - 1]
    };
    let total: Duration = samples.iter().sum();
    Some(Percentiles {
        count: samples.len(),
        p50: rank(0.50),
        p99: rank(0.99),
        max: samples[samples.len() - 1],
        mean: total / samples.len() as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn nearest_rank() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let p = percentiles(&mut samples).unwrap();
        assert_eq!(p.p50, Duration::from_millis(50));
        assert_eq!(p.p99, Duration::from_millis(99));
        assert_eq!(p.max, Duration::from_millis(100));
        assert_eq!(p.count, 100);
        assert!(percentiles(&mut []).is_none());
        let mut one = vec![Duration::from_millis(7)];
        assert_eq!(percentiles(&mut one).unwrap().p99, Duration::from_millis(7));
    }
}
