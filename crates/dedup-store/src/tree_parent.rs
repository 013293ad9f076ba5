//! The parent of a backup of files: the newest backup of files in the same
//! group, whose unchanged files are reused without reading them (as restic
//! and borg do; Guo's File Manager keeps files within backups for this).
//!
//! A file is unchanged if its path, size, mtime, ctime and inode are those
//! the parent recorded. Its segments are then the parent recipe's
//! segments covering its range of the parent's stream: files are cut on
//! their own, so each file's range starts and ends on segment boundaries.
//! The reuse is still checked (`BackupSession::reuse_all` protects each
//! container and confirms each entry against its catalog), so a stale or
//! damaged parent costs a read, never data.

use std::collections::HashMap;

use crate::recipe::SegmentRef;
use crate::repo::Repository;
use crate::repo_error::{RepoError, RepoResult};
use crate::tree::{Kind, Node, Tree};

pub(crate) struct ParentFiles {
    pub(crate) name: String,
    /// Path → (the parent's entry, its first segment, segment count).
    files: HashMap<Vec<u8>, (Node, usize, usize)>,
    segments: Vec<SegmentRef>,
}

impl ParentFiles {
    pub(crate) fn load(repo: &Repository, name: &str) -> RepoResult<ParentFiles> {
        let (record, recipe) = repo.recipe(name)?;
        let object = record
            .tree
            .ok_or_else(|| RepoError::corrupt(&record.recipe, "a stream has no files"))?;
        let tree = Tree::decode(&object, &repo.store.get(&object)?)?;
        // Where each segment starts in the parent's stream.
        let mut starts = Vec::with_capacity(recipe.segments.len() + 1);
        let mut at = 0u64;
        for s in &recipe.segments {
            starts.push(at);
            at += u64::from(s.len);
        }
        starts.push(at);
        let mut files = HashMap::new();
        for n in tree.nodes {
            if n.kind != Kind::File || n.size == 0 {
                continue;
            }
            // Only a range that starts and ends on segment boundaries.
            let (Ok(first), Ok(end)) = (
                starts.binary_search(&n.offset),
                starts.binary_search(&(n.offset + n.size)),
            ) else {
                continue;
            };
            files.insert(n.path.clone(), (n, first, end - first));
        }
        Ok(ParentFiles {
            name: name.to_string(),
            files,
            segments: recipe.segments,
        })
    }

    /// If `now` (a file as the walk just found it) is unchanged since the
    /// parent: its size and the parent's segments for it.
    /// `len` is its size by `stat` (the walk has not read it yet).
    pub(crate) fn unchanged(&self, now: &Node, len: u64) -> Option<(u64, &[SegmentRef])> {
        let (was, first, count) = self.files.get(&now.path)?;
        let same = now.kind == Kind::File
            && now.inode != 0
            && now.inode == was.inode
            && now.mtime == was.mtime
            && now.ctime == was.ctime
            && len == was.size;
        same.then(|| (was.size, &self.segments[*first..first + count]))
    }
}
