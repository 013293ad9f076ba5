//! The `thin_blocks` fuzz target over seeded mutations of real C-blocks,
//! metadata blocks and zone records
//! (bit flips, overwritten runs, truncations, extensions, and a valid
//! checksum over damaged contents, which `thin_blocks` also tries), in CI:
//! nothing may panic.

use dedup_core::fuzzing::thin_blocks;
use dedup_core::placement::thin::cblock::{Compressed, Entry};
use dedup_core::placement::thin::{window, zones};
use rand::{Rng, SeedableRng};

#[test]
fn opening_mutated_thin_blocks_never_panics() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for head in [100usize, 1500, 3000] {
        let chunk: Vec<u8> = (0..4096)
            .map(|i| if i < head { rng.random() } else { 3 })
            .collect();
        let c = Compressed::new(&chunk).unwrap();
        let entries: Vec<Entry> = (0..c.capacity() as u64)
            .map(|i| Entry {
                lbn: i,
                pbn: i * 2,
                fp: [i as u8; 16],
                timestamp: i,
            })
            .collect();
        let cblock = c.seal(&entries);
        let mblock = window::mblock(&entries[..entries.len().min(100)], 4096);
        let mut zs = zones::Zones::new(1024 + 100, 1024);
        zs.alloc(zones::Kind::C, 1100, &mut zones::Changes::default());
        let record = zs.encode(1, true);
        for i in 0..6000 {
            let mut b = [&cblock, &mblock, &record][i % 3].clone();
            match rng.random_range(0..4) {
                0 => {
                    for _ in 0..rng.random_range(1..8) {
                        let i = rng.random_range(0..b.len());
                        b[i] ^= 1 << rng.random_range(0..8);
                    }
                }
                1 => {
                    let i = rng.random_range(0..b.len());
                    let n = rng.random_range(1..64).min(b.len() - i);
                    rng.fill(&mut b[i..i + n]);
                }
                2 => b.truncate(rng.random_range(0..b.len())),
                _ => b.extend((0..rng.random_range(1..4096)).map(|_| rng.random::<u8>())),
            }
            thin_blocks(&b);
        }
    }
}
