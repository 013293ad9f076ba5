//! The metadata seam (Dmdedup §2.6): everything the engine needs to
//! remember about chunks, behind one small trait, so that a researcher can
//! add a metadata store without touching the engine. Where a chunk's bytes
//! live is the other seam (`placement`); a store never touches data.
//!
//! A store owns four things and nothing else:
//! - a **linear store** `LBN -> PBN` (the LBN map);
//! - a **sparse store** `fingerprint -> PBN` (the hash index);
//! - the **space manager**: per-PBN reference counts, which double as the
//!   allocation map (count 0 = free), and sequential allocation;
//! - the engine's **private record**: opaque words (totals, counters, a
//!   placement's clock) that it persists atomically with every commit, as
//!   dm-dedup's `get_private_data`/`flush_private_data`.
//!
//! # Who calls what
//! Only the engine calls a store (and a placement, through the `&mut`
//! the engine lends it in its hooks), always under the engine's metadata
//! mutex, so methods take `&mut self` and need no internal locking. Methods
//! are lookups and updates of metadata: hashing and data I/O never happen
//! inside them (a store may read and write its own metadata device).
//!
//! # Reference counts (Dmdedup §2.4)
//! A PBN's count is the number of references to it: one from the hash index
//! (if indexed) plus one per LBN mapped to it. `alloc_pbn` hands out a PBN with
//! count 1, the reference the hash index will hold; mapping the first LBN
//! brings it to 2. The store never interprets counts beyond "0 = free".
//!
//! # Durability
//! A change is durable once `commit` returns, for a store the registry
//! calls crash-safe. Before that a crash may lose it, but must never leave
//! a state in which a mapping names a chunk whose data was not written
//! before the mapping was made (the engine writes data first). A store that
//! is not crash-safe (inram) saves everything at `close` and refuses to open
//! after an unclean stop unless the caller accepts the loss.
//!
//! # Adding a store
//! Start from `backends/skeleton.rs` (a documented minimal store), register
//! it in `registry/`, and run the conformance suite
//! (`tests/device/seams.rs` and the model suite in `tests/device/model.rs`).

use crate::blockfile::written::Listed;
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

/// A table block that failed its checksum in a store opened for check
/// (`OpenOptions::for_check`): the store reads it as empty (never-written)
/// from then on, and writes it back whole at the next commit. What it held
/// says what a repair can rebuild and what is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostBlock {
    /// The table, as errors name it ("sparse LBN map").
    pub table: &'static str,
    /// The block's number among the store's table blocks.
    pub block: u64,
    pub held: Held,
}

/// What a lost table block held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Held {
    /// The mappings of these LBNs: not derivable from anything else, so
    /// they are unmapped (read as zeros).
    Mappings(std::ops::Range<Lbn>),
    /// Reference counts of these PBNs: rebuilt from the mappings.
    Counts(std::ops::Range<Pbn>),
    /// Fingerprints of chunks among these PBNs: rebuilt by hashing the
    /// chunks the LBN map still names.
    Fingerprints(std::ops::Range<Pbn>),
    /// A summary of other tables, rebuilt from them when the store opened.
    Summary,
}

/// How much the store holds right now, and the I/O it did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendUsage {
    /// PBNs with a non-zero reference count (allocated).
    pub pbns_used: u64,
    /// PBNs `alloc_pbn` could hand out now (free, and not freed in the
    /// current transaction).
    pub pbns_free: u64,
    /// Bytes the metadata structures occupy (in RAM or on the metadata device).
    pub metadata_bytes: u64,
    /// Metadata-device I/O since the store was opened.
    pub io: MetaIoStats,
    /// A store whose hash index is advice within a RAM budget (sparse):
    /// how full it is, how it samples and how lookups fared.
    pub index: Option<IndexFigures>,
}

/// What `dedup status` shows of a budgeted, sampled hash index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexFigures {
    /// The index's memory (`--index-memory`); `budget_bytes` in JSON.
    #[serde(rename = "budget_bytes")]
    pub index_memory: u64,
    /// RAM the index holds now (its table and prefetched fingerprints).
    pub bytes: u64,
    pub entries: u64,
    /// 1 / sampling rate: 1 keeps every fingerprint, 2 every other one...
    pub sampling_period: u64,
    pub prefetched_fingerprints: u64,
    /// Lookups answered by the table, by the prefetch cache, and not at
    /// all (new data, or data the sample missed), since open.
    pub table_hits: u64,
    pub prefetch_hits: u64,
    pub misses: u64,
    /// Candidates that failed confirmation against the chunk's record.
    pub stale: u64,
    /// Duplicates the sampling missed since open: `duplicates_seen` less
    /// those found. Holds for data in any order (0 while every fingerprint
    /// is kept).
    #[serde(default)]
    pub missed_estimate: u64,
    /// Lookups of fingerprints in the sample at the time (the table holds
    /// every one, so their answer is the truth), and the duplicates among
    /// all lookups they stand for: each hit counts the sampling period
    /// then (a sampled fingerprint stands for that many).
    #[serde(default)]
    pub sampled_lookups: u64,
    #[serde(default)]
    pub duplicates_seen: u64,
    /// The index was loaded from the checkpoint of the last clean stop
    /// (else rebuilt from the chunk records at open).
    #[serde(default)]
    pub from_checkpoint: bool,
    /// Records still to be read into the index since open (a rebuild in
    /// the background; 0 once whole).
    #[serde(default)]
    pub records_to_warm: u64,
}

/// Metadata-device I/O done by the store since it was opened.
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

impl MetaIoStats {
    /// Both stores' I/O (a placement with metadata of its own adds its share).
    pub fn plus(self, o: MetaIoStats) -> MetaIoStats {
        MetaIoStats {
            reads: self.reads + o.reads,
            writes: self.writes + o.writes,
            syncs: self.syncs + o.syncs,
            bytes_read: self.bytes_read + o.bytes_read,
            bytes_written: self.bytes_written + o.bytes_written,
            cache_hits: self.cache_hits + o.cache_hits,
            cache_misses: self.cache_misses + o.cache_misses,
        }
    }
}

/// The metadata store: 18 methods. Every one is called by the engine (or
/// by a placement's hook, with the engine's metadata mutex held). What only
/// some stores do is `Upkeep`'s, which every store also implements (most
/// with an empty `impl`): the seam stays these 18 (`tests/device/seams.rs`
/// counts them).
pub trait MetadataBackend: Upkeep + Send {
    // ---- linear store: the LBN map --------------------------------------

    /// The PBN an LBN maps to, if any. Write, read and extent paths; `lbn`
    /// is below the logical chunk count.
    fn lbn_map_lookup(&mut self, lbn: Lbn) -> Result<Option<Pbn>>;
    /// Map `lbn` to `pbn`, replacing any earlier mapping, and return the
    /// earlier one. Reference counts are the caller's job. Write path,
    /// repack, recovery. Durable after `commit`.
    fn lbn_map_insert(&mut self, lbn: Lbn, pbn: Pbn) -> Result<Option<Pbn>>;
    /// Remove `lbn`'s mapping and return it (`None`: was unmapped). Write
    /// path (zeros, trim), repair, recovery. Durable after `commit`.
    fn lbn_map_delete(&mut self, lbn: Lbn) -> Result<Option<Pbn>>;
    /// Append up to `max` mappings after `cursor` to `out`, in LBN order;
    /// returns the cursor to continue from, or `None` when complete. GC
    /// (repack), check, repair, recovery.
    fn lbn_map_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Lbn, Pbn)>,
    ) -> Result<Option<ScanCursor>>;

    // ---- sparse store: the hash index -----------------------------------

    /// Write path (phase A), GC.
    fn hash_index_lookup(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>>;
    /// Add `fp -> pbn`. The engine never inserts a fingerprint that is
    /// already present. Write path (phase B), repack. Durable after `commit`.
    fn hash_index_insert(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<()>;
    /// Remove the entry `fp -> pbn`; returns whether it was there (an
    /// entry of `fp` naming another PBN stays). GC, repair, repack, which
    /// all found the pair by a scan: a store whose lookups may miss (a
    /// sampled index) can still delete exactly what the scan showed.
    fn hash_index_delete(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<bool>;
    /// As `lbn_map_scan`, for the hash index (any order). Entries inserted
    /// or deleted during a scan may or may not be seen, and a deletion may
    /// move other entries behind the cursor (open addressing), so a scan
    /// interleaved with deletions can miss entries; without deletions, no
    /// entry present for the whole scan is missed. GC, check, repack.
    fn hash_index_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<Option<ScanCursor>>;

    // ---- space manager ----------------------------------------------------

    /// Allocate a free PBN, searching sequentially from the last allocation
    /// (write sequentialization), and set its count to 1. `None` when every
    /// PBN is in use. Called by the plain placement. Durable after `commit`;
    /// a store with transactions must not hand out a PBN freed in the open
    /// transaction.
    fn alloc_pbn(&mut self) -> Result<Option<Pbn>>;
    /// Add one reference; returns the new count.
    fn refcount_inc(&mut self, pbn: Pbn) -> Result<u32>;
    /// Drop one reference; returns the new count (0 = the PBN is free again).
    /// Decrementing a free PBN is a `Corrupt` error, never an underflow.
    fn refcount_dec(&mut self, pbn: Pbn) -> Result<u32>;
    fn refcount_get(&mut self, pbn: Pbn) -> Result<u32>;
    /// Set a count outright (0 frees the PBN; from 0, allocates exactly
    /// this PBN). Placements that choose addresses themselves (packed,
    /// thin), repack, repair, recovery.
    fn refcount_set(&mut self, pbn: Pbn, count: u32) -> Result<()>;

    // ---- persistence ---------------------------------------------------------

    /// Make every change so far durable, atomically, with `private` as the
    /// engine's record (FLUSH/FUA, or a transaction end the store asked
    /// for). The engine has already made the data durable and no write is
    /// half-applied, so every mapping names data on disk. PBNs freed since
    /// the previous commit become reusable only after this returns.
    fn commit(&mut self, private: &[u64]) -> Result<()>;
    /// Whether the store wants a commit soon (transaction length reached,
    /// cache mostly dirty). The engine asks after every write batch.
    fn wants_commit(&self) -> bool;
    /// Clean shutdown: persist everything with `private` and mark the
    /// metadata clean. No other method is called afterwards.
    fn close(&mut self, private: &[u64]) -> Result<()>;
    /// The engine's record as of the last commit or close (empty when new).
    /// Read once, at open.
    fn private_data(&self) -> &[u64];
    /// Space and I/O figures, for `dedup status` and allocation decisions.
    fn usage(&self) -> BackendUsage;
}

/// What only some stores do, beyond the seam: each has a default that does
/// nothing, so a store that needs none writes `impl Upkeep for S {}`. Called
/// like the seam's methods, by the engine under its metadata mutex.
pub trait Upkeep {
    /// `MetadataBackend::commit`, with the data not durable yet:
    /// `data_durable` makes it so, and must have returned before anything
    /// of this commit can be taken for committed without checking the
    /// data. A store that checks its last transaction's data at recovery
    /// (the journaled ones: `disktable/journal.rs`) runs it after its own
    /// sync, side by side with it (the engine starts the data sync on a
    /// helper thread and this waits for it). `listed`: the data blocks
    /// this transaction wrote and still uses, with digests of their bytes
    /// (`blockfile/written.rs`), or `None` when they could not be listed
    /// (then the data must be durable first). `None` (the default): the
    /// store cannot; the engine syncs the data, then calls `commit`.
    fn commit_beside_data(
        &mut self,
        _private: &[u64],
        _listed: Option<&[Listed]>,
        _data_durable: &mut dyn FnMut() -> Result<()>,
    ) -> Option<Result<()>> {
        None
    }
    /// The host filesystem under the metadata is full and a commit that
    /// must not fail for it (a close, one that frees space) did: give back
    /// the room the store reserved for this (journaled stores: see
    /// `disktable/tables.rs`). Returns the bytes given back; 0: none held.
    fn release_reserve(&mut self) -> Result<u64> {
        Ok(0)
    }
    /// A store whose index is advice (sparse) and was opened without its
    /// checkpoint: fill the index from the stored records, about `max` at
    /// a time; `true` while more remain. The engine calls it from a
    /// background thread after open, so a large device serves before its
    /// index is whole (a lookup that misses meanwhile costs deduplication,
    /// never correctness). Others have nothing to do.
    fn warm_index(&mut self, _max: usize) -> Result<bool> {
        Ok(false)
    }
    /// A hint that `fp` is about to be looked up (`hash_index_lookup`): a
    /// store whose index outgrows the CPU caches (sparse's table) loads
    /// where it will look, so a batch's lookups wait for memory together,
    /// not one after another. Write path (phase A). Others ignore it.
    fn touch_for_lookup(&self, _fp: &Fingerprint) {}
    /// The fingerprint the store keeps for chunk `pbn`, if it keeps one
    /// by PBN (sparse's chunk records); `None` when it does not, or has
    /// none for this chunk. A backup by fingerprint (`Engine::block_map`)
    /// reads and hashes a chunk without one, so a store that cannot say
    /// costs reads, never a wrong answer.
    fn chunk_fingerprint(&mut self, _pbn: Pbn) -> Result<Option<Fingerprint>> {
        Ok(None)
    }
    /// Table blocks found failing their checksum since a store opened for
    /// check, now read as empty (`LostBlock`). Check reports them; repair
    /// rebuilds what they held. Stores that keep no such blocks, or refuse
    /// damage at open, have none.
    fn lost_blocks(&self) -> Vec<LostBlock> {
        Vec::new()
    }
}
