//! The placement seam: where a stored chunk's bytes live on the data
//! device. The metadata store (`backend.rs`) names chunks by PBN and counts
//! references to them; a placement decides what a PBN means on disk and
//! moves the bytes: one chunk per block (`plain`), compressed fragments
//! packed several to a block (`packed`, VDO's packer), or compressed blocks
//! that carry a window's metadata (`thin`, ThinDedup). The engine never
//! decodes a placement's on-disk format; it hands chunks over and asks for
//! them back.
//!
//! # Who calls what, and under which lock
//! - Under the engine's metadata mutex (the `meta` argument is the store,
//!   lent for the call): `alloc`, the hooks `mapped`, `freed`, `revived`,
//!   `before_commit`, `write_unsynced`, `live_blocks`, `after_commit`,
//!   `reclaim`, `space`. No data I/O here except in `before_commit`,
//!   `write_unsynced` and `reclaim`, which run with no write batch in
//!   flight (the engine holds its commit gate). `sync_written` runs on a
//!   helper thread during the store's commit, with the gate still held.
//! - Outside it, from many threads at once: `write` (after `alloc`, before
//!   any mapping names the chunks), `read`. A placement locks its own state.
//!
//! # The crash contract
//! Data a committed mapping names must be on the data device and synced
//! when the store's commit returns: `before_commit` makes it so (and says
//! whether the store should commit now; thin commits its tables less often
//! than its windows), or `write_unsynced` then `sync_written` beside a
//! journal that lists the blocks `live_blocks` keeps (a recovery that
//! finds them missing drops the transaction). A PBN freed (count 0) must keep its bytes until the
//! commit that freed it is durable; placements that reuse blocks
//! themselves (packed, thin) quarantine them until `after_commit`.
//!
//! # Adding a placement
//! Start from `placement/skeleton.rs`, register it in `registry/`, and run
//! the conformance suite (`tests/device/seams.rs`).

pub mod packed;
pub mod plain;
pub mod skeleton;
pub mod thin;

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::backend::{BackendUsage, MetaIoStats, MetadataBackend};
use crate::blockfile::written::Listed;
use crate::config::{Lbn, Pbn};
use crate::error::Result;
use crate::fingerprint::Fingerprint;

/// A new chunk, for `write`: the PBN `alloc` gave it, its bytes, and its
/// compressed form if the engine made one (see `Placement::compresses`).
pub struct NewChunk<'a> {
    pub pbn: Pbn,
    pub data: &'a [u8],
    pub compressed: Option<&'a [u8]>,
}

/// Part of a read: bytes `in_chunk` of the chunk at `pbn` go to `in_buf`.
#[derive(Clone, Debug)]
pub struct ReadPiece {
    pub pbn: Pbn,
    pub in_chunk: Range<usize>,
    pub in_buf: Range<usize>,
}

/// Data blocks, when the store's PBNs are not blocks one for one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Space {
    /// Data blocks holding chunks.
    pub used: u64,
    /// Data blocks a new chunk may take now.
    pub free: u64,
    /// Blocks freed since the last commit wait for it to be reusable.
    pub waiting: bool,
}

/// What a reclaim pass (packed: repacking) did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimReport {
    /// Blocks read to weigh them.
    pub blocks_read: u64,
    /// Blocks emptied (their fragments moved) and blocks written.
    pub blocks_repacked: u64,
    pub blocks_written: u64,
    pub fragments_moved: u64,
    /// Blocks left alone because they are damaged (`dedup check` reports them).
    pub damaged_blocks: u64,
    /// The pass stopped at its budget; another may find more.
    pub more: bool,
    /// Chunks given new addresses (old, new), for whoever names them
    /// outside the store (a running snapshot).
    #[serde(skip)]
    pub moved: Vec<(Pbn, Pbn)>,
}

/// What `dedup status` reports about packing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PackingStats {
    /// Blocks holding one chunk stored raw (it did not compress enough).
    pub raw_blocks: u64,
    /// Blocks holding compressed fragments.
    pub packed_blocks: u64,
    /// Live fragments in packed blocks.
    pub fragments: u64,
    pub fragments_per_block: f64,
    /// Bins being filled (in RAM, written at the next commit at the latest).
    pub open_bins: u64,
    /// Since open: packed blocks written, and how many of them a commit
    /// (FLUSH/FUA) or their wait sent out before they were full.
    pub bins_written: u64,
    pub bins_written_early: u64,
    /// Since open: fragment bytes in the packed blocks written, as a
    /// share of their size.
    pub written_fill_percent: f64,
    /// Since open: blocks a repack emptied, blocks it wrote, fragments it moved.
    pub repacked_blocks: u64,
    pub repack_blocks_written: u64,
    pub fragments_moved: u64,
}

/// A placement's figures for `dedup status`.
#[derive(Clone, Debug, Default)]
pub struct PlacementStats {
    pub packing: Option<PackingStats>,
    /// Figures particular to this placement (thin's windows, recovery).
    pub extra: Vec<(&'static str, u64)>,
    /// Metadata-device I/O and bytes of the placement's own metadata (thin's
    /// zone records and log), beside the store's.
    pub meta_io: MetaIoStats,
    pub metadata_bytes: u64,
    /// Bytes the data device takes on the host (`BlockFile::allocated`),
    /// where the placement knows it and it is comparable with the data
    /// blocks in use (every placement: thin's entries ride inside its data
    /// blocks, and its log is on the metadata device).
    pub data_allocated: Option<u64>,
}

pub trait Placement: Send + Sync {
    /// Whether `alloc` wants new chunks' compressed form: the engine then
    /// compresses every chunk the hash index does not hold, outside the
    /// metadata mutex.
    fn compresses(&self) -> bool;

    /// An address for a new chunk whose compressed form is `compressed`
    /// (`None`: not compressed), with its count set to 1 in `meta` (the
    /// hash index's reference). `None`: no room. Metadata mutex held.
    fn alloc(
        &self,
        meta: &mut dyn MetadataBackend,
        data: &[u8],
        compressed: Option<&[u8]>,
    ) -> Result<Option<Pbn>>;

    /// Put new chunks where `alloc` placed them (written now, or staged
    /// and readable until `before_commit` writes them). Called outside the
    /// metadata mutex, before any mapping names them. Returns the bytes
    /// written to the data device.
    fn write(&self, chunks: &[NewChunk]) -> Result<u64>;

    /// Fill `buf[piece.in_buf]` from each piece's chunk. A chunk that
    /// cannot be decoded fails with `Corrupt` (EIO for that read), never
    /// returns other bytes. Returns the bytes read from the data device.
    fn read(&self, pieces: &[ReadPiece], buf: &mut [u8]) -> Result<u64>;

    /// `lbn` now maps to `to` (`None`: unmapped), with the chunk's
    /// fingerprint when the engine knows it. Metadata mutex held.
    fn mapped(&self, _lbn: Lbn, _to: Option<Pbn>, _fp: Option<&Fingerprint>) {}

    /// `pbn`'s count reached 0: its bytes may be reused after the next
    /// commit. Metadata mutex held.
    fn freed(&self, _pbn: Pbn) {}

    /// `pbn`'s count was set from 0 by a repair: it holds a chunk again.
    fn revived(&self, _pbn: Pbn) -> Result<()> {
        Ok(())
    }

    /// Whether the placement wants a commit soon (thin: the window is full
    /// or old). Asked after every write batch.
    fn wants_commit(&self) -> bool {
        false
    }

    /// Make every chunk written so far durable on the data device (write
    /// what is staged, sync), before the store commits. Returns
    /// whether the store should commit now (`closing`: it will). No write
    /// batch is in flight. Metadata mutex held.
    fn before_commit(&self, meta: &mut dyn MetadataBackend, closing: bool) -> Result<bool>;

    /// `before_commit` in two steps, so that the data sync can run beside
    /// the store's own (`Upkeep::commit_beside_data`): write what
    /// is staged without syncing and return true, after which the engine
    /// calls `sync_written` exactly once; or return false (the default)
    /// for a placement that cannot split it, which then gets
    /// `before_commit`. Same conditions as `before_commit`; a store commit
    /// always follows.
    fn write_unsynced(&self, _meta: &mut dyn MetadataBackend) -> Result<bool> {
        Ok(false)
    }

    /// The second step of `write_unsynced`: sync the data device. May run
    /// on another thread than the one holding the metadata mutex, while
    /// the store writes its journal; reads go on meanwhile.
    fn sync_written(&self) -> Result<()> {
        Ok(())
    }

    /// Of the data blocks this transaction wrote (`listed`, by offset on
    /// the data device), those still in use now, at its commit: the ones
    /// the journal lists for recovery to check. `None` (the default): this
    /// placement cannot tell, and the data is synced before the journal.
    /// A block written and freed in one transaction may be reused or
    /// punched right after its commit; listing it would make recovery
    /// drop a transaction whose FLUSH returned (`blockfile/written.rs`).
    fn live_blocks(
        &self,
        _meta: &mut dyn MetadataBackend,
        _listed: Vec<Listed>,
    ) -> Result<Option<Vec<Listed>>> {
        Ok(None)
    }

    /// The store committed (`committed`) or was left alone: blocks freed
    /// before it may be reused now.
    fn after_commit(&self, _meta: &mut dyn MetadataBackend, _committed: bool) -> Result<()> {
        Ok(())
    }

    /// Garbage collection of the placement's own (packed: repack blocks
    /// whose live fragments fell low, up to `max_blocks`), moving counts,
    /// index entries and mappings in `meta`. The engine commits right
    /// after, with no write batch in flight.
    fn reclaim(
        &self,
        _meta: &mut dyn MetadataBackend,
        _max_blocks: usize,
    ) -> Result<ReclaimReport> {
        Ok(ReclaimReport::default())
    }

    /// No reader holds an address the last reclaim moved: the blocks it
    /// emptied may be reused after the next commit.
    fn reclaim_drained(&self) {}

    /// Data blocks in use and free, given the store's usage.
    fn space(&self, usage: &BackendUsage) -> Space {
        Space {
            used: usage.pbns_used,
            free: usage.pbns_free,
            waiting: false,
        }
    }

    /// Words the placement keeps in the engine's private record (thin's
    /// clock), committed with the store.
    fn record(&self) -> Vec<u64> {
        Vec::new()
    }

    fn stats(&self) -> PlacementStats {
        PlacementStats::default()
    }
}

/// A chunk stored as it is in one data block: what `read_plain_runs`
/// and `write_runs` take, so a caller whose items already name their
/// block (plain's `ReadPiece`s and `NewChunk`s) passes them without
/// building a list of pairs on every request.
pub(crate) trait AtBlock {
    type Item: ?Sized;
    fn block(&self) -> u64;
    fn item(&self) -> &Self::Item;
}

impl AtBlock for (u64, &ReadPiece) {
    type Item = ReadPiece;
    fn block(&self) -> u64 {
        self.0
    }
    fn item(&self) -> &ReadPiece {
        self.1
    }
}

/// In the plain placement a PBN is its block.
impl AtBlock for ReadPiece {
    type Item = ReadPiece;
    fn block(&self) -> u64 {
        self.pbn
    }
    fn item(&self) -> &ReadPiece {
        self
    }
}

impl AtBlock for (u64, &[u8]) {
    type Item = [u8];
    fn block(&self) -> u64 {
        self.0
    }
    fn item(&self) -> &[u8] {
        self.1
    }
}

impl AtBlock for NewChunk<'_> {
    type Item = [u8];
    fn block(&self) -> u64 {
        self.pbn
    }
    fn item(&self) -> &[u8] {
        self.data
    }
}

/// Give the data blocks `blocks` back to the host (`BlockFile::punch`),
/// consecutive blocks in one call. Only for blocks whose freeing is
/// committed and that no allocation can hand out meanwhile (the caller
/// holds the metadata mutex). A punch is an optimisation: one that fails
/// is logged and the block simply stays allocated on the host.
pub(crate) fn punch_blocks(
    cfg: &crate::config::DeviceConfig,
    data: &dyn crate::blockfile::BlockFile,
    blocks: &mut [u64],
) {
    blocks.sort_unstable();
    let cs = cfg.chunk_size as u64;
    let mut i = 0;
    while i < blocks.len() {
        let mut j = i + 1;
        while j < blocks.len() && blocks[j] <= blocks[j - 1] + 1 {
            j += 1;
        }
        let n = blocks[j - 1] - blocks[i] + 1;
        if let Err(e) = data.punch(cfg.pbn_offset(blocks[i]), n * cs) {
            tracing::warn!("freed data blocks stay allocated on the host: {e}");
        }
        i = j;
    }
}

/// Read runs of chunks stored as they are, at their block: consecutive
/// blocks whose pieces sit side by side in `buf` go out as one I/O.
/// `pieces` must all be stored plainly. Returns the bytes read.
pub(crate) fn read_plain_runs<P: AtBlock<Item = ReadPiece>>(
    cfg: &crate::config::DeviceConfig,
    data: &dyn crate::blockfile::BlockFile,
    pieces: &[P],
    buf: &mut [u8],
) -> Result<u64> {
    let mut bytes = 0;
    let mut i = 0;
    while i < pieces.len() {
        let first = pieces[i].block();
        let mut j = i + 1;
        while j < pieces.len()
            && pieces[j].block() == first + (j - i) as u64
            && pieces[j].item().in_buf.start == pieces[j - 1].item().in_buf.end
        {
            j += 1;
        }
        let range = pieces[i].item().in_buf.start..pieces[j - 1].item().in_buf.end;
        let at = cfg.pbn_offset(first) + pieces[i].item().in_chunk.start as u64;
        bytes += range.len() as u64;
        data.read_at(&mut buf[range], at)?;
        i = j;
    }
    Ok(bytes)
}

/// Write each item's bytes to its block, consecutive blocks in one I/O.
pub(crate) fn write_runs<B: AtBlock<Item = [u8]>>(
    cfg: &crate::config::DeviceConfig,
    data: &dyn crate::blockfile::BlockFile,
    blocks: &[B],
) -> Result<u64> {
    let mut bufs: Vec<&[u8]> = Vec::new();
    let mut bytes = 0;
    for run in blocks.chunk_by(|a, b| b.block() == a.block() + 1) {
        bufs.clear();
        bufs.extend(run.iter().map(|b| b.item()));
        data.write_vectored_at(&bufs, cfg.pbn_offset(run[0].block()))?;
        bytes += bufs.iter().map(|b| b.len() as u64).sum::<u64>();
    }
    Ok(bytes)
}
