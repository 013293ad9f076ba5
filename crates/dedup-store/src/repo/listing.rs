//! Listing a repository's backups when some backup objects are damaged:
//! each backup object is read on its own, so one that does not read or
//! decode (a flipped byte in its 120 bytes) is named, and the others are
//! still listed, deleted and collected. A damaged backup object's recipe
//! and tree are not known (its bytes name them); garbage collection keeps
//! whatever might be theirs (`gc/mod.rs`).

use crate::backup::{BackupRecord, BACKUPS_PREFIX};
use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::repo::Repository;

/// A backup object that could not be read or decoded.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DamagedBackup {
    /// The backup's name (from its object's name; its bytes are what is
    /// damaged).
    pub name: String,
    /// What is wrong with it.
    pub detail: String,
}

/// The backups that read, and those that do not.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    pub backups: Vec<BackupRecord>,
    pub damaged: Vec<DamagedBackup>,
}

impl Repository {
    /// Every committed backup that reads, and the names of those whose
    /// backup objects do not (with why). Only a failure to list the store
    /// is an error; a backup deleted while listing is left out.
    pub fn list_backups_all(&self) -> RepoResult<Listing> {
        let mut out = Listing::default();
        for object in self.store.list(BACKUPS_PREFIX)? {
            let read = match self.store.get(&object) {
                Err(Error::NotFound { .. }) => continue,
                other => other
                    .map_err(RepoError::from)
                    .and_then(|bytes| BackupRecord::decode(&object, &bytes)),
            };
            match read {
                Ok(record) => out.backups.push(record),
                Err(e) => out.damaged.push(DamagedBackup {
                    name: object
                        .strip_prefix(BACKUPS_PREFIX)
                        .unwrap_or(&object)
                        .to_string(),
                    detail: e.to_string(),
                }),
            }
        }
        Ok(out)
    }
}
