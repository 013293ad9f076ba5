//! The repository config object (`config`): what identifies a directory as
//! a repository and fixes how its backups are cut. Written once by `init`.
//!
//! Body (after the frame's magic `DDUPREPO` and version 1): uuid (16),
//! segmenting kind (1: 0 fixed, 1 FastCDC), 3 zero bytes, size-or-min,
//! avg, max (u32 each; 0 for fixed), container target (u64).

use crate::framed::{frame, unframe, Reader};
use crate::repo_error::{RepoError, RepoResult};
use crate::segmenter::Segmenting;

pub const CONFIG_OBJECT: &str = "config";
const MAGIC: [u8; 8] = *b"DDUPREPO";
const VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoConfig {
    pub uuid: [u8; 16],
    pub segmenting: Segmenting,
    /// Target size of a container, bytes.
    pub container_target: u64,
}

impl RepoConfig {
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
        frame(MAGIC, VERSION, &body)
    }

    pub fn decode(bytes: &[u8]) -> RepoResult<RepoConfig> {
        let body = unframe(CONFIG_OBJECT, MAGIC, VERSION, bytes)?;
        let mut r = Reader::new(CONFIG_OBJECT, body);
        let uuid: [u8; 16] = r.bytes(16)?.try_into().expect("16");
        let kind = r.bytes(4)?;
        let (a, b, c) = (r.u32()?, r.u32()?, r.u32()?);
        let container_target = r.u64()?;
        r.finish()?;
        let corrupt = |d: String| RepoError::corrupt(CONFIG_OBJECT, d);
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
        })
    }
}
