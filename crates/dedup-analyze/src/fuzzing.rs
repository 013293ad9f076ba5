//! The entry point of the `analyze_tar` fuzz target, here so that a CI
//! test can run it over many inputs too.

use crate::{report, Algorithm, Analysis};
use dedup_core::fingerprint::HashAlgo;

/// Analyse `data` as a tar stream with every kind of algorithm: must never
/// panic, and every algorithm must account for exactly the bytes read.
pub fn analyze_tar(data: &[u8]) {
    let algorithms = ["wfh", "fbh:4k", "rabin:4k", "fastcdc:4k"]
        .iter()
        .map(|a| Algorithm::parse(a).expect("valid"))
        .collect();
    let mut a = Analysis::new(algorithms, HashAlgo::Blake3);
    a.measure_delta(1 << 20);
    a.run_tar(std::path::Path::new("fuzz input"), data);
    let r = report(&a);
    for x in &r.algorithms {
        assert_eq!(x.logical_bytes, r.bytes, "{}", x.label);
        assert!(x.unique_bytes <= x.logical_bytes, "{}", x.label);
    }
}
