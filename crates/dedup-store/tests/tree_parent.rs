//! Backups of files reuse the unchanged files of the newest backup of
//! files in their group without reading them; a file whose size, mtime,
//! ctime or inode changed is read again, and every backup restores to its
//! own snapshot, also after the parent is deleted and collected.

mod tree_support;

use std::fs;
use std::path::Path;

use dedup_store::{GcOptions, Repository, RestoreOptions};
use filetime::{set_file_mtime, FileTime};
use tree_support::*;

fn files(root: &Path) -> std::path::PathBuf {
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

fn restored_matches(repo: &Repository, name: &str, source: &Path, tmp: &Path) {
    let target = tmp.join(format!("restore-{name}"));
    repo.restore_tree(name, &target, &RestoreOptions::default())
        .unwrap();
    for e in walk(source) {
        let back = in_target(&target, &e);
        if e.is_file() {
            assert!(
                fs::read(&e).unwrap() == fs::read(&back).unwrap(),
                "{}",
                e.display()
            );
        }
    }
}

fn walk(p: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![p.to_path_buf()];
    if p.is_dir() {
        for e in fs::read_dir(p).unwrap() {
            out.extend(walk(&e.unwrap().path()));
        }
    }
    out
}

fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(1100));
}

#[test]
fn unchanged_files_are_reused_unread_and_changed_ones_are_read() {
    let tmp = tempfile::tempdir().unwrap();
    let data = files(tmp.path());
    // A file changed within a second of being read is read again next
    // time (a write in the same timestamp tick would go unseen): let the
    // new files age first.
    settle();
    let repo = Repository::init(tmp.path().join("repo")).unwrap();
    let first = repo.backup_paths("one", "g", &[&data], |_| {}).unwrap();
    assert_eq!(first.parent, None);
    assert_eq!(first.files_unchanged, 0);

    let second = repo.backup_paths("two", "g", &[&data], |_| {}).unwrap();
    assert_eq!(second.parent.as_deref(), Some("one"));
    assert_eq!(second.files_unchanged, 21, "{second:?}");
    assert_eq!(second.backup.bytes_new, 0);
    assert_eq!(second.backup.bytes_in, first.backup.bytes_in);

    // Same size and mtime, new contents: only ctime tells, and it must.
    let f3 = data.join("sub/f3");
    let mtime = FileTime::from_last_modification_time(&fs::metadata(&f3).unwrap());
    let mut changed = fs::read(&f3).unwrap();
    changed[100] ^= 0xff;
    std::thread::sleep(std::time::Duration::from_millis(20));
    fs::write(&f3, &changed).unwrap();
    set_file_mtime(&f3, mtime).unwrap();
    // A new file, and one grown.
    fs::write(data.join("sub/new"), random(7000, 1000)).unwrap();
    let mut f5 = fs::read(data.join("sub/f5")).unwrap();
    f5.extend_from_slice(b"more");
    fs::write(data.join("sub/f5"), &f5).unwrap();
    settle();
    let third = repo.backup_paths("three", "g", &[&data], |_| {}).unwrap();
    assert_eq!(third.parent.as_deref(), Some("two"));
    assert_eq!(third.files_unchanged, 19, "{third:?}");
    fs::remove_file(data.join("sub/new")).unwrap();
    fs::write(data.join("sub/new"), random(7000, 1000)).unwrap();
    settle();
    let fourth = repo.backup_paths("four", "g", &[&data], |_| {}).unwrap();
    assert_eq!(
        fourth.files_unchanged, 21,
        "all but the rewritten one: {fourth:?}"
    );
    // Written just before a backup reads it: the backup after that reads
    // it again even though nothing changed since, because a write in the
    // same timestamp tick would have left its mtime and ctime alone.
    fs::write(data.join("sub/f0"), random(5000, 0)).unwrap();
    let racy = repo.backup_paths("racy", "g", &[&data], |_| {}).unwrap();
    assert_eq!(racy.files_unchanged, 21, "{racy:?}");
    let after = repo.backup_paths("after", "g", &[&data], |_| {}).unwrap();
    assert_eq!(after.files_unchanged, 21, "f0 is read again: {after:?}");

    // Another group has no parent here.
    let other = repo.backup_paths("other", "h", &[&data], |_| {}).unwrap();
    assert_eq!(other.files_unchanged, 0);

    restored_matches(&repo, "three", &data, tmp.path());
    // The parents go; what "three" reused from them must stay.
    repo.delete_backup("one").unwrap();
    repo.delete_backup("two").unwrap();
    repo.gc(&GcOptions::default()).unwrap();
    fs::remove_dir_all(tmp.path().join("restore-three")).unwrap();
    restored_matches(&repo, "three", &data, tmp.path());
}
