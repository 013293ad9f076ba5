//! Garbage collection on one thread while backups run on others, on one
//! shared handle. The dangerous case is built in every round: back up X,
//! delete X, then back X up again on several threads while collections run
//! back to back, so the new backups reuse segments of containers that no
//! committed backup references any more, exactly what a collection is
//! looking for. Every backup that committed must restore byte-exact, after
//! the collections and after a reopen. This test fails if the protection
//! map is disabled (see the report on branch store-gc).

use crate::gc_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dedup_store::{GcOptions, RepoError, RepoOptions, Repository, Segmenting};
use gc_support::*;
use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};

fn own(rng: &mut StdRng, blocks: usize) -> Vec<u8> {
    let mut v = vec![0u8; 4096 * blocks];
    rng.fill_bytes(&mut v);
    v
}

/// One run; with `granule`, the store asks restores to read in windows
/// of that many bytes (as S3 does), so windows read before a compaction
/// meet the container rewritten under them.
fn run(seed: u64, granule: Option<u64>) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let shared = Arc::new(blocks(&mut rng, 8));
    let tmp = tempfile::tempdir().unwrap();
    let options = RepoOptions {
        segmenting: Segmenting::DEFAULT,
        container_target: 24 << 10,
        force: false,
        ..RepoOptions::default()
    };
    let repo = Repository::init_with(tmp.path(), options).unwrap();
    let repo = Arc::new(match granule {
        None => repo,
        Some(g) => {
            drop(repo);
            let (repo, store) = open_faulty(tmp.path());
            store.set_read_granule(g);
            repo
        }
    });
    // Recipes in parts of 3 segments: the backups put parts while the
    // collections list and remove orphans.
    repo.set_recipe_part_segments(3);
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut compacted = 0;
    for round in 0..4 {
        // X: mostly blocks of its own, spread over several containers.
        let mut x = own(&mut rng, 12);
        x.extend_from_slice(&shared[round % 8]);
        let xname = format!("x{round}");
        repo.backup_stream(&xname, "gx", &x[..]).unwrap();
        repo.delete_backup(&xname).unwrap();
        // Delete some older backups too, so groups change and containers
        // become partly dead.
        let older: Vec<String> = model.keys().cloned().collect();
        for old in older {
            if rng.random_bool(0.4) {
                repo.delete_backup(&old).unwrap();
                model.remove(&old);
            }
        }
        let done = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..3u64)
            .map(|t| {
                let (repo, shared, x) = (repo.clone(), shared.clone(), x.clone());
                let seed = rng.random::<u64>();
                std::thread::spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed);
                    let mut made = Vec::new();
                    for b in 0..3 {
                        let data = if b == 0 || rng.random_bool(0.3) {
                            x.clone()
                        } else if b == 1 {
                            // A quarter of X: once the whole copies go,
                            // X's containers are mostly dead (compaction).
                            let mut d = x[..3 * 4096].to_vec();
                            d.extend_from_slice(&stream(&mut rng, &shared));
                            d
                        } else {
                            stream(&mut rng, &shared)
                        };
                        let name = format!("r{round}-t{t}-b{b}");
                        repo.backup_stream(&name, &format!("g{t}"), &data[..])
                            .unwrap();
                        made.push((name, data));
                    }
                    made
                })
            })
            .collect();
        let collector = {
            let (repo, done) = (repo.clone(), done.clone());
            std::thread::spawn(move || {
                let (mut runs, mut compacted) = (0, 0);
                while !done.load(Ordering::SeqCst) || runs == 0 {
                    match repo.gc(&GcOptions::default()) {
                        Ok(r) => {
                            runs += 1;
                            compacted += r.containers_compacted;
                        }
                        Err(RepoError::GcRunning) => unreachable!("one collector"),
                        Err(e) => panic!("gc: {e}"),
                    }
                }
                compacted
            })
        };
        // Restores of the earlier rounds' backups while containers are
        // compacted under them.
        let restorer = {
            let (repo, done, model) = (repo.clone(), done.clone(), model.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    for (name, data) in &model {
                        let mut out = Vec::new();
                        repo.restore(name, &mut out)
                            .unwrap_or_else(|e| panic!("restoring {name} during gc: {e}"));
                        assert!(out == *data, "{name} restored wrong during gc");
                    }
                    if model.is_empty() {
                        break;
                    }
                }
            })
        };
        for t in threads {
            model.extend(t.join().unwrap());
        }
        done.store(true, Ordering::SeqCst);
        compacted += collector.join().unwrap();
        restorer.join().unwrap();
        check_backups(&repo, &model);
    }
    repo.gc(&GcOptions::default()).unwrap();
    check_backups(&repo, &model);
    check_collected(tmp.path());
    drop(repo);
    check_backups(&Repository::open(tmp.path()).unwrap(), &model);
    compacted
}

#[test]
fn gc_beside_backups_that_reuse_segments_of_deleted_ones() {
    let compacted: u64 = (0..20).map(|seed| run(seed, None)).sum();
    eprintln!("{compacted} containers compacted beside backups and restores");
}

#[test]
fn restores_reading_in_windows_beside_compaction() {
    let compacted: u64 = (100..110).map(|seed| run(seed, Some(4096))).sum();
    eprintln!("{compacted} containers compacted beside restores reading 4 KiB windows");
}

#[test]
fn one_collection_at_a_time() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(tmp.path()).unwrap();
    // A progress callback that tries a second collection from inside the
    // first.
    let repo_ref = &repo;
    let second = std::sync::Mutex::new(None);
    let progress = |_: &str, _: u64, _: u64| {
        let mut s = second.lock().unwrap();
        if s.is_none() {
            *s = Some(repo_ref.gc(&GcOptions::default()).map(|_| ()));
        }
    };
    repo.backup_stream("a", "g", &[7u8; 10_000][..]).unwrap();
    repo.gc(&GcOptions {
        progress: Some(&progress),
        ..GcOptions::default()
    })
    .unwrap();
    let e = second.lock().unwrap().take().expect("progress was called");
    let e = e.expect_err("a second collection is refused");
    assert!(matches!(e, RepoError::GcRunning), "{e}");
    assert!(
        e.to_string()
            .starts_with("a garbage collection is already running"),
        "{e}"
    );
    repo.gc(&GcOptions::default()).unwrap();
}
