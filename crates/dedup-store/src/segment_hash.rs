//! How a repository names its segments: BLAKE3 of the bytes, or, in an
//! encrypted repository, BLAKE3 keyed with a key derived from the
//! repository's master key (`crypto::keys`). Keyed, a fingerprint tells a
//! reader without the key nothing about the bytes (not even whether they
//! are a well-known file's), yet every writer holding the key names the
//! same bytes the same way, so deduplication across them is unchanged.
//!
//! Keyed, the key is applied in one of two ways, fixed by the config
//! (`config::KeyedOf`):
//! - to the bytes themselves (encrypted repositories made before config
//!   version 3);
//! - to the bytes' plain BLAKE3 (the default since): one more 32-byte
//!   keyed hash per segment, and what lets a device that keeps plain
//!   BLAKE3 fingerprints name an encrypted repository's segments without
//!   reading them (`from_plain`). Equal fingerprints still mean equal
//!   plain digests, so the fingerprints reveal exactly what the first
//!   way's do: which segments are equal, to a reader without the key.

use std::fmt;

use dedup_common::blake3_batch;
use dedup_common::fingerprint::Fingerprint;

use crate::config::KeyedOf;
use crate::writer::HASH;

#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SegmentHash {
    key: Option<([u8; 32], KeyedOf)>,
}

impl SegmentHash {
    /// Plain BLAKE3: a repository that is not encrypted.
    pub const PLAIN: SegmentHash = SegmentHash { key: None };

    /// Keyed BLAKE3 with `key`, over what `of` says.
    pub fn keyed(key: [u8; 32], of: KeyedOf) -> SegmentHash {
        SegmentHash {
            key: Some((key, of)),
        }
    }

    pub fn is_keyed(&self) -> bool {
        self.key.is_some()
    }

    /// The key and what it is applied to, if keyed: what a client of
    /// `store serve` must hash with.
    pub fn key(&self) -> Option<([u8; 32], KeyedOf)> {
        self.key
    }

    /// The fingerprint of one segment.
    pub fn of(&self, data: &[u8]) -> Fingerprint {
        match &self.key {
            None => HASH.fingerprint(data),
            Some((k, KeyedOf::Bytes)) => Fingerprint(*blake3::keyed_hash(k, data).as_bytes()),
            Some((k, KeyedOf::PlainDigest)) => keyed_digest(k, &HASH.fingerprint(data)),
        }
    }

    /// `of` each segment, in order, side by side in BLAKE3's lanes.
    pub fn of_many(&self, data: &[&[u8]]) -> Vec<Fingerprint> {
        match &self.key {
            None => HASH.fingerprint_many(data),
            Some((k, KeyedOf::Bytes)) => (blake3_batch::keyed_hash_many(k, data).into_iter())
                .map(Fingerprint)
                .collect(),
            Some((k, KeyedOf::PlainDigest)) => {
                let plain = HASH.fingerprint_many(data);
                let digests: Vec<&[u8]> = plain.iter().map(|f| &f.0[..]).collect();
                (blake3_batch::keyed_hash_many(k, &digests).into_iter())
                    .map(Fingerprint)
                    .collect()
            }
        }
    }

    /// The fingerprint of the segment whose plain BLAKE3 is `plain`, if
    /// this hash can tell it without the bytes (plain, or keyed over the
    /// plain digest).
    pub fn from_plain(&self, plain: &Fingerprint) -> Option<Fingerprint> {
        match &self.key {
            None => Some(*plain),
            Some((_, KeyedOf::Bytes)) => None,
            Some((k, KeyedOf::PlainDigest)) => Some(keyed_digest(k, plain)),
        }
    }
}

fn keyed_digest(key: &[u8; 32], plain: &Fingerprint) -> Fingerprint {
    Fingerprint(*blake3::keyed_hash(key, &plain.0).as_bytes())
}

/// Never the key.
impl fmt::Debug for SegmentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.key {
            None => "BLAKE3",
            Some((_, KeyedOf::Bytes)) => "keyed BLAKE3",
            Some((_, KeyedOf::PlainDigest)) => "keyed BLAKE3 of BLAKE3",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_way_hashes_one_and_many_alike_and_only_the_digest_way_names_from_plain() {
        let data: Vec<Vec<u8>> = (0..9u8).map(|i| vec![i; 4096 + usize::from(i)]).collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
        let key = [7u8; 32];
        let ways = [
            SegmentHash::PLAIN,
            SegmentHash::keyed(key, KeyedOf::Bytes),
            SegmentHash::keyed(key, KeyedOf::PlainDigest),
        ];
        for h in ways {
            let many = h.of_many(&refs);
            for (d, fp) in refs.iter().zip(&many) {
                assert_eq!(h.of(d), *fp, "{h:?}");
                let plain = HASH.fingerprint(d);
                match h.from_plain(&plain) {
                    Some(named) => assert_eq!(named, *fp, "{h:?}"),
                    None => assert_eq!(h, ways[1]),
                }
            }
        }
        // Each way is its formula (FORMATS), and the three differ.
        let d = refs[0];
        let fps: Vec<Fingerprint> = ways.iter().map(|h| h.of(d)).collect();
        assert_eq!(fps[0].0, *blake3::hash(d).as_bytes());
        assert_eq!(fps[1].0, *blake3::keyed_hash(&key, d).as_bytes());
        let digest = blake3::hash(d);
        assert_eq!(
            fps[2].0,
            *blake3::keyed_hash(&key, digest.as_bytes()).as_bytes()
        );
        assert!(fps[0] != fps[1] && fps[1] != fps[2] && fps[0] != fps[2]);
    }
}
