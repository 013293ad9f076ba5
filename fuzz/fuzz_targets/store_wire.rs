//! Read arbitrary bytes as the frames of a `dedup store serve`
//! connection, each decoded as a request and as a response: must never
//! panic, and a request that decodes must round-trip.
//!
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run store_wire -- -max_total_time=60
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dedup_store::fuzzing::wire(data);
});
