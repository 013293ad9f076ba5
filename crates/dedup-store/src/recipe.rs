//! File recipes (§3.1): a backed-up stream's segments in order, each as
//! the container and catalog entry that hold it, so a restore reads the
//! containers directly and needs no index. Each reference also carries the
//! segment's length and fingerprint, so a restore checks every segment
//! against what was backed up, not only against its container's catalog.
//!
//! Object `recipes/<backup>-<nonce>`; body after the frame (magic
//! `DDUPRCPE`): stream length (u64), segment count n (u64), then n × 48
//! bytes: container id (u64), entry (u32), length (u32), fingerprint (32).
//! Version 2 (written since 2026-11-25) keeps that body compressed with
//! zstd (see `framed::frame_compressed`); version 1 keeps it as is, and is
//! still written for a body that would expand more than 64 times (the
//! recipe of a stream of zeros), and read.

use dedup_core::fingerprint::Fingerprint;

use crate::framed::{frame_compressed, unframe_compressed, Reader};
use crate::repo_error::{RepoError, RepoResult};

const MAGIC: [u8; 8] = *b"DDUPRCPE";
const VERSION: u32 = 2;
/// The version that kept the body uncompressed.
const PLAIN_VERSION: u32 = 1;
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
        let mut body = Vec::with_capacity(16 + self.segments.len() * REF_LEN);
        body.extend_from_slice(&self.stream_len.to_le_bytes());
        body.extend_from_slice(&(self.segments.len() as u64).to_le_bytes());
        for s in &self.segments {
            body.extend_from_slice(&s.container.to_le_bytes());
            body.extend_from_slice(&s.entry.to_le_bytes());
            body.extend_from_slice(&s.len.to_le_bytes());
            body.extend_from_slice(&s.fingerprint.0);
        }
        frame_compressed(MAGIC, PLAIN_VERSION, VERSION, &body)
    }

    /// Decode the recipe object `object`, checking that the counts and
    /// lengths agree before allocating for them.
    pub fn decode(object: &str, bytes: &[u8]) -> RepoResult<Recipe> {
        let body = unframe_compressed(object, MAGIC, PLAIN_VERSION, VERSION, bytes)?;
        let body = &body[..];
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
        let mut segments = Vec::with_capacity(count as usize);
        let mut total = 0u64;
        for _ in 0..count {
            let container = r.u64()?;
            let entry = r.u32()?;
            let len = r.u32()?;
            let fingerprint = Fingerprint(r.bytes(32)?.try_into().expect("32"));
            total += u64::from(len);
            segments.push(SegmentRef {
                container,
                entry,
                len,
                fingerprint,
            });
        }
        r.finish()?;
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
