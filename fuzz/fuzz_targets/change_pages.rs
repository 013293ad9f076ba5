//! Parse arbitrary bytes as the pages of changed-block flags a snapshot
//! session sends and the tracking file keeps (`dedup_core::change_flags`):
//! an error or flags that encode back to the same bytes, never a panic.
//!
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run change_pages -- -max_total_time=60
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dedup_core::fuzzing::change_pages(data);
});
