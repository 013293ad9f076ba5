//! A collection that dies at every possible point: the object store fails
//! every operation from the Nth on, for N = 0 up to the operation count of
//! a whole collection. After each, a reopened repository restores every
//! live backup, and a clean collection finishes the job.

mod gc_support;

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

#[test]
fn a_collection_killed_at_every_step_is_finished_by_the_next() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let model = template(&base);

    // How many operations a whole collection takes.
    let whole = tmp.path().join("whole");
    copy_dir(&base, &whole);
    let (repo, store) = open_faulty(&whole);
    let before = store.ops();
    let r = repo.gc(&GcOptions::default()).unwrap();
    let total = store.ops() - before;
    assert!(
        r.groups_reused == 1 && r.groups_remarked == 1 && r.groups_dropped == 1,
        "{r:?}"
    );
    assert!(r.orphans_removed >= 1 && r.containers_swept > 0, "{r:?}");
    assert!(r.containers_compacted > 0, "{r:?}");
    drop(repo);
    check_collected(&whole);

    for n in 0..total {
        let dir = tmp.path().join(format!("crash-{n}"));
        copy_dir(&base, &dir);
        let (repo, store) = open_faulty(&dir);
        store.fail_after(n);
        assert!(repo.gc(&GcOptions::default()).is_err(), "n={n}");
        drop(repo);
        let repo = Repository::open(&dir).unwrap();
        check_backups(&repo, &model);
        repo.gc(&GcOptions::default()).unwrap();
        check_backups(&repo, &model);
        drop(repo);
        check_collected(&dir);
        check_compacted(&dir);
        check_backups(&Repository::open_read_only(&dir).unwrap(), &model);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    eprintln!("killed a collection at each of its {total} operations: {r:?}");
}
