//! The `thin` backend (and its comparison policies `ordered` and `ideal`):
//! ThinDedup's window-based persistence on top of a structured metadata
//! area (disktable's LBN array, refcount array and hash index, committed
//! through its journal).
//!
//! Write path: the engine allocates a PBN per new chunk with its LZ4 size;
//! a chunk that compresses enough to carry entries goes to a C-zone, the
//! rest to a U-zone. New chunks are staged here (reads find them) and every
//! mapping change becomes an entry (LBN, PBN, fingerprint prefix,
//! timestamp). A window ends after `window_blocks` new chunks, after
//! `window_ms`, or at a FLUSH/FUA; then:
//! - `thin`: the window's entries are embedded in its C-blocks, what does
//!   not fit goes to metadata blocks of the log, everything is written
//!   with no ordering between data and metadata, and one flush (of each
//!   device) makes the window durable;
//! - `ordered` (OrderedWrites): data, flush, then all entries in metadata
//!   blocks, flush;
//! - `ideal`: data, flush; no entries at all (the metadata lives in memory
//!   until a clean close: the upper bound, not crash-safe).
//!
//! Every `commit_windows` windows (or when the log or the area's cache
//! fills) the structured area is committed with the newest timestamp, the
//! C-zones whose entries it now holds become committed, and chunks freed
//! since the last such commit become reusable (until then they stay
//! quarantined, so a PBN changes content at most once between commits,
//! which recovery relies on). Recovery opens the area at its last commit
//! and replays the entries of uncommitted C-zones and of the log
//! (`replay`), then commits.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::cblock::{self, Entry};
use super::replay::{ReplayReport, UNMAPPED};
use super::zones::{Changes, Kind, Zones};
use crate::backend::{
    BackendTraits, BackendUsage, DataLocation, MetaIoStats, MetadataBackend, ScanCursor,
};
use crate::backends::{disktable, OpenOptions, Opened};
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::superblock::{DeviceState, Superblock};

pub const THIN: &str = "thin";
pub const ORDERED: &str = "ordered";
pub const IDEAL: &str = "ideal";

/// One of the thin family (thin, ordered, ideal).
pub fn is_thin(backend: &str) -> bool {
    [THIN, ORDERED, IDEAL].contains(&backend)
}

pub(super) const BLOCK: usize = 4096;
const HEADER_MAGIC: &[u8; 8] = b"DDTHIN01";
/// Blocks per zone, at most; small devices get smaller zones so both kinds
/// find room (at least 64 zones, at least 8 blocks each).
const ZONE_BLOCKS_MAX: usize = 256;

pub(super) fn zone_blocks(cfg: &DeviceConfig) -> usize {
    let per = (cfg.physical_chunks / 64) as usize;
    (per / 8 * 8).clamp(8, ZONE_BLOCKS_MAX)
}
/// Metadata blocks in the log (a ring; a commit empties it).
pub(super) const LOG_BLOCKS: u64 = 1024;
/// Windows between commits of the structured area.
pub(super) const COMMIT_WINDOWS: u64 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Thin,
    Ordered,
    Ideal,
}

impl Policy {
    pub fn of(name: &str) -> Option<Policy> {
        match name {
            THIN => Some(Policy::Thin),
            ORDERED => Some(Policy::Ordered),
            IDEAL => Some(Policy::Ideal),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Policy::Thin => THIN,
            Policy::Ordered => ORDERED,
            Policy::Ideal => IDEAL,
        }
    }
}

/// Window parameters, chosen at create time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowParams {
    pub blocks: u64,
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

/// Where thin's own areas start on the metadata device: after the
/// structured area.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) header: u64,
    pub(super) zones: u64,
    pub(super) log: u64,
    pub(super) end: u64,
}

impl Layout {
    fn new(cfg: &DeviceConfig) -> Layout {
        let header = disktable::metadata_device_len(cfg).next_multiple_of(BLOCK as u64);
        let zones = header + BLOCK as u64;
        let n = cfg.physical_chunks.div_ceil(zone_blocks(cfg) as u64);
        let log = zones + n * BLOCK as u64;
        Layout {
            header,
            zones,
            log,
            end: log + LOG_BLOCKS * BLOCK as u64,
        }
    }
}

pub fn metadata_device_len(cfg: &DeviceConfig) -> u64 {
    Layout::new(cfg).end
}

fn encode_header(w: WindowParams, zone_blocks: usize) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    b[..8].copy_from_slice(HEADER_MAGIC);
    b[8..16].copy_from_slice(&w.blocks.to_le_bytes());
    b[16..24].copy_from_slice(&w.ms.to_le_bytes());
    b[24..32].copy_from_slice(&(zone_blocks as u64).to_le_bytes());
    b[32..40].copy_from_slice(&LOG_BLOCKS.to_le_bytes());
    crate::codec::seal(&mut b);
    b
}

fn decode_header(b: &[u8], zone_blocks: usize) -> Result<WindowParams> {
    let bad = |d: &str| Error::corrupt("thin header", d.to_string());
    if &b[..8] != HEADER_MAGIC {
        return Err(bad("no thin header magic (not a thin device, or damaged)"));
    }
    if !crate::codec::is_sealed(b) {
        return Err(bad("checksum mismatch"));
    }
    let u = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().expect("8 bytes"));
    if u(24..32) != zone_blocks as u64 || u(32..40) != LOG_BLOCKS {
        return Err(bad("zone or log size this dedup does not use"));
    }
    let w = WindowParams {
        blocks: u(8..16),
        ms: u(16..24),
    };
    if w.blocks == 0 || w.blocks > 4096 {
        return Err(bad("window size out of range"));
    }
    Ok(w)
}

pub fn format(
    cfg: &DeviceConfig,
    meta: &dyn BlockFile,
    params: &crate::backends::BackendParams,
    window: WindowParams,
) -> Result<()> {
    if window.blocks == 0 || window.blocks > 4096 {
        return Err(Error::InvalidArgument(format!(
            "--window-blocks {} is out of range: give 1 to 4096 (default 32)",
            window.blocks
        )));
    }
    disktable::format(cfg, meta, params)?;
    let l = Layout::new(cfg);
    disktable::zero_range(meta, l.zones, l.end)?;
    meta.write_at(&encode_header(window, zone_blocks(cfg)), l.header)?;
    meta.sync()
}

pub(super) struct Staged {
    pub(super) raw: Arc<[u8]>,
    pub(super) lz4: Option<Vec<u8>>,
}

/// What thin wrote, for status and the benchmark.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThinStats {
    pub windows: u64,
    pub c_blocks: u64,
    pub u_blocks: u64,
    pub meta_blocks: u64,
    pub entries: u64,
    pub entries_embedded: u64,
    pub zone_records: u64,
    pub area_commits: u64,
    /// Windows made durable by a commit of the area (the log was full).
    pub windows_via_commit: u64,
}

pub struct Thin {
    pub(super) policy: Policy,
    pub(super) inner: Box<dyn MetadataBackend>,
    pub(super) cfg: DeviceConfig,
    pub(super) meta: Arc<dyn BlockFile>,
    pub(super) data: Option<Arc<dyn BlockFile>>,
    pub(super) layout: Layout,
    pub(super) window: WindowParams,
    pub(super) zones: Zones,
    pub(super) staged: BTreeMap<Pbn, Staged>,
    pub(super) entries: Vec<Entry>,
    pub(super) window_started: Option<Instant>,
    pub(super) ts: u64,
    /// Freed since the last commit of the structured area.
    pub(super) quarantine: Vec<Pbn>,
    pub(super) log_next: u64,
    pub(super) log_used: u64,
    pub(super) windows_since_commit: u64,
    /// A change recovery could not replay (a mapping without fingerprint):
    /// the next window commits the structured area.
    pub(super) must_commit: bool,
    /// Set after a write or flush of the window or the tables failed: the
    /// device then refuses writes until restarted (recovery runs).
    pub(super) failed: Option<String>,
    /// Not closed cleanly: recovery runs once the data device is attached.
    pub(super) unclean: bool,
    pub(super) writable: bool,
    pub(super) stats: ThinStats,
    pub(super) meta_io: MetaIoStats,
    pub recovery: Option<(ReplayReport, Duration)>,
}

pub(super) fn zone_record_at(l: &Layout, z: usize) -> u64 {
    l.zones + z as u64 * BLOCK as u64
}

pub fn open(
    superblock: Superblock,
    meta: Box<dyn BlockFile>,
    opts: &OpenOptions,
) -> Result<Opened> {
    let cfg = superblock.config.clone();
    let policy = Policy::of(&cfg.backend).expect("registered name");
    let unclean = superblock.state == DeviceState::Open;
    if policy == Policy::Ideal && unclean && opts.writable && !opts.accept_unclean {
        return Err(Error::Unclean {
            path: std::path::PathBuf::from(meta.describe()),
            backend: IDEAL.into(),
        });
    }
    let meta: Arc<dyn BlockFile> = Arc::from(meta);
    let l = Layout::new(&cfg);
    let have = meta.len()?;
    if have < l.end {
        return Err(Error::foreign(
            std::path::Path::new(&meta.describe()),
            format!(
                "metadata device is {have} bytes but this thin device needs {}; was it truncated?",
                l.end
            ),
        ));
    }
    let mut hb = vec![0u8; BLOCK];
    meta.read_at(&mut hb, l.header)?;
    let zb = zone_blocks(&cfg);
    let window = decode_header(&hb, zb)?;
    let inner = disktable::open(superblock, Box::new(meta.clone()), opts)?.backend;
    let mut zones = Zones::new(cfg.physical_chunks, zb);
    let mut rec = vec![0u8; super::zones::record_len(zb)];
    for z in 0..zones.len() {
        meta.read_at(&mut rec, zone_record_at(&l, z))?;
        if rec.iter().all(|&b| b == 0) {
            continue; // never written: unallocated
        }
        zones.decode(z, &rec)?;
    }
    let mut t = Thin {
        policy,
        inner,
        cfg,
        meta,
        data: None,
        layout: l,
        window,
        zones,
        staged: BTreeMap::new(),
        entries: Vec::new(),
        window_started: None,
        ts: 0,
        quarantine: Vec::new(),
        log_next: 0,
        log_used: 0,
        windows_since_commit: 0,
        must_commit: false,
        failed: None,
        unclean,
        writable: opts.writable,
        stats: ThinStats::default(),
        meta_io: MetaIoStats::default(),
        recovery: None,
    };
    t.ts = t.commit_ts();
    // Recovery needs the data device: it runs in `attach_data`. `ideal`
    // rolls back to its last save, which the engine then verifies.
    Ok(Opened {
        backend: Box::new(t),
        rolled_back: policy == Policy::Ideal && unclean,
    })
}

impl Thin {
    /// The timestamp the structured area was last committed with (saved
    /// as the last of the engine's counters).
    pub(super) fn commit_ts(&self) -> u64 {
        self.inner.saved_counters().last().copied().unwrap_or(0)
    }

    /// Refuse work after an I/O failure left the write order unknown.
    pub(super) fn usable(&self) -> Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(why) => Err(Error::Io {
                context: "thin backend".into(),
                cause: std::io::Error::other(format!(
                    "{why}; no more writes are taken: restart the device (recovery runs at open)"
                )),
            }),
        }
    }

    pub(super) fn data(&self) -> Result<&Arc<dyn BlockFile>> {
        self.data
            .as_ref()
            .ok_or_else(|| Error::Unsupported("thin: the data device is not attached".into()))
    }

    pub(super) fn meta_write(&mut self, b: &[u8], at: u64) -> Result<()> {
        self.meta.write_at(b, at)?;
        self.meta_io.writes += 1;
        self.meta_io.bytes_written += b.len() as u64;
        Ok(())
    }

    pub(super) fn meta_sync(&mut self) -> Result<()> {
        self.meta.sync()?;
        self.meta_io.syncs += 1;
        Ok(())
    }

    pub(super) fn write_zone(&mut self, z: usize, clean: bool) -> Result<()> {
        let mut b = self.zones.encode(z, clean);
        b.resize(BLOCK, 0);
        let at = zone_record_at(&self.layout, z);
        self.stats.zone_records += 1;
        self.meta_write(&b, at)
    }

    /// Zone records that must be on disk before the blocks they cover are
    /// written: written and flushed now (once per zone per commit period).
    pub(super) fn persist_changes(&mut self, changes: Changes) -> Result<()> {
        if changes.now.is_empty() {
            return Ok(());
        }
        let written = changes
            .now
            .into_iter()
            .try_for_each(|z| self.write_zone(z, false))
            .and_then(|_| self.meta_sync());
        if let Err(e) = &written {
            // The zone changed in memory but maybe not on disk: recovery
            // could miss its entries, so stop taking writes.
            self.failed = Some(format!("writing a zone record failed: {e}"));
        }
        written
    }

    pub(super) fn entry(&mut self, lbn: Lbn, pbn: Pbn, fp: [u8; 16]) {
        self.ts = self.ts.saturating_add(1);
        self.entries.push(Entry {
            lbn,
            pbn,
            fp,
            timestamp: self.ts,
        });
        self.window_started.get_or_insert_with(Instant::now);
    }

    pub fn thin_stats(&self) -> ThinStats {
        self.stats
    }

    fn alloc_thin(&mut self, compressed: Option<usize>) -> Result<Option<Pbn>> {
        self.usable()?;
        let kind = match compressed {
            Some(n) if cblock::capacity_for(n, self.cfg.chunk_size as usize) > 0 => Kind::C,
            _ => Kind::U,
        };
        // A block the bitmap calls free but the counts hold (a count a
        // repair restored) is never handed out: it is marked and skipped.
        for _ in 0..self.cfg.physical_chunks.max(1) {
            let mut changes = Changes::default();
            let got = self.zones.alloc(kind, 1, &mut changes);
            self.persist_changes(changes)?;
            let Some(&pbn) = got.first() else {
                return Ok(None);
            };
            if self.inner.refcount_get(pbn)? == 0 {
                self.inner.refcount_set(pbn, 1)?;
                return Ok(Some(pbn));
            }
        }
        Ok(None)
    }

    fn stage_thin(&mut self, pbn: Pbn, data: &[u8], lz4: Option<Vec<u8>>) -> Result<()> {
        self.usable()?;
        // A compressible chunk given a plain block is stored plain.
        let lz4 = if self.zones.is_cblock(pbn) {
            Some(lz4.unwrap_or_else(|| lz4_flex::block::compress(data)))
        } else {
            None
        };
        self.staged.insert(
            pbn,
            Staged {
                raw: data.into(),
                lz4,
            },
        );
        self.window_started.get_or_insert_with(Instant::now);
        Ok(())
    }
}

impl MetadataBackend for Thin {
    fn name(&self) -> &'static str {
        self.policy.name()
    }

    fn traits(&self) -> BackendTraits {
        BackendTraits {
            // `ideal` is not, but the engine must still end its windows.
            crash_safe: true,
            places_data: true,
        }
    }

    fn lbn_map_lookup(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        self.inner.lbn_map_lookup(lbn)
    }

    fn lbn_map_insert(&mut self, lbn: Lbn, pbn: Pbn) -> Result<()> {
        // Without a fingerprint recovery could not check this mapping:
        // the structured area is committed with the next window.
        self.must_commit = true;
        self.inner.lbn_map_insert(lbn, pbn)
    }

    fn lbn_map_insert_fp(&mut self, lbn: Lbn, pbn: Pbn, fp: &Fingerprint) -> Result<()> {
        self.inner.lbn_map_insert(lbn, pbn)?;
        self.entry(lbn, pbn, fp.0[..16].try_into().expect("16 bytes"));
        Ok(())
    }

    fn lbn_map_delete(&mut self, lbn: Lbn) -> Result<()> {
        self.inner.lbn_map_delete(lbn)?;
        self.entry(lbn, UNMAPPED, [0; 16]);
        Ok(())
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
        self.alloc_thin(None)
    }

    fn alloc_pbn_for(&mut self, _data: &[u8], compressed: Option<&[u8]>) -> Result<Option<Pbn>> {
        self.alloc_thin(compressed.map(<[u8]>::len))
    }

    fn stage_chunk(&mut self, pbn: Pbn, data: &[u8], lz4: Option<Vec<u8>>) -> Result<Option<u64>> {
        self.stage_thin(pbn, data, lz4)?;
        Ok(None)
    }

    fn locate(&mut self, pbn: Pbn) -> DataLocation {
        if let Some(s) = self.staged.get(&pbn) {
            return DataLocation::Staged(s.raw.clone());
        }
        if self.zones.is_cblock(pbn) {
            DataLocation::Compressed
        } else {
            DataLocation::Plain
        }
    }

    fn attach_data(&mut self, data: Arc<dyn BlockFile>) -> Result<()> {
        self.data = Some(data);
        if self.unclean && self.policy != Policy::Ideal {
            self.recover()?;
        } else if self.unclean {
            // `ideal` rolled back to its last save: the zones' bitmaps are
            // what its counts say (the engine then verifies every chunk).
            self.rebuild_bitmaps(0..self.zones.len(), &BTreeMap::new())?;
        }
        Ok(())
    }

    fn refcount_inc(&mut self, pbn: Pbn) -> Result<u32> {
        self.inner.refcount_inc(pbn)
    }

    fn refcount_dec(&mut self, pbn: Pbn) -> Result<u32> {
        let n = self.inner.refcount_dec(pbn)?;
        if n == 0 {
            self.quarantine.push(pbn);
        }
        Ok(n)
    }

    fn refcount_get(&mut self, pbn: Pbn) -> Result<u32> {
        self.inner.refcount_get(pbn)
    }

    fn refcount_set(&mut self, pbn: Pbn, count: u32) -> Result<()> {
        let was = self.inner.refcount_get(pbn)?;
        self.inner.refcount_set(pbn, count)?;
        if was > 0 && count == 0 {
            self.quarantine.push(pbn);
        }
        if count > 0 {
            // A count given back (repair): the block is in use again.
            self.quarantine.retain(|&p| p != pbn);
            let mut changes = Changes::default();
            self.zones.mark_used(pbn, &mut changes);
            self.persist_changes(changes)?;
        }
        self.must_commit = true;
        Ok(())
    }

    fn set_totals(&mut self, lbns_mapped: u64, hash_entries: u64) -> Result<()> {
        // Only repair calls this: its changes go into the tables at the
        // next commit, not through the log.
        self.must_commit = true;
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
        self.close_window()
    }

    fn wants_commit(&self) -> bool {
        self.staged.len() as u64 >= self.window.blocks
            || self.entries.len() as u64 >= self.window.blocks * 4
            || self
                .window_started
                .is_some_and(|t| t.elapsed() >= Duration::from_millis(self.window.ms))
            || self.inner.wants_commit()
    }

    fn close(&mut self) -> Result<()> {
        self.close_window()?;
        self.commit_area()?;
        let counters = {
            let mut c = self.engine_counters();
            c.push(self.ts);
            c
        };
        self.inner.save_counters(&counters);
        self.inner.close()
    }

    fn saved_counters(&self) -> Vec<u64> {
        self.engine_counters()
    }

    fn save_counters(&mut self, counters: &[u64]) {
        let mut c = counters.to_vec();
        c.push(self.ts);
        self.inner.save_counters(&c);
    }

    fn usage(&self) -> BackendUsage {
        let mut u = self.inner.usage();
        u.metadata_bytes = self.layout.end;
        // What thin can hand out is what its zones have free (the tables'
        // own space map keeps freed blocks until their commit).
        u.pbns_free = self.zones.free_blocks();
        u
    }

    fn backend_stats(&self) -> Vec<(&'static str, u64)> {
        let s = &self.stats;
        let mut v = vec![
            ("windows", s.windows),
            ("c_blocks_written", s.c_blocks),
            ("plain_blocks_written", s.u_blocks),
            ("metadata_blocks_written", s.meta_blocks),
            ("entries", s.entries),
            ("entries_embedded", s.entries_embedded),
            ("zone_records_written", s.zone_records),
            ("area_commits", s.area_commits),
            ("windows_ended_by_area_commit", s.windows_via_commit),
            ("uncommitted_c_zones", self.zones.uncommitted().len() as u64),
        ];
        if let Some((r, t)) = &self.recovery {
            v.extend([
                ("recovery_us", t.as_micros() as u64),
                ("recovery_entries", r.entries),
                ("recovery_applied", r.applied),
                ("recovery_not_written", r.not_written),
                ("recovery_chunks_verified", r.chunks_verified),
            ]);
        }
        v
    }

    fn io_stats(&self) -> MetaIoStats {
        let mut s = self.inner.io_stats();
        s.writes += self.meta_io.writes;
        s.bytes_written += self.meta_io.bytes_written;
        s.syncs += self.meta_io.syncs;
        s
    }
}
