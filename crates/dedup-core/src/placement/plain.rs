//! The plain placement (Dmdedup's own): one chunk per data block, the PBN
//! is the block. Allocation is the store's (`alloc_pbn`: sequential from
//! the last allocation), and freed blocks are reused as the store's space
//! manager allows (after the commit that freed them, for crash-safe stores).

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{
    punch_blocks, read_plain_runs, write_runs, NewChunk, Placement, PlacementStats, ReadPiece,
};
use crate::backend::MetadataBackend;
use crate::blockfile::written::Listed;
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Pbn};
use crate::error::{Error, Result};

pub struct Plain {
    cfg: DeviceConfig,
    data: Arc<dyn BlockFile>,
    /// Blocks freed since the last commit, punched once it is durable.
    /// Sorted, so adjacent blocks go out as one punch.
    freed: Mutex<BTreeSet<Pbn>>,
    /// The store's commits are durable (crash-safe backends). INRAM's are
    /// not: after a crash it rolls back to its last clean stop, whose
    /// mappings may name blocks freed since, so it punches nothing.
    punch: bool,
    /// Why a sync of the data device failed, once one has. The kernel may
    /// have dropped the pages that sync was to make durable (Linux reports
    /// a write-back error once, and a later sync succeeds), so nothing is
    /// written or committed after it: a commit would map chunks whose
    /// bytes may be gone, and a FLUSH would say they are safe. A restart
    /// goes back to the last commit, whose chunks were synced.
    failed: Mutex<Option<String>>,
}

/// Most freed blocks remembered for punching: past this a commit is long
/// overdue (or the store never commits, INRAM), and the rest simply stay
/// allocated on the host, which costs space, never correctness.
const MAX_PENDING_PUNCHES: usize = 1 << 20;

impl Plain {
    pub fn new(cfg: &DeviceConfig, data: Arc<dyn BlockFile>, punch: bool) -> Plain {
        Plain {
            cfg: cfg.clone(),
            data,
            freed: Mutex::new(BTreeSet::new()),
            punch,
            failed: Mutex::new(None),
        }
    }

    fn usable(&self) -> Result<()> {
        match &*self.failed.lock() {
            None => Ok(()),
            Some(why) => Err(Error::Io {
                context: format!(
                    "syncing the data device failed earlier ({why}); the writes since the last FLUSH that succeeded may be lost, so the device takes no more writes: stop it and start it again (crash-safe backends go back to their last commit; inram to its last clean stop, with --accept-unclean)"
                ),
                cause: std::io::Error::other("data sync failed"),
            }),
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
        let pbn = meta.alloc_pbn()?;
        if let Some(p) = pbn {
            // A store that does not quarantine (INRAM) may hand a block
            // freed in this transaction straight back: it must not be
            // punched under its new chunk.
            let mut freed = self.freed.lock();
            if !freed.is_empty() {
                freed.remove(&p);
            }
        }
        Ok(pbn)
    }

    fn write(&self, chunks: &[NewChunk]) -> Result<u64> {
        self.usable()?;
        write_runs(&self.cfg, self.data.as_ref(), chunks)
    }

    fn read(&self, pieces: &[ReadPiece], buf: &mut [u8]) -> Result<u64> {
        read_plain_runs(&self.cfg, self.data.as_ref(), pieces, buf)
    }

    fn before_commit(&self, meta: &mut dyn MetadataBackend, _closing: bool) -> Result<bool> {
        // Every chunk was written by `write`: make them durable before the
        // store commits mappings that name them.
        self.write_unsynced(meta)?;
        self.sync_written()?;
        Ok(true)
    }

    fn write_unsynced(&self, _meta: &mut dyn MetadataBackend) -> Result<bool> {
        // `write` wrote every chunk already.
        self.usable()?;
        Ok(true)
    }

    fn live_blocks(
        &self,
        meta: &mut dyn MetadataBackend,
        listed: Vec<Listed>,
    ) -> Result<Option<Vec<Listed>>> {
        let mut live = Vec::with_capacity(listed.len());
        for (offset, d) in listed {
            if meta.refcount_get(self.cfg.pbn_at(offset))? > 0 {
                live.push((offset, d));
            }
        }
        Ok(Some(live))
    }

    fn sync_written(&self) -> Result<()> {
        if let Err(e) = self.data.sync() {
            self.failed.lock().get_or_insert_with(|| e.to_string());
            return Err(e);
        }
        Ok(())
    }

    fn freed(&self, pbn: Pbn) {
        if !self.punch {
            return;
        }
        let mut freed = self.freed.lock();
        if freed.len() < MAX_PENDING_PUNCHES {
            freed.insert(pbn);
        }
    }

    fn revived(&self, pbn: Pbn) -> Result<()> {
        self.freed.lock().remove(&pbn);
        Ok(())
    }

    /// The commit that freed the blocks is durable: no committed mapping
    /// names them, so a crash cannot bring back a reference to a hole.
    /// The metadata mutex is held, so no allocation reuses one meanwhile.
    fn after_commit(&self, _meta: &mut dyn MetadataBackend, committed: bool) -> Result<()> {
        if !committed {
            return Ok(());
        }
        let mut blocks: Vec<Pbn> = std::mem::take(&mut *self.freed.lock())
            .into_iter()
            .collect();
        punch_blocks(&self.cfg, self.data.as_ref(), &mut blocks);
        Ok(())
    }

    fn stats(&self) -> PlacementStats {
        PlacementStats {
            // One stat(2): cheap enough for every `status`. Unknown if it fails.
            data_allocated: self.data.allocated().ok().flatten(),
            ..Default::default()
        }
    }
}
