//! What a device is created and opened with: the stores' and placements'
//! create-time tunables (recorded in the superblock) and the open options.
//! A leaf module, so the engine, the registry, the stores and the
//! placements can all name them without depending on one another.

use std::path::PathBuf;

use crate::codec::{Decoder, Encoder};
use crate::error::{Error, Result};

/// Tunables chosen at create time and recorded in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendParams {
    /// Metadata cache (buffer cache, B-tree cache, LSM block cache) in bytes.
    pub cache_bytes: u64,
    /// Writes per transaction (cowbtree, lsm); 0 = only FLUSH/FUA and cache
    /// pressure end one.
    pub txn_writes: u64,
    /// thin, ordered, ideal: new chunks per window, and the longest a
    /// window stays open (recorded in thin's own header).
    pub window: WindowParams,
    /// sparse: the hash index's RAM budget (recorded in sparse's own part
    /// of the superblock).
    pub index_memory: u64,
}

pub const MIN_CACHE_BYTES: u64 = 256 << 10;
/// The sparse hash index's RAM budget when none is given: a full index of
/// 12.8 M chunks (49 GiB of unique data in 4 KiB chunks), sampled beyond that.
pub const DEFAULT_INDEX_MEMORY: u64 = 256 << 20;

impl Default for BackendParams {
    fn default() -> Self {
        BackendParams {
            cache_bytes: 64 << 20,
            txn_writes: 1000,
            window: Default::default(),
            index_memory: DEFAULT_INDEX_MEMORY,
        }
    }
}

const PARAMS_VERSION: u32 = 1;

/// Window parameters of the thin placement (ThinDedup), chosen at create
/// time and recorded in thin's own header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowParams {
    /// New chunks per window.
    pub blocks: u64,
    /// The longest a window stays open.
    pub ms: u64,
}

impl Default for WindowParams {
    fn default() -> Self {
        WindowParams {
            blocks: 32,
            ms: 100,
        }
    }
}

impl BackendParams {
    pub fn validate(&self) -> Result<()> {
        if self.cache_bytes < MIN_CACHE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "a metadata cache of {} bytes is too small: give at least 256K (e.g. --cache 64M)",
                self.cache_bytes
            )));
        }
        Ok(())
    }

    /// The leading bytes of a persistent backend's superblock area.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u32(PARAMS_VERSION)
            .u64(self.cache_bytes)
            .u64(self.txn_writes);
        e.buf
    }

    pub fn decode(area: &[u8]) -> Result<BackendParams> {
        const S: &str = "backend parameters (superblock backend area)";
        let mut d = Decoder::new(area, S);
        let version = d.u32()?;
        if version != PARAMS_VERSION {
            return Err(Error::corrupt(S, format!("unknown version {version}")));
        }
        let p = BackendParams {
            cache_bytes: d.u64()?,
            txn_writes: d.u64()?,
            ..Default::default()
        };
        p.validate().map_err(|e| Error::corrupt(S, e.to_string()))?;
        Ok(p)
    }
}

#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Open for serving (false: inspect only, write nothing).
    pub writable: bool,
    /// Accept a roll-back to the last saved state after an unclean stop
    /// (backends that are not crash-safe).
    pub accept_unclean: bool,
    /// Keep metadata older than the data device's record (`Error::Stale`),
    /// verifying every stored chunk and unmapping what changed: `check
    /// --repair --data`. Needs `writable`.
    pub accept_stale: bool,
    /// Override the metadata cache size recorded at create time.
    pub cache_bytes: Option<u64>,
    /// sparse: override the hash index's RAM budget recorded at create time
    /// (the index is rebuilt from the chunk records at this budget).
    pub index_memory: Option<u64>,
    /// sparse: of the index's budget, the bytes for prefetched fingerprints
    /// (default an eighth).
    pub index_cache: Option<u64>,
    /// sparse, opened without its index checkpoint: records read into the
    /// index before open returns (default 1 M, 4 GiB of 4 KiB chunks); the
    /// rest are read in the background.
    pub open_warm_records: Option<usize>,
    /// The caller starts write-back and the index warm-up itself
    /// (`Device::start_write_back`, `start_index_warm`) once the process
    /// that serves is running (nbdkit: after its fork). The I/O helpers
    /// (the metadata's background sync, early writeback) start at open
    /// either way, so open in the process that serves.
    pub defer_threads: bool,
    /// Directory for a backend that keeps files of its own (lsm); see `aux_dir`.
    pub aux_dir: Option<PathBuf>,
    /// Opened by `check` or `repair`: damage those report and fix (totals
    /// that disagree with the tables, entries naming PBNs beyond the data
    /// device) is logged instead of refusing the open. Never set to serve.
    pub for_check: bool,
    /// Write-back: mutations are acknowledged once queued in RAM, up to
    /// this many bytes of write data, and applied by background threads;
    /// FLUSH and FUA wait for them (see `engine/writeback.rs`). 0: every
    /// request is applied before it is acknowledged.
    pub write_back_bytes: u64,
    /// Writes smaller than this are applied before they are acknowledged
    /// even with write-back on: for them a copy and a hand-over to an
    /// applier cost more than the write (0: every size may be queued).
    pub write_back_from_bytes: u64,
    /// Opened only to read chunks and the LBN map (a backup by
    /// fingerprint): a packing placement does not rebuild its block map
    /// from every LBN and chunk record (the read path needs none of it),
    /// so such an open's space and packing figures mean nothing. Ignored
    /// with `writable`, `for_check`, or metadata that was rolled back.
    pub lean: bool,
    /// Where changed-block tracking is saved at a clean stop, and the
    /// metadata file whose superblock it is bound to (`changes.rs`; set
    /// by `layout::open`). `None`: untracked.
    pub changes: Option<ChangesAt>,
}

/// The changed-block tracking file and the metadata file it belongs with.
#[derive(Clone, Debug)]
pub struct ChangesAt {
    pub file: PathBuf,
    pub meta: PathBuf,
}
