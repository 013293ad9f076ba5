//! Open arbitrary bytes as each of the thin backend's on-disk blocks (a
//! C-block: compressed chunk + embedded entries; a metadata block; a zone
//! record): must never panic.
//!
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run thin_blocks -- -max_total_time=60
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dedup_core::fuzzing::thin_blocks(data);
});
