//! Garbage collection (Dmdedup §2.4 "Garbage collection"): overwrites and
//! trims leave chunks referenced only by the hash index (count 1). They stay
//! so rewritten data can still be deduplicated, until a GC pass removes their
//! index entries and frees them (count 0) for reuse.
//!
//! Online, a pass takes the metadata mutex for one page of the index at a
//! time, so I/O keeps flowing; every decision is re-checked under the mutex.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::Engine;
use crate::backend::ScanCursor;
use crate::config::Pbn;
use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::placement::ReclaimReport;
use crate::stats::Counters;

/// Index entries examined per mutex hold.
const SCAN_PAGE: usize = 4096;
/// Candidates freed per mutex hold.
const FREE_PAGE: usize = 1024;
/// Most candidates held in memory at once (40 bytes each).
const ROUND: usize = 1 << 20;
/// Blocks one reclaim round may empty (packed: it reads them, and scans
/// the LBN map and hash index once).
const RECLAIM_ROUND: usize = 1 << 14;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GcReport {
    /// Hash index entries examined.
    pub scanned: u64,
    /// Chunks freed.
    pub reclaimed: u64,
    /// Data bytes given back: freed chunks, and on a packing device the
    /// blocks emptied by freed fragments and by repacking.
    pub bytes_reclaimed: u64,
    /// Packed blocks emptied by moving their live fragments into fewer
    /// blocks, the blocks written for them, and the fragments moved.
    #[serde(default)]
    pub blocks_repacked: u64,
    #[serde(default)]
    pub repack_blocks_written: u64,
    #[serde(default)]
    pub fragments_moved: u64,
    /// Packed blocks a repack left alone because they are damaged.
    #[serde(default)]
    pub damaged_blocks: u64,
    pub seconds: f64,
}

impl Engine {
    /// One pass over the hash index, freeing up to `limit` chunks (all, if
    /// `None`): returns (entries scanned, chunks freed). Candidates are
    /// gathered in rounds of at most `ROUND` and freed between rounds, so
    /// memory stays bounded however much garbage there is; entries that a
    /// round's deletions move behind the scan position are left for the next
    /// pass. The mutex is held for one page at a time, and the backend may
    /// commit between pages (a big collection is many transactions).
    /// The caller holds `gc_lock`.
    pub(super) fn collect(&self, limit: Option<u64>) -> Result<(u64, u64)> {
        let limit = limit.unwrap_or(u64::MAX);
        let mut candidates: Vec<(Fingerprint, Pbn)> = Vec::new();
        let mut page = Vec::with_capacity(SCAN_PAGE);
        let mut cursor = Some(ScanCursor::start());
        let (mut scanned, mut freed) = (0u64, 0u64);
        while freed < limit {
            let Some(c) = cursor.take() else { break };
            let want = (limit - freed).min(ROUND as u64) as usize;
            cursor = {
                let mut m = self.meta.lock();
                page.clear();
                let next = m.store.hash_index_scan(&c, SCAN_PAGE, &mut page)?;
                for &(fp, pbn) in &page {
                    if candidates.len() < want && m.store.refcount_get(pbn)? == 1 {
                        candidates.push((fp, pbn));
                    }
                }
                next
            };
            scanned += page.len() as u64;
            if candidates.len() >= want || cursor.is_none() {
                freed += self.free_candidates(&candidates)?;
                candidates.clear();
            }
        }
        Ok((scanned, freed))
    }

    fn free_candidates(&self, candidates: &[(Fingerprint, Pbn)]) -> Result<u64> {
        let mut freed = 0u64;
        for group in candidates.chunks(FREE_PAGE) {
            let wants_commit = {
                let mut m = self.meta.lock();
                for (fp, pbn) in group {
                    // Still held by the index alone? (A writer may have
                    // re-referenced it since the scan.) The entry is
                    // removed by the pair the scan found, not looked up
                    // by fingerprint: a sampled index may not find it.
                    // A chunk a running snapshot names waits for its end.
                    if m.holds(*pbn) {
                        continue;
                    }
                    if m.store.refcount_get(*pbn)? == 1 && m.unindex(fp, *pbn)? {
                        m.release(self.placement.as_ref(), *pbn)?;
                        freed += 1;
                    }
                }
                m.store.wants_commit()
            };
            self.commit_if_wanted(wants_commit)?;
        }
        Ok(freed)
    }

    /// Run a garbage collection pass while the device keeps serving.
    pub fn gc(&self) -> Result<GcReport> {
        let _g = self.enter()?;
        let _one_at_a_time = self.gc_lock.lock();
        let start = Instant::now();
        let blocks_before = self.space(&self.meta.lock()).used;
        let (scanned, reclaimed) = self.collect(None)?;
        Counters::add(&self.counters.gc_runs, 1);
        Counters::add(&self.counters.gc_reclaimed, reclaimed);
        let repack = self.reclaim_all()?;
        if (self.commits && reclaimed > 0)
            || repack.blocks_repacked > 0
            || self.space(&self.meta.lock()).waiting
        {
            // Freed blocks (and those a repack emptied) become free here.
            self.commit()?;
        }
        let blocks_after = self.space(&self.meta.lock()).used;
        self.note_space(blocks_after);
        let cs = self.cfg.chunk_size as u64;
        Ok(GcReport {
            scanned,
            reclaimed,
            bytes_reclaimed: blocks_before.saturating_sub(blocks_after) * cs,
            blocks_repacked: repack.blocks_repacked,
            repack_blocks_written: repack.blocks_written,
            fragments_moved: repack.fragments_moved,
            damaged_blocks: repack.damaged_blocks,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Let the placement reclaim what it holds (packed: repack blocks
    /// whose live share fell low), a round at a time: each round runs with
    /// no write batch in flight and is committed at once; then the readers
    /// that may still hold the old addresses are drained before the
    /// emptied blocks go back to the allocator.
    fn reclaim_all(&self) -> Result<ReclaimReport> {
        let mut total = ReclaimReport::default();
        loop {
            let round = self.reclaim_round()?;
            total.blocks_read += round.blocks_read;
            total.blocks_repacked += round.blocks_repacked;
            total.blocks_written += round.blocks_written;
            total.fragments_moved += round.fragments_moved;
            total.damaged_blocks += round.damaged_blocks;
            // A round that moved nothing will not do better next time.
            if !round.more || round.blocks_repacked == 0 {
                return Ok(total);
            }
        }
    }

    /// One reclaim round, committed if it moved anything, with the readers
    /// that may hold the old addresses drained before the emptied blocks
    /// are released.
    pub(super) fn reclaim_round(&self) -> Result<ReclaimReport> {
        let round = {
            let _quiet = self.commit_gate.write();
            let mut m = self.meta.lock();
            let round = self.placement.reclaim(m.store.as_mut(), RECLAIM_ROUND)?;
            m.moved(&round.moved);
            if round.blocks_repacked > 0 {
                self.commit_locked(&mut m)?;
            }
            round
        };
        if round.blocks_repacked > 0 {
            let _drained = self.move_gate.write();
            self.placement.reclaim_drained();
        }
        Counters::add(&self.counters.gc_repacked_blocks, round.blocks_repacked);
        Ok(round)
    }
}
