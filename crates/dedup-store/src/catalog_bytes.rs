//! A container's catalog as stored: the entries themselves (versions 1 and
//! 2), or, since version 3, the same 64-byte entries by column (the n
//! fingerprints, then the n 32-byte locations) compressed with zstd.
//!
//! Why compress: a catalog is 64 bytes a segment, 5.7 MB of every GiB of
//! unique data at 8 KiB segments, and half of each entry repeats its
//! frame's fields (every entry of a frame carries the frame's offset,
//! stored length, crc and raw length, so one entry is enough to read its
//! segment). The fingerprints do not compress; the locations do, to a few
//! bytes each. On the catalogs of a GiB of an ext4 image (8 KiB segments)
//! this stored 38 bytes an entry, not 64 (2.3 MB less), which is also
//! that much less for a catalog prefetch to read.

use std::borrow::Cow;

use crate::format::{entry_len, Entry, ENTRY_LEN};

/// The first version whose catalog is compressed.
pub const COMPRESSED_SINCE: u32 = 3;

/// zstd level: catalogs are written once per 16 MiB container, so their
/// cost is small next to the segments'.
const LEVEL: i32 = 3;

/// Bytes of an entry that are its fingerprint (the rest is its location).
const FP: usize = 32;

/// Whether catalogs of container format `version` are compressed.
pub fn is_compressed(version: u32) -> bool {
    version >= COMPRESSED_SINCE
}

/// The stored catalog of `entries` for format `version`.
pub fn pack(entries: &[Entry], version: u32) -> Vec<u8> {
    let rows: Vec<[u8; ENTRY_LEN]> = entries.iter().map(Entry::encode).collect();
    if !is_compressed(version) {
        let len = entry_len(version);
        return rows.iter().flat_map(|r| &r[..len]).copied().collect();
    }
    let mut columns = Vec::with_capacity(rows.len() * ENTRY_LEN);
    rows.iter()
        .for_each(|r| columns.extend_from_slice(&r[..FP]));
    rows.iter()
        .for_each(|r| columns.extend_from_slice(&r[FP..]));
    // zstd in memory fails only on a bad level, and this one is good.
    zstd::bulk::compress(&columns, LEVEL).expect("zstd compresses in memory")
}

/// Stored bytes a compressed catalog takes at least per segment: its
/// fingerprints are distinct BLAKE3 hashes, which do not compress (32
/// bytes each), so a real catalog is never below half of that. The bound
/// keeps a forged count from making a reader decompress and hold 64 bytes
/// a segment out of a few (at most 4 times the bytes it read, twice).
pub const MIN_STORED_PER_SEGMENT: u64 = 16;

/// Whether `stored` bytes can hold the catalog of `count` segments in
/// format `version`: exactly an entry each when plain; when compressed,
/// `MIN_STORED_PER_SEGMENT` bytes a segment at least and at most what zstd
/// can make of the entries.
pub fn fits(version: u32, count: u32, stored: u64) -> bool {
    let raw = u64::from(count) * entry_len(version) as u64;
    if is_compressed(version) {
        let bound = usize::try_from(raw).map(zstd::zstd_safe::compress_bound);
        u64::from(count) * MIN_STORED_PER_SEGMENT <= stored
            && bound.is_ok_and(|b| stored <= b as u64)
    } else {
        stored == raw
    }
}

/// The catalog's entries as rows of `entry_len(version)` bytes, from its
/// stored bytes (already checked against the trailer's crc and `fits`).
pub fn unpack(version: u32, count: u32, stored: &[u8]) -> Result<Cow<'_, [u8]>, String> {
    if !is_compressed(version) {
        return Ok(Cow::Borrowed(stored));
    }
    let n = count as usize;
    let raw_len = n
        .checked_mul(ENTRY_LEN)
        .ok_or_else(|| format!("{n} catalog entries do not fit in memory"))?;
    // One zstd frame, exactly the stored bytes: nothing skipped or after it.
    let frame = zstd::zstd_safe::find_frame_compressed_size(stored).map_err(|e| {
        format!(
            "its catalog is not a zstd frame: {}",
            zstd::zstd_safe::get_error_name(e)
        )
    })?;
    if frame != stored.len() {
        return Err(format!(
            "its catalog is a {frame}-byte zstd frame and {} bytes more",
            stored.len() - frame
        ));
    }
    let columns = zstd::bulk::decompress(stored, raw_len)
        .map_err(|e| format!("its catalog does not decompress: {e}"))?;
    if columns.len() != raw_len {
        return Err(format!(
            "its catalog decompresses to {} bytes, not the {raw_len} of {n} entries",
            columns.len()
        ));
    }
    let (fps, locations) = columns.split_at(n * FP);
    let mut rows = Vec::with_capacity(raw_len);
    for (fp, location) in fps
        .chunks_exact(FP)
        .zip(locations.chunks_exact(ENTRY_LEN - FP))
    {
        rows.extend_from_slice(fp);
        rows.extend_from_slice(location);
    }
    Ok(Cow::Owned(rows))
}
