//! A collection that dies at every possible point: the object store fails
//! every operation from the Nth on, for N = 0 up to the operation count of
//! a whole collection. After each, a reopened repository restores every
//! live backup, and a clean collection finishes the job.

use crate::gc_support;

use std::collections::BTreeMap;
use std::path::Path;

use dedup_store::{GcOptions, RepoOptions, Repository, Segmenting};
use gc_support::*;
use rand::{rngs::StdRng, SeedableRng};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// A repository where a collection has everything to do: a group whose
/// marks are reused, one changed, one emptied, garbage from an abandoned
/// session and an orphan recipe from a backup that died before its commit
/// point.
fn template(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut rng = StdRng::seed_from_u64(42);
    let shared = blocks(&mut rng, 10);
    let options = RepoOptions {
        segmenting: Segmenting::DEFAULT,
        container_target: 24 << 10,
        force: false,
        ..RepoOptions::default()
    };
    let repo = Repository::init_with(dir, options).unwrap();
    let mut model = BTreeMap::new();
    // p's containers end up mostly dead once p is deleted: q keeps one
    // block of each.
    let p: Vec<u8> = (0..12)
        .flat_map(|i| shared[i % 10].iter().map(move |b| b ^ (i as u8 + 1)))
        .collect();
    let mut q = p[..4096].to_vec();
    q.extend_from_slice(&p[8 * 4096..9 * 4096]);
    repo.backup_stream("p", "change", &p[..]).unwrap();
    repo.backup_stream("q", "keep", &q[..]).unwrap();
    model.insert("q".to_string(), q);
    for (i, group) in ["keep", "keep", "change", "change", "change", "empty"]
        .iter()
        .enumerate()
    {
        let data = stream(&mut rng, &shared);
        let name = format!("b{i}");
        repo.backup_stream(&name, group, &data[..]).unwrap();
        model.insert(name, data);
    }
    repo.gc(&GcOptions::default()).unwrap();
    for name in ["b2", "b5", "p"] {
        repo.delete_backup(name).unwrap();
        model.remove(name);
    }
    let data = stream(&mut rng, &shared);
    repo.backup_stream("b6", "change", &data[..]).unwrap();
    model.insert("b6".into(), data);
    // Abandoned: containers, no recipe.
    let mut s = repo.begin_backup("lost", "keep").unwrap();
    for chunk in stream(&mut rng, &shared).chunks(4096) {
        s.append(chunk).unwrap();
    }
    drop(s);
    drop(repo);
    // Died between its recipe and its backup object.
    let (repo, store) = open_faulty(dir);
    store.fail_puts_under("backups/");
    let data = stream(&mut rng, &shared);
    assert!(repo.backup_stream("died", "change", &data[..]).is_err());
    drop(repo);
    assert!(objects(dir, "recipes/")
        .iter()
        .any(|r| r.starts_with("recipes/died-")));
    model
}

/// A whole collection of a copy of `base` in `whole`: its report and how
/// many store operations it took.
fn whole_collection(base: &Path, whole: &Path) -> (dedup_store::GcReport, u64) {
    copy_dir(base, whole);
    let (repo, store) = open_faulty(whole);
    let before = store.ops();
    let r = repo.gc(&GcOptions::default()).unwrap();
    (r, store.ops() - before)
}

/// A copy of `base` in `dir` whose collection died at its `n`th store
/// operation; `dir`.
fn killed_at(base: &Path, dir: &Path, n: u64) -> std::path::PathBuf {
    copy_dir(base, dir);
    let (repo, store) = open_faulty(dir);
    store.fail_after(n);
    assert!(repo.gc(&GcOptions::default()).is_err(), "n={n}");
    dir.to_path_buf()
}

#[test]
fn a_collection_killed_at_every_step_is_finished_by_the_next_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let model = template(&base);

    // How many operations a whole collection takes.
    let whole = tmp.path().join("whole");
    let (r, total) = whole_collection(&base, &whole);
    assert!(
        r.groups_reused == 1 && r.groups_remarked == 1 && r.groups_dropped == 1,
        "{r:?}"
    );
    assert!(r.orphans_removed >= 1 && r.containers_swept > 0, "{r:?}");
    assert!(r.containers_compacted > 0, "{r:?}");
    check_collected(&whole);

    for n in 0..total {
        let dir = killed_at(&base, &tmp.path().join(format!("crash-{n}")), n);
        let repo = Repository::open(&dir).unwrap();
        check_backups(&repo, &model);
        // A compaction killed between its first two steps leaves a
        // compacted version that only a collection sure no other is
        // replacing that container deletes (two collections on), after
        // which the container is compacted again: three `gc`s.
        for _ in 0..3 {
            repo.gc(&GcOptions::default()).unwrap();
            check_backups(&repo, &model);
        }
        drop(repo);
        check_collected(&dir);
        check_compacted(&dir);
        check_backups(&Repository::open_read_only(&dir).unwrap(), &model);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    eprintln!("killed a collection at each of its {total} operations: {r:?}");
}

/// `store check` right after a collection killed at any step, before
/// anything reopens the repository to write (which would finish an
/// interrupted compaction): no damage. A compaction killed between
/// deleting `containers/<id>` and putting it again leaves only
/// `compacted/<id>`, which restores read in its place; the check reads it
/// too.
#[test]
fn store_check_finds_no_damage_after_a_collection_killed_at_any_step() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let model = template(&base);
    let (_, total) = whole_collection(&base, &tmp.path().join("whole"));
    let mut only_compacted = 0;
    for n in 0..total {
        let dir = killed_at(&base, &tmp.path().join(format!("crash-{n}")), n);
        let compacted = objects(&dir, "compacted/");
        if compacted.iter().any(|c| {
            let id = c.strip_prefix("compacted/").unwrap();
            !dir.join("containers").join(id).exists()
        }) {
            only_compacted += 1;
        }
        let local = dedup_store::LocalDir::open(&dir).unwrap();
        for data in [false, true] {
            let opts = dedup_store::CheckOptions { data };
            let report = dedup_store::check::check(&local, opts, &|_| {}).unwrap();
            assert!(
                report.problems.is_empty(),
                "killed at {n}, data {data}: {:?}",
                report.problems
            );
        }
        check_backups(&Repository::open_read_only(&dir).unwrap(), &model);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    assert!(only_compacted > 0, "no kill point left only compacted/<id>");
}
