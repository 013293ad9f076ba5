//! The container's fixed-size parts, byte by byte (FORMATS.md is the prose
//! version): header, catalog entry, trailer. Encoding and decoding only;
//! what the parts must agree on is checked in `container.rs`.
//!
//! Everything is little-endian, and every part carries a crc32c, so that a
//! single flipped byte anywhere in a container is caught.

use dedup_core::compress::Compression;
use dedup_core::fingerprint::{Fingerprint, FINGERPRINT_BYTES};

/// The first bytes of every container.
pub const HEADER_MAGIC: [u8; 8] = *b"DDUPCNTR";
/// The first bytes of the trailer, the container's last `TRAILER_LEN` bytes.
pub const TRAILER_MAGIC: [u8; 8] = *b"DDUPCTLG";
/// Bumped on any change to the layout; readers refuse other versions.
pub const FORMAT_VERSION: u32 = 1;

pub const HEADER_LEN: usize = 32;
pub const ENTRY_LEN: usize = 56;
pub const TRAILER_LEN: usize = 48;

/// Largest segment a container takes, raw. Readers refuse larger ones before
/// allocating, so a forged catalog cannot make them allocate gigabytes.
pub const MAX_SEGMENT_LEN: usize = 16 << 20;

pub fn crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Header: magic, version, flags (0), container id, segment count, crc32c
/// of the 28 bytes before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub flags: u32,
    pub container_id: u64,
    pub segment_count: u32,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&HEADER_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.container_id.to_le_bytes());
        b[24..28].copy_from_slice(&self.segment_count.to_le_bytes());
        let sum = crc(&b[..28]);
        b[28..32].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Decode, checking magic and checksum (not the version: the caller
    /// names a version mismatch itself).
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, String> {
        check_part(b, HEADER_MAGIC, "header")?;
        Ok(Header {
            version: u32_at(b, 8),
            flags: u32_at(b, 12),
            container_id: u64_at(b, 16),
            segment_count: u32_at(b, 24),
        })
    }
}

/// Where one segment lies in its container and how to get it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// From the start of the container.
    pub offset: u64,
    /// Bytes in the container (compressed or not).
    pub stored_len: u32,
    /// Bytes once decompressed.
    pub raw_len: u32,
    /// `None` when compressing did not make it smaller.
    pub compression: Compression,
    /// crc32c of the stored bytes: checked before decompressing them.
    pub stored_crc: u32,
}

/// One catalog entry: fingerprint (32), offset (8), stored length (4), raw
/// length (4), compression code (1, `Compression::code`), 3 zero bytes,
/// crc32c of the stored bytes (4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub fingerprint: Fingerprint,
    pub location: Location,
}

impl Entry {
    pub fn encode(&self) -> [u8; ENTRY_LEN] {
        let l = &self.location;
        let mut b = [0u8; ENTRY_LEN];
        b[0..32].copy_from_slice(&self.fingerprint.0);
        b[32..40].copy_from_slice(&l.offset.to_le_bytes());
        b[40..44].copy_from_slice(&l.stored_len.to_le_bytes());
        b[44..48].copy_from_slice(&l.raw_len.to_le_bytes());
        b[48] = l.compression.code();
        b[49] = u8::from(self.is_absent());
        b[52..56].copy_from_slice(&l.stored_crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; ENTRY_LEN]) -> Result<Entry, String> {
        let compression = Compression::from_code(b[48])
            .ok_or_else(|| format!("unknown compression code {:#04x}", b[48]))?;
        if b[49] > 1 || b[50..52] != [0, 0] {
            return Err(format!("reserved bytes are {:02x?}, not zero", &b[49..52]));
        }
        let mut fp = [0u8; FINGERPRINT_BYTES];
        fp.copy_from_slice(&b[0..32]);
        let entry = Entry {
            fingerprint: Fingerprint(fp),
            location: Location {
                offset: u64_at(b, 32),
                stored_len: u32_at(b, 40),
                raw_len: u32_at(b, 44),
                compression,
                stored_crc: u32_at(b, 52),
            },
        };
        if (b[49] == 1) != entry.is_absent()
            || (entry.is_absent() && entry.location.stored_crc != 0)
        {
            return Err(format!(
                "the removed flag {} does not match {} stored bytes for {} raw with compression {}",
                b[49],
                entry.location.stored_len,
                entry.location.raw_len,
                entry.location.compression
            ));
        }
        Ok(entry)
    }

    /// The segment was removed by compaction (garbage collection): its
    /// fingerprint and raw length stay so entry numbers do not change,
    /// but no bytes are stored. Told apart from a present segment by
    /// storing nothing for a non-empty segment uncompressed, which a
    /// present one never does.
    pub fn is_absent(&self) -> bool {
        let l = &self.location;
        l.stored_len == 0 && l.raw_len > 0 && l.compression == Compression::None
    }

    /// This entry with its bytes removed, at `offset`.
    pub fn absent_at(&self, offset: u64) -> Entry {
        Entry {
            fingerprint: self.fingerprint,
            location: Location {
                offset,
                stored_len: 0,
                raw_len: self.location.raw_len,
                compression: Compression::None,
                stored_crc: 0,
            },
        }
    }
}

/// Trailer: magic, version, segment count, container id, catalog offset and
/// length, crc32c of the catalog, crc32c of the 44 bytes before it. Fixed
/// size at the very end, so one suffix read finds the catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trailer {
    pub version: u32,
    pub segment_count: u32,
    pub container_id: u64,
    pub catalog_offset: u64,
    pub catalog_len: u64,
    pub catalog_crc: u32,
}

impl Trailer {
    pub fn encode(&self) -> [u8; TRAILER_LEN] {
        let mut b = [0u8; TRAILER_LEN];
        b[0..8].copy_from_slice(&TRAILER_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.segment_count.to_le_bytes());
        b[16..24].copy_from_slice(&self.container_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.catalog_offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.catalog_len.to_le_bytes());
        b[40..44].copy_from_slice(&self.catalog_crc.to_le_bytes());
        let sum = crc(&b[..44]);
        b[44..48].copy_from_slice(&sum.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; TRAILER_LEN]) -> Result<Trailer, String> {
        check_part(b, TRAILER_MAGIC, "trailer")?;
        Ok(Trailer {
            version: u32_at(b, 8),
            segment_count: u32_at(b, 12),
            container_id: u64_at(b, 16),
            catalog_offset: u64_at(b, 24),
            catalog_len: u64_at(b, 32),
            catalog_crc: u32_at(b, 40),
        })
    }
}

/// Check a header's or trailer's magic (its first 8 bytes) and crc32c (its
/// last 4, over the bytes before them).
fn check_part(b: &[u8], magic: [u8; 8], part: &str) -> Result<(), String> {
    if b[0..8] != magic {
        return Err(format!("bad {part} magic {:02x?}", &b[0..8]));
    }
    let end = b.len() - 4;
    let stored = u32_at(b, end);
    let computed = crc(&b[..end]);
    if stored != computed {
        return Err(format!(
            "{part} checksum {stored:#010x} does not match its bytes ({computed:#010x})"
        ));
    }
    Ok(())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
