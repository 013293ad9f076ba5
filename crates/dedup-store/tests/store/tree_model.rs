//! Model-based: random trees changed by random operations (write, append,
//! remove, remove a directory, symlink, hard link, chmod, set times) and
//! backed up several times along the way; every backup must restore to
//! exactly what the tree was when it was taken, with its recipe whole or
//! in parts of a few segments.

use crate::tree_support;

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use dedup_store::{Repository, RestoreOptions};
use filetime::{set_symlink_file_times, FileTime};
use proptest::prelude::*;
use tree_support::*;

const DIRS: [&str; 5] = ["", "d0", "d1", "d0/e", "d0/e/f"];
const MODES: [u32; 7] = [0o644, 0o600, 0o755, 0o4755, 0o2750, 0o444, 0o1700];

#[derive(Clone, Debug)]
enum Op {
    Write {
        at: (usize, usize),
        len: usize,
        seed: u64,
    },
    Append {
        at: (usize, usize),
        len: usize,
        seed: u64,
    },
    Remove {
        at: (usize, usize),
    },
    RemoveDir {
        dir: usize,
    },
    Symlink {
        at: (usize, usize),
        to: usize,
    },
    HardLink {
        from: (usize, usize),
        to: (usize, usize),
    },
    Chmod {
        at: (usize, usize),
        mode: usize,
    },
    Touch {
        at: (usize, usize),
        sec: i64,
        nsec: u32,
    },
    Backup,
}

fn at() -> impl Strategy<Value = (usize, usize)> {
    (0..DIRS.len(), 0..4usize)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (at(), 0..20_000usize, any::<u64>()).prop_map(|(at, len, seed)| Op::Write { at, len, seed }),
        2 => (at(), 0..5_000usize, any::<u64>()).prop_map(|(at, len, seed)| Op::Append { at, len, seed }),
        1 => at().prop_map(|at| Op::Remove { at }),
        1 => (1..DIRS.len()).prop_map(|dir| Op::RemoveDir { dir }),
        1 => (at(), 0..4usize).prop_map(|(at, to)| Op::Symlink { at, to }),
        1 => (at(), at()).prop_map(|(from, to)| Op::HardLink { from, to }),
        1 => (at(), 0..MODES.len()).prop_map(|(at, mode)| Op::Chmod { at, mode }),
        1 => (at(), 0..2_000_000_000i64, 0..1_000_000_000u32)
            .prop_map(|(at, sec, nsec)| Op::Touch { at, sec, nsec }),
        2 => Just(Op::Backup),
    ]
}

fn path(root: &Path, (d, f): (usize, usize)) -> PathBuf {
    root.join(DIRS[d]).join(format!("f{f}"))
}

/// Apply `op`; operations that do not fit the tree as it is do nothing.
fn apply(root: &Path, op: &Op) {
    match *op {
        Op::Write { at, len, seed } | Op::Append { at, len, seed } => {
            let p = path(root, at);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            if fs::symlink_metadata(&p).is_ok_and(|m| m.is_symlink()) {
                fs::remove_file(&p).unwrap();
            }
            let mut data = if matches!(op, Op::Append { .. }) {
                fs::read(&p).unwrap_or_default()
            } else {
                Vec::new()
            };
            data.extend(random(len, seed));
            fs::write(&p, data).unwrap();
        }
        Op::Remove { at } => {
            let _ = fs::remove_file(path(root, at));
        }
        Op::RemoveDir { dir } => {
            let _ = fs::remove_dir_all(root.join(DIRS[dir]));
        }
        Op::Symlink { at, to } => {
            let p = path(root, at);
            if fs::create_dir_all(p.parent().unwrap()).is_ok() {
                let _ = fs::remove_file(&p);
                symlink(format!("f{to}"), &p).unwrap();
            }
        }
        Op::HardLink { from, to } => {
            let (a, b) = (path(root, from), path(root, to));
            if fs::symlink_metadata(&a).is_ok_and(|m| m.is_file())
                && !b.exists()
                && b.parent().unwrap().is_dir()
            {
                let _ = fs::remove_file(&b); // a dangling symlink
                fs::hard_link(&a, &b).unwrap();
            }
        }
        Op::Chmod { at, mode } => {
            let p = path(root, at);
            if fs::symlink_metadata(&p).is_ok_and(|m| m.is_file()) {
                fs::set_permissions(&p, fs::Permissions::from_mode(MODES[mode])).unwrap();
            }
        }
        Op::Touch { at, sec, nsec } => {
            let p = path(root, at);
            if fs::symlink_metadata(&p).is_ok() {
                let t = FileTime::from_unix_time(sec, nsec);
                set_symlink_file_times(&p, t, t).unwrap();
            }
        }
        Op::Backup => unreachable!("the test takes backups"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn every_backup_restores_to_its_snapshot(
        ops in proptest::collection::vec(op(), 1..40),
        // Recipes in parts of a few segments, or whole.
        part in prop_oneof![1..8usize, Just(1usize << 16)],
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        fs::create_dir(&root).unwrap();
        let repo = Repository::init(tmp.path().join("repo")).unwrap();
        repo.set_recipe_part_segments(part);
        let mut snapshots = Vec::new();
        for op in ops.iter().chain([&Op::Backup]) {
            if let Op::Backup = op {
                let name = format!("b{}", snapshots.len());
                let r = repo.backup_paths(&name, "g", &[&root], |_| {}).unwrap();
                prop_assert!(r.warnings.is_empty(), "{:?}", r.warnings);
                snapshots.push((name, listing(&root)));
            } else {
                apply(&root, op);
            }
        }
        for (name, want) in &snapshots {
            let target = tmp.path().join(format!("t-{name}"));
            repo.restore_tree(name, &target, &RestoreOptions::default()).unwrap();
            assert_same(want, &listing(&in_target(&target, &root)));
        }
    }
}
