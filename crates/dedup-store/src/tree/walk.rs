//! Walking the files and directories to back up: file by file
//! ([`TreeWalk::next_file`], then [`Read`]), every regular file's contents
//! in turn, which make the backup's stream; each entry's metadata (and
//! each file's range of the stream) is recorded as the walk reaches it, so
//! the backup reads every file once and the tree it leaves matches the
//! bytes actually read.
//!
//! Paths in the tree follow tar: each path given is kept as given, made
//! relative (a leading `/` and `.` components dropped), so `/usr/share/doc`
//! is stored as `usr/share/doc/...` and `docs` as `docs/...`; `.` or `/`
//! puts the directory's entries at the top. The directories leading to a
//! given path are recorded too (metadata only), so a restore recreates
//! them as they were. `..` in a given path is refused: it would make the
//! tree's path depend on where the backup ran.
//!
//! Symlinks are never followed (not even a given path), directories are
//! read in byte order of their names (so two walks of an unchanged tree
//! give the same stream), a second name of a file already seen (same
//! device and inode) is recorded as a hard link without its contents, and
//! sockets are skipped with a warning. Files may change while they are
//! read: a file's size is what was read, to end of file; a file or
//! directory that vanishes or cannot be read is skipped with a warning.
//!
//! What the walk holds, so a backup's RAM follows the tree's depth, not
//! its size: the names of each directory on the way down to the entry
//! being visited (one list a level), the entry of the file being read,
//! the tree so far compressed as it goes (`tree/writer.rs`, 10-25 bytes
//! an entry), the first path of each inode with more than one name (a
//! hard link must name it), and the directories leading to the paths
//! given. Entries are written out as soon as they are complete.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File, Metadata};
use std::io::{self, Read, Seek};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use crate::tree::writer::{EncodedTree, TreeWriter};
use crate::tree::{Kind, Node, Time, MAX_PATH};

/// Entries of one kind the walk recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WalkCounts {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hard_links: u64,
    /// Fifos and devices.
    pub specials: u64,
}

/// A directory being walked: where it is, its tree path, and the names
/// still to visit, sorted.
struct Dir {
    source: PathBuf,
    tree: Vec<u8>,
    names: std::vec::IntoIter<OsString>,
}

/// The regular file being read and its entry, written out once it is
/// read (its size grows as it is).
struct Current {
    file: File,
    node: Node,
    /// Its size when opened, as `stat` gave it.
    len: u64,
}

pub struct TreeWalk {
    /// Given paths still to walk (source, tree path), in tree-path order.
    roots: std::vec::IntoIter<(PathBuf, Vec<u8>)>,
    stack: Vec<Dir>,
    current: Option<Current>,
    /// Every entry complete so far, compressed.
    out: TreeWriter,
    offset: u64,
    /// First tree path of each multiply-linked inode seen.
    links: HashMap<(u64, u64), Vec<u8>>,
    /// Directories leading to the given paths recorded, so a parent shared
    /// by two given paths is recorded once (no given path holds another,
    /// so no other directory can be met twice).
    dirs: HashSet<Vec<u8>>,
    counts: WalkCounts,
    warnings: Vec<String>,
}

impl TreeWalk {
    /// A walk of `paths`. Refused: a path with `..`, or two paths of which
    /// one holds the other (their entries would be recorded twice).
    pub fn new(paths: &[impl AsRef<Path>]) -> io::Result<TreeWalk> {
        let mut roots = Vec::new();
        for p in paths {
            let p = p.as_ref();
            fs::symlink_metadata(p).map_err(|e| context(e, p))?;
            roots.push((p.to_path_buf(), tree_path(p)?));
        }
        // In the order of the entries within a directory, so the whole
        // walk is in `walk_order` (a parent is read alongside in it).
        roots.sort_by(|a, b| walk_order(&a.1, &b.1));
        for w in roots.windows(2) {
            let (a, b) = (&w[0].1, &w[1].1);
            if a.is_empty() || b == a || (b.starts_with(a) && b[a.len()] == b'/') {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} and {} overlap: give each file once",
                        w[0].0.display(),
                        w[1].0.display()
                    ),
                ));
            }
        }
        Ok(TreeWalk {
            roots: roots.into_iter(),
            stack: Vec::new(),
            current: None,
            out: TreeWriter::new(),
            offset: 0,
            links: HashMap::new(),
            dirs: HashSet::new(),
            counts: WalkCounts::default(),
            warnings: Vec::new(),
        })
    }

    pub fn counts(&self) -> WalkCounts {
        self.counts
    }

    /// What was skipped, and why, so far.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The tree of everything walked, encoded (call once the reader is
    /// exhausted).
    pub fn finish(mut self) -> (EncodedTree, WalkCounts, Vec<String>) {
        self.write_current();
        let tree = self.out.finish();
        debug_assert_eq!(tree.stream_len, self.offset);
        (tree, self.counts, self.warnings)
    }

    /// Bytes the tree so far takes, compressed: what the walk holds that
    /// grows with the tree.
    pub fn tree_bytes(&self) -> usize {
        self.out.held_bytes()
    }

    /// Write out the entry of the file being read, now complete.
    fn write_current(&mut self) {
        if let Some(cur) = self.current.take() {
            self.out.push(&cur.node);
        }
    }

    /// Record the next entry; open it if it is a regular file. False once
    /// every path has been walked.
    fn advance(&mut self) -> io::Result<bool> {
        loop {
            let next = match self.stack.last_mut() {
                Some(dir) => match dir.names.next() {
                    Some(name) => {
                        let mut tree = dir.tree.clone();
                        if !tree.is_empty() {
                            tree.push(b'/');
                        }
                        tree.extend_from_slice(name.as_bytes());
                        Some((dir.source.join(&name), tree))
                    }
                    None => {
                        self.stack.pop();
                        continue;
                    }
                },
                None => match self.roots.next() {
                    Some((source, tree)) => {
                        self.record_parents(&source, &tree)?;
                        if tree.is_empty() {
                            // `.` or `/`: its entries, not itself.
                            let names = self.list(&source)?;
                            self.stack.push(Dir {
                                source,
                                tree,
                                names,
                            });
                            continue;
                        }
                        Some((source, tree))
                    }
                    None => return Ok(false),
                },
            };
            let (source, tree) = next.expect("an entry");
            if self.visit(source, tree)? {
                return Ok(true);
            }
        }
    }

    /// The directories leading to a given path, recorded once each with
    /// their own metadata (following symlinks: they only hold the path).
    fn record_parents(&mut self, source: &Path, tree: &[u8]) -> io::Result<()> {
        let mut s = PathBuf::new();
        let mut t: Vec<u8> = Vec::new();
        let mut parents = Vec::new();
        for c in source.components() {
            s.push(c);
            if let Component::Normal(name) = c {
                if !t.is_empty() {
                    t.push(b'/');
                }
                t.extend_from_slice(name.as_bytes());
                parents.push((s.clone(), t.clone()));
            }
        }
        parents.pop(); // the path itself
        debug_assert!(parents.last().is_none_or(|p| tree.starts_with(&p.1)));
        for (s, t) in parents {
            if self.dirs.contains(&t) {
                continue;
            }
            let meta = fs::metadata(&s).map_err(|e| context(e, &s))?;
            let n = entry(t.clone(), Kind::Dir, &meta, Vec::new(), &s);
            self.out.push(&n);
            self.counts.dirs += 1;
            self.dirs.insert(t);
        }
        Ok(())
    }

    /// Record `source` at `tree`; true if it is a file opened for reading.
    fn visit(&mut self, source: PathBuf, tree: Vec<u8>) -> io::Result<bool> {
        if tree.len() > MAX_PATH {
            self.warn(&source, "path longer than 4096 bytes, skipped");
            return Ok(false);
        }
        let meta = match fs::symlink_metadata(&source) {
            Ok(m) => m,
            Err(e) if is_gone(&e) => {
                self.warn(&source, "vanished before it was read, skipped");
                return Ok(false);
            }
            Err(e) => return Err(context(e, &source)),
        };
        let ft = meta.file_type();
        if ft.is_dir() {
            let names = match self.list(&source) {
                Ok(n) => n,
                Err(e) if is_gone(&e) => {
                    self.warn(&source, "vanished before it was read, skipped");
                    return Ok(false);
                }
                Err(e) => {
                    self.warn(&source, &format!("{e}; recorded empty"));
                    Vec::new().into_iter()
                }
            };
            self.out
                .push(&entry(tree.clone(), Kind::Dir, &meta, Vec::new(), &source));
            self.counts.dirs += 1;
            self.stack.push(Dir {
                source,
                tree,
                names,
            });
            return Ok(false);
        }
        if ft.is_socket() {
            self.warn(&source, "a socket; skipped");
            return Ok(false);
        }
        if meta.nlink() > 1 {
            if let Some(first) = self.links.get(&(meta.dev(), meta.ino())) {
                let first = first.clone();
                let mut n = node(tree, Kind::HardLink, &meta, first);
                // The first name carries the inode's metadata.
                (n.mode, n.uid, n.gid, n.mtime, n.atime) =
                    (0, 0, 0, Time::default(), Time::default());
                self.out.push(&n);
                self.counts.hard_links += 1;
                return Ok(false);
            }
        }
        let linked = (meta.nlink() > 1).then_some((meta.dev(), meta.ino()));
        if ft.is_symlink() {
            let target = match fs::read_link(&source) {
                Ok(t) => t.into_os_string().into_vec(),
                Err(e) if is_gone(&e) => {
                    self.warn(&source, "vanished before it was read, skipped");
                    return Ok(false);
                }
                Err(e) => return Err(context(e, &source)),
            };
            if target.is_empty() || target.len() > MAX_PATH {
                self.warn(&source, "symlink target empty or too long, skipped");
                return Ok(false);
            }
            let n = entry(tree.clone(), Kind::Symlink, &meta, target, &source);
            self.out.push(&n);
            self.counts.symlinks += 1;
        } else if ft.is_fifo() || ft.is_char_device() || ft.is_block_device() {
            let kind = if ft.is_fifo() {
                Kind::Fifo
            } else if ft.is_char_device() {
                Kind::CharDev
            } else {
                Kind::BlockDev
            };
            let mut n = entry(tree.clone(), kind, &meta, Vec::new(), &source);
            n.rdev = if kind == Kind::Fifo { 0 } else { meta.rdev() };
            self.out.push(&n);
            self.counts.specials += 1;
        } else {
            return self.open_file(source, tree, linked);
        }
        if let Some(key) = linked {
            self.links.insert(key, tree);
        }
        Ok(false)
    }

    /// Open a regular file without following a symlink that replaced it,
    /// and record it with the metadata of what was opened.
    fn open_file(
        &mut self,
        source: PathBuf,
        tree: Vec<u8>,
        linked: Option<(u64, u64)>,
    ) -> io::Result<bool> {
        let file = match open_no_follow(&source) {
            Ok(f) => f,
            Err(e) if is_gone(&e) || e.raw_os_error() == Some(libc::ELOOP) => {
                self.warn(&source, "vanished or replaced before it was read, skipped");
                return Ok(false);
            }
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                self.warn(&source, &format!("{e}; skipped"));
                return Ok(false);
            }
            Err(e) => return Err(context(e, &source)),
        };
        let meta = file.metadata().map_err(|e| context(e, &source))?;
        if !meta.file_type().is_file() {
            self.warn(&source, "replaced by something else while read, skipped");
            return Ok(false);
        }
        if let Some(key) = linked {
            self.links.insert(key, tree.clone());
        }
        let mut node = entry(tree, Kind::File, &meta, Vec::new(), &source);
        node.offset = self.offset;
        if changed_just_now(&meta) {
            // Changed within a timestamp tick of being read: a write
            // right after this read could leave mtime and ctime as they
            // are, so the next backup must read it rather than reuse it
            // (inode 0 marks it; git calls these "racily clean").
            node.inode = 0;
        }
        self.counts.files += 1;
        self.current = Some(Current {
            file,
            node,
            len: meta.len(),
        });
        Ok(true)
    }

    /// A directory's names, sorted by their bytes.
    fn list(&mut self, dir: &Path) -> io::Result<std::vec::IntoIter<OsString>> {
        let mut names = Vec::new();
        for e in fs::read_dir(dir)? {
            names.push(e?.file_name());
        }
        names.sort();
        Ok(names.into_iter())
    }

    fn warn(&mut self, path: &Path, what: &str) {
        self.warnings.push(format!("{}: {what}", path.display()));
    }
}

impl TreeWalk {
    /// Record entries up to the next regular file and open it for
    /// [`Read`]; false once every path has been walked. Each file is read
    /// (and segmented) on its own, so a change to one file never shifts
    /// the segments of the files after it.
    pub fn next_file(&mut self) -> io::Result<bool> {
        self.write_current();
        self.advance()
    }

    /// The entry of the file `next_file` opened, as recorded so far (its
    /// size still 0), and its size when opened.
    pub fn current(&self) -> Option<(&Node, u64)> {
        self.current.as_ref().map(|c| (&c.node, c.len))
    }

    /// Take the current file's contents as `size` bytes without reading
    /// them: its segments were reused from the parent backup.
    pub fn skip_current(&mut self, size: u64) {
        if let Some(cur) = &mut self.current {
            cur.node.size = size;
            self.offset += size;
        }
        self.write_current();
    }

    /// Take the current file's first `n` bytes without reading them (the
    /// parent's segments for them were reused); reads go on after them.
    pub fn skip_prefix(&mut self, n: u64) -> io::Result<()> {
        let Some(cur) = &mut self.current else {
            return Ok(());
        };
        if n == 0 {
            return Ok(());
        }
        let to = i64::try_from(n).map_err(io::Error::other)?;
        cur.file.seek(io::SeekFrom::Current(to)).map_err(|e| {
            let p = String::from_utf8_lossy(&cur.node.path).into_owned();
            io::Error::new(e.kind(), format!("skipping into {p}: {e}"))
        })?;
        cur.node.size += n;
        self.offset += n;
        Ok(())
    }
}

/// The contents of the current file (see [`TreeWalk::next_file`]), to its
/// end of file however long that turns out to be.
impl Read for TreeWalk {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(cur) = &mut self.current else {
            return Ok(0);
        };
        let n = cur.file.read(buf).map_err(|e| {
            let p = String::from_utf8_lossy(&cur.node.path).into_owned();
            io::Error::new(e.kind(), format!("reading {p}: {e}"))
        })?;
        cur.node.size += n as u64;
        self.offset += n as u64;
        Ok(n)
    }
}

/// Whether `meta`'s ctime is within a second of now (or in the future):
/// far more than a file system's timestamp tick (a jiffy, at most 10 ms).
fn changed_just_now(meta: &Metadata) -> bool {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(i128::MAX, |d| d.as_nanos() as i128);
    let ctime = i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec());
    ctime >= now - 1_000_000_000
}

/// The tree path of a given path: relative, without `.` components.
pub(crate) fn tree_path(p: &Path) -> io::Result<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(name) => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(name.as_bytes());
            }
            Component::ParentDir => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                    "{}: '..' in a path to back up; give the path without it (or cd there first)",
                    p.display()
                ),
                ))
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(out)
}

/// The order of a walk: by path component, each compared by its bytes,
/// a directory before what it holds (`a`, `a/b`, `a-b`: the order of
/// the entries of a directory read in byte order of their names, each
/// directory's entries right after it).
pub(crate) fn walk_order(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    a.split(|&c| c == b'/').cmp(b.split(|&c| c == b'/'))
}

/// [`node`] with the extended attributes of `source`.
fn entry(tree: Vec<u8>, kind: Kind, meta: &Metadata, target: Vec<u8>, source: &Path) -> Node {
    let mut n = node(tree, kind, meta, target);
    n.xattrs = xattrs(source);
    n
}

/// An entry with `meta`'s mode, owner and times; size and offset zero (a
/// file's grow as it is read).
fn node(path: Vec<u8>, kind: Kind, meta: &Metadata, target: Vec<u8>) -> Node {
    let mut n = Node::new(path, kind);
    n.mode = meta.mode() & 0o7777;
    n.uid = meta.uid();
    n.gid = meta.gid();
    n.mtime = Time {
        sec: meta.mtime(),
        nsec: meta.mtime_nsec() as u32,
    };
    n.atime = Time {
        sec: meta.atime(),
        nsec: meta.atime_nsec() as u32,
    };
    n.ctime = Time {
        sec: meta.ctime(),
        nsec: meta.ctime_nsec() as u32,
    };
    if kind == Kind::File {
        n.inode = meta.ino();
    }
    n.target = target;
    n
}

/// Extended attributes, without following a symlink; none where the file
/// system has none or they cannot be read (they are not worth failing a
/// backup for).
fn xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Ok(names) = xattr::list(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for name in names {
        let bytes = name.as_bytes();
        if bytes.len() > 255 {
            continue;
        }
        if let Ok(Some(value)) = xattr::get(path, &name) {
            out.push((bytes.to_vec(), value));
        }
    }
    out.sort();
    out
}

/// Open to read without following a symlink and, where allowed, without
/// updating the access time (a backup should not change what it reads).
fn open_no_follow(path: &Path) -> io::Result<File> {
    let open = |flags| {
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path)
    };
    match open(libc::O_NOFOLLOW | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(libc::O_NOFOLLOW),
        other => other,
    }
}

fn is_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR))
}

fn context(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_paths_are_named_as_tar_names_them() {
        for (given, stored) in [
            ("/usr/share/doc", "usr/share/doc"),
            ("docs", "docs"),
            ("./a/./b/", "a/b"),
            (".", ""),
            ("/", ""),
        ] {
            assert_eq!(
                tree_path(Path::new(given)).unwrap(),
                stored.as_bytes(),
                "{given}"
            );
        }
        for bad in ["..", "a/../b", "../a"] {
            let e = tree_path(Path::new(bad)).unwrap_err();
            assert!(e.to_string().contains("'..'"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_given_symlink_is_recorded_not_followed_and_parents_come_first() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("d");
        fs::create_dir(&d).unwrap();
        fs::write(d.join("f"), b"data").unwrap();
        std::os::unix::fs::symlink(&d, tmp.path().join("s")).unwrap();
        let mut walk = TreeWalk::new(&[tmp.path().join("s")]).unwrap();
        assert!(!walk.next_file().unwrap(), "followed the symlink");
        let (tree, counts, _) = walk.finish();
        let tree = tree.decode().unwrap();
        let last = tree.nodes.last().unwrap();
        assert_eq!(
            (last.kind, counts.symlinks, counts.files),
            (Kind::Symlink, 1, 0)
        );
        assert_eq!(last.target, d.as_os_str().as_bytes());
        // Every directory leading to it, outermost first.
        let parents = tmp.path().components().count() - 1;
        assert_eq!(tree.nodes.len(), parents + 1);
        assert!(tree.nodes[..parents].iter().all(|n| n.kind == Kind::Dir));
        tree.check().unwrap();
    }
}
