//! A minimal placement to copy when writing a new one: one chunk per data
//! block, the PBN is the block (as `plain`, without its batching of
//! consecutive blocks into one I/O). It implements only the required
//! methods; the provided hooks keep their defaults, which suit a placement
//! whose addresses are the store's PBNs one for one.
//!
//! What a real placement overrides, and why:
//! - `compresses`: return true to be handed each new chunk's compressed
//!   form in `alloc` and `write` (packed, thin store fewer bytes);
//! - `mapped`, `freed`, `revived`: track which of its blocks are live when
//!   its addresses are not the store's PBNs one for one (fragments in a
//!   block), or keep metadata beside the data (thin's fingerprints);
//! - `before_commit`: write what it staged in RAM (open bins, a window)
//!   and sync it, and say whether the store should commit now;
//!   `wants_commit`: ask for a commit (thin: its window is full or old);
//! - `after_commit`: blocks it reuses itself become free only once the
//!   commit that freed them is durable (the crash contract in `mod.rs`);
//! - `reclaim`, `reclaim_drained`: garbage of its own to collect (packed
//!   repacks half-empty blocks, and reuses them once no reader holds them);
//! - `space`: data blocks used and free when they differ from the store's
//!   PBN counts, so ENOSPC and `dedup status` are right;
//! - `record`: words to persist atomically with the store's commit (thin's
//!   clock); `stats`: figures for `dedup status`.
//!
//! Register it by adding a `PlacementKind` and the rows that use it in
//! `kinds.rs` (see `DeviceConfig::placement` for how a device
//! picks its placement) and an
//! arm in `registry.rs` `open`. Test it first, unregistered, with a
//! hand-built `registry::Pair` as `tests/device/seams.rs` does for this skeleton.

use std::sync::Arc;

use super::{NewChunk, Placement, ReadPiece};
use crate::backend::MetadataBackend;
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Pbn};
use crate::error::Result;

pub struct SkeletonPlacement {
    cfg: DeviceConfig,
    data: Arc<dyn BlockFile>,
}

impl SkeletonPlacement {
    // The geometry gives each PBN's offset; the data device is shared with the engine's owner.
    pub fn new(cfg: &DeviceConfig, data: Arc<dyn BlockFile>) -> SkeletonPlacement {
        SkeletonPlacement {
            cfg: cfg.clone(),
            data,
        }
    }
}

impl Placement for SkeletonPlacement {
    // Chunks are stored as they are, so the engine need not spend time compressing.
    fn compresses(&self) -> bool {
        false
    }

    // One chunk per block: the store's PBN is the address, and its space manager allocates.
    fn alloc(
        &self,
        meta: &mut dyn MetadataBackend,
        _data: &[u8],
        _compressed: Option<&[u8]>,
    ) -> Result<Option<Pbn>> {
        meta.alloc_pbn()
    }

    // Written at once, so `read` and `before_commit` need no staging area.
    fn write(&self, chunks: &[NewChunk]) -> Result<u64> {
        let mut bytes = 0;
        for c in chunks {
            self.data.write_at(c.data, self.cfg.pbn_offset(c.pbn))?;
            bytes += c.data.len() as u64;
        }
        Ok(bytes)
    }

    // Whole chunks through a scratch buffer: simplest, and the shape a decoding placement needs.
    fn read(&self, pieces: &[ReadPiece], buf: &mut [u8]) -> Result<u64> {
        let mut chunk = vec![0u8; self.cfg.chunk_size as usize];
        for p in pieces {
            self.data.read_at(&mut chunk, self.cfg.pbn_offset(p.pbn))?;
            buf[p.in_buf.clone()].copy_from_slice(&chunk[p.in_chunk.clone()]);
        }
        Ok(pieces.len() as u64 * chunk.len() as u64)
    }

    // Mappings the store commits next must name bytes already durable on the data device.
    fn before_commit(&self, _meta: &mut dyn MetadataBackend, _closing: bool) -> Result<bool> {
        self.data.sync()?;
        Ok(true)
    }
}
