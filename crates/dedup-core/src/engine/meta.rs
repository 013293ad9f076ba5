//! What the metadata mutex guards: the store, and the totals the engine
//! keeps in its private record (mapped LBNs, hash index entries, chunks
//! awaiting collection). Every
//! change that moves a total, frees a chunk or remaps an LBN goes through
//! here, so the totals stay exact and the placement hears of it.

use crate::backend::{MetadataBackend, ScanCursor};
use crate::config::{Lbn, Pbn};
use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::placement::Placement;
use crate::record::{Record, Totals};

use super::snapshot::Frozen;

pub(crate) struct Meta {
    pub(crate) store: Box<dyn MetadataBackend>,
    pub(crate) totals: Totals,
    /// Chunks held by the hash index alone (Dmdedup §2.4: +1 from the
    /// index, +1 per LBN, so a count of 1 on an indexed chunk): garbage
    /// until a collection frees it or a duplicate write takes it again.
    /// Moved where counts cross 1 (`release`, `pin`, `unindex`).
    pub(crate) awaiting_gc: u64,
    /// The regions of the LBN map changed since the tracking's mark.
    pub(crate) changes: crate::changes::ChangeMap,
    /// The LBN map as a served backup froze it, while that backup runs.
    pub(crate) snapshot: Option<Frozen>,
}

impl Meta {
    /// Map `lbn` to `pbn`; returns the earlier mapping.
    pub(crate) fn map(
        &mut self,
        p: &dyn Placement,
        lbn: Lbn,
        pbn: Pbn,
        fp: Option<&Fingerprint>,
    ) -> Result<Option<Pbn>> {
        let old = self.store.lbn_map_insert(lbn, pbn)?;
        self.changes.note(lbn);
        self.preserve(lbn, old);
        self.totals.lbns_mapped += old.is_none() as u64;
        p.mapped(lbn, Some(pbn), fp);
        Ok(old)
    }

    /// Unmap `lbn`; returns what it mapped to.
    pub(crate) fn unmap(&mut self, p: &dyn Placement, lbn: Lbn) -> Result<Option<Pbn>> {
        let old = self.store.lbn_map_delete(lbn)?;
        if old.is_some() {
            self.changes.note(lbn);
            self.preserve(lbn, old);
            self.totals.lbns_mapped = self.totals.lbns_mapped.saturating_sub(1);
            p.mapped(lbn, None, None);
        }
        Ok(old)
    }

    /// A snapshot keeps what `lbn` mapped to when it froze the map, the
    /// first time the LBN changes after (copy-on-write of the map entry).
    /// Cannot fail, since the map has changed already: a fingerprint that
    /// cannot be read is kept as unknown (the backup reads and hashes the
    /// chunk), and a snapshot that would keep too much is abandoned.
    fn preserve(&mut self, lbn: Lbn, old: Option<Pbn>) {
        let Some(s) = self.snapshot.as_mut().filter(|s| s.wants(lbn)) else {
            return;
        };
        s.since.note(lbn);
        if s.full() {
            s.abandon();
            return;
        }
        let fp = match old {
            Some(pbn) => self.store.chunk_fingerprint(pbn).unwrap_or(None),
            None => None,
        };
        if let Some(s) = self.snapshot.as_mut() {
            s.keep(lbn, old, fp);
        }
    }

    /// Releases a snapshot deferred, now that it has ended: every one is
    /// tried; the first failure is returned (a failed one leaves a chunk
    /// counted that `dedup check --repair` gives back).
    pub(crate) fn release_all(&mut self, p: &dyn Placement, deferred: Vec<Pbn>) -> Result<()> {
        let mut first = Ok(());
        for pbn in deferred {
            if let Err(e) = self.release(p, pbn) {
                tracing::warn!("releasing chunk {pbn} after a snapshot: {e}");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// A repack gave chunks new addresses: a snapshot follows them.
    pub(crate) fn moved(&mut self, moves: &[(Pbn, Pbn)]) {
        if let Some(s) = self.snapshot.as_mut() {
            s.moved(moves);
        }
    }

    /// Whether a snapshot holds `pbn` (it named it when it froze the map).
    pub(crate) fn holds(&self, pbn: Pbn) -> bool {
        self.snapshot.as_ref().is_some_and(|s| s.holds(pbn))
    }

    pub(crate) fn index(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<()> {
        self.store.hash_index_insert(fp, pbn)?;
        self.totals.hash_entries += 1;
        Ok(())
    }

    /// Remove the index entry `fp -> pbn`; returns whether it was there.
    pub(crate) fn unindex(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<bool> {
        let held_by_index_alone = self.store.refcount_get(pbn)? == 1;
        let removed = self.store.hash_index_delete(fp, pbn)?;
        if removed {
            self.totals.hash_entries = self.totals.hash_entries.saturating_sub(1);
            if held_by_index_alone {
                self.awaiting_gc = self.awaiting_gc.saturating_sub(1);
            }
        }
        Ok(removed)
    }

    /// Take a reference on a chunk the hash index found (a duplicate):
    /// one held by the index alone is garbage no longer.
    pub(crate) fn pin(&mut self, pbn: Pbn) -> Result<u32> {
        let n = self.store.refcount_inc(pbn)?;
        if n == 2 {
            self.awaiting_gc = self.awaiting_gc.saturating_sub(1);
        }
        Ok(n)
    }

    /// Drop one reference; returns the new count. At 1 the chunk is held
    /// by the hash index alone (garbage); at 0 the placement may reuse
    /// its space after the next commit.
    pub(crate) fn release(&mut self, p: &dyn Placement, pbn: Pbn) -> Result<u32> {
        if let Some(s) = self.snapshot.as_mut().filter(|s| s.holds(pbn)) {
            // A chunk the snapshot names keeps its last reference until
            // the snapshot ends. A collection skips held chunks, so only
            // a chunk the hash index does not hold gets here (a verify
            // mode collision's, an undone write's); a commit meanwhile
            // saves its count as 1, which a crash before the end leaves
            // for `dedup check --repair` to give back.
            if self.store.refcount_get(pbn)? == 1 {
                s.defer_release(pbn);
                return Ok(1);
            }
        }
        let n = self.store.refcount_dec(pbn)?;
        match n {
            0 => p.freed(pbn),
            1 => self.awaiting_gc += 1,
            _ => {}
        }
        Ok(n)
    }

    /// Set a count outright (repair), telling the placement when a chunk
    /// is freed or held again.
    pub(crate) fn set_count(&mut self, p: &dyn Placement, pbn: Pbn, count: u32) -> Result<()> {
        let was = self.store.refcount_get(pbn)?;
        self.store.refcount_set(pbn, count)?;
        if was > 0 && count == 0 {
            p.freed(pbn);
        }
        if was == 0 && count > 0 {
            p.revived(pbn)?;
        }
        Ok(())
    }

    /// Count the chunks held by the hash index alone (count 1) anew, a
    /// page of the index at a time: at open after an older record or a
    /// placement's recovery, and after a repair.
    pub(crate) fn count_awaiting_gc(&mut self) -> Result<()> {
        let (mut n, mut page) = (0, Vec::new());
        let mut cursor = Some(ScanCursor::start());
        while let Some(c) = cursor.take() {
            page.clear();
            cursor = self.store.hash_index_scan(&c, 4096, &mut page)?;
            for &(_, pbn) in &page {
                n += (self.store.refcount_get(pbn)? == 1) as u64;
            }
        }
        self.awaiting_gc = n;
        Ok(())
    }

    /// The record to commit with the store now.
    pub(crate) fn record(&self, counters: Vec<u64>, p: &dyn Placement) -> Vec<u64> {
        Record {
            totals: Some(self.totals),
            awaiting_gc: Some(self.awaiting_gc),
            counters,
            placement: p.record(),
        }
        .encode()
    }
}
