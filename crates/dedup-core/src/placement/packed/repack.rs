//! Repacking (issue 7's garbage collection of fragments): blocks whose
//! live fragments fill less than `REPACK_BELOW_PERCENT` of them have those
//! fragments copied, best fit largest first, into fewer new blocks; then
//! counts, hash index entries and LBN mappings move to the new addresses.
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

/// Blocks whose live fragments fill less than this share are repacked.
pub const REPACK_BELOW_PERCENT: usize = 75;

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
        if chosen.is_empty() || packers.len() >= chosen.len() {
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
            let full_enough = fill != UNKNOWN && fill as usize * 100 >= cs * REPACK_BELOW_PERCENT;
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
            if live_bytes * 100 < cs * REPACK_BELOW_PERCENT {
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
            .filter_map(|(i, p)| {
                let room = p.room_for_next()?;
                (room >= f.len()).then_some((room - f.len(), i))
            })
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
