//! Shared by the tree tests: what a directory tree looks like, entry by
//! entry (type, mode, owner, mtime to the nanosecond, contents, symlink
//! target, link count) plus which names share an inode, so a restore can
//! be compared with what was backed up.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: char,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: (i64, i64),
    pub nlink: u64,
    pub content: Option<Vec<u8>>,
    pub target: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    pub entries: BTreeMap<PathBuf, Entry>,
    /// Sets of names of one inode (only inodes with several names).
    pub links: BTreeSet<BTreeSet<PathBuf>>,
}

/// Everything under `root` (itself as ""), without following symlinks.
pub fn listing(root: &Path) -> Listing {
    let mut entries = BTreeMap::new();
    let mut inodes: HashMap<(u64, u64), BTreeSet<PathBuf>> = HashMap::new();
    walk(root, Path::new(""), &mut entries, &mut inodes);
    let links = inodes.into_values().filter(|s| s.len() > 1).collect();
    Listing { entries, links }
}

fn walk(
    root: &Path,
    rel: &Path,
    out: &mut BTreeMap<PathBuf, Entry>,
    inodes: &mut HashMap<(u64, u64), BTreeSet<PathBuf>>,
) {
    let path = root.join(rel);
    let m = fs::symlink_metadata(&path).unwrap();
    let ft = m.file_type();
    let kind = if ft.is_dir() {
        'd'
    } else if ft.is_file() {
        'f'
    } else if ft.is_symlink() {
        'l'
    } else if ft.is_fifo() {
        'p'
    } else {
        '?'
    };
    if !ft.is_dir() {
        inodes
            .entry((m.dev(), m.ino()))
            .or_default()
            .insert(rel.to_path_buf());
    }
    out.insert(
        rel.to_path_buf(),
        Entry {
            kind,
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            mtime: (m.mtime(), m.mtime_nsec()),
            nlink: if ft.is_dir() { 0 } else { m.nlink() },
            content: ft.is_file().then(|| fs::read(&path).unwrap()),
            target: ft.is_symlink().then(|| fs::read_link(&path).unwrap()),
        },
    );
    if ft.is_dir() {
        let mut names: Vec<_> = fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            walk(root, &rel.join(n), out, inodes);
        }
    }
}

/// Assert two listings are equal, naming the first entry that differs.
pub fn assert_same(a: &Listing, b: &Listing) {
    let ka: Vec<_> = a.entries.keys().collect();
    let kb: Vec<_> = b.entries.keys().collect();
    assert_eq!(ka, kb, "different names");
    for (p, e) in &a.entries {
        let f = &b.entries[p];
        if e != f {
            let short = |e: &Entry| Entry {
                content: e
                    .content
                    .as_ref()
                    .map(|c| c.iter().take(16).copied().collect()),
                ..e.clone()
            };
            panic!("{} differs: {:?} vs {:?}", p.display(), short(e), short(f));
        }
    }
    assert_eq!(a.links, b.links, "different hard links");
}

/// `path` without its leading `/`: where a backup of `path` restores
/// under a target.
pub fn in_target(target: &Path, path: &Path) -> PathBuf {
    target.join(path.strip_prefix("/").unwrap_or(path))
}

/// Deterministic bytes that do not repeat within themselves.
pub fn random(n: usize, seed: u64) -> Vec<u8> {
    dedup_core::testdata::noise(seed, n)
}

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}
