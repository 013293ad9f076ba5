//! Repacking (issue 7's garbage collection of fragments): blocks whose
//! live fragments fill at most `REPACK_LIVE_PERCENT` of them have those
//! fragments copied, best fit largest first, into fewer new blocks; then
//! counts, hash index entries and LBN mappings move to the new addresses.
//!
//! # When a round is worth it
//! A round costs the blocks it writes, the blocks it reads to weigh them,
//! two scans of the whole LBN map and hash index, and a commit; what it
//! gives back is the blocks it frees (chosen minus written). The old rule
//! (any block under 75 % live, any round freeing one block) once rewrote
//! 190 MiB to give back 2 MiB. Now:
//! - a block is a candidate only if its live fragments fill at most half
//!   of it (`REPACK_LIVE_PERCENT`), so packing candidates two or more to a
//!   block frees about one block per block written;
//! - a round is carried out only if it frees at least as many blocks as it
//!   writes (never more bytes rewritten than given back), and at least
//!   `min_gain` blocks: a 1/1024 share of the device, at least 1 and at
//!   most `REPACK_MIN_GAIN` (256 blocks, 1 MiB at 4 KiB chunks), since
//!   the scans cost in proportion to the device;
//! - except near full (fewer free blocks than `min_gain`): there any block
//!   freed may decide whether the next write fits, so any gain goes.
//!
//! Crash safety: the new blocks are written and synced before any metadata
//! names them, and the move is one change of the backend's in-memory
//! state that the engine commits right after; the old blocks are retired,
//! not freed, so until that commit is durable (and the readers that looked
//! them up are done) they still hold every old fragment. A crash before
//! the commit leaves the old mappings and old blocks; after, the new ones.

use std::collections::HashMap;

use tracing::warn;

use super::blocks::{Hold, UNKNOWN};
use super::{Addressing, State};
use crate::backend::scan_all;
use crate::backend::MetadataBackend;
use crate::config::{Lbn, Pbn};
use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::pack::{self, Packer};
use crate::placement::ReclaimReport;

/// Blocks whose live fragments fill at most this share are repacked.
pub const REPACK_LIVE_PERCENT: usize = 50;

/// Most blocks a round must free to be carried out (see the module notes).
pub const REPACK_MIN_GAIN: u64 = 256;

/// Whether a round that empties `chosen` blocks into `written` new ones is
/// worth its I/O, on a device of `count` blocks with `free` free.
pub fn repack_worth_it(chosen: u64, written: u64, count: u64, free: u64) -> bool {
    let Some(gain) = chosen.checked_sub(written).filter(|&g| g > 0) else {
        return false;
    };
    let min_gain = (count / 1024).clamp(1, REPACK_MIN_GAIN);
    if free < min_gain {
        return true;
    }
    gain >= written && gain >= min_gain
}

impl State {
    pub(super) fn repack_blocks(
        &mut self,
        meta: &mut dyn MetadataBackend,
        max_blocks: usize,
    ) -> Result<ReclaimReport> {
        self.usable()?;
        // Weigh what is on disk: write the open bins first.
        self.write_all()?;
        let mut report = ReclaimReport::default();
        let chosen = self.choose(max_blocks, &mut report)?;
        // Near full, move only as many blocks' fragments as the free
        // blocks can take (each round frees some for the next).
        let mut chosen = chosen;
        let cs = self.cfg.chunk_size as usize;
        let (mut packers, mut placed) = pack_best_fit(&chosen, cs, self.addressing);
        while !chosen.is_empty() && packers.len() as u64 > self.blocks.free() {
            chosen.truncate(chosen.len() * 3 / 4);
            (packers, placed) = pack_best_fit(&chosen, cs, self.addressing);
            report.more = true;
        }
        let (count, free) = (self.blocks.count(), self.blocks.free());
        if !repack_worth_it(chosen.len() as u64, packers.len() as u64, count, free) {
            return Ok(report);
        }
        let mut new_blocks = Vec::with_capacity(packers.len());
        for _ in &packers {
            match self.blocks.alloc(Hold::Bin, 0) {
                Some(b) => new_blocks.push(b),
                None => {
                    for b in new_blocks {
                        self.blocks.drop_bin(b);
                    }
                    warn!("repack: no free block to pack into; free space first");
                    return Ok(report);
                }
            }
        }
        let data = self.data.clone();
        let written = packers
            .iter()
            .zip(&new_blocks)
            .try_for_each(|(p, &b)| data.write_at(&p.seal(), self.cfg.pbn_offset(b)))
            .and_then(|_| data.sync());
        if let Err(e) = written {
            for b in new_blocks {
                self.blocks.drop_bin(b);
            }
            return Err(e);
        }
        // Move the counts, then the index entries and mappings naming them.
        let mut moves: HashMap<Pbn, Pbn> = HashMap::with_capacity(placed.len());
        for &(old, i, slot) in &placed {
            let new = self.addressing.addr(new_blocks[i], slot as u64);
            let count = meta.refcount_get(old)?;
            meta.refcount_set(new, count)?;
            meta.refcount_set(old, 0)?;
            self.blocks.revive(new);
            moves.insert(old, new);
        }
        let mut entries: Vec<(Fingerprint, Pbn, Pbn)> = Vec::new();
        scan_all(
            |c, page| meta.hash_index_scan(c, 4096, page),
            |fp, pbn| {
                if let Some(&new) = moves.get(&pbn) {
                    entries.push((fp, pbn, new));
                }
                Ok(())
            },
        )?;
        // Collected first: deleting during an open-addressing scan can
        // move entries behind the cursor.
        for (fp, old, new) in entries {
            meta.hash_index_delete(&fp, old)?;
            meta.hash_index_insert(&fp, new)?;
        }
        let mut mappings: Vec<(Lbn, Pbn)> = Vec::new();
        scan_all(
            |c, page| meta.lbn_map_scan(c, 4096, page),
            |lbn, pbn| {
                if let Some(&new) = moves.get(&pbn) {
                    mappings.push((lbn, new));
                }
                Ok(())
            },
        )?;
        for (lbn, new) in mappings {
            meta.lbn_map_insert(lbn, new)?;
        }
        for (p, &b) in packers.iter().zip(&new_blocks) {
            self.blocks.sealed(b, p.len(), p.used() as u32);
        }
        for (block, _) in &chosen {
            self.blocks.retire(*block);
        }
        report.blocks_repacked = chosen.len() as u64;
        report.blocks_written = new_blocks.len() as u64;
        report.fragments_moved = placed.len() as u64;
        report.moved = moves.into_iter().collect();
        self.stats.repacked_blocks += report.blocks_repacked;
        self.stats.repack_blocks_written += report.blocks_written;
        self.stats.fragments_moved += report.fragments_moved;
        Ok(report)
    }

    /// Packed blocks worth repacking, with their live fragments, up to
    /// `max_blocks`, scanning on from where the last pass stopped.
    #[allow(clippy::type_complexity)]
    fn choose(
        &mut self,
        max_blocks: usize,
        report: &mut ReclaimReport,
    ) -> Result<Vec<(u64, Vec<(usize, Vec<u8>)>)>> {
        let cs = self.cfg.chunk_size as usize;
        let n = self.blocks.count();
        let mut chosen = Vec::new();
        let mut buf = vec![0u8; cs];
        let data = self.data.clone();
        let start = self.repack_cursor % n.max(1);
        self.repack_cursor = 0;
        for step in 0..n {
            let b = (start + step) % n;
            if chosen.len() >= max_blocks {
                report.more = true;
                self.repack_cursor = b;
                break;
            }
            let live = self.blocks.live(b);
            if live == 0 || self.blocks.is_raw(b) || self.blocks.hold(b) != Hold::None {
                continue;
            }
            if live.count_ones() as usize == pack::MAX_SLOTS {
                // Every slot lives: no merge can take a block away.
                continue;
            }
            let (slots, fill) = (self.blocks.slots(b), self.blocks.fill(b));
            let full_enough = fill != UNKNOWN && fill as usize * 100 > cs * REPACK_LIVE_PERCENT;
            if slots != 0 && live.count_ones() == slots as u32 && full_enough {
                continue;
            }
            report.blocks_read += 1;
            if let Err(e) = data.read_at(&mut buf, self.cfg.pbn_offset(b)) {
                warn!("repack: block {b} left alone: {e}");
                report.damaged_blocks += 1;
                continue;
            }
            let table = match pack::slots(&buf) {
                Ok(t) => t,
                Err(e) => {
                    warn!("repack: block {b} left alone: {e}");
                    report.damaged_blocks += 1;
                    continue;
                }
            };
            let mut frags = Vec::new();
            let mut damaged = live >> table.len() != 0;
            for slot in (0..table.len()).filter(|s| live & (1 << s) != 0) {
                match pack::fragment(&buf, slot) {
                    Ok(f) => frags.push((slot, f.to_vec())),
                    Err(e) => {
                        warn!("repack: block {b} left alone: {e}");
                        damaged = true;
                    }
                }
            }
            if damaged {
                report.damaged_blocks += 1;
                continue;
            }
            let live_bytes: usize = frags.iter().map(|(_, f)| f.len()).sum();
            self.blocks.set_layout(b, table.len(), live_bytes as u32);
            if live_bytes * 100 <= cs * REPACK_LIVE_PERCENT {
                chosen.push((b, frags));
            }
        }
        Ok(chosen)
    }
}

/// Best fit, largest first: the live fragments of `chosen` blocks into as
/// few new blocks as they take. Returns the new blocks' packers and, per
/// fragment, (old address, packer, slot).
#[allow(clippy::type_complexity)]
fn pack_best_fit(
    chosen: &[(u64, Vec<(usize, Vec<u8>)>)],
    cs: usize,
    addressing: Addressing,
) -> (Vec<Packer>, Vec<(Pbn, usize, usize)>) {
    let mut fragments: Vec<(Pbn, &[u8])> = chosen
        .iter()
        .flat_map(|(block, frags)| {
            frags
                .iter()
                .map(move |(slot, f)| (addressing.addr(*block, *slot as u64), &f[..]))
        })
        .collect();
    fragments.sort_by_key(|(_, f)| std::cmp::Reverse(f.len()));
    let mut packers: Vec<Packer> = Vec::new();
    let mut placed = Vec::with_capacity(fragments.len());
    for (old, f) in fragments {
        let best = packers
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.slack_after(f.len()).map(|left| (left, i)))
            .min()
            .map(|(_, i)| i);
        let i = best.unwrap_or_else(|| {
            packers.push(Packer::new(cs));
            packers.len() - 1
        });
        let slot = packers[i].add(f).expect("chosen for having room");
        placed.push((old, i, slot));
    }
    (packers, placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_must_free_as_much_as_it_writes_and_enough_for_its_scans() {
        const BIG: u64 = 1 << 20; // blocks: min gain 256
        assert!(!repack_worth_it(10, 10, BIG, BIG), "frees nothing");
        assert!(!repack_worth_it(190, 188, BIG, BIG), "190 rewritten for 2");
        assert!(
            !repack_worth_it(1000, 600, BIG, BIG),
            "writes more than it frees"
        );
        assert!(!repack_worth_it(400, 200, BIG, BIG), "200 freed: under 256");
        assert!(repack_worth_it(600, 300, BIG, BIG));
        // A small device: 1/1024 of it.
        assert!(repack_worth_it(20, 10, 10_240, 5_000));
        assert!(!repack_worth_it(18, 10, 10_240, 5_000));
        // Near full, any block freed counts.
        assert!(repack_worth_it(3, 2, BIG, 100));
        assert!(!repack_worth_it(3, 3, BIG, 100));
    }
}
