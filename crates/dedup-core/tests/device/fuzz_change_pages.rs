//! The `change_pages` fuzz target over seeded mutations of real pages of
//! changed-block flags (bit flips in page indices and words, cuts, pages
//! repeated or swapped, another device size), in CI: nothing may panic,
//! and whatever parses gives back the same bytes.

use dedup_core::fuzzing::change_pages;
use dedup_core::Changes;

use crate::mutations::damage;
use rand::{Rng, SeedableRng};

/// A device of `size << 16` chunks as the fuzz target reads it, with
/// regions flagged at random, as a served device sends them.
fn pages(rng: &mut rand::rngs::StdRng, size: u16) -> Vec<u8> {
    let chunks = u64::from(size) << 16;
    let mut out = size.to_le_bytes().to_vec();
    // Pages of random words at rising indices, given back as a device
    // sends them (`page_bytes`).
    let slots = chunks.div_ceil(64 * 4096);
    let mut body = Vec::new();
    let mut k = 0;
    while k < slots && body.len() < 8 * 520 {
        k += rng.random_range(1..4);
        if k >= slots {
            break;
        }
        body.extend_from_slice(&k.to_le_bytes());
        body.extend((0..64).flat_map(|_| rng.random::<u64>().to_le_bytes()));
    }
    let c = Changes::from_page_bytes(1, &body, chunks).expect("pages made here parse");
    out.extend(c.page_bytes());
    out
}

#[test]
fn parsing_mutated_change_pages_never_panics() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(39);
    for _ in 0..2000 {
        let size = rng.random_range(1..200u16);
        let mut b = pages(&mut rng, size);
        change_pages(&b);
        match rng.random_range(0..5) {
            0 if b.len() > 2 + 2 * 520 => {
                // The first two pages swapped, or the first repeated.
                let (a, rest) = b[2..].split_at(520);
                let second = rest[..520].to_vec();
                let mut m = b[..2].to_vec();
                if rng.random() {
                    m.extend(second);
                    m.extend_from_slice(a);
                } else {
                    m.extend_from_slice(a);
                    m.extend_from_slice(a);
                }
                m.extend_from_slice(&rest[520..]);
                b = m;
            }
            1 => b[0] = b[0].wrapping_sub(rng.random_range(1..4)),
            _ => damage(&mut rng, &mut b),
        }
        change_pages(&b);
    }
}
