//! File recipes (§3.1): a backed-up stream's segments in order, each as
//! the container and catalog entry that hold it, so a restore reads the
//! containers directly and needs no index. Each reference also carries the
//! segment's length and fingerprint, so a restore checks every segment
//! against what was backed up, not only against its container's catalog.
//!
//! Object `recipes/<backup>-<nonce>`; body after the frame (magic
//! `DDUPRCPE`): stream length (u64), segment count n (u64), then the n
//! references. Version 3 (written since 2026-11-25) stores them by column
//! (n container ids, n entries, n lengths, n fingerprints) and compresses
//! the body with zstd (see `framed::frame_zstd`): the fingerprints of new
//! data do not compress, and apart from them zstd has runs of like numbers
//! to work on. On the recipe of a 512 MiB image it compressed at
//! 2.5 GB/s, not 157 MB/s as rows did (at the end of a 2 GiB backup, when
//! nothing else runs, the pause fell from 0.22 s to 0.08 s), and 6 %
//! smaller. Version 2 is the rows of 48 bytes (container u64, entry u32,
//! length u32, fingerprint 32) compressed; version 1 the same rows plain,
//! still written for a body that would expand more than 64 times (the
//! recipe of a stream of zeros). All three are read. A recipe too long for
//! one part is written in parts of this format, named by an index
//! (version 4, `recipe_parts.rs`).

use std::io::Read;

use dedup_core::fingerprint::Fingerprint;

use crate::framed::{frame, frame_zstd, undecompressable, unframe_any, unzstd, unzstd_reader};
use crate::repo_error::{RepoError, RepoResult};

pub(crate) const MAGIC: [u8; 8] = *b"DDUPRCPE";
/// Columns, compressed.
pub(crate) const VERSION: u32 = 3;
/// Rows, compressed.
const ROWS_VERSION: u32 = 2;
/// Rows, plain.
pub(crate) const PLAIN_VERSION: u32 = 1;
/// A reference's bytes, in either layout.
const REF_LEN: usize = 48;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentRef {
    pub container: u64,
    pub entry: u32,
    pub len: u32,
    pub fingerprint: Fingerprint,
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
    /// recipe is 48 bytes a segment in RAM (12 MiB a GiB of 4 KiB
    /// segments), and the body and its compressed copy would otherwise sit
    /// beside it.
    pub fn into_encoded(self) -> Vec<u8> {
        let body = self.columns();
        drop(self);
        encode_body(body)
    }

    /// The raw body of version 3: stream length, count, then the columns.
    fn columns(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(16 + self.segments.len() * REF_LEN);
        body.extend_from_slice(&self.stream_len.to_le_bytes());
        body.extend_from_slice(&(self.segments.len() as u64).to_le_bytes());
        let refs = &self.segments;
        refs.iter()
            .for_each(|s| body.extend_from_slice(&s.container.to_le_bytes()));
        refs.iter()
            .for_each(|s| body.extend_from_slice(&s.entry.to_le_bytes()));
        refs.iter()
            .for_each(|s| body.extend_from_slice(&s.len.to_le_bytes()));
        refs.iter()
            .for_each(|s| body.extend_from_slice(&s.fingerprint.0));
        body
    }

    /// Decode the recipe object `object`, checking that the counts and
    /// lengths agree before allocating for them.
    pub fn decode(object: &str, bytes: &[u8]) -> RepoResult<Recipe> {
        let (version, framed) = unframe_any(object, MAGIC, PLAIN_VERSION..=VERSION, bytes)?;
        Recipe::decode_body(object, version, framed)
    }

    /// `decode` of a frame already checked: its version (1 to 3) and body.
    pub(crate) fn decode_body(object: &str, version: u32, framed: &[u8]) -> RepoResult<Recipe> {
        let (stream_len, segments) = match version {
            PLAIN_VERSION => decode_rows(object, framed)?,
            ROWS_VERSION => decode_rows(object, &unzstd(object, framed)?)?,
            _ => decode_columns(object, framed)?,
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

/// Frame a version 3 body compressed, or, if it would expand too much on
/// reading (the recipe of a stream of zeros), its rows plain as version 1.
fn encode_body(body: Vec<u8>) -> Vec<u8> {
    if let Some(framed) = frame_zstd(MAGIC, VERSION, &body) {
        return framed;
    }
    let n = (body.len() - 16) / REF_LEN;
    let (head, columns) = body.split_at(16);
    let (containers, rest) = columns.split_at(8 * n);
    let (entries, rest) = rest.split_at(4 * n);
    let (lens, fingerprints) = rest.split_at(4 * n);
    let mut rows = Vec::with_capacity(body.len());
    rows.extend_from_slice(head);
    for i in 0..n {
        rows.extend_from_slice(&containers[8 * i..8 * i + 8]);
        rows.extend_from_slice(&entries[4 * i..4 * i + 4]);
        rows.extend_from_slice(&lens[4 * i..4 * i + 4]);
        rows.extend_from_slice(&fingerprints[32 * i..32 * i + 32]);
    }
    frame(MAGIC, PLAIN_VERSION, &rows)
}

/// The stream length and count of a body `len` bytes long, refused unless
/// the count's references fill it exactly.
fn head(object: &str, head: &[u8; 16], len: u64) -> RepoResult<(u64, usize)> {
    let stream_len = u64::from_le_bytes(head[..8].try_into().expect("8"));
    let count = u64::from_le_bytes(head[8..].try_into().expect("8"));
    if (count as u128) * REF_LEN as u128 + 16 != u128::from(len) {
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
    let (stream_len, _) = head(object, first, body.len() as u64)?;
    Ok((
        stream_len,
        body[16..].chunks_exact(REF_LEN).map(row).collect(),
    ))
}

/// A compressed body of columns (version 3), decoded as it decompresses,
/// so the raw body is never held beside the references.
fn decode_columns(object: &str, framed: &[u8]) -> RepoResult<(u64, Vec<SegmentRef>)> {
    let (raw_len, mut raw) = unzstd_reader(object, framed)?;
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
    let (stream_len, n) = head(object, &first, raw_len)?;
    let blank = SegmentRef {
        container: 0,
        entry: 0,
        len: 0,
        fingerprint: Fingerprint([0; 32]),
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
    column(32, &mut |s, b| {
        s.fingerprint = Fingerprint(b.try_into().expect("32"))
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
        fingerprint: Fingerprint(fingerprint.try_into().expect("32")),
    }
}
