//! Parse arbitrary bytes as the block states a served device's snapshot
//! sends a backup (`dedup_core::control::snapshot`): an error or exactly
//! the blocks asked for, never a panic.
//!
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run snapshot_reply -- -max_total_time=60
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dedup_core::fuzzing::snapshot_reply(data);
});
