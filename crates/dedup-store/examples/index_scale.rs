//! The sampled index's RAM at the store sizes users have (issue 17's
//! "index RAM per TB stored"): feeds an index with the default budget the
//! catalogs of `--tib` TiB stored in 4 KiB segments (16 MiB containers of
//! 4,096 segments each) and prints, at every power of two of stored bytes
//! from 1 GiB, R, the hooks and the bytes their table allocated, as JSON
//! lines. Fingerprints are random bytes (a real store's are BLAKE3
//! output, as uniform). Not a test: run it under `/usr/bin/time -v` for
//! the peak RSS beside the figures.
//!
//! `cargo run --release -p dedup-store --example index_scale -- 1`

use dedup_common::fingerprint::{Fingerprint, FINGERPRINT_BYTES};
use dedup_store::index::{Index, IndexConfig};

const SEGMENT: u64 = 4 << 10;
const PER_CONTAINER: usize = 4096;

fn main() {
    let tib: f64 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("give the TiB to store, e.g. 1 or 0.0625"))
        .unwrap_or(1.0);
    let budget: u64 = std::env::args()
        .nth(2)
        .map(|a| a.parse().expect("give the budget in bytes"))
        .unwrap_or(IndexConfig::default().index_memory);
    let config = IndexConfig {
        index_memory: budget,
        // `dedup backup`'s default (`--index-cache`).
        cache_entries: 1 << 18,
        ..IndexConfig::default()
    };
    let mut index = Index::new(config);
    let total = (tib * (1u64 << 40) as f64) as u64 / SEGMENT;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        // splitmix64: uniform 64-bit words, cheap.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut batch = Vec::with_capacity(PER_CONTAINER);
    let mut stored = 0u64;
    let mut report_at = (1u64 << 30) / SEGMENT;
    let mut container = 0u64;
    while stored < total {
        batch.clear();
        for _ in 0..PER_CONTAINER {
            let mut fp = [0u8; FINGERPRINT_BYTES];
            for word in fp.chunks_exact_mut(8) {
                word.copy_from_slice(&next().to_le_bytes());
            }
            batch.push(Fingerprint(fp));
        }
        index.insert(container, &batch);
        container += 1;
        stored += PER_CONTAINER as u64;
        if stored >= report_at || stored >= total {
            let f = index.figures();
            let bytes = stored * SEGMENT;
            println!(
                "{{\"stored_bytes\": {bytes}, \"rate\": {}, \"hooks\": {}, \"hook_bytes\": {}, \"hook_bytes_per_tib\": {:.0}, \"budget\": {budget}}}",
                f.rate,
                f.hooks,
                f.hook_bytes,
                f.hook_bytes as f64 * (1u64 << 40) as f64 / bytes as f64
            );
            report_at *= 2;
        }
    }
}
