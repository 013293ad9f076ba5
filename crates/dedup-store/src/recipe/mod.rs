//! File recipes (§3.1): a backed-up stream's segments in order, each as
//! the container and catalog entry that hold it, so a restore reads the
//! containers directly and needs no index. Each reference also carries the
//! segment's length and a check of its fingerprint (its first 8 bytes), so
//! a restore checks that every catalog entry it reads is the segment that
//! was backed up, not only that the bytes match their own catalog.
//!
//! Object `recipes/<backup>-<nonce>`; body after the frame (magic
//! `DDUPRCPE`): stream length (u64), segment count n (u64), then the n
//! references by column (n container ids, n entries, n lengths, n checks),
//! compressed with zstd (see `framed::frame_zstd`): apart from the checks
//! zstd has runs of like numbers to work on. Version 5 (written since
//! 2026-11-27) keeps 8 bytes of each fingerprint, not 32: the checks do
//! not compress, and a whole fingerprint made a recipe 32 bytes a segment
//! (3.2 MB for a GiB of unique data at 8 KiB segments, and as much again
//! for every unchanged re-backup), where a 64-bit check catches a wrong
//! entry all the same (the catalog keeps the whole fingerprint, which the
//! segment's bytes are checked against). Version 7 (since 2026-11-30) is
//! version 5's body compressed however well, written for a body of at most
//! a part's references (65,536) that would expand more than 64 times on
//! reading (a run of one reference: a device's unmapped blocks, an
//! image's zeros); its reader bounds the raw length by that count. Version
//! 6 is version 5's body plain, written for a larger such body (only a
//! test makes one). Still read: version 3, the
//! same columns with whole fingerprints; version 2, rows of 48 bytes
//! (container u64, entry u32, length u32, fingerprint 32) compressed;
//! version 1, those rows plain. A recipe too long for one part is written
//! in parts of this format, named by an index (version 4,
//! `recipe/parts.rs`).

pub mod parts;

use std::io::Read;

use dedup_common::fingerprint::Fingerprint;

use crate::error::repo::{RepoError, RepoResult};
use crate::framed::{
    frame, frame_zstd_bounded, undecompressable, unframe_any, unzstd, unzstd_reader,
    unzstd_reader_within,
};

pub(crate) const MAGIC: [u8; 8] = *b"DDUPRCPE";
/// Columns with fingerprint checks, compressed.
pub(crate) const VERSION: u32 = 5;
/// Columns with fingerprint checks, plain.
const PLAIN_VERSION: u32 = 6;
/// Columns with fingerprint checks, compressed however well, of at most
/// `RUNS_MAX_REFS` references.
const RUNS_VERSION: u32 = 7;
/// The most references a version 7 body holds: a recipe part's. Its raw
/// length is bounded by this, not by its compressed bytes, so a body of
/// one reference repeated (a device's unmapped blocks, an image's zeros)
/// is stored in hundreds of bytes instead of 24 a reference, and still
/// no forged one can make its reader decompress without end.
const RUNS_MAX_REFS: usize = parts::PART_SEGMENTS;
/// A version 7 body's most bytes: the head and `RUNS_MAX_REFS` references.
const RUNS_MAX_RAW: u64 = 16 + (RUNS_MAX_REFS * REF_LEN) as u64;
/// Columns with whole fingerprints, compressed (read only).
const COLUMNS_VERSION: u32 = 3;
/// Rows, compressed (read only).
const ROWS_VERSION: u32 = 2;
/// Rows, plain (read only).
pub(crate) const ROWS_PLAIN_VERSION: u32 = 1;
/// The lowest and highest version of any recipe object.
pub(crate) const VERSIONS: std::ops::RangeInclusive<u32> = ROWS_PLAIN_VERSION..=RUNS_VERSION;
/// A reference's bytes in versions 1 to 3.
const OLD_REF_LEN: usize = 48;
/// A reference's bytes in versions 5 and 6.
const REF_LEN: usize = 24;

/// One segment of a stream, where it lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentRef {
    pub container: u64,
    pub entry: u32,
    pub len: u32,
    /// The first 8 bytes of the segment's fingerprint, little-endian
    /// ([`fingerprint_check`]).
    pub check: u64,
}

/// What a reference keeps of a fingerprint: its first 8 bytes.
pub fn fingerprint_check(fp: &Fingerprint) -> u64 {
    u64::from_le_bytes(fp.0[..8].try_into().expect("8"))
}

impl SegmentRef {
    pub fn new(container: u64, entry: u32, len: u32, fp: &Fingerprint) -> SegmentRef {
        SegmentRef {
            container,
            entry,
            len,
            check: fingerprint_check(fp),
        }
    }

    /// Whether a segment of fingerprint `fp` and `len` bytes is the one
    /// this reference names.
    pub fn is(&self, fp: &Fingerprint, len: u32) -> bool {
        self.check == fingerprint_check(fp) && self.len == len
    }

    /// The containers `refs` name, each once, in order.
    pub fn containers(refs: &[SegmentRef]) -> Vec<u64> {
        // Runs of one container (a part's references mostly come so) are
        // one id before the sort.
        let mut ids: Vec<u64> = Vec::new();
        for r in refs {
            if ids.last() != Some(&r.container) {
                ids.push(r.container);
            }
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recipe {
    pub stream_len: u64,
    pub segments: Vec<SegmentRef>,
}

impl Recipe {
    pub fn encode(&self) -> Vec<u8> {
        encode_body(self.columns())
    }

    /// `encode`, giving up the references before compressing: a backup's
    /// recipe is 24 bytes a segment in RAM (6 MiB a GiB of 4 KiB
    /// segments), and the body and its compressed copy would otherwise sit
    /// beside it.
    pub fn into_encoded(self) -> Vec<u8> {
        let body = self.columns();
        drop(self);
        encode_body(body)
    }

    /// The raw body of version 5: stream length, count, then the columns.
    fn columns(&self) -> Vec<u8> {
        let refs = &self.segments;
        let n = refs.len();
        // Each column written into its place, not grown a field at a time:
        // a recipe part is 64 Ki references, a large device's backup
        // hundreds of parts.
        let mut body = vec![0u8; 16 + n * REF_LEN];
        let (head, cols) = body.split_at_mut(16);
        head[..8].copy_from_slice(&self.stream_len.to_le_bytes());
        head[8..].copy_from_slice(&(n as u64).to_le_bytes());
        let (containers, cols) = cols.split_at_mut(n * 8);
        let (entries, cols) = cols.split_at_mut(n * 4);
        let (lens, checks) = cols.split_at_mut(n * 4);
        for (i, s) in refs.iter().enumerate() {
            containers[i * 8..i * 8 + 8].copy_from_slice(&s.container.to_le_bytes());
            entries[i * 4..i * 4 + 4].copy_from_slice(&s.entry.to_le_bytes());
            lens[i * 4..i * 4 + 4].copy_from_slice(&s.len.to_le_bytes());
            checks[i * 8..i * 8 + 8].copy_from_slice(&s.check.to_le_bytes());
        }
        body
    }

    /// Decode the recipe object `object`, checking that the counts and
    /// lengths agree before allocating for them.
    pub fn decode(object: &str, bytes: &[u8]) -> RepoResult<Recipe> {
        let (version, framed) = unframe_any(object, MAGIC, VERSIONS, bytes)?;
        Recipe::decode_body(object, version, framed)
    }

    /// `decode` of a frame already checked: its version (one of
    /// the whole-recipe versions, not 4) and body.
    pub(crate) fn decode_body(object: &str, version: u32, framed: &[u8]) -> RepoResult<Recipe> {
        let (stream_len, segments) = match version {
            ROWS_PLAIN_VERSION => decode_rows(object, framed)?,
            ROWS_VERSION => decode_rows(object, &unzstd(object, framed)?)?,
            COLUMNS_VERSION => {
                let (raw_len, raw) = unzstd_reader(object, framed)?;
                decode_columns(object, raw_len, raw, 32)?
            }
            PLAIN_VERSION => decode_columns(object, framed.len() as u64, framed, 8)?,
            VERSION => {
                let (raw_len, raw) = unzstd_reader(object, framed)?;
                decode_columns(object, raw_len, raw, 8)?
            }
            RUNS_VERSION => {
                let (raw_len, raw) = unzstd_reader_within(object, framed, RUNS_MAX_RAW)?;
                decode_columns(object, raw_len, raw, 8)?
            }
            _ => {
                return Err(RepoError::corrupt(
                    object,
                    format!("format version {version} is not a whole recipe"),
                ))
            }
        };
        let total: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
        if total != stream_len {
            return Err(RepoError::corrupt(
                object,
                format!("its segments add up to {total} bytes, not the stream's {stream_len}"),
            ));
        }
        Ok(Recipe {
            stream_len,
            segments,
        })
    }
}

/// Frame a version 5 body compressed; if it would expand too much on
/// reading for version 5 (a run of one reference), as version 7 when it
/// holds few enough references, else plain as version 6.
fn encode_body(body: Vec<u8>) -> Vec<u8> {
    frame_zstd_bounded(MAGIC, VERSION, RUNS_VERSION, RUNS_MAX_RAW, &body)
        .unwrap_or_else(|| frame(MAGIC, PLAIN_VERSION, &body))
}

/// The stream length and count of a body `len` bytes long, refused unless
/// the count's references, `ref_len` bytes each, fill it exactly.
fn head(object: &str, head: &[u8; 16], len: u64, ref_len: usize) -> RepoResult<(u64, usize)> {
    let stream_len = u64::from_le_bytes(head[..8].try_into().expect("8"));
    let count = u64::from_le_bytes(head[8..].try_into().expect("8"));
    if (count as u128) * ref_len as u128 + 16 != u128::from(len) {
        return Err(RepoError::corrupt(
            object,
            format!("{count} segments do not fit its {len} bytes"),
        ));
    }
    Ok((stream_len, count as usize))
}

/// A raw body of rows (versions 1 and 2).
fn decode_rows(object: &str, body: &[u8]) -> RepoResult<(u64, Vec<SegmentRef>)> {
    let Some(first) = body.first_chunk::<16>() else {
        return Err(RepoError::corrupt(
            object,
            format!("{} bytes, too short for a recipe", body.len()),
        ));
    };
    let (stream_len, _) = head(object, first, body.len() as u64, OLD_REF_LEN)?;
    Ok((
        stream_len,
        body[16..].chunks_exact(OLD_REF_LEN).map(row).collect(),
    ))
}

/// A body of columns `raw_len` bytes long, read from `raw` (decoded as it
/// decompresses, so the raw body is never held beside the references),
/// whose last column holds `fp_width` bytes of each fingerprint: 32
/// (version 3) or 8 (versions 5 and 6).
fn decode_columns(
    object: &str,
    raw_len: u64,
    mut raw: impl Read,
    fp_width: usize,
) -> RepoResult<(u64, Vec<SegmentRef>)> {
    let short = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => RepoError::corrupt(
            object,
            format!("its body decompresses to fewer than the {raw_len} bytes it names"),
        ),
        _ => undecompressable(object, &e),
    };
    let mut first = [0u8; 16];
    raw.read_exact(&mut first).map_err(short)?;
    // The count is bounded by the raw length, which is bounded by the
    // compressed bytes at hand.
    let (stream_len, n) = head(object, &first, raw_len, 16 + fp_width)?;
    let blank = SegmentRef {
        container: 0,
        entry: 0,
        len: 0,
        check: 0,
    };
    let mut segments = vec![blank; n];
    let mut buf = vec![0u8; 64 << 10];
    let mut column = |width: usize, set: &mut dyn FnMut(&mut SegmentRef, &[u8])| {
        let per = buf.len() / width;
        for start in (0..n).step_by(per) {
            let k = per.min(n - start);
            raw.read_exact(&mut buf[..k * width]).map_err(short)?;
            for (s, b) in segments[start..start + k]
                .iter_mut()
                .zip(buf.chunks_exact(width))
            {
                set(s, b);
            }
        }
        Ok::<(), RepoError>(())
    };
    column(8, &mut |s, b| {
        s.container = u64::from_le_bytes(b.try_into().expect("8"))
    })?;
    column(4, &mut |s, b| {
        s.entry = u32::from_le_bytes(b.try_into().expect("4"))
    })?;
    column(4, &mut |s, b| {
        s.len = u32::from_le_bytes(b.try_into().expect("4"))
    })?;
    // A whole fingerprint (version 3) keeps only its check.
    column(fp_width, &mut |s, b| {
        s.check = u64::from_le_bytes(b[..8].try_into().expect("8"))
    })?;
    let mut past = [0u8; 1];
    if raw.read(&mut past).map_err(short)? != 0 {
        return Err(RepoError::corrupt(
            object,
            format!("its body decompresses to more than the {raw_len} bytes it names"),
        ));
    }
    Ok((stream_len, segments))
}

/// A reference as a row of versions 1 and 2 holds it.
fn row(b: &[u8]) -> SegmentRef {
    let (container, rest) = b.split_at(8);
    let (entry, rest) = rest.split_at(4);
    let (len, fingerprint) = rest.split_at(4);
    reference(container, entry, len, fingerprint)
}

/// A reference from its fields' little-endian bytes (8, 4, 4 and 32, which
/// the callers' splits guarantee).
fn reference(container: &[u8], entry: &[u8], len: &[u8], fingerprint: &[u8]) -> SegmentRef {
    SegmentRef {
        container: u64::from_le_bytes(container.try_into().expect("8")),
        entry: u32::from_le_bytes(entry.try_into().expect("4")),
        len: u32::from_le_bytes(len.try_into().expect("4")),
        check: u64::from_le_bytes(fingerprint[..8].try_into().expect("8")),
    }
}
