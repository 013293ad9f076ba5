//! Decode arbitrary bytes as each kind of object a backup repository holds
//! (the first byte picks the decoder: container, tree, recipe, recipe in
//! parts, backup, config, GC marks, index checkpoint): must never panic.
//!
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run store_objects -- -max_total_time=60
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    dedup_store::fuzzing::objects(data);
});
