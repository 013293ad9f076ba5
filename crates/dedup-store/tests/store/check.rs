//! The store check on whole repositories: clean ones check clean, each kind
//! of damage is named with the backups it costs (which the restores
//! confirm), garbage is reported as garbage, and nothing is ever written.

use crate::check_support;

use std::collections::BTreeSet;
use std::fs;

use check_support::{fixture, random, snapshot, Fixture};
use dedup_store::check::{CheckPhase, CheckProgress};
use dedup_store::{
    BackupRecord, CheckOptions, CheckReport, ContainerWriter, Recipe, Repository, Segmenting,
};

const BOTH: [Segmenting; 2] = [Segmenting::DEFAULT, Segmenting::FASTCDC_4K];

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// The problems naming `object`, as text.
fn about(report: &CheckReport, object: &str) -> Vec<String> {
    let named = report.problems.iter().filter(|p| p.object == object);
    named.map(|p| p.to_string()).collect()
}

/// `report` found damage to `object` (and only to objects in `objects`),
/// costing exactly `affected`, which is also exactly what fails to restore.
fn assert_damage(f: &Fixture, report: &CheckReport, objects: &[&str], affected: &[&str]) {
    assert!(!about(report, objects[0]).is_empty(), "{report:#?}");
    for p in &report.problems {
        assert!(objects.contains(&p.object.as_str()), "{p}: {report:#?}");
    }
    let found: BTreeSet<String> = report
        .affected_backups()
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(found, set(affected), "{report:#?}");
    assert_eq!(
        f.unrestorable(),
        set(affected),
        "restores disagree: {report:#?}"
    );
}

#[test]
fn a_clean_repository_checks_clean_and_counts_what_it_holds() {
    for segmenting in BOTH {
        let f = fixture(segmenting);
        let containers = f.containers();
        let on_disk: u64 = containers
            .iter()
            .map(|c| fs::metadata(f.path(c)).unwrap().len())
            .sum();
        for data in [false, true] {
            let r = f.check(data);
            assert!(r.is_clean(), "{segmenting:?} data {data}: {r:#?}");
            assert!(r.garbage.is_empty() && r.garbage_complete, "{r:#?}");
            assert_eq!(r.data_verified, data);
            let c = r.counts;
            assert_eq!((c.backups, c.recipes), (3, 3));
            assert_eq!(c.containers, containers.len() as u64);
            assert!(c.containers >= 2, "the fixture spans containers: {c:?}");
            assert_eq!(c.bytes_stored, on_disk, "data {data}");
            assert!(c.segments >= 8, "{c:?}");
        }
    }
}

#[test]
fn progress_goes_through_every_object_of_each_kind() {
    let f = fixture(Segmenting::DEFAULT);
    let repo = Repository::open_read_only(f.dir()).unwrap();
    let seen = std::cell::RefCell::new(Vec::new());
    let r = repo
        .check(CheckOptions { data: true }, &|p: CheckProgress| {
            seen.borrow_mut().push(p)
        })
        .unwrap();
    assert!(r.is_clean());
    let seen = seen.into_inner();
    let last = |phase| *seen.iter().rev().find(|p| p.phase == phase).unwrap();
    assert_eq!(
        (
            last(CheckPhase::Backups).done,
            last(CheckPhase::Backups).total
        ),
        (3, 3)
    );
    let c = last(CheckPhase::Containers);
    assert_eq!(
        (c.done, c.total),
        (r.counts.containers, r.counts.containers)
    );
}

#[test]
fn a_deleted_container_names_the_backups_that_need_it() {
    for segmenting in BOTH {
        let f = fixture(segmenting);
        // Container 0 holds the start of a, which b shares.
        let c0 = &f.containers()[0];
        fs::remove_file(f.path(c0)).unwrap();
        for data in [false, true] {
            let r = f.check(data);
            assert_damage(&f, &r, &[c0], &["a", "b"]);
            assert!(about(&r, c0)[0].contains("missing"), "{r:#?}");
        }
    }
}

#[test]
fn a_truncated_container_is_damage_with_or_without_data() {
    let f = fixture(Segmenting::DEFAULT);
    let c0 = f.containers()[0].clone();
    let good = fs::read(f.path(&c0)).unwrap();
    for cut in [
        0,
        1,
        31,
        32,
        good.len() / 2,
        good.len() - 48,
        good.len() - 1,
    ] {
        fs::write(f.path(&c0), &good[..cut]).unwrap();
        for data in [false, true] {
            let r = f.check(data);
            assert_damage(&f, &r, &[&c0], &["a", "b"]);
        }
    }
}

#[test]
fn a_corrupt_recipe_costs_its_backup() {
    let f = fixture(Segmenting::FASTCDC_4K);
    let recipe = f.recipe_object("b");
    let mut bytes = fs::read(f.path(&recipe)).unwrap();
    bytes[40] ^= 1;
    fs::write(f.path(&recipe), &bytes).unwrap();
    let r = f.check(false);
    assert_damage(&f, &r, &[&recipe], &["b"]);
    assert!(about(&r, &recipe)[0].contains("checksum"), "{r:#?}");
    // What b alone referenced now looks unreferenced: say it may not be.
    assert!(!r.garbage_complete);
}

#[test]
fn a_missing_recipe_costs_its_backup() {
    let f = fixture(Segmenting::DEFAULT);
    let recipe = f.recipe_object("c");
    fs::remove_file(f.path(&recipe)).unwrap();
    let r = f.check(true);
    assert_damage(&f, &r, &[&recipe], &["c"]);
    let said = &about(&r, &recipe)[0];
    assert!(said.contains("missing, but backup c names it"), "{said}");
    assert!(!r.garbage_complete);
}

#[test]
fn a_backup_naming_a_recipe_that_is_gone_is_damage_and_the_old_recipe_garbage() {
    let f = fixture(Segmenting::DEFAULT);
    let repo = Repository::open_read_only(f.dir()).unwrap();
    let old = repo.backup("b").unwrap();
    let renamed = BackupRecord {
        recipe: "recipes/b-00000000000000ff".into(),
        ..old.clone()
    };
    fs::write(f.path("backups/b"), renamed.encode()).unwrap();
    let r = f.check(false);
    assert_damage(&f, &r, &["recipes/b-00000000000000ff"], &["b"]);
    let garbage: Vec<&str> = r.garbage.iter().map(|g| g.object.as_str()).collect();
    assert!(garbage.contains(&old.recipe.as_str()), "{r:#?}");
}

#[test]
fn a_recipe_pointing_at_a_wrong_entry_is_damage_of_its_backup() {
    let f = fixture(Segmenting::DEFAULT);
    let object = f.recipe_object("c");
    let good = Recipe::decode(&object, &fs::read(f.path(&object)).unwrap()).unwrap();
    let first = good.segments[0];
    let wrongs = [
        ("another segment", first.entry + 1, first.len),
        ("no catalog entry", 9999, first.len),
        ("bytes, the recipe says", first.entry, first.len - 1),
    ];
    for (says, entry, len) in wrongs {
        let mut bad = good.clone();
        bad.segments[0].entry = entry;
        bad.segments[0].len = len;
        bad.segments[1].len += first.len - len; // keep the total
        fs::write(f.path(&object), bad.encode()).unwrap();
        let r = f.check(true);
        assert_damage(&f, &r, &[&object], &["c"]);
        let said = &about(&r, &object)[0];
        assert!(
            said.contains("reference 0") && said.contains(says),
            "{said}"
        );
    }
}

#[test]
fn damaged_config_backup_object_and_bad_names_are_found() {
    let f = fixture(Segmenting::DEFAULT);
    let config = fs::read(f.path("config")).unwrap();
    let mut bad = config.clone();
    bad[20] ^= 4;
    fs::write(f.path("config"), &bad).unwrap();
    // Nothing opens without the config: every backup is affected.
    assert_damage(&f, &f.check(false), &["config"], &["a", "b", "c"]);
    fs::remove_file(f.path("config")).unwrap();
    assert_damage(&f, &f.check(false), &["config"], &["a", "b", "c"]);
    fs::write(f.path("config"), &config).unwrap();

    let mut backup = fs::read(f.path("backups/a")).unwrap();
    backup[15] ^= 0x80;
    fs::write(f.path("backups/a"), &backup).unwrap();
    let r = f.check(false);
    assert_damage(&f, &r, &["backups/a"], &["a"]);
    // Its recipe is unnamed now, but not to be thrown away lightly.
    assert!(!r.garbage_complete);
    assert!(r
        .garbage
        .iter()
        .any(|g| g.reason.contains("damaged backup a")));
    backup[15] ^= 0x80;
    fs::write(f.path("backups/a"), &backup).unwrap();

    fs::write(f.path("containers/0000000000000ABC"), b"x").unwrap();
    let r = f.check(false);
    assert_eq!(about(&r, "containers/0000000000000ABC").len(), 1, "{r:#?}");
    assert!(r.affected_backups().is_empty());
}

#[test]
fn garbage_is_reported_as_garbage_not_damage() {
    for segmenting in BOTH {
        let f = fixture(segmenting);
        let c_recipe = f.recipe_object("c");
        // A backup that died before its commit point: recipe, no backup.
        fs::remove_file(f.path("backups/c")).unwrap();
        // And one that died before its recipe: a container alone.
        let mut w = ContainerWriter::new(0x77);
        w.add(b"never committed").unwrap();
        fs::write(f.path("containers/0000000000000077"), w.seal()).unwrap();
        for data in [false, true] {
            let r = f.check(data);
            assert!(r.is_clean(), "{r:#?}");
            assert!(r.garbage_complete);
            let garbage: Vec<&str> = r.garbage.iter().map(|g| g.object.as_str()).collect();
            assert!(garbage.contains(&c_recipe.as_str()), "{r:#?}");
            assert!(garbage.contains(&"containers/0000000000000077"), "{r:#?}");
            let lone = r.garbage.iter().find(|g| g.object.ends_with("77")).unwrap();
            assert_eq!(lone.reason, "no recipe references it");
            // c's own containers are referenced only by its orphan recipe.
            assert!(
                r.garbage.iter().any(|g| g.reason.contains(&c_recipe)),
                "{r:#?}"
            );
        }
    }
}

#[test]
fn check_writes_nothing_even_on_a_damaged_repository() {
    let f = fixture(Segmenting::FASTCDC_4K);
    let before = snapshot(f.dir());
    for data in [false, true] {
        assert!(f.check(data).is_clean());
        assert!(
            snapshot(f.dir()) == before,
            "check (data {data}) changed the repository"
        );
    }
    let containers = f.containers();
    let mut bytes = fs::read(f.path(&containers[1])).unwrap();
    bytes[100] ^= 1;
    fs::write(f.path(&containers[1]), &bytes).unwrap();
    fs::remove_file(f.path("backups/c")).unwrap();
    fs::remove_file(f.path(&f.recipe_object("b"))).unwrap();
    let before = snapshot(f.dir());
    for data in [false, true] {
        let r = f.check(data);
        assert!(!r.is_clean() && !r.garbage.is_empty());
        assert!(
            snapshot(f.dir()) == before,
            "check (data {data}) changed the repository"
        );
    }
}

#[test]
fn a_backup_of_files_needs_its_tree_and_an_unnamed_tree_is_garbage() {
    let f = fixture(Segmenting::DEFAULT);
    let tree = {
        let repo = Repository::open(f.dir()).unwrap();
        let mut s = repo.begin_backup("files", "g").unwrap();
        s.append(&random(5000, 9)).unwrap();
        let mut file = dedup_store::tree::Node::new(&b"f"[..], dedup_store::tree::Kind::File);
        file.size = 5000;
        let tree = dedup_store::Tree {
            stream_len: 5000,
            nodes: vec![file],
        };
        let record = s.commit_with_tree(Some(&tree.encode())).unwrap();
        record.tree.expect("a tree")
    };
    let r = f.check(true);
    assert!(r.is_clean() && r.garbage.is_empty(), "{r:#?}");
    assert_eq!(r.counts.trees, 1);

    let saved = fs::read(f.path(&tree)).unwrap();
    fs::remove_file(f.path(&tree)).unwrap();
    let r = f.check(false);
    assert_eq!(
        about(&r, &tree),
        [format!("{tree}: missing, but backup files names it")]
    );
    assert_eq!(r.problems.len(), 1);
    assert_eq!(r.affected_backups(), BTreeSet::from(["files"]));

    // A tree that does not decode costs its backup too.
    fs::write(f.path(&tree), b"tree bytes").unwrap();
    let r = f.check(false);
    assert_eq!(r.problems.len(), 1, "{r:#?}");
    assert_eq!(r.affected_backups(), BTreeSet::from(["files"]));
    assert!(about(&r, &tree)[0].contains("too short"), "{r:#?}");

    fs::write(f.path(&tree), saved).unwrap();
    fs::remove_file(f.path("backups/files")).unwrap();
    let r = f.check(false);
    assert!(r.is_clean(), "{r:#?}");
    assert!(r.garbage.iter().any(|g| g.object == tree), "{r:#?}");
}

/// A tree whose files add up to another length than the stream its
/// backup read (a restore refuses it) is damage of that backup, though it
/// decodes and its recipe is right.
#[test]
fn a_tree_whose_stream_length_is_not_its_backups_bytes_is_damage() {
    let f = fixture(Segmenting::DEFAULT);
    let file = |size| {
        let mut file = dedup_store::tree::Node::new(&b"f"[..], dedup_store::tree::Kind::File);
        file.size = size;
        dedup_store::Tree {
            stream_len: size,
            nodes: vec![file],
        }
    };
    let tree = {
        let repo = Repository::open(f.dir()).unwrap();
        let mut s = repo.begin_backup("files", "g").unwrap();
        s.append(&random(5000, 9)).unwrap();
        let record = s.commit_with_tree(Some(&file(5000).encode())).unwrap();
        record.tree.expect("a tree")
    };
    fs::write(f.path(&tree), file(4000).encode()).unwrap();
    let r = f.check(false);
    assert_eq!(
        about(&r, &tree),
        [format!(
            "{tree}: its files hold 4000 bytes, but backup files read 5000"
        )]
    );
    assert_eq!(r.affected_backups(), BTreeSet::from(["files"]));
}
