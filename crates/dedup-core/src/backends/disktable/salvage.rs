//! disktable opened for check (`OpenOptions::for_check`): the table
//! blocks `load_space` found failing their checksum read as empty from
//! then on, and each is told as what it held (`LostBlock`), for check to
//! report and repair to rebuild. The hash table's probe runs are made
//! whole again over an emptied block at once, so lookups find every entry
//! that survived.

use super::geometry::{LBNS_PER_BLOCK, REFS_PER_BLOCK, SLOTS_PER_BLOCK};
use super::DiskTable;
use crate::backend::{Held, LostBlock};
use crate::backends::probe;
use crate::error::Result;

impl DiskTable {
    /// Take the blocks in `lost` as empty, and re-seat the probe runs that
    /// crossed an emptied block of the hash table.
    pub(super) fn salvage(&mut self, lost: &[u64]) -> Result<()> {
        for &b in lost {
            self.t.cache.mark_lost(b);
        }
        let first_slot_block = self.geo.slot(0).0;
        for &b in lost.iter().filter(|&&b| b >= first_slot_block) {
            let end = ((b - first_slot_block + 1) * SLOTS_PER_BLOCK).min(self.geo.hash_slots);
            let moved = probe::reseat_run(&mut self.slots(), end)?;
            tracing::info!("disktable hash index: {moved} entries moved over lost block {b}");
        }
        Ok(())
    }

    /// What lost block `b` held.
    pub(super) fn held(&self, b: u64) -> LostBlock {
        let first_ref = self.geo.refcount(0).0;
        let held = if b < first_ref {
            // The LBN map (the root, block 0, is never read as empty).
            let i = b.saturating_sub(1);
            let end = ((i + 1) * LBNS_PER_BLOCK).min(self.cfg.logical_chunks());
            Held::Mappings(i * LBNS_PER_BLOCK..end)
        } else if b < self.geo.slot(0).0 {
            let r = b - first_ref;
            Held::Counts(r * REFS_PER_BLOCK..((r + 1) * REFS_PER_BLOCK).min(self.geo.pbn_space))
        } else {
            // Keyed by fingerprint: which chunks lost their entry is not
            // known, so any chunk the LBN map names without one may have.
            Held::Fingerprints(0..self.geo.pbn_space)
        };
        LostBlock {
            table: self.geo.table_name(b),
            block: b,
            held,
        }
    }
}
