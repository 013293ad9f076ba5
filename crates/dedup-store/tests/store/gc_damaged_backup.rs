//! A damaged backup object (a flipped byte in its 120-odd bytes) while
//! its recipe and containers are intact: the other backups are still
//! listed, the damaged one is named, deleted on request, and a collection
//! goes on, keeping whatever the damaged backup may reference, so that
//! the backup restores byte-exact once its object is repaired.

use crate::gc_support;

use std::path::Path;

use dedup_common::testdata::noise;
use dedup_store::{GcOptions, Repository};
use gc_support::objects;

/// A repository with backups `a` and `b` (nothing shared), `backups/a`
/// then damaged; its good bytes and the two streams.
fn damaged(dir: &Path) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let repo = Repository::init(dir).unwrap();
    let (a, b) = (noise(1, 300_000), noise(2, 300_000));
    repo.backup_stream("a", "a", &a[..]).unwrap();
    repo.backup_stream("b", "b", &b[..]).unwrap();
    drop(repo);
    let good = std::fs::read(dir.join("backups/a")).unwrap();
    let mut bad = good.clone();
    bad[40] ^= 1;
    std::fs::write(dir.join("backups/a"), bad).unwrap();
    (good, a, b)
}

fn restored(repo: &Repository, name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    repo.restore(name, &mut out).unwrap();
    out
}

#[test]
fn a_damaged_backup_object_is_named_and_the_others_are_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    damaged(&dir);
    let repo = Repository::open_read_only(&dir).unwrap();
    let listing = repo.list_backups_all().unwrap();
    let names: Vec<&str> = listing.backups.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["b"]);
    assert_eq!(listing.damaged.len(), 1);
    assert_eq!(listing.damaged[0].name, "a");
    assert!(
        listing.damaged[0].detail.contains("backups/a"),
        "{:?}",
        listing.damaged
    );
}

#[test]
fn gc_beside_a_damaged_backup_keeps_what_it_may_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let (good, a, b) = damaged(&dir);
    let repo = Repository::open(&dir).unwrap();
    repo.delete_backup("b").unwrap();
    let r = repo.gc(&GcOptions::default()).unwrap();
    assert_eq!(r.backups_damaged, 1, "{r:?}");
    // a's recipe is kept (it may be the damaged backup's), b's went with
    // b's containers.
    assert_eq!(r.orphans_kept, 1, "{r:?}");
    assert!(r.containers_swept > 0 && !r.sweep_withheld, "{r:?}");
    let recipes = objects(&dir, "recipes/");
    assert!(
        recipes.iter().all(|o| o.starts_with("recipes/a-")),
        "{recipes:?}"
    );
    drop(repo);
    // Repaired, it restores as it was backed up.
    std::fs::write(dir.join("backups/a"), good).unwrap();
    let repo = Repository::open_read_only(&dir).unwrap();
    assert!(restored(&repo, "a") == a);
    assert!(b.len() == a.len());
}

#[test]
fn a_damaged_backup_is_deleted_and_the_next_gc_collects_what_was_its() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let (_, _, b) = damaged(&dir);
    let repo = Repository::open(&dir).unwrap();
    repo.delete_backup("a").unwrap();
    assert!(repo.list_backups_all().unwrap().damaged.is_empty());
    let r = repo.gc(&GcOptions::default()).unwrap();
    assert_eq!((r.backups_damaged, r.orphans_kept), (0, 0), "{r:?}");
    assert!(r.orphans_removed >= 1 && r.containers_swept > 0, "{r:?}");
    let recipes = objects(&dir, "recipes/");
    assert!(
        recipes.iter().all(|o| o.starts_with("recipes/b-")),
        "{recipes:?}"
    );
    assert!(restored(&repo, "b") == b);
}

/// If a recipe no readable backup names cannot be read either, what the
/// damaged backup references is unknown: no container is deleted.
#[test]
fn gc_deletes_no_container_when_a_damaged_backups_recipe_may_be_unreadable() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    damaged(&dir);
    let recipe = objects(&dir, "recipes/")
        .into_iter()
        .find(|o| o.starts_with("recipes/a-"))
        .unwrap();
    let mut bytes = std::fs::read(dir.join(&recipe)).unwrap();
    bytes[30] ^= 1;
    std::fs::write(dir.join(&recipe), bytes).unwrap();
    let repo = Repository::open(&dir).unwrap();
    repo.delete_backup("b").unwrap();
    let containers = objects(&dir, "containers/");
    let r = repo.gc(&GcOptions::default()).unwrap();
    assert!(r.sweep_withheld && r.containers_swept == 0, "{r:?}");
    assert_eq!(objects(&dir, "containers/"), containers);
    assert!(objects(&dir, "recipes/").contains(&recipe));
}

/// A damaged backup object does not hold the next files backup hostage:
/// the parent is the newest readable backup of the group (a damaged one
/// cannot serve as a parent anyway), and the backup restores exact.
#[test]
fn a_files_backup_goes_on_beside_a_damaged_backup_object() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("f"), noise(3, 100_000)).unwrap();
    let repo = Repository::init(&dir).unwrap();
    repo.backup_paths("one", "g", &[&data], |_| {}).unwrap();
    drop(repo);
    let mut bytes = std::fs::read(dir.join("backups/one")).unwrap();
    bytes[40] ^= 1;
    std::fs::write(dir.join("backups/one"), bytes).unwrap();
    let repo = Repository::open(&dir).unwrap();
    repo.backup_paths("two", "g", &[&data], |_| {})
        .expect("a damaged backup object must not stop the next backup");
    let names: Vec<String> = repo
        .list_backups_all()
        .unwrap()
        .backups
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(names, ["two"]);
}

/// A backup counted in its group's marks whose object is then damaged:
/// the collection takes it out of the counts (it is no longer listed) but
/// keeps its recipe as a suspect, with what that references; repaired, it
/// is counted again and restores as it was. A deleted backup beside it
/// still goes.
#[test]
fn a_counted_backup_damaged_later_keeps_its_segments_and_is_counted_again_once_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let repo = Repository::init(&dir).unwrap();
    let (a, b, c) = (noise(1, 300_000), noise(2, 300_000), noise(3, 300_000));
    for (name, data) in [("a", &a), ("b", &b), ("c", &c)] {
        repo.backup_stream(name, "g", &data[..]).unwrap();
    }
    repo.gc(&GcOptions::default()).unwrap();
    let good = std::fs::read(dir.join("backups/a")).unwrap();
    let mut bad = good.clone();
    bad[40] ^= 1;
    std::fs::write(dir.join("backups/a"), bad).unwrap();
    repo.delete_backup("c").unwrap();
    let r = repo.gc(&GcOptions::default()).unwrap();
    assert_eq!((r.backups_damaged, r.orphans_kept), (1, 1), "{r:?}");
    assert!(r.containers_swept > 0 && !r.sweep_withheld, "{r:?}");
    let recipes = objects(&dir, "recipes/");
    assert!(
        recipes.iter().all(|o| !o.starts_with("recipes/c-")),
        "{recipes:?}"
    );
    std::fs::write(dir.join("backups/a"), &good).unwrap();
    let r = repo.gc(&GcOptions::default()).unwrap();
    assert_eq!((r.backups_damaged, r.recipes_read), (0, 1), "{r:?}");
    assert!(restored(&repo, "a") == a && restored(&repo, "b") == b);
    drop(repo);
    gc_support::check_collected(&dir);
}
