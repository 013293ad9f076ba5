//! Backing up files and directories: the walk's file contents go through
//! the same session and block cutter as any stream (cut file by file, so
//! segments never span two files), and the
//! tree it records becomes the backup's tree object, committed with it.
//! A remote client can do the same through a server: send the stream's
//! segments, then the encoded tree.
//!
//! Memory: the walk holds its tree compressed as it goes
//! (`tree/walk.rs`), the parent is read alongside it (`tree/parent.rs`),
//! and each file is cut a block at a time (`segment_blocks::BLOCK`), so
//! what grows with the tree is its compressed tree object and the
//! parent's, 10-25 bytes an entry each; the rest is the session's
//! (`session.rs`) and the index's, bounded whatever the tree.

use std::io::{self, Read};
use std::path::Path;

use crate::backup::BackupReport;
use crate::backup_stream::StreamError;
use crate::error::repo::{RepoError, RepoResult};
use crate::repo::Repository;
use crate::tree::cut::FileCutter;
use crate::tree::parent::ParentFiles;
use crate::tree::walk::{TreeWalk, WalkCounts};
use crate::BackupRecord;

/// What a backup of files cost, what it held, and what it skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TreeBackupReport {
    #[serde(flatten)]
    pub backup: BackupReport,
    #[serde(flatten)]
    pub counts: WalkCounts,
    /// Entries skipped (vanished, unreadable, sockets), one line each.
    pub warnings: Vec<String>,
    /// The backup whose unchanged files were reused, if any.
    pub parent: Option<String>,
    /// Files unchanged since the parent (same size, mtime, ctime and
    /// inode), whose segments were reused without reading them.
    pub files_unchanged: u64,
    /// Bytes reused from the parent without reading them: those of the
    /// unchanged files, and the start of an unchanged file whose parent
    /// segments could be reused only up to a point (the rest was read).
    pub bytes_unchanged: u64,
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
    /// The files of the newest backup of files in `group`, to reuse what
    /// is unchanged. A parent that cannot be read is no parent: every
    /// file is then read (never a reason to fail the backup).
    fn parent_files(&self, group: &str) -> RepoResult<Option<ParentFiles>> {
        let newest = self.newest_files_backup(group)?;
        Ok(newest.and_then(|record| ParentFiles::load(self, record).ok()))
    }

    /// The record of the newest backup of files in `group`: the parent of
    /// the next one. A damaged backup object is passed over (it cannot be
    /// a parent, and must not stop the next backup; `list` names it).
    pub(crate) fn newest_files_backup(&self, group: &str) -> RepoResult<Option<BackupRecord>> {
        Ok(self
            .list_backups_all()?
            .backups
            .into_iter()
            .filter(|b| b.group == group && b.tree.is_some())
            .max_by_key(|b| b.time))
    }

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
        let context = || format!("backing up files as {name}");
        let io = |cause| RepoError::Io {
            context: context(),
            cause,
        };
        let stream = |e: StreamError| e.into_repo(context);
        let mut walk = TreeWalk::new(paths).map_err(io)?;
        let mut cutter = FileCutter::new(self.config.segmenting, self.segment_hash());
        let mut session = self.begin_backup(name, group)?;
        let mut parent = self.parent_files(group)?;
        let (mut files_unchanged, mut bytes_unchanged) = (0, 0);
        // Segmented file by file: an edit shifts no other file's segments.
        while walk.next_file().map_err(io)? {
            let unchanged = walk
                .current()
                .and_then(|(n, len)| parent.as_mut()?.unchanged(n, len));
            let mut len = walk.current().map_or(0, |(_, len)| len);
            if let (Some(file), Some(p)) = (unchanged, parent.as_mut()) {
                // The files before it first: segments go in walk order.
                cutter.finish(&mut session).map_err(stream)?;
                let taken = p.recipe.reuse(self, &mut session, file)?;
                progress(taken);
                bytes_unchanged += taken;
                if taken == file.size {
                    walk.skip_current(taken);
                    files_unchanged += 1;
                    continue;
                }
                // Read the rest: it starts where a segment of the parent
                // did, so it is cut as the parent's was.
                walk.skip_prefix(taken).map_err(io)?;
                len = len.saturating_sub(taken);
            }
            let mut reader = Progress {
                inner: &mut walk,
                progress: &mut progress,
            };
            cutter
                .file(&mut session, &mut reader, len)
                .map_err(stream)?;
        }
        cutter.finish(&mut session).map_err(stream)?;
        let (tree, counts, warnings) = walk.finish();
        let record = session.commit_with_walked_tree(&tree)?;
        Ok(TreeBackupReport {
            backup: record.report,
            counts,
            warnings,
            parent: parent.map(|p| p.name),
            files_unchanged,
            bytes_unchanged,
        })
    }
}
