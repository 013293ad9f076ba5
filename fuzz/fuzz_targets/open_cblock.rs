//! Open arbitrary bytes as a thin C-block (compressed chunk + embedded
//! metadata entries) and as a thin metadata block: must never panic.
//!
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run open_cblock -- -max_total_time=60
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dedup_core::fuzzing::open_cblock(data);
});
