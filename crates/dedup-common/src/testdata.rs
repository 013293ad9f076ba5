//! Reproducible data for tests, fuzzing seeds and benchmarks: one
//! generator, so every test that wants "incompressible bytes" gets them
//! the same way.

/// `n` pseudo-random (incompressible) bytes from `seed` (xorshift64; any
/// seed, zero included, gives a full-period sequence).
pub fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn is_reproducible_and_does_not_compress() {
        let a = super::noise(5, 4096);
        assert_eq!(a, super::noise(5, 4096));
        assert_ne!(a, super::noise(6, 4096));
        assert!(lz4_flex::block::compress(&a).len() > 4000);
    }
}
