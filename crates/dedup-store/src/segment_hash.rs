//! How a repository names its segments: BLAKE3 of the bytes, or, in an
//! encrypted repository, BLAKE3 keyed with a key derived from the
//! repository's master key (`crypto::keys`). Keyed, a fingerprint tells a
//! reader without the key nothing about the bytes (not even whether they
//! are a well-known file's), yet every writer holding the key names the
//! same bytes the same way, so deduplication across them is unchanged.

use std::fmt;

use dedup_common::blake3_batch;
use dedup_common::fingerprint::Fingerprint;

use crate::writer::HASH;

#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SegmentHash {
    key: Option<[u8; 32]>,
}

impl SegmentHash {
    /// Plain BLAKE3: a repository that is not encrypted.
    pub const PLAIN: SegmentHash = SegmentHash { key: None };

    pub fn keyed(key: [u8; 32]) -> SegmentHash {
        SegmentHash { key: Some(key) }
    }

    pub fn is_keyed(&self) -> bool {
        self.key.is_some()
    }

    /// The key, if keyed: what a client of `store serve` must hash with.
    pub fn key(&self) -> Option<[u8; 32]> {
        self.key
    }

    /// The fingerprint of one segment.
    pub fn of(&self, data: &[u8]) -> Fingerprint {
        match &self.key {
            None => HASH.fingerprint(data),
            Some(k) => Fingerprint(*blake3::keyed_hash(k, data).as_bytes()),
        }
    }

    /// `of` each segment, in order, side by side in BLAKE3's lanes.
    pub fn of_many(&self, data: &[&[u8]]) -> Vec<Fingerprint> {
        match &self.key {
            None => HASH.fingerprint_many(data),
            Some(k) => (blake3_batch::keyed_hash_many(k, data).into_iter())
                .map(Fingerprint)
                .collect(),
        }
    }
}

/// Never the key.
impl fmt::Debug for SegmentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_keyed() {
            "keyed BLAKE3"
        } else {
            "BLAKE3"
        })
    }
}
