//! The repository config object (`config`): what identifies a directory as
//! a repository and fixes how its backups are cut. Written once by `init`.
//!
//! Body (after the frame's magic `DDUPREPO` and version 2): uuid (16),
//! segmenting kind (1: 0 fixed, 1 FastCDC), 3 zero bytes, size-or-min,
//! avg, max (u32 each; 0 for fixed), container target (u64), then the
//! compression of new segments (1: `Compression::code`) and 7 zero bytes.
//! Version 1 (still read) ends after the container target and means lz4.
//! Version 3 is version 2 with the first of those 7 bytes saying what an
//! encrypted repository's fingerprints key (`KeyedOf::code`); a config
//! of version 2 or 1 keys the bytes. A config is written as version 2
//! where that is what it says, so older builds still open it, and as
//! version 3 only where they would hash wrongly (and so must refuse it).

use dedup_common::compress::Compression;

use crate::error::repo::{RepoError, RepoResult};
use crate::framed::{frame, unframe_any, Reader};
use crate::segmenter::Segmenting;

pub const CONFIG_OBJECT: &str = "config";
const MAGIC: [u8; 8] = *b"DDUPREPO";
const VERSION: u32 = 3;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoConfig {
    pub uuid: [u8; 16],
    pub segmenting: Segmenting,
    /// Target size of a container, bytes.
    pub container_target: u64,
    /// How new segments are compressed (each segment records its own, so
    /// this may change without rewriting anything).
    pub compression: Compression,
    /// What an encrypted repository's keyed fingerprints are taken over
    /// (`segment_hash.rs`); a repository in the clear ignores it.
    pub keyed_of: KeyedOf,
}

/// What an encrypted repository's keyed BLAKE3 fingerprints hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyedOf {
    /// The segment's bytes: repositories made before config version 3.
    Bytes,
    /// The segment's plain BLAKE3, so a fingerprint can be had from a
    /// device's plain one without the bytes: the default since.
    PlainDigest,
}

impl KeyedOf {
    fn code(self) -> u8 {
        match self {
            KeyedOf::Bytes => 0,
            KeyedOf::PlainDigest => 1,
        }
    }

    fn from_code(code: u8) -> Option<KeyedOf> {
        match code {
            0 => Some(KeyedOf::Bytes),
            1 => Some(KeyedOf::PlainDigest),
            _ => None,
        }
    }
}

impl RepoConfig {
    /// Whether `bytes` (the `config` object as stored) is a config in the
    /// clear, not one sealed in an encrypted repository.
    pub fn is_in_the_clear(bytes: &[u8]) -> bool {
        bytes.starts_with(&MAGIC)
    }

    pub fn encode(&self) -> Vec<u8> {
        let (kind, a, b, c) = match self.segmenting {
            Segmenting::Fixed { size } => (0u8, size, 0, 0),
            Segmenting::FastCdc { min, avg, max } => (1u8, min, avg, max),
        };
        let mut body = Vec::with_capacity(48);
        body.extend_from_slice(&self.uuid);
        body.extend_from_slice(&[kind, 0, 0, 0]);
        for v in [a, b, c] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend_from_slice(&self.container_target.to_le_bytes());
        let keyed = self.keyed_of.code();
        body.extend_from_slice(&[self.compression.code(), keyed, 0, 0, 0, 0, 0, 0]);
        frame(MAGIC, if keyed == 0 { 2 } else { VERSION }, &body)
    }

    pub fn decode(bytes: &[u8]) -> RepoResult<RepoConfig> {
        let (version, body) = unframe_any(CONFIG_OBJECT, MAGIC, 1..=VERSION, bytes)?;
        let mut r = Reader::new(CONFIG_OBJECT, body);
        let uuid: [u8; 16] = r.bytes(16)?.try_into().expect("16");
        let kind = r.bytes(4)?;
        let (a, b, c) = (r.u32()?, r.u32()?, r.u32()?);
        let container_target = r.u64()?;
        let corrupt = |d: String| RepoError::corrupt(CONFIG_OBJECT, d);
        let (compression, keyed_of) = if version >= 2 {
            let c = r.bytes(8)?;
            // Version 2 has no keyed byte: there it is reserved, zero.
            let reserved = if version >= 3 { &c[2..] } else { &c[1..] };
            if reserved.iter().any(|&b| b != 0) {
                return Err(corrupt(format!(
                    "reserved bytes {reserved:02x?} are not zero"
                )));
            }
            let compression = Compression::from_code(c[0])
                .ok_or_else(|| corrupt(format!("unknown compression code {:#04x}", c[0])))?;
            let keyed_of = KeyedOf::from_code(c[1]).ok_or_else(|| {
                corrupt(format!("unknown way of keying fingerprints {:#04x}", c[1]))
            })?;
            (compression, keyed_of)
        } else {
            (Compression::Lz4, KeyedOf::Bytes)
        };
        r.finish()?;
        let segmenting = match kind {
            [0, 0, 0, 0] => Segmenting::Fixed { size: a },
            [1, 0, 0, 0] => Segmenting::FastCdc {
                min: a,
                avg: b,
                max: c,
            },
            _ => return Err(corrupt(format!("unknown segmenting {kind:02x?}"))),
        };
        segmenting.check().map_err(corrupt)?;
        if container_target == 0 {
            return Err(corrupt("container target is 0".into()));
        }
        Ok(RepoConfig {
            uuid,
            segmenting,
            container_target,
            compression,
            keyed_of,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framed::frame;

    fn config(compression: Compression) -> RepoConfig {
        RepoConfig {
            uuid: [7; 16],
            segmenting: Segmenting::DEFAULT,
            container_target: 1 << 20,
            compression,
            keyed_of: KeyedOf::Bytes,
        }
    }

    #[test]
    fn keyed_over_the_plain_digest_is_version_3_and_bytes_stays_version_2() {
        let bytes = config(Compression::Lz4).encode();
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 2);
        let digest = RepoConfig {
            keyed_of: KeyedOf::PlainDigest,
            ..config(Compression::Lz4)
        };
        let bytes = digest.encode();
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 3);
        assert_eq!(RepoConfig::decode(&bytes).unwrap(), digest);
        // Version 2 with the keyed byte set: a reserved byte, refused.
        let mut body = bytes[12..bytes.len() - 4].to_vec();
        let e = RepoConfig::decode(&frame(MAGIC, 2, &body)).unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        let at = body.len() - 7;
        body[at] = 9;
        let e = RepoConfig::decode(&frame(MAGIC, 3, &body)).unwrap_err();
        assert!(e.to_string().contains("keying fingerprints"), "{e}");
    }

    #[test]
    fn configs_round_trip_and_version_1_means_lz4() {
        for c in [Compression::None, Compression::Lz4, Compression::Zstd(3)] {
            assert_eq!(RepoConfig::decode(&config(c).encode()).unwrap(), config(c));
        }
        let v2 = config(Compression::Lz4).encode();
        let v1 = frame(MAGIC, 1, &v2[12..v2.len() - 4 - 8]);
        assert_eq!(RepoConfig::decode(&v1).unwrap(), config(Compression::Lz4));
    }

    #[test]
    fn an_unknown_compression_is_refused_by_name() {
        let v2 = config(Compression::Lz4).encode();
        let mut body = v2[12..v2.len() - 4].to_vec();
        let at = body.len() - 8;
        body[at] = 0x7e;
        let e = RepoConfig::decode(&frame(MAGIC, 2, &body)).unwrap_err();
        assert!(e.to_string().contains("compression"), "{e}");
    }
}
