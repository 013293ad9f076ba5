//! Mapping by fingerprint from an encrypted repository
//! (`restore::blocks`). Its segments are named by BLAKE3 keyed over their
//! plain BLAKE3 (`config::KeyedOf::PlainDigest`), and a device's hash
//! index holds plain fingerprints: a keyed one cannot be turned back into
//! the plain one to map by. But every plain fingerprint the device maps
//! can be turned into the repository's. So the first pass sets aside the
//! blocks the device lacks where they are, with their keyed fingerprints;
//! then one walk of the device's map keys every fingerprint it holds and
//! keeps the plain one of each that is set aside; the blocks whose plain
//! fingerprint was found are mapped like any other, and the rest are
//! written.
//!
//! A plain fingerprint is taken only when keying it gives exactly the
//! keyed one the recipe's catalog entry names, so the block is mapped to
//! a chunk whose bytes hash to the segment's plain digest: the same
//! guarantee as mapping in the clear.
//!
//! The first pass's trims wait until the walk is done: a block trimmed
//! first could have been the only one mapping a chunk another block
//! wants. What a chunk stored but mapped by no block (garbage not yet
//! collected) could give is not found: such blocks are written (the write
//! path still stores each chunk once).

use std::collections::HashMap;
use std::io;

use dedup_common::fingerprint::Fingerprint;

use super::blocks::{map_known_checked, BlockTarget};
use crate::block_map::BlockState;
use crate::segment_hash::SegmentHash;

/// Blocks set aside at most (about 80 bytes each while they wait, 20 MB
/// in all: 1 GiB of 4 KiB blocks); past it, blocks are written.
const MAX_WAITING: usize = 1 << 18;
/// Trim runs held back at most; past it they are applied at once.
const MAX_TRIMS: usize = 1 << 16;
/// Blocks asked of the device at a time.
const STEP_BLOCKS: u64 = 1024;

/// What the first pass sets aside in a keyed repository.
#[derive(Default)]
pub(super) struct KeyedWaiting {
    /// Blocks the device lacks where they are, and their keyed
    /// fingerprints, in the order met.
    waiting: Vec<(u64, Fingerprint)>,
    /// Zero runs (first block, count) to trim once the walk is done.
    trims: Vec<(u64, u64)>,
}

impl KeyedWaiting {
    /// Set block `block` aside to map by `keyed` later, if there is room
    /// (the caller wants it either way; what is not set aside is written).
    pub fn wait(&mut self, block: u64, keyed: Fingerprint) {
        if self.waiting.len() < MAX_WAITING {
            self.waiting.push((block, keyed));
        }
    }

    /// Trim a run after the walk (or now, if too many wait).
    pub fn trim(&mut self, target: &dyn BlockTarget, first: u64, count: u64) -> io::Result<()> {
        if self.trims.len() >= MAX_TRIMS {
            let bs = u64::from(target.block_size());
            return target.zero(first * bs, count * bs);
        }
        self.trims.push((first, count));
        Ok(())
    }

    /// Find the plain fingerprints of the blocks set aside in the
    /// device's map, map those it has, then apply the trims held back.
    /// Returns the blocks mapped, in order.
    pub fn resolve(self, target: &dyn BlockTarget, hash: &SegmentHash) -> io::Result<Vec<u64>> {
        let mut plain: HashMap<Fingerprint, Option<Fingerprint>> =
            self.waiting.iter().map(|&(_, k)| (k, None)).collect();
        let mut unfound = plain.len();
        let blocks = target.blocks();
        let mut first = 0;
        while first < blocks && unfound > 0 {
            let n = (blocks - first).min(STEP_BLOCKS);
            for state in target.map(first, n)? {
                let BlockState::Known(p) = state else {
                    continue;
                };
                let Some(keyed) = hash.from_plain(&p) else {
                    continue;
                };
                if let Some(slot @ None) = plain.get_mut(&keyed) {
                    *slot = Some(p);
                    unfound -= 1;
                }
            }
            first += n;
        }
        let known: Vec<(u64, Fingerprint)> = (self.waiting.iter())
            .filter_map(|(block, keyed)| plain.get(keyed).copied().flatten().map(|p| (*block, p)))
            .collect();
        let mut mapped = Vec::new();
        for batch in known.chunks(STEP_BLOCKS as usize) {
            let done = map_known_checked(target, batch)?;
            mapped.extend(
                batch
                    .iter()
                    .zip(done)
                    .filter(|(_, m)| *m)
                    .map(|((b, _), _)| *b),
            );
        }
        let bs = u64::from(target.block_size());
        for (first, count) in self.trims {
            target.zero(first * bs, count * bs)?;
        }
        mapped.sort_unstable();
        Ok(mapped)
    }
}
