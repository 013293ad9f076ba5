//! sparse opened for check (`OpenOptions::for_check`): table blocks that
//! fail their checksum read as empty (`Cache::lost`). The tables are read
//! lazily when serving, so here every block ever written (where the file
//! tells its holes), every block the summaries say holds something, and
//! every block a lost or impossible summary entry covers is read at open:
//! the damage is all found before check reports and repair plans, and a
//! damaged block that once held entries is rewritten even if it holds none
//! now. Each summary entry is then set to what its blocks now hold, so
//! allocation and scans agree with the emptied blocks; what the lost blocks
//! held is told to check and repair (`LostBlock`).

use std::collections::BTreeSet;

use super::geometry::{Place, RECORDS_PER_BLOCK, RECORD_BYTES, REFS_PER_BLOCK};
use super::{read_u32, read_u64, Sparse};
use crate::backend::{Held, LostBlock};
use crate::backends::disktable::geometry::HEADER;
use crate::error::Result;

impl Sparse {
    /// Read every block in use, and recount the summary entries of those
    /// `odd_refs`/`odd_lbns` name, those of lost summary blocks, and those
    /// whose blocks were lost.
    pub(super) fn salvage(
        &mut self,
        mut odd_refs: BTreeSet<u64>,
        mut odd_lbns: BTreeSet<u64>,
    ) -> Result<()> {
        self.read_written_blocks()?;
        for b in self.t.cache.lost.clone() {
            match self.geo.place(b) {
                Place::Summary(k) => odd_refs.extend(self.geo.ref_blocks_of_summary(k)),
                Place::LbnSummary(k) => odd_lbns.extend(self.geo.lbn_blocks_of_summary(k)),
                _ => {}
            }
        }
        let lbn_blocks: BTreeSet<u64> = (self.mapped.nonzero().map(|(i, _)| i))
            .chain(odd_lbns)
            .collect();
        for i in lbn_blocks {
            self.recount_lbn_block(i)?;
        }
        let ref_blocks: BTreeSet<u64> = (self.summary.nonzero().map(|(r, _)| r))
            .chain(self.recorded.nonzero().map(|(r, _)| r))
            .chain(odd_refs)
            .collect();
        for r in ref_blocks {
            self.recount_ref_block(r)?;
        }
        self.used = self.summary.sum();
        self.records = self.recorded.sum();
        Ok(())
    }

    /// Read (and so check) every table block but the root that the file
    /// says was ever written. One the summaries call empty reads as empty
    /// if damaged, which is what they say it holds.
    fn read_written_blocks(&mut self) -> Result<()> {
        let Some(runs) = self.t.written_runs(1..self.geo.table_blocks())? else {
            return Ok(());
        };
        for b in runs.into_iter().flatten() {
            self.t.cache.get(b)?;
        }
        Ok(())
    }

    /// Set LBN-map block `i`'s summary entry to the LBNs it maps.
    fn recount_lbn_block(&mut self, i: u64) -> Result<()> {
        let lbns = self.geo.lbns_of_block(i);
        let (b, _) = self.geo.lbn(lbns.start);
        let block = self.t.cache.get(b)?;
        let n = lbns
            .clone()
            .filter(|&l| read_u64(block, HEADER + self.geo.lbn(l).1) != 0)
            .count() as u16;
        if n != self.mapped.get(i) {
            tracing::warn!(
                "sparse LBN summary: LBN-map block {i} maps {n} LBNs, the summary said {}",
                self.mapped.get(i)
            );
            self.mapped.set(i, n);
            self.t.set_u16(self.geo.lbn_summary(i), n)?;
        }
        Ok(())
    }

    /// Set refcount block `r`'s summary entry to the PBNs in use and the
    /// records among its PBNs.
    fn recount_ref_block(&mut self, r: u64) -> Result<()> {
        let pbns = self.geo.pbns_of_ref_block(r);
        let (b, _) = self.geo.refcount(pbns.start);
        let counts = self.t.cache.get(b)?;
        let used = pbns
            .clone()
            .filter(|&p| read_u32(counts, HEADER + (p % REFS_PER_BLOCK) as usize * 4) != 0)
            .count() as u16;
        let mut recorded = 0u16;
        let mut p = pbns.start;
        while p < pbns.end {
            let (b, _) = self.geo.record(p);
            let records = self.t.cache.get(b)?;
            let end = ((p / RECORDS_PER_BLOCK + 1) * RECORDS_PER_BLOCK).min(pbns.end);
            for q in p..end {
                let at = HEADER + (q % RECORDS_PER_BLOCK) as usize * RECORD_BYTES;
                recorded += (records[at] != 0) as u16;
            }
            p = end;
        }
        if (used, recorded) != (self.summary.get(r), self.recorded.get(r)) {
            tracing::warn!(
                "sparse refcount summary: refcount block {r} has {used} PBNs in use and {recorded} records, the summary said {} and {}",
                self.summary.get(r),
                self.recorded.get(r)
            );
            self.summary.set(r, used);
            self.recorded.set(r, recorded);
            self.write_summary(r)?;
        }
        Ok(())
    }

    /// What lost block `b` held.
    pub(super) fn held(&self, b: u64) -> LostBlock {
        let held = match self.geo.place(b) {
            Place::LbnMap(i) => Held::Mappings(self.geo.lbns_of_block(i)),
            Place::Refcounts(r) => Held::Counts(self.geo.pbns_of_ref_block(r)),
            Place::Records(j) => Held::Fingerprints(self.geo.pbns_of_record_block(j)),
            // The root is never read as empty (`Cache::salvage`).
            Place::Root | Place::Summary(_) | Place::LbnSummary(_) => Held::Summary,
        };
        LostBlock {
            table: self.geo.area().table_name(b),
            block: b,
            held,
        }
    }
}
