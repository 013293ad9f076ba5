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
//!
//! The parent's tree is read alongside the walk, entry by entry
//! (`tree/reader.rs`): both are in walk order (`tree::walk::walk_order`),
//! so the parent's entry for a path is found by moving forward past the
//! entries that sort before it, and only the next of them is held
//! decoded. A backup with a parent holds its tree object as stored (10-25
//! bytes an entry) and at most `tree::reader::MAX_WINDOW` bytes of it
//! decompressed; holding it decoded in a map of paths took about 150
//! bytes a file, 60 MB more at its peak on the 104,000 files of
//! `/usr/share` and `/usr/lib`. A parent whose entries are not in walk
//! order (written before walks sorted their given paths by component)
//! only finds fewer files unchanged.
//!
//! The parent's recipe is read one part at a time, as the walk reaches
//! the files in it (a walk visits files in the order the parent's walk
//! did, so each part is read once), and only the part in use is held: the
//! RAM of a backup with a parent follows its files, not its segments (a
//! whole recipe is 24 bytes a segment: 3 GiB for 1 TiB of files in 8 KiB
//! segments).
//!
//! A client of a server still builds a map of its parent's files
//! ([`ParentIndex`], from the tree the server sends).

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use crate::error::repo::{RepoError, RepoResult};
use crate::recipe::parts::{read_part, RecipeObject};
use crate::recipe::SegmentRef;
use crate::repo::Repository;
use crate::session::BackupSession;
use crate::tree::reader::TreeReader;
use crate::tree::walk::walk_order;
use crate::tree::{Kind, Node, Time, Tree};
use crate::BackupRecord;

/// What the parent recorded of a file: what says it is unchanged, and
/// where its bytes are in the parent's stream.
struct Was {
    inode: u64,
    mtime: Time,
    ctime: Time,
    size: u64,
    offset: u64,
}

impl Was {
    fn of(n: &Node) -> Was {
        Was {
            inode: n.inode,
            mtime: n.mtime,
            ctime: n.ctime,
            size: n.size,
            offset: n.offset,
        }
    }

    /// If `now` (a file as the walk just found it, `len` bytes by `stat`:
    /// it is not read yet) is this file unchanged: where its bytes are in
    /// the parent's stream.
    fn unchanged(&self, now: &Node, len: u64) -> Option<Unchanged> {
        let same = now.kind == Kind::File
            && now.inode != 0
            && now.inode == self.inode
            && now.mtime == self.mtime
            && now.ctime == self.ctime
            && len == self.size;
        same.then_some(Unchanged {
            offset: self.offset,
            size: self.size,
        })
    }
}

pub(crate) struct ParentFiles {
    pub(crate) name: String,
    tree: TreeReader,
    /// The parent's next file with contents, read ahead of the walk.
    ahead: Option<Node>,
    pub(crate) recipe: ParentRecipe,
}

/// Path → what the parent recorded, for its files with contents: what a
/// walk asks to know a file unchanged. A client of a server builds it
/// from the parent's tree the server sends (`rpc/pipeline.rs`).
pub(crate) struct ParentIndex {
    files: HashMap<Vec<u8>, Was>,
}

impl ParentIndex {
    pub(crate) fn new(tree: Tree) -> ParentIndex {
        let files = tree
            .nodes
            .into_iter()
            .filter(|n| n.kind == Kind::File && n.size > 0)
            .map(|n| {
                let was = Was::of(&n);
                (n.path, was)
            })
            .collect();
        ParentIndex { files }
    }

    /// If `now` (a file as the walk just found it) is unchanged since the
    /// parent: where its bytes are in the parent's stream. `len` is its
    /// size by `stat` (the walk has not read it yet).
    pub(crate) fn unchanged(&self, now: &Node, len: u64) -> Option<Unchanged> {
        self.files.get(&now.path)?.unchanged(now, len)
    }
}

/// An unchanged file's bytes in the parent's stream (or a run of them:
/// files are cut on their own, so they start and end on segments).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unchanged {
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

impl ParentFiles {
    /// The files of backup `record` (read already: not read again).
    pub(crate) fn load(repo: &Repository, record: BackupRecord) -> RepoResult<ParentFiles> {
        let name = record.name.clone();
        let (object, stream_len, recipe) = parent_parts(repo, record)?;
        Ok(ParentFiles {
            name,
            tree: TreeReader::open(repo, &object, stream_len)?,
            ahead: None,
            recipe,
        })
    }

    /// If `now` (a file as the walk just found it; `len` its size by
    /// `stat`) is unchanged since the parent: where its bytes are in the
    /// parent's stream. Asked in walk order: the parent's files before
    /// `now` are passed over for good.
    pub(crate) fn unchanged(&mut self, now: &Node, len: u64) -> Option<Unchanged> {
        loop {
            if self.ahead.is_none() {
                self.ahead = std::iter::from_fn(|| self.tree.next_entry())
                    .find(|n| n.kind == Kind::File && n.size > 0);
            }
            let was = self.ahead.as_ref()?;
            match walk_order(&was.path, &now.path) {
                // Gone since, or a file this walk did not open.
                Ordering::Less => self.ahead = None,
                Ordering::Equal => return Was::of(&self.ahead.take()?).unchanged(now, len),
                // New since the parent.
                Ordering::Greater => return None,
            }
        }
    }
}

/// What a server keeps of backup `name` as a parent: its tree object as
/// stored, to send its client (who decides what is unchanged), and its
/// recipe, to take runs from. `None` if the tree object is over
/// `max_tree` bytes.
pub(crate) fn parent_for_client(
    repo: &Repository,
    record: BackupRecord,
    max_tree: usize,
) -> RepoResult<Option<(Vec<u8>, ParentRecipe)>> {
    Ok(read_parent(repo, record, max_tree)?.map(|(stored, _, recipe)| (stored, recipe)))
}

/// Backup `name`'s tree object, as stored and decoded, checked against
/// its recipe, and the recipe; `None` if the tree object is over
/// `max_tree` bytes.
fn read_parent(
    repo: &Repository,
    record: BackupRecord,
    max_tree: usize,
) -> RepoResult<Option<(Vec<u8>, Tree, ParentRecipe)>> {
    let name = record.name.clone();
    let (object, stream_len, recipe) = parent_parts(repo, record)?;
    let stored = repo.store.get(&object)?;
    if stored.len() > max_tree {
        return Ok(None);
    }
    let tree = Tree::decode(&object, &stored)?;
    // A tree that is not of this recipe's stream (whose length
    // `recipe_parts` checked against the backup's) places its files
    // wrongly: no parent (every file is read).
    tree.check_stream_len(&name, stream_len)
        .map_err(|d| RepoError::corrupt(&object, d))?;
    Ok(Some((stored, tree, recipe)))
}

/// Backup `name`'s tree object name, the bytes its stream holds, and its
/// recipe, to read a part at a time.
fn parent_parts(
    repo: &Repository,
    record: BackupRecord,
) -> RepoResult<(String, u64, ParentRecipe)> {
    let (record, parts) = repo.recipe_parts_of(record)?;
    let object = record
        .tree
        .clone()
        .ok_or_else(|| RepoError::corrupt(&record.recipe, "a stream has no files"))?;
    let stream_len = record.report.bytes_in;
    Ok((
        object,
        stream_len,
        ParentRecipe::new(record.recipe, parts.into_head()),
    ))
}

/// The parent's recipe, read a part at a time.
pub(crate) struct ParentRecipe {
    object: String,
    head: RecipeObject,
    /// Where each part starts in the stream, then the stream's end.
    part_starts: Vec<u64>,
    loaded: Option<Part>,
    /// The containers of the part just loaded, to be held (and pinned,
    /// in one pin) before any of its files is reused: one pin per part
    /// instead of one per container.
    hold_ahead: Vec<u64>,
    /// Parts that could not be read, not tried again.
    broken: HashSet<usize>,
}

/// One part of the parent's recipe, in RAM.
struct Part {
    k: usize,
    refs: Vec<SegmentRef>,
    /// Where each reference starts in the stream, then the part's end.
    starts: Vec<u64>,
}

impl Part {
    fn new(k: usize, at: u64, refs: Vec<SegmentRef>) -> Part {
        let mut starts = Vec::with_capacity(refs.len() + 1);
        let mut next = at;
        starts.push(next);
        for r in &refs {
            next += u64::from(r.len);
            starts.push(next);
        }
        Part { k, refs, starts }
    }

    fn end(&self) -> u64 {
        *self.starts.last().expect("a part has its start")
    }
}

impl ParentRecipe {
    /// Push the parent's segments of unchanged file `file` into `session`,
    /// one part's slice at a time, each slice only once all of it is
    /// confirmed; the bytes taken so. Fewer than the file's size (even 0)
    /// if a slice could not be confirmed, a part of the parent could not
    /// be read, or its segments do not end where the file does: the rest
    /// of the file is then to be read. What was taken always ends on a
    /// segment boundary of the parent, where a cut of the rest starts as
    /// the parent's did.
    pub(crate) fn reuse(
        &mut self,
        repo: &Repository,
        session: &mut BackupSession<'_>,
        file: Unchanged,
    ) -> RepoResult<u64> {
        let end = file.offset + file.size;
        let mut at = file.offset;
        while at < end {
            let Some(part) = self.held_part_at(repo, session, at)? else {
                break;
            };
            // The slice must start and end on segment boundaries: it
            // always ends at the file's end or the part's.
            let stop = end.min(part.end());
            let (Ok(first), Ok(last)) = (
                part.starts.binary_search(&at),
                part.starts.binary_search(&stop),
            ) else {
                break;
            };
            if !session.reuse_all(&part.refs[first..last])? {
                break;
            }
            at = stop;
        }
        Ok(at - file.offset)
    }

    /// The parent's segment that starts at stream byte `at`, if one does
    /// and its part reads; its part's containers are held (and pinned
    /// together) for `session` the first time the part is loaded. The
    /// caller confirms the segment before it references it.
    pub(crate) fn segment_at(
        &mut self,
        repo: &Repository,
        session: &mut BackupSession<'_>,
        at: u64,
    ) -> RepoResult<Option<SegmentRef>> {
        let Some(part) = self.held_part_at(repo, session, at)? else {
            return Ok(None);
        };
        Ok(part
            .starts
            .binary_search(&at)
            .ok()
            .and_then(|i| part.refs.get(i).copied()))
    }

    /// The parent's references for `count` blocks of `bs` bytes from
    /// stream byte `at`, if it has one whole block's segment starting at
    /// each (as a backup by fingerprint of a device makes them) and the
    /// parts read; their parts' containers held as `segment_at` holds
    /// them. The caller confirms them before it references them.
    pub(crate) fn whole_blocks(
        &mut self,
        repo: &Repository,
        session: &mut BackupSession<'_>,
        at: u64,
        count: u64,
        bs: u32,
    ) -> RepoResult<Option<Vec<SegmentRef>>> {
        let mut refs = Vec::with_capacity(count as usize);
        let end = at + count * u64::from(bs);
        let mut next = at;
        while next < end {
            let Some(part) = self.held_part_at(repo, session, next)? else {
                return Ok(None);
            };
            let Ok(i) = part.starts.binary_search(&next) else {
                return Ok(None);
            };
            for r in &part.refs[i..] {
                if next == end {
                    break;
                }
                if r.len != bs {
                    return Ok(None);
                }
                refs.push(*r);
                next += u64::from(bs);
            }
        }
        Ok(Some(refs))
    }

    /// `part_at`, its containers held for `session` (pinned together) the
    /// first time the part is loaded. Whether all were held does not
    /// matter here: each reuse checks its own containers.
    fn held_part_at(
        &mut self,
        repo: &Repository,
        session: &mut BackupSession<'_>,
        at: u64,
    ) -> RepoResult<Option<&Part>> {
        if self.part_at(repo, at).is_none() {
            return Ok(None);
        }
        let ahead = std::mem::take(&mut self.hold_ahead);
        if !ahead.is_empty() {
            session.hold_ahead(&ahead)?;
        }
        Ok(self.loaded.as_ref())
    }

    pub(crate) fn new(object: String, head: RecipeObject) -> ParentRecipe {
        let mut part_starts = vec![0u64];
        let mut at = 0u64;
        match &head {
            RecipeObject::Whole(r) => part_starts.push(r.stream_len),
            RecipeObject::Index(i) => {
                // The index's rows add up to its stream (checked at decode).
                for p in &i.parts {
                    at += p.bytes;
                    part_starts.push(at);
                }
            }
        }
        ParentRecipe {
            object,
            head,
            part_starts,
            loaded: None,
            hold_ahead: Vec::new(),
            broken: HashSet::new(),
        }
    }

    /// The part holding stream byte `at`, read if it is not the one in
    /// RAM; `None` if it cannot be read (that file is then read instead).
    fn part_at(&mut self, repo: &Repository, at: u64) -> Option<&Part> {
        let k = self
            .part_starts
            .partition_point(|&s| s <= at)
            .checked_sub(1)?;
        if k + 1 >= self.part_starts.len() || self.broken.contains(&k) {
            return None;
        }
        if self.loaded.as_ref().is_none_or(|p| p.k != k) {
            let refs = match &mut self.head {
                // A whole recipe is its one part, read with the index.
                RecipeObject::Whole(r) => std::mem::take(&mut r.segments),
                RecipeObject::Index(i) => {
                    match read_part(&*repo.store, &self.object, k, i.parts[k]) {
                        Ok((_, part)) => part.segments,
                        Err(_) => {
                            self.broken.insert(k);
                            return None;
                        }
                    }
                }
            };
            self.hold_ahead = SegmentRef::containers(&refs);
            self.loaded = Some(Part::new(k, self.part_starts[k], refs));
        }
        self.loaded.as_ref()
    }
}
