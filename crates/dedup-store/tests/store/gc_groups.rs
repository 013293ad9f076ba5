//! Grouped marking (§3.3): a collection reads the recipes of the groups
//! whose backups changed and no others, and reads no container at all, so
//! its work follows the change rather than the repository's size.

use crate::gc_support;

use std::collections::BTreeSet;

use dedup_store::{GcOptions, GcReport, Repository};
use gc_support::*;
use rand::{rngs::StdRng, RngCore, SeedableRng};

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// A collection, the recipes it read, and the containers it read (only
/// to decide on compacting those a changed group used).
fn gc_reading(repo: &Repository, store: &Faulty) -> (GcReport, Vec<String>, BTreeSet<String>) {
    store.clear_reads();
    let r = repo.gc(&GcOptions::default()).unwrap();
    let containers: BTreeSet<String> = store.reads_under("containers/").into_iter().collect();
    if r.groups_remarked == 0 && r.groups_dropped == 0 {
        assert!(
            containers.is_empty(),
            "nothing changed, yet {containers:?} read"
        );
    }
    (r, store.reads_under("recipes/"), containers)
}

fn gc(repo: &Repository, store: &Faulty) -> (GcReport, Vec<String>) {
    let (r, recipes, _) = gc_reading(repo, store);
    (r, recipes)
}

#[test]
fn only_changed_groups_are_marked_again() {
    let tmp = tempfile::tempdir().unwrap();
    Repository::init(tmp.path()).unwrap();
    let (repo, store) = open_faulty(tmp.path());
    for (group, base) in [("A", 0), ("B", 100)] {
        for i in 0..4 {
            let name = format!("{group}{i}");
            repo.backup_stream(&name, group, &data(base + i, 30_000)[..])
                .unwrap();
        }
    }
    let (r, read) = gc(&repo, &store);
    assert_eq!(
        (r.groups_remarked, r.groups_reused, r.recipes_read),
        (2, 0, 8)
    );
    assert_eq!(read.len(), 8);

    // Nothing changed: both groups' marks reused, no recipe read, and
    // each group's marks read once for the GC's four looks.
    let (r, read) = gc(&repo, &store);
    assert_eq!(
        (r.groups_remarked, r.groups_reused, r.recipes_read),
        (0, 2, 0)
    );
    assert!(read.is_empty(), "{read:?}");
    assert_eq!(store.reads_under("gc/marks/").len(), 2);
    assert_eq!(r.containers_swept, 0);

    // A backup of A deleted: A alone is marked again, by taking A1's
    // references out of its counts (A1's recipe, left by the delete, is
    // read once more); no other recipe is read.
    repo.delete_backup("A1").unwrap();
    let (r, read) = gc(&repo, &store);
    assert_eq!(
        (r.groups_remarked, r.groups_reused, r.recipes_read),
        (1, 1, 1)
    );
    assert!(
        read.iter().all(|r| r.starts_with("recipes/A1-")),
        "{read:?}"
    );
    assert!(r.containers_swept > 0 && r.bytes_reclaimed > 0, "{r:?}");
    check_collected(tmp.path());

    // A backup added to B: B alone, from B9's recipe only.
    repo.backup_stream("B9", "B", &data(9, 20_000)[..]).unwrap();
    let (r, read) = gc(&repo, &store);
    assert_eq!(
        (r.groups_remarked, r.groups_reused, r.recipes_read),
        (1, 1, 1)
    );
    assert!(
        read.iter().all(|r| r.starts_with("recipes/B9-")),
        "{read:?}"
    );
    assert_eq!(r.containers_swept, 0);

    // Group A emptied: its marks dropped, its containers freed.
    for i in [0, 2, 3] {
        repo.delete_backup(&format!("A{i}")).unwrap();
    }
    let (r, read) = gc(&repo, &store);
    assert_eq!(
        (r.groups_remarked, r.groups_reused, r.groups_dropped),
        (0, 1, 1)
    );
    assert!(read.is_empty(), "{read:?}");
    check_collected(tmp.path());
    let mut out = Vec::new();
    repo.restore("B9", &mut out).unwrap();
    assert_eq!(out, data(9, 20_000));
}

#[test]
fn work_follows_the_change_not_the_repository_size() {
    let tmp = tempfile::tempdir().unwrap();
    Repository::init(tmp.path()).unwrap();
    let (repo, store) = open_faulty(tmp.path());
    let groups = 30;
    for g in 0..groups {
        for i in 0..3 {
            let name = format!("g{g}-{i}");
            repo.backup_stream(&name, &format!("g{g}"), &data(g * 10 + i, 20_000)[..])
                .unwrap();
        }
    }
    let (full, read) = gc(&repo, &store);
    assert_eq!(full.recipes_read, 3 * groups);
    assert_eq!(read.len() as u64, 3 * groups);
    repo.delete_backup("g7-1").unwrap();
    let (r, read, containers) = gc_reading(&repo, &store);
    assert_eq!((r.groups_remarked, r.groups_reused), (1, groups - 1));
    assert_eq!(
        read.len(),
        1,
        "only g7-1's recipe, taken out of g7's counts: {read:?}"
    );
    // Each backup fills one container: g7's other two lost no entry (their
    // marks are the same), so no catalog is read to decide on compacting;
    // g7-1's is deleted (its catalog read for the index's count of
    // fingerprints stored).
    assert!(containers.len() <= 1, "{containers:?}");
    assert_eq!(r.catalogs_read, 0);
    eprintln!(
        "{groups} groups: full mark {:.1} ms, one group changed {:.1} ms",
        full.seconds * 1e3,
        r.seconds * 1e3
    );
    check_collected(tmp.path());
}

/// A repository with backups A0..A`n` of group A (`data(i, 30_000)`),
/// collected once, so that A's marks are counted.
fn group_a_collected(n: u64) -> (tempfile::TempDir, Repository, std::sync::Arc<Faulty>) {
    let tmp = tempfile::tempdir().unwrap();
    Repository::init(tmp.path()).unwrap();
    let (repo, store) = open_faulty(tmp.path());
    for i in 0..n {
        repo.backup_stream(&format!("A{i}"), "A", &data(i, 30_000)[..])
            .unwrap();
    }
    gc(&repo, &store);
    (tmp, repo, store)
}

#[test]
fn a_deleted_recipe_that_is_gone_or_damaged_marks_the_group_from_all_its_recipes() {
    for damage in ["gone", "damaged"] {
        let (tmp, repo, store) = group_a_collected(4);
        let recipe = repo.backup("A2").unwrap().recipe;
        repo.delete_backup("A2").unwrap();
        // As a delete by an earlier version left it (recipe removed), or
        // a recipe damaged since: the counts cannot take A2 out.
        let path = tmp.path().join(&recipe);
        match damage {
            "gone" => std::fs::remove_file(&path).unwrap(),
            _ => {
                let mut b = std::fs::read(&path).unwrap();
                let mid = b.len() / 2;
                b[mid] ^= 1;
                std::fs::write(&path, b).unwrap();
            }
        }
        let (r, read) = gc(&repo, &store);
        assert_eq!(
            (r.groups_remarked, r.recipes_read),
            (1, 4),
            "{damage}: {r:?}"
        );
        // A2's recipe tried, then the three left.
        assert_eq!(read.len(), 4, "{read:?}");
        assert!(r.containers_swept > 0, "{damage}: {r:?}");
        check_collected(tmp.path());
        for i in [0, 1, 3] {
            let mut out = Vec::new();
            repo.restore(&format!("A{i}"), &mut out).unwrap();
            assert!(out == data(i, 30_000));
        }
    }
}

#[test]
fn a_backup_deleted_and_made_again_under_its_name_is_counted_once() {
    let (tmp, repo, store) = group_a_collected(3);
    // A1 again, other bytes, before any collection: A1's old recipe is
    // taken out and its new one added.
    repo.delete_backup("A1").unwrap();
    repo.backup_stream("A1", "A", &data(7, 30_000)[..]).unwrap();
    let (r, read) = gc(&repo, &store);
    assert_eq!((r.groups_remarked, r.recipes_read), (1, 2), "{r:?}");
    assert!(
        read.iter().all(|o| o.starts_with("recipes/A1-")),
        "{read:?}"
    );
    assert!(r.containers_swept > 0, "{r:?}");
    check_collected(tmp.path());
    for (name, seed) in [("A0", 0), ("A1", 7), ("A2", 2)] {
        let mut out = Vec::new();
        repo.restore(name, &mut out).unwrap();
        assert!(out == data(seed, 30_000), "{name}");
    }
}
