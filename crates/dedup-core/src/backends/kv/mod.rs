//! A metadata backend on any ordered key-value engine with atomic commits
//! (`KvStore`): the cowbtree and lsm backends are this plus their engine.
//!
//! Changes since the last commit live in an in-memory, ordered write set
//! (the transaction); reads look there first, then in the engine. A commit
//! hands the whole write set and the totals to the engine as one atomic,
//! durable batch. PBNs freed in a transaction are quarantined until it
//! commits (`SpaceMap`), so no chunk a durable mapping may name is
//! overwritten (Dmdedup §2.6.3).
//!
//! A transaction ends when the engine commits: on FLUSH/FUA, or when this
//! backend asks (`wants_commit`) after `txn_writes` LBN updates, or when the
//! write set reaches three quarters of the cache budget.

pub mod guard;
pub mod store;

use std::ops::Bound;

use crate::backend::{BackendUsage, MetadataBackend, ScanCursor, Upkeep};
use crate::backends::counts;
use crate::backends::space_map::SpaceMap;
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::superblock::{DeviceState, Superblock};

use store::{Changes, KvStore, StoreState};

/// RAM one write-set entry costs, roughly, for the cache budget.
const ENTRY_BYTES: u64 = 96;

pub struct KvBackend<S: KvStore> {
    name: &'static str,
    cfg: DeviceConfig,
    store: S,
    changes: Changes,
    space: SpaceMap,
    /// The engine's private record, committed with every batch.
    private: Vec<u64>,
    /// LBN updates per transaction; 0: only FLUSH/FUA (and cache pressure) commit.
    txn_writes: u64,
    writes_in_txn: u64,
    max_changes: usize,
    /// Our superblock lives on this device; the engine's files are the store's.
    meta: Box<dyn BlockFile>,
    superblock: Superblock,
    writable: bool,
}

impl<S: KvStore> KvBackend<S> {
    /// Open over `store`, rebuilding the allocation map from the stored counts.
    pub fn open(
        name: &'static str,
        mut store: S,
        superblock: Superblock,
        meta: Box<dyn BlockFile>,
        txn_writes: u64,
        cache_bytes: u64,
        writable: bool,
    ) -> Result<Self> {
        let cfg = superblock.config.clone();
        let state = store.state()?;
        let mut space = SpaceMap::new(cfg.pbn_space());
        let mut used = 0u64;
        store.for_each_refcount(&mut |pbn, count| {
            if pbn >= cfg.pbn_space() || count == 0 {
                return Err(Error::corrupt(
                    format!("{name} refcounts"),
                    format!("PBN {pbn} with count {count} is out of range"),
                ));
            }
            space.mark_used(pbn);
            used += 1;
            Ok(())
        })?;
        if used != state.pbns_used {
            return Err(Error::corrupt(
                format!("{name} state"),
                format!(
                    "{} PBNs hold data but the committed state says {}",
                    used, state.pbns_used
                ),
            ));
        }
        space.set_cursor(state.alloc_cursor);
        let mut backend = KvBackend {
            name,
            cfg,
            store,
            changes: Changes::default(),
            space,
            private: state.counters,
            txn_writes,
            writes_in_txn: 0,
            max_changes: ((cache_bytes * 3 / 4) / ENTRY_BYTES).max(1024) as usize,
            meta,
            superblock,
            writable,
        };
        if writable {
            backend.superblock.state = DeviceState::Open;
            backend.superblock.write(backend.meta.as_ref())?;
        }
        Ok(backend)
    }

    fn refcount(&mut self, pbn: Pbn) -> Result<u32> {
        if pbn >= self.space.total() {
            return Err(Error::corrupt(
                format!("{} refcounts", self.name),
                format!("PBN {pbn} is beyond the data device"),
            ));
        }
        match self.changes.refcounts.get(&pbn) {
            Some(&c) => Ok(c),
            None => self.store.get_refcount(pbn),
        }
    }

    fn current_state(&self) -> StoreState {
        StoreState {
            // Mapped LBNs and index entries are counted by the engine, in
            // its private record.
            lbns_mapped: 0,
            pbns_used: self.space.used(),
            hash_entries: 0,
            alloc_cursor: self.space.cursor(),
            counters: self.private.clone(),
        }
    }

    fn check_lbn(&self, lbn: Lbn) -> Result<()> {
        if lbn < self.cfg.logical_chunks() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "LBN {lbn} is beyond the device ({} chunks)",
                self.cfg.logical_chunks()
            )))
        }
    }
}

fn lbn_cursor(cursor: &ScanCursor) -> Result<Option<Lbn>> {
    match cursor.0.len() {
        0 => Ok(None),
        8 => Ok(Some(u64::from_be_bytes(
            cursor.0[..].try_into().expect("8 bytes"),
        ))),
        _ => Err(Error::InvalidArgument("not an LBN scan cursor".into())),
    }
}

fn hash_cursor(cursor: &ScanCursor) -> Result<Option<Fingerprint>> {
    match cursor.0.len() {
        0 => Ok(None),
        32 => Ok(Some(Fingerprint(
            cursor.0[..].try_into().expect("32 bytes"),
        ))),
        _ => Err(Error::InvalidArgument(
            "not a hash index scan cursor".into(),
        )),
    }
}

/// Merge one page of committed entries with the write set over the same
/// key range. Returns where the next page starts (None: scan complete).
fn merge_page<K: Ord + Copy>(
    committed: Vec<(K, Pbn)>,
    full_page: bool,
    after: Option<K>,
    pending: &std::collections::BTreeMap<K, Option<Pbn>>,
    out: &mut Vec<(K, Pbn)>,
) -> Option<K> {
    let upper = if full_page {
        committed.last().map(|e| e.0)
    } else {
        None
    };
    let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
    let upper_bound = upper.map_or(Bound::Unbounded, Bound::Included);
    let mut overlay = pending.range((lower, upper_bound)).peekable();
    let mut stored = committed.into_iter().peekable();
    loop {
        let take_overlay = match (stored.peek(), overlay.peek()) {
            (None, None) => break,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some(s), Some(o)) => *o.0 <= s.0,
        };
        if take_overlay {
            let (k, v) = overlay.next().expect("peeked");
            if stored.peek().is_some_and(|s| s.0 == *k) {
                stored.next();
            }
            if let Some(pbn) = v {
                out.push((*k, *pbn));
            }
        } else {
            out.push(stored.next().expect("peeked"));
        }
    }
    upper
}

impl<S: KvStore> MetadataBackend for KvBackend<S> {
    fn lbn_map_lookup(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        self.check_lbn(lbn)?;
        match self.changes.lbn_map.get(&lbn) {
            Some(&v) => Ok(v),
            None => self.store.get_lbn(lbn),
        }
    }

    fn lbn_map_insert(&mut self, lbn: Lbn, pbn: Pbn) -> Result<Option<Pbn>> {
        let old = self.lbn_map_lookup(lbn)?;
        self.changes.lbn_map.insert(lbn, Some(pbn));
        self.writes_in_txn += 1;
        Ok(old)
    }

    fn lbn_map_delete(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        // No range check here: a repair deletes stray keys beyond the device.
        let current = match self.changes.lbn_map.get(&lbn) {
            Some(&v) => v,
            None => self.store.get_lbn(lbn)?,
        };
        if current.is_some() {
            self.changes.lbn_map.insert(lbn, None);
            self.writes_in_txn += 1;
        }
        Ok(current)
    }

    fn hash_index_lookup(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        match self.changes.hash_index.get(fp) {
            Some(&v) => Ok(v),
            None => self.store.get_hash(fp),
        }
    }

    fn hash_index_insert(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<()> {
        if let Some(existing) = self.hash_index_lookup(fp)? {
            return Err(Error::corrupt(
                format!("{} hash index", self.name),
                format!(
                    "fingerprint already indexed at PBN {existing}, cannot also index PBN {pbn}"
                ),
            ));
        }
        self.changes.hash_index.insert(*fp, Some(pbn));
        Ok(())
    }

    fn hash_index_delete(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<bool> {
        let present = self.hash_index_lookup(fp)? == Some(pbn);
        if present {
            self.changes.hash_index.insert(*fp, None);
        }
        Ok(present)
    }

    fn alloc_pbn(&mut self) -> Result<Option<Pbn>> {
        let Some(pbn) = self.space.alloc() else {
            return Ok(None);
        };
        if self.refcount(pbn)? != 0 {
            return Err(Error::corrupt(
                format!("{} refcounts", self.name),
                format!("PBN {pbn} is free in the allocation map but has references"),
            ));
        }
        self.changes.refcounts.insert(pbn, 1);
        Ok(Some(pbn))
    }

    fn refcount_inc(&mut self, pbn: Pbn) -> Result<u32> {
        let count = self.refcount(pbn)?;
        let name = self.name;
        let c = counts::incremented(format_args!("{name} refcounts"), pbn, count)?;
        self.changes.refcounts.insert(pbn, c);
        Ok(c)
    }

    fn refcount_dec(&mut self, pbn: Pbn) -> Result<u32> {
        let count = self.refcount(pbn)?;
        let name = self.name;
        let c = counts::decremented(format_args!("{name} refcounts"), pbn, count)?;
        self.changes.refcounts.insert(pbn, c);
        if c == 0 {
            self.space.free(pbn);
        }
        Ok(c)
    }

    fn refcount_get(&mut self, pbn: Pbn) -> Result<u32> {
        self.refcount(pbn)
    }

    fn refcount_set(&mut self, pbn: Pbn, count: u32) -> Result<()> {
        let c = self.refcount(pbn)?;
        match (c, count) {
            (0, n) if n > 0 => self.space.mark_used(pbn),
            (n, 0) if n > 0 => self.space.free(pbn),
            _ => {}
        }
        self.changes.refcounts.insert(pbn, count);
        Ok(())
    }

    fn hash_index_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        let after = hash_cursor(cursor)?;
        let mut page = Vec::with_capacity(max);
        self.store.scan_hash(after.as_ref(), max, &mut page)?;
        let full = page.len() >= max;
        let next = merge_page(page, full, after, &self.changes.hash_index, out);
        Ok(next.map(|fp| ScanCursor(fp.0.to_vec())))
    }

    fn lbn_map_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Lbn, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        let after = lbn_cursor(cursor)?;
        let mut page = Vec::with_capacity(max);
        self.store.scan_lbn(after, max, &mut page)?;
        let full = page.len() >= max;
        let next = merge_page(page, full, after, &self.changes.lbn_map, out);
        Ok(next.map(|lbn| ScanCursor(lbn.to_be_bytes().to_vec())))
    }

    fn commit(&mut self, private: &[u64]) -> Result<()> {
        self.private = private.to_vec();
        let state = self.current_state();
        self.store.apply(&self.changes, &state)?;
        self.changes.clear();
        self.space.commit();
        self.writes_in_txn = 0;
        Ok(())
    }

    fn wants_commit(&self) -> bool {
        (self.txn_writes > 0 && self.writes_in_txn >= self.txn_writes)
            || self.changes.len() >= self.max_changes
    }

    fn close(&mut self, private: &[u64]) -> Result<()> {
        if !self.writable {
            return Ok(());
        }
        self.commit(private)?;
        self.store.close()?;
        self.superblock.state = DeviceState::Clean;
        self.superblock.write(self.meta.as_ref())?;
        self.writable = false;
        Ok(())
    }

    fn private_data(&self) -> &[u64] {
        &self.private
    }

    fn usage(&self) -> BackendUsage {
        BackendUsage {
            pbns_used: self.space.used(),
            pbns_free: self.space.allocatable(),
            metadata_bytes: self.store.size_bytes(),
            io: self.store.io_stats(),
            index: None,
        }
    }
}

// Nothing beyond the seam.
impl<S: KvStore> Upkeep for KvBackend<S> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn merged_pages_prefer_the_write_set_and_drop_deletions() {
        let mut pending = BTreeMap::new();
        pending.insert(2u64, None); // deleted
        pending.insert(3u64, Some(30)); // changed
        pending.insert(4u64, Some(40)); // new
        pending.insert(9u64, Some(90)); // beyond this page
        let committed = vec![(1, 10), (2, 20), (3, 31), (5, 50)];
        let mut out = Vec::new();
        let next = merge_page(committed, true, None, &pending, &mut out);
        assert_eq!(out, vec![(1, 10), (3, 30), (4, 40), (5, 50)]);
        assert_eq!(next, Some(5));
        let mut out = Vec::new();
        let next = merge_page(vec![], false, Some(5), &pending, &mut out);
        assert_eq!(out, vec![(9, 90)]);
        assert_eq!(next, None);
    }
}
