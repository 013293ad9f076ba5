//! The `packed_block` fuzz target over seeded mutations of real packed
//! blocks (bit flips, overwritten runs, truncations, and a valid table
//! checksum over damaged contents, which the target also tries), in CI:
//! nothing may panic.

use dedup_core::fuzzing::packed_block;
use dedup_core::pack::Packer;
use rand::{Rng, SeedableRng};

#[test]
fn opening_mutated_packed_blocks_never_panics() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for sizes in [
        vec![700usize; 5],
        vec![10; 14],
        vec![4000],
        vec![100, 2000, 900],
    ] {
        let mut p = Packer::new(4096);
        for (i, n) in sizes.iter().enumerate() {
            let f: Vec<u8> = (0..*n).map(|_| rng.random()).collect();
            assert!(p.add(&f).is_some(), "fragment {i} of {sizes:?}");
        }
        let block = p.seal();
        for _ in 0..3000 {
            let mut b = block.clone();
            match rng.random_range(0..3) {
                0 => {
                    for _ in 0..rng.random_range(1..8) {
                        let i = rng.random_range(0..b.len());
                        b[i] ^= 1 << rng.random_range(0..8);
                    }
                }
                1 => {
                    let at = rng.random_range(0..b.len());
                    let n = rng.random_range(1..64).min(b.len() - at);
                    let v: u8 = rng.random();
                    b[at..at + n].fill(v);
                }
                _ => b.truncate(rng.random_range(0..b.len())),
            }
            packed_block(&b);
        }
    }
}
