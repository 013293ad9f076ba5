//! Restoring a backup of files into a directory: the tree object says what
//! to create; the backup's stream, restored as any stream is (every
//! segment checked), is split into the files as it arrives.
//!
//! Entries are created in tree order, which puts every directory before
//! what it holds; a file's metadata is set once its contents are written,
//! a directory's last, deepest first, so writing into it does not change
//! its times and a read-only mode does not stop its contents being made.
//! Ownership is restored only when running as root (otherwise the
//! restorer owns everything, and modes are still restored). Nothing is
//! synced file by file: one `syncfs` makes the whole restore durable
//! before it reports success.
//!
//! The tree is untrusted input: `Tree::decode` refuses absolute paths,
//! `..`, and entries whose parent is not an earlier directory, and every
//! directory on the way is one this restore made or found as a real
//! directory (never a symlink), so nothing is written outside the target.
//! Over existing files (`force`), whatever is in the way of an entry is
//! removed first: a symlink in the target is replaced, never followed.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::repo::Repository;
use crate::repo_error::{RepoError, RepoResult};
use crate::tree::{Kind, Node, Time, Tree};
use crate::tree_walk::{tree_path, WalkCounts};

#[derive(Clone, Debug)]
pub struct RestoreOptions {
    /// Restore only the entries at or under these paths (tree paths, as
    /// `dedup list` names them; a leading `/` is ignored), and the
    /// directories leading to them. Empty: everything.
    pub include: Vec<PathBuf>,
    /// Restore into a directory that is not empty, replacing what is in
    /// the way.
    pub force: bool,
    /// Restore owners (uid, gid): by default only as root.
    pub owners: bool,
}

impl Default for RestoreOptions {
    fn default() -> RestoreOptions {
        RestoreOptions {
            include: Vec::new(),
            force: false,
            // SAFETY: geteuid has no preconditions and cannot fail.
            owners: unsafe { libc::geteuid() } == 0,
        }
    }
}

/// What a restore made.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RestoreReport {
    #[serde(flatten)]
    pub counts: WalkCounts,
    /// Bytes written into files.
    pub bytes: u64,
    /// What could not be restored as it was (a device as non-root, an
    /// xattr the file system refused), one line each.
    pub warnings: Vec<String>,
}

impl Repository {
    /// Restore backup `name`, a backup of files, into directory `target`.
    pub fn restore_tree(
        &self,
        name: &str,
        target: &Path,
        options: &RestoreOptions,
    ) -> RepoResult<RestoreReport> {
        let record = self.backup(name)?;
        let Some(object) = &record.tree else {
            return Err(RepoError::WrongKind {
                name: name.into(),
                detail: "is a stream, not files: restore it to a file".into(),
            });
        };
        let tree = match self.store.get(object) {
            Err(Error::NotFound { .. }) => {
                return Err(RepoError::corrupt(
                    object,
                    format!("missing, but backup {name} needs it"),
                ))
            }
            other => Tree::decode(object, &other?)?,
        };
        tree.check_stream_len(name, record.report.bytes_in)
            .map_err(|d| RepoError::corrupt(object, d))?;
        let included = included(name, &tree, &options.include)?;
        prepare_target(target, options.force)?;
        let mut r = Restorer::new(target, &tree.nodes, included, options.owners);
        self.restore(name, &mut r)?;
        r.finish().map_err(|cause| RepoError::Io {
            context: format!("restoring backup {name} into {}", target.display()),
            cause,
        })
    }
}

/// Which entries to restore: those at or under an included path, and
/// the directories leading to them. Every included path must hold one.
fn included(name: &str, tree: &Tree, include: &[PathBuf]) -> RepoResult<Vec<bool>> {
    if include.is_empty() {
        return Ok(vec![true; tree.nodes.len()]);
    }
    let mut wanted = Vec::new();
    for p in include {
        let no_path = || RepoError::NoSuchPath {
            name: name.into(),
            path: p.display().to_string(),
        };
        let t = tree_path(p).map_err(|_| no_path())?;
        if t.is_empty() {
            return Ok(vec![true; tree.nodes.len()]);
        }
        if !tree.nodes.iter().any(|n| under(&n.path, &t)) {
            return Err(no_path());
        }
        wanted.push(t);
    }
    Ok(tree
        .nodes
        .iter()
        .map(|n| {
            wanted
                .iter()
                .any(|w| under(&n.path, w) || (n.kind == Kind::Dir && under(w, &n.path)))
        })
        .collect())
}

/// `path` is `dir` or inside it.
fn under(path: &[u8], dir: &[u8]) -> bool {
    path.starts_with(dir) && (path.len() == dir.len() || path[dir.len()] == b'/')
}

/// Create `target`, or check that it is an empty directory (or `force`).
fn prepare_target(target: &Path, force: bool) -> RepoResult<()> {
    let io = |cause| RepoError::Io {
        context: format!("restoring into {}", target.display()),
        cause,
    };
    match fs::read_dir(target) {
        Ok(mut entries) => {
            if entries.next().is_some() && !force {
                return Err(RepoError::TargetNotEmpty {
                    dir: target.to_path_buf(),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir_all(target).map_err(io),
        Err(e) => Err(io(e)),
    }
}

/// The file being written: where to (`None`: not included, its bytes are
/// skipped) and how many bytes it still needs.
struct Current {
    node: usize,
    out: Option<BufWriter<File>>,
    left: u64,
}

/// A `Write` that takes the backup's stream and makes the tree.
struct Restorer<'t> {
    target: PathBuf,
    nodes: &'t [Node],
    included: Vec<bool>,
    /// An excluded file's included hard links: the first gets the contents
    /// (and the file's metadata), the others link to it.
    stand_in: HashMap<usize, usize>,
    next: usize,
    current: Option<Current>,
    owners: bool,
    /// Tree path of each entry made, for hard links to name.
    made: HashMap<&'t [u8], PathBuf>,
    dirs: Vec<usize>,
    report: RestoreReport,
}

impl<'t> Restorer<'t> {
    fn new(target: &Path, nodes: &'t [Node], included: Vec<bool>, owners: bool) -> Restorer<'t> {
        let index: HashMap<&[u8], usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.path.as_slice(), i))
            .collect();
        let mut stand_in = HashMap::new();
        for (i, n) in nodes.iter().enumerate() {
            if n.kind == Kind::HardLink && included[i] {
                let first = index[n.target.as_slice()];
                if !included[first] {
                    stand_in.entry(first).or_insert(i);
                }
            }
        }
        Restorer {
            target: target.to_path_buf(),
            nodes,
            included,
            stand_in,
            next: 0,
            current: None,
            owners,
            made: HashMap::new(),
            dirs: Vec::new(),
            report: RestoreReport::default(),
        }
    }

    fn full(&self, tree_path: &[u8]) -> PathBuf {
        self.target.join(OsStr::from_bytes(tree_path))
    }

    /// Make the entries up to the next file with contents to come and
    /// open it; false at the end of the tree.
    fn next_file(&mut self) -> io::Result<bool> {
        while self.next < self.nodes.len() {
            let i = self.next;
            self.next += 1;
            let nodes = self.nodes;
            let n = &nodes[i];
            if n.kind == Kind::File {
                let out = self.open_file(i)?;
                self.current = Some(Current {
                    node: i,
                    out,
                    left: n.size,
                });
                if n.size == 0 {
                    self.end_file()?;
                    continue;
                }
                return Ok(true);
            }
            self.make(i)?;
        }
        Ok(false)
    }

    /// Create file `i` (or its stand-in), empty; `None` if not included.
    fn open_file(&mut self, i: usize) -> io::Result<Option<BufWriter<File>>> {
        let nodes = self.nodes;
        let n = &nodes[i];
        let path = if self.included[i] {
            self.full(&n.path)
        } else if let Some(&link) = self.stand_in.get(&i) {
            // The link's directory may come later in the tree.
            let link_path = &self.nodes[link].path;
            self.make_parents(link_path)?;
            self.full(link_path)
        } else {
            return Ok(None);
        };
        clear(&path)?;
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| at(e, &path))?;
        self.made.insert(&n.path, path);
        self.report.counts.files += 1;
        Ok(Some(BufWriter::with_capacity(256 << 10, file)))
    }

    /// Close the current file and set its metadata.
    fn end_file(&mut self) -> io::Result<()> {
        let cur = self.current.take().expect("a file");
        if let Some(out) = cur.out {
            let path = &self.made[self.nodes[cur.node].path.as_slice()];
            // Closed unsynced: one syncfs at the end is far cheaper than a
            // sync per file.
            out.into_inner().map_err(|e| at(e.into_error(), path))?;
            let path = path.clone();
            let nodes = self.nodes;
            self.set_meta(&nodes[cur.node], &path)?;
        }
        Ok(())
    }

    /// Make entry `i`, which has no contents.
    fn make(&mut self, i: usize) -> io::Result<()> {
        if !self.included[i] {
            return Ok(());
        }
        let nodes = self.nodes;
        let n = &nodes[i];
        let path = self.full(&n.path);
        match n.kind {
            Kind::Dir => {
                make_dir(&path)?;
                self.dirs.push(i);
                self.report.counts.dirs += 1;
            }
            Kind::File => unreachable!("files are made by open_file"),
            Kind::Symlink => {
                clear(&path)?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&n.target), &path)
                    .map_err(|e| at(e, &path))?;
                self.set_meta(n, &path)?;
                self.report.counts.symlinks += 1;
            }
            Kind::HardLink => {
                let first = self.made.get(n.target.as_slice()).cloned();
                match first {
                    // This link is the stand-in: it already has the inode.
                    Some(p) if p == path => {}
                    Some(p) => {
                        clear(&path)?;
                        fs::hard_link(&p, &path).map_err(|e| at(e, &path))?;
                    }
                    None => {
                        // Not made: a device this restore could not make.
                        self.warn(&path, "hard link to an entry not restored, skipped");
                        return Ok(());
                    }
                }
                self.made.insert(&n.path, path);
                self.report.counts.hard_links += 1;
            }
            Kind::Fifo | Kind::CharDev | Kind::BlockDev => {
                clear(&path)?;
                let (kind, rdev) = match n.kind {
                    Kind::Fifo => (libc::S_IFIFO, 0),
                    Kind::CharDev => (libc::S_IFCHR, n.rdev),
                    _ => (libc::S_IFBLK, n.rdev),
                };
                let c = cstr(&path)?;
                // SAFETY: c is a NUL-terminated path.
                if unsafe { libc::mknod(c.as_ptr(), kind | 0o600, rdev as libc::dev_t) } != 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::PermissionDenied {
                        self.warn(&path, "a device needs root to be made, skipped");
                        return Ok(());
                    }
                    return Err(at(e, &path));
                }
                self.made.insert(&n.path, path.clone());
                self.set_meta(n, &path)?;
                self.report.counts.specials += 1;
            }
        }
        Ok(())
    }

    /// Make the directories leading to `tree_path` that are not made yet
    /// (their metadata is set when the tree reaches them).
    fn make_parents(&self, tree_path: &[u8]) -> io::Result<()> {
        let mut dir = self.target.clone();
        let parts: Vec<&[u8]> = tree_path.split(|&b| b == b'/').collect();
        for part in &parts[..parts.len() - 1] {
            dir.push(OsStr::from_bytes(part));
            make_dir(&dir)?;
        }
        Ok(())
    }

    /// Owner, xattrs, mode, then times: chown clears setuid bits and
    /// capabilities, and times must come after every other change.
    fn set_meta(&mut self, n: &Node, path: &Path) -> io::Result<()> {
        let c = cstr(path)?;
        if self.owners {
            // SAFETY: c is a NUL-terminated path; lchown does not follow.
            if unsafe { libc::lchown(c.as_ptr(), n.uid, n.gid) } != 0 {
                return Err(at(io::Error::last_os_error(), path));
            }
        }
        for (name, value) in &n.xattrs {
            if xattr::set(path, OsStr::from_bytes(name), value).is_err() {
                let name = String::from_utf8_lossy(name).into_owned();
                self.warn(path, &format!("xattr {name} not restored"));
            }
        }
        if n.kind != Kind::Symlink {
            fs::set_permissions(path, fs::Permissions::from_mode(n.mode))
                .map_err(|e| at(e, path))?;
        }
        let ts = [timespec(n.atime), timespec(n.mtime)];
        // SAFETY: c is a NUL-terminated path and ts two timespecs.
        let rc = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                ts.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return Err(at(io::Error::last_os_error(), path));
        }
        Ok(())
    }

    /// Make what is left of the tree, then set directories' metadata,
    /// deepest first (reverse tree order puts children before parents).
    fn finish(mut self) -> io::Result<RestoreReport> {
        if self.current.is_some() || self.next_file()? {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the backup's stream ended before its files did",
            ));
        }
        for &i in self.dirs.clone().iter().rev() {
            let nodes = self.nodes;
            let path = self.full(&nodes[i].path);
            self.set_meta(&nodes[i], &path)?;
        }
        let dir = File::open(&self.target).map_err(|e| at(e, &self.target))?;
        // SAFETY: a valid open descriptor.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } != 0 {
            return Err(at(io::Error::last_os_error(), &self.target));
        }
        Ok(self.report)
    }

    fn warn(&mut self, path: &Path, what: &str) {
        self.report
            .warnings
            .push(format!("{}: {what}", path.display()));
    }
}

impl Write for Restorer<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.current.is_none() && !self.next_file()? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the backup's stream is longer than its files",
            ));
        }
        let cur = self.current.as_mut().expect("a file");
        let n = buf
            .len()
            .min(usize::try_from(cur.left).unwrap_or(usize::MAX));
        if let Some(out) = &mut cur.out {
            out.write_all(&buf[..n])?;
            self.report.bytes += n as u64;
        }
        cur.left -= n as u64;
        if cur.left == 0 {
            self.end_file()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Make directory `path`, or keep the real directory already there;
/// anything else in the way (a file, a symlink) is removed first. Made
/// owner-only: its mode is set after its contents.
fn make_dir(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => return Ok(()),
        Ok(_) => fs::remove_file(path).map_err(|e| at(e, path))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(at(e, path)),
    }
    fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(|e| at(e, path))
}

/// Remove whatever is at `path` (restoring with force over a previous
/// restore or other files); a directory goes with its contents.
fn clear(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
    .map_err(|e| at(e, path))
}

fn timespec(t: Time) -> libc::timespec {
    libc::timespec {
        tv_sec: t.sec as libc::time_t,
        tv_nsec: t.nsec as _,
    }
}

fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path holds NUL"))
}

fn at(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}
