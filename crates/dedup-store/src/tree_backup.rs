//! Backing up files and directories: the walk's file contents go through
//! the same session and segmenter as any stream (cut file by file, so
//! segments never span two files), and the
//! tree it records becomes the backup's tree object, committed with it.
//! A remote client can do the same through a server: send the stream's
//! segments, then the encoded tree.

use std::io::{self, Read};
use std::path::Path;

use crate::backup::BackupReport;
use crate::repo::Repository;
use crate::repo_error::{RepoError, RepoResult};
use crate::segmenter::Segmenter;
use crate::tree_walk::{TreeWalk, WalkCounts};

/// What a backup of files cost, what it held, and what it skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TreeBackupReport {
    #[serde(flatten)]
    pub backup: BackupReport,
    #[serde(flatten)]
    pub counts: WalkCounts,
    /// Entries skipped (vanished, unreadable, sockets), one line each.
    pub warnings: Vec<String>,
}

/// Tells `progress` how many bytes each read returned.
struct Progress<'a, R, F> {
    inner: &'a mut R,
    progress: &'a mut F,
}

impl<R: Read, F: FnMut(u64)> Read for Progress<'_, R, F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        (self.progress)(n as u64);
        Ok(n)
    }
}

impl Repository {
    /// Back up `paths` (files or directories, see [`TreeWalk`] for how
    /// they are named in the tree) as backup `name` in `group`;
    /// `progress` is told the bytes of file contents as they are read.
    pub fn backup_paths(
        &self,
        name: &str,
        group: &str,
        paths: &[impl AsRef<Path>],
        mut progress: impl FnMut(u64),
    ) -> RepoResult<TreeBackupReport> {
        let io = |cause| RepoError::Io {
            context: format!("backing up files as {name}"),
            cause,
        };
        let mut walk = TreeWalk::new(paths).map_err(io)?;
        let mut session = self.begin_backup(name, group)?;
        // Segmented file by file: an edit shifts no other file's segments.
        while walk.next_file().map_err(io)? {
            let reader = Progress {
                inner: &mut walk,
                progress: &mut progress,
            };
            for segment in Segmenter::new(self.config.segmenting, reader) {
                session.append(&segment.map_err(io)?)?;
            }
        }
        let (tree, counts, warnings) = walk.finish();
        debug_assert_eq!(tree.stream_len, session.report().bytes_in);
        let record = session.commit_with_tree(Some(&tree.encode()))?;
        Ok(TreeBackupReport {
            backup: record.report,
            counts,
            warnings,
        })
    }
}
