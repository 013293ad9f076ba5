//! The packed placement: compressed chunks packed several to a data block
//! (VDO's packer, ThinDedup's remark that LZ4 pays for itself), over any
//! metadata store.
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
//! index name (each stored chunk is named by one or the other), and
//! learns of every count that reaches 0 through the `freed` hook.
//!
//! # Writes
//! A new chunk that compresses by at least an eighth goes to an open bin
//! ([`bins::Bins`]); others get a block of their own. `alloc` (under the
//! metadata mutex) only decides; `write` (outside it) writes raw chunks
//! and the bins sealed meanwhile (full, or waiting longer than
//! `bins::WAIT`), and `before_commit` writes every open bin and syncs (or
//! `write_unsynced` writes them and `sync_written` syncs beside the
//! journal, which lists the blocks: see `placement/mod.rs`): the data is on
//! disk before any committed mapping recovery keeps names it (the crash
//! contract). Until a bin is on disk its chunks are read from RAM.
//!
//! # Garbage collection
//! A fragment's count reaching 0 frees its bytes only when its whole block
//! is dead. `reclaim` copies the live fragments of blocks at most half
//! live into new blocks (`repack.rs`, which says when a round is worth it), then moves their counts, hash
//! index entries and LBN mappings to the new addresses in the same
//! transaction; the old blocks are reused only after that commit and after
//! every reader that looked up an old address is done (the engine drains
//! them), so a crash or a racing read sees either the old or the new copy.

pub mod bins;
pub mod blocks;
mod repack;

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tracing::warn;

use super::{
    read_plain_runs, NewChunk, PackingStats, Placement, PlacementStats, ReadPiece, ReclaimReport,
    Space,
};
use crate::backend::{scan_all, BackendUsage, MetadataBackend};
use crate::blockfile::written::Listed;
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Pbn};
use crate::error::{Error, Result};

use bins::{Bin, Bins};
use blocks::{Blocks, Hold};
pub use repack::{repack_worth_it, REPACK_LIVE_PERCENT, REPACK_MIN_GAIN};

pub use crate::config::{Addressing, RAW_SLOT};

/// A chunk is stored compressed only if that saves an eighth of it or
/// more: less would not pay for the decompression on every read.
pub fn worth_packing(compressed: usize, chunk: usize) -> bool {
    compressed <= chunk - chunk / 8
}

pub struct Packed {
    state: Mutex<State>,
    /// Punch blocks freed by a commit: only where commits are durable
    /// (INRAM rolls back to its last clean stop after a crash, whose
    /// mappings may name blocks freed since).
    punch: bool,
}

/// A bin sealed but not yet on disk: readable from RAM until `write` or
/// `before_commit` has written it. `claimed`: a writer is writing it.
struct Sealed {
    bin: Bin,
    early: bool,
    claimed: bool,
}

struct State {
    cfg: DeviceConfig,
    /// How (block, slot) maps to an address (`cfg.addressing()`).
    addressing: Addressing,
    /// `cfg.max_chunks()`, asked on every allocation.
    max_chunks: u64,
    data: Arc<dyn BlockFile>,
    blocks: Blocks,
    bins: Bins,
    sealed: Vec<Sealed>,
    stats: PackingStats,
    fragment_bytes_written: u64,
    repack_cursor: u64,
    /// Set when a packed block could not be written: the chunks in it
    /// stay readable from RAM, and the device takes no more writes.
    failed: Option<String>,
    /// Bins written and not yet synced (`write_bins`).
    unsynced: Vec<(u64, Vec<u8>)>,
}

/// The packed placement for a device: rebuild the block map from the
/// addresses `meta`'s LBN map and hash index name.
pub fn open(
    cfg: &DeviceConfig,
    data: Arc<dyn BlockFile>,
    meta: &mut dyn MetadataBackend,
    for_check: bool,
    punch: bool,
    lean: bool,
) -> Result<Packed> {
    let addressing = cfg.addressing();
    let mut blocks = Blocks::new(cfg.physical_chunks, addressing);
    let mut note = |pbn: Pbn, what: &dyn Fn() -> String| -> Result<()> {
        let (block, slot) = addressing.split(pbn);
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
    // Which slots are live, for allocation and the space figures: a
    // lean open (to read chunks only) allocates nothing and skips it.
    if !lean {
        scan_all(
            |c, page| meta.lbn_map_scan(c, 4096, page),
            |lbn, pbn| note(pbn, &|| format!("LBN {lbn}")),
        )?;
        scan_all(
            |c, page| meta.hash_index_scan(c, 4096, page),
            |_, pbn| note(pbn, &|| "a hash index entry".to_string()),
        )?;
    }
    Ok(Packed {
        punch,
        state: Mutex::new(State {
            bins: Bins::new(cfg.chunk_size as usize),
            max_chunks: cfg.max_chunks(),
            addressing: cfg.addressing(),
            cfg: cfg.clone(),
            data,
            blocks,
            sealed: Vec::new(),
            stats: PackingStats::default(),
            fragment_bytes_written: 0,
            repack_cursor: 0,
            failed: None,
            unsynced: Vec::new(),
        }),
    })
}

impl State {
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

    /// Stop the device if `r` failed while the block map and the store
    /// may disagree (half a placement, half a repack): nothing more is
    /// written or committed, and a restart rebuilds the map from the last
    /// commit.
    fn fail_on<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.failed.get_or_insert_with(|| e.to_string());
        }
        r
    }

    fn seal(&mut self, bins: Vec<Bin>, early: bool) {
        self.sealed.extend(bins.into_iter().map(|bin| Sealed {
            bin,
            early,
            claimed: false,
        }));
    }

    /// The staged chunk at (block, slot), if that block is not on disk yet.
    fn staged(&self, block: u64, slot: usize) -> Option<Arc<[u8]>> {
        if self.blocks.hold(block) != Hold::Bin {
            return None;
        }
        self.bins.staged(block, slot).or_else(|| {
            self.sealed
                .iter()
                .find(|s| s.bin.block == block)
                .and_then(|s| s.bin.chunks.get(slot).cloned())
        })
    }

    /// Claim the sealed bins nobody is writing: (block, sealed bytes).
    /// A bin whose fragments all died meanwhile is dropped unwritten.
    fn claim(&mut self) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let blocks = &mut self.blocks;
        self.sealed.retain_mut(|s| {
            if s.claimed {
                return true;
            }
            if blocks.live(s.bin.block) == 0 {
                blocks.drop_bin(s.bin.block);
                return false;
            }
            s.claimed = true;
            out.push((s.bin.block, s.bin.packer.seal()));
            true
        });
        out
    }

    /// Claimed bins are on disk (`ok`) or not: settle them.
    fn settle(&mut self, claimed: &[(u64, Vec<u8>)], ok: bool) {
        for (block, _) in claimed {
            let Some(i) = self.sealed.iter().position(|s| s.bin.block == *block) else {
                continue;
            };
            if !ok {
                self.sealed[i].claimed = false;
                continue;
            }
            let s = self.sealed.swap_remove(i);
            let used = s.bin.packer.used();
            self.blocks
                .sealed(s.bin.block, s.bin.packer.len(), used as u32);
            self.stats.bins_written += 1;
            self.stats.bins_written_early += s.early as u64;
            self.fragment_bytes_written += used as u64;
        }
    }

    /// Write every bin (open ones too) and sync the data device. Runs
    /// with no write batch in flight (before a commit, a repack, close).
    /// A failed sync, or a write failing otherwise than for space, stops
    /// the device: the kernel may have dropped the unwritten pages, so a
    /// later sync that succeeds proves nothing. A write refused for lack
    /// of space (the host's disk full) dirtied nothing: the bins stay in
    /// RAM, sealed, and are written again by the next call, once space is
    /// freed.
    fn write_all(&mut self) -> Result<()> {
        self.write_bins()?;
        let synced = self.data.sync();
        self.settle_unsynced(synced)
    }

    /// `write_all`'s writes: the blocks wait in `unsynced`, still read
    /// from RAM, until `settle_unsynced` hears how their sync went.
    fn write_bins(&mut self) -> Result<()> {
        let all = self.bins.take_all();
        self.seal(all, true);
        let claimed = self.claim();
        let data = self.data.clone();
        let written = claimed
            .iter()
            .try_for_each(|(block, bytes)| data.write_at(bytes, self.cfg.pbn_offset(*block)));
        if let Err(e) = written {
            self.settle(&claimed, false);
            return match e.errno() == libc::ENOSPC {
                true => Err(e),
                false => self.fail_on(Err(e)),
            };
        }
        self.unsynced.extend(claimed);
        Ok(())
    }

    /// The data device was synced (`synced`) after `write_bins`: its
    /// blocks are on disk, or the device stops.
    fn settle_unsynced(&mut self, synced: Result<()>) -> Result<()> {
        let claimed = std::mem::take(&mut self.unsynced);
        self.settle(&claimed, synced.is_ok());
        self.fail_on(synced)
    }

    fn alloc_raw(&mut self, meta: &mut dyn MetadataBackend) -> Result<Option<Pbn>> {
        let Some(block) = self.blocks.alloc(Hold::None, 1 << RAW_SLOT) else {
            return Ok(None);
        };
        let pbn = self.addressing.addr(block, RAW_SLOT);
        let counted = meta.refcount_set(pbn, 1);
        self.fail_on(counted)?;
        Ok(Some(pbn))
    }

    fn alloc_fragment(
        &mut self,
        meta: &mut dyn MetadataBackend,
        data: &[u8],
        fragment: &[u8],
    ) -> Result<Option<Pbn>> {
        let blocks = &mut self.blocks;
        let Some(placed) = self
            .bins
            .place(fragment, Arc::from(data), || blocks.alloc(Hold::Bin, 0))
        else {
            return Ok(None);
        };
        let pbn = self.addressing.addr(placed.block, placed.slot as u64);
        self.blocks.revive(pbn);
        // Bins sealed to make room stay readable from RAM until written.
        self.seal(placed.sealed, false);
        let counted = meta.refcount_set(pbn, 1);
        self.fail_on(counted)?;
        Ok(Some(pbn))
    }

    fn packing_stats(&self) -> PackingStats {
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
            open_bins: (self.bins.len() + self.sealed.len()) as u64,
            written_fill_percent: 100.0 * self.fragment_bytes_written as f64 / written,
            ..self.stats.clone()
        }
    }
}

/// A chunk from its fragment in a packed block: checked against the
/// fragment's checksum, decompressed, and exactly a chunk long, or an
/// error for this chunk alone (never another chunk's bytes).
fn decode_fragment(
    cfg: &DeviceConfig,
    block: u64,
    slot: usize,
    packed: &[u8],
    out: &mut [u8],
) -> Result<()> {
    let what = || format!("compressed chunk in data block {block}, slot {slot}");
    let fragment =
        crate::pack::fragment(packed, slot).map_err(|e| Error::corrupt(what(), e.to_string()))?;
    Ok(cfg.compression.decompress(fragment, out, &what())?)
}

impl Placement for Packed {
    fn compresses(&self) -> bool {
        true
    }

    fn alloc(
        &self,
        meta: &mut dyn MetadataBackend,
        data: &[u8],
        compressed: Option<&[u8]>,
    ) -> Result<Option<Pbn>> {
        let mut s = self.state.lock();
        s.usable()?;
        if !s.bins.is_empty() {
            let old = s.bins.expired(Instant::now(), bins::WAIT);
            s.seal(old, true);
        }
        if meta.usage().pbns_used >= s.max_chunks {
            // The hash index is sized for this many chunks.
            return Ok(None);
        }
        match compressed {
            Some(c) if worth_packing(c.len(), data.len()) => s.alloc_fragment(meta, data, c),
            _ => s.alloc_raw(meta),
        }
    }

    fn write(&self, chunks: &[NewChunk]) -> Result<u64> {
        let (cfg, addressing, data_dev, claimed) = {
            let mut s = self.state.lock();
            s.usable()?;
            (s.cfg.clone(), s.addressing, s.data.clone(), s.claim())
        };
        // Fragments went into their bin at allocation; raw chunks and the
        // bins sealed meanwhile are written here, outside every lock.
        let mut bytes = 0u64;
        let mut raw: Vec<(u64, &[u8])> = Vec::new();
        for c in chunks {
            match addressing.split(c.pbn) {
                (block, RAW_SLOT) => raw.push((block, c.data)),
                _ => bytes += c.compressed.map_or(c.data.len(), <[u8]>::len) as u64,
            }
        }
        let written = super::write_runs(&cfg, data_dev.as_ref(), &raw).and_then(|n| {
            claimed
                .iter()
                .try_for_each(|(block, b)| data_dev.write_at(b, cfg.pbn_offset(*block)))
                .map(|_| n)
        });
        let mut s = self.state.lock();
        s.settle(&claimed, written.is_ok());
        // No room on the host: nothing was dirtied (see `write_all`); the
        // request fails, its chunks are released, the bins stay queued.
        if let Err(e) = &written {
            if e.errno() == libc::ENOSPC {
                return written.map(|n| n + bytes);
            }
        }
        Ok(bytes + s.fail_on(written)?)
    }

    fn read(&self, pieces: &[ReadPiece], buf: &mut [u8]) -> Result<u64> {
        let (cfg, addressing, data) = {
            let s = self.state.lock();
            (s.cfg.clone(), s.addressing, s.data.clone())
        };
        let cs = cfg.chunk_size as usize;
        let mut bytes = 0;
        let mut raw: Vec<(u64, &ReadPiece)> = Vec::new();
        let mut chunk = vec![0u8; cs];
        // The last packed block read, so fragments side by side in one
        // block cost one read.
        let mut packed: Option<(u64, Vec<u8>)> = None;
        for p in pieces {
            let (block, slot) = addressing.split(p.pbn);
            if slot == RAW_SLOT {
                raw.push((block, p));
                continue;
            }
            bytes += read_plain_runs(&cfg, data.as_ref(), &raw, buf)?;
            raw.clear();
            let staged = self.state.lock().staged(block, slot as usize);
            match staged {
                Some(c) => chunk.copy_from_slice(&c),
                None => {
                    if packed.as_ref().map(|(b, _)| *b) != Some(block) {
                        let mut bytes_of_block = vec![0u8; cs];
                        data.read_at(&mut bytes_of_block, cfg.pbn_offset(block))?;
                        bytes += cs as u64;
                        packed = Some((block, bytes_of_block));
                    }
                    let (_, b) = packed.as_ref().expect("just loaded");
                    decode_fragment(&cfg, block, slot as usize, b, &mut chunk)?;
                }
            }
            buf[p.in_buf.clone()].copy_from_slice(&chunk[p.in_chunk.clone()]);
        }
        bytes += read_plain_runs(&cfg, data.as_ref(), &raw, buf)?;
        Ok(bytes)
    }

    fn freed(&self, pbn: Pbn) {
        self.state.lock().blocks.kill(pbn);
    }

    fn revived(&self, pbn: Pbn) -> Result<()> {
        self.state.lock().blocks.revive(pbn);
        Ok(())
    }

    fn before_commit(&self, _meta: &mut dyn MetadataBackend, _closing: bool) -> Result<bool> {
        let mut s = self.state.lock();
        s.usable()?;
        s.write_all()?;
        Ok(true)
    }

    fn write_unsynced(&self, _meta: &mut dyn MetadataBackend) -> Result<bool> {
        let mut s = self.state.lock();
        s.usable()?;
        s.write_bins()?;
        Ok(true)
    }

    fn live_blocks(
        &self,
        _meta: &mut dyn MetadataBackend,
        mut listed: Vec<Listed>,
    ) -> Result<Option<Vec<Listed>>> {
        let s = self.state.lock();
        // A block with any live chunk (its raw one, or a fragment) is
        // freed only by a later commit.
        listed.retain(|(offset, _)| s.blocks.live(s.cfg.pbn_at(*offset)) != 0);
        Ok(Some(listed))
    }

    fn sync_written(&self) -> Result<()> {
        // Outside the state lock: reads of the bins go on from RAM.
        let data = self.state.lock().data.clone();
        let synced = data.sync();
        self.state.lock().settle_unsynced(synced)
    }

    fn after_commit(&self, _meta: &mut dyn MetadataBackend, committed: bool) -> Result<()> {
        if committed {
            // Blocks whose every fragment is dead, now durably: give them
            // back to the host. Outside the state lock (reads go on); the
            // metadata mutex we are called under keeps `alloc` from handing
            // one out before its punch.
            let (cfg, data, mut freed) = {
                let mut s = self.state.lock();
                let freed = s.blocks.commit();
                (s.cfg.clone(), s.data.clone(), freed)
            };
            if self.punch {
                super::punch_blocks(&cfg, data.as_ref(), &mut freed);
            }
        }
        Ok(())
    }

    fn reclaim(&self, meta: &mut dyn MetadataBackend, max_blocks: usize) -> Result<ReclaimReport> {
        let mut s = self.state.lock();
        let r = s.repack_blocks(meta, max_blocks);
        // Any error past the first moved count leaves the store and the
        // block map out of step: stop rather than commit that.
        s.fail_on(r)
    }

    fn reclaim_drained(&self) {
        self.state.lock().blocks.release_retired();
    }

    fn space(&self, _usage: &BackendUsage) -> Space {
        let s = self.state.lock();
        Space {
            used: s.blocks.used(),
            free: s.blocks.free(),
            waiting: s.blocks.waiting(),
        }
    }

    fn stats(&self) -> PlacementStats {
        let (packing, data) = {
            let s = self.state.lock();
            (s.packing_stats(), s.data.clone())
        };
        PlacementStats {
            packing: Some(packing),
            // One stat(2): cheap enough for every `status`. Unknown if it fails.
            data_allocated: data.allocated().ok().flatten(),
            ..Default::default()
        }
    }
}
