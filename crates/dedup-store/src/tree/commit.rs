//! Committing a backup with its tree object: a tree from a client is
//! checked as a restore will check it, a tree this process walked only
//! for its stream's length; then the session commits (`session.rs`),
//! storing the tree before the backup object names it.

use crate::backup::BackupRecord;
use crate::error::repo::{RepoError, RepoResult};
use crate::session::BackupSession;

use super::writer::EncodedTree;
use super::{check_stream_len, Tree};

impl BackupSession<'_> {
    /// Commit, with `tree` (the encoded metadata of the files whose
    /// contents the stream holds) stored as the backup's tree object
    /// before the backup object names it.
    pub fn commit_with_tree(self, tree: Option<&[u8]>) -> RepoResult<BackupRecord> {
        if let Some(bytes) = tree {
            // A tree from a client is checked as a restore will check it,
            // so a backup is never committed that cannot be restored.
            let what = format!("the tree of backup {}", self.name());
            Tree::decode(&what, bytes)?
                .check_stream_len(self.name(), self.report().bytes_in)
                .map_err(|d| RepoError::corrupt(&what, d))?;
        }
        self.commit_checked(tree)
    }

    /// Commit with the tree this process walked while it read the stream
    /// (`tree/walk.rs`), which makes a tree a restore can follow by
    /// construction: it is not decoded again (that held the whole tree
    /// twice over, some 70 MB for 104,000 files), only its stream's length
    /// checked against the bytes backed up.
    pub(crate) fn commit_with_walked_tree(self, tree: &EncodedTree) -> RepoResult<BackupRecord> {
        let what = format!("the tree of backup {}", self.name());
        check_stream_len(tree.stream_len, self.name(), self.report().bytes_in)
            .map_err(|d| RepoError::corrupt(&what, d))?;
        self.commit_checked(Some(&tree.bytes))
    }
}
