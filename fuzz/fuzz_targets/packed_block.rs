//! Open arbitrary bytes as a packed block (compressed fragments of several
//! chunks in one data block) and read every slot: must never panic, and a
//! slot read returns only bytes inside the block that match their checksum.
//!
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run packed_block -- -max_total_time=60
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dedup_core::fuzzing::packed_block(data);
});
