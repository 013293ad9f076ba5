//! Parse arbitrary bytes as a trace (either format, strict and lenient),
//! write what parsed in dedup's format and parse it again: must never
//! panic, and the round trip must give the same requests.
//!
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run parse_trace -- -max_total_time=60
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dedup_trace::fuzzing::parse_trace(data);
});
