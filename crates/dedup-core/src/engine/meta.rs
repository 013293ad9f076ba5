//! What the metadata mutex guards: the store, and the totals the engine
//! keeps in its private record (mapped LBNs, hash index entries). Every
//! change that moves a total, frees a chunk or remaps an LBN goes through
//! here, so the totals stay exact and the placement hears of it.

use crate::backend::MetadataBackend;
use crate::config::{Lbn, Pbn};
use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::placement::Placement;
use crate::record::{Record, Totals};

pub(crate) struct Meta {
    pub(crate) store: Box<dyn MetadataBackend>,
    pub(crate) totals: Totals,
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
        self.totals.lbns_mapped += old.is_none() as u64;
        p.mapped(lbn, Some(pbn), fp);
        Ok(old)
    }

    /// Unmap `lbn`; returns what it mapped to.
    pub(crate) fn unmap(&mut self, p: &dyn Placement, lbn: Lbn) -> Result<Option<Pbn>> {
        let old = self.store.lbn_map_delete(lbn)?;
        if old.is_some() {
            self.totals.lbns_mapped = self.totals.lbns_mapped.saturating_sub(1);
            p.mapped(lbn, None, None);
        }
        Ok(old)
    }

    pub(crate) fn index(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<()> {
        self.store.hash_index_insert(fp, pbn)?;
        self.totals.hash_entries += 1;
        Ok(())
    }

    /// Remove the index entry `fp -> pbn`; returns whether it was there.
    pub(crate) fn unindex(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<bool> {
        let removed = self.store.hash_index_delete(fp, pbn)?;
        if removed {
            self.totals.hash_entries = self.totals.hash_entries.saturating_sub(1);
        }
        Ok(removed)
    }

    /// Drop one reference; returns the new count. At 0 the placement may
    /// reuse the chunk's space after the next commit.
    pub(crate) fn release(&mut self, p: &dyn Placement, pbn: Pbn) -> Result<u32> {
        let n = self.store.refcount_dec(pbn)?;
        if n == 0 {
            p.freed(pbn);
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

    /// The record to commit with the store now.
    pub(crate) fn record(&self, counters: Vec<u64>, p: &dyn Placement) -> Vec<u64> {
        Record {
            totals: Some(self.totals),
            counters,
            placement: p.record(),
        }
        .encode()
    }
}
