//! Committing metadata (FLUSH, FUA, and the backend's own transaction
//! boundaries), and making room when the data device is full.
//!
//! A commit must capture a state in which every mapping names a chunk whose
//! bytes are on disk, and no write is half-applied (a PBN allocated or pinned
//! but not yet mapped). So writers hold the commit gate shared for a whole
//! batch, and a commit takes it exclusively, has the placement make the
//! data durable (`before_commit`), then commits the store with the engine's
//! record; or, for a journaled store and a placement that can split it
//! (`write_unsynced`, `sync_written`), syncs the data on a helper thread
//! beside the store's journal, which lists the data blocks it needs so that
//! recovery can tell whether they landed (`blockfile/written.rs`). Stores
//! that are not crash-safe (INRAM) skip the gate: their commit persists
//! nothing.

use std::sync::atomic::Ordering::{self, SeqCst};

use tracing::debug;

use super::{Engine, OnDrop, NOT_COMMITTING};
use crate::error::Result;
use crate::stats::Counters;

/// Most chunks one space-making collection frees: enough for many batches,
/// few enough to keep it short.
const RECLAIM_CHUNKS: u64 = 4096;

impl Engine {
    /// Make every completed write durable (crash-safe backends).
    pub(super) fn commit(&self) -> Result<()> {
        if !self.commits {
            return self.commit_locked(&mut self.meta.lock());
        }
        // Counted while waiting for the gate: writes arriving meanwhile
        // would queue behind this commit at the gate, so they wait for its
        // room instead (`await_commit_room`).
        self.commits_waiting.fetch_add(1, SeqCst);
        let waiting = OnDrop(|| self.room_settled(|| {}));
        // thin's `ideal` is not crash-safe but writes its windows here, so
        // it needs the batches out of the way too.
        let _quiet = self.commit_gate.write();
        let mut m = self.meta.lock();
        // Published while the gate is held, withdrawn before it opens
        // (dropped first): writes arriving meanwhile may be queued against
        // it instead of waiting out the syncs.
        let room = self.room_in(&m).min(NOT_COMMITTING - 1);
        self.room_settled(|| self.commit_room.store(room, SeqCst));
        std::mem::forget(waiting);
        let _room = OnDrop(|| self.commit_room.store(NOT_COMMITTING, SeqCst));
        self.commit_locked(&mut m)
    }

    /// A commit that was waiting for the gate no longer is: `publish` (its
    /// room), count it out, and wake the writes waiting for it.
    fn room_settled(&self, publish: impl FnOnce()) {
        {
            let _l = self.room_lock.lock();
            publish();
            self.commits_waiting.fetch_sub(1, SeqCst);
        }
        self.room_published.notify_all();
    }

    /// Whether a commit is waiting for the gate and has published no room.
    pub(crate) fn commit_waiting(&self) -> bool {
        self.commits_waiting.load(SeqCst) > 0 && self.commit_room().is_none()
    }

    /// A write about to start: if a commit is waiting for the gate, wait
    /// until it has the gate and has published its room (or gave up). The
    /// write would otherwise queue behind it at the gate and wait out its
    /// syncs; after, write-back may queue it against the room. The wait is
    /// the batches in progress finishing.
    pub(crate) fn await_commit_room(&self) {
        if self.commits_waiting.load(SeqCst) == 0 {
            return;
        }
        let mut l = self.room_lock.lock();
        while self.commit_waiting() {
            // Timed, as a bound on any wake-up missed.
            self.room_published
                .wait_for(&mut l, std::time::Duration::from_millis(5));
        }
    }

    /// `commit`, with the gate (if needed) and the metadata mutex held.
    pub(super) fn commit_locked(&self, m: &mut super::Meta) -> Result<()> {
        let p = self.placement.as_ref();
        let begun = self.group.begin();
        if p.write_unsynced(m.store.as_mut())? {
            let record = m.record(self.counters.to_vec(), p);
            let committed = self.commit_beside_data(m, &record);
            p.after_commit(m.store.as_mut(), committed.is_ok())?;
            committed?;
        } else if p.before_commit(m.store.as_mut(), false)? {
            let record = m.record(self.counters.to_vec(), p);
            let committed = m.store.commit(&record);
            p.after_commit(m.store.as_mut(), committed.is_ok())?;
            committed?;
        }
        // Every write so far is durable: the next list starts empty.
        if let Some(w) = &self.written {
            w.clear();
        }
        self.group.succeeded(begun);
        Counters::add(&self.counters.commits, 1);
        Ok(())
    }

    /// The store's commit, with the placement's data sync beside it: on
    /// the device's data-sync thread, started now, which the store waits for where its
    /// order needs the data durable (`Upkeep::commit_beside_data`).
    /// A FLUSH then costs about one synchronous write instead of two in a
    /// row. On a crash test's disks (no `data_sync`) the sync
    /// runs when the store asks for it, which keeps the I/O in one order.
    fn commit_beside_data(&self, m: &mut super::Meta, record: &[u64]) -> Result<()> {
        let p = self.placement.as_ref();
        // `sync_written` runs once whatever fails: it settles what
        // `write_unsynced` wrote.
        let listed = match self.written.as_ref().and_then(|w| w.listed()) {
            Some(l) => match p.live_blocks(m.store.as_mut(), l) {
                Ok(live) => live,
                Err(e) => {
                    let _ = p.sync_written();
                    return Err(e);
                }
            },
            None => None,
        };
        let listed = listed.as_deref();
        // On a crash test's disks, or with no thread to be had, no
        // helper: the sync runs when the store asks for it.
        let mut sync = self.data_sync.as_ref().and_then(|d| d.start());
        // A store that fails before it asks: the sync still runs (or is
        // waited for, as `Started` does when dropped), and a failure of it
        // stops the device.
        let mut asked = false;
        let mut synced = || {
            asked = true;
            match sync.take() {
                Some(started) => started.wait(),
                None => p.sync_written(),
            }
        };
        let committed = match m.store.commit_beside_data(record, listed, &mut synced) {
            Some(committed) => committed,
            None => synced().and_then(|_| m.store.commit(record)),
        };
        if !asked {
            match sync.take() {
                Some(started) => drop(started.wait()),
                None => drop(p.sync_written()),
            }
        }
        committed
    }

    /// A commit that must not fail for a full host filesystem (a close,
    /// one that gives space back): on ENOSPC the store gives back the room
    /// it reserved for this (`release_reserve`), and it is tried again.
    pub(super) fn commit_or_release(&self, m: &mut super::Meta) -> Result<()> {
        match self.commit_locked(m) {
            Err(e) if e.errno() == libc::ENOSPC && m.store.release_reserve()? > 0 => {
                self.commit_locked(m)
            }
            r => r,
        }
    }

    /// Commit what a TRIM freed, using the store's reserve if the host is
    /// full: while writes stall for space, this is how the device gives
    /// space back through itself. A trim leaves its chunks held by the
    /// hash index alone (count 1) until a collection, so one runs first:
    /// without it the commit frees almost nothing.
    pub(crate) fn commit_freed(&self) -> Result<()> {
        {
            let _one_at_a_time = self.gc_lock.lock();
            self.collect_some()?;
        }
        let _quiet = self.commits.then(|| self.commit_gate.write());
        let mut m = self.meta.lock();
        self.commit_or_release(&mut m)
    }

    /// Collect up to `RECLAIM_CHUNKS` chunks of garbage, unless the last
    /// collection found nothing and no chunk became garbage since. The
    /// caller holds `gc_lock`.
    fn collect_some(&self) -> Result<()> {
        let releases = self.releases.load(Ordering::Relaxed);
        if self.fruitless_gc_at.load(Ordering::Relaxed) != releases {
            let (_, reclaimed) = self.collect(Some(RECLAIM_CHUNKS))?;
            Counters::add(&self.counters.gc_runs, 1);
            Counters::add(&self.counters.gc_reclaimed, reclaimed);
            if reclaimed == 0 {
                self.fruitless_gc_at.store(releases, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// After a batch: commit if the backend asked (transaction length
    /// reached, cache mostly dirty).
    pub(super) fn commit_if_wanted(&self, wanted: bool) -> Result<()> {
        if wanted && self.commits {
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
        self.collect_some()?;
        // Chunks freed here or earlier (by an online GC, an undone write)
        // wait in quarantine for a commit: give them one.
        // Fragments freed by the collection may leave packed blocks half
        // empty: the placement reclaims one round (committed when it moved
        // anything), then a commit makes the blocks it emptied free.
        self.reclaim_round()?;
        let space = self.space(&self.meta.lock());
        if space.waiting || space.used + space.free < self.cfg.physical_chunks {
            self.commit()?;
        }
        // Room made here, or by another thread meanwhile.
        Ok(self.space(&self.meta.lock()).free > 0)
    }
}
