//! Latency samples and their percentiles.

use std::time::Duration;

/// Latencies of one kind of call.
#[derive(Clone, Debug, Default)]
pub struct Samples(Vec<Duration>);

impl Samples {
    /// Room for `n` samples.
    pub fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }

    /// Adds one sample.
    pub fn push(&mut self, d: Duration) {
        self.0.push(d);
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `p`th percentile (0 < p <= 100), nearest rank; zero when empty.
    pub fn percentile(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let mut v = self.0.clone();
        v.sort_unstable();
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1]
    }

    /// The median.
    pub fn p50(&self) -> Duration {
        self.percentile(50.0)
    }

    /// The 99th percentile.
    pub fn p99(&self) -> Duration {
        self.percentile(99.0)
    }
}

/// Microseconds as a float.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Milliseconds as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut s = Samples::default();
        for i in 1..=100 {
            s.push(Duration::from_millis(i));
        }
        assert_eq!(s.p50(), Duration::from_millis(50));
        assert_eq!(s.p99(), Duration::from_millis(99));
        assert_eq!(s.percentile(100.0), Duration::from_millis(100));
        assert_eq!(Samples::default().p99(), Duration::ZERO);
    }
}
