//! Analyse arbitrary bytes as a tar stream with every algorithm: must
//! never panic, and every algorithm accounts for exactly the bytes read.
//!
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run analyze_tar -- -max_total_time=60
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dedup_analyze::fuzzing::analyze_tar(data);
});
