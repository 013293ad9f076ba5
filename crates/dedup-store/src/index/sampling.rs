//! The sampling rate R = 1/T of §3.2 (Eq. 1), kept a power of two so that
//! progressive sampling (§3.2.2) can halve it and down-sample the hooks by
//! one more fingerprint bit: a fingerprint is sampled at period T when the
//! low log2(T) bits of its prefix are zero, so the same fingerprint is
//! always or never a hook at a given R, and every hook at R/2 was a hook at R.

use dedup_common::fingerprint::Fingerprint;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SamplingRate {
    log2_period: u32,
}

impl SamplingRate {
    /// R = 1: every fingerprint is a hook (a full index).
    pub const FULL: SamplingRate = SamplingRate { log2_period: 0 };
    /// The longest period the 64-bit prefix can express.
    pub const MAX_LOG2_PERIOD: u32 = 63;

    pub fn from_log2_period(log2_period: u32) -> Option<SamplingRate> {
        (log2_period <= Self::MAX_LOG2_PERIOD).then_some(SamplingRate { log2_period })
    }

    pub fn log2_period(self) -> u32 {
        self.log2_period
    }

    /// T, the sampling period: one hook in T fingerprints.
    pub fn period(self) -> u64 {
        1 << self.log2_period
    }

    /// R as a number, for figures and Eq. 2.
    pub fn as_f64(self) -> f64 {
        1.0 / self.period() as f64
    }

    /// R/2, or `None` at the longest period.
    pub fn halved(self) -> Option<SamplingRate> {
        SamplingRate::from_log2_period(self.log2_period + 1)
    }

    /// Whether `fp` is sampled at this rate (`prefix mod T == 0`).
    pub fn samples(self, fp: &Fingerprint) -> bool {
        self.samples_prefix(fp.prefix_u64())
    }

    /// `samples` of a fingerprint by its 64-bit prefix.
    pub fn samples_prefix(self, prefix: u64) -> bool {
        prefix & (self.period() - 1) == 0
    }

    /// Eq. 1, R = (M/E)/(C/S), with the fingerprints actually stored for
    /// C/S (progressive sampling, §3.2.2), rounded down to a power of two
    /// and capped at 1.
    pub fn for_budget(budget_bytes: u64, entry_bytes: u64, fingerprints: u64) -> SamplingRate {
        let entries = budget_bytes / entry_bytes.max(1);
        let mut rate = SamplingRate::FULL;
        while fingerprints / rate.period() > entries {
            match rate.halved() {
                Some(r) => rate = r,
                None => break,
            }
        }
        rate
    }
}
