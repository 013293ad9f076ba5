//! Open arbitrary bytes as a dedup metadata device; must never panic.
//!
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run open_metadata -- -max_total_time=60
//!
//! Seed it with real metadata: `fuzz/seed-corpus` writes one file per backend.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dedup_core::fuzzing::open_metadata(data);
});
