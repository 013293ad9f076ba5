//! The engine's side of changed-block tracking (`crate::changes`): taken
//! back at open only from a clean stop of exactly this metadata, kept in
//! the metadata mutex beside the LBN map it follows (`Meta::map` and
//! `unmap` note every change), saved at a clean stop, and restarted from a
//! mark by a backup.

use tracing::warn;

use super::Engine;
use crate::blockfile::FileBlockFile;
use crate::changes::{self, Changes, Owner};
use crate::error::{Error, Result};
use crate::options::OpenOptions;
use crate::superblock::{DeviceState, Superblock};

impl Engine {
    /// At open: take the saved tracking back if the superblock read then
    /// (`owner`, a clean stop) is the one it was saved with and nothing
    /// was recovered; a writable open then removes the file, so no later
    /// state of the device can be paired with it.
    pub(super) fn take_changes(&mut self, opts: &OpenOptions, owner: Owner, clean: bool) {
        let Some(at) = &opts.changes else { return };
        self.changes_at = Some(at.clone());
        let clean = clean && self.recovery.is_none();
        self.opened = Some((owner, clean));
        if clean {
            let chunks = self.cfg.logical_chunks();
            self.meta.get_mut().changes = changes::load(&at.file, owner, chunks);
        }
        if self.writable {
            if let Err(e) = changes::remove(&at.file) {
                // Left behind, it would still name the superblock read at
                // open, which this open has replaced: never paired again.
                warn!("{e}");
            }
        }
    }

    /// At a clean stop (the superblock just written): save the tracking,
    /// bound to that superblock. A failure only costs the next backup a
    /// full walk.
    pub(super) fn save_changes(&self, m: &super::Meta) {
        let Some(at) = self.changes_at.as_ref().filter(|_| self.writable) else {
            return;
        };
        let saved = (|| {
            let meta = FileBlockFile::open(&at.meta, false)?;
            let sb = Superblock::read(&meta, &at.meta)?;
            if sb.state != DeviceState::Clean {
                return Err(Error::InvalidArgument("the superblock is not clean".into()));
            }
            let owner = Owner {
                uuid: self.cfg.uuid,
                generation: sb.generation,
                logical_size: self.cfg.logical_size,
            };
            changes::save(&at.file, owner, &m.changes)
        })();
        if let Err(e) = saved {
            warn!("changed-block tracking not saved ({e}): the next backup by fingerprint walks every block");
            let _ = changes::remove(&at.file);
        }
    }

    /// What changed since the tracking's mark, if tracked.
    pub(crate) fn changes(&self) -> Option<Changes> {
        self.meta.lock().changes.changes()
    }

    /// Whether `start_changes` can work (see `Device::can_track`).
    pub(crate) fn can_track(&self) -> bool {
        self.changes_at.is_some() && (self.writable || self.opened.is_some_and(|(_, clean)| clean))
    }

    /// Track anew from `mark`. A device opened to read (a backup of a
    /// stopped device) saves it now, bound to the metadata as opened,
    /// which must have been stopped cleanly; a writable one saves it at
    /// its clean stop.
    pub(crate) fn start_changes(&self, mark: u64) -> Result<()> {
        let _g = self.enter()?;
        let mut m = self.meta.lock();
        let chunks = self.cfg.logical_chunks();
        if self.writable {
            m.changes.start(mark, chunks);
            return Ok(());
        }
        let (Some(at), Some((owner, clean))) = (&self.changes_at, self.opened) else {
            return Err(Error::InvalidArgument(
                "this device keeps no changed-block tracking (opened without its directory)".into(),
            ));
        };
        if !clean {
            return Err(Error::InvalidArgument(
                "the device was not stopped cleanly: changed-block tracking starts at its next clean stop"
                    .into(),
            ));
        }
        m.changes.start(mark, chunks);
        changes::save(&at.file, owner, &m.changes)
    }
}
