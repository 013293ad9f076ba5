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
//! recipe of a stream of zeros). All three are read.

use dedup_core::fingerprint::Fingerprint;

use crate::framed::{frame, frame_zstd, unframe_any, unzstd, Reader};
use crate::repo_error::{RepoError, RepoResult};

const MAGIC: [u8; 8] = *b"DDUPRCPE";
/// Columns, compressed.
const VERSION: u32 = 3;
/// Rows, compressed.
const ROWS_VERSION: u32 = 2;
/// Rows, plain.
const PLAIN_VERSION: u32 = 1;
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
        let mut body = self.body_head();
        let refs = &self.segments;
        refs.iter()
            .for_each(|s| body.extend_from_slice(&s.container.to_le_bytes()));
        refs.iter()
            .for_each(|s| body.extend_from_slice(&s.entry.to_le_bytes()));
        refs.iter()
            .for_each(|s| body.extend_from_slice(&s.len.to_le_bytes()));
        refs.iter()
            .for_each(|s| body.extend_from_slice(&s.fingerprint.0));
        frame_zstd(MAGIC, VERSION, &body).unwrap_or_else(|| self.encode_plain())
    }

    /// Version 1: rows, plain.
    fn encode_plain(&self) -> Vec<u8> {
        let mut body = self.body_head();
        for s in &self.segments {
            body.extend_from_slice(&s.container.to_le_bytes());
            body.extend_from_slice(&s.entry.to_le_bytes());
            body.extend_from_slice(&s.len.to_le_bytes());
            body.extend_from_slice(&s.fingerprint.0);
        }
        frame(MAGIC, PLAIN_VERSION, &body)
    }

    /// Room for the whole body, and its stream length and count.
    fn body_head(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(16 + self.segments.len() * REF_LEN);
        body.extend_from_slice(&self.stream_len.to_le_bytes());
        body.extend_from_slice(&(self.segments.len() as u64).to_le_bytes());
        body
    }

    /// Decode the recipe object `object`, checking that the counts and
    /// lengths agree before allocating for them.
    pub fn decode(object: &str, bytes: &[u8]) -> RepoResult<Recipe> {
        let (version, framed) = unframe_any(object, MAGIC, PLAIN_VERSION..=VERSION, bytes)?;
        let unpacked;
        let body = if version == PLAIN_VERSION {
            framed
        } else {
            unpacked = unzstd(object, framed)?;
            &unpacked[..]
        };
        let mut r = Reader::new(object, body);
        let stream_len = r.u64()?;
        let count = r.u64()?;
        let expected = (count as u128) * REF_LEN as u128 + 16;
        if expected != body.len() as u128 {
            return Err(RepoError::corrupt(
                object,
                format!("{count} segments do not fit its {} bytes", body.len()),
            ));
        }
        let refs = &body[16..];
        let segments: Vec<SegmentRef> = if version == ROWS_VERSION || version == PLAIN_VERSION {
            refs.chunks_exact(REF_LEN).map(row).collect()
        } else {
            let n = count as usize;
            let (containers, rest) = refs.split_at(8 * n);
            let (entries, rest) = rest.split_at(4 * n);
            let (lens, fingerprints) = rest.split_at(4 * n);
            containers
                .chunks_exact(8)
                .zip(entries.chunks_exact(4))
                .zip(lens.chunks_exact(4))
                .zip(fingerprints.chunks_exact(32))
                .map(|(((c, e), l), f)| reference(c, e, l, f))
                .collect()
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
