//! The plain placement (Dmdedup's own): one chunk per data block, the PBN
//! is the block. Allocation is the store's (`alloc_pbn`: sequential from
//! the last allocation), and freed blocks are reused as the store's space
//! manager allows (after the commit that freed them, for crash-safe stores).

use std::sync::Arc;

use super::{read_plain_runs, write_runs, NewChunk, Placement, ReadPiece};
use crate::backend::MetadataBackend;
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Pbn};
use crate::error::Result;

pub struct Plain {
    cfg: DeviceConfig,
    data: Arc<dyn BlockFile>,
}

impl Plain {
    pub fn new(cfg: &DeviceConfig, data: Arc<dyn BlockFile>) -> Plain {
        Plain {
            cfg: cfg.clone(),
            data,
        }
    }
}

impl Placement for Plain {
    fn compresses(&self) -> bool {
        false
    }

    fn alloc(
        &self,
        meta: &mut dyn MetadataBackend,
        _data: &[u8],
        _compressed: Option<&[u8]>,
    ) -> Result<Option<Pbn>> {
        meta.alloc_pbn()
    }

    fn write(&self, chunks: &[NewChunk]) -> Result<u64> {
        write_runs(&self.cfg, self.data.as_ref(), chunks)
    }

    fn read(&self, pieces: &[ReadPiece], buf: &mut [u8]) -> Result<u64> {
        read_plain_runs(&self.cfg, self.data.as_ref(), pieces, buf)
    }

    fn before_commit(&self, _meta: &mut dyn MetadataBackend, _closing: bool) -> Result<bool> {
        // Every chunk was written by `write`: make them durable before the
        // store commits mappings that name them.
        self.data.sync()?;
        Ok(true)
    }
}
