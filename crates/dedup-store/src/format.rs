//! The container's fixed-size parts, byte by byte (FORMATS.md is the prose
//! version): header, catalog entry, trailer. Encoding and decoding only;
//! what the parts must agree on is checked in `container.rs`.
//!
//! Everything is little-endian, and every part carries a crc32c, so that a
//! single flipped byte anywhere in a container is caught.

use dedup_common::compress::Compression;
use dedup_common::fingerprint::{Fingerprint, FINGERPRINT_BYTES};

/// The first bytes of every container.
pub const HEADER_MAGIC: [u8; 8] = *b"DDUPCNTR";
/// The first bytes of the trailer, the container's last `TRAILER_LEN` bytes.
pub const TRAILER_MAGIC: [u8; 8] = *b"DDUPCTLG";
/// Bumped on any change to the layout. Version 3 compresses the catalog
/// (`catalog_bytes.rs`); version 2 compresses runs of segments together in
/// frames; version 1 (one segment per frame, 56-byte entries) is still
/// read. Readers refuse other versions.
pub const FORMAT_VERSION: u32 = 3;
/// The oldest version this build reads.
pub const OLDEST_VERSION: u32 = 1;

pub const HEADER_LEN: usize = 32;
/// A catalog entry of version 2 and 3 (before version 3 compresses them).
pub const ENTRY_LEN: usize = 64;
/// A version 1 catalog entry: the first 56 bytes of a version 2 one.
pub const ENTRY_LEN_V1: usize = 56;
pub const TRAILER_LEN: usize = 48;

/// The catalog entry length of format `version` (one this build reads).
pub fn entry_len(version: u32) -> usize {
    if version == 1 {
        ENTRY_LEN_V1
    } else {
        ENTRY_LEN
    }
}

/// Largest segment a container takes, raw. Readers refuse larger ones before
/// allocating, so a forged catalog cannot make them allocate gigabytes.
pub const MAX_SEGMENT_LEN: usize = 16 << 20;
/// Largest frame, raw: a frame holds whole segments, so one segment of
/// `MAX_SEGMENT_LEN` fits. Same reason for the limit.
pub const MAX_FRAME_LEN: usize = MAX_SEGMENT_LEN;

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

/// Where one segment lies in its container and how to get it back: in a
/// frame, a run of segments compressed together (a compressor finds far
/// more to share in 1 MiB than in 4 KiB), at `frame_at` in the frame's
/// decompressed bytes. Every entry of a frame repeats the frame's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Where the frame starts, from the start of the container.
    pub offset: u64,
    /// The frame's bytes in the container (compressed or not).
    pub stored_len: u32,
    /// The segment's bytes once decompressed.
    pub raw_len: u32,
    /// The frame's; `None` when compressing did not make it smaller.
    pub compression: Compression,
    /// crc32c of the frame's stored bytes: checked before decompressing.
    pub stored_crc: u32,
    /// Where the segment starts in the decompressed frame.
    pub frame_at: u32,
    /// The frame's bytes once decompressed: all its segments.
    pub frame_len: u32,
}

impl Location {
    /// Whether `other` lies in the same frame (every frame field equal).
    pub fn same_frame(&self, other: &Location) -> bool {
        (
            self.offset,
            self.stored_len,
            self.compression,
            self.stored_crc,
            self.frame_len,
        ) == (
            other.offset,
            other.stored_len,
            other.compression,
            other.stored_crc,
            other.frame_len,
        )
    }

    /// Where the frame ends in the container.
    pub fn frame_end(&self) -> u64 {
        self.offset + u64::from(self.stored_len)
    }
}

/// One catalog entry: fingerprint (32), frame offset (8), frame stored
/// length (4), segment raw length (4), compression code (1,
/// `Compression::code`), removed flag (1), 2 zero bytes, crc32c of the
/// frame's stored bytes (4), then (version 2 only) the segment's offset in
/// the decompressed frame (4) and the frame's raw length (4). A version 1
/// entry is a frame of one segment: offset 0, frame length the raw length.
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
        b[56..60].copy_from_slice(&l.frame_at.to_le_bytes());
        b[60..64].copy_from_slice(&l.frame_len.to_le_bytes());
        b
    }

    /// Decode an entry of format `version`: `b` is `entry_len(version)` bytes.
    pub fn decode(b: &[u8], version: u32) -> Result<Entry, String> {
        if b.len() != entry_len(version) {
            return Err(format!(
                "a version {version} entry is {} bytes, not {}",
                entry_len(version),
                b.len()
            ));
        }
        let compression = Compression::from_code(b[48])
            .ok_or_else(|| format!("unknown compression code {:#04x}", b[48]))?;
        if b[49] > 1 || b[50..52] != [0, 0] {
            return Err(format!("reserved bytes are {:02x?}, not zero", &b[49..52]));
        }
        let mut fp = [0u8; FINGERPRINT_BYTES];
        fp.copy_from_slice(&b[0..32]);
        let raw_len = u32_at(b, 44);
        let (frame_at, frame_len) = if version == 1 {
            (0, if b[49] == 1 { 0 } else { raw_len })
        } else {
            (u32_at(b, 56), u32_at(b, 60))
        };
        let entry = Entry {
            fingerprint: Fingerprint(fp),
            location: Location {
                offset: u64_at(b, 32),
                stored_len: u32_at(b, 40),
                raw_len,
                compression,
                stored_crc: u32_at(b, 52),
                frame_at,
                frame_len,
            },
        };
        let l = &entry.location;
        if (b[49] == 1) != entry.is_absent()
            || (entry.is_absent() && (l.stored_crc, l.frame_at, l.frame_len) != (0, 0, 0))
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
                frame_at: 0,
                frame_len: 0,
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
