//! A device as blocks of one size, each known by its state without
//! reading it: what a backup by fingerprint reads (`backup_blocks.rs`)
//! and a restore by fingerprint writes (`restore/blocks.rs`) share.

use std::io;

use dedup_common::fingerprint::{Fingerprint, HashAlgo};

/// What a source knows of one block without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Reads as zeros (never written, trimmed).
    Zero,
    /// Holds the bytes whose fingerprint (the source's hash) this is.
    Known(Fingerprint),
    /// Holds bytes the source keeps no fingerprint for: read them.
    Unknown,
}

/// A device as blocks of one size, each known by its state: what a
/// backup by fingerprint reads (`BlockSource`) and a restore by
/// fingerprint writes (`restore::blocks::BlockTarget`) share.
pub trait BlockMap {
    /// Bytes in a block.
    fn block_size(&self) -> u32;
    /// Blocks in the device.
    fn blocks(&self) -> u64;
    /// The hash behind `BlockState::Known` fingerprints.
    fn hash(&self) -> HashAlgo;
    /// The states of blocks `first..first + count`, in order.
    fn map(&self, first: u64, count: u64) -> io::Result<Vec<BlockState>>;
}
