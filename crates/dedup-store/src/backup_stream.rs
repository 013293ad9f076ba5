//! Backing up one stream in this process: cut it into segments and append
//! them to a [`BackupSession`](crate::session::BackupSession), which keeps
//! each segment the index finds already stored, writes the new ones into
//! containers, then commits the recipe and the backup object, in that
//! order. Only the last `put` makes the backup visible, so a backup that
//! fails or dies part-way leaves no backup, only unreferenced containers
//! for GC.

use std::io::Read;

use crate::backup::BackupReport;
use crate::repo::Repository;
use crate::repo_error::{RepoError, RepoResult};
use crate::segmenter::Segmenter;

impl Repository {
    /// Back up `reader` as backup `name` in `group`.
    pub fn backup_stream(
        &self,
        name: &str,
        group: &str,
        reader: impl Read,
    ) -> RepoResult<BackupReport> {
        let mut session = self.begin_backup(name, group)?;
        for segment in Segmenter::new(self.config.segmenting, reader) {
            let segment = segment.map_err(|cause| RepoError::Io {
                context: format!("reading the stream of backup {name}"),
                cause,
            })?;
            session.append(&segment)?;
        }
        Ok(session.commit()?.report)
    }
}
