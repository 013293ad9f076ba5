//! Shared by the store-check tests: a small repository with backups that
//! share segments (so damage costs more than one backup), the check run on
//! it, the restores that show which backups damage really costs, and a
//! snapshot of every file to prove the check wrote nothing.

#![allow(dead_code)] // each test file uses its own part

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use dedup_store::check::{check, CheckOptions, CheckReport};
use dedup_store::{LocalDir, RepoOptions, Repository, Segmenting};
use rand::{rngs::StdRng, RngCore, SeedableRng};

pub fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Bytes LZ4 compresses, so segments are stored both ways.
pub fn text(n: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 64);
    let mut i = seed;
    while out.len() < n {
        out.extend_from_slice(format!("line {i}: the quick brown fox jumps\n").as_bytes());
        i += 1;
    }
    out.truncate(n);
    out
}

pub struct Fixture {
    pub tmp: tempfile::TempDir,
    /// Backup names and what each backed up.
    pub backups: Vec<(String, Vec<u8>)>,
}

/// Three backups in 16 KiB containers: `b` is `a` with one block changed
/// and a tail added (so they share most segments), `c` is unrelated.
pub fn fixture(segmenting: Segmenting) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let options = RepoOptions {
        segmenting,
        container_target: 16 << 10,
        force: false,
        ..RepoOptions::default()
    };
    let repo = Repository::init_with(tmp.path(), options).unwrap();
    let a = [random(14_000, 1), text(10_000, 0)].concat();
    let mut b = a.clone();
    b[4096..8192].copy_from_slice(&random(4096, 2));
    b.extend_from_slice(&random(2000, 3));
    let c = [text(7000, 500), random(3000, 4)].concat();
    let mut backups = Vec::new();
    for (name, data) in [("a", a), ("b", b), ("c", c)] {
        repo.backup_stream(name, "g", &data[..]).unwrap();
        backups.push((name.to_string(), data));
    }
    Fixture { tmp, backups }
}

impl Fixture {
    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    pub fn check(&self, data: bool) -> CheckReport {
        let store = LocalDir::open(self.dir()).unwrap();
        check(&store, CheckOptions { data }, &|_| {}).unwrap()
    }

    /// The backups that fail to restore (or restore wrong) as things are.
    pub fn unrestorable(&self) -> BTreeSet<String> {
        let all = || self.backups.iter().map(|(n, _)| n.clone()).collect();
        let Ok(repo) = Repository::open_read_only(self.dir()) else {
            return all();
        };
        let mut out = BTreeSet::new();
        for (name, data) in &self.backups {
            let mut got = Vec::new();
            if repo.restore(name, &mut got).is_err() || got != *data {
                out.insert(name.clone());
            }
        }
        out
    }

    pub fn recipe_object(&self, backup: &str) -> String {
        let repo = Repository::open_read_only(self.dir()).unwrap();
        repo.backup(backup).unwrap().recipe
    }

    pub fn path(&self, object: &str) -> PathBuf {
        self.dir().join(object)
    }

    /// The container objects, sorted.
    pub fn containers(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.path("containers"))
            .unwrap()
            .map(|e| format!("containers/{}", e.unwrap().file_name().to_str().unwrap()))
            .collect();
        names.sort();
        names
    }
}

/// Every file and directory under `dir`: mode, size, mtime and contents.
pub type Snapshot = BTreeMap<PathBuf, (u32, u64, i64, i64, Vec<u8>)>;

pub fn snapshot(dir: &Path) -> Snapshot {
    let mut out = BTreeMap::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let m = fs::symlink_metadata(&path).unwrap();
            let bytes = if m.is_dir() {
                dirs.push(path.clone());
                Vec::new()
            } else {
                fs::read(&path).unwrap()
            };
            let key = (m.mode(), m.len(), m.mtime(), m.mtime_nsec(), bytes);
            out.insert(path, key);
        }
    }
    let m = fs::metadata(dir).unwrap();
    out.insert(
        dir.to_path_buf(),
        (m.mode(), 0, m.mtime(), m.mtime_nsec(), Vec::new()),
    );
    out
}
