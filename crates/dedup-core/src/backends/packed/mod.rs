//! Compressed chunks packed several to a data block (issue 7; VDO's
//! packer, ThinDedup's remark that LZ4 pays for itself): a layer over any
//! metadata backend that does not place data itself.
//!
//! # Addresses
//! The backend's PBNs become addresses `block * 16 + slot`: slots 0–13 are
//! fragments of a packed block (`pack.rs`), slot 15 is a chunk stored raw,
//! alone in its block. The LBN map, hash index and reference counts hold
//! addresses unchanged, so every count is a fragment's, and nothing in the
//! backends had to learn what a block is: they size their count arrays
//! for `DeviceConfig::pbn_space` and their hash index for `max_chunks`.
//!
//! # Space
//! This layer owns the data blocks ([`blocks::Blocks`]). It learns of
//! every reference change because all of them pass through it, and it
//! rebuilds the block map at open from the addresses the LBN map and hash
//! index name (each stored chunk is named by one or the other).
//!
//! # Writes
//! A new chunk that compresses by at least an eighth goes to an open bin
//! ([`bins::Bins`]); others get a block of their own, written by the
//! engine outside the metadata mutex. Bins are written when full, when
//! they have waited `bins::WAIT`, and before every commit: the data is on
//! disk and synced before any committed mapping names it, which is the
//! crash contract of DESIGN.md. Until then a bin's chunks are read from RAM.
//!
//! # Garbage collection
//! A fragment's count reaching 0 frees its bytes only when its whole block
//! is dead. [`Packed::repack`] copies the live fragments of blocks whose
//! live share fell low into new blocks, then moves their counts, hash
//! index entries and LBN mappings to the new addresses in the same
//! transaction; the old blocks are reused only after that commit and after
//! every reader that looked up an old address is done (the engine drains
//! them), so a crash or a racing read sees either the old or the new copy.

pub mod bins;
pub mod blocks;
mod repack;

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::backend::{
    scan_all, BackendTraits, BackendUsage, DataLocation, MetaIoStats, MetadataBackend, ScanCursor,
};
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;

use bins::{Bin, Bins};
use blocks::{Blocks, Hold};
pub use repack::RepackReport;

/// Addresses per data block: 14 fragment slots, one unused, one raw.
pub const SLOTS_PER_BLOCK: u64 = 16;
/// The slot of a chunk stored raw, alone in its block.
pub const RAW_SLOT: u64 = 15;

pub fn addr(block: u64, slot: u64) -> Pbn {
    block * SLOTS_PER_BLOCK + slot
}

/// (block, slot) of an address.
pub fn split(pbn: Pbn) -> (u64, u64) {
    (pbn / SLOTS_PER_BLOCK, pbn % SLOTS_PER_BLOCK)
}

/// Where an address's bytes are on disk (open bins aside).
pub fn location(pbn: Pbn) -> DataLocation {
    match split(pbn) {
        (block, RAW_SLOT) => DataLocation::Block(block),
        (block, slot) => DataLocation::Fragment {
            block,
            slot: slot as usize,
        },
    }
}

/// A chunk is stored compressed only if that saves an eighth of it or
/// more: less would not pay for the decompression on every read.
pub fn worth_packing(compressed: usize, chunk: usize) -> bool {
    compressed <= chunk - chunk / 8
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

pub struct Packed {
    cfg: DeviceConfig,
    inner: Box<dyn MetadataBackend>,
    data: Option<Arc<dyn BlockFile>>,
    blocks: Blocks,
    bins: Bins,
    stats: PackingStats,
    fragment_bytes_written: u64,
    repack_cursor: u64,
    /// Set when a packed block could not be written: the chunks in it
    /// stay readable from RAM, and the device takes no more writes.
    failed: Option<String>,
}

/// Wrap `inner` for a packing device: rebuild the block map from the
/// addresses its LBN map and hash index name.
pub fn wrap(
    cfg: &DeviceConfig,
    mut inner: Box<dyn MetadataBackend>,
    for_check: bool,
) -> Result<Box<dyn MetadataBackend>> {
    let mut blocks = Blocks::new(cfg.physical_chunks);
    let mut note = |pbn: Pbn, what: &dyn Fn() -> String| -> Result<()> {
        let (block, slot) = split(pbn);
        let bad = if block >= cfg.physical_chunks {
            Some("is beyond the data device")
        } else if slot != RAW_SLOT && slot as usize >= crate::pack::MAX_SLOTS {
            Some("names a slot no packed block has")
        } else {
            let live = blocks.live(block);
            let raw = slot == RAW_SLOT;
            let clash = if raw {
                live & !(1 << RAW_SLOT) != 0
            } else {
                blocks.is_raw(block)
            };
            clash.then_some("shares its block with a chunk stored another way")
        };
        match bad {
            Some(why) if for_check => {
                warn!("{} (address {pbn}) {why}", what());
                Ok(())
            }
            Some(why) => Err(Error::corrupt(
                "packed-block addresses",
                format!(
                    "{} (block {block}, slot {slot}) {why}; `dedup check --repair` fixes the mapping",
                    what()
                ),
            )),
            None => {
                blocks.revive(pbn);
                Ok(())
            }
        }
    };
    scan_all(
        |c, page| inner.lbn_map_scan(c, 4096, page),
        |lbn, pbn| note(pbn, &|| format!("LBN {lbn}")),
    )?;
    scan_all(
        |c, page| inner.hash_index_scan(c, 4096, page),
        |_, pbn| note(pbn, &|| "a hash index entry".to_string()),
    )?;
    Ok(Box::new(Packed {
        bins: Bins::new(cfg.chunk_size as usize),
        cfg: cfg.clone(),
        inner,
        data: None,
        blocks,
        stats: PackingStats::default(),
        fragment_bytes_written: 0,
        repack_cursor: 0,
        failed: None,
    }))
}

impl Packed {
    fn data(&self) -> Result<&Arc<dyn BlockFile>> {
        self.data
            .as_ref()
            .ok_or_else(|| Error::Unsupported("the packing layer has no data device yet".into()))
    }

    fn usable(&self) -> Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(why) => Err(Error::Io {
                context: format!(
                    "writing a packed block failed earlier ({why}); the device takes no more writes: stop it and start it again"
                ),
                cause: std::io::Error::other("packed block write failed"),
            }),
        }
    }

    /// Write sealed bins. A failed write keeps the bins (their chunks stay
    /// readable) and stops the device taking writes.
    fn write_bins(&mut self, sealed: Vec<Bin>, early: bool) -> Result<()> {
        let mut pending = sealed.into_iter();
        while let Some(bin) = pending.next() {
            if self.blocks.live(bin.block) == 0 {
                // Every fragment died before the bin was written.
                self.blocks.drop_bin(bin.block);
                continue;
            }
            let block = self.cfg.pbn_offset(bin.block);
            if let Err(e) = self.data()?.write_at(&bin.packer.seal(), block) {
                self.failed = Some(e.to_string());
                let mut back = vec![bin];
                back.extend(pending);
                self.bins.restore(back);
                return Err(e);
            }
            let used = bin.packer.used();
            self.blocks.sealed(bin.block, bin.packer.len(), used as u32);
            self.stats.bins_written += 1;
            self.stats.bins_written_early += early as u64;
            self.fragment_bytes_written += used as u64;
        }
        Ok(())
    }

    fn write_expired(&mut self) -> Result<()> {
        if self.bins.is_empty() {
            return Ok(());
        }
        let old = self.bins.expired(Instant::now(), bins::WAIT);
        self.write_bins(old, true)
    }

    /// Write every open bin and sync the data device (before a commit).
    /// A failed sync stops the device: the kernel may have dropped the
    /// unwritten pages, so a later sync that succeeds proves nothing.
    fn write_all(&mut self) -> Result<()> {
        let all = self.bins.take_all();
        self.write_bins(all, true)?;
        let synced = self.data()?.sync();
        self.fail_on(synced)
    }

    /// Stop the device if `r` failed while the block map and the backend
    /// may disagree (half a placement, half a repack): nothing more is
    /// written or committed, and a restart rebuilds the map from the last
    /// commit.
    fn fail_on<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.failed.get_or_insert_with(|| e.to_string());
        }
        r
    }

    fn alloc_raw(&mut self) -> Result<Option<Pbn>> {
        let Some(block) = self.blocks.alloc(Hold::None, 1 << RAW_SLOT) else {
            return Ok(None);
        };
        let pbn = addr(block, RAW_SLOT);
        let counted = self.inner.refcount_set(pbn, 1);
        self.fail_on(counted)?;
        Ok(Some(pbn))
    }

    fn alloc_fragment(&mut self, data: &[u8], fragment: &[u8]) -> Result<Option<Pbn>> {
        let blocks = &mut self.blocks;
        let Some(placed) = self
            .bins
            .place(fragment, Arc::from(data), || blocks.alloc(Hold::Bin, 0))
        else {
            return Ok(None);
        };
        let pbn = addr(placed.block, placed.slot as u64);
        self.blocks.revive(pbn);
        // Bins sealed to make room go out first: a failure below must not
        // leave them neither in RAM nor on disk.
        self.write_bins(placed.sealed, false)?;
        let counted = self.inner.refcount_set(pbn, 1);
        self.fail_on(counted)?;
        Ok(Some(pbn))
    }

    pub fn packing_stats(&self) -> PackingStats {
        let (raw, packed, frags) = self.blocks.census();
        let written = self.stats.bins_written.max(1) as f64 * self.cfg.chunk_size as f64;
        PackingStats {
            raw_blocks: raw,
            packed_blocks: packed,
            fragments: frags,
            fragments_per_block: if packed == 0 {
                0.0
            } else {
                frags as f64 / packed as f64
            },
            open_bins: self.bins.len() as u64,
            written_fill_percent: 100.0 * self.fragment_bytes_written as f64 / written,
            ..self.stats.clone()
        }
    }
}

impl MetadataBackend for Packed {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn traits(&self) -> BackendTraits {
        BackendTraits {
            places_data: true,
            ..self.inner.traits()
        }
    }

    fn lbn_map_lookup(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        self.inner.lbn_map_lookup(lbn)
    }

    fn lbn_map_insert(&mut self, lbn: Lbn, pbn: Pbn) -> Result<()> {
        self.inner.lbn_map_insert(lbn, pbn)
    }

    fn lbn_map_delete(&mut self, lbn: Lbn) -> Result<()> {
        self.inner.lbn_map_delete(lbn)
    }

    fn hash_index_lookup(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        self.inner.hash_index_lookup(fp)
    }

    fn hash_index_insert(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<()> {
        self.inner.hash_index_insert(fp, pbn)
    }

    fn hash_index_delete(&mut self, fp: &Fingerprint) -> Result<()> {
        self.inner.hash_index_delete(fp)
    }

    fn alloc_pbn(&mut self) -> Result<Option<Pbn>> {
        // Nothing compressed: a raw block.
        self.alloc_pbn_for(&[], None)
    }

    fn alloc_pbn_for(&mut self, data: &[u8], compressed: Option<&[u8]>) -> Result<Option<Pbn>> {
        self.usable()?;
        self.write_expired()?;
        if self.inner.usage().pbns_used >= self.cfg.max_chunks() {
            // The hash index is sized for this many chunks.
            return Ok(None);
        }
        match compressed {
            Some(c) if worth_packing(c.len(), data.len()) => self.alloc_fragment(data, c),
            _ => self.alloc_raw(),
        }
    }

    fn stage_chunk(&mut self, pbn: Pbn, _data: &[u8], _c: Option<Vec<u8>>) -> Result<Option<u64>> {
        // Fragments went into their bin at allocation; a raw chunk is
        // written by the engine, outside the mutex.
        Ok(match split(pbn) {
            (block, RAW_SLOT) => Some(block),
            _ => None,
        })
    }

    fn locate(&mut self, pbn: Pbn) -> DataLocation {
        let (block, slot) = split(pbn);
        if slot != RAW_SLOT && self.blocks.hold(block) == Hold::Bin {
            if let Some(chunk) = self.bins.staged(block, slot as usize) {
                return DataLocation::Staged(chunk);
            }
        }
        location(pbn)
    }

    fn refcount_inc(&mut self, pbn: Pbn) -> Result<u32> {
        self.inner.refcount_inc(pbn)
    }

    fn refcount_dec(&mut self, pbn: Pbn) -> Result<u32> {
        let c = self.inner.refcount_dec(pbn)?;
        if c == 0 {
            self.blocks.kill(pbn);
        }
        Ok(c)
    }

    fn refcount_get(&mut self, pbn: Pbn) -> Result<u32> {
        self.inner.refcount_get(pbn)
    }

    fn refcount_set(&mut self, pbn: Pbn, count: u32) -> Result<()> {
        let old = self.inner.refcount_get(pbn)?;
        self.inner.refcount_set(pbn, count)?;
        match (old, count) {
            (0, c) if c > 0 => self.blocks.revive(pbn),
            (o, 0) if o > 0 => self.blocks.kill(pbn),
            _ => {}
        }
        Ok(())
    }

    fn set_totals(&mut self, lbns_mapped: u64, hash_entries: u64) -> Result<()> {
        self.inner.set_totals(lbns_mapped, hash_entries)
    }

    fn hash_index_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        self.inner.hash_index_scan(cursor, max, out)
    }

    fn lbn_map_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Lbn, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        self.inner.lbn_map_scan(cursor, max, out)
    }

    fn commit(&mut self) -> Result<()> {
        self.usable()?;
        self.write_all()?;
        self.inner.commit()?;
        self.blocks.commit();
        Ok(())
    }

    fn blocks_waiting(&self) -> bool {
        self.blocks.waiting()
    }

    fn wants_commit(&self) -> bool {
        self.inner.wants_commit()
    }

    fn close(&mut self) -> Result<()> {
        self.usable()?;
        self.write_all()?;
        self.inner.close()
    }

    fn saved_counters(&self) -> Vec<u64> {
        self.inner.saved_counters()
    }

    fn save_counters(&mut self, counters: &[u64]) {
        self.inner.save_counters(counters)
    }

    fn usage(&self) -> BackendUsage {
        self.inner.usage()
    }

    fn data_blocks(&self) -> Option<(u64, u64)> {
        Some((self.blocks.used(), self.blocks.free()))
    }

    fn io_stats(&self) -> MetaIoStats {
        self.inner.io_stats()
    }

    fn backend_stats(&self) -> Vec<(&'static str, u64)> {
        self.inner.backend_stats()
    }

    fn packing(&self) -> Option<PackingStats> {
        Some(self.packing_stats())
    }

    fn attach_data(&mut self, data: Arc<dyn BlockFile>) -> Result<()> {
        self.data = Some(data);
        Ok(())
    }

    fn repack(&mut self, max_blocks: usize) -> Result<RepackReport> {
        let r = self.repack_blocks(max_blocks);
        // Any error past the first moved count leaves the backend and the
        // block map out of step: stop rather than commit that.
        self.fail_on(r)
    }

    fn release_moved(&mut self) {
        self.blocks.release_retired();
    }
}
