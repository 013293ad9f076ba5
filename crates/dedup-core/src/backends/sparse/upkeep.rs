//! sparse beyond the metadata seam's 18 methods (`Upkeep`): commits beside
//! the data device's sync, filling a partial index in the background,
//! loading the index's slots ahead of a batch's lookups, giving the
//! journal's reserve back to a full host, naming damaged table blocks.

use super::{cursor_at, Sparse};
use crate::backend::{LostBlock, ScanCursor, Upkeep};
use crate::blockfile::written::Listed;
use crate::config::Pbn;
use crate::error::Result;
use crate::fingerprint::Fingerprint;

impl Upkeep for Sparse {
    fn commit_beside_data(
        &mut self,
        private: &[u64],
        listed: Option<&[Listed]>,
        data_durable: &mut dyn FnMut() -> Result<()>,
    ) -> Option<Result<()>> {
        Some(self.commit_with(private, listed, data_durable))
    }

    fn touch_for_lookup(&self, fp: &Fingerprint) {
        self.index.touch(fp.prefix_u64());
    }

    fn chunk_fingerprint(&mut self, pbn: Pbn) -> Result<Option<Fingerprint>> {
        self.check_pbn(pbn)?;
        self.record(pbn)
    }

    fn warm_index(&mut self, max: usize) -> Result<bool> {
        let Some(from) = self.warm_from else {
            return Ok(false);
        };
        let mut page = Vec::new();
        let next = self.scan_records(&ScanCursor(from.to_le_bytes().to_vec()), max, &mut page)?;
        // Records written since open are in the index already; inserting
        // one again changes nothing (advice, newest wins).
        for (fp, pbn) in &page {
            self.index.insert(fp.prefix_u64(), *pbn);
        }
        self.warmed += page.len() as u64;
        self.warm_from = match next {
            Some(c) => Some(cursor_at(&c)?),
            None => None,
        };
        Ok(self.warm_from.is_some())
    }

    fn release_reserve(&mut self) -> Result<u64> {
        self.t.release_reserve()
    }

    fn lost_blocks(&self) -> Vec<LostBlock> {
        self.t.cache.lost.iter().map(|&b| self.held(b)).collect()
    }
}

impl Sparse {
    /// A commit (`Journaled::commit_beside_data`): `listed`, the data
    /// blocks the journal lists, so that its sync can follow the journal's.
    pub(super) fn commit_with(
        &mut self,
        private: &[u64],
        listed: Option<&[Listed]>,
        data_durable: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        self.private = private.to_vec();
        let written = self
            .t
            .commit_beside_data(&self.state(), listed, data_durable)?;
        self.quarantine.clear();
        if written > 0 {
            self.allocated = self.t.file.allocated()?.unwrap_or(self.allocated);
        }
        Ok(())
    }
}
