//! The sparse store: metadata that grows with the data, not the device.
//!
//! disktable's crash-safe machinery (4 KiB checksummed table blocks behind
//! a bounded buffer cache, a redo journal, commits on FLUSH/FUA and when
//! the cache is mostly dirty) over tables laid out in a sparse file
//! (`geometry.rs`), so a block never written costs nothing:
//! - the **LBN map**, 8 bytes per logical chunk, paged through the cache
//!   (VDO's block map): a 1 TiB device costs nothing for ranges never written;
//! - **reference counts**, 4 bytes per PBN, and a **summary** of how many
//!   PBNs of each refcount block are in use (in RAM, 2 bytes per 1,022
//!   PBNs, paged: only pages that count something, `paged.rs`), so
//!   allocation skips full blocks and never scans the device;
//! - **chunk records**, the fingerprint stored with each indexed chunk:
//!   the authoritative "hash index" of the Dmdedup seam, keyed by PBN, so
//!   GC and check scan it and a candidate can be confirmed;
//! - the **hash index proper** in RAM within a budget (`index.rs`): advice
//!   only, 16 bytes a fingerprint while small (`exact.rs`), then 4
//!   (`compact.rs`, naming the chunk's group), sampled when the budget is
//!   reached, refilled by prefetching the records of chunks written around
//!   a hit, rebuilt from the records at open. A fingerprint the index misses costs a second copy of the chunk,
//!   never wrong data.
//!
//! Open reads the root and the summary blocks ever written (not the
//! tables), then the records of the blocks in use to refill the index: its
//! time and RAM follow the data stored, not the device size.

mod compact;
mod exact;
pub mod geometry;
pub mod index;
mod paged;
mod salvage;
mod upkeep;

use std::collections::{BTreeSet, HashSet};
use std::ops::Range;
use std::sync::Arc;

use crate::backend::{BackendUsage, IndexFigures, MetadataBackend, ScanCursor, Upkeep};
use crate::backends::counts;
use crate::backends::disktable::geometry::{BLOCK, HEADER};
use crate::backends::disktable::tables::Journaled;
use crate::backends::kv::store::StoreState;
use crate::backends::{BackendParams, OpenOptions, Opened};
use crate::blockfile::BlockFile;
use crate::codec::{Decoder, Encoder};
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::superblock::Superblock;

use geometry::{Geometry, RECORDS_PER_BLOCK, RECORD_BYTES, REFS_PER_BLOCK};
use index::{Grouping, Hint, SampledIndex, GROUP_BLOCKS};
use paged::PagedCounts;

/// The smallest budget the store accepts: a table of a few entries, for
/// tests that make the index sample (the commands ask for 64 KiB or more).
pub const MIN_INDEX_MEMORY: u64 = 64;
/// Records an open without a checkpoint reads into the index before it
/// returns (4 GiB of unique 4 KiB chunks, about a second); the rest are
/// read in the background.
const OPEN_WARM_RECORDS: usize = 1 << 20;

/// Where the sparse store's fields start in the superblock backend area.
const AREA_OFFSET: usize = 64;
/// The sparse layout; a device of another layout is refused.
const LAYOUT: u32 = 1;
const WHAT: &str = "sparse layout (superblock backend area)";
const COUNTS: &str = "sparse refcount array";
/// The second checkpoint format (exact or compact table); the first
/// (`DDUPIXCK`, exact only) is not loaded, the index is rebuilt instead.
const CHECKPOINT_MAGIC: &[u8; 8] = b"DDUPIXC2";

/// What to do about damage `check --repair` fixes.
const REPAIR: &str = "`dedup check --repair DIR` (device stopped) reports and fixes this";

/// Damage `check --repair` fixes, found at open: refused, or, opened for
/// check, logged (the caller goes on, for check to report it).
fn damage(table: &str, detail: String, for_check: bool) -> Result<()> {
    if !for_check {
        return Err(Error::corrupt(table, format!("{detail}; {REPAIR}")));
    }
    tracing::warn!("{table}: {detail}");
    Ok(())
}

fn check_index_memory(index_memory: u64) -> Result<()> {
    if index_memory < MIN_INDEX_MEMORY {
        return Err(Error::InvalidArgument(format!(
            "the hash index's memory must be at least {MIN_INDEX_MEMORY} bytes, not {index_memory} (e.g. --index-memory 256M)"
        )));
    }
    Ok(())
}

/// How the index groups a device's chunks for prefetch.
fn grouping(cfg: &DeviceConfig) -> Grouping {
    Grouping::new(cfg.packs().then(|| cfg.addressing()), cfg.physical_chunks)
}

pub fn metadata_device_len(cfg: &DeviceConfig) -> u64 {
    Geometry::new(cfg).device_len()
}

/// What a sparse device will cost, told at create time.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Sizing {
    /// Metadata bytes on disk per stored chunk (LBN entry, count, record).
    pub metadata_bytes_per_chunk: u64,
    /// Metadata on disk per TiB of unique data stored.
    pub metadata_bytes_per_tib: u64,
    /// RAM: the buffer cache, the index budget and the summaries.
    pub ram_cache_bytes: u64,
    /// The index's memory (`--index-memory`); `ram_index_bytes` in JSON.
    #[serde(rename = "ram_index_bytes")]
    pub index_memory: u64,
    /// RAM for the summaries once the whole data space is used; they are
    /// paged (`paged.rs`), so they take `ram_summary_bytes_per_tib` per
    /// TiB of unique data stored.
    pub ram_summary_bytes: u64,
    pub ram_summary_bytes_per_tib: u64,
    /// Unique data the index holds every fingerprint of; beyond it, it
    /// samples 1 in 2, 4, ...
    pub full_index_bytes: u64,
    /// Guo's Eq. 2: the share of duplicates still found at 1/8 and 1/32 of
    /// the full index's memory, with prefetch groups of `GROUP_BLOCKS`
    /// blocks, for copies in the order first written only (prefetch finds
    /// a hit's neighbours; shuffled copies find about half at 1/16).
    pub efficiency_at_eighth: f64,
    pub efficiency_at_thirty_second: f64,
}

/// Guo & Efstathopoulos Eq. 2: with a sampling period `t` and prefetch
/// units of `t_min` chunks, a stream of duplicates misses about `t - 1`
/// chunks per unit, so the share found is `1 - (t - 1) / t_min`.
pub fn predicted_efficiency(t: f64) -> f64 {
    (1.0 - (t - 1.0) / GROUP_BLOCKS as f64).max(0.0)
}

/// Duplicates a sampled index missed. The sample is by fingerprint value
/// (a random subset of the data whatever its order) and the table holds
/// every sampled fingerprint, so each hit on one stands for a sampling
/// period's worth of duplicates among all lookups (`note_lookup`); that
/// many, less those found, were stored again. (Scaling the hits by Eq. 2,
/// as before, assumed copies in the order first written: on shuffled
/// copies it said 1,404 where 102,144 were missed.)
fn missed_estimate(s: &IndexFigures) -> u64 {
    s.duplicates_seen
        .saturating_sub(s.table_hits + s.prefetch_hits)
}

pub fn sizing(cfg: &DeviceConfig, params: &BackendParams) -> Sizing {
    let per_chunk = 8 + 4 + RECORD_BYTES as u64;
    let chunks_per_tib = (1u64 << 40) / cfg.chunk_size as u64;
    let geo = Geometry::new(cfg);
    Sizing {
        metadata_bytes_per_chunk: per_chunk,
        metadata_bytes_per_tib: per_chunk * chunks_per_tib,
        ram_cache_bytes: params.cache_bytes,
        index_memory: params.index_memory,
        ram_summary_bytes: geo.ref_blocks * 4 + geo.lbn_blocks * 2,
        // A stored chunk takes its share of the PBN space (a packed block
        // has 16 addresses) and of the LBN map.
        ram_summary_bytes_per_tib: chunks_per_tib
            * 4
            * geo.pbn_space.div_ceil(cfg.physical_chunks.max(1))
            / REFS_PER_BLOCK
            + chunks_per_tib * 2 / geometry::LBNS_PER_BLOCK,
        full_index_bytes: SampledIndex::full_capacity(params.index_memory, grouping(cfg))
            * cfg.chunk_size as u64,
        efficiency_at_eighth: predicted_efficiency(8.0),
        efficiency_at_thirty_second: predicted_efficiency(32.0),
    }
}

/// Bytes a metadata file may have allocated and still count as new (its
/// superblock, written by no one yet, and filesystem slack).
const FRESH_BYTES: u64 = 64 << 10;

fn encode_area(params: &BackendParams, geo: &Geometry) -> Vec<u8> {
    let mut e = Encoder::default();
    e.bytes(&params.encode())
        .pad_to(AREA_OFFSET)
        .u32(LAYOUT)
        .u64(geo.journal_blocks)
        .u64(params.index_memory);
    e.buf
}

fn decode_area(area: &[u8], cfg: &DeviceConfig) -> Result<(BackendParams, Geometry)> {
    let mut params = BackendParams::decode(area)?;
    let mut d = Decoder::new(&area[AREA_OFFSET..], WHAT);
    let layout = d.u32()?;
    if layout != LAYOUT {
        return Err(Error::corrupt(
            WHAT,
            format!("layout {layout} but this dedup reads layout {LAYOUT}"),
        ));
    }
    let journal_blocks = d.u64()?;
    let index_memory = d.u64()?;
    let geo = Geometry::new(cfg);
    if journal_blocks != geo.journal_blocks {
        return Err(Error::corrupt(
            WHAT,
            format!(
                "journal of {journal_blocks} blocks, expected {}",
                geo.journal_blocks
            ),
        ));
    }
    if index_memory < MIN_INDEX_MEMORY {
        return Err(Error::corrupt(
            WHAT,
            format!("index memory {index_memory} is below the minimum {MIN_INDEX_MEMORY}"),
        ));
    }
    params.index_memory = index_memory;
    Ok((params, geo))
}

/// The parameters recorded at create time (index memory included).
pub fn recorded_params(sb: &Superblock) -> Result<BackendParams> {
    decode_area(&sb.backend_area, &sb.config).map(|(params, _)| params)
}

/// Make a new sparse store: a superblock. The tables of a new sparse file
/// are holes, which read as empty; any other file or device is zeroed over
/// the whole range first.
pub fn format(cfg: &DeviceConfig, meta: &dyn BlockFile, params: &BackendParams) -> Result<()> {
    check_index_memory(params.index_memory)?;
    let geo = Geometry::new(cfg);
    // The tables must read as empty. A new sparse file does (holes), and
    // is not read through; anything else that may hold old contents (a
    // reused file, a block device, a device of unknown allocation) is
    // zeroed, since an old table block with a valid checksum would
    // otherwise be taken for this device's.
    let fresh = meta.allocated()?.is_some_and(|a| a <= FRESH_BYTES);
    let start = geo.area().journal_start;
    if fresh {
        crate::backends::disktable::zero_range(meta, start, start + BLOCK as u64)?;
    } else {
        crate::backends::disktable::zero_range(meta, start, geo.device_len())?;
    }
    let mut sb = Superblock::new(cfg.clone());
    sb.backend_area = encode_area(params, &geo);
    sb.write(meta)
}

pub struct Sparse {
    geo: Geometry,
    t: Journaled,
    index: SampledIndex,
    /// Per refcount block: PBNs in use (count > 0), and PBNs with a chunk
    /// record (scans of the records skip ranges with none; a record may
    /// outlive its count for a moment, as when a repack moves counts
    /// before index entries).
    summary: PagedCounts,
    recorded: PagedCounts,
    /// Per LBN-map block: LBNs mapped (scans skip blocks with none).
    mapped: PagedCounts,
    /// PBNs with a count > 0.
    used: u64,
    /// Chunk records (indexed chunks).
    records: u64,
    cursor: Pbn,
    /// PBNs freed in the open transaction: not reused before the commit.
    quarantine: HashSet<Pbn>,
    private: Vec<u64>,
    /// Bytes the metadata file occupies, as of the last commit.
    allocated: u64,
    /// The next PBN whose record the background rebuild reads into the
    /// index (`None`: the index is whole), and the records read so far.
    warm_from: Option<Pbn>,
    warmed: u64,
}

pub fn open(
    superblock: Superblock,
    meta: Box<dyn BlockFile>,
    opts: &OpenOptions,
) -> Result<Opened> {
    let backend = Sparse::open(superblock, meta, opts)?;
    Ok(Opened {
        rolled_back: backend.t.kept_stale,
        backend: Box::new(backend),
    })
}

fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn cursor_at(cursor: &ScanCursor) -> Result<u64> {
    match cursor.0.len() {
        0 => Ok(0),
        8 => Ok(read_u64(&cursor.0, 0)),
        _ => Err(Error::InvalidArgument("not a sparse scan cursor".into())),
    }
}

impl Sparse {
    fn open(
        superblock: Superblock,
        meta: Box<dyn BlockFile>,
        opts: &OpenOptions,
    ) -> Result<Sparse> {
        let cfg = superblock.config.clone();
        let (params, geo) = decode_area(&superblock.backend_area, &cfg)?;
        let file: Arc<dyn BlockFile> = Arc::from(meta);
        let have = Journaled::check_len(file.as_ref(), geo.device_len())?;
        let cache_bytes = opts.cache_bytes.unwrap_or(params.cache_bytes);
        let index_memory = opts.index_memory.unwrap_or(params.index_memory);
        check_index_memory(index_memory)?;
        if opts.index_cache.is_some_and(|c| c >= index_memory) {
            return Err(Error::InvalidArgument(format!(
                "the index's prefetch cache ({} bytes) must be smaller than its memory ({index_memory} bytes)",
                opts.index_cache.unwrap_or(0)
            )));
        }
        let (t, state) =
            Journaled::open(superblock, file, geo.area(), cache_bytes, opts, "sparse")?;
        let mut s = Sparse {
            geo,
            t,
            index: match opts.index_cache {
                Some(cache) => SampledIndex::with_cache(index_memory, cache, grouping(&cfg)),
                None => SampledIndex::new(index_memory, grouping(&cfg)),
            },
            summary: PagedCounts::default(),
            recorded: PagedCounts::default(),
            mapped: PagedCounts::default(),
            used: 0,
            records: 0,
            cursor: state.alloc_cursor.min(geo.pbn_space.saturating_sub(1)),
            quarantine: HashSet::new(),
            private: state.counters.clone(),
            allocated: 0,
            warm_from: None,
            warmed: 0,
        };
        let odd_refs = s.load_summary(opts.for_check)?;
        let odd_lbns = s.load_lbn_summary(opts.for_check)?;
        if opts.writable && !opts.for_check {
            // Every write may allocate or count a chunk in any refcount
            // block; one that fails its checksum would fail a write that
            // write-back has already acknowledged. 4 bytes a chunk ever
            // stored, read in long runs.
            s.t.verify_blocks(s.geo.ref_table_blocks())?;
        }
        if opts.for_check {
            s.salvage(odd_refs, odd_lbns)?;
        }
        s.agree("PBNs hold data", s.used, state.pbns_used, opts.for_check)?;
        s.agree(
            "record counts in the summary",
            s.records,
            state.hash_entries,
            opts.for_check,
        )?;
        if !s.load_checkpoint()? {
            if opts.for_check {
                s.refill_index(&state, opts.for_check)?;
            } else {
                // Rebuild from the records: the first ones now, the rest in
                // the background (`warm_index`), so open time does not grow
                // with the data stored.
                s.warm_from = Some(0);
                s.warm_index(opts.open_warm_records.unwrap_or(OPEN_WARM_RECORDS))?;
            }
        }
        s.allocated = s.t.file.allocated()?.unwrap_or(have);
        s.t.mark_open()?;
        Ok(s)
    }

    /// Read the summary into RAM (the root's counts of PBNs in use and of
    /// records are checked against it once it is whole). An entry larger
    /// than its block is refused, or, opened for check, returned among the
    /// refcount blocks whose entries `salvage` recounts.
    fn load_summary(&mut self, for_check: bool) -> Result<BTreeSet<u64>> {
        let (mut used, mut records) = (0u64, 0u64);
        let mut odd = BTreeSet::new();
        let geo = self.geo;
        let first = geo.summary_table_blocks().start;
        let written = self.written_blocks(geo.summary_table_blocks())?;
        let blocks = written.into_iter().flatten();
        for r in blocks.flat_map(|b| geo.ref_blocks_of_summary(b - first)) {
            let (b, off) = self.geo.summary(r);
            let n = self.t.u16_at((b, off))?;
            let k = self.t.u16_at((b, off + 2))?;
            let room = self.pbns_in_ref_block(r);
            if u64::from(n) > room || u64::from(k) > room {
                damage(
                    "sparse refcount summary",
                    format!(
                        "refcount block {r} counts {n} PBNs in use and {k} records, more than its {room} PBNs"
                    ),
                    for_check,
                )?;
                odd.insert(r);
                continue;
            }
            self.summary.set(r, n);
            self.recorded.set(r, k);
            used += u64::from(n);
            records += u64::from(k);
        }
        self.used = used;
        self.records = records;
        Ok(odd)
    }

    /// As `load_summary`, for the LBN summary.
    fn load_lbn_summary(&mut self, for_check: bool) -> Result<BTreeSet<u64>> {
        let mut odd = BTreeSet::new();
        let geo = self.geo;
        let first = geo.lbn_summary_table_blocks().start;
        let written = self.written_blocks(geo.lbn_summary_table_blocks())?;
        let blocks = written.into_iter().flatten();
        for i in blocks.flat_map(|b| geo.lbn_blocks_of_summary(b - first)) {
            let n = self.t.u16_at(self.geo.lbn_summary(i))?;
            let room = self.geo.lbns_of_block(i).count() as u64;
            if u64::from(n) > room {
                damage(
                    "sparse LBN summary",
                    format!("LBN-map block {i} counts {n} mapped LBNs, more than its {room}"),
                    for_check,
                )?;
                odd.insert(i);
                continue;
            }
            self.mapped.set(i, n);
        }
        Ok(odd)
    }

    /// The runs of `blocks` the metadata file says were ever written (a
    /// sparse file's holes read as zeros: empty summaries), all of them
    /// where it cannot tell (a block device).
    fn written_blocks(&self, blocks: Range<u64>) -> Result<Vec<Range<u64>>> {
        Ok((self.t.written_runs(blocks.clone())?).unwrap_or_else(|| vec![blocks]))
    }

    /// One more (`true`) or one fewer mapped LBN in `lbn`'s map block.
    fn note_mapped(&mut self, lbn: Lbn, more: bool) -> Result<()> {
        let i = lbn / geometry::LBNS_PER_BLOCK;
        let n = match more {
            true => self.mapped.get(i) + 1,
            false => self.mapped.get(i) - 1,
        };
        self.mapped.set(i, n);
        let at = self.geo.lbn_summary(i);
        self.t.set_u16(at, n)
    }

    /// Rebuild the RAM index from the chunk records (of the ranges the
    /// summary says hold some), counting them.
    fn refill_index(&mut self, state: &StoreState, for_check: bool) -> Result<()> {
        let mut cursor = Some(ScanCursor::start());
        let mut page = Vec::new();
        let mut found = 0u64;
        while let Some(c) = cursor.take() {
            page.clear();
            cursor = self.scan_records(&c, 1 << 16, &mut page)?;
            for (fp, pbn) in &page {
                self.index.insert(fp.prefix_u64(), *pbn);
            }
            found += page.len() as u64;
        }
        self.records = found;
        self.agree("chunks have records", found, state.hash_entries, for_check)
    }

    fn agree(&self, what: &str, found: u64, recorded: u64, for_check: bool) -> Result<()> {
        if found == recorded {
            return Ok(());
        }
        damage(
            "sparse tables",
            format!("{found} {what} but the last commit recorded {recorded}"),
            for_check,
        )
    }

    fn pbns_in_ref_block(&self, r: u64) -> u64 {
        (self.geo.pbn_space - r * REFS_PER_BLOCK).min(REFS_PER_BLOCK)
    }

    fn check_lbn(&self, lbn: Lbn) -> Result<()> {
        counts::lbn_index(lbn, self.geo.logical_chunks).map(|_| ())
    }

    fn check_pbn(&self, pbn: Pbn) -> Result<()> {
        counts::pbn_index(COUNTS, pbn, self.geo.pbn_space).map(|_| ())
    }

    fn set_refcount(&mut self, pbn: Pbn, count: u32) -> Result<()> {
        let at = self.geo.refcount(pbn);
        self.t.set_u32(at, count)
    }

    /// A PBN went from free to used (`+1`) or back (`-1`): the summary and
    /// the totals follow, and a freed PBN waits for the commit.
    fn note_use(&mut self, pbn: Pbn, in_use: bool) -> Result<()> {
        let r = pbn / REFS_PER_BLOCK;
        if in_use {
            self.summary.set(r, self.summary.get(r) + 1);
            self.used += 1;
            self.quarantine.remove(&pbn);
        } else {
            self.summary.set(r, self.summary.get(r) - 1);
            self.used -= 1;
            self.quarantine.insert(pbn);
        }
        self.write_summary(r)
    }

    fn write_summary(&mut self, r: u64) -> Result<()> {
        let (n, k) = (self.summary.get(r), self.recorded.get(r));
        let (b, off) = self.geo.summary(r);
        self.t.set_u16((b, off), n)?;
        self.t.set_u16((b, off + 2), k)
    }

    /// The record stored for `pbn`, if any.
    fn record(&mut self, pbn: Pbn) -> Result<Option<Fingerprint>> {
        let (b, off) = self.geo.record(pbn);
        let block = self.t.cache.get(b)?;
        let at = HEADER + off;
        match block[at] {
            0 => Ok(None),
            1 => {
                let mut fp = [0u8; 32];
                fp.copy_from_slice(&block[at + 1..at + RECORD_BYTES]);
                Ok(Some(Fingerprint(fp)))
            }
            tag => Err(Error::corrupt(
                "sparse chunk records",
                format!("record of PBN {pbn} has tag {tag}; {REPAIR}"),
            )),
        }
    }

    /// Set or clear `pbn`'s record (the caller knows whether one was there).
    fn set_record(&mut self, pbn: Pbn, fp: Option<&Fingerprint>) -> Result<()> {
        let (b, off) = self.geo.record(pbn);
        let block = self.t.cache.get_mut(b)?;
        let slot = &mut block[HEADER + off..HEADER + off + RECORD_BYTES];
        let r = pbn / REFS_PER_BLOCK;
        match fp {
            Some(fp) => {
                slot[0] = 1;
                slot[1..].copy_from_slice(&fp.0);
                self.recorded.set(r, self.recorded.get(r) + 1);
                self.records += 1;
            }
            None => {
                slot.fill(0);
                self.recorded.set(r, self.recorded.get(r) - 1);
                self.records -= 1;
            }
        }
        self.write_summary(r)
    }

    /// Is `pbn` a live chunk whose record is `fp`? (A candidate from the
    /// index is advice until this says yes.)
    fn confirm(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<bool> {
        if pbn >= self.geo.pbn_space {
            return Ok(false);
        }
        Ok(self.record(pbn)?.as_ref() == Some(fp))
    }

    /// Load the records of group `group`'s chunks into the index's
    /// prefetch cache, skipping the ranges the summary says hold none.
    fn prefetch(&mut self, group: u64) -> Result<()> {
        if self.index.has_group(group) {
            return Ok(());
        }
        let mut entries = Vec::new();
        for range in self.index.grouping.ranges(group) {
            let (mut p, end) = (range.start, range.end.min(self.geo.pbn_space));
            while p < end {
                let r = p / REFS_PER_BLOCK;
                if self.recorded.get(r) == 0 {
                    p = ((r + 1) * REFS_PER_BLOCK).min(end);
                    continue;
                }
                let (b, _) = self.geo.record(p);
                let block = self.t.cache.get(b)?;
                let block_end = ((p / RECORDS_PER_BLOCK + 1) * RECORDS_PER_BLOCK)
                    .min((r + 1) * REFS_PER_BLOCK)
                    .min(end);
                for q in p..block_end {
                    let at = HEADER + (q % RECORDS_PER_BLOCK) as usize * RECORD_BYTES;
                    if block[at] == 1 {
                        entries.push((read_u64(block, at + 1), q));
                    }
                }
                p = block_end;
            }
        }
        self.index.prefetched(group, entries);
        Ok(())
    }

    /// The chunk records from `cursor` on (PBN order), skipping the ranges
    /// of refcount blocks the summary says hold no record.
    fn scan_records(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        let mut pbn = cursor_at(cursor)?;
        let mut taken = 0;
        while pbn < self.geo.pbn_space {
            let r = pbn / REFS_PER_BLOCK;
            if self.recorded.get(r) == 0 {
                // The next refcount block with records, if any.
                match self.recorded.next_nonzero(r) {
                    Some(next) => pbn = next * REFS_PER_BLOCK,
                    None => break,
                }
                continue;
            }
            if taken >= max {
                return Ok(Some(ScanCursor(pbn.to_le_bytes().to_vec())));
            }
            if let Some(fp) = self.record(pbn)? {
                out.push((fp, pbn));
                taken += 1;
            }
            pbn += 1;
        }
        Ok(None)
    }

    /// Where the index checkpoint lives: past the tables, in a regular file
    /// only (it grows the file; a block device has no room there).
    fn checkpoint_at(&self) -> Result<Option<u64>> {
        Ok(match self.t.file.capacity()? {
            None => Some(self.geo.device_len().next_multiple_of(BLOCK as u64)),
            Some(_) => None,
        })
    }

    /// After a clean close: save the index, so the next open need not read
    /// every record (Guo §3.2.3). Body first, then the header that names
    /// the commit it belongs to; a crash anywhere leaves a header that does
    /// not match, and the next open rebuilds.
    fn save_checkpoint(&mut self) -> Result<()> {
        let Some(at) = self.checkpoint_at()? else {
            return Ok(());
        };
        let (file, mut hasher, mut len) = (&self.t.file, blake3::Hasher::new(), 0u64);
        self.index.encode_parts(|piece| {
            hasher.update(piece);
            file.write_at(piece, at + BLOCK as u64 + len)?;
            len += piece.len() as u64;
            Ok(())
        })?;
        self.t.file.sync()?;
        let mut e = Encoder::with_capacity(BLOCK);
        e.bytes(CHECKPOINT_MAGIC)
            .u64(self.t.seq())
            .u64(len)
            .bytes(&hasher.finalize().as_bytes()[..16])
            .pad_to(BLOCK);
        let mut header = e.buf;
        crate::codec::seal(&mut header);
        self.t.file.write_at(&header, at)?;
        self.t.file.sync()
    }

    /// Load the index from the checkpoint if it belongs to the last commit
    /// and reads back whole; `false`: rebuild it from the records.
    fn load_checkpoint(&mut self) -> Result<bool> {
        let Some(at) = self.checkpoint_at()? else {
            return Ok(false);
        };
        let file_len = self.t.file.len()?;
        if file_len < at + BLOCK as u64 {
            return Ok(false);
        }
        let mut header = vec![0u8; BLOCK];
        self.t.file.read_at(&mut header, at)?;
        if &header[..8] != CHECKPOINT_MAGIC || !crate::codec::is_sealed(&header) {
            return Ok(false);
        }
        let mut d = Decoder::new(&header[8..], "sparse index checkpoint");
        let (seq, len, digest) = (d.u64()?, d.u64()?, d.bytes(16)?.to_vec());
        if seq != self.t.seq() || len > 2 * self.index.index_memory() + BLOCK as u64 {
            return Ok(false);
        }
        if file_len < at + BLOCK as u64 + len {
            return Ok(false);
        }
        let mut body = vec![0u8; len as usize];
        self.t.file.read_at(&mut body, at + BLOCK as u64)?;
        if blake3::hash(&body).as_bytes()[..16] != digest[..] {
            return Ok(false);
        }
        match self.index.emptied().load(&body) {
            Some(mut ix) => {
                ix.stats.from_checkpoint = true;
                self.index = ix;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The index's answer for `fp`, confirmed against the chunk record.
    fn lookup(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        let key = fp.prefix_u64();
        if let Some(pbn) = self.index.cached(key) {
            if self.confirm(fp, pbn)? {
                self.index.stats.prefetch_hits += 1;
                return Ok(Some(pbn));
            }
            self.index.stats.stale += 1;
            self.index.remove(key, pbn);
        }
        let (hints, n) = self.index.hints(key);
        for hint in &hints[..n] {
            let pbn = match *hint {
                Hint::Pbn(pbn) => Some(pbn),
                // The compact table names the group: load its records,
                // which a hit prefetches anyway, and look there.
                Hint::Group(g) => {
                    self.prefetch(g)?;
                    self.index.cached(key)
                }
            };
            match pbn {
                Some(pbn) if self.confirm(fp, pbn)? => {
                    self.index.stats.table_hits += 1;
                    self.prefetch(self.index.grouping.group(pbn))?;
                    return Ok(Some(pbn));
                }
                Some(pbn) => {
                    self.index.stats.stale += 1;
                    self.index.remove(key, pbn);
                }
                // A tag that matched by chance, or a chunk since moved.
                None => self.index.stats.stale += 1,
            }
        }
        self.index.stats.misses += 1;
        Ok(None)
    }

    /// The state record to commit now.
    fn state(&self) -> StoreState {
        StoreState {
            lbns_mapped: 0,
            pbns_used: self.used,
            hash_entries: self.records,
            alloc_cursor: self.cursor,
            counters: self.private.clone(),
        }
    }
}

impl MetadataBackend for Sparse {
    fn lbn_map_lookup(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        self.check_lbn(lbn)?;
        let at = self.geo.lbn(lbn);
        self.t
            .mapping_at(at, lbn, self.geo.pbn_space, "sparse LBN map")
    }

    fn lbn_map_insert(&mut self, lbn: Lbn, pbn: Pbn) -> Result<Option<Pbn>> {
        self.check_pbn(pbn)?;
        let old = self.lbn_map_lookup(lbn)?;
        let at = self.geo.lbn(lbn);
        self.t.set_u64(at, pbn + 1)?;
        if old.is_none() {
            self.note_mapped(lbn, true)?;
        }
        Ok(old)
    }

    fn lbn_map_delete(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        let old = self.lbn_map_lookup(lbn)?;
        if old.is_some() {
            let at = self.geo.lbn(lbn);
            self.t.set_u64(at, 0)?;
            self.note_mapped(lbn, false)?;
        }
        Ok(old)
    }

    fn lbn_map_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Lbn, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        let mut lbn = cursor_at(cursor)?;
        let mut taken = 0;
        while lbn < self.geo.logical_chunks {
            let i = lbn / geometry::LBNS_PER_BLOCK;
            if self.mapped.get(i) == 0 {
                // The next LBN-map block that maps any, if any.
                match self.mapped.next_nonzero(i) {
                    Some(next) => lbn = next * geometry::LBNS_PER_BLOCK,
                    None => break,
                }
                continue;
            }
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

    fn hash_index_lookup(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        let found = self.lookup(fp)?;
        self.index.note_lookup(fp.prefix_u64(), found.is_some());
        Ok(found)
    }

    fn hash_index_insert(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<()> {
        self.check_pbn(pbn)?;
        if self.record(pbn)?.is_some() {
            return Err(Error::corrupt(
                "sparse chunk records",
                format!("PBN {pbn} already has a record when it is indexed again"),
            ));
        }
        self.set_record(pbn, Some(fp))?;
        self.index.insert(fp.prefix_u64(), pbn);
        Ok(())
    }

    fn hash_index_delete(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<bool> {
        if pbn >= self.geo.pbn_space || self.record(pbn)?.as_ref() != Some(fp) {
            return Ok(false);
        }
        self.set_record(pbn, None)?;
        self.index.remove(fp.prefix_u64(), pbn);
        Ok(true)
    }

    fn hash_index_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        self.scan_records(cursor, max, out)
    }

    fn alloc_pbn(&mut self) -> Result<Option<Pbn>> {
        let total = self.geo.pbn_space;
        if self.used + self.quarantine.len() as u64 >= total {
            return Ok(None);
        }
        // Dmdedup §2.6.1: sequentially from the last allocation; the
        // summary skips refcount blocks with no free PBN.
        let mut pbn = self.cursor % total;
        for _ in 0..=self.geo.ref_blocks {
            let r = pbn / REFS_PER_BLOCK;
            let end = ((r + 1) * REFS_PER_BLOCK).min(total);
            if u64::from(self.summary.get(r)) < end - r * REFS_PER_BLOCK {
                let (b, _) = self.geo.refcount(pbn);
                let block = self.t.cache.get(b)?;
                let free = (pbn..end).find(|&p| {
                    read_u32(block, HEADER + (p % REFS_PER_BLOCK) as usize * 4) == 0
                        && !self.quarantine.contains(&p)
                });
                if let Some(p) = free {
                    self.set_refcount(p, 1)?;
                    self.note_use(p, true)?;
                    self.cursor = p + 1;
                    return Ok(Some(p));
                }
            }
            pbn = if end >= total { 0 } else { end };
        }
        Err(Error::corrupt(
            "sparse refcount summary",
            format!(
                "{} PBNs in use of {total}, but no free one was found; {REPAIR}",
                self.used
            ),
        ))
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
            self.note_use(pbn, false)?;
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
        self.set_refcount(pbn, count)?;
        match (c, count) {
            (0, n) if n > 0 => self.note_use(pbn, true),
            (n, 0) if n > 0 => self.note_use(pbn, false),
            _ => Ok(()),
        }
    }

    fn commit(&mut self, private: &[u64]) -> Result<()> {
        self.commit_with(private, None, &mut || Ok(()))
    }

    fn wants_commit(&self) -> bool {
        self.t.wants_commit()
    }

    fn close(&mut self, private: &[u64]) -> Result<()> {
        let writable = self.t.is_writable();
        self.private = private.to_vec();
        self.t.close(&self.state())?;
        self.quarantine.clear();
        // A partial index is not saved: the next open would take it for
        // whole. Without a checkpoint it rebuilds again.
        if writable && self.warm_from.is_none() {
            // The store is saved and clean: a full host filesystem costs
            // the checkpoint at most (its header is written last, so a
            // partial one is never loaded; the next open rebuilds).
            let saved = match self.save_checkpoint() {
                Err(e) if e.errno() == libc::ENOSPC && self.t.release_reserve()? > 0 => {
                    self.save_checkpoint()
                }
                r => r,
            };
            match saved {
                Err(e) if e.errno() == libc::ENOSPC => tracing::warn!(
                    "sparse: the index checkpoint was not saved ({e}); the metadata is, and the next start rebuilds the index from the chunk records"
                ),
                r => r?,
            }
        }
        Ok(())
    }

    fn private_data(&self) -> &[u64] {
        &self.private
    }

    fn usage(&self) -> BackendUsage {
        BackendUsage {
            pbns_used: self.used,
            pbns_free: self.geo.pbn_space - self.used - self.quarantine.len() as u64,
            metadata_bytes: self.allocated + self.index.bytes(),
            io: self.t.cache.io,
            index: Some(IndexFigures {
                bytes: self.index.bytes(),
                missed_estimate: missed_estimate(&self.index.stats),
                records_to_warm: match self.warm_from {
                    // At least 1 while unfinished: records written since
                    // open may be read again, so the count is an estimate.
                    Some(_) => self.records.saturating_sub(self.warmed).max(1),
                    None => 0,
                },
                ..self.index.stats
            }),
        }
    }
}

#[cfg(test)]
mod tests;
