//! A device whose logical size fits its physical size takes every write a
//! disk of that size takes, forever: fill it with unique data, then
//! overwrite all of it with other unique data, again and again, in small,
//! medium and whole-device requests, with and without compression, on
//! every backend. Nothing may fail with ENOSPC (overwritten chunks are
//! reclaimed as the space is needed), and every pass reads back exactly.

mod common;

use common::{MemDevice, VARIANTS};
use dedup_core::backends::BackendParams;
use dedup_core::fingerprint::HashAlgo;

const CS: usize = 4096;
const CHUNKS: u64 = 256;
const PASSES: u64 = 5;

fn overwrite_forever(variant: &str) {
    // As `dedup create --size` makes it: the physical size of the logical
    // one, and the reserve for overwrites in flight on top.
    let physical = CHUNKS + dedup_core::engine::overwrite_reserve_chunks(CS as u32);
    let cfg = common::config(
        variant,
        CS as u32,
        CHUNKS,
        physical,
        HashAlgo::Blake3,
        false,
    );
    let md = MemDevice::format(cfg, &common::params(variant, BackendParams::default()));
    let dev = md.open().unwrap();
    let size = CHUNKS as usize * CS;
    for pass in 0..PASSES {
        // Unique in every chunk, different in every pass.
        let image = dedup_core::testdata::noise(0x5eed + pass, size);
        let request = [CS, 16 * CS, size][pass as usize % 3];
        for at in (0..size).step_by(request) {
            dev.write(at as u64, &image[at..at + request], false)
                .unwrap_or_else(|e| panic!("{variant}: pass {pass}, write at {at}: {e}"));
        }
        if pass % 2 == 1 {
            dev.flush().unwrap();
        }
        let mut back = vec![0u8; size];
        dev.read(0, &mut back).unwrap();
        assert!(back == image, "{variant}: pass {pass} reads back wrong");
    }
    common::assert_consistent(&dev);
    dev.close().unwrap();
}

#[test]
fn overwrites_of_a_full_device_always_fit_on_every_backend() {
    for variant in VARIANTS {
        overwrite_forever(variant);
    }
}
