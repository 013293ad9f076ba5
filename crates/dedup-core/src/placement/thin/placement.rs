//! The `thin` placement (and its comparison policies `ordered` and `ideal`):
//! ThinDedup's window-based persistence on top of a structured metadata
//! area (the disktable store: LBN array, refcount array and hash index,
//! committed through its journal), which the registry pairs with it.
//!
//! Write path: `alloc` places each new chunk by its LZ4 size;
//! a chunk that compresses enough to carry entries goes to a C-zone, the
//! rest to a U-zone. New chunks are staged here by `write` (reads find
//! them) and every mapping change (the `mapped` hook) becomes an entry
//! (LBN, PBN, fingerprint prefix, timestamp). A window ends after
//! `window_blocks` new chunks, after `window_ms`, or at a FLUSH/FUA (the
//! engine's commit, `before_commit`); then:
//! - `thin`: the window's entries are embedded in its C-blocks, what does
//!   not fit goes to metadata blocks of the log, everything is written
//!   with no ordering between data and metadata, and one flush (of each
//!   device) makes the window durable;
//! - `ordered` (OrderedWrites): data, flush, then all entries in metadata
//!   blocks, flush;
//! - `ideal`: data, flush; no entries at all (the metadata lives in memory
//!   until a clean close: the upper bound, not crash-safe).
//!
//! Every `COMMIT_WINDOWS` windows (or when the log or the area's cache
//! fills) `before_commit` asks the engine to commit the structured area
//! (with the newest timestamp in the engine's record), and then the
//! C-zones whose entries it now holds become committed, and chunks freed
//! since the last such commit become reusable (until then they stay
//! quarantined, so a PBN changes content at most once between commits,
//! which recovery relies on). Recovery opens the area at its last commit
//! and replays the entries of uncommitted C-zones and of the log
//! (`replay`); the engine commits right after.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::cblock::{self, Entry};
use super::replay::{ReplayReport, UNMAPPED};
use super::zones::{Changes, Kind, Zones};
use crate::backend::{BackendUsage, MetaIoStats, MetadataBackend};
use crate::backends::{disktable, BackendParams, WindowParams};
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::placement::{read_plain_runs, NewChunk, Placement, PlacementStats, ReadPiece, Space};

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
/// Bytes of new chunks held in RAM at most (or two windows, if larger)
/// before an allocation writes them out itself. Far above what a window and the
/// batches in flight hold; reached only while commits keep failing (the
/// host's disk full), where a client writing new data would otherwise
/// pile it up in RAM until the host has room again.
const MAX_STAGED_BYTES: u64 = 64 << 20;

/// How a window is made durable (ThinDedup's thin, and the two policies
/// it is compared with).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Entries embedded in the window's C-blocks, no ordering, one flush.
    Thin,
    /// OrderedWrites: data, flush, metadata blocks, flush.
    Ordered,
    /// Data, flush; metadata in memory only (the upper bound, not crash-safe).
    Ideal,
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

/// Lay out thin's areas after the structured area (the disktable store,
/// formatted first).
pub fn format(
    cfg: &DeviceConfig,
    meta: &dyn BlockFile,
    params: &BackendParams,
    window: WindowParams,
) -> Result<()> {
    if window.blocks == 0 || window.blocks > 4096 {
        return Err(Error::InvalidArgument(format!(
            "--window-blocks {} is out of range: give 1 to 4096 (default 32)",
            window.blocks
        )));
    }
    let _ = params;
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

/// The placement: thin's state behind its own lock (reads and `write` come
/// from many threads without the engine's metadata mutex).
pub struct ThinPlacement {
    t: Mutex<Thin>,
}

pub struct Thin {
    pub(super) policy: Policy,
    pub(super) cfg: DeviceConfig,
    pub(super) meta: Arc<dyn BlockFile>,
    pub(super) data: Arc<dyn BlockFile>,
    pub(super) layout: Layout,
    pub(super) window: WindowParams,
    pub(super) zones: Zones,
    pub(super) staged: BTreeMap<Pbn, Staged>,
    pub(super) entries: Vec<Entry>,
    pub(super) window_started: Option<Instant>,
    pub(super) ts: u64,
    /// The clock of the last commit of the structured area.
    pub(super) commit_ts: u64,
    /// Freed since the last commit of the structured area.
    pub(super) quarantine: Vec<Pbn>,
    pub(super) log_next: u64,
    pub(super) log_used: u64,
    pub(super) windows_since_commit: u64,
    /// A change recovery could not replay (a mapping without fingerprint),
    /// or a commit of the structured area that failed: the next window
    /// commits the structured area.
    pub(super) must_commit: bool,
    /// Zone records changed in memory that are not known to be on disk
    /// (their write or flush failed, the host's disk full): written again
    /// before any allocation succeeds, since blocks they cover must not be
    /// written before them.
    pub(super) unpersisted: Vec<usize>,
    pub(super) writable: bool,
    /// `before_commit` asked for a commit of the structured area.
    pub(super) area_pending: bool,
    pub(super) stats: ThinStats,
    pub(super) meta_io: MetaIoStats,
    pub recovery: Option<(ReplayReport, Duration)>,
}

pub(super) fn zone_record_at(l: &Layout, z: usize) -> u64 {
    l.zones + z as u64 * BLOCK as u64
}

/// What opening thin did beyond building the placement.
pub struct OpenedThin {
    pub placement: ThinPlacement,
    /// Recovery changed the structured area: the engine commits it before
    /// serving, and adjusts its totals by these (mapped LBNs, index entries).
    pub recovered: bool,
    pub mapped_delta: i64,
    pub indexed_delta: i64,
}

/// Open thin's areas over `store` (the disktable store on the same
/// metadata device), recovering after an unclean stop (`ideal` instead
/// rolls back to its last save, which the engine then verifies). `record`
/// is what `ThinPlacement::record` saved: the clock of the last commit.
#[allow(clippy::too_many_arguments)]
pub fn open(
    cfg: &DeviceConfig,
    policy: Policy,
    meta: Arc<dyn BlockFile>,
    data: Arc<dyn BlockFile>,
    store: &mut dyn MetadataBackend,
    record: &[u64],
    unclean: bool,
    writable: bool,
) -> Result<OpenedThin> {
    let l = Layout::new(cfg);
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
    let zb = zone_blocks(cfg);
    let window = decode_header(&hb, zb)?;
    let mut zones = Zones::new(cfg.physical_chunks, zb);
    let mut rec = vec![0u8; super::zones::record_len(zb)];
    for z in 0..zones.len() {
        meta.read_at(&mut rec, zone_record_at(&l, z))?;
        if rec.iter().all(|&b| b == 0) {
            continue; // never written: unallocated
        }
        zones.decode(z, &rec)?;
    }
    let commit_ts = record.last().copied().unwrap_or(0);
    let mut t = Thin {
        policy,
        cfg: cfg.clone(),
        meta,
        data,
        layout: l,
        window,
        zones,
        staged: BTreeMap::new(),
        entries: Vec::new(),
        window_started: None,
        ts: commit_ts,
        commit_ts,
        quarantine: Vec::new(),
        log_next: 0,
        log_used: 0,
        windows_since_commit: 0,
        must_commit: false,
        unpersisted: Vec::new(),
        writable,
        area_pending: false,
        stats: ThinStats::default(),
        meta_io: MetaIoStats::default(),
        recovery: None,
    };
    let (mut mapped_delta, mut indexed_delta) = (0, 0);
    let recovered = unclean && policy != Policy::Ideal;
    if recovered {
        (mapped_delta, indexed_delta) = t.recover(store)?;
    } else if unclean {
        // `ideal` rolled back to its last save: the zones' bitmaps are
        // what its counts say (the engine then verifies every chunk).
        let all = 0..t.zones.len();
        t.rebuild_bitmaps(store, all, &BTreeMap::new())?;
    }
    Ok(OpenedThin {
        placement: ThinPlacement { t: Mutex::new(t) },
        recovered,
        mapped_delta,
        indexed_delta,
    })
}

impl Thin {
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
    /// written: written and flushed now (once per zone per commit period),
    /// with any left over from a failed attempt. If this fails the records
    /// stay owed: the zones already say dirty in memory, so later changes
    /// would not ask for them again, and the next call writes them first
    /// (all of them again, as a failed flush may have dropped any).
    pub(super) fn persist_changes(&mut self, changes: Changes) -> Result<()> {
        self.unpersisted.extend(changes.now);
        if self.unpersisted.is_empty() {
            return Ok(());
        }
        self.unpersisted.sort_unstable();
        self.unpersisted.dedup();
        for z in self.unpersisted.clone() {
            self.write_zone(z, false)?;
        }
        self.meta_sync()?;
        self.unpersisted.clear();
        Ok(())
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

    fn alloc_thin(
        &mut self,
        meta: &mut dyn MetadataBackend,
        compressed: Option<usize>,
    ) -> Result<Option<Pbn>> {
        let limit = (self.window.blocks * 2).max(MAX_STAGED_BYTES / self.cfg.chunk_size as u64);
        if self.staged.len() as u64 >= limit {
            // Windows the host refused are still staged: write them now,
            // and refuse this chunk with the host's error if that fails
            // too. (Sound outside a commit: an entry's chunk is staged
            // before the entry is made, so it is never in a later window.)
            self.close_window()?;
        }
        let kind = match compressed {
            Some(n) if cblock::capacity_for(n, self.cfg.chunk_size as usize) > 0 => Kind::C,
            _ => Kind::U,
        };
        // A block the bitmap calls free but the counts hold (a count a
        // repair restored) is never handed out: it is marked and skipped.
        for _ in 0..self.cfg.physical_chunks.max(1) {
            let mut changes = Changes::default();
            let got = self.zones.alloc(kind, 1, &mut changes);
            if let Err(e) = self.persist_changes(changes) {
                // Not handed out, so not left marked in use (nothing would
                // ever free it); its zone's record stays owed.
                for &pbn in &got {
                    self.zones.free(pbn, &mut Changes::default());
                }
                return Err(e);
            }
            let Some(&pbn) = got.first() else {
                return Ok(None);
            };
            if meta.refcount_get(pbn)? == 0 {
                meta.refcount_set(pbn, 1)?;
                return Ok(Some(pbn));
            }
        }
        Ok(None)
    }

    fn stage_thin(&mut self, pbn: Pbn, data: &[u8], lz4: Option<Vec<u8>>) {
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
    }
}

impl Thin {
    /// The chunk at `pbn` (whole): staged, a C-block, or stored plain.
    fn read_chunk(&self, pbn: Pbn, out: &mut [u8]) -> Result<u64> {
        if let Some(s) = self.staged.get(&pbn) {
            out.copy_from_slice(&s.raw);
            return Ok(0);
        }
        self.data.read_at(out, self.cfg.pbn_offset(pbn))?;
        if self.zones.is_cblock(pbn) {
            decode_cblock(pbn, out)?;
        }
        Ok(out.len() as u64)
    }
}

/// Replace the C-block in `buf` by the chunk it holds. A damaged block
/// fails this one read (EIO), never returns other bytes.
fn decode_cblock(pbn: Pbn, buf: &mut [u8]) -> Result<()> {
    let what = || format!("compressed chunk at PBN {pbn}");
    let (chunk, _) = cblock::open(buf).map_err(|e| Error::corrupt(what(), e.to_string()))?;
    if chunk.len() != buf.len() {
        return Err(Error::corrupt(
            what(),
            format!("decompresses to {} bytes, not {}", chunk.len(), buf.len()),
        ));
    }
    buf.copy_from_slice(&chunk);
    Ok(())
}

impl ThinPlacement {
    pub fn thin_stats(&self) -> ThinStats {
        self.t.lock().stats
    }
}

impl Placement for ThinPlacement {
    fn compresses(&self) -> bool {
        !self.t.lock().cfg.compression.is_none()
    }

    fn alloc(
        &self,
        meta: &mut dyn MetadataBackend,
        _data: &[u8],
        compressed: Option<&[u8]>,
    ) -> Result<Option<Pbn>> {
        self.t.lock().alloc_thin(meta, compressed.map(<[u8]>::len))
    }

    fn write(&self, chunks: &[NewChunk]) -> Result<u64> {
        let mut t = self.t.lock();
        let mut bytes = 0u64;
        for c in chunks {
            bytes += c.compressed.map_or(c.data.len(), <[u8]>::len) as u64;
            t.stage_thin(c.pbn, c.data, c.compressed.map(<[u8]>::to_vec));
        }
        Ok(bytes)
    }

    fn read(&self, pieces: &[ReadPiece], buf: &mut [u8]) -> Result<u64> {
        let t = self.t.lock();
        let cs = t.cfg.chunk_size as usize;
        let mut bytes = 0;
        let mut plain: Vec<(u64, &ReadPiece)> = Vec::new();
        let mut chunk = vec![0u8; cs];
        for p in pieces {
            if !t.staged.contains_key(&p.pbn) && !t.zones.is_cblock(p.pbn) {
                plain.push((p.pbn, p));
                continue;
            }
            bytes += t.read_chunk(p.pbn, &mut chunk)?;
            buf[p.in_buf.clone()].copy_from_slice(&chunk[p.in_chunk.clone()]);
        }
        bytes += read_plain_runs(&t.cfg, t.data.as_ref(), &plain, buf)?;
        Ok(bytes)
    }

    fn mapped(&self, lbn: Lbn, to: Option<Pbn>, fp: Option<&Fingerprint>) {
        let mut t = self.t.lock();
        match (to, fp) {
            (Some(pbn), Some(fp)) => t.entry(lbn, pbn, fp.0[..16].try_into().expect("16 bytes")),
            // Without a fingerprint recovery could not check this mapping
            // (a repair): the structured area is committed with the next
            // window.
            (Some(_), None) => t.must_commit = true,
            (None, _) => t.entry(lbn, UNMAPPED, [0; 16]),
        }
    }

    fn freed(&self, pbn: Pbn) {
        self.t.lock().quarantine.push(pbn);
    }

    fn revived(&self, pbn: Pbn) -> Result<()> {
        // A count given back (repair): the block is in use again.
        let mut t = self.t.lock();
        t.quarantine.retain(|&p| p != pbn);
        let mut changes = Changes::default();
        t.zones.mark_used(pbn, &mut changes);
        t.must_commit = true;
        t.persist_changes(changes)
    }

    fn wants_commit(&self) -> bool {
        let t = self.t.lock();
        t.staged.len() as u64 >= t.window.blocks
            || t.entries.len() as u64 >= t.window.blocks * 4
            || t.window_started
                .is_some_and(|s| s.elapsed() >= Duration::from_millis(t.window.ms))
    }

    fn before_commit(&self, meta: &mut dyn MetadataBackend, closing: bool) -> Result<bool> {
        let mut t = self.t.lock();
        t.close_window()?;
        t.area_due(meta, closing)
    }

    fn after_commit(&self, _meta: &mut dyn MetadataBackend, committed: bool) -> Result<()> {
        self.t.lock().area_committed(committed)
    }

    fn space(&self, usage: &BackendUsage) -> Space {
        // What thin can hand out is what its zones have free (the tables'
        // own space map keeps freed blocks until their commit).
        Space {
            used: usage.pbns_used,
            free: self.t.lock().zones.free_blocks(),
            waiting: false,
        }
    }

    fn record(&self) -> Vec<u64> {
        vec![self.t.lock().ts]
    }

    fn stats(&self) -> PlacementStats {
        let t = self.t.lock();
        let s = &t.stats;
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
            ("uncommitted_c_zones", t.zones.uncommitted().len() as u64),
            ("chunks_staged", t.staged.len() as u64),
        ];
        if let Some((r, d)) = &t.recovery {
            v.extend([
                ("recovery_us", d.as_micros() as u64),
                ("recovery_entries", r.entries),
                ("recovery_applied", r.applied),
                ("recovery_not_written", r.not_written),
                ("recovery_chunks_verified", r.chunks_verified),
            ]);
        }
        PlacementStats {
            packing: None,
            extra: v,
            meta_io: t.meta_io,
            metadata_bytes: t.layout.end - t.layout.header,
            // One stat(2): cheap enough for every `status`. Unknown if it fails.
            data_allocated: t.data.allocated().ok().flatten(),
        }
    }
}
