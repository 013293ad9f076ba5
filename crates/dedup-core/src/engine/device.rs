//! The device users hold: the [`Engine`], with write-back in front of it
//! when it was opened with `write_back_bytes` (see `writeback.rs`). Every
//! call that looks at data or metadata first waits for the queued
//! mutations it could see, so callers never observe the queue.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::write_path::Mutation;
use super::writeback::{Admission, Admit, Request, Wait, WriteBack, CLOSE_PATIENCE};
use super::{
    CheckReport, ChunkState, Engine, Extent, GcReport, OnDrop, RecoveryReport, RepairReport,
};
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::Result;
use crate::lock::DeviceLock;
use crate::options::OpenOptions;
use crate::stats::{Counters, Stats};

pub struct Device {
    /// Dropped first: its appliers stop before the engine goes.
    write_back: OnceLock<WriteBack>,
    /// The background index rebuild, if one was started: its stop flag and
    /// thread, joined when the device drops (the thread holds the engine,
    /// and with it the device's lock, while it works).
    warming: OnceLock<Warming>,
    /// Mutations in `mutate` now (write-back decides by it).
    in_flight: AtomicUsize,
    /// The new chunks they may need, at most (write-back's `need`).
    in_flight_need: AtomicU64,
    pub(super) engine: Arc<Engine>,
}

impl Device {
    /// Lay out a new device on `data` and `meta` (both already sized).
    /// `aux_dir`: where a backend with files of its own (lsm) keeps them.
    pub fn format(
        cfg: &DeviceConfig,
        data: &dyn BlockFile,
        meta: Arc<dyn BlockFile>,
        params: &crate::options::BackendParams,
        aux_dir: Option<&std::path::Path>,
    ) -> Result<()> {
        Engine::format(cfg, data, meta, params, aux_dir)
    }

    /// Open a formatted device. `lock` (if any) is held until the device drops.
    pub fn open(
        data: Box<dyn BlockFile>,
        meta: Box<dyn BlockFile>,
        opts: &OpenOptions,
        lock: Option<DeviceLock>,
    ) -> Result<Device> {
        let device = Device {
            write_back: OnceLock::new(),
            warming: OnceLock::new(),
            in_flight: AtomicUsize::new(0),
            in_flight_need: AtomicU64::new(0),
            engine: Arc::new(Engine::open(data, meta, opts, lock)?),
        };
        if !opts.defer_threads {
            device.start_write_back(opts.write_back_bytes, opts.write_back_from_bytes);
            device.start_index_warm();
        }
        Ok(device)
    }

    /// A device on a store and placement built by the caller instead of
    /// the registry (see `registry::Pair`): how a new store or placement
    /// is tried before it is registered.
    pub fn assemble(
        cfg: DeviceConfig,
        pair: crate::registry::Pair,
        opts: &OpenOptions,
    ) -> Result<Device> {
        let device = Device {
            write_back: OnceLock::new(),
            warming: OnceLock::new(),
            in_flight: AtomicUsize::new(0),
            in_flight_need: AtomicU64::new(0),
            engine: Arc::new(Engine::assemble(cfg, pair, opts, None)?),
        };
        if !opts.defer_threads {
            device.start_write_back(opts.write_back_bytes, opts.write_back_from_bytes);
            device.start_index_warm();
        }
        Ok(device)
    }

    /// Turn write-back on (`limit_bytes` > 0, a device opened to serve),
    /// if it is not on yet. Apart from `open` for a process that forks
    /// after opening (nbdkit): threads do not survive a fork.
    pub fn start_write_back(&self, limit_bytes: u64, from_bytes: u64) {
        if limit_bytes > 0 && self.engine.writable {
            self.write_back
                .get_or_init(|| WriteBack::start(&self.engine, limit_bytes, from_bytes));
        }
    }

    /// Finish a partial hash index in the background (a store's
    /// `warm_index`: sparse opened without its checkpoint), on a device
    /// opened to serve. Apart from `open` for a process that forks after
    /// opening (nbdkit): threads do not survive a fork.
    pub fn start_index_warm(&self) {
        if !self.engine.writable || !self.engine.index_warming() {
            return;
        }
        self.warming.get_or_init(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let (engine, stopped) = (Arc::downgrade(&self.engine), stop.clone());
            let thread = std::thread::Builder::new()
                .name("dedup-index-warm".into())
                .spawn(move || {
                    // Some thousands of records per step: the metadata lock
                    // is held for about a millisecond at a time.
                    while !stopped.load(SeqCst)
                        && engine.upgrade().is_some_and(|e| e.warm_index_step(4096))
                    {
                    }
                })
                .expect("the system can start a thread");
            Warming {
                stop,
                thread: Mutex::new(Some(thread)),
            }
        });
    }

    pub fn config(&self) -> &DeviceConfig {
        self.engine.config()
    }

    pub fn size(&self) -> u64 {
        self.engine.size()
    }

    /// Whether writes are acknowledged before they are applied.
    pub fn writes_back(&self) -> bool {
        self.write_back.get().is_some()
    }

    /// What recovery did at open, if the device was rolled back.
    pub fn recovery(&self) -> Option<&RecoveryReport> {
        self.engine.recovery()
    }

    /// Every queued mutation applied (a no-op without write-back).
    fn settled(&self) -> &Engine {
        if let Some(wb) = self.write_back.get() {
            // Stalled: what is applied is consistent; the stalled
            // mutation and those behind it are not in it yet.
            let _ = wb.wait_all();
        }
        &self.engine
    }

    /// Write `buf` at byte `offset`; with `fua`, durable before returning.
    pub fn write(&self, offset: u64, buf: &[u8], fua: bool) -> Result<()> {
        self.mutate(Mutation::Write, offset, buf.len() as u64, buf, fua)
    }

    /// TRIM/discard: the range reads back as zeros; whole chunks are
    /// unmapped and their references dropped (Dmdedup §2.4), partial
    /// chunks get zeros over the covered bytes.
    pub fn discard(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.mutate(Mutation::Discard, offset, len, &[], fua)
    }

    /// WRITE_ZEROES: the same as a discard, since all-zero chunks are never
    /// stored; counted apart so users can tell which their clients send.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.mutate(Mutation::WriteZeroes, offset, len, &[], fua)
    }

    fn mutate(&self, what: Mutation, offset: u64, len: u64, buf: &[u8], fua: bool) -> Result<()> {
        let Some(wb) = self.write_back.get() else {
            return self.engine.mutate(what, offset, len, buf, fua);
        };
        let _g = self.engine.enter()?;
        self.engine.check_range(offset, len)?;
        let e = &self.engine;
        // Counted before `idle` is asked below, so that a request queued
        // against a commit's room sees every one that bypasses the queue.
        // Why that room suffices: no batch allocates while a commit holds
        // the gate, so all that can take the room the commit saw before a
        // write queued now applies are the mutations in flight now
        // (`in_flight_need`, less its own), the mutations write-back holds
        // room for (`room_held`), and mutations arriving later, which find
        // write-back busy and never bypass it (and while such writes are
        // queued, read the room again less what is in flight: `submit`).
        let _in = InFlight::enter(self, wb.need(what, offset, len));
        // Writes while others are in flight are applied here (the client
        // keeps the device busy), and so are small writes: for them a copy
        // and a hand-over cost more than the write. With nothing queued
        // that takes no lock. But a write that arrives while a FLUSH's
        // commit holds the gate is queued if it can be: applied here it
        // would wait out the commit's syncs (ten times a write's latency);
        // queued it is acknowledged at once, applied when the gate opens,
        // and the next FLUSH waits for it as for any queued write.
        let small = what == Mutation::Write && len < wb.queue_from;
        let asked = Asked {
            device: self,
            small,
        };
        // A write found no commit under way below, but one may take the
        // gate before the write's batch does: applied here, the write
        // would then wait out that commit's syncs. Such a write is refused
        // by the gate, nothing done, and decided again, once, now that the
        // commit holds the gate (queued if it can be). Each pass is the
        // decision made before: nothing of the first is left behind.
        let mut may_refuse = what == Mutation::Write;
        loop {
            if what == Mutation::Write && !asked.alone() {
                // It would be applied here, and so queue behind a commit
                // that waits for the gate and wait out its syncs too: it
                // waits for the commit to take the gate instead, and is
                // then queued.
                e.await_commit_room();
            }
            let during_commit = what == Mutation::Write && e.commit_room().is_some();
            let refuse = may_refuse && !during_commit;
            may_refuse = false;
            let perform = || {
                if refuse {
                    e.perform_unless_committing(what, offset, len, buf)
                } else {
                    e.perform(what, offset, len, buf).map(|()| true)
                }
            };
            let worth_queueing = asked.alone() || during_commit;
            let applied = if !worth_queueing && wb.idle() {
                let _done = OnDrop(|| wb.bypassed());
                perform()?
            } else {
                let req = Request {
                    what,
                    offset,
                    len,
                    buf,
                };
                match wb.submit(req, &asked) {
                    Admit::Queued => {
                        Counters::add(&e.counters.write_back_requests, 1);
                        true
                    }
                    Admit::Direct { held, after } => {
                        let _done = OnDrop(|| wb.done_direct(held));
                        match after {
                            Wait::All => wb.wait_all(),
                            Wait::Overlapping => wb.wait_range(offset, len),
                        }?;
                        perform()?
                    }
                }
            };
            if applied {
                break;
            }
        }
        if what != Mutation::Write && wb.stalled() {
            // Writes wait for space (the host's filesystem is full): what
            // this trim freed is given back now, through the store's
            // reserve if need be, not at a FLUSH that fails until the
            // stall clears. The commit makes it durable (FUA too).
            return e.commit_freed();
        }
        if fua {
            self.flush_entered(wb)?;
        }
        Ok(())
    }

    /// Whether a commit holds the gate now (for tests that time a request
    /// into one).
    #[doc(hidden)]
    pub fn committing(&self) -> bool {
        self.engine.commit_room().is_some()
    }

    /// Whether a commit is waiting for the gate now (for tests).
    #[doc(hidden)]
    pub fn commit_waiting(&self) -> bool {
        self.engine.commit_waiting()
    }

    /// Writes queued so far, read without waiting for anything (`stats`
    /// waits for the queue and the metadata mutex; for tests).
    #[doc(hidden)]
    pub fn queued_so_far(&self) -> u64 {
        self.engine
            .counters
            .write_back_requests
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// FLUSH: every write acknowledged before this call is made durable
    /// (queued ones applied first). Fails while a queued write that failed
    /// is being retried: what it acknowledged is not durable yet.
    pub fn flush(&self) -> Result<()> {
        let Some(wb) = self.write_back.get() else {
            return self.engine.flush();
        };
        let _g = self.engine.enter()?;
        self.flush_entered(wb)
    }

    fn flush_entered(&self, wb: &WriteBack) -> Result<()> {
        wb.wait_all()?;
        self.engine.flush_entered()
    }

    /// Read `buf.len()` bytes at `offset`, after the queued mutations of
    /// that range.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if let Some(wb) = self.write_back.get() {
            wb.wait_range(offset, buf.len() as u64)?;
        }
        self.engine.read(offset, buf)
    }

    /// Point each LBN at the stored chunk of its fingerprint where the
    /// hash index holds one, with no data written; per block, whether it
    /// now holds that content (else its bytes must be written). See
    /// `map_known.rs`: the fingerprints must come from checked bytes.
    pub fn map_known(
        &self,
        blocks: &[(Lbn, crate::fingerprint::Fingerprint)],
    ) -> Result<Vec<bool>> {
        // Never mapped under a queued mutation that would land after it.
        if let Some(wb) = self.write_back.get() {
            wb.wait_all()?;
        }
        self.engine.map_known(blocks)
    }

    /// What changed since the changed-block tracking's mark, if the
    /// device tracks it and trusts it (`changes.rs`).
    pub fn changes(&self) -> Option<crate::changes::Changes> {
        self.settled().changes()
    }

    /// Whether `start_changes` can start the tracking: the device was
    /// opened from its directory, to write or after a clean stop.
    pub fn can_track(&self) -> bool {
        self.engine.can_track()
    }

    /// Track changed blocks anew from `mark` (a backup that walked the
    /// device as it is now records it).
    pub fn start_changes(&self, mark: u64) -> Result<()> {
        self.settled().start_changes(mark)
    }

    /// Freeze the LBN map for a backup while writes go on (see
    /// `engine/snapshot.rs`): every write completed before this call is
    /// in it, none begun after it returns.
    pub fn snapshot_start(&self) -> Result<super::SnapshotStart> {
        self.snapshot_start_keeping(super::snapshot::MAX_KEPT)
    }

    /// `snapshot_start`, given up past `max_kept` LBNs kept (tests ask
    /// for few). A queued write that cannot be applied (write-back
    /// stalled) refuses the snapshot: an acknowledged write would be
    /// missing from it.
    pub fn snapshot_start_keeping(&self, max_kept: usize) -> Result<super::SnapshotStart> {
        if let Some(wb) = self.write_back.get() {
            wb.wait_all()?;
        }
        self.engine.snapshot_start(max_kept)
    }

    /// What LBNs `first..first + count` held at the freeze.
    pub fn snapshot_map(&self, first: Lbn, count: u64) -> Result<Vec<ChunkState>> {
        self.engine.snapshot_map(first, count)
    }

    /// Whole chunks from LBN `first` as they were at the freeze.
    pub fn snapshot_read(&self, first: Lbn, buf: &mut [u8]) -> Result<()> {
        self.engine.snapshot_read(first, buf)
    }

    /// End snapshot `id`; with `mark` (its backup committed) the tracking
    /// goes on from the freeze under that mark. Returns whether it did.
    pub fn snapshot_end(&self, id: u64, mark: Option<u64>) -> Result<bool> {
        self.engine.snapshot_end(id, mark)
    }

    /// What logical chunks `first..first + count` hold, after the queued
    /// mutations of that range (see `Engine::block_map`).
    pub fn block_map(&self, first: Lbn, count: u64) -> Result<Vec<ChunkState>> {
        if let Some(wb) = self.write_back.get() {
            let cs = u64::from(self.config().chunk_size);
            wb.wait_range(first.saturating_mul(cs), count.saturating_mul(cs))?;
        }
        self.engine.block_map(first, count)
    }

    /// Mapped and unmapped extents from `offset` (see `Engine::extents`).
    pub fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        if let Some(wb) = self.write_back.get() {
            wb.wait_range(offset, len)?;
        }
        self.engine.extents(offset, len)
    }

    /// Clean shutdown (see `Engine::close`): queued mutations are applied
    /// first; one that keeps failing is retried for `CLOSE_PATIENCE`, then
    /// given up so that the metadata is saved, and the stop fails with
    /// `Error::WritesLost`: never a clean stop after dropping a write.
    pub fn close(&self) -> Result<()> {
        match self.write_back.get() {
            None => self.engine.close(),
            Some(wb) => self
                .engine
                .close_after(|| wb.settle_for_close(&self.engine.counters, CLOSE_PATIENCE)),
        }
    }

    pub fn stats(&self) -> Stats {
        self.settled().stats()
    }

    pub fn gc(&self) -> Result<GcReport> {
        self.settled().gc()
    }

    pub fn check(&self, verify_data: bool) -> Result<CheckReport> {
        self.settled().check(verify_data)
    }

    /// `check`, reporting (hash index entries done, total) as it goes.
    pub fn check_with_progress(
        &self,
        verify_data: bool,
        progress: &dyn Fn(u64, u64),
    ) -> Result<CheckReport> {
        self.settled().check_with_progress(verify_data, progress)
    }

    pub fn repair(&self, verify_data: bool) -> Result<(CheckReport, RepairReport)> {
        self.settled().repair(verify_data)
    }

    /// Where an LBN points and that chunk's reference count: for tests,
    /// debugging and tools. `None` when unmapped.
    pub fn inspect_lbn(&self, lbn: Lbn) -> Result<Option<(Pbn, u32)>> {
        self.settled().inspect_lbn(lbn)
    }

    /// A PBN's reference count (0 = free).
    pub fn refcount(&self, pbn: Pbn) -> Result<u32> {
        self.settled().refcount(pbn)
    }
}

/// Write-back's questions about a request, answered for `Device::mutate`.
struct Asked<'a> {
    device: &'a Device,
    /// Below write-back's `queue_from`: never queued for arriving alone.
    small: bool,
}

impl Admission for Asked<'_> {
    fn room(&self) -> u64 {
        self.device.engine.room_chunks()
    }

    fn alone(&self) -> bool {
        !self.small && self.device.in_flight.load(SeqCst) == 1
    }

    fn others_need(&self, own: u64) -> u64 {
        self.device.in_flight_need.load(SeqCst).saturating_sub(own)
    }

    fn commit_room(&self) -> Option<u64> {
        self.device.engine.commit_room()
    }
}

/// Counts a mutation in flight, and the new chunks it may need, while it
/// lives.
struct InFlight<'a>(&'a Device, u64);

impl<'a> InFlight<'a> {
    fn enter(d: &'a Device, need: u64) -> InFlight<'a> {
        d.in_flight.fetch_add(1, SeqCst);
        d.in_flight_need.fetch_add(need, SeqCst);
        InFlight(d, need)
    }
}

struct Warming {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Some(w) = self.warming.get() {
            w.stop.store(true, SeqCst);
            if let Some(t) = w.thread.lock().take() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight_need.fetch_sub(self.1, SeqCst);
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}
