//! How INRAM saves its tables at a clean stop and loads them at open.
//!
//! The metadata device holds, after the two superblock slots, two payload
//! regions A and B of equal size. A save writes the region the superblock does
//! not point at, syncs, then writes a superblock naming it: a crash during a
//! save leaves the previous save intact. Each section carries a crc32c in the
//! superblock's backend area. Layout details are in FORMATS.md.

use crate::blockfile::BlockFile;
use crate::codec::{Decoder, Encoder};
use crate::config::DeviceConfig;
use crate::error::{Error, Result};
use crate::superblock::SUPERBLOCK_AREA;

const LAYOUT_VERSION: u32 = 1;
/// Upper bound on persisted engine counters (the engine keeps far fewer).
pub const MAX_COUNTERS: u64 = 64;
/// Bytes of one hash index entry on disk: fingerprint + PBN.
pub const HASH_ENTRY_BYTES: u64 = 40;
/// I/O unit for streaming sections; a multiple of every item size (8, 4, 40).
const PIECE: usize = 40 * 32 * 1024;

/// The sections of one save, in on-disk order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    LbnMap,
    Refcounts,
    HashEntries,
    Counters,
}

impl Section {
    pub const ALL: [Section; 4] = [
        Section::LbnMap,
        Section::Refcounts,
        Section::HashEntries,
        Section::Counters,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Section::LbnMap => "inram LBN map",
            Section::Refcounts => "inram refcount array",
            Section::HashEntries => "inram hash index",
            Section::Counters => "inram counters",
        }
    }

    pub fn item_bytes(self) -> u64 {
        match self {
            Section::LbnMap | Section::Counters => 8,
            Section::Refcounts => 4,
            Section::HashEntries => HASH_ENTRY_BYTES,
        }
    }

    /// Most items this section can hold for a device.
    fn max_items(self, cfg: &DeviceConfig) -> u64 {
        match self {
            Section::LbnMap => cfg.logical_chunks(),
            Section::Refcounts => cfg.pbn_space(),
            Section::HashEntries => cfg.max_chunks(),
            Section::Counters => MAX_COUNTERS,
        }
    }
}

/// Item count and checksum of each section of the active save.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SaveTable {
    pub active_region: u32,
    pub items: [u64; 4],
    pub crcs: [u32; 4],
}

impl SaveTable {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u32(LAYOUT_VERSION).u32(self.active_region);
        for i in 0..4 {
            e.u64(self.items[i]).u32(self.crcs[i]);
        }
        e.buf
    }

    pub fn decode(area: &[u8], cfg: &DeviceConfig) -> Result<SaveTable> {
        const S: &str = "inram section table (superblock backend area)";
        let mut d = Decoder::new(area, S);
        let version = d.u32()?;
        if version != LAYOUT_VERSION {
            return Err(Error::corrupt(
                S,
                format!("unknown layout version {version}"),
            ));
        }
        let active_region = d.u32()?;
        if active_region > 1 {
            return Err(Error::corrupt(S, format!("bad region {active_region}")));
        }
        let mut t = SaveTable {
            active_region,
            ..Default::default()
        };
        for (i, s) in Section::ALL.iter().enumerate() {
            t.items[i] = d.u64()?;
            t.crcs[i] = d.u32()?;
            if t.items[i] > s.max_items(cfg) {
                return Err(Error::corrupt(
                    S,
                    format!(
                        "{} claims {} items, more than the device allows ({})",
                        s.name(),
                        t.items[i],
                        s.max_items(cfg)
                    ),
                ));
            }
        }
        // A brand-new device has saved nothing yet (all sections empty);
        // afterwards the two arrays always cover the whole device.
        let fresh = t.items == [0; 4];
        if !fresh && (t.items[0] != cfg.logical_chunks() || t.items[1] != cfg.pbn_space()) {
            return Err(Error::corrupt(
                S,
                "array sizes do not match the device geometry",
            ));
        }
        Ok(t)
    }
}

/// Bytes one payload region needs, rounded up to 4 KiB.
pub fn region_len(cfg: &DeviceConfig) -> u64 {
    let raw: u64 = Section::ALL
        .iter()
        .map(|s| s.max_items(cfg) * s.item_bytes())
        .sum();
    raw.div_ceil(4096) * 4096
}

/// Bytes the metadata device must hold.
pub fn metadata_device_len(cfg: &DeviceConfig) -> u64 {
    SUPERBLOCK_AREA + 2 * region_len(cfg)
}

fn section_offset(cfg: &DeviceConfig, table: &SaveTable, region: u32, section: usize) -> u64 {
    let mut off = SUPERBLOCK_AREA + region as u64 * region_len(cfg);
    for (i, s) in Section::ALL.iter().enumerate().take(section) {
        off += table.items[i] * s.item_bytes();
    }
    off
}

/// Streams one section to the metadata device, checksumming as it goes.
pub struct SectionWriter<'a> {
    file: &'a dyn BlockFile,
    offset: u64,
    buf: Vec<u8>,
    crc: u32,
    items: u64,
    item_bytes: usize,
    pub bytes_written: u64,
}

impl<'a> SectionWriter<'a> {
    pub fn new(
        file: &'a dyn BlockFile,
        cfg: &DeviceConfig,
        table: &SaveTable,
        region: u32,
        section: Section,
    ) -> Self {
        let idx = Section::ALL.iter().position(|&s| s == section).unwrap_or(0);
        SectionWriter {
            file,
            offset: section_offset(cfg, table, region, idx),
            buf: Vec::with_capacity(PIECE),
            crc: 0,
            items: 0,
            item_bytes: section.item_bytes() as usize,
            bytes_written: 0,
        }
    }

    pub fn item(&mut self, bytes: &[u8]) -> Result<()> {
        debug_assert_eq!(bytes.len(), self.item_bytes);
        self.buf.extend_from_slice(bytes);
        self.items += 1;
        if self.buf.len() >= PIECE {
            self.flush_piece()?;
        }
        Ok(())
    }

    fn flush_piece(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.crc = crc32c::crc32c_append(self.crc, &self.buf);
        self.file.write_at(&self.buf, self.offset)?;
        self.offset += self.buf.len() as u64;
        self.bytes_written += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Returns (items, crc32c).
    pub fn finish(mut self) -> Result<(u64, u32, u64)> {
        self.flush_piece()?;
        Ok((self.items, self.crc, self.bytes_written))
    }
}

/// Reads one section back, handing out items as they are read. Nothing read
/// is trusted until the whole section's checksum matches: on a mismatch the
/// caller gets an error and must drop everything it built. Returns bytes read.
pub fn read_section(
    file: &dyn BlockFile,
    cfg: &DeviceConfig,
    table: &SaveTable,
    section: Section,
    mut each: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<u64> {
    let idx = Section::ALL.iter().position(|&s| s == section).unwrap_or(0);
    let item = section.item_bytes() as usize;
    let total = table.items[idx] * item as u64;
    let start = section_offset(cfg, table, table.active_region, idx);
    let mut crc = 0u32;
    let mut buf = vec![0u8; PIECE];
    let mut done = 0u64;
    let mut index = 0u64;
    while done < total {
        let n = (total - done).min(PIECE as u64) as usize;
        file.read_at(&mut buf[..n], start + done)?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        for piece in buf[..n].chunks_exact(item) {
            each(index, piece)?;
            index += 1;
        }
        done += n as u64;
    }
    if crc != table.crcs[idx] {
        return Err(Error::corrupt(
            section.name(),
            format!(
                "checksum mismatch (stored {:#010x}, computed {crc:#010x}); {}",
                table.crcs[idx],
                crate::backends::NOT_REBUILT
            ),
        ));
    }
    Ok(total)
}
