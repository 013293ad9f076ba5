//! Random damage to bytes for the fuzz targets' seeded runs in CI: a few
//! bits flipped, a cut, or a run overwritten with random bytes.

use rand::{rngs::StdRng, Rng};

/// One of the three, at random, to `b` (not empty).
pub fn damage(rng: &mut StdRng, b: &mut Vec<u8>) {
    match rng.random_range(0..3) {
        0 => {
            for _ in 0..rng.random_range(1..6) {
                let i = rng.random_range(0..b.len());
                b[i] ^= 1 << rng.random_range(0..8);
            }
        }
        1 => {
            let cut = rng.random_range(0..b.len());
            b.truncate(cut);
        }
        _ => {
            let i = rng.random_range(0..b.len());
            let n = rng.random_range(1..40).min(b.len() - i);
            rng.fill(&mut b[i..i + n]);
        }
    }
}
