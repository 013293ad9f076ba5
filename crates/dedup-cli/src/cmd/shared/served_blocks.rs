//! A served dedup device as blocks, through a snapshot its server keeps
//! for the backup (`dedup_core::control::snapshot`): the LBN map frozen at
//! one instant while clients go on writing. The snapshot ends when this
//! is dropped or, once the backup has committed, when the tracking
//! restarts from its mark.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use dedup_core::control::snapshot::SnapshotClient;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::Changes;
use dedup_store::backup_blocks::{BlockMap, BlockSource, BlockState};

use super::device_blocks::{block_state, changed_since, damaged_chunk};

/// The device in `dir` as a block source: a snapshot through its server
/// if it is served (`true`), else opened here, stopped. With `walk_all`,
/// its changed-block tracking is ignored.
pub fn served_or_stopped(
    dir: &Path,
    walk_all: bool,
) -> anyhow::Result<(Box<dyn BlockSource>, bool)> {
    if let Some(mut s) = ServedBlocks::start(dir)? {
        if walk_all {
            s.ignore_changes();
        }
        return Ok((Box::new(s), true));
    }
    let mut s = super::device_blocks::DeviceBlocks::open_to_read(dir)?;
    if walk_all {
        s.ignore_changes();
    }
    Ok((Box::new(s), false))
}

pub struct ServedBlocks {
    /// `None` once the snapshot has ended.
    client: Mutex<Option<SnapshotClient>>,
    dir: PathBuf,
    chunk_size: u32,
    blocks: u64,
    hash: HashAlgo,
    uuid: [u8; 16],
    can_track: bool,
    changes: Option<Changes>,
}

impl ServedBlocks {
    /// A snapshot of the device served from `dir`, if it is served.
    pub fn start(dir: &Path) -> anyhow::Result<Option<ServedBlocks>> {
        let socket = super::device::control_path(dir);
        let Some(client) = SnapshotClient::start(&socket)? else {
            return Ok(None);
        };
        let i = &client.info;
        Ok(Some(ServedBlocks {
            dir: dir.to_path_buf(),
            chunk_size: i.chunk_size,
            blocks: i.logical_size / u64::from(i.chunk_size),
            hash: i.hash,
            uuid: i.uuid,
            can_track: i.can_track,
            changes: client.changes(),
            client: Mutex::new(Some(client)),
        }))
    }

    /// Walk every block, whatever the tracking says (`--walk-all`).
    pub fn ignore_changes(&mut self) {
        self.changes = None;
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut SnapshotClient) -> dedup_core::Result<T>,
    ) -> io::Result<T> {
        let mut c = self.client.lock().unwrap_or_else(|p| p.into_inner());
        let c = c
            .as_mut()
            .ok_or_else(|| io::Error::other("the device's snapshot has ended"))?;
        f(c).map_err(|e| io::Error::other(e.to_string()))
    }
}

impl BlockMap for ServedBlocks {
    fn block_size(&self) -> u32 {
        self.chunk_size
    }

    fn blocks(&self) -> u64 {
        self.blocks
    }

    fn hash(&self) -> HashAlgo {
        self.hash
    }

    fn map(&self, first: u64, count: u64) -> io::Result<Vec<BlockState>> {
        use dedup_core::control::snapshot::MAX_MAP_BLOCKS;
        let mut out = Vec::with_capacity(count as usize);
        let end = first + count;
        let mut at = first;
        while at < end {
            let n = (end - at).min(MAX_MAP_BLOCKS);
            let states = self.with(|c| c.map(at, n))?;
            out.extend(states.into_iter().map(block_state));
            at += n;
        }
        Ok(out)
    }
}

impl BlockSource for ServedBlocks {
    fn read(&self, first: u64, buf: &mut [u8]) -> io::Result<()> {
        use dedup_core::control::snapshot::MAX_READ_BYTES;
        let cs = self.chunk_size as usize;
        let per = (MAX_READ_BYTES as usize / cs).max(1) * cs;
        for (i, part) in buf.chunks_mut(per).enumerate() {
            let at = first + (i * per / cs) as u64;
            self.with(|c| c.read(at, part))?;
        }
        Ok(())
    }

    fn describe(&self, block: u64) -> String {
        damaged_chunk(&self.dir, block, self.chunk_size)
    }

    fn device_id(&self) -> Option<[u8; 16]> {
        self.can_track.then_some(self.uuid)
    }

    fn tracking_mark(&self) -> Option<u64> {
        self.changes.as_ref().map(|c| c.mark)
    }

    fn changed_since_mark(&self, first: u64, count: u64) -> bool {
        changed_since(self.changes.as_ref(), first, count)
    }

    fn start_tracking(&self, mark: u64) -> io::Result<()> {
        let client = self
            .client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| io::Error::other("the device's snapshot has ended"))?;
        match client.end(Some(mark)) {
            Ok(true) => Ok(()),
            Ok(false) => Err(io::Error::other(
                "the device's server did not restart its tracking",
            )),
            Err(e) => Err(io::Error::other(e.to_string())),
        }
    }
}
