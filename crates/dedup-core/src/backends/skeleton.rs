//! A minimal metadata store to copy when writing a new one (the role
//! tikv's `engine_traits` skeleton plays): every `MetadataBackend` method,
//! each as plain as it can be, over `BTreeMap`s and a `Vec` of counts.
//!
//! It keeps everything in RAM and persists nothing: `commit` and `close`
//! only remember the engine's record, so a device built on it forgets all
//! when dropped. To make a real store from it:
//! - persistence: have `commit` write the changes since the last commit
//!   (and `private`) atomically, `close` mark the metadata clean, and an
//!   `open` function load them back (`private_data` then returns them);
//! - crash safety: until `commit` returns, a crash must leave the previous
//!   commit intact, and a PBN freed in the open transaction must not be
//!   handed out again by `alloc_pbn` before it commits (see `backend.rs`);
//! - `wants_commit`: return true when the open transaction grows long.
//!
//! Register it by adding a `StoreKind` and a row to the table in
//! `registry/kinds.rs`, and arms for it in `registry/mod.rs` (`format`,
//! `open`, `metadata_space`). Test it first, unregistered, by building a
//! `registry::Pair` by hand as `tests/seams.rs` does for this skeleton.

use std::collections::BTreeMap;

use crate::backend::{BackendUsage, MetaIoStats, MetadataBackend, ScanCursor};
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, FINGERPRINT_BYTES};

/// The name errors give for this store's structures.
const WHAT: &str = "skeleton refcount array";

pub struct Skeleton {
    logical_chunks: u64,
    /// The linear store: LBN -> PBN, only mapped LBNs present.
    lbn_map: BTreeMap<Lbn, Pbn>,
    /// The sparse store: fingerprint -> PBN.
    hash_index: BTreeMap<Fingerprint, Pbn>,
    /// One count per PBN; 0 = free, so this is also the allocation map.
    refcounts: Vec<u32>,
    /// Where the next sequential allocation search starts.
    next_alloc: Pbn,
    /// PBNs with a non-zero count, so `usage` need not scan.
    pbns_used: u64,
    /// The engine's record as of the last commit or close.
    private: Vec<u64>,
}

impl Skeleton {
    // Empty tables: nothing is ever saved, so there is nothing to load.
    pub fn new(cfg: &DeviceConfig) -> Skeleton {
        Skeleton {
            logical_chunks: cfg.logical_chunks(),
            lbn_map: BTreeMap::new(),
            hash_index: BTreeMap::new(),
            refcounts: vec![0; cfg.pbn_space() as usize],
            next_alloc: 0,
            pbns_used: 0,
            private: Vec::new(),
        }
    }

    // The engine only asks for LBNs of the device; anything else is a caller bug.
    fn check_lbn(&self, lbn: Lbn) -> Result<()> {
        if lbn < self.logical_chunks {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "LBN {lbn} is beyond the device ({} chunks)",
            self.logical_chunks
        )))
    }

    // A PBN beyond the data device can only come from damaged metadata.
    fn check_pbn(&self, pbn: Pbn) -> Result<usize> {
        match self.refcounts.get(pbn as usize) {
            Some(_) => Ok(pbn as usize),
            None => Err(Error::corrupt(
                WHAT,
                format!(
                    "PBN {pbn} is beyond the data device ({} chunks)",
                    self.refcounts.len()
                ),
            )),
        }
    }
}

/// Up to `max` entries of `map` from the cursor's key on; the cursor
/// returned holds the first key not taken. Keys are encoded by `enc`.
fn scan_page<K: Ord + Copy>(
    map: &BTreeMap<K, Pbn>,
    from: Option<K>,
    max: usize,
    out: &mut Vec<(K, Pbn)>,
    enc: impl Fn(&K) -> Vec<u8>,
) -> Option<ScanCursor> {
    let mut it = match from {
        Some(k) => map.range(k..),
        None => map.range(..),
    };
    out.extend(it.by_ref().take(max).map(|(&k, &p)| (k, p)));
    it.next().map(|(k, _)| ScanCursor(enc(k)))
}

fn bad_cursor() -> Error {
    Error::InvalidArgument("not a skeleton scan cursor".into())
}

impl MetadataBackend for Skeleton {
    // Read and write paths need the current mapping of one LBN.
    fn lbn_map_lookup(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        self.check_lbn(lbn)?;
        Ok(self.lbn_map.get(&lbn).copied())
    }

    // The engine drops the old mapping's reference itself, so it needs it back.
    fn lbn_map_insert(&mut self, lbn: Lbn, pbn: Pbn) -> Result<Option<Pbn>> {
        self.check_lbn(lbn)?;
        self.check_pbn(pbn)?;
        Ok(self.lbn_map.insert(lbn, pbn))
    }

    // Zeros and trims unmap; the caller releases what was mapped.
    fn lbn_map_delete(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        self.check_lbn(lbn)?;
        Ok(self.lbn_map.remove(&lbn))
    }

    // Check, repair and GC walk the map a page at a time, in LBN order.
    fn lbn_map_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Lbn, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        let from = match cursor.0.len() {
            0 => None,
            8 => Some(Lbn::from_le_bytes(
                cursor.0[..].try_into().expect("8 bytes"),
            )),
            _ => return Err(bad_cursor()),
        };
        Ok(scan_page(&self.lbn_map, from, max, out, |k| {
            k.to_le_bytes().to_vec()
        }))
    }

    // Deduplication itself: is this content stored already?
    fn hash_index_lookup(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        Ok(self.hash_index.get(fp).copied())
    }

    // The engine never re-inserts a fingerprint, so a duplicate means damage.
    fn hash_index_insert(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<()> {
        self.check_pbn(pbn)?;
        match self.hash_index.get(fp) {
            Some(&old) => Err(Error::corrupt(
                "skeleton hash index",
                format!("fingerprint already indexed at PBN {old}, cannot also index PBN {pbn}"),
            )),
            None => {
                self.hash_index.insert(*fp, pbn);
                Ok(())
            }
        }
    }

    // GC removes entries of chunks nothing else references.
    fn hash_index_delete(&mut self, fp: &Fingerprint) -> Result<bool> {
        Ok(self.hash_index.remove(fp).is_some())
    }

    // GC and check visit every entry; a BTreeMap never moves entries, so none is missed.
    fn hash_index_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        let from = match cursor.0.len() {
            0 => None,
            FINGERPRINT_BYTES => Some(Fingerprint(cursor.0[..].try_into().expect("a fingerprint"))),
            _ => return Err(bad_cursor()),
        };
        Ok(scan_page(&self.hash_index, from, max, out, |k| {
            k.0.to_vec()
        }))
    }

    // Searching on from the last allocation turns random writes into sequential PBNs.
    fn alloc_pbn(&mut self) -> Result<Option<Pbn>> {
        let total = self.refcounts.len() as u64;
        if self.pbns_used >= total {
            return Ok(None);
        }
        for i in 0..total {
            let pbn = (self.next_alloc + i) % total;
            if self.refcounts[pbn as usize] == 0 {
                self.refcounts[pbn as usize] = 1;
                self.pbns_used += 1;
                self.next_alloc = pbn + 1;
                return Ok(Some(pbn));
            }
        }
        Err(Error::corrupt(
            WHAT,
            "usage count says a PBN is free but none is",
        ))
    }

    // A new reference to a free PBN would share bytes that may be reused.
    fn refcount_inc(&mut self, pbn: Pbn) -> Result<u32> {
        let i = self.check_pbn(pbn)?;
        let c = &mut self.refcounts[i];
        if *c == 0 {
            return Err(Error::corrupt(
                WHAT,
                format!("reference added to free PBN {pbn}"),
            ));
        }
        *c = c
            .checked_add(1)
            .ok_or_else(|| Error::corrupt(WHAT, format!("PBN {pbn} count overflows")))?;
        Ok(*c)
    }

    // An underflow would mark a PBN in use that nothing references (or worse).
    fn refcount_dec(&mut self, pbn: Pbn) -> Result<u32> {
        let i = self.check_pbn(pbn)?;
        let c = &mut self.refcounts[i];
        if *c == 0 {
            return Err(Error::corrupt(
                WHAT,
                format!("reference dropped from free PBN {pbn} (count would underflow)"),
            ));
        }
        *c -= 1;
        if *c == 0 {
            self.pbns_used -= 1;
        }
        Ok(*c)
    }

    // GC picks chunks whose only reference is the hash index's (count 1).
    fn refcount_get(&mut self, pbn: Pbn) -> Result<u32> {
        Ok(self.refcounts[self.check_pbn(pbn)?])
    }

    // Repair and placements that pick addresses themselves need exact counts.
    fn refcount_set(&mut self, pbn: Pbn, count: u32) -> Result<()> {
        let i = self.check_pbn(pbn)?;
        match (self.refcounts[i], count) {
            (0, c) if c > 0 => self.pbns_used += 1,
            (c, 0) if c > 0 => self.pbns_used -= 1,
            _ => {}
        }
        self.refcounts[i] = count;
        Ok(())
    }

    // Nothing to make durable here; a real store writes its changes and `private` atomically.
    fn commit(&mut self, private: &[u64]) -> Result<()> {
        self.private = private.to_vec();
        Ok(())
    }

    // No transaction grows, so the engine need never commit on the store's behalf.
    fn wants_commit(&self) -> bool {
        false
    }

    // A real store saves everything and marks itself clean here.
    fn close(&mut self, private: &[u64]) -> Result<()> {
        self.private = private.to_vec();
        Ok(())
    }

    // The engine reads its totals and counters back from this at open.
    fn private_data(&self) -> &[u64] {
        &self.private
    }

    // `dedup status`, `check` and the free-space decisions read these figures.
    fn usage(&self) -> BackendUsage {
        // Keys and values only: the maps' node overhead is not counted.
        let metadata_bytes = self.lbn_map.len() as u64 * 16
            + self.hash_index.len() as u64 * 40
            + self.refcounts.len() as u64 * 4;
        BackendUsage {
            pbns_used: self.pbns_used,
            pbns_free: self.refcounts.len() as u64 - self.pbns_used,
            metadata_bytes,
            io: MetaIoStats::default(),
        }
    }
}
