//! Model-based test of garbage collection: seeded random sequences of
//! backups in several groups (streams sharing blocks, some with trees),
//! deletes, collections, collections that crash part-way (the object store
//! fails every operation after the Nth), backups that crash part-way, and
//! reopens. After every step every live backup restores byte-exact; after
//! every finished collection the repository holds exactly what the live
//! backups need (containers, recipes, trees) and one marks object per group.

use crate::gc_support;

use std::collections::BTreeMap;
use std::path::Path;

use dedup_store::{GcOptions, RepoOptions, Repository, Segmenting};
use gc_support::*;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Back up `data` as `name` (fixed 4 KiB segments), with a tree sometimes.
fn backup(repo: &Repository, name: &str, group: &str, data: &[u8], tree: bool) -> bool {
    let Ok(mut s) = repo.begin_backup(name, group) else {
        return false;
    };
    for chunk in data.chunks(4096) {
        if s.append(chunk).is_err() {
            return false;
        }
    }
    // One file holding the whole stream: a tree a restore would accept.
    let mut file = dedup_store::tree::Node::new("f", dedup_store::tree::Kind::File);
    file.size = data.len() as u64;
    let tree_bytes = dedup_store::tree::Tree {
        stream_len: data.len() as u64,
        nodes: vec![file],
    }
    .encode();
    match s.commit_with_tree(tree.then_some(&tree_bytes[..])) {
        Ok(_) => true,
        // Put, but the look that confirms it failed: listed, and whole.
        Err(dedup_store::RepoError::Unconfirmed { .. }) => repo.backup(name).is_ok(),
        Err(_) => false,
    }
}

/// Reopen, writing recipes in parts of a few segments, so backups, GC,
/// crashes and deletes meet recipes of many parts.
fn reopen(dir: &Path) -> (Repository, std::sync::Arc<Faulty>) {
    let (repo, store) = open_faulty(dir);
    repo.set_recipe_part_segments(3);
    (repo, store)
}

fn run(seed: u64) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let shared = blocks(&mut rng, 12);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    Repository::init_with(
        dir,
        RepoOptions {
            segmenting: Segmenting::DEFAULT,
            container_target: 24 << 10,
            force: false,
            ..RepoOptions::default()
        },
    )
    .unwrap();
    let (mut repo, mut store) = reopen(dir);
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let (mut gcs, mut crashed_gcs, mut compacted) = (0, 0, 0);
    for step in 0..80 {
        let name = format!("b{}", rng.random_range(0..10));
        let group = format!("g{}", rng.random_range(0..3));
        match rng.random_range(0..12) {
            0..=3 => {
                let data = stream(&mut rng, &shared);
                let ok = backup(&repo, &name, &group, &data, rng.random_bool(0.3));
                assert_eq!(ok, !model.contains_key(&name), "step {step}");
                model.entry(name).or_insert(data);
            }
            4 | 5 => {
                if model.remove(&name).is_some() {
                    repo.delete_backup(&name).unwrap();
                }
            }
            6 | 7 => {
                let r = gc_settled(&repo, &GcOptions::default());
                gcs += 1;
                compacted += r.containers_compacted;
                check_backups(&repo, &model);
                check_collected(dir);
                check_compacted(dir);
                assert!(r.recipes_read as usize <= model.len(), "{r:?}");
            }
            8 => {
                // A collection that dies after a few operations.
                store.fail_after(rng.random_range(0..30));
                if repo.gc(&GcOptions::default()).is_err() {
                    crashed_gcs += 1;
                }
                drop(repo);
                (repo, store) = reopen(dir);
            }
            9 => {
                // A backup that dies part-way (maybe between its recipe
                // and its commit point).
                if model.contains_key(&name) {
                    continue;
                }
                let data = stream(&mut rng, &shared);
                store.fail_after(rng.random_range(0..12));
                if backup(&repo, &name, &group, &data, rng.random_bool(0.5)) {
                    model.insert(name, data);
                }
                drop(repo);
                (repo, store) = reopen(dir);
            }
            10 => {
                // A session abandoned without a commit.
                if !model.contains_key(&name) {
                    let mut s = repo.begin_backup(&name, &group).unwrap();
                    for chunk in stream(&mut rng, &shared).chunks(4096) {
                        s.append(chunk).unwrap();
                    }
                }
            }
            _ => {
                drop(repo);
                (repo, store) = reopen(dir);
            }
        }
        check_backups(&repo, &model);
    }
    // A last clean collection finishes whatever crashed ones left.
    gc_settled(&repo, &GcOptions::default());
    check_backups(&repo, &model);
    check_collected(dir);
    check_compacted(dir);
    for name in model.keys() {
        repo.delete_backup(name).unwrap();
    }
    let r = repo.gc(&GcOptions::default()).unwrap();
    check_collected(dir);
    assert_eq!(
        container_bytes(dir),
        0,
        "deleting every backup frees every byte"
    );
    assert!(objects(dir, "gc/marks/").is_empty());
    assert!(objects(dir, "recipes/").is_empty(), "recipes or parts left");
    eprintln!("seed {seed}: {gcs} collections ({compacted} containers compacted), {crashed_gcs} crashed; last {r:?}");
    compacted
}

#[test]
fn model_backup_delete_gc_crash_reopen() {
    let compacted: u64 = (0..8).map(run).sum();
    assert!(compacted > 0, "no collection compacted anything");
}
