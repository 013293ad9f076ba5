//! Chunk fingerprints (Dmdedup §2.4 "Hashing"): a collision-resistant hash of a
//! chunk's bytes, the key of the hash index. The algorithm is chosen when the
//! device is created and recorded in its superblock; it never changes after.
//!
//! This module owns hashing only; it never touches the index or the disk.

use std::fmt;
use std::str::FromStr;

use md5::Md5;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Error;

/// Bytes reserved for a fingerprint in every structure. MD5 uses the first 16
/// and leaves the rest zero; one device never mixes algorithms.
pub const FINGERPRINT_BYTES: usize = 32;

// Clippy takes the hidden `Weak4` for a non-exhaustive marker; it is a
// real algorithm, for tests.
#[allow(clippy::manual_non_exhaustive)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HashAlgo {
    Blake3,
    Sha256,
    Md5,
    /// dedup-core's unit tests of verify mode only: 4 bits of fingerprint,
    /// so distinct chunks collide all the time and verify mode has to earn
    /// its keep. No name, JSON or on-disk code yields it (`from_code`,
    /// `FromStr` and serde refuse it; only those unit tests map its code
    /// back), so no real device or repository can have it, and a device
    /// made with it in a test cannot be reopened. It is compiled
    /// in rather than behind a feature because a test-only feature made
    /// Cargo build this crate and every crate above it twice.
    #[doc(hidden)]
    #[serde(skip_deserializing)]
    Weak4,
}

impl HashAlgo {
    pub const ALL: [HashAlgo; 3] = [HashAlgo::Blake3, HashAlgo::Sha256, HashAlgo::Md5];

    pub fn name(self) -> &'static str {
        match self {
            HashAlgo::Blake3 => "blake3",
            HashAlgo::Sha256 => "sha256",
            HashAlgo::Md5 => "md5",
            HashAlgo::Weak4 => "weak4",
        }
    }

    /// Stable code used in on-disk superblocks.
    pub fn code(self) -> u8 {
        match self {
            HashAlgo::Blake3 => 1,
            HashAlgo::Sha256 => 2,
            HashAlgo::Md5 => 3,
            HashAlgo::Weak4 => 0xf4,
        }
    }

    /// The algorithm an on-disk code names; never `Weak4`.
    pub fn from_code(code: u8) -> Option<HashAlgo> {
        HashAlgo::ALL.into_iter().find(|a| a.code() == code)
    }

    /// Length of the digest this algorithm produces.
    pub fn digest_len(self) -> usize {
        match self {
            HashAlgo::Blake3 | HashAlgo::Sha256 => 32,
            HashAlgo::Md5 => 16,
            HashAlgo::Weak4 => 1,
        }
    }

    /// Fingerprint one chunk.
    pub fn fingerprint(self, chunk: &[u8]) -> Fingerprint {
        let mut bytes = [0u8; FINGERPRINT_BYTES];
        match self {
            HashAlgo::Blake3 => bytes.copy_from_slice(blake3::hash(chunk).as_bytes()),
            HashAlgo::Sha256 => bytes.copy_from_slice(&Sha256::digest(chunk)),
            HashAlgo::Md5 => bytes[..16].copy_from_slice(&Md5::digest(chunk)),
            HashAlgo::Weak4 => bytes[0] = blake3::hash(chunk).as_bytes()[0] & 0x0f,
        }
        Fingerprint(bytes)
    }

    /// `fingerprint` of each chunk, in order: BLAKE3 hashes short chunks
    /// side by side (`blake3_batch`), several times faster than one by
    /// one for chunks of a few KiB.
    pub fn fingerprint_many(self, chunks: &[&[u8]]) -> Vec<Fingerprint> {
        match self {
            HashAlgo::Blake3 => (crate::blake3_batch::hash_many(chunks).into_iter())
                .map(Fingerprint)
                .collect(),
            _ => chunks.iter().map(|c| self.fingerprint(c)).collect(),
        }
    }
}

impl fmt::Display for HashAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for HashAlgo {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        HashAlgo::ALL
            .into_iter()
            .find(|a| a.name() == s.to_ascii_lowercase())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown hash {s:?}: choose one of blake3 (default), sha256, md5"
                ))
            })
    }
}

/// A chunk's fingerprint. Its bytes are uniformly distributed, so any slice of
/// them is a good hash-table key (the sparse store relies on that).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; FINGERPRINT_BYTES]);

impl Fingerprint {
    /// The first 8 bytes as an integer: a ready-made hash for tables and lock stripes.
    pub fn prefix_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(b)
    }

    pub fn to_hex(&self, algo: HashAlgo) -> String {
        self.0[..algo.digest_len()]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex(HashAlgo::Blake3))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_of_many_are_each_ones() {
        let data: Vec<u8> = (0..40_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let chunks: Vec<&[u8]> = [0, 1, 1024, 1025, 4096, 8191, 12_345, 32_768]
            .iter()
            .map(|&l| &data[..l])
            .collect();
        for a in HashAlgo::ALL {
            let one_by_one: Vec<Fingerprint> = chunks.iter().map(|c| a.fingerprint(c)).collect();
            assert_eq!(a.fingerprint_many(&chunks), one_by_one, "{a}");
        }
    }

    #[test]
    fn known_digests() {
        assert_eq!(
            HashAlgo::Md5.fingerprint(b"").to_hex(HashAlgo::Md5),
            "d41d8cd98f00b204e9800998ecf8427e"
        );
        assert_eq!(
            HashAlgo::Sha256
                .fingerprint(b"abc")
                .to_hex(HashAlgo::Sha256),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            HashAlgo::Blake3.fingerprint(b"").to_hex(HashAlgo::Blake3),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }

    #[test]
    fn codes_and_names_round_trip() {
        for a in HashAlgo::ALL {
            assert_eq!(HashAlgo::from_code(a.code()), Some(a));
            assert_eq!(a.name().parse::<HashAlgo>().unwrap(), a);
        }
        assert!(HashAlgo::from_code(0).is_none());
        // The test-only hash is never read back from a name, a code or JSON.
        assert!(HashAlgo::from_code(HashAlgo::Weak4.code()).is_none());
        assert!("weak4".parse::<HashAlgo>().is_err());
        assert!(serde_json::from_str::<HashAlgo>("\"weak4\"").is_err());
        assert!("crc32".parse::<HashAlgo>().is_err());
    }
}
