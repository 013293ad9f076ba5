//! A minimal metadata store to copy when writing a new one (as tikv's
//! `engine_traits` skeleton): every `MetadataBackend` method, as plain as
//! it can be, over `BTreeMap`s and a `Vec` of counts, all in RAM.
//!
//! It persists nothing: `commit` and `close` only remember the engine's
//! record. A real store makes `commit` write the changes and `private`
//! atomically (a crash before it returns leaves the previous commit whole),
//! keeps PBNs freed in the open transaction from `alloc_pbn` until it
//! commits, returns `wants_commit` true when the transaction grows long,
//! saves and marks itself clean in `close`, and loads all back in an `open`.
//! `Upkeep`'s hooks (a reserve to give back, an index to warm, damaged
//! blocks to name) have defaults that do nothing; a store overrides those
//! it needs.
//!
//! Register it with a `StoreKind` and a row in `kinds.rs`, and
//! arms in `registry.rs` (`format`, `open`, `metadata_space`). Test it first with a hand-built `registry::Pair`, as
//! `tests/device/seams.rs` does.

use std::collections::{btree_map::Entry, BTreeMap};

use crate::backend::{BackendUsage, MetaIoStats, MetadataBackend, ScanCursor, Upkeep};
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;

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

/// Damage in the tables (the engine reports it as EIO, `check` finds why).
fn corrupt(detail: String) -> Error {
    Error::corrupt("skeleton metadata store", detail)
}

/// A scan cursor holds the first key not yet returned, as bytes.
fn cursor_key<const N: usize>(cursor: &ScanCursor) -> Result<Option<[u8; N]>> {
    match cursor.0.len() {
        0 => Ok(None),
        n if n == N => Ok(Some(cursor.0[..].try_into().expect("N bytes"))),
        _ => Err(Error::InvalidArgument("not a skeleton scan cursor".into())),
    }
}

/// Up to `max` entries of `map` from `from` on, and the cursor after them.
fn scan_page<K: Ord + Copy, const N: usize>(
    map: &BTreeMap<K, Pbn>,
    from: Option<K>,
    max: usize,
    out: &mut Vec<(K, Pbn)>,
    key: impl Fn(K) -> [u8; N],
) -> Option<ScanCursor> {
    let mut it = match from {
        Some(k) => map.range(k..),
        None => map.range(..),
    };
    out.extend(it.by_ref().take(max).map(|(&k, &p)| (k, p)));
    it.next().map(|(&k, _)| ScanCursor(key(k).to_vec()))
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
        if lbn >= self.logical_chunks {
            let n = self.logical_chunks;
            return Err(Error::InvalidArgument(format!(
                "LBN {lbn} is beyond the device ({n} chunks)"
            )));
        }
        Ok(())
    }

    // A PBN beyond the data device can only come from damaged metadata.
    fn check_pbn(&self, pbn: Pbn) -> Result<usize> {
        if pbn as usize >= self.refcounts.len() {
            return Err(corrupt(format!("PBN {pbn} is beyond the data device")));
        }
        Ok(pbn as usize)
    }
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
        let from = cursor_key(cursor)?.map(Lbn::from_le_bytes);
        Ok(scan_page(&self.lbn_map, from, max, out, Lbn::to_le_bytes))
    }

    // Deduplication itself: is this content stored already?
    fn hash_index_lookup(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        Ok(self.hash_index.get(fp).copied())
    }

    // The engine never re-inserts a fingerprint, so a duplicate means damage.
    fn hash_index_insert(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<()> {
        self.check_pbn(pbn)?;
        match self.hash_index.entry(*fp) {
            Entry::Occupied(e) => Err(corrupt(format!(
                "fingerprint already indexed at PBN {}, cannot also index PBN {pbn}",
                e.get()
            ))),
            Entry::Vacant(e) => {
                e.insert(pbn);
                Ok(())
            }
        }
    }

    // GC removes entries of chunks nothing else references.
    fn hash_index_delete(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<bool> {
        if self.hash_index.get(fp) != Some(&pbn) {
            return Ok(false);
        }
        Ok(self.hash_index.remove(fp).is_some())
    }

    // GC and check visit every entry; a BTreeMap never moves one, so none is missed.
    fn hash_index_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        let from = cursor_key(cursor)?.map(Fingerprint);
        Ok(scan_page(&self.hash_index, from, max, out, |k| k.0))
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
        Err(corrupt("usage says a PBN is free but none is".into()))
    }

    // A new reference to a free PBN would share bytes that may be reused.
    fn refcount_inc(&mut self, pbn: Pbn) -> Result<u32> {
        let i = self.check_pbn(pbn)?;
        let c = &mut self.refcounts[i];
        if *c == 0 {
            return Err(corrupt(format!("reference added to free PBN {pbn}")));
        }
        *c = c
            .checked_add(1)
            .ok_or_else(|| corrupt(format!("PBN {pbn} count overflows")))?;
        Ok(*c)
    }

    // A drop below zero means a reference was counted twice: damage, not a wrap.
    fn refcount_dec(&mut self, pbn: Pbn) -> Result<u32> {
        let i = self.check_pbn(pbn)?;
        let c = &mut self.refcounts[i];
        if *c == 0 {
            return Err(corrupt(format!(
                "reference dropped from free PBN {pbn} (count would underflow)"
            )));
        }
        *c -= 1;
        self.pbns_used -= (*c == 0) as u64;
        Ok(*c)
    }

    // GC picks chunks whose only reference is the hash index's (count 1).
    fn refcount_get(&mut self, pbn: Pbn) -> Result<u32> {
        Ok(self.refcounts[self.check_pbn(pbn)?])
    }

    // Repair and placements that pick addresses themselves need exact counts.
    fn refcount_set(&mut self, pbn: Pbn, count: u32) -> Result<()> {
        let i = self.check_pbn(pbn)?;
        let c = &mut self.refcounts[i];
        self.pbns_used = self.pbns_used + (count > 0) as u64 - (*c > 0) as u64;
        *c = count;
        Ok(())
    }

    // Nothing to make durable; a real store writes its changes and `private` atomically.
    fn commit(&mut self, private: &[u64]) -> Result<()> {
        self.private = private.to_vec();
        Ok(())
    }

    // No transaction grows here, so the store never needs a commit of its own.
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

    // `dedup status`, `check` and free-space decisions read these figures.
    fn usage(&self) -> BackendUsage {
        BackendUsage {
            pbns_used: self.pbns_used,
            pbns_free: self.refcounts.len() as u64 - self.pbns_used,
            // Keys, values and counts only: the maps' node overhead is left out.
            metadata_bytes: self.lbn_map.len() as u64 * 16
                + self.hash_index.len() as u64 * 40
                + self.refcounts.len() as u64 * 4,
            io: MetaIoStats::default(),
            index: None,
        }
    }
}

// Nothing beyond the seam.
impl Upkeep for Skeleton {}
