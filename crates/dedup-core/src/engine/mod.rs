//! The deduplication engine (Dmdedup §2.3): a block device whose chunks are
//! fingerprinted, looked up in the hash index and stored once. It owns the
//! data device and a metadata backend; it knows nothing of NBD or the CLI.
//!
//! Concurrency: any number of threads may call `read`, `write`, `discard`,
//! `flush` and `gc` at once. Hashing and data I/O happen outside the metadata
//! mutex; see `locks.rs` for the lock order.

mod check;
mod chunking;
mod commit;
mod device;
mod gc;
mod locks;
mod read_path;
mod recover;
mod write_path;
mod writeback;

#[cfg(test)]
mod verify_tests;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use tracing::{info, warn};

use crate::backend::MetadataBackend;
use crate::backends::{self, BackendParams, OpenOptions};
use crate::blockfile::BlockFile;
use crate::config::DeviceConfig;
use crate::error::{Error, Result};
use crate::lock::DeviceLock;
use crate::stats::{ratio, Counters, Stats};
use crate::superblock::{check_data_header, encode_data_header, Superblock, SUPERBLOCK_AREA};

pub use check::{CheckReport, Problem, ProblemKind, RepairReport};
pub use chunking::is_zero;
pub use device::Device;
pub use gc::GcReport;
pub use read_path::{Extent, EXTENT_SCAN_CHUNKS};
pub use recover::RecoveryReport;

use locks::{FingerprintLocks, LbnLocks};

/// Data blocks (in use, allocatable): one per PBN unless the backend packs.
fn data_space(m: &dyn MetadataBackend) -> (u64, u64) {
    m.data_blocks().unwrap_or_else(|| {
        let u = m.usage();
        (u.pbns_used, u.pbns_free)
    })
}

/// Usage above which the device warns that it is running out of space.
const SPACE_WARNING_PERCENT: u64 = 90;

/// The engine proper. [`Device`] is what users hold: this, with
/// write-back in front of it when it is on.
pub(crate) struct Engine {
    cfg: DeviceConfig,
    data: Arc<dyn BlockFile>,
    meta: Mutex<Box<dyn MetadataBackend>>,
    /// Requests hold it shared; `close` takes it exclusively, so it waits for
    /// requests in flight and turns later ones away.
    gate: RwLock<bool>,
    /// Write batches hold it shared, commits exclusively (see `commit.rs`).
    commit_gate: RwLock<()>,
    /// Reads hold it shared from looking chunks up to reading them; a
    /// repack takes it exclusively before the blocks it emptied can be
    /// reused, so no read gets a reused block's bytes (see `gc.rs`).
    move_gate: RwLock<()>,
    /// The backend persists commits (so commits need the gate).
    crash_safe: bool,
    /// The backend writes chunk data itself (see `BackendTraits`).
    places_data: bool,
    /// Opened to serve (false: to inspect, writing nothing).
    writable: bool,
    lbn_locks: LbnLocks,
    fp_locks: FingerprintLocks,
    gc_lock: Mutex<()>,
    counters: Counters,
    space_warned: AtomicBool,
    /// Times a chunk was left with count 1 (garbage); see `alloc`.
    releases: AtomicU64,
    /// `releases` when an inline collection last found nothing to free.
    fruitless_gc_at: AtomicU64,
    recovery: Option<RecoveryReport>,
    _lock: Option<DeviceLock>,
}

impl Engine {
    /// Lay out a new device on `data` and `meta` (both already sized).
    /// `aux_dir`: where a backend with files of its own (lsm) keeps them.
    pub fn format(
        cfg: &DeviceConfig,
        data: &dyn BlockFile,
        meta: Arc<dyn BlockFile>,
        params: &BackendParams,
        aux_dir: Option<&std::path::Path>,
    ) -> Result<()> {
        cfg.validate()?;
        backends::check_name(&cfg.backend)?;
        params.validate()?;
        data.write_at(&encode_data_header(cfg), 0)?;
        data.sync()?;
        // Wipe both superblock slots first: a device formatted over an old one
        // (`create --force`) must not find the old superblock in the other slot.
        meta.write_at(&[0u8; SUPERBLOCK_AREA as usize], 0)?;
        meta.sync()?;
        backends::format(cfg, meta, params, aux_dir)
    }

    /// Open a formatted device. `lock` (if any) is held until the device drops.
    pub fn open(
        data: Box<dyn BlockFile>,
        meta: Box<dyn BlockFile>,
        opts: &OpenOptions,
        lock: Option<DeviceLock>,
    ) -> Result<Engine> {
        let meta_name = std::path::PathBuf::from(meta.describe());
        let data_name = std::path::PathBuf::from(data.describe());
        let sb = Superblock::read(meta.as_ref(), &meta_name)?;
        let cfg = sb.config.clone();
        check_data_header(data.as_ref(), &data_name, &cfg)?;
        let mut opened = backends::open(sb, meta, opts)?;
        let counters = Counters::default();
        counters.load(&opened.backend.saved_counters());
        let traits = opened.backend.traits();
        let crash_safe = traits.crash_safe;
        let data: Arc<dyn BlockFile> = Arc::from(data);
        if traits.places_data {
            opened.backend.attach_data(data.clone())?;
        }
        let mut device = Engine {
            cfg,
            data,
            meta: Mutex::new(opened.backend),
            gate: RwLock::new(false),
            commit_gate: RwLock::new(()),
            move_gate: RwLock::new(()),
            crash_safe,
            places_data: traits.places_data,
            writable: opts.writable,
            lbn_locks: LbnLocks::default(),
            fp_locks: FingerprintLocks::default(),
            gc_lock: Mutex::new(()),
            counters,
            space_warned: AtomicBool::new(false),
            releases: AtomicU64::new(0),
            fruitless_gc_at: AtomicU64::new(u64::MAX),
            recovery: None,
            _lock: lock,
        };
        if opened.rolled_back {
            let report = device.recover_rolled_back()?;
            warn!(
                "recovered after an unclean shutdown: rolled back to the last clean stop; \
                 {} stored chunks verified, {} no longer matched their fingerprint and \
                 {} LBNs mapped to them now read as zeros",
                report.chunks_verified, report.chunks_dropped, report.lbns_unmapped
            );
            device.recovery = Some(report);
        }
        Ok(device)
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.cfg
    }

    pub fn size(&self) -> u64 {
        self.cfg.logical_size
    }

    /// Where an LBN points and that chunk's reference count: for tests,
    /// debugging and tools. `None` when unmapped.
    pub fn inspect_lbn(
        &self,
        lbn: crate::config::Lbn,
    ) -> Result<Option<(crate::config::Pbn, u32)>> {
        let mut m = self.meta.lock();
        match m.lbn_map_lookup(lbn)? {
            Some(pbn) => Ok(Some((pbn, m.refcount_get(pbn)?))),
            None => Ok(None),
        }
    }

    /// A PBN's reference count (0 = free).
    pub fn refcount(&self, pbn: crate::config::Pbn) -> Result<u32> {
        self.meta.lock().refcount_get(pbn)
    }

    /// What recovery did at open, if the device was rolled back.
    pub fn recovery(&self) -> Option<&RecoveryReport> {
        self.recovery.as_ref()
    }

    pub(crate) fn enter(&self) -> Result<RwLockReadGuard<'_, bool>> {
        let g = self.gate.read();
        if *g {
            return Err(Error::Closed);
        }
        Ok(g)
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.cfg.logical_size => Ok(()),
            _ => Err(Error::OutOfRange {
                offset,
                len,
                size: self.cfg.logical_size,
            }),
        }
    }

    /// FLUSH: every write completed before this call is made durable (for
    /// crash-safe backends); data first, so no durable mapping names a chunk
    /// whose bytes are not on disk.
    pub fn flush(&self) -> Result<()> {
        let _g = self.enter()?;
        self.flush_entered()
    }

    pub(crate) fn flush_entered(&self) -> Result<()> {
        Counters::add(&self.counters.flushes, 1);
        self.commit()
    }

    /// Clean shutdown: waits for requests in flight, saves all metadata and
    /// marks it clean; later requests fail with `Error::Closed`. If saving
    /// fails, the device stays open and `close` can be tried again. Dropping
    /// a device without closing it is a crash, as far as its metadata knows.
    pub fn close(&self) -> Result<()> {
        self.close_after(|| {})
    }

    /// `close`, running `settle` once no request is in flight or can
    /// start (write-back applies what it holds there).
    pub(crate) fn close_after(&self, settle: impl FnOnce()) -> Result<()> {
        let mut g = self.gate.write();
        if *g {
            return Ok(());
        }
        settle();
        self.data.sync()?;
        let mut m = self.meta.lock();
        m.save_counters(&self.counters.to_vec());
        m.close()?;
        *g = true;
        info!("device closed cleanly, metadata saved");
        Ok(())
    }

    pub fn stats(&self) -> Stats {
        let (usage, io, name, extra, blocks, packing) = {
            let m = self.meta.lock();
            (
                m.usage(),
                m.io_stats(),
                m.name(),
                m.backend_stats(),
                data_space(&**m),
                m.packing(),
            )
        };
        let counters = self.counters.snapshot();
        let cs = self.cfg.chunk_size as u64;
        let used = blocks.0 * cs;
        let physical = self.cfg.physical_size();
        let mapped = usage.lbns_mapped * cs;
        Stats {
            backend: name.to_string(),
            hash: self.cfg.hash.name().to_string(),
            verify: self.cfg.verify,
            chunk_size: self.cfg.chunk_size,
            logical_size: self.cfg.logical_size,
            physical_size: physical,
            chunks_stored: usage.pbns_used,
            chunks_mapped: usage.lbns_mapped,
            hash_index_entries: usage.hash_entries,
            physical_bytes_used: used,
            physical_bytes_free: physical - used,
            physical_used_percent: 100.0 * used as f64 / physical as f64,
            logical_bytes_mapped: mapped,
            metadata_bytes: usage.metadata_bytes,
            dedup_ratio: ratio(usage.lbns_mapped, usage.pbns_used),
            io_dedup_ratio: ratio(counters.bytes_written, counters.data_bytes_written),
            compression: self.cfg.compression.to_string(),
            data_blocks_used: blocks.0,
            space_ratio: ratio(mapped, used),
            compression_ratio: ratio(usage.pbns_used * cs, used),
            incompressible_chunks: packing.as_ref().map_or(0, |p| p.raw_blocks),
            packing,
            counters,
            metadata_io: io,
            backend_stats: extra.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    /// Chunks that writes may still allocate, at least: what write-back
    /// may hold without a write it acknowledged finding the device full.
    pub(crate) fn room_chunks(&self) -> u64 {
        let m = self.meta.lock();
        let u = m.usage();
        let (_, free) = data_space(&**m);
        free.min(u.pbns_free)
            .min(self.cfg.max_chunks().saturating_sub(u.pbns_used))
    }

    /// Warn once when usage crosses 90 %; re-arm once it falls well below.
    fn note_space(&self, used: u64) {
        let total = self.cfg.physical_chunks;
        if used * 100 >= total * SPACE_WARNING_PERCENT {
            if !self.space_warned.swap(true, Ordering::Relaxed) {
                warn!(
                    "data device is {}% full ({used} of {total} chunks); free space (fstrim) and run `dedup gc`, \
                     or writes of new data will fail with ENOSPC",
                    used * 100 / total
                );
            }
        } else if used * 100 < total * (SPACE_WARNING_PERCENT - 5) {
            self.space_warned.store(false, Ordering::Relaxed);
        }
    }
}
