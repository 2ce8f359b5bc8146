//! Small statistics helpers: medians over repeated runs.

/// Median of a sample (sorted copy); 0 for an empty sample.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Median, lowest and highest of a sample.
pub fn spread(v: &[f64]) -> (f64, f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (median(v), lo, hi)
}

/// [`spread`] of one figure `f` of each run.
pub fn spread_of<T>(runs: &[T], f: impl Fn(&T) -> f64) -> (f64, f64, f64) {
    spread(&runs.iter().map(f).collect::<Vec<_>>())
}

/// The `p`-th percentile (0–100) of a sample, nearest rank.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// A figure's median and spread over the runs (bytes per second where it is a rate).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rate {
    /// Median.
    pub median: f64,
    /// Lowest run.
    pub min: f64,
    /// Highest run.
    pub max: f64,
}

impl Rate {
    /// The median and spread of `v`.
    pub fn of(v: &[f64]) -> Rate {
        let (median, min, max) = spread(v);
        Rate { median, min, max }
    }

    /// As GB/s: `median (lowest-highest)`.
    pub fn gbs(self) -> String {
        format!(
            "{:.2} ({:.2}-{:.2})",
            self.median / 1e9,
            self.min / 1e9,
            self.max / 1e9
        )
    }
}

/// Bytes a copy benchmark's timed sample moves at least (small copies are repeated up to it).
pub const COPY_SAMPLE_BYTES: usize = 256 << 20;

/// Bytes per second of `copy`, which moves `bytes` each call: called once to warm up (pages
/// touched, buffers grown), then timed over as many calls as move [`COPY_SAMPLE_BYTES`] (at
/// least one).
pub fn copy_rate(bytes: usize, mut copy: impl FnMut()) -> f64 {
    let reps = (COPY_SAMPLE_BYTES / bytes).max(1);
    copy();
    let t = std::time::Instant::now();
    for _ in 0..reps {
        copy();
    }
    (bytes * reps) as f64 / t.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_percentiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(percentile(&[5.0, 1.0, 4.0, 2.0, 3.0], 50.0), 3.0);
        assert_eq!(percentile(&[5.0, 1.0, 4.0, 2.0, 3.0], 100.0), 5.0);
        assert_eq!(median(&[]), 0.0);
    }
}
