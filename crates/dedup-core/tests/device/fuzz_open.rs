//! The `open_metadata` fuzz target, run over seeded mutations of real
//! metadata from every backend, so CI exercises it without a fuzzer:
//! bit flips, overwritten runs, truncations and extensions. Nothing may
//! panic. `DEDUP_FUZZ_CORPUS=DIR` also writes the unmutated images to DIR,
//! to seed `cargo fuzz run open_metadata DIR`.

use crate::common;

use dedup_core::fingerprint::HashAlgo;
use dedup_core::fuzzing;
use rand::{Rng, SeedableRng};

#[test]
fn opening_mutated_metadata_never_panics() {
    let iterations: usize = std::env::var("DEDUP_FUZZ_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let corpus = std::env::var_os("DEDUP_FUZZ_CORPUS");
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    for backend in ["sparse", "inram", "disktable", "cowbtree", "thin"] {
        let base = common::image(backend, 32, 24, HashAlgo::Blake3).meta;
        if let Some(dir) = &corpus {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(std::path::Path::new(dir).join(backend), &base).unwrap();
        }
        fuzzing::open_metadata(&base);
        for _ in 0..iterations {
            let mut m = base.clone();
            match rng.random_range(0..5) {
                0 => {
                    for _ in 0..rng.random_range(1..8) {
                        let i = rng.random_range(0..m.len());
                        m[i] ^= 1 << rng.random_range(0..8);
                    }
                }
                1 => {
                    let i = rng.random_range(0..m.len());
                    let n = rng.random_range(1..512).min(m.len() - i);
                    rng.fill(&mut m[i..i + n]);
                }
                2 => m.truncate(rng.random_range(0..m.len())),
                3 => m.extend((0..rng.random_range(1..9000)).map(|_| rng.random::<u8>())),
                _ => {
                    // Damage the superblock fields but keep its checksum valid.
                    let slot = rng.random_range(0..2) * 4096;
                    if m.len() >= slot + 4096 {
                        let i = slot + rng.random_range(8..1100);
                        m[i] = rng.random();
                        let crc = crc32c::crc32c(&m[slot..slot + 4092]);
                        m[slot + 4092..slot + 4096].copy_from_slice(&crc.to_le_bytes());
                    }
                }
            }
            fuzzing::open_metadata(&m);
        }
    }
}
