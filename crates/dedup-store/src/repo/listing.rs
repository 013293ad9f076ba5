//! Listing a repository's backups when some backup objects are damaged:
//! each backup object is read on its own, so one that does not read or
//! decode (a flipped byte in its 120 bytes) is named, and the others are
//! still listed, deleted and collected. A damaged backup object's recipe
//! and tree are not known (its bytes name them); garbage collection keeps
//! whatever might be theirs (`gc/mod.rs`).
//!
//! A backup object is never changed, only deleted (and a name may be
//! taken again by a new one): where the listing tags each object (S3's
//! ETag), a record read once is kept by name and tag and not read again
//! while the tag is the same. A collection looks at the backups three
//! times, and read every record each time: 30 of the 60-100 requests of a
//! gc beside 10 backups.

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
    /// is an error. A backup deleted after the listing is left out when
    /// its object is read, and kept when it is known by its tag (here, or
    /// in this machine's cache), as in any listing taken just before.
    pub fn list_backups_all(&self) -> RepoResult<Listing> {
        let mut out = Listing::default();
        let listed = self.store.list_tagged(BACKUPS_PREFIX)?;
        let mut kept = self.records.lock().unwrap_or_else(|p| p.into_inner());
        // Only what is still listed: as many as the backups (looked up in
        // a set: a scan of the listing per record is quadratic in them).
        let names: std::collections::HashSet<&str> =
            listed.iter().map(|(o, _)| o.as_str()).collect();
        kept.retain(|object, _| names.contains(object.as_str()));
        for (object, tag) in listed {
            let same = |(was, _): &&(String, BackupRecord)| Some(was) == tag.as_ref();
            if let Some((_, record)) = kept.get(&object).filter(same) {
                out.backups.push(record.clone());
                continue;
            }
            let decode = |got: crate::error::Result<Vec<u8>>| match got {
                Err(Error::NotFound { .. }) => None,
                other => Some(
                    other
                        .map_err(RepoError::from)
                        .and_then(|bytes| BackupRecord::decode(&object, &bytes)),
                ),
            };
            let read = match &tag {
                Some(tag) => match decode(self.store.get_listed(&object, tag)) {
                    // This machine's copy did not open: dropped, and the
                    // object read again (and kept again if it proves
                    // itself), so a bad copy is not kept for every later
                    // process.
                    Some(Err(_)) => {
                        self.store.forget_listed(&object, tag);
                        decode(self.store.get_listed(&object, tag))
                    }
                    other => other,
                },
                None => decode(self.store.get(&object)),
            };
            let Some(read) = read else {
                continue;
            };
            match read {
                Ok(record) => {
                    match tag {
                        Some(tag) => kept.insert(object, (tag, record.clone())),
                        None => kept.remove(&object),
                    };
                    out.backups.push(record)
                }
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
