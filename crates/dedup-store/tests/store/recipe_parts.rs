//! Recipes in parts (`recipe/parts.rs`): a backup writes its recipe as it
//! goes, part by part, then an index; restores, GC, delete and the store
//! check read it part by part. Here parts are a few segments long, so small
//! streams make many of them: they restore byte-exact; a part missing,
//! damaged or swapped is refused by name and costs only its backup; parts
//! of a backup that died are garbage that GC removes, never while a backup
//! still writes them; a crash at every write of a backup leaves the
//! backup whole or absent.

use crate::gc_support;

use std::fs;
use std::path::Path;

use dedup_common::testdata::noise;
use dedup_store::check::{check, CheckOptions, CheckReport};
use dedup_store::recipe::parts::{part_name, part_of, PartInfo, RecipeIndex, RecipeObject};
use dedup_store::{GcOptions, LocalDir, RepoOptions, Repository, Segmenting};
use gc_support::{check_backups, check_collected, gc_settled, objects, open_faulty};
use proptest::prelude::*;

/// Segments a part holds in these tests.
const PART: usize = 2;

fn init(dir: &Path) -> Repository {
    let options = RepoOptions {
        segmenting: Segmenting::DEFAULT,
        container_target: 16 << 10,
        force: false,
        ..RepoOptions::default()
    };
    let repo = Repository::init_with(dir, options).unwrap();
    repo.set_recipe_part_segments(PART);
    repo
}

fn check_store(dir: &Path) -> CheckReport {
    let store = LocalDir::open(dir).unwrap();
    check(&store, CheckOptions { data: true }, &|_| {}).unwrap()
}

fn index(dir: &Path, recipe: &str) -> RecipeIndex {
    match RecipeObject::decode(recipe, &fs::read(dir.join(recipe)).unwrap()).unwrap() {
        RecipeObject::Index(i) => i,
        RecipeObject::Whole(_) => panic!("{recipe} is not in parts"),
    }
}

fn restored(repo: &Repository, name: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    repo.restore(name, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Backup `name`'s recipe object.
fn recipe_object(dir: &Path, name: &str) -> String {
    let repo = Repository::open_read_only(dir).unwrap();
    repo.backup(name).unwrap().recipe
}

/// Three backups: `a` and `b` share most segments, `c` is its own.
fn three(dir: &Path) -> Vec<(&'static str, Vec<u8>)> {
    let repo = init(dir);
    let a = noise(1, 9 * 4096 + 100);
    let mut b = a.clone();
    b[4096..8192].copy_from_slice(&noise(2, 4096));
    let c = noise(3, 7 * 4096);
    let all = vec![("a", a), ("b", b), ("c", c)];
    for (name, data) in &all {
        repo.backup_stream(name, "g", &data[..]).unwrap();
    }
    all
}

#[test]
fn a_stream_in_parts_restores_and_its_recipe_is_an_index_of_them() {
    let tmp = tempfile::tempdir().unwrap();
    let all = three(tmp.path());
    let repo = Repository::open_read_only(tmp.path()).unwrap();
    for (name, data) in &all {
        assert_eq!(restored(&repo, name).unwrap(), *data, "{name}");
        let record = repo.backup(name).unwrap();
        let i = index(tmp.path(), &record.recipe);
        let segments = (data.len() as u64).div_ceil(4096);
        assert_eq!(i.segments, segments);
        assert_eq!(i.parts.len() as u64, segments.div_ceil(PART as u64));
        assert_eq!(i.stream_len, data.len() as u64);
        let (_, whole) = repo.recipe(name).unwrap();
        assert_eq!(whole.segments.len() as u64, segments);
        assert_eq!(whole.stream_len, data.len() as u64);
    }
    let r = check_store(tmp.path());
    assert!(r.problems.is_empty() && r.garbage.is_empty(), "{r:#?}");
    assert_eq!(r.counts.recipes, 3, "parts are not counted as recipes");
}

#[test]
fn a_recipe_of_one_part_is_still_written_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = init(tmp.path());
    let data = noise(4, 2 * 4096);
    let record_recipe = {
        repo.backup_stream("small", "g", &data[..]).unwrap();
        repo.backup("small").unwrap().recipe
    };
    let bytes = fs::read(tmp.path().join(&record_recipe)).unwrap();
    assert!(matches!(
        RecipeObject::decode(&record_recipe, &bytes).unwrap(),
        RecipeObject::Whole(_)
    ));
    assert_eq!(objects(tmp.path(), "recipes/").len(), 1);
    assert_eq!(restored(&repo, "small").unwrap(), data);
}

#[test]
fn delete_and_gc_remove_every_part() {
    let tmp = tempfile::tempdir().unwrap();
    let all = three(tmp.path());
    let repo = Repository::open(tmp.path()).unwrap();
    let c = repo.backup("c").unwrap().recipe;
    assert!(objects(tmp.path(), "recipes/")
        .iter()
        .any(|o| o.starts_with(&c) && o != &c));
    let parts = || {
        objects(tmp.path(), "recipes/")
            .into_iter()
            .filter(|o| o.starts_with(&c))
            .count()
    };
    repo.gc(&GcOptions::default()).unwrap();
    let before = parts();
    // The recipe and its parts stay for the collection, which reads them
    // once more to take c's references out of the group's counts.
    repo.delete_backup("c").unwrap();
    assert_eq!(parts(), before);
    let r = repo.gc(&GcOptions::default()).unwrap();
    assert_eq!(r.recipes_read, 1, "{r:?}");
    assert_eq!(parts(), 0);
    check_collected(tmp.path());
    for (name, data) in &all[..2] {
        assert_eq!(restored(&repo, name).unwrap(), *data);
    }
}

/// Every object under `dir`, by name.
fn every_object(dir: &Path) -> std::collections::BTreeSet<String> {
    let store = LocalDir::open(dir).unwrap();
    dedup_store::ObjectStore::list(&store, "")
        .unwrap()
        .into_iter()
        .collect()
}

/// Damage to one part of `c`'s recipe, as the check, a restore and a GC
/// see it: named, costing `c` only, and no GC deletes anything.
fn assert_part_refused(dir: &Path, part: &str, says: &str) {
    let r = check_store(dir);
    assert!(!r.problems.is_empty(), "{r:#?}");
    for p in &r.problems {
        assert_eq!(p.object, part, "{r:#?}");
        assert!(p.detail.contains(says), "{}", p.detail);
    }
    let affected: Vec<&str> = r.affected_backups().into_iter().collect();
    assert_eq!(affected, ["c"], "{r:#?}");
    let repo = Repository::open(dir).unwrap();
    let e = restored(&repo, "c").unwrap_err();
    assert!(e.contains(part) && e.contains(says), "{e}");
    assert!(restored(&repo, "a").is_ok() && restored(&repo, "b").is_ok());
    let before = every_object(dir);
    let e = repo.gc(&GcOptions::default()).unwrap_err().to_string();
    assert!(
        e.contains(part) && e.contains("stopped before deleting anything"),
        "{e}"
    );
    let after = every_object(dir);
    assert!(before.iter().any(|o| o.starts_with("containers/")));
    let deleted: Vec<&String> = before.difference(&after).collect();
    assert!(
        deleted.iter().all(|o| o.starts_with("gc/")),
        "GC deleted {deleted:?}"
    );
}

#[test]
fn a_missing_part_is_named_and_costs_only_its_backup() {
    let tmp = tempfile::tempdir().unwrap();
    three(tmp.path());
    let recipe = recipe_object(tmp.path(), "c");
    let part = part_name(&recipe, 1);
    fs::remove_file(tmp.path().join(&part)).unwrap();
    assert_part_refused(tmp.path(), &part, "missing, but recipe");
}

#[test]
fn a_part_swapped_for_another_of_its_recipe_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    three(tmp.path());
    let recipe = recipe_object(tmp.path(), "c");
    // Same length and segment count, other segments: only its digest
    // tells it from the part the index wrote.
    let (p0, p1) = (part_name(&recipe, 0), part_name(&recipe, 1));
    fs::copy(tmp.path().join(&p0), tmp.path().join(&p1)).unwrap();
    assert_part_refused(tmp.path(), &p1, "not the part recipe");
}

#[test]
fn every_byte_flipped_in_a_part_or_its_index_is_found() {
    let tmp = tempfile::tempdir().unwrap();
    three(tmp.path());
    let recipe = recipe_object(tmp.path(), "c");
    for object in [part_name(&recipe, 2), recipe.clone()] {
        let path = tmp.path().join(&object);
        let good = fs::read(&path).unwrap();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x5a;
            fs::write(&path, &bad).unwrap();
            let r = check_store(tmp.path());
            let named: Vec<&str> = r.problems.iter().map(|p| p.object.as_str()).collect();
            assert!(!named.is_empty(), "{object} byte {i}: {r:#?}");
            assert!(
                named.iter().all(|o| *o == object),
                "{object} byte {i}: {named:?}"
            );
            let affected: Vec<&str> = r.affected_backups().into_iter().collect();
            assert_eq!(affected, ["c"], "{object} byte {i}");
            let repo = Repository::open_read_only(tmp.path()).unwrap();
            assert!(restored(&repo, "c").is_err(), "{object} byte {i}");
        }
        fs::write(&path, &good).unwrap();
    }
    assert!(check_store(tmp.path()).problems.is_empty());
}

#[test]
fn parts_of_a_backup_that_died_are_garbage_which_gc_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = init(tmp.path());
    let data = noise(5, 8 * 4096);
    {
        let mut s = repo.begin_backup("died", "g").unwrap();
        for chunk in data.chunks(4096) {
            s.append(chunk).unwrap();
        }
        // Dropped without a commit.
    }
    let parts = objects(tmp.path(), "recipes/");
    assert_eq!(parts.len(), 3, "{parts:?}");
    assert!(parts.iter().all(|p| part_of(p).is_some()));
    let r = check_store(tmp.path());
    assert!(r.problems.is_empty(), "{r:#?}");
    let garbage: Vec<&str> = r.garbage.iter().map(|g| g.object.as_str()).collect();
    for p in &parts {
        assert!(garbage.contains(&p.as_str()), "{p} not garbage: {r:#?}");
    }
    let gc = repo.gc(&GcOptions::default()).unwrap();
    assert_eq!(gc.orphans_removed, 3);
    assert!(objects(tmp.path(), "recipes/").is_empty());
    check_collected(tmp.path());
}

#[test]
fn a_gc_while_a_backup_writes_parts_keeps_them() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = init(tmp.path());
    let data = noise(6, 12 * 4096 + 7);
    let mut s = repo.begin_backup("running", "g").unwrap();
    let mut chunks = data.chunks(4096);
    for chunk in chunks.by_ref().take(6) {
        s.append(chunk).unwrap();
    }
    let before = objects(tmp.path(), "recipes/");
    assert_eq!(before.len(), 2, "{before:?}");
    let gc = repo.gc(&GcOptions::default()).unwrap();
    assert_eq!(gc.orphans_removed, 0, "{gc:?}");
    assert_eq!(objects(tmp.path(), "recipes/"), before);
    for chunk in chunks {
        s.append(chunk).unwrap();
    }
    s.commit().unwrap();
    repo.gc(&GcOptions::default()).unwrap();
    assert_eq!(restored(&repo, "running").unwrap(), data);
    check_collected(tmp.path());
}

/// A crash at every write of a backup in parts (each container, each
/// part, the index, the backup object): after a reopen the backup either
/// restores byte-exact or is absent, and after a GC nothing of it is left
/// but what a committed backup names; the store check finds no damage.
#[test]
fn a_crash_at_every_write_of_a_backup_in_parts_leaves_it_whole_or_absent() {
    let data = noise(7, 11 * 4096 + 300);
    let earlier = noise(8, 5 * 4096);
    let mut committed_at = None;
    for fail_after in 0..200 {
        let tmp = tempfile::tempdir().unwrap();
        drop(init(tmp.path()));
        let (repo, store) = open_faulty(tmp.path());
        repo.set_recipe_part_segments(PART);
        repo.backup_stream("earlier", "g", &earlier[..]).unwrap();
        store.fail_after(fail_after);
        let result = repo.backup_stream("crashing", "g", &data[..]);
        drop(repo);
        let (repo, _) = open_faulty(tmp.path());
        let mut model = std::collections::BTreeMap::new();
        model.insert("earlier".to_string(), earlier.clone());
        // Committed, or put but not confirmed (the look at the epochs
        // after the commit point failed): then listed, and whole.
        let unconfirmed = matches!(result, Err(dedup_store::RepoError::Unconfirmed { .. }))
            && repo.backup("crashing").is_ok();
        if result.is_ok() || unconfirmed {
            model.insert("crashing".to_string(), data.clone());
        }
        check_backups(&repo, &model);
        let r = check_store(tmp.path());
        assert!(r.problems.is_empty(), "fail after {fail_after}: {r:#?}");
        gc_settled(&repo, &GcOptions::default());
        check_collected(tmp.path());
        if result.is_ok() {
            committed_at = Some(fail_after);
            break;
        }
    }
    let at = committed_at.expect("the backup never got through");
    assert!(
        at > 8,
        "only {at} writes: the parts were not written on their own"
    );
}

/// A part whose put fails loses no reference: the session tries it again
/// with the next segment, and the backup restores whole.
#[test]
fn a_part_that_failed_to_be_written_is_written_again() {
    let tmp = tempfile::tempdir().unwrap();
    drop(init(tmp.path()));
    let (repo, store) = open_faulty(tmp.path());
    repo.set_recipe_part_segments(PART);
    let data = noise(9, 9 * 4096 + 10);
    let mut s = repo.begin_backup("retried", "g").unwrap();
    let mut failed = 0;
    for (i, chunk) in data.chunks(4096).enumerate() {
        if i == 4 {
            store.fail_puts_under("recipes/");
            let e = s.append(chunk).unwrap_err();
            assert!(e.to_string().contains("recipes/retried-"), "{e}");
            failed += 1;
            store.allow_puts();
        }
        s.append(chunk).unwrap();
    }
    assert_eq!(failed, 1);
    s.commit().unwrap();
    assert_eq!(restored(&repo, "retried").unwrap(), data);
    assert!(check_store(tmp.path()).problems.is_empty());
}

/// The parts of a recipe that cannot be read are not called garbage a
/// collection may remove: they may be what repairs it.
#[test]
fn parts_of_an_unreadable_recipe_are_not_called_extra() {
    let tmp = tempfile::tempdir().unwrap();
    three(tmp.path());
    let recipe = recipe_object(tmp.path(), "c");
    let path = tmp.path().join(&recipe);
    let mut bytes = fs::read(&path).unwrap();
    bytes[8] = 9; // the version, under a crc that no longer matches
    fs::write(&path, &bytes).unwrap();
    let r = check_store(tmp.path());
    assert!(!r.garbage_complete, "{r:#?}");
    let parts: Vec<_> = r
        .garbage
        .iter()
        .filter(|g| g.object.starts_with(&recipe))
        .collect();
    assert!(!parts.is_empty(), "{r:#?}");
    for g in parts {
        assert!(
            g.reason.contains("cannot be read") && g.reason.contains("repair"),
            "{g:?}"
        );
    }
    // Deleted, the collection finds the parts by listing when the index
    // cannot be read, and removes them with it.
    let repo = Repository::open(tmp.path()).unwrap();
    repo.delete_backup("c").unwrap();
    repo.gc(&GcOptions::default()).unwrap();
    assert!(!objects(tmp.path(), "recipes/")
        .iter()
        .any(|o| o.starts_with(&recipe)));
}

fn index_strategy() -> impl Strategy<Value = RecipeIndex> {
    let part =
        (1..100u64, 0..1_000_000u64, any::<[u8; 32]>()).prop_map(|(segments, bytes, digest)| {
            PartInfo {
                segments,
                bytes,
                digest,
            }
        });
    prop::collection::vec(part, 0..20).prop_map(|parts| RecipeIndex {
        stream_len: parts.iter().map(|p| p.bytes).sum(),
        segments: parts.iter().map(|p| p.segments).sum(),
        parts,
    })
}

/// A frame as the repository writes one: magic, version, body, crc32c.
fn frame(version: u32, body: &[u8]) -> Vec<u8> {
    let mut out = b"DDUPRCPE".to_vec();
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(body);
    let sum = dedup_store::format::crc(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

proptest! {
    #[test]
    fn every_index_reads_back(i in index_strategy()) {
        let bytes = i.encode();
        prop_assert_eq!(RecipeObject::decode("r", &bytes).unwrap(), RecipeObject::Index(i));
    }

    /// An index's body with a byte changed or cut short, reframed with a
    /// good crc: read (if still consistent) or refused by name, never a
    /// panic.
    #[test]
    fn damaged_indexes_never_panic(
        i in index_strategy(),
        at in any::<prop::sample::Index>(),
        value in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = i.encode();
        let mut body = bytes[12..bytes.len() - 4].to_vec();
        let k = at.index(body.len());
        body[k] = value;
        body.truncate(cut.index(body.len() + 1));
        if let Err(e) = RecipeObject::decode("recipes/x", &frame(4, &body)) {
            prop_assert!(e.to_string().contains("recipes/x"), "{}", e);
        }
    }

    #[test]
    fn arbitrary_index_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..400)) {
        let _ = RecipeObject::decode("r", &frame(4, &body));
    }
}
