//! disktable backend (Dmdedup §2.6.2, DTB): INRAM's structures (an LBN
//! array, a refcount array, a linear-probing hash table) laid out on the
//! metadata device and reached through a buffer cache of configurable size
//! with LRU eviction.
//!
//! Crash consistency: a write-ahead redo journal (`journal.rs`). Changed
//! blocks stay in the cache until a commit journals them and then writes
//! them home; a commit happens on FLUSH/FUA and whenever 75 % of the cache
//! is dirty (the paper's write-back threshold), or the journal would fill.
//! After a crash, the last complete journal is replayed at open, so the
//! tables are exactly those of the last commit. The journal has room for
//! every table block, so a transaction (a big GC pass, a repair) can never
//! outgrow it.

pub(crate) mod cache;
pub(crate) mod geometry;
mod home_sync;
pub(crate) mod journal;
mod salvage;
pub(crate) mod tables;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::backend::{BackendUsage, LostBlock, MetaIoStats, MetadataBackend, ScanCursor, Upkeep};
use crate::backends::counts;
use crate::backends::kv::store::StoreState;
use crate::backends::probe::{self, Slots};
use crate::backends::space_map::SpaceMap;
use crate::backends::{BackendParams, OpenOptions, Opened};
use crate::blockfile::written::Listed;
use crate::blockfile::BlockFile;
use crate::codec::{Decoder, Encoder};
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::superblock::Superblock;

use cache::Cache;
use geometry::{block_ok, Geometry, BLOCK, HEADER, REFS_PER_BLOCK, SLOT_BYTES};
use tables::Journaled;

pub const NAME: &str = "disktable";
const COUNTS: &str = "disktable refcount array";

/// Where disktable's own fields start in the superblock backend area.
const AREA_OFFSET: usize = 64;

pub fn metadata_device_len(cfg: &DeviceConfig) -> u64 {
    Geometry::new(cfg).device_len()
}

pub struct DiskTable {
    cfg: DeviceConfig,
    geo: Geometry,
    t: Journaled,
    space: SpaceMap,
    /// Entries in the hash table (its occupancy: a full table refuses
    /// inserts).
    hash_entries: u64,
    /// The engine's private record, committed in the root block.
    private: Vec<u64>,
}

fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The hash table's slots, through the cache.
struct HashSlots<'a> {
    cache: &'a mut Cache,
    geo: &'a Geometry,
}

impl Slots for HashSlots<'_> {
    fn slot_count(&self) -> u64 {
        self.geo.hash_slots
    }

    fn get(&mut self, i: u64) -> Result<Option<(Fingerprint, Pbn)>> {
        let (b, off) = self.geo.slot(i);
        let block = self.cache.get(b)?;
        let at = HEADER + off;
        let pbn_plus_one = read_u64(block, at + 32);
        if pbn_plus_one == 0 {
            return Ok(None);
        }
        let mut fp = [0u8; 32];
        fp.copy_from_slice(&block[at..at + 32]);
        Ok(Some((Fingerprint(fp), pbn_plus_one - 1)))
    }

    fn set(&mut self, i: u64, entry: Option<(Fingerprint, Pbn)>) -> Result<()> {
        let (b, off) = self.geo.slot(i);
        let block = self.cache.get_mut(b)?;
        let at = HEADER + off;
        let slot = &mut block[at..at + SLOT_BYTES];
        match entry {
            Some((fp, pbn)) => {
                slot[..32].copy_from_slice(&fp.0);
                slot[32..].copy_from_slice(&(pbn + 1).to_le_bytes());
            }
            None => slot.fill(0),
        }
        Ok(())
    }
}

/// disktable's fields in the superblock backend area, after the parameters.
/// The disktable layout (journal and table formats). 2: the journal body
/// is checked by blake3 and holds every table block; 1 (recorded as 0, the
/// field did not exist) had a crc32c body check and a journal of at most
/// 64 MiB.
const LAYOUT: u32 = 2;

fn encode_area(params: &BackendParams, geo: &Geometry) -> Vec<u8> {
    let mut e = Encoder::default();
    e.bytes(&params.encode())
        .pad_to(AREA_OFFSET)
        .u64(geo.journal_blocks)
        .u32(LAYOUT);
    e.buf
}

fn decode_area(area: &[u8], cfg: &DeviceConfig) -> Result<(BackendParams, Geometry)> {
    let params = BackendParams::decode(area)?;
    let mut d = Decoder::new(
        &area[AREA_OFFSET..],
        "disktable layout (superblock backend area)",
    );
    let journal_blocks = d.u64()?;
    let layout = d.u32()?;
    if layout != LAYOUT {
        return Err(Error::corrupt(
            "disktable layout (superblock backend area)",
            format!(
                "layout {} but this dedup reads layout {LAYOUT}: {}",
                layout.max(1),
                if layout < LAYOUT {
                    "the device was made by an earlier development version of dedup; \
                     copy its data off with that version and create it again"
                } else {
                    "the device was made by a newer dedup; use that version"
                }
            ),
        ));
    }
    let geo = Geometry::new(cfg);
    if journal_blocks != geo.journal_blocks {
        return Err(Error::corrupt(
            "disktable layout (superblock backend area)",
            format!(
                "journal of {journal_blocks} blocks, expected {}",
                geo.journal_blocks
            ),
        ));
    }
    Ok((params, geo))
}

/// Zero `[start, end)` of the device, skipping pieces already zero (a fresh
/// sparse file), so old contents of a reused device never look like tables.
pub(crate) fn zero_range(file: &dyn BlockFile, start: u64, end: u64) -> Result<()> {
    const PIECE: u64 = 1 << 20;
    let zeros = vec![0u8; PIECE as usize];
    let mut buf = vec![0u8; PIECE as usize];
    let mut at = start;
    while at < end {
        let n = (end - at).min(PIECE) as usize;
        file.read_at(&mut buf[..n], at)?;
        if buf[..n].iter().any(|&b| b != 0) {
            file.write_at(&zeros[..n], at)?;
        }
        at += n as u64;
    }
    file.sync()
}

pub fn format(cfg: &DeviceConfig, meta: &dyn BlockFile, params: &BackendParams) -> Result<()> {
    let geo = Geometry::new(cfg);
    zero_range(meta, geo.journal_start(), geo.device_len())?;
    let mut sb = Superblock::new(cfg.clone());
    sb.backend_area = encode_area(params, &geo);
    sb.write(meta)
}

pub fn open(
    superblock: Superblock,
    meta: Box<dyn BlockFile>,
    opts: &OpenOptions,
) -> Result<Opened> {
    let backend = open_table(superblock, meta, opts)?;
    Ok(Opened {
        rolled_back: backend.t.kept_stale,
        backend: Box::new(backend),
    })
}

fn open_table(
    superblock: Superblock,
    meta: Box<dyn BlockFile>,
    opts: &OpenOptions,
) -> Result<DiskTable> {
    let cfg = superblock.config.clone();
    let (params, geo) = decode_area(&superblock.backend_area, &cfg)?;
    let file: Arc<dyn BlockFile> = Arc::from(meta);
    Journaled::check_len(file.as_ref(), geo.device_len())?;
    let cache_bytes = opts.cache_bytes.unwrap_or(params.cache_bytes);
    let (mut t, state) = Journaled::open(superblock, file, geo.area(), cache_bytes, opts, NAME)?;
    let mut lost = Vec::new();
    let (space, hash_entries) = load_space(
        t.file.as_ref(),
        &cfg,
        &geo,
        &state,
        opts.for_check.then_some(&mut lost),
        &mut t.cache.io,
    )?;
    let mut table = DiskTable {
        cfg,
        geo,
        t,
        space,
        hash_entries,
        private: state.counters,
    };
    table.salvage(&lost)?;
    // The journal holds every table block, so no transaction outgrows it.
    table.t.mark_open()?;
    Ok(table)
}

/// Read `count` table blocks from `first`, straight from the device (not
/// through the cache), checking each, and hand them to `each` with their
/// index in the run. A block that fails its checksum is refused, or, when
/// salvaging (`lost`), noted there and handed on as empty.
fn scan_blocks(
    file: &dyn BlockFile,
    geo: &Geometry,
    (first, count): (u64, u64),
    io: &mut MetaIoStats,
    mut lost: Option<&mut Vec<u64>>,
    mut each: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    const PER_READ: u64 = 256;
    let empty = [0u8; BLOCK];
    let mut buf = vec![0u8; PER_READ as usize * BLOCK];
    let mut b = 0;
    while b < count {
        let n = (count - b).min(PER_READ);
        let bytes = &mut buf[..n as usize * BLOCK];
        file.read_at(bytes, geo.table_start() + (first + b) * BLOCK as u64)?;
        io.reads += 1;
        io.bytes_read += bytes.len() as u64;
        for (i, block) in bytes.chunks(BLOCK).enumerate() {
            let block_no = first + b + i as u64;
            let block = match (block_ok(block_no, block), lost.as_deref_mut()) {
                (true, _) => block,
                (false, Some(lost)) => {
                    tracing::warn!(
                        "{}: block {block_no} fails its checksum; reading it as empty for the check",
                        geo.table_name(block_no)
                    );
                    lost.push(block_no);
                    &empty[..]
                }
                (false, None) => return Err(geo.area().damaged(block_no)),
            };
            each(b + i as u64, block)?;
        }
        b += n;
    }
    Ok(())
}

/// At open: read every table once, checking every block, rebuild the
/// allocation map from the refcount array, and cross-check the counts of
/// used PBNs and index entries against the root block. A block lost or zeroed since
/// the last commit cannot then go unnoticed (a zero block is also a valid
/// empty one). Opened for check (`lost`), it logs what `check` reports and
/// `repair` fixes instead of refusing, and notes blocks that fail their
/// checksum in `lost`, counting them as empty. Returns the map and the
/// entries in the hash index.
fn load_space(
    file: &dyn BlockFile,
    cfg: &DeviceConfig,
    geo: &Geometry,
    state: &StoreState,
    mut lost: Option<&mut Vec<u64>>,
    io: &mut MetaIoStats,
) -> Result<(SpaceMap, u64)> {
    let for_check = lost.is_some();
    let nr = cfg.pbn_space();
    let mut space = SpaceMap::new(nr);
    space.set_cursor(state.alloc_cursor);
    let mut used = 0u64;
    scan_blocks(
        file,
        geo,
        (geo.refcount(0).0, geo.ref_blocks),
        io,
        lost.as_deref_mut(),
        |i, block| {
            for k in 0..REFS_PER_BLOCK {
                let pbn = i * REFS_PER_BLOCK + k;
                if pbn < nr && read_u32(block, HEADER + k as usize * 4) != 0 {
                    space.mark_used(pbn);
                    used += 1;
                }
            }
            Ok(())
        },
    )?;
    // The LBN map is read for its checksums and ranges; the count of
    // mapped LBNs is the engine's (in its private record).
    count_pbn_entries(
        file,
        geo,
        io,
        lost.as_deref_mut(),
        PbnEntries {
            table: "disktable LBN map",
            entry: "LBN",
            first_block: geo.lbn(0).0,
            blocks: geo.lbn_blocks,
            per_block: geometry::LBNS_PER_BLOCK,
            stride: 8,
            at: 0,
            entries: cfg.logical_chunks(),
            pbns: nr,
        },
    )?;
    let entries = count_pbn_entries(
        file,
        geo,
        io,
        lost,
        PbnEntries {
            table: "disktable hash index",
            entry: "slot",
            first_block: geo.slot(0).0,
            blocks: geo.hash_blocks,
            per_block: geometry::SLOTS_PER_BLOCK,
            stride: SLOT_BYTES,
            at: 32,
            entries: geo.hash_slots,
            pbns: nr,
        },
    )?;
    for (what, found, recorded) in [
        ("PBNs hold data", used, state.pbns_used),
        ("fingerprints are indexed", entries, state.hash_entries),
    ] {
        if found != recorded {
            let detail = format!("{found} {what} but the last commit recorded {recorded}");
            if !for_check {
                return Err(Error::corrupt(
                    "disktable tables",
                    format!("{detail}; {REPAIR}"),
                ));
            }
            tracing::warn!("disktable tables: {detail}");
        }
    }
    Ok((space, entries))
}

/// A table of entries that each hold `PBN + 1` (0 = empty) as 8 bytes.
struct PbnEntries {
    table: &'static str,
    entry: &'static str,
    first_block: u64,
    blocks: u64,
    per_block: u64,
    /// Bytes per entry, and where in the entry the PBN field is.
    stride: usize,
    at: usize,
    /// Entries in use (the last block may have spare room).
    entries: u64,
    /// PBNs on the data device.
    pbns: u64,
}

/// What to do about damage `check --repair` fixes.
const REPAIR: &str = "`dedup check --repair DIR` (device stopped) reports and fixes this";

/// Count a table's non-empty entries, refusing one beyond the data device.
fn count_pbn_entries(
    file: &dyn BlockFile,
    geo: &Geometry,
    io: &mut MetaIoStats,
    lost: Option<&mut Vec<u64>>,
    t: PbnEntries,
) -> Result<u64> {
    let mut found = 0u64;
    let blocks = (t.first_block, t.blocks);
    // Opened for check: an entry beyond the device is counted, for
    // `check` to report, instead of refused.
    let for_check = lost.is_some();
    scan_blocks(file, geo, blocks, io, lost, |i, block| {
        for k in 0..t.per_block {
            let n = i * t.per_block + k;
            let v = read_u64(block, HEADER + k as usize * t.stride + t.at);
            if n < t.entries && v != 0 {
                if v > t.pbns {
                    let what = format!("{} {n} names a PBN beyond the data device", t.entry);
                    if !for_check {
                        return Err(Error::corrupt(t.table, format!("{what}; {REPAIR}")));
                    }
                    tracing::warn!("{}: {what}", t.table);
                }
                found += 1;
            }
        }
        Ok(())
    })?;
    Ok(found)
}

impl DiskTable {
    fn slots(&mut self) -> HashSlots<'_> {
        HashSlots {
            cache: &mut self.t.cache,
            geo: &self.geo,
        }
    }

    fn check_lbn(&self, lbn: Lbn) -> Result<()> {
        counts::lbn_index(lbn, self.cfg.logical_chunks()).map(|_| ())
    }

    fn check_pbn(&self, pbn: Pbn) -> Result<()> {
        counts::pbn_index(COUNTS, pbn, self.geo.pbn_space).map(|_| ())
    }

    fn set_lbn(&mut self, lbn: Lbn, value: u64) -> Result<()> {
        let at = self.geo.lbn(lbn);
        self.t.set_u64(at, value)
    }

    fn set_refcount(&mut self, pbn: Pbn, count: u32) -> Result<()> {
        let at = self.geo.refcount(pbn);
        self.t.set_u32(at, count)
    }

    /// The state record to commit now.
    fn state(&self) -> StoreState {
        StoreState {
            // The engine keeps the count of mapped LBNs in its record.
            lbns_mapped: 0,
            pbns_used: self.space.used(),
            hash_entries: self.hash_entries,
            alloc_cursor: self.space.cursor(),
            counters: self.private.clone(),
        }
    }
}

impl MetadataBackend for DiskTable {
    fn lbn_map_lookup(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        self.check_lbn(lbn)?;
        let at = self.geo.lbn(lbn);
        self.t
            .mapping_at(at, lbn, self.geo.pbn_space, "disktable LBN map")
    }

    fn lbn_map_insert(&mut self, lbn: Lbn, pbn: Pbn) -> Result<Option<Pbn>> {
        self.check_pbn(pbn)?;
        let old = self.lbn_map_lookup(lbn)?;
        self.set_lbn(lbn, pbn + 1)?;
        Ok(old)
    }

    fn lbn_map_delete(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        let old = self.lbn_map_lookup(lbn)?;
        if old.is_some() {
            self.set_lbn(lbn, 0)?;
        }
        Ok(old)
    }

    fn hash_index_lookup(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        probe::lookup(&mut self.slots(), fp)
    }

    fn hash_index_insert(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<()> {
        self.check_pbn(pbn)?;
        let len = self.hash_entries;
        match probe::insert(&mut self.slots(), fp, pbn, len)? {
            probe::Inserted::New => {
                self.hash_entries += 1;
                Ok(())
            }
            probe::Inserted::Replaced => Err(Error::corrupt(
                "disktable hash index",
                format!("fingerprint was already indexed when PBN {pbn} was added"),
            )),
            probe::Inserted::Full => Err(Error::corrupt(
                "disktable hash index",
                "table full: more fingerprints than data chunks, so reference counts are wrong",
            )),
        }
    }

    fn hash_index_delete(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<bool> {
        if self.hash_index_lookup(fp)? != Some(pbn) {
            return Ok(false);
        }
        let removed = probe::delete(&mut self.slots(), fp)?.is_some();
        self.hash_entries -= removed as u64;
        Ok(removed)
    }

    fn alloc_pbn(&mut self) -> Result<Option<Pbn>> {
        let Some(pbn) = self.space.alloc() else {
            return Ok(None);
        };
        if self.refcount_get(pbn)? != 0 {
            return Err(Error::corrupt(
                "disktable refcount array",
                format!("PBN {pbn} is free in the allocation map but has references"),
            ));
        }
        self.set_refcount(pbn, 1)?;
        Ok(Some(pbn))
    }

    fn refcount_inc(&mut self, pbn: Pbn) -> Result<u32> {
        let c = counts::incremented(COUNTS, pbn, self.refcount_get(pbn)?)?;
        self.set_refcount(pbn, c)?;
        Ok(c)
    }

    fn refcount_dec(&mut self, pbn: Pbn) -> Result<u32> {
        let c = counts::decremented(COUNTS, pbn, self.refcount_get(pbn)?)?;
        self.set_refcount(pbn, c)?;
        if c == 0 {
            self.space.free(pbn);
        }
        Ok(c)
    }

    fn refcount_get(&mut self, pbn: Pbn) -> Result<u32> {
        self.check_pbn(pbn)?;
        let at = self.geo.refcount(pbn);
        self.t.u32_at(at)
    }

    fn refcount_set(&mut self, pbn: Pbn, count: u32) -> Result<()> {
        let c = self.refcount_get(pbn)?;
        match (c, count) {
            (0, n) if n > 0 => self.space.mark_used(pbn),
            (n, 0) if n > 0 => self.space.free(pbn),
            _ => {}
        }
        self.set_refcount(pbn, count)
    }

    fn hash_index_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        let from = match cursor.0.len() {
            0 => 0,
            8 => read_u64(&cursor.0, 0),
            _ => return Err(Error::InvalidArgument("not a disktable scan cursor".into())),
        };
        let next = probe::scan(&mut self.slots(), from, max, out)?;
        Ok(next.map(|n| ScanCursor(n.to_le_bytes().to_vec())))
    }

    fn lbn_map_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Lbn, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        let mut lbn = match cursor.0.len() {
            0 => 0,
            8 => read_u64(&cursor.0, 0),
            _ => return Err(Error::InvalidArgument("not a disktable scan cursor".into())),
        };
        let mut taken = 0;
        while lbn < self.cfg.logical_chunks() {
            if taken == max {
                return Ok(Some(ScanCursor(lbn.to_le_bytes().to_vec())));
            }
            if let Some(pbn) = self.lbn_map_lookup(lbn)? {
                out.push((lbn, pbn));
                taken += 1;
            }
            lbn += 1;
        }
        Ok(None)
    }

    fn commit(&mut self, private: &[u64]) -> Result<()> {
        self.commit_with(private, None, &mut || Ok(()))
    }

    fn wants_commit(&self) -> bool {
        self.t.wants_commit()
    }

    fn close(&mut self, private: &[u64]) -> Result<()> {
        self.private = private.to_vec();
        self.t.close(&self.state())?;
        self.space.commit();
        Ok(())
    }

    fn private_data(&self) -> &[u64] {
        &self.private
    }

    fn usage(&self) -> BackendUsage {
        BackendUsage {
            pbns_used: self.space.used(),
            pbns_free: self.space.allocatable(),
            metadata_bytes: self.geo.device_len(),
            io: self.t.cache.io,
            index: None,
        }
    }
}

impl Upkeep for DiskTable {
    fn commit_beside_data(
        &mut self,
        private: &[u64],
        listed: Option<&[Listed]>,
        data_durable: &mut dyn FnMut() -> Result<()>,
    ) -> Option<Result<()>> {
        Some(self.commit_with(private, listed, data_durable))
    }

    fn release_reserve(&mut self) -> Result<u64> {
        self.t.release_reserve()
    }

    fn lost_blocks(&self) -> Vec<LostBlock> {
        self.t.cache.lost.iter().map(|&b| self.held(b)).collect()
    }
}

impl DiskTable {
    /// A commit (`Journaled::commit_beside_data`): `listed`, the data
    /// blocks the journal lists, so that its sync can follow the journal's.
    fn commit_with(
        &mut self,
        private: &[u64],
        listed: Option<&[Listed]>,
        data_durable: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        self.private = private.to_vec();
        self.t
            .commit_beside_data(&self.state(), listed, data_durable)?;
        self.space.commit();
        Ok(())
    }
}
