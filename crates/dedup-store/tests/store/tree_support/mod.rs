//! Shared by the tree tests: what a directory tree looks like, entry by
//! entry (type, mode, owner, mtime to the nanosecond, contents, symlink
//! target, link count) plus which names share an inode, so a restore can
//! be compared with what was backed up; `build`, a tree with one of
//! every kind of entry; and, for the parent tests, `files`, plain files to
//! back up again, `settle` and `edit_some`.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use filetime::{set_symlink_file_times, FileTime};

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
    dedup_common::testdata::noise(seed, n)
}

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

pub fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

pub fn mkfifo(p: &Path) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o640) }, 0);
}

/// A tree with one of everything under `root/data`; returns `root/data`.
pub fn build(root: &Path) -> PathBuf {
    let d = root.join("data");
    for dir in ["a/b/c", "empty_dir", "sticky", "readonly", "closed"] {
        fs::create_dir_all(d.join(dir)).unwrap();
    }
    let big = random(3 << 20, 1);
    fs::write(d.join("big"), &big).unwrap();
    fs::write(d.join("a/b/copy_of_big"), &big).unwrap();
    fs::write(d.join("empty"), b"").unwrap();
    fs::write(d.join("a/small"), b"small\n").unwrap();
    fs::write(d.join("a/b/c/deep"), random(10_000, 2)).unwrap();
    fs::write(d.join("readonly/inside"), b"kept").unwrap();
    for (name, mode) in [
        ("m0644", 0o644),
        ("m0755", 0o755),
        ("m4755", 0o4755),
        ("m0000", 0),
    ] {
        fs::write(d.join(name), name).unwrap();
        chmod(&d.join(name), mode);
    }
    fs::write(d.join("a/hard1"), b"one inode, two names").unwrap();
    fs::hard_link(d.join("a/hard1"), d.join("hard2")).unwrap();
    symlink("a/small", d.join("link")).unwrap();
    symlink("nowhere/at/all", d.join("dangling")).unwrap();
    symlink("/etc/passwd", d.join("absolute")).unwrap();
    mkfifo(&d.join("fifo"));
    let _ = xattr::set(d.join("a/small"), "user.dedup", b"attr value");
    if is_root() {
        std::os::unix::fs::chown(d.join("a/small"), Some(1234), Some(5678)).unwrap();
        std::os::unix::fs::lchown(d.join("link"), Some(4321), Some(8765)).unwrap();
    }
    // Times last, directories after their contents, nanoseconds odd.
    let mut all = Vec::new();
    collect(&d, &mut all);
    for (i, p) in all.iter().rev().enumerate() {
        let t = FileTime::from_unix_time(1_600_000_000 + i as i64 * 1000, 123_456_789 + i as u32);
        set_symlink_file_times(p, t, t).unwrap();
    }
    chmod(&d.join("sticky"), 0o1777);
    chmod(&d.join("readonly"), 0o555);
    chmod(&d.join("closed"), 0);
    // chmod does not change mtime, so the times above stand.
    d
}

/// Every path under `p` (itself first), parents before children.
pub fn collect(p: &Path, out: &mut Vec<PathBuf>) {
    out.push(p.to_path_buf());
    if fs::symlink_metadata(p).unwrap().is_dir() {
        let mut names: Vec<_> = fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for n in names {
            collect(&n, out);
        }
    }
}

/// 20 small files under `root/data/sub` and a large one; `root/data`.
pub fn files(root: &Path) -> PathBuf {
    let d = root.join("data");
    fs::create_dir_all(d.join("sub")).unwrap();
    for i in 0..20u64 {
        fs::write(
            d.join(format!("sub/f{i}")),
            random(5000 + 3000 * i as usize, i),
        )
        .unwrap();
    }
    fs::write(d.join("big"), random(1 << 20, 99)).unwrap();
    d
}

/// Past the second in which files were last written: a file changed
/// within a second of a backup's start is read again by the next (a write
/// in the same timestamp tick would go unseen), so let new files age.
pub fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(1100));
}

/// Change three of `files`' files, each in a way a backup must see: new
/// contents of `sub/f3` with its size and mtime kept (only ctime tells),
/// a new `sub/new`, and `sub/f5` grown.
pub fn edit_some(data: &Path) {
    let f3 = data.join("sub/f3");
    let mtime = FileTime::from_last_modification_time(&fs::metadata(&f3).unwrap());
    let mut changed = fs::read(&f3).unwrap();
    changed[100] ^= 0xff;
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(&f3, &changed).unwrap();
    filetime::set_file_mtime(&f3, mtime).unwrap();
    fs::write(data.join("sub/new"), random(7000, 1000)).unwrap();
    let mut f5 = fs::read(data.join("sub/f5")).unwrap();
    f5.extend_from_slice(b"more");
    fs::write(data.join("sub/f5"), &f5).unwrap();
}
