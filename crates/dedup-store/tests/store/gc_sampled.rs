//! Garbage collection under the sampled index (§3.2): after containers are
//! deleted and compacted, backups still dedup against what is left, never
//! against a removed segment, and everything restores, before and after a
//! reopen (which rebuilds the index from compacted catalogs).

use crate::gc_support;

use std::collections::BTreeMap;

use dedup_store::index::IndexConfig;
use dedup_store::{CheckOptions, GcOptions, Repository};
use gc_support::*;
use rand::{rngs::StdRng, RngCore, SeedableRng};

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

#[test]
fn sampled_index_after_sweep_and_compaction() {
    let tmp = tempfile::tempdir().unwrap();
    Repository::init(tmp.path()).unwrap();
    drop(Repository::open(tmp.path()).unwrap());
    let repo = Repository::open_sampled(tmp.path(), IndexConfig::default()).unwrap();
    let mut model = BTreeMap::new();
    let big = data(1, 1 << 20);
    repo.backup_stream("big", "g", &big[..]).unwrap();
    // A tenth of big, and something of its own.
    let mut part = big[..100 << 12].to_vec();
    part.extend_from_slice(&data(2, 64 << 10));
    repo.backup_stream("part", "h", &part[..]).unwrap();
    model.insert("part".to_string(), part.clone());
    repo.delete_backup("big").unwrap();
    let r = repo.gc(&GcOptions::default()).unwrap();
    assert_eq!(r.containers_compacted, 1, "{r:?}");
    check_backups(&repo, &model);
    check_compacted(tmp.path());
    // The store check reads every segment still stored and skips the ones
    // compaction removed (it took those for damage before).
    let report = repo.check(CheckOptions { data: true }, &|_| {}).unwrap();
    assert!(report.is_clean(), "{report:#?}");
    // Backing big up again stores the removed part again and reuses the
    // kept part.
    let again = repo.backup_stream("big2", "g", &big[..]).unwrap();
    assert!(again.bytes_new < big.len() as u64, "{again:?}");
    model.insert("big2".to_string(), big.clone());
    check_backups(&repo, &model);
    drop(repo);
    let repo = Repository::open_sampled(tmp.path(), IndexConfig::default()).unwrap();
    check_backups(&repo, &model);
    let third = repo.backup_stream("big3", "g", &big[..]).unwrap();
    assert_eq!(third.bytes_new, 0, "{third:?}");
    model.insert("big3".to_string(), big);
    repo.gc(&GcOptions::default()).unwrap();
    check_backups(&repo, &model);
    check_collected(tmp.path());
}

/// The count of fingerprints stored that the index reports and saves in
/// its checkpoint goes down by what a collection deletes or compacts
/// away: after deleting every backup and collecting, it is 0, and a
/// reopen from the checkpoint says so too.
#[test]
fn the_index_checkpoints_fingerprint_count_falls_with_what_gc_deletes() {
    let tmp = tempfile::tempdir().unwrap();
    Repository::init(tmp.path()).unwrap();
    drop(Repository::open(tmp.path()).unwrap());
    let fingerprints = |repo: &Repository| repo.index_ram().unwrap().fingerprints;
    let repo = Repository::open_sampled(tmp.path(), IndexConfig::default()).unwrap();
    let big = data(1, 1 << 20);
    let b = repo.backup_stream("big", "g", &big[..]).unwrap();
    let mut part = big[..100 << 12].to_vec();
    part.extend_from_slice(&data(2, 64 << 10));
    let p = repo.backup_stream("part", "h", &part[..]).unwrap();
    let stored = b.segments_new + p.segments_new;
    assert_eq!(fingerprints(&repo), stored);
    // big's segments that part does not share are compacted away.
    repo.delete_backup("big").unwrap();
    repo.gc(&GcOptions::default()).unwrap();
    let left = fingerprints(&repo);
    assert!(
        left < stored && left >= p.segments_new,
        "{left} of {stored}"
    );
    repo.delete_backup("part").unwrap();
    let r = repo.gc(&GcOptions::default()).unwrap();
    assert!(r.containers_swept > 0, "{r:?}");
    assert_eq!(fingerprints(&repo), 0);
    drop(repo);
    let repo = Repository::open_sampled(tmp.path(), IndexConfig::default()).unwrap();
    assert_eq!(fingerprints(&repo), 0);
}
