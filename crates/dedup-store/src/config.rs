//! The repository config object (`config`): what identifies a directory as
//! a repository and fixes how its backups are cut. Written once by `init`.
//!
//! Body (after the frame's magic `DDUPREPO` and version 2): uuid (16),
//! segmenting kind (1: 0 fixed, 1 FastCDC), 3 zero bytes, size-or-min,
//! avg, max (u32 each; 0 for fixed), container target (u64), then the
//! compression of new segments (1: `Compression::code`) and 7 zero bytes.
//! Version 1 (still read) ends after the container target and means lz4.

use dedup_common::compress::Compression;

use crate::error::repo::{RepoError, RepoResult};
use crate::framed::{frame, unframe_any, Reader};
use crate::segmenter::Segmenting;

pub const CONFIG_OBJECT: &str = "config";
const MAGIC: [u8; 8] = *b"DDUPREPO";
const VERSION: u32 = 2;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoConfig {
    pub uuid: [u8; 16],
    pub segmenting: Segmenting,
    /// Target size of a container, bytes.
    pub container_target: u64,
    /// How new segments are compressed (each segment records its own, so
    /// this may change without rewriting anything).
    pub compression: Compression,
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
        body.extend_from_slice(&[self.compression.code(), 0, 0, 0, 0, 0, 0, 0]);
        frame(MAGIC, VERSION, &body)
    }

    pub fn decode(bytes: &[u8]) -> RepoResult<RepoConfig> {
        let (version, body) = unframe_any(CONFIG_OBJECT, MAGIC, 1..=VERSION, bytes)?;
        let mut r = Reader::new(CONFIG_OBJECT, body);
        let uuid: [u8; 16] = r.bytes(16)?.try_into().expect("16");
        let kind = r.bytes(4)?;
        let (a, b, c) = (r.u32()?, r.u32()?, r.u32()?);
        let container_target = r.u64()?;
        let corrupt = |d: String| RepoError::corrupt(CONFIG_OBJECT, d);
        let compression = if version >= 2 {
            let c = r.bytes(8)?;
            if c[1..] != [0; 7] {
                return Err(corrupt(format!(
                    "reserved bytes {:02x?} are not zero",
                    &c[1..]
                )));
            }
            Compression::from_code(c[0])
                .ok_or_else(|| corrupt(format!("unknown compression code {:#04x}", c[0])))?
        } else {
            Compression::Lz4
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
        }
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
