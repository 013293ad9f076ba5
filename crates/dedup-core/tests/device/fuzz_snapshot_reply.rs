//! The `snapshot_reply` fuzz target over seeded mutations of real `map`
//! replies of a snapshot session (bit flips, overwritten runs, cuts, and
//! counts off by a few), in CI: nothing may panic, and whatever parses
//! has exactly the blocks asked for.

use dedup_core::fuzzing::snapshot_reply;

use crate::mutations::damage;
use rand::{Rng, SeedableRng};

/// A reply as the server encodes it: per block a tag, 2 followed by a
/// 32-byte fingerprint.
fn reply(rng: &mut rand::rngs::StdRng, blocks: u8) -> Vec<u8> {
    let mut out = vec![blocks];
    for _ in 0..blocks {
        let tag = rng.random_range(0..3u8);
        out.push(tag);
        if tag == 2 {
            out.extend((0..32).map(|_| rng.random::<u8>()));
        }
    }
    out
}

#[test]
fn parsing_mutated_snapshot_replies_never_panics() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(39);
    for _ in 0..4000 {
        let blocks = rng.random_range(0..40u8);
        let mut b = reply(&mut rng, blocks);
        snapshot_reply(&b);
        match rng.random_range(0..4) {
            0 => b[0] = b[0].wrapping_add(rng.random_range(1..4)),
            _ => damage(&mut rng, &mut b),
        }
        snapshot_reply(&b);
    }
}
