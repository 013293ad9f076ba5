//! Backups of files reuse the unchanged files of the newest backup of
//! files in their group without reading them; a file whose size, mtime,
//! ctime or inode changed is read again, and every backup restores to its
//! own snapshot, also after the parent is deleted and collected. A parent
//! whose recipe is in parts is read part by part; a part of it that is
//! missing or damaged only costs reading the files it covers, from the
//! last segment boundary before it.

use crate::tree_support;

use std::fs;
use std::path::Path;

use dedup_store::recipe::parts::{part_name, RecipeObject};
use dedup_store::{
    container_name, GcOptions, Recipe, RepoOptions, Repository, RestoreOptions, Segmenting,
};
use tree_support::*;

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

    edit_some(&data);
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

/// Segments a part of a recipe holds in the parts tests.
const PART: usize = 5;

/// A repository at `dir` whose recipes are in parts of `PART` segments,
/// in small containers.
fn init_in_parts(dir: &Path, segmenting: Segmenting) -> Repository {
    let options = RepoOptions {
        segmenting,
        container_target: 64 << 10,
        ..RepoOptions::default()
    };
    let repo = Repository::init_with(dir, options).unwrap();
    repo.set_recipe_part_segments(PART);
    repo
}

/// Backup `name`'s recipe object and where each of its parts starts in
/// its stream (then the stream's end).
fn part_starts(repo: &Repository, dir: &Path, name: &str) -> (String, Vec<u64>) {
    let recipe = repo.backup(name).unwrap().recipe;
    let RecipeObject::Index(index) =
        RecipeObject::decode(&recipe, &fs::read(dir.join(&recipe)).unwrap()).unwrap()
    else {
        panic!("{recipe} is not in parts");
    };
    let mut starts = vec![0];
    for p in &index.parts {
        starts.push(starts.last().unwrap() + p.bytes);
    }
    (recipe, starts)
}

#[test]
fn a_parent_in_parts_is_reused_part_by_part_and_a_lost_part_costs_a_read() {
    for (segmenting, flip) in [(Segmenting::DEFAULT, false), (Segmenting::FASTCDC_4K, true)] {
        let tmp = tempfile::tempdir().unwrap();
        let data = files(tmp.path());
        settle();
        let dir = tmp.path().join("repo");
        let repo = init_in_parts(&dir, segmenting);
        let one = repo.backup_paths("one", "g", &[&data], |_| {}).unwrap();
        let two = repo.backup_paths("two", "g", &[&data], |_| {}).unwrap();
        assert_eq!(two.parent.as_deref(), Some("one"));
        assert_eq!(two.files_unchanged, 21, "{segmenting:?}: {two:?}");
        assert_eq!(two.bytes_unchanged, one.backup.bytes_in);
        assert_eq!(two.backup.bytes_new, 0);

        // "big" (1 MiB) is the first file of the stream: lose a part well
        // inside it. The parts before it are reused, the rest of "big"
        // is read and, cut from a boundary of the parent's segments, is
        // cut as it was: nothing new is stored.
        let (recipe, starts) = part_starts(&repo, &dir, "two");
        let k = starts.iter().position(|&s| s > 300 << 10).unwrap();
        assert!(
            starts[k + 1] < 1 << 20,
            "{segmenting:?}: part {k} ends in big"
        );
        let part = dir.join(part_name(&recipe, k));
        if flip {
            let mut bytes = fs::read(&part).unwrap();
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x10;
            fs::write(&part, bytes).unwrap();
        } else {
            fs::remove_file(&part).unwrap();
        }
        let three = repo.backup_paths("three", "g", &[&data], |_| {}).unwrap();
        assert_eq!(three.parent.as_deref(), Some("two"));
        assert_eq!(three.files_unchanged, 20, "{segmenting:?}: {three:?}");
        let read = (1 << 20) - starts[k];
        assert_eq!(three.bytes_unchanged, one.backup.bytes_in - read);
        assert_eq!(three.backup.bytes_in, one.backup.bytes_in);
        assert_eq!(three.backup.bytes_new, 0, "{segmenting:?}: {three:?}");
        restored_matches(&repo, "three", &data, tmp.path());

        // With "two" gone, "three" is the parent: whole again.
        repo.delete_backup("two").unwrap();
        repo.gc(&GcOptions::default()).unwrap();
        let four = repo.backup_paths("four", "g", &[&data], |_| {}).unwrap();
        assert_eq!(four.parent.as_deref(), Some("three"));
        assert_eq!(four.files_unchanged, 21, "{segmenting:?}: {four:?}");
        restored_matches(&repo, "four", &data, tmp.path());
    }
}

#[test]
fn a_container_the_parent_names_that_is_gone_costs_a_read_from_its_part() {
    let tmp = tempfile::tempdir().unwrap();
    let data = files(tmp.path());
    settle();
    let dir = tmp.path().join("repo");
    let repo = init_in_parts(&dir, Segmenting::DEFAULT);
    let one = repo.backup_paths("one", "g", &[&data], |_| {}).unwrap();
    let two = repo.backup_paths("two", "g", &[&data], |_| {}).unwrap();
    assert_eq!(two.files_unchanged, 21);

    // A container holding part of "big" (the first file, 1 MiB) is lost.
    // The first part of the parent naming it cannot be confirmed: "big"
    // is reused up to where that part starts and read from there on, and
    // what the lost container held is stored again.
    let (recipe, starts) = part_starts(&repo, &dir, "two");
    let part = |k: usize| {
        let name = part_name(&recipe, k);
        Recipe::decode(&name, &fs::read(dir.join(&name)).unwrap()).unwrap()
    };
    let k = starts.iter().position(|&s| s > 400 << 10).unwrap();
    let lost = part(k).segments[0].container;
    let first = (0..k)
        .find(|&j| part(j).segments.iter().any(|r| r.container == lost))
        .unwrap_or(k);
    fs::remove_file(dir.join(container_name(lost))).unwrap();
    // Opened again, so no catalog of it is cached.
    drop(repo);
    let repo = Repository::open(&dir).unwrap();
    repo.set_recipe_part_segments(PART);
    let three = repo.backup_paths("three", "g", &[&data], |_| {}).unwrap();
    assert_eq!(three.files_unchanged, 20, "{three:?}");
    assert_eq!(
        three.bytes_unchanged,
        one.backup.bytes_in - ((1 << 20) - starts[first])
    );
    assert!(three.backup.bytes_new > 0, "{three:?}");
    restored_matches(&repo, "three", &data, tmp.path());
}
