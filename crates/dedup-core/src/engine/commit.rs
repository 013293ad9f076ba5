//! Committing metadata (FLUSH, FUA, and the backend's own transaction
//! boundaries), and making room when the data device is full.
//!
//! A commit must capture a state in which every mapping names a chunk whose
//! bytes are on disk, and no write is half-applied (a PBN allocated or pinned
//! but not yet mapped). So writers hold the commit gate shared for a whole
//! batch, and a commit takes it exclusively, syncs the data device, then
//! commits the backend. Backends that are not crash-safe (INRAM) skip the
//! gate: their commit persists nothing.

use std::sync::atomic::Ordering;

use tracing::debug;

use super::Engine;
use crate::error::Result;
use crate::stats::Counters;

/// Most chunks one space-making collection frees: enough for many batches,
/// few enough to keep it short.
const RECLAIM_CHUNKS: u64 = 4096;

impl Engine {
    /// Make every completed write durable (crash-safe backends).
    pub(super) fn commit(&self) -> Result<()> {
        let _quiet = self.crash_safe.then(|| self.commit_gate.write());
        // A backend that places data flushes what it wrote itself.
        if !self.places_data {
            self.data.sync()?;
        }
        let mut m = self.meta.lock();
        m.save_counters(&self.counters.to_vec());
        m.commit()?;
        Counters::add(&self.counters.commits, 1);
        Ok(())
    }

    /// After a batch: commit if the backend asked (transaction length
    /// reached, cache mostly dirty).
    pub(super) fn commit_if_wanted(&self, wanted: bool) -> Result<()> {
        if wanted && self.crash_safe {
            debug!("backend asked for a commit");
            self.commit()?;
        }
        Ok(())
    }

    /// The data device is full: collect some garbage and, for crash-safe
    /// backends, commit so the freed chunks may be reused (they stay
    /// quarantined until the commit that frees them is durable). Returns
    /// whether a retry may now find a free chunk. A collection that found
    /// nothing is not repeated until some chunk has become garbage since.
    pub(super) fn reclaim_for_space(&self) -> Result<bool> {
        let _one_at_a_time = self.gc_lock.lock();
        let releases = self.releases.load(Ordering::Relaxed);
        if self.fruitless_gc_at.load(Ordering::Relaxed) != releases {
            let (_, reclaimed) = self.collect(Some(RECLAIM_CHUNKS))?;
            Counters::add(&self.counters.gc_runs, 1);
            Counters::add(&self.counters.gc_reclaimed, reclaimed);
            if reclaimed == 0 {
                self.fruitless_gc_at.store(releases, Ordering::Relaxed);
            }
        }
        // Chunks freed here or earlier (by an online GC, an undone write)
        // wait in quarantine for a commit: give them one.
        if self.cfg.packs() {
            // Fragments freed by the collection may leave blocks half
            // empty: repack one round (it commits), then commit once more
            // so the blocks it emptied are free.
            self.repack_round()?;
        }
        let (used, free) = super::data_space(&**self.meta.lock());
        let waiting = self.meta.lock().blocks_waiting();
        if (self.crash_safe || self.places_data)
            && (waiting || used + free < self.cfg.physical_chunks)
        {
            self.commit()?;
        }
        // Room made here, or by another thread meanwhile.
        Ok(super::data_space(&**self.meta.lock()).1 > 0)
    }
}
