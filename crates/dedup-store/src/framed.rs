//! The frame shared by the repository's own objects (config, recipe,
//! backup): 8-byte magic, 4-byte version, the body, and a crc32c of all the
//! bytes before it. The checksum is checked before anything in the body is
//! trusted, so a flipped byte is refused before a length in it is used.

use std::borrow::Cow;
use std::io::Read;

use crate::error::repo::{RepoError, RepoResult};
use crate::format::crc;

/// zstd level for the repository's own objects that grow with a backup
/// (recipes, trees): small next to the data, and read rarely, so worth a
/// good ratio. On a backup of 40 tokio releases as files the recipe fell
/// from 2.3 MB to 175 KB (the same files' fingerprints repeat) and the
/// tree from 4.1 MB to 365 KB (paths share their prefixes).
pub(crate) const OBJECT_LEVEL: i32 = 3;

/// The most a compressed body may expand, so that a forged one (a tree
/// from a client, say) cannot make its reader decompress without end:
/// trees and recipes compress 10-15 times. A body that compresses better
/// is framed plain instead.
pub const MAX_EXPANSION: u64 = 64;

/// Frame `body` compressed as `version`: the frame's body is the raw
/// body's length (u64), then the raw body compressed with zstd. A body
/// that would expand more than `MAX_EXPANSION` times is framed as is, as
/// `plain_version`.
pub fn frame_compressed(magic: [u8; 8], plain_version: u32, version: u32, body: &[u8]) -> Vec<u8> {
    frame_zstd(magic, version, body).unwrap_or_else(|| frame(magic, plain_version, body))
}

/// Frame `body` compressed as `version` (as [`frame_compressed`] does), or
/// `None` when it would expand more than `MAX_EXPANSION` times.
pub fn frame_zstd(magic: [u8; 8], version: u32, body: &[u8]) -> Option<Vec<u8>> {
    let packed = zstd_packed(body);
    expansion_allowed(body.len() as u64, packed.len())
        .then(|| frame_packed(magic, version, body.len(), packed))
}

/// [`frame_zstd`], or, for a body that shrinks more than `MAX_EXPANSION`
/// times, compressed all the same as `runs_version` if it is at most
/// `max_raw` bytes (that version's reader bounds the raw length so,
/// `unzstd_reader_within`); `None` for a larger one. Compressed once.
pub fn frame_zstd_bounded(
    magic: [u8; 8],
    version: u32,
    runs_version: u32,
    max_raw: u64,
    body: &[u8],
) -> Option<Vec<u8>> {
    let packed = zstd_packed(body);
    let raw = body.len() as u64;
    if expansion_allowed(raw, packed.len()) {
        Some(frame_packed(magic, version, body.len(), packed))
    } else if raw <= max_raw {
        Some(frame_packed(magic, runs_version, body.len(), packed))
    } else {
        None
    }
}

/// `body` compressed at the objects' level.
fn zstd_packed(body: &[u8]) -> Vec<u8> {
    // This thread's context, kept: a backup's recipe parts are compressed
    // one after another, and a fresh context allocates and clears its
    // tables each time (a twentieth of an incremental device backup's
    // time on a 64 GiB device, 256 parts). zstd in memory fails only for
    // want of memory.
    dedup_common::compress::zstd_frame(body, OBJECT_LEVEL).expect("zstd compresses in memory")
}

/// The frame of `packed`, a body of `raw_len` bytes compressed.
fn frame_packed(magic: [u8; 8], version: u32, raw_len: usize, mut packed: Vec<u8>) -> Vec<u8> {
    // The frame is made around the compressed bytes in place, not copied
    // twice more: a recipe's is several bytes a segment of the backup.
    let mut head = magic.to_vec();
    head.extend_from_slice(&version.to_le_bytes());
    head.extend_from_slice(&(raw_len as u64).to_le_bytes());
    packed.splice(0..0, head);
    let sum = crc(&packed);
    packed.extend_from_slice(&sum.to_le_bytes());
    packed
}

fn expansion_allowed(raw_len: u64, packed_len: usize) -> bool {
    raw_len <= (packed_len as u64).saturating_mul(MAX_EXPANSION)
}

/// Check the frame of `object`, of version `plain` (its body as is) or
/// `compressed` (as [`frame_compressed`] makes it), and return its body.
/// A compressed body may name at most `MAX_EXPANSION` times its own
/// length, is decompressed as it comes (never into room sized by the
/// length it names), and must come to exactly that length.
pub fn unframe_compressed<'a>(
    object: &str,
    magic: [u8; 8],
    plain: u32,
    compressed: u32,
    bytes: &'a [u8],
) -> RepoResult<Cow<'a, [u8]>> {
    let (version, body) = unframe_any(object, magic, plain..=compressed, bytes)?;
    if version != compressed {
        return Ok(Cow::Borrowed(body));
    }
    unzstd(object, body).map(Cow::Owned)
}

/// The raw body of a frame body that [`frame_zstd`] made: at most
/// `MAX_EXPANSION` times its bytes, decompressed as it comes (never into
/// room sized by the length it names), and exactly that length.
pub fn unzstd(object: &str, body: &[u8]) -> RepoResult<Vec<u8>> {
    let (raw_len, raw) = unzstd_reader(object, body)?;
    let mut out = Vec::new();
    raw.take(raw_len.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| undecompressable(object, &e))?;
    if out.len() as u64 != raw_len {
        return Err(RepoError::corrupt(
            object,
            format!(
                "its body decompresses to {} bytes, not the {raw_len} it names",
                out.len()
            ),
        ));
    }
    Ok(out)
}

/// The raw length a frame body that [`frame_zstd`] made names, refused
/// past `MAX_EXPANSION` times its bytes, and a reader of the raw bytes
/// for a caller that decodes them as they come (and must then find
/// exactly that many).
pub fn unzstd_reader<'a>(object: &str, body: &'a [u8]) -> RepoResult<(u64, impl Read + 'a)> {
    let raw_len = Reader::new(object, body).u64()?;
    if !expansion_allowed(raw_len, body.len() - 8) {
        return Err(RepoError::corrupt(
            object,
            format!(
                "its compressed body names {raw_len} bytes, over {MAX_EXPANSION} times its {}",
                body.len() - 8
            ),
        ));
    }
    zstd_reader(object, body, raw_len)
}

/// [`unzstd_reader`] of a body [`frame_zstd_bounded`] made, whose raw length
/// may be any ratio to its bytes but at most `max_raw` (what the version
/// can hold), so no body makes its reader decompress without end.
pub fn unzstd_reader_within<'a>(
    object: &str,
    body: &'a [u8],
    max_raw: u64,
) -> RepoResult<(u64, impl Read + 'a)> {
    let raw_len = Reader::new(object, body).u64()?;
    if raw_len > max_raw {
        return Err(RepoError::corrupt(
            object,
            format!("its compressed body names {raw_len} bytes, over the {max_raw} it may hold"),
        ));
    }
    zstd_reader(object, body, raw_len)
}

/// The raw length and a reader of the zstd stream after it.
fn zstd_reader<'a>(
    object: &str,
    body: &'a [u8],
    raw_len: u64,
) -> RepoResult<(u64, impl Read + 'a)> {
    let decoder =
        zstd::stream::read::Decoder::new(&body[8..]).map_err(|e| undecompressable(object, &e))?;
    Ok((raw_len, decoder))
}

/// The error for a compressed body that does not decompress.
pub fn undecompressable(object: &str, e: &std::io::Error) -> RepoError {
    RepoError::corrupt(
        object,
        format!("its compressed body does not decompress: {e}"),
    )
}

/// Frame `body` under `magic` and `version`.
pub fn frame(magic: [u8; 8], version: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(body);
    let sum = crc(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Check the frame of `object` and return its body.
pub fn unframe<'a>(
    object: &str,
    magic: [u8; 8],
    version: u32,
    bytes: &'a [u8],
) -> RepoResult<&'a [u8]> {
    unframe_any(object, magic, version..=version, bytes).map(|(_, body)| body)
}

/// Check the frame of `object`, which may be any of `versions`; its
/// version and body.
pub fn unframe_any<'a>(
    object: &str,
    magic: [u8; 8],
    versions: std::ops::RangeInclusive<u32>,
    bytes: &'a [u8],
) -> RepoResult<(u32, &'a [u8])> {
    let corrupt = |d: String| RepoError::corrupt(object, d);
    if bytes.len() < 16 {
        return Err(corrupt(format!(
            "{} bytes, too short for a frame",
            bytes.len()
        )));
    }
    if bytes[..8] != magic {
        return Err(corrupt(format!("bad magic {:02x?}", &bytes[..8])));
    }
    let end = bytes.len() - 4;
    let stored = u32::from_le_bytes(bytes[end..].try_into().expect("4 bytes"));
    if stored != crc(&bytes[..end]) {
        return Err(corrupt("checksum does not match its bytes".into()));
    }
    let found = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if !versions.contains(&found) {
        return Err(corrupt(format!(
            "format version {found}; this build reads versions {} to {}",
            versions.start(),
            versions.end()
        )));
    }
    Ok((found, &bytes[12..end]))
}

/// Bounds-checked little-endian reads from a frame's body.
pub struct Reader<'a> {
    object: &'a str,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(object: &'a str, buf: &'a [u8]) -> Reader<'a> {
        Reader {
            object,
            buf,
            pos: 0,
        }
    }

    pub fn bytes(&mut self, n: usize) -> RepoResult<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| {
            RepoError::corrupt(
                self.object,
                format!("truncated: {n} bytes needed at offset {}", self.pos),
            )
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub fn u16(&mut self) -> RepoResult<u16> {
        Ok(u16::from_le_bytes(self.bytes(2)?.try_into().expect("2")))
    }

    pub fn u32(&mut self) -> RepoResult<u32> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4")))
    }

    pub fn u64(&mut self) -> RepoResult<u64> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8")))
    }

    /// A string written by `put_str`: u16 length, UTF-8 bytes.
    pub fn str(&mut self) -> RepoResult<String> {
        let n = self.u16()? as usize;
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| RepoError::corrupt(self.object, "a string is not UTF-8"))
    }

    /// Refuse bytes left over: every byte of a frame has a meaning.
    pub fn finish(&self) -> RepoResult<()> {
        if self.pos != self.buf.len() {
            return Err(RepoError::corrupt(
                self.object,
                format!("{} unexpected bytes at the end", self.buf.len() - self.pos),
            ));
        }
        Ok(())
    }
}

/// Append a string as `Reader::str` reads it (names are ≤ 255 bytes).
pub fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}
