//! Content-based sampling of fingerprints, for datasets whose index would
//! not fit in memory: only chunks whose fingerprint falls in the first
//! 1/RATE of the hash space are indexed. Because the choice depends on
//! content alone, every copy of a chunk is sampled or none is, so each
//! distinct chunk is in the sample independently with probability
//! p = 1/RATE, and RATE × (sampled distinct bytes) estimates the distinct
//! bytes without bias. Logical bytes are counted exactly.
//!
//! Error bound: for independent inclusions the estimate's variance is
//! Σ sᵢ² (1 − p)/p over distinct chunks of size sᵢ; Σ sᵢ² is itself
//! estimated from the sample as RATE × Σ sampled sᵢ². The report gives
//! the estimate ± Z standard deviations.

/// Standard deviations in the stated bound: about 99 % of estimates fall
/// within it (normal approximation, good once a few hundred distinct
/// chunks are sampled).
pub const Z: f64 = 2.576;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampling {
    rate: u64,
    threshold: u64,
}

impl Sampling {
    /// Keep 1 in `rate` distinct chunks (1: keep all).
    pub fn new(rate: u64) -> Result<Sampling, String> {
        if rate == 0 {
            return Err("the sample rate must be at least 1 (1 keeps every chunk)".into());
        }
        Ok(Sampling {
            rate,
            threshold: u64::MAX / rate,
        })
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    pub fn is_sampling(&self) -> bool {
        self.rate > 1
    }

    /// Is the chunk with this fingerprint key in the sample?
    pub fn keeps(&self, key: u128) -> bool {
        self.rate == 1 || ((key >> 64) as u64) <= self.threshold
    }

    /// Estimated distinct bytes and the half-width of the bound, from the
    /// sampled distinct bytes and the sum of their squared sizes.
    pub fn estimate(&self, sampled_bytes: u64, sampled_sq: f64) -> (f64, f64) {
        let r = self.rate as f64;
        let est = r * sampled_bytes as f64;
        let var = r * (r - 1.0) * sampled_sq;
        (est, Z * var.sqrt())
    }
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling::new(1).expect("1 is valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_one_keeps_everything_with_no_error() {
        let s = Sampling::new(1).unwrap();
        assert!(s.keeps(u128::MAX));
        assert_eq!(s.estimate(1000, 4.0e6), (1000.0, 0.0));
    }

    #[test]
    fn a_rate_keeps_about_that_share_of_uniform_keys() {
        let s = Sampling::new(8).unwrap();
        let mut x = 1u64;
        let kept = (0..80_000)
            .filter(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                s.keeps((x as u128) << 64)
            })
            .count();
        assert!((9_000..11_000).contains(&kept), "{kept}");
        assert!(Sampling::new(0).is_err());
    }
}
