//! The deduplication engine (Dmdedup §2.3): a block device whose chunks are
//! fingerprinted, looked up in the hash index and stored once. It drives a
//! metadata store (`backend.rs`) and a data placement (`placement/`), both
//! built by the registry; it knows nothing of NBD or the CLI, nor of any
//! store's or placement's format.
//!
//! Concurrency: any number of threads may call `read`, `write`, `discard`,
//! `flush` and `gc` at once. Hashing and data I/O happen outside the metadata
//! mutex; see `locks.rs` for the lock order.

mod changes;
mod check;
mod chunking;
mod commit;
mod data_sync;
mod device;
mod gate;
mod gc;
mod group_commit;
mod locks;
mod map_known;
mod meta;
mod read_path;
mod recover;
mod snapshot;
mod write_path;
mod writeback;

#[cfg(test)]
mod damage_tests;
#[cfg(test)]
mod verify_tests;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard};
use tracing::{error, info, warn};

use crate::backend::scan_all;
use crate::blockfile::overlay::Overlay;
use crate::blockfile::BlockFile;
use crate::config::DeviceConfig;
use crate::error::{Error, Result};
use crate::generation;
use crate::lock::DeviceLock;
use crate::options::{BackendParams, OpenOptions};
use crate::placement::{Placement, Space};
use crate::record::Totals;
use crate::registry;
use crate::stats::{ratio, Counters, Stats};
use crate::superblock::{encode_data_header, Superblock, SUPERBLOCK_AREA};

pub use check::{CheckReport, LostRange, Problem, ProblemKind, RepairReport};
pub use chunking::{is_zero, overwrite_reserve_chunks};
pub use device::Device;
pub use gc::GcReport;
pub use read_path::{ChunkState, Extent, EXTENT_SCAN_CHUNKS};
pub use recover::RecoveryReport;
pub use snapshot::SnapshotStart;

use locks::{FingerprintLocks, LbnLocks};
pub(crate) use meta::Meta;

/// Usage above which the device warns that it is running out of space.
const SPACE_WARNING_PERCENT: u64 = 90;

/// Runs its closure when dropped (a panic included).
pub(super) struct OnDrop<F: FnMut()>(pub(super) F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// `Engine::commit_room` when no FLUSH's commit holds the gate.
const NOT_COMMITTING: u64 = u64::MAX;

/// The engine proper. [`Device`] is what users hold: this, with
/// write-back in front of it when it is on.
pub(crate) struct Engine {
    cfg: DeviceConfig,
    meta: Mutex<Meta>,
    placement: Arc<dyn Placement>,
    /// Requests hold it shared; `close` takes it exclusively, so it waits for
    /// requests in flight and turns later ones away.
    gate: RwLock<bool>,
    /// Write batches hold it shared, commits exclusively (see `commit.rs`).
    commit_gate: gate::Gate,
    /// `commit_room`: `NOT_COMMITTING`, or set by `commit` while it holds
    /// the gate.
    commit_room: AtomicU64,
    /// Commits waiting for the gate, and where writes wait for one of
    /// them to publish its room (`await_commit_room`).
    commits_waiting: AtomicU64,
    room_lock: Mutex<()>,
    room_published: Condvar,
    /// Which FLUSHes an earlier commit already covers (`group_commit.rs`).
    group: group_commit::GroupCommit,
    /// Reads hold it shared from looking chunks up to reading them; a
    /// repack takes it exclusively before the blocks it emptied can be
    /// reused, so no read gets a reused block's bytes (see `gc.rs`).
    move_gate: RwLock<()>,
    /// Commits must run when the store or placement asks, even if the
    /// store is not crash-safe (thin's `ideal` ends windows in them).
    commits: bool,
    /// The thread that syncs the data device while a commit's journal
    /// is written; `None` for a crash test's disks, whose I/O stays in
    /// one order. Declared before `_lock` so that it drops first: the
    /// thread is gone before another process may open the device.
    data_sync: Option<data_sync::DataSync>,
    /// What each commit wrote to the data device (journaled stores).
    written: Option<Arc<crate::blockfile::written::WrittenBlocks>>,
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
    /// Where changed-block tracking is saved, and who it belonged to at
    /// open (the superblock read then) and whether that was a clean stop.
    changes_at: Option<crate::options::ChangesAt>,
    opened: Option<(crate::changes::Owner, bool)>,
    /// Where the data file is (its directory), for errors that say what
    /// to free when the host filesystem fills.
    pub(crate) host_dir: String,
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
        registry::check_name(&cfg.backend)?;
        params.validate()?;
        data.write_at(&encode_data_header(cfg), 0)?;
        data.sync()?;
        // Wipe both superblock slots first: a device formatted over an old one
        // (`create --force`) must not find the old superblock in the other slot.
        meta.write_at(&[0u8; SUPERBLOCK_AREA as usize], 0)?;
        meta.sync()?;
        registry::format(cfg, meta, params, aux_dir)
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
        // Inspection writes nothing to the device, even where an engine
        // writes while it opens (`blockfile/overlay.rs`).
        let (data, meta): (Box<dyn BlockFile>, Box<dyn BlockFile>) = if opts.writable {
            (data, meta)
        } else {
            let (data, meta): (Arc<dyn BlockFile>, Arc<dyn BlockFile>) =
                (Arc::from(data), Arc::from(meta));
            (Box::new(Overlay::new(data)), Box::new(Overlay::new(meta)))
        };
        let mut sb = Superblock::read(meta.as_ref(), &meta_name)?;
        let cfg = sb.config.clone();
        let owner = crate::changes::Owner {
            uuid: cfg.uuid,
            generation: sb.generation,
            logical_size: cfg.logical_size,
        };
        let clean = sb.state == crate::superblock::DeviceState::Clean;
        let mut opts = opts.clone();
        let is_stale = match sb.check_data(data.as_ref(), &meta_name, &data_name) {
            Ok(()) => false,
            Err(e @ Error::Stale { .. }) if opts.accept_stale && opts.writable => {
                warn!("{e}; keeping the older metadata as asked: verifying every stored chunk");
                // The older slot may be one written at open (an unclean state).
                opts.accept_unclean = true;
                true
            }
            Err(e) => return Err(e),
        };
        let data: Arc<dyn BlockFile> = Arc::from(data);
        // Kept stale metadata records no generation until every chunk is
        // verified (`assemble` runs the roll-back check): interrupted, the
        // repair leaves the device refused, never served unverified. The
        // superblock's own generation is left alone, so its writes go to
        // the slot that does not hold the one being kept.
        let witness = match opts.writable {
            true => Some(generation::Witness::new(
                data.clone(),
                cfg.uuid,
                sb.generation,
                is_stale,
            )?),
            false => None,
        };
        sb.witness = witness.clone();
        let mut pair = registry::open(sb, meta, data, &opts)?;
        pair.rolled_back |= is_stale;
        let mut engine = Engine::assemble(cfg, pair, &opts, lock)?;
        if let Some(dir) = std::fs::canonicalize(&data_name)
            .ok()
            .and_then(|p| p.parent().map(|d| d.display().to_string()))
        {
            engine.host_dir = dir;
        }
        if let Some(w) = witness.filter(|w| w.is_held()) {
            w.release()?;
        }
        engine.take_changes(&opts, owner, clean && !is_stale);
        Ok(engine)
    }

    /// Run a device on a store and placement the caller built (the
    /// registry, or a test of a new store or placement: `tests/device/seams.rs`).
    pub fn assemble(
        cfg: DeviceConfig,
        pair: registry::Pair,
        opts: &OpenOptions,
        lock: Option<DeviceLock>,
    ) -> Result<Engine> {
        let counters = Counters::default();
        counters.load(&pair.record.counters);
        let known = pair.record.totals;
        let placement: Arc<dyn Placement> = Arc::from(pair.placement);
        let data_sync = (!pair.data_ordered).then(|| data_sync::DataSync::new(placement.clone()));
        let mut device = Engine {
            cfg,
            meta: Mutex::new(Meta {
                store: pair.store,
                totals: known.unwrap_or_default(),
                awaiting_gc: pair.record.awaiting_gc.unwrap_or(0),
                changes: Default::default(),
                snapshot: None,
            }),
            placement,
            gate: RwLock::new(false),
            commit_gate: Default::default(),
            commit_room: AtomicU64::new(NOT_COMMITTING),
            commits_waiting: AtomicU64::new(0),
            room_lock: Mutex::new(()),
            room_published: Condvar::new(),
            group: Default::default(),
            move_gate: RwLock::new(()),
            commits: pair.commits,
            data_sync,
            written: pair.written,
            writable: opts.writable,
            lbn_locks: LbnLocks::default(),
            fp_locks: FingerprintLocks::default(),
            gc_lock: Mutex::new(()),
            counters,
            space_warned: AtomicBool::new(false),
            releases: AtomicU64::new(0),
            fruitless_gc_at: AtomicU64::new(u64::MAX),
            recovery: None,
            changes_at: None,
            opened: None,
            host_dir: "the data file".to_string(),
            _lock: lock,
        };
        match (known, pair.recovered) {
            // A record of the older layout (or none: a device assembled by
            // hand): count once; the next commit records the totals.
            (None, _) => device.count_totals()?,
            (Some(_), Some((mapped, indexed))) => {
                let t = &mut device.meta.get_mut().totals;
                t.lbns_mapped = t.lbns_mapped.saturating_add_signed(mapped);
                t.hash_entries = t.hash_entries.saturating_add_signed(indexed);
            }
            _ => {}
        }
        if pair.record.awaiting_gc.is_none() || pair.recovered.is_some() {
            // An older record, or a placement's recovery moved counts:
            // count once (a scan of the index); commits keep it after.
            device.meta.get_mut().count_awaiting_gc()?;
        }
        if pair.recovered.is_some() && device.writable {
            // Make the recovered state the committed one before serving.
            device.commit()?;
        }
        if pair.rolled_back {
            let report = device.recover_rolled_back()?;
            warn!(
                "rolled back to older metadata (the last clean stop after a crash, or what `check --repair --data` kept); \
                 {} stored chunks verified, {} no longer matched their fingerprint and \
                 {} LBNs mapped to them now read as zeros",
                report.chunks_verified, report.chunks_dropped, report.lbns_unmapped
            );
            device.recovery = Some(report);
        }
        Ok(device)
    }

    /// Count mapped LBNs and index entries with a scan of each.
    fn count_totals(&mut self) -> Result<()> {
        let m = self.meta.get_mut();
        let mut t = Totals::default();
        scan_all(
            |c, page| m.store.lbn_map_scan(c, 4096, page),
            |_, _| {
                t.lbns_mapped += 1;
                Ok(())
            },
        )?;
        scan_all(
            |c, page| m.store.hash_index_scan(c, 4096, page),
            |_, _| {
                t.hash_entries += 1;
                Ok(())
            },
        )?;
        m.totals = t;
        Ok(())
    }

    /// Data blocks in use and free, as the placement counts them.
    fn space(&self, m: &Meta) -> Space {
        self.placement.space(&m.store.usage())
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
        match m.store.lbn_map_lookup(lbn)? {
            Some(pbn) => Ok(Some((pbn, m.store.refcount_get(pbn)?))),
            None => Ok(None),
        }
    }

    /// Whether the store's index still has records to read (`warm_index`).
    pub(crate) fn index_warming(&self) -> bool {
        let usage = self.meta.lock().store.usage();
        usage.index.is_some_and(|ix| ix.records_to_warm > 0)
    }

    /// One step of the store's background index rebuild (`warm_index`):
    /// `false` once it is whole, or the device closed or failed.
    pub(crate) fn warm_index_step(&self, max: usize) -> bool {
        let Ok(_open) = self.enter() else {
            return false;
        };
        match self.meta.lock().store.warm_index(max) {
            Ok(more) => more,
            Err(e) => {
                warn!("rebuilding the hash index stopped: {e}; it finds fewer duplicates until the next open");
                false
            }
        }
    }

    /// A PBN's reference count (0 = free).
    pub fn refcount(&self, pbn: crate::config::Pbn) -> Result<u32> {
        self.meta.lock().store.refcount_get(pbn)
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

    /// While a FLUSH's commit holds the gate: the new chunks the device
    /// could give when it began. No write batch allocates until it ends,
    /// so this is what every write in flight or queued then shares (see
    /// `Device::mutate`). `None` otherwise.
    pub(crate) fn commit_room(&self) -> Option<u64> {
        match self.commit_room.load(Ordering::SeqCst) {
            NOT_COMMITTING => None,
            room => Some(room),
        }
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

    /// `check_range` of LBNs `first..first + count`.
    pub(crate) fn check_lbns(&self, first: crate::config::Lbn, count: u64) -> Result<()> {
        let cs = u64::from(self.cfg.chunk_size);
        let offset = first
            .checked_mul(cs)
            .ok_or_else(|| Error::InvalidArgument(format!("LBN {first} is past any device")))?;
        self.check_range(offset, count.saturating_mul(cs))
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
        if !self.commits {
            return self.commit();
        }
        let arrived = self.group.arrive();
        match self.group.turn(arrived) {
            Some(_turn) => self.commit(),
            None => Ok(()),
        }
    }

    /// Clean shutdown: waits for requests in flight, saves all metadata and
    /// marks it clean; later requests fail with `Error::Closed`. If saving
    /// fails, the device stays open and `close` can be tried again. Dropping
    /// a device without closing it is a crash, as far as its metadata knows.
    pub fn close(&self) -> Result<()> {
        self.close_after(|| None)
    }

    /// `close`, running `settle` once no request is in flight or can
    /// start (write-back applies what it holds there). What `settle` gave
    /// up (acknowledged writes it could not apply: how many, why) makes
    /// the stop fail with `Error::WritesLost` once the metadata is saved,
    /// and a crash-safe store is left marked open: nothing may call such
    /// a stop clean, and the next start says it was not.
    pub(crate) fn close_after(&self, settle: impl FnOnce() -> Option<(u64, String)>) -> Result<()> {
        let mut g = self.gate.write();
        if *g {
            return Ok(());
        }
        let lost = settle();
        let mut m = self.meta.lock();
        self.end_snapshot_at_close(&mut m)?;
        // Everything out and committed, then the store marks itself clean.
        let p = self.placement.as_ref();
        p.before_commit(m.store.as_mut(), true)?;
        let record = m.record(self.counters.to_vec(), p);
        let committed = match m.store.commit(&record) {
            Err(e) if e.errno() == libc::ENOSPC && m.store.release_reserve()? > 0 => {
                m.store.commit(&record)
            }
            r => r,
        };
        p.after_commit(m.store.as_mut(), committed.is_ok())?;
        committed?;
        if let Some((count, why)) = lost {
            if !self.commits {
                // Saved only at a close: without it the metadata is lost.
                m.store.close(&record)?;
            }
            *g = true;
            let e = Error::WritesLost { count, why };
            error!("device stopped, not cleanly: {e}");
            return Err(e);
        }
        m.store.close(&record)?;
        self.save_changes(&m);
        *g = true;
        info!("device closed cleanly, metadata saved");
        Ok(())
    }

    pub fn stats(&self) -> Stats {
        let (usage, totals, awaiting_gc, blocks, placed, changes, snapshot) = {
            let m = self.meta.lock();
            (
                m.store.usage(),
                m.totals,
                m.awaiting_gc,
                self.space(&m),
                self.placement.stats(),
                m.changes.figures(),
                m.snapshot.as_ref().map(|s| s.figures()),
            )
        };
        let packing = placed.packing;
        let counters = self.counters.snapshot();
        let cs = self.cfg.chunk_size as u64;
        let used = blocks.used * cs;
        let physical = self.cfg.physical_size();
        let mapped = totals.lbns_mapped * cs;
        Stats {
            backend: self.cfg.backend.clone(),
            hash: self.cfg.hash.name().to_string(),
            verify: self.cfg.verify,
            chunk_size: self.cfg.chunk_size,
            logical_size: self.cfg.logical_size,
            physical_size: physical,
            chunks_stored: usage.pbns_used,
            chunks_mapped: totals.lbns_mapped,
            hash_index_entries: totals.hash_entries,
            chunks_awaiting_gc: awaiting_gc,
            hash_index: usage.index,
            overwrite_reserve_bytes: physical.saturating_sub(self.cfg.logical_size).min(
                chunking::overwrite_reserve_chunks(self.cfg.chunk_size)
                    * self.cfg.chunk_size as u64,
            ),
            physical_bytes_used: used,
            data_allocated_bytes: placed.data_allocated,
            physical_bytes_free: physical - used,
            physical_used_percent: 100.0 * used as f64 / physical as f64,
            logical_bytes_mapped: mapped,
            metadata_bytes: usage.metadata_bytes + placed.metadata_bytes,
            dedup_ratio: ratio(totals.lbns_mapped, usage.pbns_used),
            live_dedup_ratio: ratio(
                totals.lbns_mapped,
                usage.pbns_used.saturating_sub(awaiting_gc),
            ),
            io_dedup_ratio: ratio(counters.bytes_written, counters.data_bytes_written),
            compression: self.cfg.compression.to_string(),
            data_blocks_used: blocks.used,
            space_ratio: ratio(mapped, used),
            compression_ratio: ratio(usage.pbns_used * cs, used),
            incompressible_chunks: packing.as_ref().map_or(0, |p| p.raw_blocks),
            packing,
            counters,
            metadata_io: usage.io.plus(placed.meta_io),
            backend_stats: placed
                .extra
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            tracking: changes.map(|(mark, regions_changed)| crate::stats::TrackingFigures {
                mark,
                regions_changed,
                region_chunks: crate::changes::Changes::REGION_CHUNKS,
            }),
            snapshot,
        }
    }

    /// Chunks that writes may still allocate, at least: what write-back
    /// may hold without a write it acknowledged finding the device full.
    pub(crate) fn room_chunks(&self) -> u64 {
        self.room_in(&self.meta.lock())
    }

    /// `room_chunks`, with the metadata mutex held.
    fn room_in(&self, m: &Meta) -> u64 {
        let u = m.store.usage();
        let free = self.placement.space(&u).free;
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
