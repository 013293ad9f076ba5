//! Deterministic block content from a seed.
//!
//! Equal seeds must give equal bytes and different seeds different bytes
//! (or the replay would deduplicate what the original did not). The bytes
//! are a splitmix64 stream keyed by the seed: several GB/s on one core, so
//! content generation does not throttle a replay on a 2-core machine, and
//! incompressible, like most real written data after the page cache.

/// 128 bits naming a block's content: equal seeds, equal bytes.
pub type Seed = [u8; 16];

/// splitmix64 (Steele, Lea, Flood 2014): one 64-bit state, one multiply-xorshift mix per word.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Fill `out` with the bytes `seed` names. Two streams (one per seed half)
/// are interleaved, so all 128 bits of the seed matter.
pub fn fill(seed: &Seed, out: &mut [u8]) {
    let lo = u64::from_le_bytes(seed[..8].try_into().expect("8 bytes"));
    let hi = u64::from_le_bytes(seed[8..].try_into().expect("8 bytes"));
    let mut a = SplitMix(lo);
    let mut b = SplitMix(hi ^ 0x6a09_e667_f3bc_c908);
    let mut words = out.chunks_exact_mut(8);
    for w in &mut words {
        w.copy_from_slice(&(a.next() ^ b.next().rotate_left(17)).to_le_bytes());
    }
    let tail = words.into_remainder();
    let last = (a.next() ^ b.next().rotate_left(17)).to_le_bytes();
    let n = tail.len();
    tail.copy_from_slice(&last[..n]);
}

/// The seed of the `index`th block of a request whose whole content is
/// named by `seed` (FIU) and whose length is `len`: equal (seed, len) give
/// equal requests, block by block.
pub fn derive(seed: &Seed, index: u64, len: u64) -> Seed {
    let mut h = blake3::Hasher::new();
    h.update(seed)
        .update(&index.to_le_bytes())
        .update(&len.to_le_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize().as_bytes()[..16]);
    out
}

/// The seed that names `bytes` in a recorded trace: 128 bits of blake3.
pub fn seed_of(bytes: &[u8]) -> Seed {
    let mut out = [0u8; 16];
    out.copy_from_slice(&blake3::hash(bytes).as_bytes()[..16]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_seeds_equal_bytes_and_every_seed_bit_matters() {
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        fill(&[7; 16], &mut a);
        fill(&[7; 16], &mut b);
        assert_eq!(a, b);
        for bit in 0..128 {
            let mut s = [7u8; 16];
            s[bit / 8] ^= 1 << (bit % 8);
            fill(&s, &mut b);
            assert_ne!(a, b, "flipping seed bit {bit} left the content unchanged");
        }
        assert!(a.iter().any(|&x| x != 0));
    }

    #[test]
    fn a_short_fill_is_a_prefix_of_a_long_one() {
        let mut long = vec![0u8; 4096];
        let mut short = vec![0u8; 1001];
        fill(&[3; 16], &mut long);
        fill(&[3; 16], &mut short);
        assert_eq!(&long[..1000], &short[..1000]);
    }
}
