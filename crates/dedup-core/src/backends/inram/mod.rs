//! INRAM backend (Dmdedup §2.6.1): all metadata in RAM, no metadata I/O while
//! serving. A linear-probing hash table for the hash index, an array for the
//! LBN map, an integer array of reference counts that is also the allocation
//! map. Saved to the metadata device at a clean stop and loaded at open.
//!
//! Not crash-safe: the superblock is marked open while serving, so an unclean
//! stop is detected and refused at the next open unless the caller accepts a
//! roll-back to the last save (which the engine then verifies chunk by chunk).
//! This is also the skeleton to copy for a new backend.

mod hash_table;
mod persist;

use std::path::PathBuf;

use crate::backend::{BackendUsage, MetaIoStats, MetadataBackend, ScanCursor, Upkeep};
use crate::backends::{counts, OpenOptions, Opened};
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::superblock::{DeviceState, Superblock};
use crate::zeroed::zeroed_vec;

use hash_table::LinearProbeTable;
use persist::{read_section, SaveTable, Section, SectionWriter, HASH_ENTRY_BYTES, MAX_COUNTERS};

pub use persist::metadata_device_len;

pub const NAME: &str = "inram";
const COUNTS: &str = "inram refcount array";

pub struct InRam {
    cfg: DeviceConfig,
    meta: Box<dyn BlockFile>,
    superblock: Superblock,
    table: SaveTable,
    writable: bool,
    /// PBN + 1 per LBN; 0 = unmapped (so a new map is untouched zero pages).
    lbn_map: Vec<u64>,
    refcounts: Vec<u32>,
    hash_index: LinearProbeTable,
    next_alloc: Pbn,
    pbns_used: u64,
    /// The engine's private record, saved with the tables.
    private: Vec<u64>,
    io: MetaIoStats,
}

/// Lay out a new, empty INRAM metadata device.
pub fn format(cfg: &DeviceConfig, meta: &dyn BlockFile) -> Result<()> {
    let mut sb = Superblock::new(cfg.clone());
    sb.backend_area = SaveTable::default().encode();
    sb.write(meta)
}

pub fn open(
    superblock: Superblock,
    meta: Box<dyn BlockFile>,
    opts: &OpenOptions,
) -> Result<Opened> {
    let cfg = superblock.config.clone();
    let unclean = superblock.state == DeviceState::Open;
    if unclean && !opts.accept_unclean {
        return Err(Error::Unclean {
            path: PathBuf::from(meta.describe()),
            backend: NAME.into(),
        });
    }
    let need = metadata_device_len(&cfg);
    let have = meta.len()?;
    if have < need {
        return Err(Error::foreign(
            &PathBuf::from(meta.describe()),
            format!(
                "metadata device is {have} bytes but this device needs {need}; was it truncated?"
            ),
        ));
    }
    let table = SaveTable::decode(&superblock.backend_area, &cfg)?;
    let mut backend = InRam {
        lbn_map: zeroed_vec(cfg.logical_chunks() as usize, "the inram LBN map")?,
        refcounts: zeroed_vec(cfg.pbn_space() as usize, "the inram refcount array")?,
        hash_index: LinearProbeTable::with_max_entries(cfg.max_chunks())?,
        cfg,
        meta,
        superblock,
        table,
        writable: opts.writable,
        next_alloc: 0,
        pbns_used: 0,
        private: Vec::new(),
        io: MetaIoStats::default(),
    };
    backend.load()?;
    backend.verify_refcounts()?;
    if backend.writable {
        // From here until a clean close, the saved tables are stale.
        backend.superblock.state = DeviceState::Open;
        backend.superblock.write(backend.meta.as_ref())?;
        backend.io.writes += 1;
        backend.io.syncs += 1;
        backend.io.bytes_written += crate::superblock::SUPERBLOCK_SIZE as u64;
    }
    Ok(Opened {
        backend: Box::new(backend),
        rolled_back: unclean,
    })
}

impl InRam {
    /// Addresses the refcount array covers (`DeviceConfig::pbn_space`,
    /// which looks the backend up by name: too slow for every write).
    fn pbn_space(&self) -> u64 {
        self.refcounts.len() as u64
    }

    fn load(&mut self) -> Result<()> {
        let nr_pbns = self.cfg.pbn_space();
        let (cfg, table, meta) = (&self.cfg, &self.table, self.meta.as_ref());
        let lbn_map = &mut self.lbn_map;
        let mut bytes = read_section(meta, cfg, table, Section::LbnMap, |lbn, item| {
            let v = u64::from_le_bytes(item.try_into().expect("8-byte item"));
            if v > nr_pbns {
                return Err(Error::corrupt(
                    Section::LbnMap.name(),
                    format!(
                        "LBN {lbn} maps to PBN {} beyond the data device ({nr_pbns} chunks)",
                        v - 1
                    ),
                ));
            }
            lbn_map[lbn as usize] = v;
            Ok(())
        })?;
        let refcounts = &mut self.refcounts;
        bytes += read_section(meta, cfg, table, Section::Refcounts, |pbn, item| {
            refcounts[pbn as usize] = u32::from_le_bytes(item.try_into().expect("4-byte item"));
            Ok(())
        })?;
        let hash_index = &mut self.hash_index;
        bytes += read_section(meta, cfg, table, Section::HashEntries, |i, item| {
            let mut fp = [0u8; 32];
            fp.copy_from_slice(&item[..32]);
            let pbn = u64::from_le_bytes(item[32..40].try_into().expect("8-byte field"));
            let name = Section::HashEntries.name();
            if pbn >= nr_pbns {
                return Err(Error::corrupt(
                    name,
                    format!("entry {i} names PBN {pbn} beyond the data device"),
                ));
            }
            let fp = Fingerprint(fp);
            if hash_index.lookup(&fp)?.is_some() {
                return Err(Error::corrupt(
                    name,
                    format!("entry {i} repeats a fingerprint"),
                ));
            }
            if !hash_index.insert(&fp, pbn)? {
                return Err(Error::corrupt(name, "more entries than the table can hold"));
            }
            Ok(())
        })?;
        let private = &mut self.private;
        bytes += read_section(meta, cfg, table, Section::Counters, |_, item| {
            private.push(u64::from_le_bytes(item.try_into().expect("8-byte item")));
            Ok(())
        })?;
        self.io.reads += 1;
        self.io.bytes_read += bytes;
        self.pbns_used = self.refcounts.iter().filter(|&&c| c != 0).count() as u64;
        Ok(())
    }

    /// Reference counts are derivable from the maps; a saved array that
    /// disagrees means damage, and trusting it could hand a live PBN out again.
    fn verify_refcounts(&mut self) -> Result<()> {
        let mut expected = vec![0u32; self.refcounts.len()];
        for &v in &self.lbn_map {
            if v != 0 {
                expected[(v - 1) as usize] += 1;
            }
        }
        let mut indexed = vec![false; self.refcounts.len()];
        let mut page = Vec::new();
        let mut cursor = Some(0);
        while let Some(c) = cursor {
            page.clear();
            cursor = self.hash_index.scan(c, 1 << 16, &mut page)?;
            for &(_, pbn) in &page {
                if std::mem::replace(&mut indexed[pbn as usize], true) {
                    return Err(Error::corrupt(
                        Section::HashEntries.name(),
                        format!("PBN {pbn} is indexed under two fingerprints"),
                    ));
                }
                expected[pbn as usize] += 1;
            }
        }
        if let Some(pbn) = (0..expected.len()).find(|&p| expected[p] != self.refcounts[p]) {
            return Err(Error::corrupt(
                Section::Refcounts.name(),
                format!(
                    "PBN {pbn} has count {} but {} references in the LBN map and hash index",
                    self.refcounts[pbn], expected[pbn]
                ),
            ));
        }
        Ok(())
    }

    fn save(&mut self) -> Result<()> {
        let region = 1 - self.table.active_region;
        let mut table = SaveTable {
            active_region: region,
            ..Default::default()
        };
        // Counts first, so section offsets are known before writing.
        table.items = [
            self.cfg.logical_chunks(),
            self.cfg.pbn_space(),
            self.hash_index.len(),
            self.private.len().min(MAX_COUNTERS as usize) as u64,
        ];
        let meta = self.meta.as_ref();
        let mut bytes = 0;

        let mut w = SectionWriter::new(meta, &self.cfg, &table, region, Section::LbnMap);
        for v in &self.lbn_map {
            w.item(&v.to_le_bytes())?;
        }
        let (_, crc, n) = w.finish()?;
        table.crcs[0] = crc;
        bytes += n;

        let mut w = SectionWriter::new(meta, &self.cfg, &table, region, Section::Refcounts);
        for c in &self.refcounts {
            w.item(&c.to_le_bytes())?;
        }
        let (_, crc, n) = w.finish()?;
        table.crcs[1] = crc;
        bytes += n;

        let mut w = SectionWriter::new(meta, &self.cfg, &table, region, Section::HashEntries);
        let mut entries = Vec::new();
        let mut cursor = Some(0);
        let mut item = [0u8; HASH_ENTRY_BYTES as usize];
        while let Some(c) = cursor {
            entries.clear();
            cursor = self.hash_index.scan(c, 1 << 16, &mut entries)?;
            for (fp, pbn) in &entries {
                item[..32].copy_from_slice(&fp.0);
                item[32..].copy_from_slice(&pbn.to_le_bytes());
                w.item(&item)?;
            }
        }
        let (_, crc, n) = w.finish()?;
        table.crcs[2] = crc;
        bytes += n;

        let mut w = SectionWriter::new(meta, &self.cfg, &table, region, Section::Counters);
        for c in self.private.iter().take(MAX_COUNTERS as usize) {
            w.item(&c.to_le_bytes())?;
        }
        let (_, crc, n) = w.finish()?;
        table.crcs[3] = crc;
        bytes += n;

        // The payload must be durable before the superblock points at it.
        meta.sync()?;
        self.superblock.backend_area = table.encode();
        self.superblock.state = DeviceState::Clean;
        self.superblock.write(meta)?;
        self.table = table;
        self.io.writes += 2;
        self.io.syncs += 2;
        self.io.bytes_written += bytes + crate::superblock::SUPERBLOCK_SIZE as u64;
        Ok(())
    }

    fn check_lbn(&self, lbn: Lbn) -> Result<usize> {
        counts::lbn_index(lbn, self.cfg.logical_chunks())
    }

    fn check_pbn(&self, pbn: Pbn) -> Result<usize> {
        counts::pbn_index(COUNTS, pbn, self.pbn_space())
    }
}

fn cursor_position(cursor: &ScanCursor) -> Result<u64> {
    match cursor.0.len() {
        0 => Ok(0),
        8 => Ok(u64::from_le_bytes(
            cursor.0[..].try_into().expect("8 bytes"),
        )),
        _ => Err(Error::InvalidArgument("not an inram scan cursor".into())),
    }
}

fn next_cursor(position: Option<u64>) -> Option<ScanCursor> {
    position.map(|p| ScanCursor(p.to_le_bytes().to_vec()))
}

impl MetadataBackend for InRam {
    fn lbn_map_lookup(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        let i = self.check_lbn(lbn)?;
        Ok(self.lbn_map[i].checked_sub(1))
    }

    fn lbn_map_insert(&mut self, lbn: Lbn, pbn: Pbn) -> Result<Option<Pbn>> {
        let i = self.check_lbn(lbn)?;
        self.check_pbn(pbn)?;
        Ok(std::mem::replace(&mut self.lbn_map[i], pbn + 1).checked_sub(1))
    }

    fn lbn_map_delete(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        let i = self.check_lbn(lbn)?;
        Ok(std::mem::take(&mut self.lbn_map[i]).checked_sub(1))
    }

    fn hash_index_lookup(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        self.hash_index.lookup(fp)
    }

    fn hash_index_insert(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<()> {
        self.check_pbn(pbn)?;
        if let Some(existing) = self.hash_index.lookup(fp)? {
            return Err(Error::corrupt(
                "inram hash index",
                format!(
                    "fingerprint already indexed at PBN {existing}, cannot also index PBN {pbn}"
                ),
            ));
        }
        if self.hash_index.insert(fp, pbn)? {
            Ok(())
        } else {
            Err(Error::corrupt(
                "inram hash index",
                "table full: more fingerprints than data chunks, so reference counts are wrong",
            ))
        }
    }

    fn hash_index_delete(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<bool> {
        if self.hash_index_lookup(fp)? != Some(pbn) {
            return Ok(false);
        }
        Ok(self.hash_index.delete(fp)?.is_some())
    }

    fn alloc_pbn(&mut self) -> Result<Option<Pbn>> {
        let total = self.pbn_space();
        if self.pbns_used >= total {
            return Ok(None);
        }
        // Dmdedup §2.6.1: sequential search of the refcount array from the
        // last allocation, which turns random LBN writes into sequential PBNs.
        let mut pbn = self.next_alloc;
        for _ in 0..total {
            if pbn >= total {
                pbn = 0;
            }
            if self.refcounts[pbn as usize] == 0 {
                self.refcounts[pbn as usize] = 1;
                self.pbns_used += 1;
                self.next_alloc = pbn + 1;
                return Ok(Some(pbn));
            }
            pbn += 1;
        }
        Err(Error::corrupt(
            COUNTS,
            "usage count says a PBN is free but none is",
        ))
    }

    fn refcount_inc(&mut self, pbn: Pbn) -> Result<u32> {
        let i = self.check_pbn(pbn)?;
        let c = counts::incremented(COUNTS, pbn, self.refcounts[i])?;
        self.refcounts[i] = c;
        Ok(c)
    }

    fn refcount_dec(&mut self, pbn: Pbn) -> Result<u32> {
        let i = self.check_pbn(pbn)?;
        let c = counts::decremented(COUNTS, pbn, self.refcounts[i])?;
        self.refcounts[i] = c;
        if c == 0 {
            self.pbns_used -= 1;
        }
        Ok(c)
    }

    fn refcount_get(&mut self, pbn: Pbn) -> Result<u32> {
        let i = self.check_pbn(pbn)?;
        Ok(self.refcounts[i])
    }

    fn refcount_set(&mut self, pbn: Pbn, count: u32) -> Result<()> {
        let i = self.check_pbn(pbn)?;
        match (self.refcounts[i], count) {
            (0, c) if c > 0 => self.pbns_used += 1,
            (c, 0) if c > 0 => self.pbns_used -= 1,
            _ => {}
        }
        self.refcounts[i] = count;
        Ok(())
    }

    fn hash_index_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        let from = cursor_position(cursor)?;
        Ok(next_cursor(self.hash_index.scan(from, max, out)?))
    }

    fn lbn_map_scan(
        &mut self,
        cursor: &ScanCursor,
        max: usize,
        out: &mut Vec<(Lbn, Pbn)>,
    ) -> Result<Option<ScanCursor>> {
        let mut lbn = cursor_position(cursor)? as usize;
        let mut taken = 0;
        while lbn < self.lbn_map.len() {
            if taken == max {
                return Ok(next_cursor(Some(lbn as u64)));
            }
            if let Some(pbn) = self.lbn_map[lbn].checked_sub(1) {
                out.push((lbn as u64, pbn));
                taken += 1;
            }
            lbn += 1;
        }
        Ok(None)
    }

    fn commit(&mut self, private: &[u64]) -> Result<()> {
        // Dmdedup §2.6.1: INRAM does no metadata I/O while serving; its
        // metadata only reaches the disk at a clean close.
        self.private = private.to_vec();
        Ok(())
    }

    fn wants_commit(&self) -> bool {
        false
    }

    fn close(&mut self, private: &[u64]) -> Result<()> {
        self.private = private.to_vec();
        if self.writable {
            self.save()?;
            self.writable = false;
        }
        Ok(())
    }

    fn private_data(&self) -> &[u64] {
        &self.private
    }

    fn usage(&self) -> BackendUsage {
        BackendUsage {
            pbns_used: self.pbns_used,
            pbns_free: self.pbn_space() - self.pbns_used,
            metadata_bytes: self.lbn_map.len() as u64 * 8
                + self.refcounts.len() as u64 * 4
                + self.hash_index.bytes(),
            io: self.io,
            index: None,
        }
    }
}

// Nothing beyond the seam.
impl Upkeep for InRam {}
