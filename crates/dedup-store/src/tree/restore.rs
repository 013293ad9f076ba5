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
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::repo::Repository;
use crate::restore::salvage::{note, DamagedRange};
use crate::restore::{Piece, Wanted};
use crate::tree::walk::{tree_path, WalkCounts};
use crate::tree::{Kind, Node, Time, Tree};

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
    /// Bytes written into files (damaged ranges not counted).
    pub bytes: u64,
    /// What could not be restored as it was (a device as non-root, an
    /// xattr the file system refused), one line each.
    pub warnings: Vec<String>,
    /// The files whose contents could not all be restored (a recipe part,
    /// catalog or frame they need is missing or damaged), in tree order,
    /// hard links to them included. Each is made with what could be
    /// restored and holes (zeros) where the damage is, with its owner and
    /// mode but not its times, so a tool that compares size and mtime
    /// still sees it differ from the original.
    pub damaged: Vec<DamagedEntry>,
}

/// A file restored with damage.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DamagedEntry {
    /// Where it was restored.
    pub path: String,
    /// The ranges of its contents that are holes, and why.
    pub ranges: Vec<DamagedRange>,
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
        // The tree is the one list of the backup's entries: without it
        // none can be found, or named.
        let lost = |detail: String| {
            RepoError::corrupt(
                object,
                format!("{detail}; it lists every file and directory of backup {name}, so nothing of that backup can be restored (restore another backup of them)"),
            )
        };
        let tree = match self.store.get(object) {
            Err(Error::NotFound { .. }) => return Err(lost("missing".into())),
            other => Tree::decode(object, &other?).map_err(|e| match e {
                RepoError::Corrupt { detail, .. } => lost(detail),
                e => e,
            })?,
        };
        tree.check_stream_len(name, record.report.bytes_in)
            .map_err(lost)?;
        let included = included(name, &tree, &options.include)?;
        prepare_target(target, options.force)?;
        let mut r = Restorer::new(target, &tree.nodes, included, options.owners);
        let io = |cause| RepoError::Io {
            context: format!("restoring backup {name} into {}", target.display()),
            cause,
        };
        let wanted = r.wanted();
        match self.recipe_parts(name) {
            Ok((_, parts)) => self.restore_pieces(name, parts, wanted.as_ref(), &mut |piece| {
                r.take(piece).map_err(io)
            })?,
            Err(gone @ RepoError::NoSuchBackup { .. }) => return Err(gone),
            // The recipe lost: every file's contents are, but the tree
            // still makes the rest and names each file.
            Err(e) => r.take(Piece::Damaged(tree.stream_len, e)).map_err(io)?,
        }
        r.finish().map_err(io)
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
/// skipped), how many bytes it still needs, and its damaged ranges.
struct Current {
    node: usize,
    out: Option<BufWriter<File>>,
    left: u64,
    damage: Vec<DamagedRange>,
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
    /// The damaged files' ranges by tree path, for their hard links.
    damaged: HashMap<&'t [u8], Vec<DamagedRange>>,
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
            damaged: HashMap::new(),
            report: RestoreReport::default(),
        }
    }

    /// The ranges of the stream this restore writes (`None`: all): the
    /// files included and the ones standing in for them.
    fn wanted(&self) -> Option<Wanted> {
        if self.included.iter().all(|&i| i) {
            return None;
        }
        let mut wanted = Wanted::default();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.kind == Kind::File && (self.included[i] || self.stand_in.contains_key(&i)) {
                wanted.push(n.offset..n.offset + n.size);
            }
        }
        Some(wanted)
    }

    /// Take the next piece of the stream.
    fn take(&mut self, piece: Piece) -> io::Result<()> {
        match piece {
            Piece::Data(data) => self.write_all(data),
            // A file asked for is always wanted: its bytes never skipped.
            Piece::Skipped(len) => self.pass(len, None),
            Piece::Damaged(len, e) => self.pass(len, Some(e.to_string())),
        }
    }

    /// Pass over `len` bytes of the stream that are not here: the files
    /// they belong to get holes there, named as damaged for `why`.
    fn pass(&mut self, mut len: u64, why: Option<String>) -> io::Result<()> {
        while len > 0 {
            if self.current.is_none() && !self.next_file()? {
                return Err(longer_stream());
            }
            let nodes = self.nodes;
            let cur = self.current.as_mut().expect("a file");
            let n = len.min(cur.left);
            if let Some(out) = &mut cur.out {
                let at = nodes[cur.node].size - cur.left;
                // A hole: the file is made its full length at its end.
                out.seek(SeekFrom::Current(n as i64))?;
                let why = why.clone().unwrap_or_else(|| "not read".into());
                note(&mut cur.damage, at, n, why);
            }
            cur.left -= n;
            len -= n;
            if cur.left == 0 {
                self.end_file()?;
            }
        }
        Ok(())
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
                    damage: Vec::new(),
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

    /// Close the current file and set its metadata (a damaged one's
    /// times are left as the restore made them).
    fn end_file(&mut self) -> io::Result<()> {
        let cur = self.current.take().expect("a file");
        if let Some(out) = cur.out {
            let nodes = self.nodes;
            let n = &nodes[cur.node];
            let path = self.made[n.path.as_slice()].clone();
            // Closed unsynced: one syncfs at the end is far cheaper than a
            // sync per file.
            let file = out.into_inner().map_err(|e| at(e.into_error(), &path))?;
            let intact = cur.damage.is_empty();
            if !intact {
                // A hole at the end is not made by seeking past it.
                file.set_len(n.size).map_err(|e| at(e, &path))?;
                self.name_damaged(&path, cur.damage.clone());
                self.damaged.insert(&n.path, cur.damage);
            }
            self.set_meta(n, &path, intact)?;
        }
        Ok(())
    }

    fn name_damaged(&mut self, path: &Path, ranges: Vec<DamagedRange>) {
        self.report.damaged.push(DamagedEntry {
            path: path.display().to_string(),
            ranges,
        });
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
            Kind::HardLink => self.link(n, path)?,
            Kind::Symlink | Kind::Fifo | Kind::CharDev | Kind::BlockDev => {
                self.make_other(n, path)?
            }
        }
        Ok(())
    }

    /// Make symlink or special file `n` at `path` (its own, or that of a
    /// hard link to it standing in for it).
    fn make_other(&mut self, n: &'t Node, path: PathBuf) -> io::Result<()> {
        clear(&path)?;
        if n.kind == Kind::Symlink {
            std::os::unix::fs::symlink(OsStr::from_bytes(&n.target), &path)
                .map_err(|e| at(e, &path))?;
            self.report.counts.symlinks += 1;
        } else {
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
            self.report.counts.specials += 1;
        }
        // Hard links to it (a `cp -al` tree links symlinks too) link here.
        self.made.insert(&n.path, path.clone());
        self.set_meta(n, &path, true)
    }

    /// Make hard link `n` at `path` to the entry it names, made before;
    /// if that entry was left out by `include`, a symlink or special file
    /// is made here in its stead (a file's stand-in got the contents).
    fn link(&mut self, n: &'t Node, path: PathBuf) -> io::Result<()> {
        let first = self.made.get(n.target.as_slice()).cloned();
        match first {
            // This link is the stand-in: it already has the inode.
            Some(p) if p == path => {}
            Some(p) => {
                clear(&path)?;
                hard_link_no_follow(&p, &path)?;
                if let Some(ranges) = self.damaged.get(n.target.as_slice()).cloned() {
                    self.name_damaged(&path, ranges);
                }
            }
            None => {
                let nodes = self.nodes;
                let stand_in = nodes.iter().enumerate().find(|(i, m)| {
                    m.path == n.target && !self.included[*i] && m.kind != Kind::File
                });
                match stand_in {
                    Some((_, m)) => return self.make_other(m, path),
                    None => {
                        // Not made: a device this restore could not make.
                        self.warn(&path, "hard link to an entry not restored, skipped");
                        return Ok(());
                    }
                }
            }
        }
        self.made.insert(&n.path, path);
        self.report.counts.hard_links += 1;
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
    /// A damaged file keeps the times the restore gave it (`times`
    /// false).
    fn set_meta(&mut self, n: &Node, path: &Path, times: bool) -> io::Result<()> {
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
        if !times {
            return Ok(());
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
            self.set_meta(&nodes[i], &path, true)?;
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
            return Err(longer_stream());
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

fn longer_stream() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "the backup's stream is longer than its files",
    )
}

/// Hard-link `link` to `existing` without following `existing` if it is
/// a symlink (linkat without AT_SYMLINK_FOLLOW): the link is to the
/// symlink itself, as `cp -al` made it.
fn hard_link_no_follow(existing: &Path, link: &Path) -> io::Result<()> {
    let (from, to) = (cstr(existing)?, cstr(link)?);
    // SAFETY: two NUL-terminated paths; flags 0 follows nothing.
    let rc = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            0,
        )
    };
    if rc != 0 {
        return Err(at(io::Error::last_os_error(), link));
    }
    Ok(())
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
