//! Writing a block by its fingerprint alone (a restore by fingerprint,
//! issue 39): where the hash index holds the fingerprint, the LBN is
//! pointed at that chunk, as the write path does for a duplicate (Dmdedup
//! §2.4's hit branch: one more reference, no data written). A fingerprint
//! the index lacks is left to the caller, who then writes the bytes.
//!
//! A fingerprint handed here is the caller's word for the block's bytes,
//! so the caller must have it from a source it checked (the backup store
//! checks every segment against its fingerprint). Verify mode shares a
//! chunk only after comparing bytes, which this path has not got: there
//! every block is left to the caller.

use super::chunking;
use super::Engine;
use crate::config::Lbn;
use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::stats::Counters;

impl Engine {
    /// Point each block's LBN at the stored chunk of its fingerprint (the
    /// device's hash) where the hash index has one. Returns, per block in
    /// order, whether it now holds that content: `false` means the caller
    /// must write the block's bytes.
    pub(crate) fn map_known(&self, blocks: &[(Lbn, Fingerprint)]) -> Result<Vec<bool>> {
        let _g = self.enter()?;
        let cs = u64::from(self.cfg.chunk_size);
        for &(lbn, _) in blocks {
            self.check_lbns(lbn, 1)?;
        }
        if self.cfg.verify {
            return Ok(vec![false; blocks.len()]);
        }
        let mut done = Vec::with_capacity(blocks.len());
        for batch in blocks.chunks(chunking::batch_chunks(cs as usize)) {
            let wants_commit = self.map_batch(batch, &mut done)?;
            self.commit_if_wanted(wants_commit)?;
        }
        Ok(done)
    }

    /// One batch of `map_known` under its locks, in the write path's order
    /// (LBN stripes, the commit gate, fingerprint stripes, the metadata
    /// mutex). Returns whether a commit is wanted.
    fn map_batch(&self, batch: &[(Lbn, Fingerprint)], done: &mut Vec<bool>) -> Result<bool> {
        let _lbn_guards = self.lbn_locks.write_many(batch.iter().map(|b| b.0));
        let _batch = self.commit_gate.read();
        self.group.batch();
        let _fp_guards = self
            .fp_locks
            .lock_many(batch.iter().map(|b| b.1.prefix_u64()));
        let p = self.placement.as_ref();
        let c = &self.counters;
        let mut m = self.meta.lock();
        for (_, fp) in batch {
            m.store.touch_for_lookup(fp);
        }
        for &(lbn, fp) in batch {
            // Already there: the chunk the LBN maps to is recorded under
            // this fingerprint (a sampled index may not hold it).
            let current = m.store.lbn_map_lookup(lbn)?;
            let here = match current {
                Some(pbn) => m.store.chunk_fingerprint(pbn)? == Some(fp),
                None => false,
            };
            let found = match here {
                true => current,
                false => m.store.hash_index_lookup(&fp)?,
            };
            let Some(pbn) = found else {
                done.push(false);
                continue;
            };
            Counters::add(&c.writes, 1);
            Counters::add(&c.duplicate_writes, 1);
            if current == Some(pbn) {
                Counters::add(&c.rewrites, 1);
                done.push(true);
                continue;
            }
            // The LBN's new reference, taken before the old one is
            // dropped: the same chunk can never reach 0 between them.
            m.pin(pbn)?;
            let old = match m.map(p, lbn, pbn, Some(&fp)) {
                Ok(old) => old,
                Err(e) => {
                    // Give the pin back: a failed block changes no count.
                    let _ = self.release(&mut m, pbn);
                    return Err(e);
                }
            };
            if let Some(old) = old {
                self.release(&mut m, old)?;
                Counters::add(&c.overwrites, 1);
            }
            done.push(true);
        }
        Ok(m.store.wants_commit() || self.placement.wants_commit())
    }
}
