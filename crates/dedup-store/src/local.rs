//! `LocalDir`: objects as files under one directory, a name's `/`s as
//! subdirectories. Files are 0600 and directories 0700 (they hold every
//! byte ever backed up; see `dedup_common::perms`).
//!
//! `put` writes a temporary file (named `.tmp-<process>.…`, which no
//! valid object name can be, `<process>` naming its writer as
//! `process.rs` does) in the object's directory (a large object past the page
//! cache: `direct_write.rs`), fsyncs it, renames it into place
//! without replacing anything (so a racing `put` of the same name is refused,
//! not overwritten), then fsyncs the directory so the rename itself is
//! durable. A crash leaves at most a temporary file behind, which `list` and
//! `get` never show; `sweep_temporaries` removes those of dead processes
//! (a repository calls it when it is opened to write: other writers may
//! be putting at the same time, and theirs stay).

use std::fs::{self, DirBuilder, File, Permissions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{DirBuilderExt, FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

use dedup_common::perms;

use crate::direct_write::{write_new, Bounce};
use crate::error::{Error, Result};
use crate::name::validate;
use crate::objects::{whole_range, ObjectStore};

/// Prefix of in-flight `put` files; starts with `.` so it is never a name.
pub const TEMP_PREFIX: &str = ".tmp-";

pub struct LocalDir {
    root: PathBuf,
    /// `.tmp-<this process>.`: the prefix of this process's temporaries.
    temp_prefix: String,
    bounce: Bounce,
}

impl LocalDir {
    /// Open the store at `root`, creating it (0700) if it does not exist.
    pub fn open(root: impl Into<PathBuf>) -> Result<LocalDir> {
        let root = root.into();
        if !root.is_dir() {
            perms::create_dir_all(&root)
                .map_err(|e| Error::io(format!("creating store {}", root.display()), e))?;
        }
        Ok(LocalDir {
            root,
            temp_prefix: format!("{TEMP_PREFIX}{}.", crate::process::tag()),
            bounce: Bounce::default(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Remove the temporary files that `put`s of processes now dead left
    /// behind; how many. Those of live processes (other writers, this
    /// one) and those whose writer cannot be told stay.
    pub fn sweep_temporaries(&self) -> Result<usize> {
        let mut removed = 0;
        let mut dirs = vec![self.root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in read_dir(&dir)? {
                let (path, is_dir) = entry;
                let file_name = path.file_name().unwrap_or_default().to_string_lossy();
                if is_dir {
                    dirs.push(path);
                } else if file_name
                    .strip_prefix(TEMP_PREFIX)
                    .and_then(|rest| rest.split_once('.'))
                    .is_some_and(|(tag, _)| crate::process::tag_is_dead_here(tag))
                {
                    match fs::remove_file(&path) {
                        Ok(()) => removed += 1,
                        Err(e) if e.kind() == ErrorKind::NotFound => {}
                        Err(e) => {
                            let d = format!("removing the temporary file {} a killed writer left (remove it by hand)", path.display());
                            return Err(Error::io(d, e));
                        }
                    }
                }
            }
        }
        Ok(removed)
    }

    fn path(&self, name: &str) -> Result<PathBuf> {
        validate(name)?;
        Ok(self.root.join(name))
    }

    /// Create the missing directories between the root and `dir`, each
    /// 0700 and each made durable in its parent.
    fn make_dirs(&self, dir: &Path) -> Result<()> {
        if dir == self.root || dir.is_dir() {
            return Ok(());
        }
        let parent = dir.parent().unwrap_or(&self.root);
        self.make_dirs(parent)?;
        let ctx = || format!("creating directory {}", dir.display());
        match DirBuilder::new().mode(perms::DIR_MODE).create(dir) {
            Ok(()) => {}
            // Another put made it first: fine, it is made the same way.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(()),
            Err(e) => return Err(Error::io(ctx(), e)),
        }
        fs::set_permissions(dir, Permissions::from_mode(perms::DIR_MODE))
            .map_err(|e| Error::io(ctx(), e))?;
        sync_dir(parent)
    }

    fn open_object(&self, name: &str) -> Result<(File, u64)> {
        let path = self.path(name)?;
        let file = File::open(&path).map_err(|e| not_found_or(name, e, "opening"))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("reading the size of object {name}"), e))?;
        if meta.is_dir() {
            return Err(Error::NotFound {
                name: name.to_string(),
            });
        }
        Ok((file, meta.len()))
    }
}

impl ObjectStore for LocalDir {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let path = self.path(name)?;
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        self.make_dirs(&dir)?;
        let ctx = |what: &str| format!("{what} object {name}");
        // tempfile creates the file 0600 and removes it if we fail below.
        let tmp = tempfile::Builder::new()
            .prefix(&self.temp_prefix)
            .tempfile_in(&dir)
            .map_err(|e| Error::io(ctx("creating a temporary file for"), e))?;
        perms::set_file_mode(tmp.as_file())
            .map_err(|e| Error::io(ctx("setting the mode of"), e))?;
        write_new(tmp.as_file(), bytes, &self.bounce).map_err(|e| Error::io(ctx("writing"), e))?;
        tmp.as_file()
            .sync_all()
            .map_err(|e| Error::io(ctx("syncing"), e))?;
        tmp.persist_noclobber(&path).map_err(|e| {
            if e.error.kind() == ErrorKind::AlreadyExists {
                Error::Exists {
                    name: name.to_string(),
                }
            } else {
                Error::io(ctx("renaming into place"), e.error)
            }
        })?;
        sync_dir(&dir)
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.path(name)?;
        fs::read(&path).map_err(|e| not_found_or(name, e, "reading"))
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        whole_range(name, offset, len, self.get_upto(name, offset, len)?)
    }

    fn get_tail(&self, name: &str, len: u64) -> Result<Vec<u8>> {
        self.get_tail_sized(name, len).map(|(bytes, _)| bytes)
    }

    fn get_upto(&self, name: &str, offset: u64, len: u64) -> Result<(Vec<u8>, u64)> {
        let (file, size) = self.open_object(name)?;
        if offset > size {
            return Err(Error::out_of_range(name, offset, len, size));
        }
        Ok((read_at(&file, name, offset, len.min(size - offset))?, size))
    }

    /// One open file answers both the size and the bytes: a compaction
    /// replacing the object between two opens must not mix them.
    fn get_tail_sized(&self, name: &str, len: u64) -> Result<(Vec<u8>, u64)> {
        let (file, size) = self.open_object(name)?;
        let len = len.min(size);
        Ok((read_at(&file, name, size - len, len)?, size))
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        // Walk only the directory the prefix's full components name.
        let start_rel = prefix.rsplit_once('/').map_or("", |(dir, _)| dir);
        if !start_rel.is_empty() && validate(start_rel).is_err() {
            return Ok(Vec::new()); // no valid name can lie below it
        }
        let start = self.root.join(start_rel);
        if !start.is_dir() {
            return Ok(Vec::new());
        }
        let mut names = Vec::new();
        let mut dirs = vec![start];
        while let Some(dir) = dirs.pop() {
            for (path, is_dir) in read_dir(&dir)? {
                let Ok(rel) = path.strip_prefix(&self.root) else {
                    continue;
                };
                let Some(rel) = rel.to_str() else { continue };
                if validate(rel).is_err() {
                    continue; // temporaries and strangers are not objects
                }
                if is_dir {
                    dirs.push(path);
                } else if rel.starts_with(prefix) {
                    names.push(rel.to_string());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    fn size(&self, name: &str) -> Result<u64> {
        self.open_object(name).map(|(_, size)| size)
    }

    fn segment_hash(&self) -> crate::segment_hash::SegmentHash {
        crate::segment_hash::SegmentHash::PLAIN
    }

    fn delete(&self, name: &str) -> Result<()> {
        let path = self.path(name)?;
        fs::remove_file(&path).map_err(|e| not_found_or(name, e, "deleting"))?;
        sync_dir(path.parent().unwrap_or(&self.root))
    }
}

/// The entries of `dir` with whether each is a directory (symlinks are not
/// followed: a store never makes them).
fn read_dir(dir: &Path) -> Result<Vec<(PathBuf, bool)>> {
    let ctx = || format!("listing {}", dir.display());
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| Error::io(ctx(), e))? {
        let entry = entry.map_err(|e| Error::io(ctx(), e))?;
        let kind = entry.file_type().map_err(|e| Error::io(ctx(), e))?;
        out.push((entry.path(), kind.is_dir()));
    }
    Ok(out)
}

/// `len` bytes of object `name`'s open `file` from `offset`.
fn read_at(file: &File, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset).map_err(|e| {
        Error::io(
            format!("reading {len} bytes at {offset} of object {name}"),
            e,
        )
    })?;
    Ok(buf)
}

/// Make a directory's entries (a rename, a new file) durable.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("syncing directory {}", dir.display()), e))
}

fn not_found_or(name: &str, e: io::Error, doing: &str) -> Error {
    // A file where the name needs a directory, or a directory where it
    // needs a file, is also just "no such object".
    if matches!(
        e.kind(),
        ErrorKind::NotFound | ErrorKind::NotADirectory | ErrorKind::IsADirectory
    ) {
        Error::NotFound {
            name: name.to_string(),
        }
    } else {
        Error::io(format!("{doing} object {name}"), e)
    }
}
