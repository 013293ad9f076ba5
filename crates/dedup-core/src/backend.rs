//! The metadata backend seam (Dmdedup §2.6): everything the engine needs to
//! remember about chunks, behind one trait, so that researchers can add a
//! backend without touching the engine.
//!
//! A backend owns three things and nothing else:
//! - a **linear store** `LBN -> PBN` (the LBN map), dense over the logical device;
//! - a **sparse store** `fingerprint -> PBN` (the hash index), keys uniformly spread;
//! - the **space manager**: per-PBN reference counts, which double as the
//!   allocation map (count 0 = free), and sequential allocation.
//!
//! # Who calls what
//! Only the engine calls a backend, always under one mutex, so methods take
//! `&mut self` and need no internal locking. Methods are cheap lookups and
//! updates; hashing and data I/O never happen inside them.
//!
//! # Reference counts (Dmdedup §2.4)
//! A PBN's count is the number of references to it: one from the hash index
//! (if indexed) plus one per LBN mapped to it. `alloc_pbn` hands out a PBN with
//! count 1, the reference the hash index will hold; mapping the first LBN
//! brings it to 2. When LBNs are overwritten or trimmed, a chunk may be left
//! with count 1 (only the index holds it); it stays until garbage collection
//! removes its index entry and decrements it to 0 (free).
//!
//! # Durability
//! Unless stated otherwise, a change is durable once `commit` returns (for a
//! backend whose [`BackendTraits::crash_safe`] is true). Before that, a crash
//! may lose it, but must never leave a state where a mapping points at a chunk
//! whose data was not written before the mapping was made. A backend that is
//! not crash-safe (INRAM) saves everything on `close` and must refuse to open
//! after an unclean stop unless the caller explicitly accepts the loss.
//!
//! # Adding a backend
//! Copy `backends/inram/` as a skeleton, implement this trait, register the
//! name in `backends/mod.rs`, and run the conformance suite in `tests/`.

use std::sync::Arc;

use crate::blockfile::BlockFile;
use crate::config::{Lbn, Pbn};
use crate::error::Result;
use crate::fingerprint::Fingerprint;

/// Opaque position in a scan; `ScanCursor::start()` begins one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanCursor(pub Vec<u8>);

impl ScanCursor {
    pub fn start() -> Self {
        ScanCursor(Vec::new())
    }
}

/// Every entry of a paged scan (the LBN map or the hash index).
pub fn scan_all<K: Copy>(
    mut scan: impl FnMut(&ScanCursor, &mut Vec<(K, Pbn)>) -> Result<Option<ScanCursor>>,
    mut each: impl FnMut(K, Pbn) -> Result<()>,
) -> Result<()> {
    let mut page = Vec::new();
    let mut cursor = Some(ScanCursor::start());
    while let Some(c) = cursor.take() {
        page.clear();
        cursor = scan(&c, &mut page)?;
        for &(key, pbn) in &page {
            each(key, pbn)?;
        }
    }
    Ok(())
}

/// How much the backend holds right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendUsage {
    /// LBNs with a mapping.
    pub lbns_mapped: u64,
    /// PBNs with a non-zero reference count (allocated).
    pub pbns_used: u64,
    /// PBNs `alloc_pbn` could hand out now (free, and not freed in the
    /// current transaction).
    pub pbns_free: u64,
    /// Entries in the hash index.
    pub hash_entries: u64,
    /// Bytes the metadata structures occupy (in RAM or on the metadata device).
    pub metadata_bytes: u64,
}

/// Metadata-device I/O done by the backend since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MetaIoStats {
    pub reads: u64,
    pub writes: u64,
    pub syncs: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
}

/// Fixed properties of a backend implementation.
#[derive(Clone, Copy, Debug)]
pub struct BackendTraits {
    /// After `commit` returns, all changes survive a crash.
    pub crash_safe: bool,
    /// The backend writes chunk data itself (thin: compressed blocks with
    /// metadata embedded, written a window at a time): the engine hands it
    /// new chunks with `stage_chunk` instead of writing them, and asks
    /// `locate` where a chunk's bytes are before reading.
    pub places_data: bool,
}

/// Where a stored chunk's bytes are, for a backend that places data.
#[derive(Clone, Debug)]
pub enum DataLocation {
    /// The chunk as it is, at the PBN's offset on the data device.
    Plain,
    /// A thin C-block at the PBN's offset: the chunk LZ4-compressed with
    /// metadata entries beside it.
    Compressed,
    /// Not on the data device yet: the bytes, from the open window or bin.
    Staged(Arc<[u8]>),
    /// A packing device's chunk stored raw, alone in this data block.
    Block(u64),
    /// A packing device's compressed fragment: this slot of this block.
    Fragment { block: u64, slot: usize },
}

pub trait MetadataBackend: Send {
    /// The name users pass to `dedup create --backend`.
    fn name(&self) -> &'static str;
    fn traits(&self) -> BackendTraits;

    // ---- linear store: the LBN map --------------------------------------

    /// The PBN an LBN maps to, if any. `lbn` is below the logical chunk count.
    fn lbn_map_lookup(&mut self, lbn: Lbn) -> Result<Option<Pbn>>;
    /// Map `lbn` to `pbn`, replacing any earlier mapping. Reference counts are
    /// the caller's job. Durable after `commit`.
    fn lbn_map_insert(&mut self, lbn: Lbn, pbn: Pbn) -> Result<()>;
    /// Remove `lbn`'s mapping (no-op if unmapped). Durable after `commit`.
    fn lbn_map_delete(&mut self, lbn: Lbn) -> Result<()>;

    // ---- sparse store: the hash index -----------------------------------

    fn hash_index_lookup(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>>;
    /// Add `fp -> pbn`. The engine never inserts a fingerprint that is
    /// already present. Durable after `commit`.
    fn hash_index_insert(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<()>;
    /// Remove `fp` (no-op if absent). Only garbage collection does this.
    fn hash_index_delete(&mut self, fp: &Fingerprint) -> Result<()>;

    // ---- space manager ----------------------------------------------------

    /// Allocate a free PBN, searching sequentially from the last allocation
    /// (write sequentialization), and set its count to 1. `None` when every
    /// PBN is in use. The allocation is durable after `commit`; a backend
    /// with transactions must not hand out a PBN freed in the open transaction.
    fn alloc_pbn(&mut self) -> Result<Option<Pbn>>;
    /// Add one reference; returns the new count.
    fn refcount_inc(&mut self, pbn: Pbn) -> Result<u32>;
    /// Drop one reference; returns the new count (0 = the PBN is free again).
    /// Decrementing a free PBN is a `Corrupt` error, never an underflow.
    fn refcount_dec(&mut self, pbn: Pbn) -> Result<u32>;
    fn refcount_get(&mut self, pbn: Pbn) -> Result<u32>;
    /// Set a count outright (0 frees the PBN). Only `check --repair` calls
    /// this, to rebuild counts from the LBN map and hash index.
    fn refcount_set(&mut self, pbn: Pbn, count: u32) -> Result<()>;
    /// Overwrite the totals `usage` reports (mapped LBNs, index entries)
    /// with what a full scan found. Only `check --repair` calls this.
    fn set_totals(&mut self, lbns_mapped: u64, hash_entries: u64) -> Result<()>;

    // ---- iteration, for garbage collection and checking -------------------

    /// Append up to `max` hash index entries after `cursor` to `out`; returns
    /// the cursor to continue from, or `None` when the scan is complete.
    /// Entries inserted or deleted during a scan may or may not be seen, and
    /// a deletion may move other entries behind the cursor (open addressing),
    /// so a scan interleaved with deletions can miss entries; without
    /// deletions, no entry present for the whole scan is missed.
    fn hash_index_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<Option<ScanCursor>>;
    /// Same as `hash_index_scan`, for the LBN map, in LBN order.
    fn lbn_map_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Lbn, Pbn)>,
    ) -> Result<Option<ScanCursor>>;

    // ---- persistence ---------------------------------------------------------

    /// Make every change so far durable, atomically (FLUSH/FUA, or a
    /// transaction end the backend asked for). The engine has already synced
    /// the data device and no write is half-applied, so every mapping names
    /// data on disk. PBNs freed since the previous commit become reusable
    /// only after this returns.
    fn commit(&mut self) -> Result<()>;
    /// Whether the backend wants a commit soon (transaction length reached,
    /// cache mostly dirty). The engine asks after every write batch.
    fn wants_commit(&self) -> bool {
        false
    }
    /// Clean shutdown: persist everything and mark the metadata clean. No
    /// other method is called afterwards.
    fn close(&mut self) -> Result<()>;

    /// Engine counters saved at the last commit or close (empty when new).
    fn saved_counters(&self) -> Vec<u64>;
    /// Counters to persist with the next commit or close.
    fn save_counters(&mut self, counters: &[u64]);

    fn usage(&self) -> BackendUsage;
    fn io_stats(&self) -> MetaIoStats;
    /// Figures particular to this backend, for `dedup status`.
    fn backend_stats(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }

    // ---- data placement (only backends whose traits say `places_data`) ----

    /// The data device, given once at open (a backend may recover here).
    fn attach_data(&mut self, _data: Arc<dyn BlockFile>) -> Result<()> {
        Ok(())
    }
    /// `alloc_pbn` for the chunk `data`, whose compressed form (with the
    /// device's codec) is `compressed` (None: it does not compress), so
    /// the backend can place it.
    fn alloc_pbn_for(&mut self, _data: &[u8], _compressed: Option<&[u8]>) -> Result<Option<Pbn>> {
        self.alloc_pbn()
    }
    /// Take a new chunk's bytes (and their compressed form, if any) for
    /// the PBN `alloc_pbn_for` gave; the backend writes them, durable
    /// after `commit`, or returns the data block the engine must write
    /// them to itself (before any mapping names them).
    fn stage_chunk(
        &mut self,
        _pbn: Pbn,
        _data: &[u8],
        _compressed: Option<Vec<u8>>,
    ) -> Result<Option<u64>> {
        Err(crate::error::Error::Unsupported(format!(
            "the {} backend does not place data",
            self.name()
        )))
    }
    /// Data blocks (used, free) when they are not one per PBN (packing).
    fn data_blocks(&self) -> Option<(u64, u64)> {
        None
    }
    /// Freed data blocks wait for a commit to be reusable (packing).
    fn blocks_waiting(&self) -> bool {
        false
    }
    /// Packing figures, for a packing device.
    fn packing(&self) -> Option<crate::backends::packed::PackingStats> {
        None
    }
    /// Move live fragments out of blocks that are mostly dead, up to
    /// `max_blocks` of them (packing devices; see `backends::packed`).
    /// The engine commits right after, with no write batch in flight.
    fn repack(&mut self, _max_blocks: usize) -> Result<crate::backends::packed::RepackReport> {
        Ok(Default::default())
    }
    /// No reader holds an address a repack moved any more: the blocks it
    /// emptied may be reused after the next commit.
    fn release_moved(&mut self) {}
    /// Where the chunk at `pbn` is to be read from.
    fn locate(&mut self, _pbn: Pbn) -> DataLocation {
        DataLocation::Plain
    }
    /// `lbn_map_insert`, with the fingerprint of the chunk mapped, for a
    /// backend that keeps it beside the mapping (thin's recovery checks the
    /// chunk against it).
    fn lbn_map_insert_fp(&mut self, lbn: Lbn, pbn: Pbn, _fp: &Fingerprint) -> Result<()> {
        self.lbn_map_insert(lbn, pbn)
    }
}
